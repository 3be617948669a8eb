//! The host side of emulated PCI functions: what the x86 host would see.
//!
//! A real BlueField makes an emulated NVMe namespace or virtio-blk disk appear
//! as a PCI function with a block device under it. We make the same thing real
//! on this machine: a loop device over the bdev's backing storage, described in
//! a sysfs-shaped tree under `sysfs_root` that mirrors the kernel's layout:
//!
//! ```text
//! <root>/bus/pci/devices/0000:<bdf>/{vendor,device,class}
//! <root>/bus/pci/devices/0000:<bdf>/nvme/nvme<X>/nvme<X>n<Y>/{nsid,uuid,size,dev}
//! <root>/bus/pci/devices/0000:<bdf>/virtio<N>/block/vd<x>/{serial,size,dev}
//! ```
//!
//! File contents are the kernel's, byte for byte: `size` is in 512-byte sectors
//! and `dev` holds the loop device's real `major:minor`, so a reader resolves the
//! device node exactly as it would on a real host. Like the kernel's, `serial`
//! is at most 20 bytes and has no trailing newline.
//!
//! Directories appear atomically (built under `<root>/.snap-emu-tmp`, then
//! renamed into place), so a reader never sees a disk without its `dev`.
//!
//! The data path: a disk whose [`Source`] is [`Source::DataPath`] gets its
//! loop device over a file the emulator serves through FUSE (see
//! [`crate::datapath`]) instead of over the bdev's backing file; the file is
//! made just before the attach and goes with the record when it is released.
//!
//! Crash safety: every loop device is recorded in `<state_dir>/host-disks/`
//! before we rely on it, and the intent (backing file and offset) before
//! `losetup` runs, so a restarted emulator detaches what a crashed one left,
//! and only that: a loop device counts as ours only while its backing file,
//! inode and offset still match the record. `<state_dir>/host.lock` keeps a
//! second emulator from "cleaning up" the loop devices of a live one.
//!
//! Every method but the `*_in_background` attaches blocks (it runs `losetup`
//! and fsyncs); call it from `spawn_blocking`. Calls for different PCI functions run in parallel; calls
//! for the same function run one at a time, in the order they were made.
//!
//! Asynchronous discovery. On a BlueField, SNAP answers a controller resume or
//! a namespace attach once its own state has changed; the host's NVMe or
//! virtio driver finds the disk afterwards (hot-plug), and consumers poll
//! sysfs for it. The `*_in_background` attaches model that: they check their
//! arguments, take their place in the function's line and return a
//! [`DiskRef`], while a thread of their own makes the loop device and the
//! directory. Whatever is asked of the same function later (detach, resize,
//! removing the function) waits for it, so a disk never appears after its
//! detach returned; [`shutdown`](HostSide::shutdown) waits for every queued
//! attach, and the crash records cover one cut short by a kill. An attach that
//! fails in the background is logged and undone like any failed attach.
//!
//! What this does not model: a real host's discovery latency (ours is the time
//! `losetup` takes, milliseconds), a driver that gives up on a namespace it
//! cannot read, and the host noticing a disk leave: removal is synchronous
//! here, while a real host learns of it after SNAP answered.

mod loop_ioctl;
mod loopdev;
mod missed;
mod records;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, TryLockError};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};

use crate::datapath::fuse::DataPath;
use crate::datapath::volume::{Backing, Volume};
use crate::faults::Faults;
use loopdev::LoopState;
use missed::MissedDisk;
use records::{DiskRecord, Records};

/// What a disk shows the host: a byte range directly, or a [`Volume`]
/// through the emulator's data path.
#[derive(Debug, Clone)]
pub enum Source {
    Direct(Backing),
    DataPath(Arc<Volume>),
}

impl From<Backing> for Source {
    fn from(backing: Backing) -> Self {
        Self::Direct(backing)
    }
}

/// One disk made visible to the host: a loop device plus its sysfs directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostDisk {
    /// `/dev/loopN`.
    pub loop_device: PathBuf,
    pub major: u32,
    pub minor: u32,
    /// The namespace or disk directory in the tree (`.../nvme0/nvme0n1`, `.../block/vda`).
    pub sysfs_dir: PathBuf,
}

/// A disk whose attach was queued: its place in the tree names it, since its
/// loop device may not exist yet (or ever, if the attach fails).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskRef {
    /// The namespace or disk directory it has (or will have) in the tree.
    pub sysfs_dir: PathBuf,
}

#[derive(Debug)]
pub struct HostSide {
    /// Canonical, so that the `sysfs_dir` of a `HostDisk` maps back to its disk.
    sysfs_root: PathBuf,
    state_dir: PathBuf,
    records: Records,
    functions: Arc<FunctionLocks>,
    jobs: Arc<Jobs>,
    faults: Faults,
    /// Attaches of disks the host missed (see [`Faults::miss_discovery`]),
    /// by record key, until a rescan or their detach.
    missed: Mutex<HashMap<String, MissedDisk>>,
    /// Serves the disks whose source is the data path.
    datapath: DataPath,
    /// Held (flock) for our lifetime; the kernel drops it when the process dies.
    _lock: File,
    tmp_seq: AtomicU64,
}

const DEVICES: &str = "bus/pci/devices";
const TMP_DIR: &str = ".snap-emu-tmp";
const RECORDS_DIR: &str = "host-disks";
const LOCK_FILE: &str = "host.lock";
/// The data path's FUSE mount point.
const DATAPATH_DIR: &str = "datapath";
const SECTOR: u64 = 512;
/// VIRTIO_BLK_ID_BYTES: the kernel shows at most this much of the serial.
const VIRTIO_BLK_ID_BYTES: usize = 20;
/// How long `detach` keeps retrying a busy `losetup -d` before it falls back
/// to autoclear.
const DETACH_PATIENCE: Duration = Duration::from_secs(3);
/// How long a detach deferred to the last close may take before we stop
/// waiting for it and report it as deferred.
const DETACH_SETTLE: Duration = Duration::from_secs(1);

