//! What the host can see of SNAP: the disks of its controllers, which the
//! host ([`Host`]: this machine's tree, or a guest) makes real, and
//! how each reaches the host, straight over the bdev's bytes or through the
//! emulator's data path.
//!
//! Showing up is asynchronous, as on a real host, whose driver finds a disk
//! by hot-plug after SNAP answered: the reply (and SNAP's state, `ready`
//! included) does not wait for the loop device, which appears in the tree
//! shortly after, so a consumer polls sysfs for it as the node does. Going
//! away is done before the reply.

use std::sync::Arc;

use crate::bdev::registry::Bdev;
use crate::datapath::DataPathMode;
use crate::datapath::volume::{Backing, Source};
use crate::host::{BlockStat, DiskRef, FunctionKind, Host, NvmeDisk, VirtioBlkDisk};
use crate::registry::Cx;
use crate::rpc::{EIO, ENODEV, RpcError};

/// The host side and how exposures reach it.
#[derive(Debug)]
pub(super) struct Visible {
    /// `None` once shut down.
    host: Option<Arc<dyn Host>>,
    data_path: DataPathMode,
}

impl Visible {
    pub(super) fn new(host: Option<Arc<dyn Host>>, data_path: DataPathMode) -> Self {
        Self { host, data_path }
    }

    /// How an exposure of `bdev` reaches the host; `read_only` adds to the
    /// bdev's own read-only-ness (a read-only virtio-blk controller). A
    /// crypto bdev goes through the data path whatever the mode (directly,
    /// the host would see ciphertext); one whose key is gone is -ENODEV.
    pub(super) fn source(
        &self,
        bdev: &Bdev,
        read_only: bool,
        spdk: &Cx<'_>,
    ) -> Result<Source, RpcError> {
        let mut volume = spdk.volume_of(bdev)?;
        volume.backing.read_only |= read_only;
        let through = volume.cipher.is_some()
            || match self.data_path {
                DataPathMode::Direct => false,
                DataPathMode::Fuse => true,
                // Some bdev on the way has rate limits to enforce, or the
                // bytes are a remote target's, which may have its own (and
                // set them at any time), and whose pause holds I/O.
                DataPathMode::Auto => {
                    volume.remote.is_some() || volume.layers.iter().any(|l| l.qos.is_limited())
                }
            };
        if !through {
            return Ok(Source::Direct(volume.backing));
        }
        Ok(Source::DataPath(Arc::new(volume)))
    }

    /// Queues an NVMe namespace's attach (see [`Host::attach_nvme`]);
    /// `None` without a host side.
    pub(super) fn attach_nvme(
        &self,
        bdf: &str,
        ctrl: u32,
        ns: u32,
        nsid: u32,
        (uuid, serial): (&str, &str),
        source: Source,
    ) -> Result<Option<DiskRef>, RpcError> {
        let Some(host) = &self.host else {
            return Ok(None);
        };
        let disk = NvmeDisk {
            bdf,
            ctrl,
            ns,
            nsid,
            uuid,
            serial,
        };
        Arc::clone(host)
            .attach_nvme(disk, source)
            .map(Some)
            .map_err(|e| host_error("attach an NVMe namespace", &e))
    }

    /// Queues a virtio-blk disk's attach; `None` without a host side.
    pub(super) fn attach_virtio_blk(
        &self,
        bdf: &str,
        index: u32,
        letter: u32,
        serial: &str,
        source: Source,
    ) -> Result<Option<DiskRef>, RpcError> {
        let Some(host) = &self.host else {
            return Ok(None);
        };
        let name = virtio_disk_name(letter);
        let disk = VirtioBlkDisk {
            bdf,
            index,
            name: &name,
            serial,
        };
        Arc::clone(host)
            .attach_virtio_blk(disk, source)
            .map(Some)
            .map_err(|e| host_error("attach a virtio-blk disk", &e))
    }

    pub(super) fn detach(&self, disk: &DiskRef) {
        if let Some(host) = &self.host
            && let Err(e) = host.detach(disk)
        {
            tracing::error!("failed to detach {}: {e:#}", disk.sysfs_dir.display());
        }
    }

    /// Tells the host that the disks' bdev now has `backing`'s size.
    pub(super) fn resize(&self, disks: &[DiskRef], backing: &Backing) {
        let Some(host) = &self.host else {
            return;
        };
        for d in disks {
            if let Err(e) = host.resize(d, backing) {
                tracing::error!("failed to resize {}: {e:#}", d.sysfs_dir.display());
            }
        }
    }

    /// The kernel's counters of the disks the host reaches directly.
    pub(super) fn block_stat(&self, disks: &[DiskRef]) -> BlockStat {
        let mut total = BlockStat::default();
        if let Some(host) = &self.host {
            for disk in disks {
                if let Some(stat) = host.block_stat(disk) {
                    total.add(&stat);
                }
            }
        }
        total
    }

