//! The host side of emulated PCI functions: what the x86 host would see.
//! SNAP's model reaches a host through one seam ([`Host`], `side`); this
//! module's [`HostSide`] is the host this machine makes, `guest` a QEMU
//! guest's real kernel.
//!
//! A real BlueField makes an emulated NVMe namespace or virtio-blk disk appear
//! as a PCI function with a block device under it. We make the same thing real
//! on this machine: a loop device over the bdev's backing storage, described in
//! a sysfs-shaped tree under `sysfs_root` that mirrors the kernel's layout
//! (`tree`), in the PCI domain of the DPU it emulates ([`PciDomain`]), so
//! that the emulators of a host's two DPUs can share one tree.
//!
//! A started, hot-plugged virtio-fs device is its entry under `fs/virtiofs`
//! and a socket a host mounts it through, handing the emulator the FUSE
//! connection to serve its fsdev's tree on (`virtiofs`).
//!
//! The data path: a disk whose [`Source`] is [`Source::DataPath`] gets its
//! loop device over a file the emulator serves through FUSE (see
//! [`crate::datapath`]) instead of over the bdev's backing file; the file is
//! made just before the attach and goes with the record when it is released.
//!
//! Crash safety: every loop device is recorded before we rely on it
//! (`records`), so a restarted emulator detaches what a crashed one left, and
//! only that (`recovery`). `<state_dir>/host.lock` keeps a second emulator
//! from "cleaning up" the loop devices of a live one.
//!
//! Every method but the `*_in_background` attaches blocks (it runs `losetup`
//! and fsyncs); call it from `spawn_blocking`. Calls for different PCI
//! functions run in parallel; calls for the same function run one at a time,
//! in the order they were made (`queue`).
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

mod domain;
mod guest;
mod loop_ioctl;
mod loopdev;
mod missed;
mod nvme_names;
mod queue;
mod records;
mod recovery;
mod side;
#[cfg(test)]
mod tests;
mod tree;
mod virtiofs;

use std::fs::{self, File, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};

use crate::datapath::fuse::DataPath;
use crate::datapath::volume::{Backing, Source};
use crate::faults::{Faults, Rescan};
use missed::{Missed, MissedDisk};
use queue::Queue;
use records::{DiskRecord, Records};
use recovery::{Target, live_state};
use tree::{
    DiskAttrs, DiskId, SECTOR, Tree, key_bdf, nvme_disk, validate_bdf, validate_disk_name,
    virtio_disk,
};
use virtiofs::VirtioFs;

pub use domain::PciDomain;
pub use guest::{GuestHost, GuestHostConfig};
pub use nvme_names::NvmeNaming;
pub use side::{BlockStat, Host, NvmeDisk, VirtioBlkDisk};
pub use tree::{DiskRef, FunctionKind, HostDisk};

#[derive(Debug)]
pub struct HostSide {
    tree: Tree,
    state_dir: PathBuf,
    records: Records,
    queue: Queue,
    faults: Faults,
    /// Attaches of disks the host missed (see [`Faults::miss_discovery`]),
    /// until a rescan or their detach.
    missed: Missed,
    /// Serves the disks whose source is the data path.
    datapath: DataPath,
    /// The virtio-fs devices the host sees and their mounts.
    virtiofs: Mutex<VirtioFs>,
    /// Held (flock) for our lifetime; the kernel drops it when the process dies.
    _lock: File,
}

const RECORDS_DIR: &str = "host-disks";
const LOCK_FILE: &str = "host.lock";
/// The data path's FUSE mount point.
const DATAPATH_DIR: &str = "datapath";
/// Where virtio-fs devices are mounted, one directory per tag.
pub const VIRTIOFS_DIR: &str = "virtiofs";