impl HostSide {
    /// Opens the host side and removes whatever an earlier run left behind:
    /// recorded loop devices whose backing file still matches, and the tree.
    pub fn open(sysfs_root: &Path, state_dir: &Path) -> anyhow::Result<Self> {
        refuse_system_root(sysfs_root)?;
        fs::create_dir_all(sysfs_root)
            .with_context(|| format!("creating sysfs root {}", sysfs_root.display()))?;
        let sysfs_root = fs::canonicalize(sysfs_root)
            .with_context(|| format!("resolving sysfs root {}", sysfs_root.display()))?;
        refuse_system_root(&sysfs_root)?;
        fs::create_dir_all(state_dir)
            .with_context(|| format!("creating state dir {}", state_dir.display()))?;
        let state_dir = fs::canonicalize(state_dir)
            .with_context(|| format!("resolving state dir {}", state_dir.display()))?;

        let lock_path = state_dir.join(LOCK_FILE);
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .with_context(|| format!("opening {}", lock_path.display()))?;
        // A child forked by another thread holds a copy of our descriptors
        // until it execs, and with them a previous owner's lock: give that a moment.
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(10));
                }
                Err(TryLockError::WouldBlock) => bail!(
                    "{} is locked: another HostSide uses state dir {} (another snap-emu, \
                     or a HostSide of this process that is still alive)",
                    lock_path.display(),
                    state_dir.display()
                ),
                Err(TryLockError::Error(e)) => {
                    return Err(e).with_context(|| format!("locking {}", lock_path.display()));
                }
            }
        }

        let version = loopdev::version()?;
        tracing::debug!(%version, "using losetup");
        let records = Records::open(state_dir.join(RECORDS_DIR))?;
        records.sweep_temp_files()?;
        let host = Self {
            sysfs_root,
            state_dir: state_dir.clone(),
            records,
            functions: Arc::default(),
            jobs: Arc::default(),
            faults: Faults::default(),
            missed: Mutex::default(),
            datapath: DataPath::new(state_dir.join(DATAPATH_DIR)),
            _lock: lock,
            tmp_seq: AtomicU64::new(0),
        };
        host.release_everything()
            .and_then(|()| host.datapath.unmount_stale())
            .with_context(|| {
                format!(
                    "cleaning up what an earlier run left (records in {}, tree under {})",
                    host.state_dir.display(),
                    host.sysfs_root.display()
                )
            })?;
        Ok(host)
    }

    /// The host side with the faults a test switches on.
    pub fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// Creates `bus/pci/devices/0000:<bdf>` (with `vendor`, `device`, `class`).
    pub fn add_pci_function(&self, bdf: &str, kind: FunctionKind) -> anyhow::Result<()> {
        validate_bdf(bdf)?;
        let dir = self.function_dir(bdf);
        let _guard = self.functions.lock(bdf);
        match function_kind(&dir)? {
            Some(existing) if existing == kind => return Ok(()),
            Some(existing) => bail!(
                "PCI function {} already exists as a {} function, not {}",
                dir.display(),
                existing.name(),
                kind.name()
            ),
            None => {}
        }
        let (vendor, device, class) = kind.ids();
        let files = [
            ("vendor", format!("0x{vendor:04x}\n").into_bytes()),
            ("device", format!("0x{device:04x}\n").into_bytes()),
            ("class", format!("0x{class:06x}\n").into_bytes()),
        ];
        self.install_dir(&dir, &files)
            .with_context(|| format!("creating PCI function {}", dir.display()))?;
        tracing::info!(bdf, kind = kind.name(), "added PCI function");
        Ok(())
    }

    /// Removes a function's directory (after all its disks are detached).
    ///
    /// Disks still under it are detached first, so that removing a function
    /// can never strand a loop device.
    pub fn remove_pci_function(&self, bdf: &str) -> anyhow::Result<()> {
        validate_bdf(bdf)?;
        let dir = self.function_dir(bdf);
        let _guard = self.functions.lock(bdf);
        let prefix = format!("0000:{bdf}_");
        for (key, record) in self.records.list()? {
            if !key.starts_with(&prefix) {
                continue;
            }
            let record = record?;
            tracing::warn!(
                disk = %record.sysfs_dir.display(),
                "removing PCI function with a disk still attached; detaching it"
            );
            self.release(&key, &record)
                .with_context(|| format!("removing PCI function {}", dir.display()))?;
        }
        remove_dir_all_if_present(&dir)
            .with_context(|| format!("removing PCI function {}", dir.display()))?;
        tracing::info!(bdf, "removed PCI function");
        Ok(())
    }

    // Synchronous, for the tests; the emulator itself queues (below).
    #[cfg(test)]
    /// Makes `nvme<ctrl>n<ns>` with namespace id `nsid` appear under `bdf`.
    pub fn attach_nvme_namespace(
        &self,
        bdf: &str,
        ctrl: u32,
        ns: u32,
        nsid: u32,
        uuid: &str,
        backing: &Backing,
    ) -> anyhow::Result<HostDisk> {
        let (id, attrs) = nvme_disk(bdf, ctrl, ns, nsid, uuid)?;
        self.attach(&id, &attrs, &Source::Direct(backing.clone()))
    }

    // Synchronous, for the tests; the emulator itself queues (below).
    #[cfg(test)]
    /// Makes `virtio<virtio>/block/<disk>` with `serial` appear under `bdf`.
    pub fn attach_virtio_blk(
        &self,
        bdf: &str,
        virtio: u32,
        disk: &str,
        serial: &str,
        backing: &Backing,
    ) -> anyhow::Result<HostDisk> {
        let (id, attrs) = virtio_disk(bdf, virtio, disk, serial)?;
        self.attach(&id, &attrs, &Source::Direct(backing.clone()))
    }

    /// [`attach_nvme_namespace`](Self::attach_nvme_namespace) on a thread of
    /// its own, as a host's NVMe driver discovers a namespace some time after
    /// the controller announced it. Only the arguments are checked before this
    /// returns; a failure later is logged, and leaves nothing behind.
    pub fn attach_nvme_namespace_in_background(
        self: &Arc<Self>,
        bdf: &str,
        ctrl: u32,
        ns: u32,
        nsid: u32,
        uuid: &str,
        source: impl Into<Source>,
    ) -> anyhow::Result<DiskRef> {
        let (id, attrs) = nvme_disk(bdf, ctrl, ns, nsid, uuid)?;
        self.attach_in_background(id, attrs, source.into())
    }

    /// [`attach_virtio_blk`](Self::attach_virtio_blk) on a thread of its own,
    /// like [`attach_nvme_namespace_in_background`](Self::attach_nvme_namespace_in_background).
    pub fn attach_virtio_blk_in_background(
        self: &Arc<Self>,
        bdf: &str,
        virtio: u32,
        disk: &str,
        serial: &str,
        source: impl Into<Source>,
    ) -> anyhow::Result<DiskRef> {
        let (id, attrs) = virtio_disk(bdf, virtio, disk, serial)?;
        self.attach_in_background(id, attrs, source.into())
    }

    /// Queues the attach behind every earlier call for the same function, so
    /// that whatever is asked of the function later happens after it.
    fn attach_in_background(
        self: &Arc<Self>,
        id: DiskId,
        attrs: DiskAttrs,
        source: Source,
    ) -> anyhow::Result<DiskRef> {
        let disk = DiskRef {
            sysfs_dir: self.disk_dir(&id),
        };
        let thread_name = format!("attach-{}", id.bdf());
        let ticket = self.functions.reserve(id.bdf());
        let running = self.jobs.start();
        let host = Arc::clone(self);
        let job = move || {
            let guard = ticket.wait();
            if host.faults.misses(&attrs.identity()) {
                tracing::info!(disk = %host.disk_dir(&id).display(), "the host missed this disk (fault)");
                host.missed_disks()
                    .insert(id.key(), MissedDisk { id, attrs, source });
            } else if let Err(e) = host.attach_locked(&id, &attrs, &source) {
                tracing::warn!(
                    "host discovery of {} failed: {e:#}",
                    host.disk_dir(&id).display()
                );
            }
            drop(guard);
            // Dropped before the job counts as finished: a shutdown that waits
            // for the jobs then holds the last reference, and with it the lock.
            drop(host);
            drop(running);
        };
        thread::Builder::new()
            .name(thread_name)
            .spawn(job)
            .with_context(|| format!("starting the attach of {}", disk.sysfs_dir.display()))?;
        Ok(disk)
    }

    /// The loop device of a queued disk, once its attach has made one.
    pub fn loop_device_of(&self, disk: &DiskRef) -> Option<PathBuf> {
        let id = self.disk_id(&disk.sysfs_dir).ok()?;
        let name = self.records.load(&id.key()).ok()??.loop_device?;
        Some(loopdev::dev_path(&name))
    }

    /// Whether a queued disk is served through the data path (so its I/O
    /// is counted there, not by the kernel's counters of its loop device).
    pub fn is_on_data_path(&self, disk: &DiskRef) -> bool {
        self.disk_id(&disk.sysfs_dir)
            .ok()
            .and_then(|id| self.records.load(&id.key()).ok()?)
            .is_some_and(|record| self.datapath.volume_at(&record.backing_path).is_some())
    }

    // Synchronous, for the tests; the emulator itself queues (below).
    #[cfg(test)]
    /// Tells the host the disk changed size (lvol resize, aio rescan).
    ///
    /// The loop device keeps its backing file and offset; only the size limit
    /// changes, in place, while the host may have the device open. `losetup`
    /// cannot do that (it refuses `--sizelimit` on an attached device and
    /// `--set-capacity` stops at the old limit), so a new limit goes through
    /// LOOP_SET_STATUS64, after which the kernel recomputes the capacity and
    /// announces it. With an unchanged limit, `losetup --set-capacity` re-reads
    /// a backing file that has grown into it.
    pub fn resize(&self, disk: &HostDisk, backing: &Backing) -> anyhow::Result<()> {
        let what = || format!("resizing {}", disk.sysfs_dir.display());
        let id = self.disk_id(&disk.sysfs_dir).with_context(what)?;
        let name = loopdev::name_of(&disk.loop_device).with_context(what)?;
        let _guard = self.functions.lock(id.bdf());
        self.resize_locked(&id, &name, backing).with_context(what)
    }

    /// [`resize`](Self::resize) of a queued disk, after its attach.
    pub fn resize_queued(&self, disk: &DiskRef, backing: &Backing) -> anyhow::Result<()> {
        let what = || format!("resizing {}", disk.sysfs_dir.display());
        let id = self.disk_id(&disk.sysfs_dir).with_context(what)?;
        let _guard = self.functions.lock(id.bdf());
        let name = self
            .records
            .load(&id.key())
            .with_context(what)?
            .and_then(|record| record.loop_device)
            .ok_or_else(|| anyhow!("not on the host (its attach failed)"))
            .with_context(what)?;
        self.resize_locked(&id, &name, backing).with_context(what)
    }

    // Synchronous, for the tests; the emulator itself queues (below).
    #[cfg(test)]
    /// Detaches the loop device and removes the disk's directory and any parent
    /// (`nvme<X>`, `virtio<N>`) left empty. Detaching an absent disk succeeds.
    pub fn detach(&self, disk: &HostDisk) -> anyhow::Result<()> {
        let what = || format!("detaching {}", disk.sysfs_dir.display());
        let id = self.disk_id(&disk.sysfs_dir).with_context(what)?;
        let name = loopdev::name_of(&disk.loop_device).with_context(what)?;
        let _guard = self.functions.lock(id.bdf());
        self.detach_locked(&id, Some(&name)).with_context(what)
    }

    /// [`detach`](Self::detach) of a queued disk: it waits for the attach
    /// (which came earlier in the function's line), then removes whatever that
    /// attach left, which is nothing if it failed.
    pub fn detach_queued(&self, disk: &DiskRef) -> anyhow::Result<()> {
        let what = || format!("detaching {}", disk.sysfs_dir.display());
        let id = self.disk_id(&disk.sysfs_dir).with_context(what)?;
        let _guard = self.functions.lock(id.bdf());
        self.detach_locked(&id, None).with_context(what)
    }

    /// Emulator-only: the NVMe namespace disk takes the controller instance
    /// `ctrl` (`nvme<ctrl>n<ns>`, the same `ns`), keeping its loop device, as
    /// a host names a controller anew after a reconnect (see [`Self::rename_queued`]).
    pub fn rename_nvme_queued(&self, disk: &DiskRef, ctrl: u32) -> anyhow::Result<DiskRef> {
        let from = self.disk_id(&disk.sysfs_dir)?;
        let DiskId::Nvme { bdf, ns, .. } = &from else {
            bail!("{} is not an NVMe namespace", disk.sysfs_dir.display());
        };
        let to = DiskId::Nvme {
            bdf: bdf.clone(),
            ctrl,
            ns: *ns,
        };
        self.rename_queued(&from, &to)
    }

    /// Emulator-only: the virtio-blk disk becomes `virtio<virtio>/block/<name>`,
    /// keeping its loop device (see [`Self::rename_queued`]).
    pub fn rename_virtio_blk_queued(
        &self,
        disk: &DiskRef,
        virtio: u32,
        name: &str,
    ) -> anyhow::Result<DiskRef> {
        validate_disk_name(name)?;
        let from = self.disk_id(&disk.sysfs_dir)?;
        let DiskId::VirtioBlk { bdf, .. } = &from else {
            bail!("{} is not a virtio-blk disk", disk.sysfs_dir.display());
        };
        let to = DiskId::VirtioBlk {
            bdf: bdf.clone(),
            virtio,
            disk: name.to_owned(),
        };
        self.rename_queued(&from, &to)
    }

    /// Moves an attached disk to another name under its function: the same
    /// loop device (so a filesystem mounted from it stays mounted) and the
    /// same identity (NSID and UUID, or serial), a new kernel name. Real
    /// hosts rename this way after a reconnect when the old name is still
    /// held; the node must find the disk by its identity, never its name.
    fn rename_queued(&self, from: &DiskId, to: &DiskId) -> anyhow::Result<DiskRef> {
        let (old_dir, new_dir) = (self.disk_dir(from), self.disk_dir(to));
        let what = || format!("renaming {} to {}", old_dir.display(), new_dir.display());
        let _guard = self.functions.lock(from.bdf());
        let record = match self.records.load(&from.key()).with_context(what)? {
            Some(record) if live_state(&record).with_context(what)?.is_some() => record,
            _ => return Err(anyhow!("not on the host")).with_context(what),
        };
        if self.records.load(&to.key()).with_context(what)?.is_some() || new_dir.exists() {
            return Err(anyhow!("the new name is taken")).with_context(what);
        }
        // The new record first: after a crash in between, two records name
        // one loop device, and releasing the second finds it gone.
        let moved = DiskRecord {
            sysfs_dir: new_dir.clone(),
            ..record
        };
        self.records.store(&to.key(), &moved).with_context(what)?;
        (|| -> anyhow::Result<()> {
            if let Some(parent) = new_dir.parent() {
                fs::create_dir_all(parent)?;
            }
            fs::rename(&old_dir, &new_dir)?;
            self.remove_disk_dirs(from)?;
            self.records.remove(&from.key())
        })()
        .with_context(what)?;
        tracing::info!(from = %old_dir.display(), to = %new_dir.display(), "renamed");
        Ok(DiskRef { sysfs_dir: new_dir })
    }

    /// Detaches the disk at `id`; with `expected`, only if that is still its
    /// loop device.
    fn detach_locked(&self, id: &DiskId, expected: Option<&str>) -> anyhow::Result<()> {
        let key = id.key();
        self.missed_disks().remove(&key);
        if let Some(record) = self.records.load(&key)? {
            if let (Some(expected), Some(have)) = (expected, &record.loop_device)
                && have != expected
            {
                // The disk was detached and attached again since this handle
                // was made; the new attachment is not the caller's to remove.
                tracing::warn!(
                    disk = %self.disk_dir(id).display(),
                    stale = %loopdev::dev_path(expected).display(),
                    "detach of a stale handle; leaving the current attachment"
                );
                return Ok(());
            }
            self.release(&key, &record)?;
        }
        self.remove_disk_dirs(id)?;
        tracing::info!(disk = %self.disk_dir(id).display(), "detached");
        Ok(())
    }

    /// Waits for the queued attaches, then detaches every disk and removes the
    /// whole tree (graceful shutdown).
    pub fn shutdown(&self) -> anyhow::Result<()> {
        self.jobs.wait_idle();
        // Loop devices first: detaching one closes its data path file.
        self.release_everything()
            .and_then(|()| self.datapath.unmount())
            .with_context(|| {
                format!(
                    "shutting down the host side (records in {}, tree under {})",
                    self.state_dir.display(),
                    self.sysfs_root.display()
                )
            })
    }

    fn devices_dir(&self) -> PathBuf {
        self.sysfs_root.join(DEVICES)
    }

    fn function_dir(&self, bdf: &str) -> PathBuf {
        self.devices_dir().join(format!("0000:{bdf}"))
    }

    fn disk_dir(&self, id: &DiskId) -> PathBuf {
        let mut dir = self.function_dir(id.bdf());
        dir.extend(id.rel_dirs());
        dir
    }

    /// Maps a disk's directory back to the disk it names, refusing one that is not
    /// under our tree.
    fn disk_id(&self, sysfs_dir: &Path) -> anyhow::Result<DiskId> {
        sysfs_dir
            .strip_prefix(self.devices_dir())
            .ok()
            .and_then(DiskId::parse)
            .ok_or_else(|| {
                anyhow!(
                    "{} is not a disk directory under {}",
                    sysfs_dir.display(),
                    self.devices_dir().display()
                )
            })
    }

    #[cfg(test)]
    fn attach(&self, id: &DiskId, attrs: &DiskAttrs, source: &Source) -> anyhow::Result<HostDisk> {
        let _guard = self.functions.lock(id.bdf());
        self.attach_locked(id, attrs, source)
            .with_context(|| format!("attaching {}", self.disk_dir(id).display()))
    }

    fn attach_locked(
        &self,
        id: &DiskId,
        attrs: &DiskAttrs,
        source: &Source,
    ) -> anyhow::Result<HostDisk> {
        let key = id.key();
        let function = self.function_dir(id.bdf());
        match function_kind(&function)? {
            Some(kind) if kind == id.kind() => {}
            Some(kind) => bail!(
                "PCI function {} is a {} function",
                function.display(),
                kind.name()
            ),
            None => bail!(
                "PCI function {} does not exist (add_pci_function first)",
                function.display()
            ),
        }
        if let Some(record) = self.records.load(&key)? {
            if let Some(state) = live_state(&record)? {
                if self.is_same_source(source, &record)? {
                    // A retried attach: same disk, same bytes. Hand back what exists.
                    return self.publish(id, attrs, &state);
                }
                bail!(
                    "already attached to {} (offset {}, {} bytes{}) as {}; detach it first",
                    record.backing_path.display(),
                    record.offset,
                    record.size,
                    if record.read_only { ", read-only" } else { "" },
                    loopdev::dev_path(&state.name).display()
                );
            }
            // The record outlived its device (detached behind our back).
            self.release(&key, &record)?;
        }
        // A directory without a record holds no loop device: debris of a failed removal.
        self.remove_disk_dirs(id)?;

        let backing = match source {
            Source::Direct(backing) => backing.clone(),
            Source::DataPath(volume) => self.datapath.add(Arc::clone(volume))?,
        };
        // Whatever fails from here on, the data path file must not outlive it.
        self.attach_backing(id, attrs, &backing)
            .inspect_err(|_| self.datapath.remove(&backing.path))
    }

    /// Whether a retried attach asks for what the record already has: the
    /// same bytes, or the same volume through the data path.
    fn is_same_source(&self, source: &Source, record: &DiskRecord) -> anyhow::Result<bool> {
        Ok(match source {
            Source::Direct(backing) => {
                let target = Target::of(backing)?;
                target.is_record(record)
                    && record.size == target.size
                    && record.read_only == target.read_only
            }
            Source::DataPath(volume) => self
                .datapath
                .volume_at(&record.backing_path)
                .is_some_and(|served| served.backing == volume.backing),
        })
    }

    /// The attach proper, of a disk that has no record: `backing` gets a
    /// loop device and the disk its directory.
    fn attach_backing(
        &self,
        id: &DiskId,
        attrs: &DiskAttrs,
        backing: &Backing,
    ) -> anyhow::Result<HostDisk> {
        let key = id.key();
        let target = Target::of(backing)?;
        let preexisting = loopdev::all_bound()?
            .into_iter()
            .filter(|state| target.owns(state))
            .map(|state| state.name)
            .collect();
        let mut record = target.intent(self.disk_dir(id), preexisting);
        self.records.store(&key, &record)?;

        let attached = (|| -> anyhow::Result<HostDisk> {
            // A data path file takes requests in parallel, and QoS quotas
            // are used as soon as a timeslice opens only if requests wait.
            let direct_io = self.datapath.volume_at(&backing.path).is_some();
            let name = loopdev::attach(
                &target.path,
                target.offset,
                target.size,
                target.read_only,
                direct_io,
            )?;
            record.loop_device = Some(name.clone());
            self.records.store(&key, &record)?;
            let device = loopdev::dev_path(&name);
            let state = live_state(&record)?.ok_or_else(|| {
                anyhow!(
                    "{} vanished right after losetup attached it",
                    device.display()
                )
            })?;
            if state.read_only != target.read_only {
                bail!(
                    "{} came up {} (losetup falls back to read-only when it cannot open {} for writing)",
                    device.display(),
                    if state.read_only {
                        "read-only"
                    } else {
                        "writable"
                    },
                    target.path.display()
                );
            }
            if state.sectors != target.size / SECTOR {
                bail!(
                    "{} has {} sectors, expected {}",
                    device.display(),
                    state.sectors,
                    target.size / SECTOR
                );
            }
            self.publish(id, attrs, &state)
        })();
        match attached {
            Ok(disk) => {
                tracing::info!(
                    disk = %disk.sysfs_dir.display(),
                    device = %disk.loop_device.display(),
                    backing = %target.path.display(),
                    offset = target.offset,
                    size = target.size,
                    "attached"
                );
                Ok(disk)
            }
            Err(e) => {
                // A failed attach must hold nothing; the record goes only once
                // whatever losetup may have attached is gone. A losetup that
                // exited with an error attached nothing; one we had to kill may have.
                let unknown = e.downcast_ref::<loopdev::TimedOut>().is_some();
                let undo = if record.loop_device.is_some() || unknown {
                    self.release(&key, &record)
                } else {
                    self.records.remove(&key)
                };
                if let Err(undo) = undo {
                    return Err(e.context(format!(
                        "the attach failed, and undoing it failed too: {undo:#}"
                    )));
                }
                let _ = self.remove_disk_dirs(id);
                Err(e)
            }
        }
    }

    /// Writes the disk's directory for the loop device `state` and returns the handle.
    fn publish(
        &self,
        id: &DiskId,
        attrs: &DiskAttrs,
        state: &LoopState,
    ) -> anyhow::Result<HostDisk> {
        let size = format!("{}\n", state.sectors).into_bytes();
        let dev = format!("{}:{}\n", state.major, state.minor).into_bytes();
        let files = match attrs {
            DiskAttrs::Nvme { nsid, uuid } => vec![
                ("nsid", format!("{nsid}\n").into_bytes()),
                ("uuid", format!("{uuid}\n").into_bytes()),
                ("size", size),
                ("dev", dev),
            ],
            DiskAttrs::VirtioBlk { serial } => {
                vec![("serial", serial.clone()), ("size", size), ("dev", dev)]
            }
        };
        let dir = self.disk_dir(id);
        if !dir_holds(&dir, &files) {
            self.install_dir(&dir, &files)
                .with_context(|| format!("writing {}", dir.display()))?;
        }
        Ok(HostDisk {
            loop_device: loopdev::dev_path(&state.name),
            major: state.major,
            minor: state.minor,
            sysfs_dir: dir,
        })
    }

    fn resize_locked(&self, id: &DiskId, name: &str, backing: &Backing) -> anyhow::Result<()> {
        let key = id.key();
        let device = loopdev::dev_path(name);
        let mut record = self
            .records
            .load(&key)?
            .filter(|record| record.loop_device.as_deref() == Some(name))
            .ok_or_else(|| {
                anyhow!(
                    "{} is not attached here (no record of it)",
                    device.display()
                )
            })?;
        // A disk on the data path keeps its file, which now serves the new size.
        let backing = match self.datapath.volume_at(&record.backing_path) {
            Some(_) => self.datapath.resize(&record.backing_path, backing)?,
            None => backing.clone(),
        };
        let target = Target::of(&backing)?;
        if !target.is_record(&record) {
            bail!(
                "a resize cannot move the disk: it is {} at offset {}, asked for {} at offset {}",
                record.backing_path.display(),
                record.offset,
                target.path.display(),
                target.offset
            );
        }
        if target.read_only != record.read_only {
            bail!("a resize cannot change read-only to {}", target.read_only);
        }
        let before = live_state(&record)?.ok_or_else(|| {
            anyhow!(
                "{} is no longer attached to {}",
                device.display(),
                record.backing_path.display()
            )
        })?;
        if before.sizelimit == target.size {
            loopdev::set_capacity(name)?;
        } else {
            loopdev::set_sizelimit(name, target.size)?;
        }
        let after = live_state(&record)?
            .ok_or_else(|| anyhow!("{} vanished during the resize", device.display()))?;
        if after.sectors != target.size / SECTOR {
            bail!(
                "{} has {} sectors after the resize, expected {}",
                device.display(),
                after.sectors,
                target.size / SECTOR
            );
        }
        record.size = target.size;
        self.records.store(&key, &record)?;
        let dir = self.disk_dir(id);
        replace_file(&dir.join("size"), format!("{}\n", after.sectors).as_bytes())?;
        tracing::info!(
            disk = %dir.display(),
            from = before.sectors * SECTOR,
            to = target.size,
            "resized"
        );
        Ok(())
    }

    /// Detaches what a record owns, then drops the record.
    fn release(&self, key: &str, record: &DiskRecord) -> anyhow::Result<()> {
        let candidates = match &record.loop_device {
            Some(name) => vec![name.clone()],
            // Only the intent was recorded: losetup may have attached a device
            // we never learnt of. Any device over the same bytes that was not
            // there before, and that no other record claims, is that one. (A
            // second attach of the same bytes racing this one, between its
            // losetup and its record, could still be mistaken for it: exposing
            // one bdev twice at once is not something SNAP does.)
            None => {
                let claimed: HashSet<String> = self
                    .records
                    .list()?
                    .into_iter()
                    .filter_map(|(_, other)| other.ok()?.loop_device)
                    .collect();
                loopdev::all_bound()?
                    .into_iter()
                    .filter(|state| {
                        !record.preexisting.contains(&state.name) && !claimed.contains(&state.name)
                    })
                    .map(|state| state.name)
                    .collect()
            }
        };
        for name in candidates {
            detach_loop(&name, record)?;
        }
        self.datapath.remove(&record.backing_path);
        self.records.remove(key)
    }

    /// Releases every record and removes every function we made. Failures are
    /// collected, not fatal, so that one stuck device does not keep the rest.
    fn release_everything(&self) -> anyhow::Result<()> {
        let mut failures = Vec::new();
        for (key, record) in self.records.list()? {
            let _guard = key_bdf(&key).map(|bdf| self.functions.lock(bdf));
            match record {
                Ok(record) => {
                    tracing::info!(disk = %record.sysfs_dir.display(), "releasing");
                    if let Err(e) = self.release(&key, &record) {
                        failures.push(format!("{e:#}"));
                    }
                }
                Err(e) => {
                    // Records are written atomically, so this is not a torn write;
                    // nothing in it can be trusted to say which device is ours.
                    tracing::error!("dropping unreadable record {key}: {e:#}");
                    if let Err(e) = self.records.remove(&key) {
                        failures.push(format!("{e:#}"));
                    }
                }
            }
        }
        if let Err(e) = self.remove_tree() {
            failures.push(format!("{e:#}"));
        }
        if !failures.is_empty() {
            bail!("{}", failures.join("; "));
        }
        Ok(())
    }

    /// Removes the functions we made (recognised by their ids) and the empty
    /// `bus/pci/devices` above them; anything else under the root is left alone.
    fn remove_tree(&self) -> anyhow::Result<()> {
        let devices = self.devices_dir();
        let entries = match fs::read_dir(&devices) {
            Ok(entries) => Some(entries),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("listing {}", devices.display())),
        };
        for entry in entries.into_iter().flatten() {
            let entry = entry.with_context(|| format!("listing {}", devices.display()))?;
            let name = entry.file_name();
            let Some(bdf) = name.to_str().and_then(|n| n.strip_prefix("0000:")) else {
                continue;
            };
            if validate_bdf(bdf).is_err() || !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let _guard = self.functions.lock(bdf);
            let path = entry.path();
            match function_kind(&path) {
                Ok(Some(_)) => remove_dir_all_if_present(&path)
                    .with_context(|| format!("removing {}", path.display()))?,
                Ok(None) => {}
                Err(e) => tracing::warn!("leaving {} alone: {e:#}", path.display()),
            }
        }
        for dir in [
            devices,
            self.sysfs_root.join("bus/pci"),
            self.sysfs_root.join("bus"),
        ] {
            remove_dir_if_empty(&dir)?;
        }
        remove_dir_all_if_present(&self.sysfs_root.join(TMP_DIR))
    }

    /// Removes the disk's directory and the parents it leaves empty, up to but
    /// not including the function's directory.
    fn remove_disk_dirs(&self, id: &DiskId) -> anyhow::Result<()> {
        let mut dir = self.disk_dir(id);
        remove_dir_all_if_present(&dir).with_context(|| format!("removing {}", dir.display()))?;
        for _ in 1..id.rel_dirs().len() {
            dir.pop();
            remove_dir_if_empty(&dir)?;
        }
        Ok(())
    }

    /// Puts a directory with exactly `files` at `dir`, replacing what is there,
    /// in one rename so that readers see all of it or none of it.
    fn install_dir(&self, dir: &Path, files: &[(&str, Vec<u8>)]) -> anyhow::Result<()> {
        let tmp_root = self.sysfs_root.join(TMP_DIR);
        fs::create_dir_all(&tmp_root)
            .with_context(|| format!("creating {}", tmp_root.display()))?;
        let tmp = tmp_root.join(format!(
            "{}-{}",
            std::process::id(),
            self.tmp_seq.fetch_add(1, Ordering::Relaxed)
        ));
        let build = || -> io::Result<()> {
            fs::create_dir(&tmp)?;
            for (name, contents) in files {
                fs::write(tmp.join(name), contents)?;
            }
            if let Some(parent) = dir.parent() {
                fs::create_dir_all(parent)?;
            }
            match fs::remove_dir_all(dir) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            fs::rename(&tmp, dir)
        };
        build().map_err(|e| {
            let _ = fs::remove_dir_all(&tmp);
            anyhow!(e)
        })
    }
}

