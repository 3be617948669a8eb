//! What the target answers its listeners (see [`super::listener`]): a
//! host's handshake admitted as a controller (with SPDK's controller ids),
//! its end, and an I/O connection's namespace; each connection recorded
//! with its listener (see [`super::conns`]).

use std::sync::Arc;

use tokio::sync::oneshot;
use uuid::Uuid;

use super::conns::{Cut, ListenKey};
use super::io::Gate;
use super::listener::Admit;
use super::target::NvmfTarget;
use super::wire::{Accepted, WireNamespace};
use crate::bdev::registry::{BdevKind, Bdevs};
use crate::datapath::remote::IoHello;
use crate::datapath::volume::Volume;
use crate::registry::Cx;

impl NvmfTarget {
    /// The subsystem `hostnqn` may reach as `subnqn` on listener `key`.
    fn admit(&self, key: &ListenKey, subnqn: &str, hostnqn: &str) -> Result<usize, String> {
        let si = self
            .subsystem(subnqn)
            .ok_or_else(|| format!("no subsystem {subnqn}"))?;
        let s = &self.subsystems[si];
        if !s.listeners.iter().any(|l| &l.key() == key) {
            return Err(format!("{subnqn} does not listen on {}:{}", key.0, key.1));
        }
        if !s.allow_any_host && !s.hosts.iter().any(|h| h == hostnqn) {
            return Err(format!("host {hostnqn} is not allowed on {subnqn}"));
        }
        Ok(si)
    }

    /// The namespaces a host's controller sees, as the handshake carries them.
    fn wire_namespaces(&self, si: usize, bdevs: &Bdevs) -> Vec<WireNamespace> {
        self.subsystems[si]
            .namespaces
            .iter()
            .filter_map(|n| {
                let b = bdevs.get(&n.bdev)?;
                let backing = bdevs.backing_of(b);
                let (unmap, copy) = match &b.kind {
                    BdevKind::Aio { fallocate, .. } => (*fallocate, false),
                    BdevKind::Null { .. } => (false, false),
                    BdevKind::Malloc { .. } => (true, true),
                    BdevKind::Lvol { .. } => (true, false),
                    BdevKind::Nvme(i) => (i.unmap, i.copy),
                    // The fabrics shortcut hands over a file range, which for
                    // a crypto bdev holds ciphertext: not offered (see `super::wire`).
                    BdevKind::Crypto { .. } => return None,
                };
                // SPDK's host names a namespace's bdev by its NGUID when it
                // has one (the target derives one from the bdev's UUID).
                let uuid = if n.nguid == [0; 16] {
                    n.uuid
                } else {
                    Uuid::from_bytes(n.nguid)
                };
                Some(WireNamespace {
                    nsid: n.nsid,
                    uuid: uuid.to_string(),
                    block_size: b.block_size,
                    num_blocks: b.num_blocks,
                    path: backing.path,
                    offset: backing.offset,
                    size: backing.size,
                    read_only: backing.read_only,
                    unmap,
                    copy,
                })
            })
            .collect()
    }
}

impl Admit for NvmfTarget {
    /// A host's handshake arrived on listener `key`: admit it or say why not.
    fn connect(
        &mut self,
        key: &ListenKey,
        subnqn: &str,
        hostnqn: &str,
        kick: oneshot::Sender<()>,
        bdevs: &Bdevs,
    ) -> Result<Accepted, String> {
        let si = self.admit(key, subnqn, hostnqn)?;
        let namespaces = self.wire_namespaces(si, bdevs);
        let s = &mut self.subsystems[si];
        let span = u32::from(s.max_cntlid - s.min_cntlid) + 1;
        let cntlid = (0..span)
            .map(|i| {
                let off = (u32::from(s.next_cntlid - s.min_cntlid) + i) % span;
                s.min_cntlid + off as u16
            })
            .find(|c| !s.connections.cntlid_in_use(*c))
            .ok_or_else(|| "no free controller id".to_owned())?;
        s.next_cntlid = if cntlid == s.max_cntlid {
            s.min_cntlid
        } else {
            cntlid + 1
        };
        s.connections.add_host(cntlid, hostnqn, key, kick);
        Ok(Accepted {
            cntlid,
            serial_number: s.serial_number.clone(),
            model_number: s.model_number.clone(),
            namespaces,
        })
    }

    fn disconnect(&mut self, subnqn: &str, cntlid: u16) {
        if let Some(i) = self.subsystem(subnqn) {
            self.subsystems[i].connections.remove_host(cntlid);
        }
    }

    fn open_io(
        &mut self,
        key: &ListenKey,
        hello: &IoHello,
        cut: &Arc<Cut>,
        cx: &Cx<'_>,
    ) -> Result<(Volume, Arc<Gate>), String> {
        let si = self.admit(key, &hello.subnqn, &hello.hostnqn)?;
        let s = &mut self.subsystems[si];
        let ns = s
            .namespaces
            .iter()
            .find(|n| n.nsid == hello.nsid)
            .ok_or_else(|| format!("no namespace {} in {}", hello.nsid, hello.subnqn))?;
        let bdev = cx
            .bdevs
            .get(&ns.bdev)
            .ok_or_else(|| format!("no bdev {}", ns.bdev))?;
        let volume = cx.volume_of(bdev).map_err(|e| e.message)?;
        s.connections.add_io(key.clone(), cut);
        Ok((volume, Arc::clone(&s.gate)))
    }
}
