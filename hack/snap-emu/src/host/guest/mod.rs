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
//! - a virtio-blk disk (`virtio_blk`): `virtio-blk-pci` with SNAP's serial
//!   over the disk's bytes (the bdev's file, or its file on the emulator's
//!   data path, so encryption, QoS and NVMe-oF targets behave as on the
//!   tree);
//! - a virtio-fs device (`virtio_fs`): `vhost-user-fs-pci` with the tag,
//!   served by virtiofsd over the fsdev's tree.
//!
//! NVMe is not here yet: QEMU cannot add a namespace to a live controller,
//! which SNAP's namespace attach needs (the way around it, namespaces made
//! detached at boot and attached from inside the guest, is to come); an
//! attach is refused with that reason.
//!
//! Crash safety: the emulator keeps nothing on disk for the guest. A
//! restarted emulator unplugs whatever is on its ports, which only it
//! plugs into.
//!
//! What this does not prove: SNAP's own emulation (QEMU's devices stand in
//! for SNAP's) and a BlueField's PCIe timing; the guest's I/O counters are
//! the guest's own (`block_stat` knows none).

mod virtio_blk;
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
    Disk(virtio_blk::Disk),
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

    /// Unplugs what is on `bus`, if anything.
    fn unplug(&self, state: &mut State, bus: u32) -> anyhow::Result<()> {
        let Some(plugged) = state.plugged.remove(&bus) else {
            return Ok(());
        };
        let removed = qemu_hotplug::remove(&mut state.qmp, &device_id(bus), QMP_TIMEOUT);
        match plugged {
            Plugged::Disk(disk) => disk.release(&self.datapath),
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

    fn attach_nvme(self: Arc<Self>, d: NvmeDisk<'_>, _: Source) -> anyhow::Result<DiskRef> {
        bail!(
            "namespace {} of {}: a guest host has no NVMe yet (QEMU cannot add a namespace \
             to a live controller)",
            d.nsid,
            d.bdf
        )
    }

    fn attach_virtio_blk(
        self: Arc<Self>,
        d: VirtioBlkDisk<'_>,
        source: Source,
    ) -> anyhow::Result<DiskRef> {
        let (bus, port) = self.port(d.bdf)?;
        let mut state = self.state();
        if state.plugged.contains_key(&bus) {
            bail!("{} already shows a device", d.bdf);
        }
        let disk = virtio_blk::plug(
            &mut state.qmp,
            &self.datapath,
            (&device_id(bus), port),
            d.serial,
            source,
        )?;
        state.plugged.insert(bus, Plugged::Disk(disk));
        Ok(disk_ref(bus))
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