/// Which kind of PCI function the host sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FunctionKind {
    Nvme,
    VirtioBlk,
}

impl FunctionKind {
    /// `(vendor, device, class)` as the host reads them from sysfs.
    fn ids(self) -> (u16, u16, u32) {
        match self {
            // BlueField emulated NVMe functions enumerate as Mellanox (0x15b3)
            // "NVMe SNAP Controller" 0x6001, class NVMe (0x010802).
            FunctionKind::Nvme => (0x15b3, 0x6001, 0x010802),
            // Linux's virtio-pci driver binds only vendor 0x1af4 (the virtio
            // spec reserves it for all virtio PCI devices), so an emulated
            // virtio-blk function presents 0x1af4 whoever built it: 0x1042 is
            // the modern virtio-blk device id, shown with class 0x010000 (SCSI
            // storage controller) as QEMU shows it.
            FunctionKind::VirtioBlk => (0x1af4, 0x1042, 0x010000),
        }
    }

    fn name(self) -> &'static str {
        match self {
            FunctionKind::Nvme => "NVMe",
            FunctionKind::VirtioBlk => "virtio-blk",
        }
    }
}

/// Which kind of function we made at `dir`, `None` if there is none, an error
/// if something is there that we did not make.
fn function_kind(dir: &Path) -> anyhow::Result<Option<FunctionKind>> {
    let read = |name: &str| fs::read_to_string(dir.join(name));
    match (read("vendor"), read("device"), read("class")) {
        (Ok(vendor), Ok(device), Ok(class)) => {
            for kind in [FunctionKind::Nvme, FunctionKind::VirtioBlk] {
                let (v, d, c) = kind.ids();
                if vendor == format!("0x{v:04x}\n")
                    && device == format!("0x{d:04x}\n")
                    && class == format!("0x{c:06x}\n")
                {
                    return Ok(Some(kind));
                }
            }
            bail!(
                "{} holds vendor {} device {} class {}: not a function this emulator makes",
                dir.display(),
                vendor.trim(),
                device.trim(),
                class.trim()
            )
        }
        (Err(e), _, _) if e.kind() == io::ErrorKind::NotFound && !dir.exists() => Ok(None),
        _ => bail!(
            "{} exists but has no readable vendor/device/class: not a function this emulator made",
            dir.display()
        ),
    }
}

