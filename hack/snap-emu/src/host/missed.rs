//! Disks the host missed (a fault a test switches on, see
//! [`Faults::miss_discovery`]): their attach is kept, not carried out, until
//! a rescan or their detach, whichever comes first in the function's line.
//!
//! [`Faults::miss_discovery`]: crate::faults::Faults::miss_discovery

use std::collections::HashMap;
use std::sync::{Arc, MutexGuard, PoisonError};
use std::thread;

use super::{DiskAttrs, DiskId, HostSide, Source};
use crate::faults::Rescan;

/// An attach the host missed, kept for a rescan.
#[derive(Debug)]
pub(super) struct MissedDisk {
    pub id: DiskId,
    pub attrs: DiskAttrs,
    pub source: Source,
}

impl DiskAttrs {
    /// What names the disk's volume to a reader: the namespace UUID or the serial.
    pub(super) fn identity(&self) -> String {
        match self {
            DiskAttrs::Nvme { uuid, .. } => uuid.clone(),
            DiskAttrs::VirtioBlk { serial } => String::from_utf8_lossy(serial).into_owned(),
        }
    }
}

impl HostSide {
    /// Attaches the missed disks with `identity` (see [`Faults::rescan`]),
    /// each in its function's line, unless its detach comes first.
    fn attach_missed(self: &Arc<Self>, identity: &str) {
        let found: Vec<(String, String)> = self
            .missed_disks()
            .iter()
            .filter(|(_, m)| m.attrs.identity() == identity)
            .map(|(key, m)| (key.clone(), m.id.bdf().to_owned()))
            .collect();
        for (key, bdf) in found {
            let ticket = self.functions.reserve(&bdf);
            let running = self.jobs.start();
            let host = Arc::clone(self);
            let job = move || {
                let guard = ticket.wait();
                // Taken under the function's lock, which a detach holds while
                // it forgets a missed disk: one or the other has it.
                let missed = host.missed_disks().remove(&key);
                if let Some(m) = missed
                    && let Err(e) = host.attach_locked(&m.id, &m.attrs, &m.source)
                {
                    tracing::warn!("rescan of {} failed: {e:#}", host.disk_dir(&m.id).display());
                }
                drop(guard);
                drop(host);
                drop(running);
            };
            if let Err(e) = thread::Builder::new()
                .name(format!("rescan-{bdf}"))
                .spawn(job)
            {
                tracing::error!("cannot start a rescan of {bdf}: {e}");
            }
        }
    }

    pub(super) fn missed_disks(&self) -> MutexGuard<'_, HashMap<String, MissedDisk>> {
        self.missed.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Rescan for HostSide {
    fn rescan(self: Arc<Self>, identity: &str) {
        self.attach_missed(identity);
    }
}
