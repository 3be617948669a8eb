//! A QEMU guest as the host: its real Linux kernel finds SNAP's functions
//! by hot-plug, as a BlueField's host does, where [`super::HostSide`] shows
//! them in a tree of our own.
//!
//! Each SNAP function is a PCIe root port of the guest
//! ([`GuestHostConfig::ports`]): its
//! bus is the function's bus, so the `pci_bdf` SNAP lists is the address the
//! guest's kernel gives the device (`<bus>:00.0`), and the node finds it
//! there as on a real host. A function shows in the guest when it has
//! something to show, as device `snap-<bus>` on its port (crate
//! `qemu-hotplug`):
//! - a disk (`disk`) over its bytes (the bdev's file, or its file on the
//!   emulator's data path, so encryption, QoS and NVMe-oF targets behave as
//!   on the tree): a virtio-blk function is `virtio-blk-pci` with SNAP's
//!   serial; an NVMe namespace is an NVMe controller with the subsystem's
//!   serial that comes with it as its NSID 1;
//! - a virtio-fs device (`virtio_fs`): `vhost-user-fs-pci` with the tag,
//!   served by virtiofsd over the fsdev's tree.
//!
//! NVMe, what QEMU cannot show: a namespace added to a live controller (QMP
//! has no hot-plug of `nvme-ns`), so only a dedicated volume's namespace
//! (NSID 1, the controller's first and only) shows; a packed pool's
//! namespaces are refused with that reason. The kernel also trusts none of
//! QEMU's namespace identifiers (its BOGUS_NID quirk): the host lists no
//! `uuid`, and the node identifies the namespace by its controller's serial
//! (`snap_csi::host::Sysfs::find_nvme_namespace`).
//!
//! Crash safety: the emulator keeps nothing on disk for the guest. A
//! restarted emulator unplugs whatever is on its ports, which only it
//! plugs into.
//!
//! What this does not prove: SNAP's own emulation (QEMU's devices stand in
//! for SNAP's) and a BlueField's PCIe timing; the guest's I/O counters are
//! the guest's own (`block_stat` knows none).

mod disk;
mod virtio_fs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use qemu_hotplug::Qmp;

use super::side::{BlockStat, Host, NvmeDisk, VirtioBlkDisk};
use super::tree::{DiskRef, FunctionKind};
use crate::datapath::fuse::DataPath;
use crate::datapath::volume::{Backing, Source};
use virtio_fs::Daemon;

/// A guest to plug into: its QMP monitor, the root ports SNAP's functions
/// go in, and the virtiofsd binary that serves virtio-fs devices.
#[derive(Debug, Clone)]
pub struct GuestHostConfig {
    pub qmp: PathBuf,
    /// (QEMU's id of a root port, the bus the guest gave it), in order.
    pub ports: Vec<(String, u8)>,
    pub virtiofsd: PathBuf,
}

impl GuestHostConfig {
    /// The buses SNAP's functions take, in order.
    pub fn buses(&self) -> Vec<u32> {
        self.ports.iter().map(|(_, bus)| u32::from(*bus)).collect()
    }
}

/// A QMP command, and a guest letting a device go under TCG on a loaded machine.
const QMP_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug)]
pub struct GuestHost {
    /// Root port ids by bus.
    ports: BTreeMap<u32, String>,
    virtiofsd: PathBuf,
    state_dir: PathBuf,
    datapath: DataPath,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    qmp: Qmp,
    /// What is plugged, by bus.
    plugged: BTreeMap<u32, Plugged>,
}

#[derive(Debug)]
enum Plugged {
    Disk(disk::Disk),
    /// A controller with its namespace, which QEMU cannot grow.
    Nvme(disk::Disk),
    Fs(Daemon),
}