/// Checks an NVMe namespace's arguments and spells them as the kernel would.
fn nvme_disk(
    bdf: &str,
    ctrl: u32,
    ns: u32,
    nsid: u32,
    uuid: &str,
) -> anyhow::Result<(DiskId, DiskAttrs)> {
    validate_bdf(bdf)?;
    if nsid == 0 || nsid == u32::MAX {
        bail!("invalid NVMe namespace id {nsid}: valid ids are 1..=0xfffffffe");
    }
    // The kernel prints the UUID with %pU: lowercase, hyphenated.
    let uuid = uuid::Uuid::parse_str(uuid)
        .with_context(|| format!("invalid namespace UUID {uuid:?}"))?
        .hyphenated()
        .to_string();
    let id = DiskId::Nvme {
        bdf: bdf.to_owned(),
        ctrl,
        ns,
    };
    Ok((id, DiskAttrs::Nvme { nsid, uuid }))
}

/// Checks a virtio-blk disk's arguments and cuts the serial as the device does.
fn virtio_disk(
    bdf: &str,
    virtio: u32,
    disk: &str,
    serial: &str,
) -> anyhow::Result<(DiskId, DiskAttrs)> {
    validate_bdf(bdf)?;
    validate_disk_name(disk)?;
    // The device holds 20 bytes, NUL-padded; the kernel prints up to the
    // first NUL. A longer serial is cut here as the device would cut it.
    let serial = serial.as_bytes();
    let serial = serial.split(|&b| b == 0).next().unwrap_or_default();
    let serial = serial[..serial.len().min(VIRTIO_BLK_ID_BYTES)].to_vec();
    let id = DiskId::VirtioBlk {
        bdf: bdf.to_owned(),
        virtio,
        disk: disk.to_owned(),
    };
    Ok((id, DiskAttrs::VirtioBlk { serial }))
}

