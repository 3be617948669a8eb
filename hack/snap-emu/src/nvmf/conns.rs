//! The connections a subsystem serves, each with the listener it came in
//! through: hosts' controllers (their handshake connection, see
//! `super::wire`) and data path volumes' I/O connections (see `super::io`),
//! so that removing a listener cuts exactly those, as SPDK's
//! `nvmf_subsystem_remove_listener` disconnects the qpairs that came in
//! through it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use tokio::sync::oneshot;

/// A listener's `(traddr, trsvcid)`.
pub(crate) type ListenKey = (String, String);

/// An I/O connection's mark, set when its listener is removed: it serves
/// nothing more and closes.
#[derive(Debug, Default)]
pub(crate) struct Cut(AtomicBool);

impl Cut {
    pub(crate) fn is_cut(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn cut(&self) {
        self.0.store(true, Ordering::Release);
    }
}

#[derive(Debug)]
struct HostConnection {
    cntlid: u16,
    hostnqn: String,
    key: ListenKey,
    /// Dropping it closes the connection.
    _kick: oneshot::Sender<()>,
}

#[derive(Debug)]
struct IoConnection {
    key: ListenKey,
    cut: Weak<Cut>,
}

#[derive(Debug, Default)]
pub(crate) struct Connections {
    hosts: Vec<HostConnection>,
    io: Vec<IoConnection>,
}

impl Connections {
    /// A host's controller `cntlid`, connected through listener `key`;
    /// dropping `kick` closes its connection.
    pub(crate) fn add_host(
        &mut self,
        cntlid: u16,
        hostnqn: &str,
        key: &ListenKey,
        kick: oneshot::Sender<()>,
    ) {
        self.hosts.push(HostConnection {
            cntlid,
            hostnqn: hostnqn.to_owned(),
            key: key.clone(),
            _kick: kick,
        });
    }

    pub(crate) fn cntlid_in_use(&self, cntlid: u16) -> bool {
        self.hosts.iter().any(|c| c.cntlid == cntlid)
    }

    /// The host's connection closed.
    pub(crate) fn remove_host(&mut self, cntlid: u16) {
        self.hosts.retain(|c| c.cntlid != cntlid);
    }

    /// A host no longer allowed loses its controllers' connections.
    pub(crate) fn drop_hostnqn(&mut self, hostnqn: &str) {
        self.hosts.retain(|c| c.hostnqn != hostnqn);
    }

    pub(crate) fn add_io(&mut self, key: ListenKey, cut: &Arc<Cut>) {
        self.io.retain(|c| c.cut.strong_count() > 0);
        self.io.push(IoConnection {
            key,
            cut: Arc::downgrade(cut),
        });
    }

    /// Closes what came in through the listener `key`.
    pub(crate) fn cut_listener(&mut self, key: &ListenKey) {
        self.hosts.retain(|c| &c.key != key);
        self.io.retain(|c| {
            if &c.key != key {
                return true;
            }
            if let Some(cut) = c.cut.upgrade() {
                cut.cut();
            }
            false
        });
    }
}