    /// Emulator-only: the host names a controller's NVMe namespace anew
    /// (`nvme<ctrl>`), keeping its device and identity. -19 without a host.
    pub(super) fn rename_nvme(&self, disk: &DiskRef, ctrl: u32) -> Result<DiskRef, RpcError> {
        let host = self.host.as_ref().ok_or(RpcError::errno(ENODEV))?;
        host.rename_nvme(disk, ctrl)
            .map_err(|e| host_error("rename a disk", &e))
    }

    /// Emulator-only: the host names a virtio-blk disk anew.
    pub(super) fn rename_virtio_blk(
        &self,
        disk: &DiskRef,
        index: u32,
        letter: u32,
    ) -> Result<DiskRef, RpcError> {
        let host = self.host.as_ref().ok_or(RpcError::errno(ENODEV))?;
        host.rename_virtio_blk(disk, index, &virtio_disk_name(letter))
            .map_err(|e| host_error("rename a disk", &e))
    }

    /// Whether there is a host side to show anything to.
    pub(super) fn has_host(&self) -> bool {
        self.host.is_some()
    }

    /// A hot-plugged function appears on the host.
    pub(super) fn add_function(&self, bdf: &str, kind: FunctionKind) -> Result<(), RpcError> {
        match &self.host {
            Some(host) => host
                .add_function(bdf, kind)
                .map_err(|e| host_error("add a PCI function", &e)),
            None => Ok(()),
        }
    }

    /// A hot-plugged function leaves the host (a failure is only logged:
    /// SNAP's state has let go of it).
    pub(super) fn remove_function(&self, bdf: &str) {
        if let Some(host) = &self.host
            && let Err(e) = host.remove_function(bdf)
        {
            tracing::error!("failed to remove PCI function {bdf}: {e:#}");
        }
    }

    /// A virtio-fs device of the function at `bdf` serving `root` under
    /// `tag` appears on the host: its `<n>`, `None` without a host.
    pub(super) fn show_virtiofs(
        &self,
        bdf: &str,
        tag: &str,
        root: &std::path::Path,
    ) -> Result<Option<u32>, RpcError> {
        match &self.host {
            Some(host) => host
                .show_virtiofs(bdf, tag, root)
                .map(Some)
                .map_err(|e| host_error("show a virtio-fs device", &e)),
            None => Ok(None),
        }
    }

    /// Virtio-fs device `<n>` leaves the host.
    pub(super) fn hide_virtiofs(&self, n: u32) {
        if let Some(host) = &self.host {
            host.hide_virtiofs(n);
        }
    }

    /// Graceful shutdown: the host side detaches every disk.
    pub(super) fn shutdown(&mut self) {
        if let Some(host) = self.host.take()
            && let Err(e) = host.shutdown()
        {
            tracing::error!("host side shutdown failed: {e:#}");
        }
    }
}

/// `vda`, ..., `vdz`, `vdaa`, ...: the kernel's disk naming.
pub(super) fn virtio_disk_name(index: u32) -> String {
    let mut letters = Vec::new();
    let mut n = u64::from(index) + 1;
    while n > 0 {
        n -= 1;
        letters.push(b'a' + (n % 26) as u8);
        n /= 26;
    }
    letters.reverse();
    format!("vd{}", String::from_utf8_lossy(&letters))
}

/// The lowest number not in `used`, as the kernel hands out instances.
pub(super) fn lowest_free(used: impl Iterator<Item = u32>) -> u32 {
    let mut used: Vec<u32> = used.collect();
    used.sort_unstable();
    let mut n = 0;
    for u in used {
        if u == n {
            n += 1;
        } else if u > n {
            break;
        }
    }
    n
}

/// The host side refused a disk before queueing it: -5 (EIO). The message
/// says why after SPDK's `strerror` text (free text on the wire, which no
/// caller parses): a test that sees the code alone has only "Input/output
/// error" to go on (a CI run's kill trials once did).
fn host_error(what: &str, e: &anyhow::Error) -> RpcError {
    tracing::error!("host side failed to {what}: {e:#}");
    let eio = RpcError::errno(EIO);
    RpcError::new(
        eio.code,
        format!("{}: the emulated host failed to {what}: {e:#}", eio.message),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_names_follow_the_kernel() {
        assert_eq!(virtio_disk_name(0), "vda");
        assert_eq!(virtio_disk_name(25), "vdz");
        assert_eq!(virtio_disk_name(26), "vdaa");
        assert_eq!(virtio_disk_name(27), "vdab");
        assert_eq!(virtio_disk_name(26 + 26 * 26), "vdaaa");
    }

    #[test]
    fn lowest_free_fills_holes() {
        assert_eq!(lowest_free([].into_iter()), 0);
        assert_eq!(lowest_free([0, 1, 3].into_iter()), 2);
        assert_eq!(lowest_free([3, 1, 0, 2].into_iter()), 4);
        assert_eq!(lowest_free([1, 2].into_iter()), 0);
    }
}