/// A disk's place in the tree, which is also its identity.
#[derive(Debug, Clone, PartialEq, Eq)]
enum DiskId {
    Nvme {
        bdf: String,
        ctrl: u32,
        ns: u32,
    },
    VirtioBlk {
        bdf: String,
        virtio: u32,
        disk: String,
    },
}

impl DiskId {
    fn bdf(&self) -> &str {
        match self {
            DiskId::Nvme { bdf, .. } | DiskId::VirtioBlk { bdf, .. } => bdf,
        }
    }

    fn kind(&self) -> FunctionKind {
        match self {
            DiskId::Nvme { .. } => FunctionKind::Nvme,
            DiskId::VirtioBlk { .. } => FunctionKind::VirtioBlk,
        }
    }

    /// The record's file name: unambiguous because every part is validated
    /// (`n` and `_` cannot occur inside the numbers or the disk name).
    fn key(&self) -> String {
        match self {
            DiskId::Nvme { bdf, ctrl, ns } => format!("0000:{bdf}_nvme{ctrl}n{ns}"),
            DiskId::VirtioBlk { bdf, virtio, disk } => format!("0000:{bdf}_virtio{virtio}_{disk}"),
        }
    }

    /// Directories below the function's, outermost first; the last is the disk's.
    fn rel_dirs(&self) -> Vec<String> {
        match self {
            DiskId::Nvme { ctrl, ns, .. } => vec![
                "nvme".to_owned(),
                format!("nvme{ctrl}"),
                format!("nvme{ctrl}n{ns}"),
            ],
            DiskId::VirtioBlk { virtio, disk, .. } => {
                vec![format!("virtio{virtio}"), "block".to_owned(), disk.clone()]
            }
        }
    }