impl GuestHost {
    /// Connects to the guest's monitor and unplugs what an earlier run left
    /// on the ports.
    pub fn open(config: &GuestHostConfig, state_dir: &Path) -> anyhow::Result<Self> {
        let qmp = Qmp::connect(&config.qmp, QMP_TIMEOUT)?;
        std::fs::create_dir_all(state_dir)
            .with_context(|| format!("creating {}", state_dir.display()))?;
        let state_dir = std::fs::canonicalize(state_dir)?;
        let host = Self {
            ports: config
                .ports
                .iter()
                .map(|(id, bus)| (u32::from(*bus), id.clone()))
                .collect(),
            virtiofsd: config.virtiofsd.clone(),
            datapath: DataPath::new(state_dir.join("datapath")),
            state_dir,
            state: Mutex::new(State {
                qmp,
                plugged: BTreeMap::new(),
            }),
        };
        host.datapath.unmount_stale()?;
        let mut state = host.state();
        for bus in host.ports.keys() {
            qemu_hotplug::remove(&mut state.qmp, &device_id(*bus), QMP_TIMEOUT)
                .context("unplugging what an earlier run left")?;
        }
        drop(state);
        Ok(host)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The bus of the function at `bdf` and its root port.
    fn port(&self, bdf: &str) -> anyhow::Result<(u32, &str)> {
        let bus = port_bus(bdf)
            .ok_or_else(|| anyhow!("{bdf} is not a function a root port holds (<bus>:00.0)"))?;
        let port = self
            .ports
            .get(&bus)
            .ok_or_else(|| anyhow!("no root port of the guest has bus {bus:02x} ({bdf})"))?;
        Ok((bus, port))
    }

    /// Plugs the function at `bdf` as `device` with its serial over
    /// `source`'s bytes, kept as `kind`.
    fn plug_disk(
        &self,
        bdf: &str,
        source: Source,
        (device, serial): (qemu_hotplug::Disk, &str),
        kind: fn(disk::Disk) -> Plugged,
    ) -> anyhow::Result<DiskRef> {
        let (bus, port) = self.port(bdf)?;
        let mut state = self.state();
        if state.plugged.contains_key(&bus) {
            bail!("{bdf} already shows a device");
        }
        let disk = disk::plug(&mut state.qmp, &self.datapath, source, |qmp, drive| {
            qemu_hotplug::add_disk(qmp, device, (&device_id(bus), port), drive, serial)
        })?;
        state.plugged.insert(bus, kind(disk));
        Ok(disk_ref(bus))
    }

    /// Unplugs what is on `bus`, if anything.
    fn unplug(&self, state: &mut State, bus: u32) -> anyhow::Result<()> {
        let Some(plugged) = state.plugged.remove(&bus) else {
            return Ok(());
        };
        let removed = qemu_hotplug::remove(&mut state.qmp, &device_id(bus), QMP_TIMEOUT);
        match plugged {
            Plugged::Disk(disk) | Plugged::Nvme(disk) => disk.release(&self.datapath),
            Plugged::Fs(daemon) => drop(daemon),
        }
        removed.with_context(|| format!("unplugging {}", device_id(bus)))
    }
}

/// The bus of `<bus>:00.0`, the one function a root port holds.
fn port_bus(bdf: &str) -> Option<u32> {
    u32::from_str_radix(bdf.strip_suffix(":00.0")?, 16).ok()
}

/// The QEMU id of what SNAP's function on `bus` shows.
fn device_id(bus: u32) -> String {
    format!("snap-{bus:02x}")
}

/// How the node would name the disk's function in the guest.
fn disk_ref(bus: u32) -> DiskRef {
    DiskRef {
        sysfs_dir: PathBuf::from(format!("/sys/bus/pci/devices/0000:{bus:02x}:00.0")),
    }
}

/// The bus of a [`disk_ref`].
fn bus_of(disk: &DiskRef) -> anyhow::Result<u32> {
    disk.sysfs_dir
        .file_name()
        .and_then(|name| name.to_str())
        .and_then(|name| name.strip_prefix("0000:"))
        .and_then(port_bus)
        .ok_or_else(|| anyhow!("{} is not a guest's disk", disk.sysfs_dir.display()))
}

impl Host for GuestHost {
    fn add_function(&self, bdf: &str, _kind: FunctionKind) -> anyhow::Result<()> {
        self.port(bdf).map(drop)
    }

