//! The emulator's state, shared by every connection, and the rules that span
//! modules: removing a bdev takes its consumers with it (SPDK's hot remove),
//! and the host side is told about everything that appears or goes.

use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Instant;

use tokio::sync::Mutex;

use crate::bdev::{BdevKind, Bdevs};
use crate::bdev_nvme::NvmeInitiator;
use crate::crypto::Crypto;
use crate::datapath::stats::TICK_RATE;
use crate::host::HostSide;
use crate::lvol::LvolStore;
use crate::nvmf::NvmfTarget;
use crate::snap::Snap;

/// What connections, listeners and tasks share. One lock serialises RPCs, as
/// SPDK's single RPC thread does; handlers that touch the host side (which
/// blocks on `losetup`) run on the blocking pool while holding it. Attaches
/// to the host run outside it, in the background (see `host`), so that only
/// SNAP's own work, and host-side removal, is serialised.
#[derive(Debug)]
pub(crate) struct Shared {
    pub state: Arc<Mutex<Emulator>>,
    pub snap_enabled: bool,
}

#[derive(Debug)]
pub(crate) struct Emulator {
    /// Lets handlers start tasks (listeners) that need the shared state.
    pub me: Weak<Shared>,
    /// Our backing files; wiped at start and at shutdown.
    pub files_dir: PathBuf,
    pub bdevs: Bdevs,
    pub crypto: Crypto,
    pub lvstores: Vec<LvolStore>,
    pub nvmf: NvmfTarget,
    pub nvme: NvmeInitiator,
    pub snap: Option<Snap>,
    pub host: Option<Arc<HostSide>>,
    pub started: Instant,
    /// `nqn.2014-08.org.nvmexpress:uuid:<uuid>`, fixed per process like SPDK's.
    pub default_hostnqn: String,
    /// Which exposures go through the data path.
    pub data_path: crate::datapath::DataPathMode,
}

/// Kernel block-layer counters of one device (`/sys/block/<dev>/stat`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IoStat {
    pub read_ios: u64,
    pub read_sectors: u64,
    pub read_ms: u64,
    pub write_ios: u64,
    pub write_sectors: u64,
    pub write_ms: u64,
    pub discard_ios: u64,
    pub discard_sectors: u64,
    pub discard_ms: u64,
}

impl IoStat {
    pub fn parse(text: &str) -> Self {
        let f: Vec<u64> = text
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        let at = |i: usize| f.get(i).copied().unwrap_or(0);
        Self {
            read_ios: at(0),
            read_sectors: at(2),
            read_ms: at(3),
            write_ios: at(4),
            write_sectors: at(6),
            write_ms: at(7),
            discard_ios: at(11),
            discard_sectors: at(13),
            discard_ms: at(14),
        }
    }

    fn add(&mut self, o: &Self) {
        self.read_ios += o.read_ios;
        self.read_sectors += o.read_sectors;
        self.read_ms += o.read_ms;
        self.write_ios += o.write_ios;
        self.write_sectors += o.write_sectors;
        self.write_ms += o.write_ms;
        self.discard_ios += o.discard_ios;
        self.discard_sectors += o.discard_sectors;
        self.discard_ms += o.discard_ms;
    }
}

impl Emulator {
    pub(crate) fn ticks(&self) -> u64 {
        let ns = self.started.elapsed().as_nanos();
        u64::try_from(ns.saturating_mul(u128::from(TICK_RATE)) / 1_000_000_000).unwrap_or(u64::MAX)
    }

    /// I/O counters of the loop devices exposing a bdev to the host
    /// directly (the data path counts its own).
    pub(crate) fn host_io_stat(&self, bdev: &str) -> IoStat {
        let mut total = IoStat::default();
        let Some(host) = &self.host else {
            return total;
        };
        for disk in self.host_disks_of(bdev) {
            if host.is_on_data_path(&disk) {
                continue;
            }
            let Some(dev) = host.loop_device_of(&disk) else {
                continue;
            };
            let Some(dev) = dev.file_name() else {
                continue;
            };
            let path = PathBuf::from("/sys/block").join(dev).join("stat");
            if let Ok(text) = std::fs::read_to_string(path) {
                total.add(&IoStat::parse(&text));
            }
        }
        total
    }

    /// Removes a bdev after everything built on it: SNAP namespaces and
    /// virtio-blk controllers let go (their host disks are detached), nvmf
    /// namespaces are removed, an lvol store on it is destroyed with its lvols.
    /// This is SPDK's hot-remove, which is why deleting a claimed bdev succeeds.
    pub(crate) fn unregister_bdev(&mut self, name: &str) {
        let Some(bdev) = self.bdevs.get(name) else {
            return;
        };
        let name = bdev.name.clone();
        for vbdev in self.crypto_consumers(&name) {
            self.unregister_bdev(&vbdev);
        }
        let stores: Vec<uuid::Uuid> = self
            .lvstores
            .iter()
            .filter(|s| s.base_bdev == name)
            .map(|s| s.uuid)
            .collect();
        for s in stores {
            self.destroy_lvstore(s);
        }
        self.snap_release_bdev(&name);
        self.nvmf_release_bdev(&name);
        let Some(bdev) = self.bdevs.remove(&name) else {
            return;
        };
        match bdev.kind {
            BdevKind::Malloc { file } | BdevKind::Null { file } => {
                let _ = std::fs::remove_file(file);
            }
            BdevKind::Lvol { lvs_uuid, .. } => self.forget_lvol(lvs_uuid, bdev.uuid),
            BdevKind::Crypto { base, .. } => self.release_crypto_base(&base),
            BdevKind::Aio { .. } | BdevKind::Nvme(_) => {}
        }
    }

    /// Graceful shutdown: stop listening, close fabrics connections, let the
    /// host side detach every loop device, and remove our files.
    pub(crate) fn shutdown(&mut self) {
        self.nvmf.stop();
        self.nvme.stop();
        if let Some(host) = self.host.take()
            && let Err(e) = host.shutdown()
        {
            tracing::error!("host side shutdown failed: {e:#}");
        }
        let _ = std::fs::remove_dir_all(&self.files_dir);
    }
}

impl Drop for Emulator {
    /// A server dropped without a graceful shutdown (its future cancelled, a
    /// test panicking) still must not leave loop devices behind.
    fn drop(&mut self) {
        if self.host.is_some() {
            self.shutdown();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_stat_lines_parse() {
        let s =
            IoStat::parse("     73        0     74 5   2  0  16  3  0  12  8  1  0  8  2  0  0\n");
        assert_eq!(s.read_ios, 73);
        assert_eq!(s.read_sectors, 74);
        assert_eq!(s.read_ms, 5);
        assert_eq!(s.write_ios, 2);
        assert_eq!(s.write_sectors, 16);
        assert_eq!(s.discard_ios, 1);
        assert_eq!(s.discard_sectors, 8);
        assert_eq!(IoStat::parse(""), IoStat::default());
    }
}