    /// Parses a path relative to `bus/pci/devices`; only the exact spelling
    /// `rel_dirs` produces is accepted.
    fn parse(rel: &Path) -> Option<DiskId> {
        let parts: Vec<&str> = rel
            .components()
            .map(|c| c.as_os_str().to_str())
            .collect::<Option<_>>()?;
        let [function, a, b, c] = parts.as_slice() else {
            return None;
        };
        let bdf = function.strip_prefix("0000:")?;
        validate_bdf(bdf).ok()?;
        let number = |s: &str| -> Option<u32> {
            s.bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| s.parse().ok())?
        };
        let id = if *a == "nvme" {
            let ctrl = number(b.strip_prefix("nvme")?)?;
            let ns = number(c.strip_prefix(b)?.strip_prefix('n')?)?;
            DiskId::Nvme {
                bdf: bdf.to_owned(),
                ctrl,
                ns,
            }
        } else {
            validate_disk_name(c).ok()?;
            DiskId::VirtioBlk {
                bdf: bdf.to_owned(),
                virtio: number(a.strip_prefix("virtio")?)?,
                disk: (*c).to_owned(),
            }
        };
        (id.rel_dirs() == [*a, *b, *c]).then_some(id)
    }
}

/// The PCI address part of a record key, for taking the function's lock.
fn key_bdf(key: &str) -> Option<&str> {
    let bdf = key.strip_prefix("0000:")?.split('_').next()?;
    validate_bdf(bdf).ok().map(|()| bdf)
}