    fn remove_function(&self, bdf: &str) -> anyhow::Result<()> {
        let (bus, _) = self.port(bdf)?;
        self.unplug(&mut self.state(), bus)
    }

    fn attach_nvme(self: Arc<Self>, d: NvmeDisk<'_>, source: Source) -> anyhow::Result<DiskRef> {
        // QEMU gives a live controller no new namespace: the controller
        // comes with its one namespace, NSID 1, a dedicated volume's.
        if d.nsid != 1 {
            bail!(
                "namespace {} of {}: a guest's NVMe controller carries NSID 1 only \
                 (QEMU cannot add a namespace to a live controller)",
                d.nsid,
                d.bdf
            );
        }
        let nvme = (qemu_hotplug::Disk::NvmeWithNamespace, d.serial);
        self.plug_disk(d.bdf, source, nvme, Plugged::Nvme)
    }

    fn attach_virtio_blk(
        self: Arc<Self>,
        d: VirtioBlkDisk<'_>,
        source: Source,
    ) -> anyhow::Result<DiskRef> {
        let virtio_blk = (qemu_hotplug::Disk::VirtioBlk, d.serial);
        self.plug_disk(d.bdf, source, virtio_blk, Plugged::Disk)
    }

    fn detach(&self, disk: &DiskRef) -> anyhow::Result<()> {
        self.unplug(&mut self.state(), bus_of(disk)?)
    }

    fn resize(&self, disk: &DiskRef, backing: &Backing) -> anyhow::Result<()> {
        let bus = bus_of(disk)?;
        let mut state = self.state();
        let State { qmp, plugged } = &mut *state;
        match plugged.get(&bus) {
            Some(Plugged::Disk(d)) => d.resize(qmp, &self.datapath, &device_id(bus), backing),
            // QEMU's namespace keeps the size it had when the controller
            // came, and the guest is told of no change.
            Some(Plugged::Nvme(_)) => bail!(
                "{}: QEMU's NVMe namespace cannot grow",
                disk.sysfs_dir.display()
            ),
            _ => bail!("{} shows no disk", disk.sysfs_dir.display()),
        }
    }

    fn block_stat(&self, _: &DiskRef) -> Option<BlockStat> {
        None
    }

    fn rename_nvme(&self, disk: &DiskRef, _: u32) -> anyhow::Result<DiskRef> {
        bail!(
            "{}: a guest's kernel names its disks itself",
            disk.sysfs_dir.display()
        )
    }

    fn rename_virtio_blk(&self, disk: &DiskRef, _: u32, _: &str) -> anyhow::Result<DiskRef> {
        bail!(
            "{}: a guest's kernel names its disks itself",
            disk.sysfs_dir.display()
        )
    }

    fn show_virtiofs(&self, bdf: &str, tag: &str, root: &Path) -> anyhow::Result<u32> {
        let (bus, port) = self.port(bdf)?;
        let mut state = self.state();
        if state.plugged.contains_key(&bus) {
            bail!("{bdf} already shows a device");
        }
        let socket = self.state_dir.join(format!("virtiofsd-{bus:02x}.sock"));
        let daemon = Daemon::start(&self.virtiofsd, &socket, root)?;
        qemu_hotplug::add_virtio_fs(&mut state.qmp, &device_id(bus), port, &socket, tag)?;
        state.plugged.insert(bus, Plugged::Fs(daemon));
        Ok(bus)
    }

    fn hide_virtiofs(&self, bus: u32) {
        if let Err(e) = self.unplug(&mut self.state(), bus) {
            tracing::error!("{e:#}");
        }
    }

    fn shutdown(&self) -> anyhow::Result<()> {
        let mut state = self.state();
        let buses: Vec<u32> = state.plugged.keys().copied().collect();
        let mut failed = Ok(());
        for bus in buses {
            if let Err(e) = self.unplug(&mut state, bus) {
                tracing::error!("{e:#}");
                failed = Err(e);
            }
        }
        self.datapath.unmount()?;
        failed
    }
}
