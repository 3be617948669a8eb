//! The seam between SNAP's model and a host: what SNAP's functions and
//! disks do to the host they are plugged into. Two hosts implement it: the
//! sysfs-shaped tree over loop devices on this machine (`HostSide`), and a
//! QEMU guest running a real Linux kernel, into which functions are
//! hot-plugged (`GuestHost`).
//!
//! Every method may block (a loop device, a guest letting a device go):
//! call it from a blocking thread, as the dispatcher does.

use std::fmt::Debug;
use std::path::Path;
use std::sync::Arc;

use super::tree::{DiskRef, FunctionKind};
use crate::datapath::volume::{Backing, Source};

pub trait Host: Debug + Send + Sync {
    /// A function appears on the host at `bdf`.
    fn add_function(&self, bdf: &str, kind: FunctionKind) -> anyhow::Result<()>;
    /// The function at `bdf` leaves the host, with any disk still under it.
    fn remove_function(&self, bdf: &str) -> anyhow::Result<()>;
    /// Namespace `nsid` (the host's `n<ns>` of controller `<ctrl>`, with
    /// `uuid`) of the NVMe function at `bdf` appears; the host finds it after
    /// this returns, as a host's driver does.
    fn attach_nvme(self: Arc<Self>, disk: NvmeDisk<'_>, source: Source) -> anyhow::Result<DiskRef>;
    /// The virtio-blk function at `bdf` (the host's `virtio<index>`) shows
    /// its disk `name` with `serial`; found after this returns.
    fn attach_virtio_blk(
        self: Arc<Self>,
        disk: VirtioBlkDisk<'_>,
        source: Source,
    ) -> anyhow::Result<DiskRef>;
    /// The disk leaves the host; done when this returns.
    fn detach(&self, disk: &DiskRef) -> anyhow::Result<()>;
    /// The disk's bytes now have `backing`'s size.
    fn resize(&self, disk: &DiskRef, backing: &Backing) -> anyhow::Result<()>;
    /// The host kernel's counters of a disk it reaches directly, if known.
    fn block_stat(&self, disk: &DiskRef) -> Option<BlockStat>;
    /// Emulator-only: the host names an NVMe disk anew (`nvme<ctrl>`).
    fn rename_nvme(&self, disk: &DiskRef, ctrl: u32) -> anyhow::Result<DiskRef>;
    /// Emulator-only: the host names a virtio-blk disk anew.
    fn rename_virtio_blk(&self, disk: &DiskRef, index: u32, name: &str) -> anyhow::Result<DiskRef>;
    /// A virtio-fs device of the function at `bdf` serving `root` under
    /// `tag` appears; returns the number the host gave it.
    fn show_virtiofs(&self, bdf: &str, tag: &str, root: &Path) -> anyhow::Result<u32>;
    /// Virtio-fs device `n` leaves the host.
    fn hide_virtiofs(&self, n: u32);
    /// Graceful shutdown: everything shown leaves the host.
    fn shutdown(&self) -> anyhow::Result<()>;
}

/// An NVMe namespace as the host will name and identify it.
#[derive(Debug, Clone, Copy)]
pub struct NvmeDisk<'a> {
    pub bdf: &'a str,
    pub ctrl: u32,
    pub ns: u32,
    pub nsid: u32,
    pub uuid: &'a str,
    /// The subsystem's serial, which the host shows on the controller.
    pub serial: &'a str,
}

/// A virtio-blk disk as the host will name and identify it.
#[derive(Debug, Clone, Copy)]
pub struct VirtioBlkDisk<'a> {
    pub bdf: &'a str,
    pub index: u32,
    pub name: &'a str,
    pub serial: &'a str,
}

/// Kernel block-layer counters of one device (`/sys/block/<dev>/stat`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BlockStat {
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

impl BlockStat {
    pub(super) fn parse(text: &str) -> Self {
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

    pub fn add(&mut self, o: &Self) {
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