#[derive(Debug)]
enum DiskAttrs {
    Nvme { nsid: u32, uuid: String },
    VirtioBlk { serial: Vec<u8> },
}

/// A validated backing byte range.
#[derive(Debug)]
struct Target {
    /// Canonical, because that is what the kernel shows as `backing_file`.
    path: PathBuf,
    dev: u64,
    ino: u64,
    offset: u64,
    size: u64,
    read_only: bool,
}

impl Target {
    fn of(backing: &Backing) -> anyhow::Result<Self> {
        let shown = backing.path.display();
        if backing.size == 0 || !backing.size.is_multiple_of(SECTOR) {
            bail!(
                "backing {shown}: size {} is not a positive multiple of {SECTOR} bytes",
                backing.size
            );
        }
        let path = fs::canonicalize(&backing.path)
            .with_context(|| format!("backing {shown} cannot be resolved"))?;
        if path.to_str().is_none() {
            bail!("backing {shown}: path is not UTF-8");
        }
        let meta = fs::metadata(&path).with_context(|| format!("backing {shown}"))?;
        let file_type = meta.file_type();
        if !file_type.is_file() && !file_type.is_block_device() {
            bail!("backing {shown} is neither a regular file nor a block device");
        }
        // Seeking to the end measures a block device as well as a file.
        let len = File::open(&path)
            .and_then(|mut file| file.seek(SeekFrom::End(0)))
            .with_context(|| format!("measuring backing {shown}"))?;
        let fits = backing
            .offset
            .checked_add(backing.size)
            .is_some_and(|end| end <= len);
        if !fits {
            bail!(
                "backing {shown}: {} bytes at offset {} go past its end ({len} bytes); \
                 a loop device would come out short",
                backing.size,
                backing.offset
            );
        }
        Ok(Self {
            path,
            dev: meta.dev(),
            ino: meta.ino(),
            offset: backing.offset,
            size: backing.size,
            read_only: backing.read_only,
        })
    }

    /// The record written before `losetup` runs: the bytes, no device yet.
    fn intent(&self, sysfs_dir: PathBuf, preexisting: Vec<String>) -> DiskRecord {
        DiskRecord {
            sysfs_dir,
            backing_path: self.path.clone(),
            backing_dev: self.dev,
            backing_ino: self.ino,
            offset: self.offset,
            size: self.size,
            read_only: self.read_only,
            loop_device: None,
            preexisting,
        }
    }

    /// Same bytes as the record (size aside).
    fn is_record(&self, record: &DiskRecord) -> bool {
        self.path == record.backing_path
            && self.ino == record.backing_ino
            && loopdev::split_dev(self.dev) == loopdev::split_dev(record.backing_dev)
            && self.offset == record.offset
    }

    fn owns(&self, state: &LoopState) -> bool {
        loop_matches(state, &self.path, self.dev, self.ino, self.offset)
    }
}

/// Whether the bound loop device `state` is over `path` (same inode) at `offset`.
///
/// A file on a dead FUSE mount (a killed emulator's data path) cannot say
/// its inode (ENOTCONN): its path, in a mount no one else makes files in,
/// is identity enough.
fn loop_matches(state: &LoopState, path: &Path, dev: u64, ino: u64, offset: u64) -> bool {
    state.offset == offset
        && loopdev::backing_is(&state.backing_file, path)
        // Checked last: it opens the device, the cheap sysfs tests came first.
        && match loopdev::backing_identity(&state.name) {
            Ok((have_dev, have_ino)) => {
                have_ino == ino && loopdev::split_dev(have_dev) == loopdev::split_dev(dev)
            }
            Err(e) => e.raw_os_error() == Some(ENOTCONN),
        }
}

const ENOTCONN: i32 = 107;

fn record_owns(record: &DiskRecord, state: &LoopState) -> bool {
    loop_matches(
        state,
        &record.backing_path,
        record.backing_dev,
        record.backing_ino,
        record.offset,
    )
}

/// The recorded loop device's state, if it is still bound to the recorded bytes.
fn live_state(record: &DiskRecord) -> anyhow::Result<Option<LoopState>> {
    let Some(name) = &record.loop_device else {
        return Ok(None);
    };
    Ok(loopdev::state(name)?.filter(|state| record_owns(record, state)))
}

/// Detaches `name` if it is still the record's device; a device that is gone,
/// or now someone else's, counts as detached.
///
/// Since Linux 5.x LOOP_CLR_FD on an open device sets autoclear and succeeds,
/// and the device goes away on its last close; older kernels answer EBUSY, so
/// after retrying we set autoclear ourselves. Either way nothing leaks. Probes
/// (`losetup -l`, blkid) open devices for a moment, so a deferred detach is
/// given a second to complete before we report it as deferred.
fn detach_loop(name: &str, record: &DiskRecord) -> anyhow::Result<()> {
    let device = loopdev::dev_path(name);
    let deadline = Instant::now() + DETACH_PATIENCE;
    let mut nap = Duration::from_millis(20);
    let mut asked_at: Option<Instant> = None;
    let mut refusal = String::new();
    loop {
        let Some(state) = loopdev::state(name)? else {
            return Ok(());
        };
        if !record_owns(record, &state) {
            return Ok(());
        }
        if let Some(asked_at) = asked_at
            && state.autoclear
        {
            if asked_at.elapsed() >= DETACH_SETTLE {
                tracing::warn!(device = %device.display(), "still open; the kernel detaches it on last close");
                return Ok(());
            }
            thread::sleep(Duration::from_millis(5));
            continue;
        }
        if Instant::now() >= deadline {
            break;
        }
        if asked_at.is_some() {
            thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(200));
        }
        if let Err(why) = loopdev::detach(name)? {
            refusal = why;
        }
        asked_at.get_or_insert_with(Instant::now);
    }
    let failure = || {
        format!(
            "could not detach {} (backing {} at offset {}){}",
            device.display(),
            record.backing_path.display(),
            record.offset,
            if refusal.is_empty() {
                String::new()
            } else {
                format!(": losetup said {refusal}")
            }
        )
    };
    loopdev::set_autoclear(name).with_context(failure)?;
    match loopdev::state(name)? {
        Some(state) if record_owns(record, &state) && !state.autoclear => {
            bail!("{}; autoclear did not stick", failure())
        }
        _ => {
            tracing::warn!(device = %device.display(), "busy; set autoclear so the kernel detaches it on last close");
            Ok(())
        }
    }
}