impl HostSide {
    /// Opens the host side of the functions in `domain`, naming NVMe disks
    /// by `naming`, and removes whatever an earlier run left behind: recorded
    /// loop devices whose backing file still matches, and its domain of the
    /// tree.
    pub fn open(
        sysfs_root: &Path,
        (domain, naming): (PciDomain, NvmeNaming),
        state_dir: &Path,
    ) -> anyhow::Result<Self> {
        let tree = Tree::open(sysfs_root, domain, naming)?;
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
            tree,
            state_dir: state_dir.clone(),
            records,
            queue: Queue::default(),
            faults: Faults::default(),
            missed: Missed::default(),
            datapath: DataPath::new(state_dir.join(DATAPATH_DIR)),
            virtiofs: Mutex::new(VirtioFs::new(state_dir.join(VIRTIOFS_DIR))),
            _lock: lock,
        };
        host.release_everything()
            .and_then(|()| host.datapath.unmount_stale())
            .and_then(|()| host.virtiofs().clean_up(&host.tree))
            .with_context(|| {
                format!(
                    "cleaning up what an earlier run left (records in {}, tree under {})",
                    host.state_dir.display(),
                    host.tree.root().display()
                )
            })?;
        Ok(host)
    }

    /// The host side with the faults a test switches on.
    pub fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// Creates `bus/pci/devices/<domain>:<bdf>` (with `vendor`, `device`, `class`).
    pub fn add_pci_function(&self, bdf: &str, kind: FunctionKind) -> anyhow::Result<()> {
        validate_bdf(bdf)?;
        let _guard = self.queue.lock(bdf);
        self.tree.add_function(bdf, kind)?;
        tracing::info!(bdf, kind = kind.name(), "added PCI function");
        Ok(())
    }

    /// Removes a function's directory (after all its disks are detached).
    ///
    /// Disks still under it are detached first, so that removing a function
    /// can never strand a loop device.
    pub fn remove_pci_function(&self, bdf: &str) -> anyhow::Result<()> {
        validate_bdf(bdf)?;
        let dir = self.tree.function_dir(bdf);
        let _guard = self.queue.lock(bdf);
        let prefix = DiskId::key_prefix(bdf);
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
        self.tree
            .remove_function(bdf)
            .with_context(|| format!("removing PCI function {}", dir.display()))?;
        tracing::info!(bdf, "removed PCI function");
        Ok(())
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
            sysfs_dir: self.tree.disk_dir(&id),
        };
        let bdf = id.bdf().to_owned();
        let host = Arc::clone(self);
        let job = move || {
            if host.faults.misses(&attrs.identity()) {
                tracing::info!(disk = %host.tree.disk_dir(&id).display(), "the host missed this disk (fault)");
                host.missed.insert(MissedDisk { id, attrs, source });
            } else if let Err(e) = host.attach_locked(&id, &attrs, &source) {
                tracing::warn!(
                    "host discovery of {} failed: {e:#}",
                    host.tree.disk_dir(&id).display()
                );
            }
        };
        self.queue
            .spawn(&bdf, format!("attach-{bdf}"), job)
            .with_context(|| format!("starting the attach of {}", disk.sysfs_dir.display()))?;
        Ok(disk)
    }

    /// The loop device of a queued disk, once its attach has made one.
    pub fn loop_device_of(&self, disk: &DiskRef) -> Option<PathBuf> {
        let id = self.tree.disk_id(&disk.sysfs_dir).ok()?;
        let name = self.records.load(&id.key()).ok()??.loop_device?;
        Some(loopdev::dev_path(&name))
    }

    /// Whether a queued disk is served through the data path (so its I/O
    /// is counted there, not by the kernel's counters of its loop device).
    fn is_on_data_path(&self, disk: &DiskRef) -> bool {
        self.tree
            .disk_id(&disk.sysfs_dir)
            .ok()
            .and_then(|id| self.records.load(&id.key()).ok()?)
            .is_some_and(|record| self.datapath.volume_at(&record.backing_path).is_some())
    }

    /// The kernel's counters of a queued disk's loop device, unless the
    /// disk is served through the data path.
    pub fn block_stat(&self, disk: &DiskRef) -> Option<BlockStat> {
        if self.is_on_data_path(disk) {
            return None;
        }
        let dev = self.loop_device_of(disk)?;
        let path = PathBuf::from("/sys/block")
            .join(dev.file_name()?)
            .join("stat");
        let text = fs::read_to_string(path).ok()?;
        Some(BlockStat::parse(&text))
    }

    /// Tells the host the disk changed size (lvol resize, aio rescan), after
    /// its attach.
    ///
    /// The loop device keeps its backing file and offset; only the size limit
    /// changes, in place, while the host may have the device open. `losetup`
    /// cannot do that (it refuses `--sizelimit` on an attached device and
    /// `--set-capacity` stops at the old limit), so a new limit goes through
    /// LOOP_SET_STATUS64, after which the kernel recomputes the capacity and
    /// announces it. With an unchanged limit, `losetup --set-capacity` re-reads
    /// a backing file that has grown into it.
    pub fn resize_queued(&self, disk: &DiskRef, backing: &Backing) -> anyhow::Result<()> {
        let what = || format!("resizing {}", disk.sysfs_dir.display());
        let id = self.tree.disk_id(&disk.sysfs_dir).with_context(what)?;
        let _guard = self.queue.lock(id.bdf());
        let name = self
            .records
            .load(&id.key())
            .with_context(what)?
            .and_then(|record| record.loop_device)
            .ok_or_else(|| anyhow!("not on the host (its attach failed)"))
            .with_context(what)?;
        self.resize_locked(&id, &name, backing).with_context(what)
    }

    /// Detaches the loop device and removes the disk's directory and any parent
    /// (`nvme<X>`, `virtio<N>`) left empty; detaching an absent disk succeeds.
    /// It waits for the attach (which came earlier in the function's line),
    /// then removes whatever that attach left, which is nothing if it failed.
    pub fn detach_queued(&self, disk: &DiskRef) -> anyhow::Result<()> {
        let what = || format!("detaching {}", disk.sysfs_dir.display());
        let id = self.tree.disk_id(&disk.sysfs_dir).with_context(what)?;
        let _guard = self.queue.lock(id.bdf());
        self.detach_locked(&id).with_context(what)
    }

    /// Emulator-only: the NVMe namespace disk takes the controller instance
    /// `ctrl` (`nvme<ctrl>n<ns>`, the same `ns`), keeping its loop device, as
    /// a host names a controller anew after a reconnect (see [`Self::rename_queued`]).
    pub fn rename_nvme_queued(&self, disk: &DiskRef, ctrl: u32) -> anyhow::Result<DiskRef> {
        let from = self.tree.disk_id(&disk.sysfs_dir)?;
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
        let from = self.tree.disk_id(&disk.sysfs_dir)?;
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
        let (old_dir, new_dir) = (self.tree.disk_dir(from), self.tree.disk_dir(to));
        let what = || format!("renaming {} to {}", old_dir.display(), new_dir.display());
        let _guard = self.queue.lock(from.bdf());
        let record = match self.records.load(&from.key()).with_context(what)? {
            Some(record)
                if live_state(&record, &self.datapath)
                    .with_context(what)?
                    .is_some() =>
            {
                record
            }
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
        self.tree
            .move_disk(from, to)
            .and_then(|()| self.records.remove(&from.key()))
            .with_context(what)?;
        tracing::info!(from = %old_dir.display(), to = %new_dir.display(), "renamed");
        Ok(DiskRef { sysfs_dir: new_dir })
    }

    /// Detaches the disk at `id`.
    fn detach_locked(&self, id: &DiskId) -> anyhow::Result<()> {
        let key = id.key();
        self.missed.take(&key);
        if let Some(record) = self.records.load(&key)? {
            self.release(&key, &record)?;
        }
        self.tree.remove_disk_dirs(id)?;
        tracing::info!(disk = %self.tree.disk_dir(id).display(), "detached");
        Ok(())
    }

    /// The directory holding a socket per virtio-fs device on the host,
    /// named by its tag: a host here mounts `fuse_handoff::mount(<it>, tag,
    /// ...)` where a real one mounts `-t virtiofs <tag>`.
    pub fn virtiofs_dir(&self) -> PathBuf {
        self.virtiofs().devices_dir().to_owned()
    }

    /// A started virtio-fs device of the function at `bdf` appears on the
    /// host, serving the tree at `root` under `tag`; returns the `<n>` of
    /// `fs/virtiofs/<n>`.
    pub fn show_virtiofs(&self, bdf: &str, tag: &str, root: &Path) -> anyhow::Result<u32> {
        validate_bdf(bdf)?;
        let _guard = self.queue.lock(bdf);
        self.virtiofs().show(&self.tree, bdf, tag, root)
    }

    /// Virtio-fs device `<n>` leaves the host; whoever still has it mounted
    /// gets ENOTCONN.
    pub fn hide_virtiofs(&self, n: u32) {
        self.virtiofs().hide(&self.tree, n);
    }

    fn virtiofs(&self) -> std::sync::MutexGuard<'_, VirtioFs> {
        self.virtiofs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for the queued attaches, then detaches every disk and removes the
    /// whole tree (graceful shutdown).
    pub fn shutdown(&self) -> anyhow::Result<()> {
        self.queue.wait_idle();
        let hidden = self.virtiofs().hide_all(&self.tree);
        // Released whether or not the list went: a loop device kept here
        // would outlive the emulator. Loop devices first: detaching one
        // closes its data path file.
        let released = self
            .release_everything()
            .and_then(|()| self.datapath.unmount());
        hidden.and(released).with_context(|| {
            format!(
                "shutting down the host side (records in {}, tree under {})",
                self.state_dir.display(),
                self.tree.root().display()
            )
        })
    }

    fn attach_locked(
        &self,
        id: &DiskId,
        attrs: &DiskAttrs,
        source: &Source,
    ) -> anyhow::Result<HostDisk> {
        let key = id.key();
        self.tree.check_function(id)?;
        if let Some(record) = self.records.load(&key)? {
            if let Some(state) = live_state(&record, &self.datapath)? {
                if self.is_same_source(source, &record)? {
                    // A retried attach: same disk, same bytes. Hand back what exists.
                    return self.tree.publish(id, attrs, &state);
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
        self.tree.remove_disk_dirs(id)?;

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
                let target = Target::of(backing, &self.datapath)?;
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
        let target = Target::of(backing, &self.datapath)?;
        let preexisting = loopdev::all_bound()?
            .into_iter()
            .filter(|state| target.owns(state))
            .map(|state| state.name)
            .collect();
        let mut record = target.intent(self.tree.disk_dir(id), preexisting);
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
            let state = live_state(&record, &self.datapath)?.ok_or_else(|| {
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
            self.tree.publish(id, attrs, &state)
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
                let _ = self.tree.remove_disk_dirs(id);
                Err(e)
            }
        }
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
        let target = Target::of(&backing, &self.datapath)?;
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
        let before = live_state(&record, &self.datapath)?.ok_or_else(|| {
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
        let after = live_state(&record, &self.datapath)?
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
        self.tree.set_size(id, after.sectors)?;
        tracing::info!(
            disk = %self.tree.disk_dir(id).display(),
            from = before.sectors * SECTOR,
            to = target.size,
            "resized"
        );
        Ok(())
    }

    /// Releases every record and removes every function we made. Failures are
    /// collected, not fatal, so that one stuck device does not keep the rest.
    fn release_everything(&self) -> anyhow::Result<()> {
        let mut failures = Vec::new();
        for (key, record) in self.records.list()? {
            let _guard = key_bdf(&key).map(|bdf| self.queue.lock(bdf));
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
        if let Err(e) = self.tree.remove_functions(&self.queue) {
            failures.push(format!("{e:#}"));
        }
        if !failures.is_empty() {
            bail!("{}", failures.join("; "));
        }
        Ok(())
    }

    /// Detaches what a record owns, then drops the record.
    fn release(&self, key: &str, record: &DiskRecord) -> anyhow::Result<()> {
        recovery::release(&self.records, &self.datapath, key, record)
    }

    /// Attaches the missed disks with `identity` (see [`Faults::rescan`]),
    /// each in its function's line, unless its detach comes first.
    fn attach_missed(self: &Arc<Self>, identity: &str) {
        for (key, bdf) in self.missed.with_identity(identity) {
            let host = Arc::clone(self);
            let job = move || {
                // Taken under the function's lock, which a detach holds while
                // it forgets a missed disk: one or the other has it.
                if let Some(m) = host.missed.take(&key)
                    && let Err(e) = host.attach_locked(&m.id, &m.attrs, &m.source)
                {
                    tracing::warn!(
                        "rescan of {} failed: {e:#}",
                        host.tree.disk_dir(&m.id).display()
                    );
                }
            };
            if let Err(e) = self.queue.spawn(&bdf, format!("rescan-{bdf}"), job) {
                tracing::error!("cannot start a rescan of {bdf}: {e}");
            }
        }
    }
}

impl Rescan for HostSide {
    fn rescan(self: Arc<Self>, identity: &str) {
        self.attach_missed(identity);
    }
}

impl Host for HostSide {
    fn add_function(&self, bdf: &str, kind: FunctionKind) -> anyhow::Result<()> {
        self.add_pci_function(bdf, kind)
    }

    fn remove_function(&self, bdf: &str) -> anyhow::Result<()> {
        self.remove_pci_function(bdf)
    }

    fn attach_nvme(self: Arc<Self>, d: NvmeDisk<'_>, source: Source) -> anyhow::Result<DiskRef> {
        self.attach_nvme_namespace_in_background(d.bdf, d.ctrl, d.ns, d.nsid, d.uuid, source)
    }

    fn attach_virtio_blk(
        self: Arc<Self>,
        d: VirtioBlkDisk<'_>,
        source: Source,
    ) -> anyhow::Result<DiskRef> {
        self.attach_virtio_blk_in_background(d.bdf, d.index, d.name, d.serial, source)
    }

    fn detach(&self, disk: &DiskRef) -> anyhow::Result<()> {
        self.detach_queued(disk)
    }

    fn resize(&self, disk: &DiskRef, backing: &Backing) -> anyhow::Result<()> {
        self.resize_queued(disk, backing)
    }

    fn block_stat(&self, disk: &DiskRef) -> Option<BlockStat> {
        HostSide::block_stat(self, disk)
    }

    fn rename_nvme(&self, disk: &DiskRef, ctrl: u32) -> anyhow::Result<DiskRef> {
        self.rename_nvme_queued(disk, ctrl)
    }

    fn rename_virtio_blk(&self, disk: &DiskRef, index: u32, name: &str) -> anyhow::Result<DiskRef> {
        self.rename_virtio_blk_queued(disk, index, name)
    }

    fn show_virtiofs(&self, bdf: &str, tag: &str, root: &Path) -> anyhow::Result<u32> {
        HostSide::show_virtiofs(self, bdf, tag, root)
    }

    fn hide_virtiofs(&self, n: u32) {
        HostSide::hide_virtiofs(self, n);
    }

    fn shutdown(&self) -> anyhow::Result<()> {
        HostSide::shutdown(self)
    }
}
