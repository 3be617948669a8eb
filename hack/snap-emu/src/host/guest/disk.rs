//! A disk in the guest: a block function (`virtio-blk-pci`, or an NVMe
//! controller with its namespace) over the disk's bytes, read straight from
//! the bdev's file or from its file on the emulator's data path.

use std::path::PathBuf;

use anyhow::bail;
use qemu_hotplug::{Drive, Qmp};

use crate::datapath::fuse::DataPath;
use crate::datapath::volume::{Backing, Source};

/// A plugged disk.
#[derive(Debug)]
pub(super) struct Disk {
    /// Its file on the data path, which goes with it.
    datapath_file: Option<PathBuf>,
    /// Whether QEMU reads the whole file (which can then grow), not a
    /// window of it.
    whole_file: bool,
}

/// Plugs the disk's function with `device` (a `qemu_hotplug` block
/// function's add) over the bytes of `source`.
pub(super) fn plug(
    qmp: &mut Qmp,
    datapath: &DataPath,
    source: Source,
    device: impl FnOnce(&mut Qmp, &Drive<'_>) -> anyhow::Result<()>,
) -> anyhow::Result<Disk> {
    let (backing, datapath_file) = match source {
        Source::Direct(backing) => (backing, None),
        Source::DataPath(volume) => {
            let backing = datapath.add(volume)?;
            let path = backing.path.clone();
            (backing, Some(path))
        }
    };
    let whole_file = backing.offset == 0
        && std::fs::metadata(&backing.path).is_ok_and(|m| m.len() == backing.size);
    let drive = Drive {
        file: &backing.path,
        offset: backing.offset,
        size: (!whole_file).then_some(backing.size),
        read_only: backing.read_only,
    };
    let disk = Disk {
        datapath_file,
        whole_file,
    };
    if let Err(e) = device(qmp, &drive) {
        disk.release(datapath);
        return Err(e);
    }
    Ok(disk)
}

impl Disk {
    /// What it held outside QEMU, once unplugged.
    pub(super) fn release(self, datapath: &DataPath) {
        if let Some(path) = &self.datapath_file {
            datapath.remove(path);
        }
    }

    /// Tells the guest the disk has `backing`'s size now.
    pub(super) fn resize(
        &self,
        qmp: &mut Qmp,
        datapath: &DataPath,
        id: &str,
        backing: &Backing,
    ) -> anyhow::Result<()> {
        if !self.whole_file {
            bail!("{id} shows a window of its file, which QEMU cannot grow");
        }
        if let Some(path) = &self.datapath_file {
            datapath.resize(path, backing)?;
        }
        qemu_hotplug::resize(qmp, id, backing.size)
    }
}