/// Serialises the calls for one PCI function, first come first served;
/// calls for different functions never wait for each other, and nothing is
/// held across them but this.
///
/// The order matters because a background attach takes its place in line
/// when SNAP's state changes, not when its thread gets to run: a detach of
/// the same function that comes later must find the disk attached, never
/// overtake the attach and leave it to appear afterwards.
#[derive(Debug, Default)]
struct FunctionLocks {
    lines: Mutex<HashMap<String, Line>>,
    turn: Condvar,
}

/// One function's line: ticket `served` holds the function, and every ticket
/// below `issued` waits for its turn.
#[derive(Debug, Default)]
struct Line {
    issued: u64,
    served: u64,
}

impl FunctionLocks {
    fn lock(self: &Arc<Self>, bdf: &str) -> FunctionGuard {
        self.reserve(bdf).wait()
    }

    fn reserve(self: &Arc<Self>, bdf: &str) -> Ticket {
        // The lines are only ever left consistent, so a panic elsewhere is no
        // reason to stop using them.
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        let line = lines.entry(bdf.to_owned()).or_default();
        let number = line.issued;
        line.issued += 1;
        Ticket {
            locks: Some(Arc::clone(self)),
            bdf: bdf.to_owned(),
            number,
        }
    }
}

/// A place in a function's line.
#[derive(Debug)]
#[must_use]
struct Ticket {
    /// Taken when the ticket is redeemed.
    locks: Option<Arc<FunctionLocks>>,
    bdf: String,
    number: u64,
}

impl Ticket {
    fn wait(mut self) -> FunctionGuard {
        let locks = self.locks.take().expect("a ticket is redeemed once");
        let mut lines = locks.lines.lock().unwrap_or_else(PoisonError::into_inner);
        while lines
            .get(&self.bdf)
            .is_some_and(|l| l.served != self.number)
        {
            lines = locks
                .turn
                .wait(lines)
                .unwrap_or_else(PoisonError::into_inner);
        }
        drop(lines);
        FunctionGuard {
            locks,
            bdf: std::mem::take(&mut self.bdf),
        }
    }
}

impl Drop for Ticket {
    /// A ticket that was never redeemed (its job could not start) still has
    /// to pass its turn on, or the function's line stops for good.
    fn drop(&mut self) {
        if self.locks.is_some() {
            let bdf = std::mem::take(&mut self.bdf);
            drop(
                Ticket {
                    locks: self.locks.take(),
                    bdf,
                    number: self.number,
                }
                .wait(),
            );
        }
    }
}

#[derive(Debug)]
struct FunctionGuard {
    locks: Arc<FunctionLocks>,
    bdf: String,
}

impl Drop for FunctionGuard {
    fn drop(&mut self) {
        let mut lines = self
            .locks
            .lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(line) = lines.get_mut(&self.bdf) {
            line.served += 1;
            if line.served == line.issued {
                lines.remove(&self.bdf);
            }
        }
        drop(lines);
        self.locks.turn.notify_all();
    }
}

/// Background host jobs not finished yet; shutdown waits for none.
#[derive(Debug, Default)]
struct Jobs {
    running: Mutex<usize>,
    finished: Condvar,
}

impl Jobs {
    fn start(self: &Arc<Self>) -> JobGuard {
        *self.running.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        JobGuard(Arc::clone(self))
    }

    fn wait_idle(&self) {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        while *running > 0 {
            running = self
                .finished
                .wait(running)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Counts a job as running until dropped, also when its thread never starts.
#[derive(Debug)]
struct JobGuard(Arc<Jobs>);

impl Drop for JobGuard {
    fn drop(&mut self) {
        *self
            .0
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner) -= 1;
        self.0.finished.notify_all();
    }
}

/// `bus:device.function` without the domain, in the kernel's lowercase hex.
fn validate_bdf(bdf: &str) -> anyhow::Result<()> {
    let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
    let ok = match bdf.as_bytes() {
        &[b0, b1, b':', d0, d1, b'.', f] => {
            hex(b0) && hex(b1) && hex(d0) && hex(d1) && d0 <= b'1' && (b'0'..=b'7').contains(&f)
        }
        _ => false,
    };
    if !ok {
        bail!(
            "invalid PCI address {bdf:?}: expected bus:device.function without the domain, \
             lowercase hex, device at most 1f, function at most 7 (e.g. \"26:00.1\")"
        );
    }
    Ok(())
}

/// A block device name as the kernel would make it (`vda`, `vdab`): it becomes
/// a directory name and part of a record's file name.
fn validate_disk_name(disk: &str) -> anyhow::Result<()> {
    let ok = disk.len() < 32
        && disk.starts_with(|c: char| c.is_ascii_lowercase())
        && disk
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !ok {
        bail!("invalid disk name {disk:?}: expected lowercase letters and digits, like \"vda\"");
    }
    Ok(())
}

/// Refuses a root whose tree would land in, or be deleted from, the real system.
fn refuse_system_root(root: &Path) -> anyhow::Result<()> {
    if root == Path::new("/")
        || ["/sys", "/proc", "/dev"]
            .iter()
            .any(|p| root.starts_with(p))
    {
        bail!(
            "refusing {} as the emulated sysfs root: the emulator creates and deletes \
             bus/pci/devices/0000:* there; use a directory of its own",
            root.display()
        );
    }
    Ok(())
}

/// Whether `dir` already holds `files` with exactly these contents.
fn dir_holds(dir: &Path, files: &[(&str, Vec<u8>)]) -> bool {
    files
        .iter()
        .all(|(name, contents)| fs::read(dir.join(name)).is_ok_and(|have| have == *contents))
}

/// Rewrites one file so that a reader sees the old or the new contents, never a mix.
fn replace_file(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| anyhow!("{} has no file name", path.display()))?;
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    fs::write(&tmp, contents)
        .and_then(|()| fs::rename(&tmp, path))
        .inspect_err(|_| {
            let _ = fs::remove_file(&tmp);
        })
        .with_context(|| format!("writing {}", path.display()))
}

fn remove_dir_all_if_present(dir: &Path) -> anyhow::Result<()> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", dir.display()))
        }
        _ => Ok(()),
    }
}

fn remove_dir_if_empty(dir: &Path) -> anyhow::Result<()> {
    match fs::remove_dir(dir) {
        Err(e)
            if !matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::DirectoryNotEmpty
            ) =>
        {
            Err(e).with_context(|| format!("removing {}", dir.display()))
        }
        _ => Ok(()),
    }
}
