//! The FUSE mount serving the data path's files: `<mountpoint>/d<N>`, one
//! per exposure, each a [`Volume`] the host side put a loop device on.
//!
//! Threads: the session reads requests on a few threads of its own. An I/O
//! of a volume without rate limits (nor cipher or remote target) is served
//! on the thread that read it; so is one with limits when nothing waits
//! before it and the quotas have room. Otherwise it goes to the volume's own
//! thread, which serves them in order, waiting for QoS quota as SPDK queues
//! I/O, so a throttled volume never holds up the others (nor the JSON-RPC
//! server, which shares nothing with this but the counters and limits). An
//! NVMe-oF namespace's I/O always goes to its volume's thread: its target
//! may hold it (its own limits, a pause), which must not hold the session.
//!
//! Crash safety: a killed emulator leaves its mount dead (ENOTCONN) with its
//! loop devices still on it. The host side detaches those first (from its
//! records, which need nothing from the mount), then [`DataPath::unmount_stale`]
//! lazily unmounts what is left at the mount point. Shutdown goes the same
//! way round: loop devices first, then the mount.
//!
//! Nor does the emulator ever make a filesystem call on its own mount (open,
//! stat, lookup, even of the mount point, which is the mount's root): each
//! is a request to its own session threads, and a SIGKILL in that instant
//! leaves the calling thread waiting for dead ones, the process never
//! exiting. What a `stat` of one of its files would say is known here
//! ([`DataPath::served_file`]): the mount's device number from
//! `/proc/self/mountinfo`, the inode the session assigned, the size served.
//! Nor does it ask a loop device over one of its files for that file's
//! identity (LOOP_GET_STATUS64 stats it): see `host::recovery`.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, MountOption, OpenAccMode, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request, WriteFlags,
};
use nix::errno::Errno as NixErrno;
use nix::fcntl::{FallocateFlags, fallocate};
use nix::mount::{MntFlags, umount2};
use nix::sys::statfs::{FUSE_SUPER_MAGIC, statfs};

use super::stats::IoKind;
use super::volume::{Backing, Volume};

const ROOT: u64 = 1;
/// Attributes are never cached: a resize must show at once.
const TTL: Duration = Duration::ZERO;
/// Session threads reading requests.
const SESSION_THREADS: usize = 4;
/// Larger requests than the kernel's 128 KiB default, fewer round trips.
const MAX_WRITE: u32 = 1 << 20;

type Job = Box<dyn FnOnce() + Send>;

/// One exposure's file.
#[derive(Debug)]
struct Served {
    volume: Arc<Volume>,
    /// The backing, opened once.
    file: File,
    /// The bdev's size now (a resize changes it).
    size: AtomicU64,
    /// To the volume's thread; `None` once removed.
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    /// Jobs sent to the volume's thread and not finished yet.
    queued: Arc<AtomicUsize>,
}

type Files = RwLock<HashMap<u64, Arc<Served>>>;

/// What `stat` says of one of our files (and so what a loop device over it
/// shows), known without asking the mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServedFile {
    /// Canonical, as the kernel shows it as a loop device's `backing_file`.
    pub(crate) path: PathBuf,
    /// The mount's (anonymous) device number, `st_dev`.
    pub(crate) dev: u64,
    /// `st_ino`: the kernel takes the inode number the session assigns.
    pub(crate) ino: u64,
    /// `st_size`: the bdev's size now.
    pub(crate) len: u64,
}

/// A live mount.
#[derive(Debug)]
struct Mounted {
    session: fuser::BackgroundSession,
    /// The mount point, canonical.
    canonical: PathBuf,
    /// `st_dev` of every file on the mount.
    dev: u64,
}

/// The mount and its files.
#[derive(Debug)]
pub(crate) struct DataPath {
    mountpoint: PathBuf,
    files: Arc<Files>,
    next_ino: AtomicU64,
    /// Mounted at the first file.
    session: Mutex<Option<Mounted>>,
    /// Lookups, getattrs and opens the session has answered: a test's count
    /// of calls on the mount.
    #[cfg(test)]
    pub(crate) asked: Arc<AtomicU64>,
}

impl DataPath {
    /// A data path at `mountpoint` (an absolute, canonical path), mounted
    /// when its first file is added.
    pub(crate) fn new(mountpoint: PathBuf) -> Self {
        Self {
            mountpoint,
            files: Arc::default(),
            next_ino: AtomicU64::new(ROOT + 1),
            session: Mutex::default(),
            #[cfg(test)]
            asked: Arc::default(),
        }
    }

    /// Unmounts what an earlier run left mounted at the mount point, once
    /// the loop devices on it are detached.
    pub(crate) fn unmount_stale(&self) -> anyhow::Result<()> {
        unmount_stale(&self.mountpoint)
    }

    /// Serves `volume` as a new file and returns the byte range to attach.
    pub(crate) fn add(&self, volume: Arc<Volume>) -> anyhow::Result<Backing> {
        self.mount()?;
        let b = &volume.backing;
        let file = OpenOptions::new()
            .read(true)
            .write(!b.read_only)
            .open(&b.path)
            .with_context(|| format!("opening backing {}", b.path.display()))?;
        let ino = self.next_ino.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel::<Job>();
        thread::Builder::new()
            .name(format!("datapath-{ino}"))
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                }
            })
            .context("starting a data path thread")?;
        let backing = Backing {
            path: self.mountpoint.join(format!("d{ino}")),
            offset: 0,
            size: b.size,
            read_only: b.read_only,
        };
        let served = Served {
            size: AtomicU64::new(b.size),
            volume,
            file,
            queue: Mutex::new(Some(tx)),
            queued: Arc::default(),
        };
        self.files_mut().insert(ino, Arc::new(served));
        Ok(backing)
    }

    /// Stops serving the file at `path` (once nothing has it open); a path
    /// that is not one of ours is left alone.
    pub(crate) fn remove(&self, path: &Path) {
        let Some(ino) = self.ino_of(path) else {
            return;
        };
        if let Some(served) = self.files_mut().remove(&ino) {
            // The volume's thread ends once it has answered what it holds.
            lock(&served.queue).take();
        }
    }

    /// The volume served at `path`, if it is one of our files.
    pub(crate) fn volume_at(&self, path: &Path) -> Option<Arc<Volume>> {
        let ino = self.ino_of(path)?;
        Some(Arc::clone(&self.files().get(&ino)?.volume))
    }

    /// What `stat` would say of the file at `path`, if `path` is on our mount
    /// (`None` if it is not; an error if it is but no file of ours is
    /// there), computed without a call on the mount: see the module's docs.
    pub(crate) fn served_file(&self, path: &Path) -> Option<anyhow::Result<ServedFile>> {
        if !path.starts_with(&self.mountpoint) {
            return None;
        }
        let session = lock(&self.session);
        let served = || -> anyhow::Result<ServedFile> {
            let mounted = session.as_ref().context("the data path is not mounted")?;
            let ino = self.ino_of(path).context("not a data path file")?;
            let len = self
                .files()
                .get(&ino)
                .context("not served (any more)")?
                .size
                .load(Ordering::Relaxed);
            Ok(ServedFile {
                path: mounted.canonical.join(format!("d{ino}")),
                dev: mounted.dev,
                ino,
                len,
            })
        };
        Some(served().with_context(|| format!("data path file {}", path.display())))
    }

    /// Whether `path`, `dev` and `ino` (as `served_file` gave them) name a
    /// file of our mount as it is now, served or no longer; without a call
    /// on the mount.
    pub(crate) fn is_on_mount(&self, path: &Path, dev: u64, ino: u64) -> bool {
        lock(&self.session)
            .as_ref()
            .is_some_and(|m| m.dev == dev && path == m.canonical.join(format!("d{ino}")))
    }

    /// The file at `path` now serves `backing`'s size (a resize); the bytes
    /// must stay where they are.
    pub(crate) fn resize(&self, path: &Path, backing: &Backing) -> anyhow::Result<Backing> {
        let served = self
            .ino_of(path)
            .and_then(|ino| self.files().get(&ino).cloned())
            .with_context(|| format!("{} is not served", path.display()))?;
        let have = &served.volume.backing;
        if have.path != backing.path || have.offset != backing.offset {
            bail!(
                "a resize cannot move the disk: it is {} at offset {}, asked for {} at offset {}",
                have.path.display(),
                have.offset,
                backing.path.display(),
                backing.offset
            );
        }
        served.size.store(backing.size, Ordering::Relaxed);
        Ok(Backing {
            path: path.to_owned(),
            offset: 0,
            size: backing.size,
            read_only: have.read_only,
        })
    }

    /// Unmounts (after the host side detached its loop devices). A mount
    /// still busy (a loop device whose detach the kernel deferred to its
    /// last close) is detached lazily and ends with that close.
    pub(crate) fn unmount(&self) -> anyhow::Result<()> {
        let Some(Mounted { session, .. }) = lock(&self.session).take() else {
            return Ok(());
        };
        self.files_mut().clear();
        match nix::mount::umount(&self.mountpoint) {
            Ok(()) => {
                if session.join().is_err() {
                    tracing::warn!("the data path's FUSE session ended with an error");
                }
            }
            Err(NixErrno::EBUSY) => {
                tracing::warn!(
                    mountpoint = %self.mountpoint.display(),
                    "data path still in use; unmounting it lazily"
                );
                umount2(&self.mountpoint, MntFlags::MNT_DETACH)
                    .with_context(|| format!("unmounting {}", self.mountpoint.display()))?;
            }
            Err(e) => {
                return Err(e).with_context(|| format!("unmounting {}", self.mountpoint.display()));
            }
        }
        let _ = fs::remove_dir(&self.mountpoint);
        Ok(())
    }

    fn mount(&self) -> anyhow::Result<()> {
        let mut session = lock(&self.session);
        if session.is_some() {
            return Ok(());
        }
        fs::create_dir_all(&self.mountpoint)
            .with_context(|| format!("creating {}", self.mountpoint.display()))?;
        // Resolved before the mount, and only its parent, which is not on it.
        let canonical = match (self.mountpoint.parent(), self.mountpoint.file_name()) {
            (Some(parent), Some(name)) => fs::canonicalize(parent)
                .with_context(|| format!("resolving {}", parent.display()))?
                .join(name),
            _ => bail!(
                "data path mount point {} has no parent",
                self.mountpoint.display()
            ),
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            MountOption::FSName("snap-emu".into()),
            MountOption::Subtype("snap-emu-datapath".into()),
            MountOption::NoExec,
            MountOption::NoSuid,
            MountOption::NoDev,
            MountOption::NoAtime,
        ];
        config.n_threads = Some(SESSION_THREADS);
        config.clone_fd = true;
        let fs = Fs {
            files: Arc::clone(&self.files),
            #[cfg(test)]
            asked: Arc::clone(&self.asked),
        };
        let mounted = fuser::spawn_mount(fs, &self.mountpoint, &config).with_context(|| {
            format!(
                "mounting the data path at {} (FUSE: /dev/fuse, run as root)",
                self.mountpoint.display()
            )
        })?;
        // Read from the mount table, never by a `stat` of the mount point:
        // that would be a request to the session (see the module's docs).
        let dev = match mount_dev(&canonical) {
            Ok(dev) => dev,
            Err(e) => {
                // Dropping the session unmounts it.
                drop(mounted);
                return Err(e);
            }
        };
        tracing::info!(mountpoint = %self.mountpoint.display(), "data path mounted");
        *session = Some(Mounted {
            session: mounted,
            canonical,
            dev,
        });
        Ok(())
    }

    fn ino_of(&self, path: &Path) -> Option<u64> {
        let name = path.strip_prefix(&self.mountpoint).ok()?.to_str()?;
        name.strip_prefix('d')?.parse().ok()
    }

    fn files(&self) -> std::sync::RwLockReadGuard<'_, HashMap<u64, Arc<Served>>> {
        self.files.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn files_mut(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<u64, Arc<Served>>> {
        self.files.write().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for DataPath {
    fn drop(&mut self) {
        if let Err(e) = self.unmount() {
            tracing::error!("{e:#}");
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The device number (`st_dev`) of the files of the FUSE mount at
/// `mountpoint` (canonical; the topmost mount there), from
/// `/proc/self/mountinfo`, which the kernel writes without asking the mount.
fn mount_dev(mountpoint: &Path) -> anyhow::Result<u64> {
    let table = fs::read_to_string(MOUNTINFO).with_context(|| format!("reading {MOUNTINFO}"))?;
    mountinfo_dev(&table, mountpoint)
        .with_context(|| format!("no FUSE mount at {} in {MOUNTINFO}", mountpoint.display()))
}

const MOUNTINFO: &str = "/proc/self/mountinfo";

/// `mount_dev` of the text of a mountinfo file: its lines are `id parent
/// major:minor root mount-point options [optional fields] - fstype source
/// super-options`, spaces and such in paths as octal escapes, in the order
/// the mounts were made.
fn mountinfo_dev(table: &str, mountpoint: &Path) -> Option<u64> {
    let want = mountpoint.as_os_str().as_encoded_bytes();
    table.lines().rev().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let (majmin, point) = (fields.get(2)?, fields.get(4)?);
        let fstype = fields.iter().skip_while(|f| **f != "-").nth(1)?;
        if !fstype.starts_with("fuse") || unescape(point) != want {
            return None;
        }
        let (major, minor) = majmin.split_once(':')?;
        Some(nix::sys::stat::makedev(
            major.parse().ok()?,
            minor.parse().ok()?,
        ))
    })
}

/// A mountinfo path as it is: `\ooo` (octal) is the byte it stands for.
fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok());
        match octal {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

/// Lazily unmounts every FUSE mount (dead or not: none can be a live
/// emulator's, the host side's lock sees to that) stacked at `mountpoint`.
pub(crate) fn unmount_stale(mountpoint: &Path) -> anyhow::Result<()> {
    loop {
        match statfs(mountpoint) {
            Ok(s) if s.filesystem_type() != FUSE_SUPER_MAGIC => return Ok(()),
            Err(NixErrno::ENOENT) => return Ok(()),
            Ok(_) | Err(NixErrno::ENOTCONN) => {
                tracing::info!(mountpoint = %mountpoint.display(), "unmounting an earlier run's data path");
                umount2(mountpoint, MntFlags::MNT_DETACH).with_context(|| {
                    format!("unmounting the stale data path {}", mountpoint.display())
                })?;
            }
            Err(e) => {
                return Err(e).with_context(|| format!("examining {}", mountpoint.display()));
            }
        }
    }
}

/// A read or write that QoS limits apply to.
#[derive(Debug, Clone, Copy)]
struct Quota {
    read: bool,
    bytes: u64,
    /// When the request arrived: the timeslices since, it waited in line.
    arrived: Instant,
}

/// The filesystem the session serves.
#[derive(Debug)]
struct Fs {
    files: Arc<Files>,
    #[cfg(test)]
    asked: Arc<AtomicU64>,
}

impl Fs {
    /// Counts a lookup, getattr or open, in a test.
    fn asked(&self) {
        #[cfg(test)]
        self.asked.fetch_add(1, Ordering::SeqCst);
    }

    fn get(&self, ino: INodeNo) -> Option<Arc<Served>> {
        let files = self.files.read().unwrap_or_else(PoisonError::into_inner);
        files.get(&ino.0).cloned()
    }

    /// Runs `job` once the I/O is admitted: `quota` is what QoS limits
    /// apply to (`None` for what only keeps its place in line). A volume
    /// whose I/O goes in order (see `Volume::in_order`) runs it here only
    /// when nothing is in line and the quotas have room now; otherwise its
    /// thread waits for the quota.
    fn submit(
        &self,
        served: Arc<Served>,
        quota: Option<Quota>,
        job: impl FnOnce(&Served) + Send + 'static,
    ) {
        if !served.volume.in_order() {
            return job(&served);
        }
        if served.volume.remote.is_none()
            && served.queued.load(Ordering::SeqCst) == 0
            && quota.is_none_or(|q| served.volume.try_admit(q.read, q.bytes))
        {
            return job(&served);
        }
        let queue = lock(&served.queue).clone();
        let s = Arc::clone(&served);
        let queued = Arc::clone(&served.queued);
        queued.fetch_add(1, Ordering::SeqCst);
        let run = move || {
            if let Some(q) = quota {
                s.volume.admit(q.read, q.bytes, q.arrived);
            }
            job(&s);
            queued.fetch_sub(1, Ordering::SeqCst);
        };
        match queue {
            // A send fails only once the volume is gone: then it runs here.
            Some(queue) => {
                if let Err(mpsc::SendError(run)) = queue.send(Box::new(run)) {
                    run();
                }
            }
            None => run(),
        }
    }
}

fn dir_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(ROOT),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: FileType::Directory,
        perm: 0o500,
        nlink: 2,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl Served {
    fn attr(&self, ino: u64) -> FileAttr {
        let size = self.size.load(Ordering::Relaxed);
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            kind: FileType::RegularFile,
            perm: if self.volume.backing.read_only {
                0o400
            } else {
                0o600
            },
            nlink: 1,
            blksize: self.volume.block_size,
            ..dir_attr()
        }
    }

    /// The part of `[offset, offset + len)` inside the bdev.
    fn clamp(&self, offset: u64, len: u64) -> u64 {
        let size = self.size.load(Ordering::Relaxed);
        len.min(size.saturating_sub(offset))
    }
}

fn errno(e: std::io::Error) -> Errno {
    Errno::from(e)
}

impl Filesystem for Fs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // The kernel may cap it lower; what it allows is fine.
        let _ = config.set_max_write(MAX_WRITE);
        // A loop device in direct I/O mode submits asynchronously: let those
        // requests be in flight together, as a host's queue would be. A
        // kernel without it serves them one by one, which is only slower.
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.asked();
        let ino = name
            .to_str()
            .and_then(|n| n.strip_prefix('d'))
            .and_then(|n| n.parse::<u64>().ok());
        match (parent.0, ino.and_then(|i| Some((i, self.get(INodeNo(i))?)))) {
            (ROOT, Some((ino, served))) => reply.entry(&TTL, &served.attr(ino), Generation(0)),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.asked();
        if ino.0 == ROOT {
            return reply.attr(&TTL, &dir_attr());
        }
        match self.get(ino) {
            Some(served) => reply.attr(&TTL, &served.attr(ino.0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let Some(served) = self.get(ino) else {
            return reply.error(Errno::ENOENT);
        };
        // A disk's size is the bdev's: only a "change" to the same size passes.
        let attr = served.attr(ino.0);
        match size {
            Some(size) if size != attr.size => reply.error(Errno::EPERM),
            _ => reply.attr(&TTL, &attr),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.asked();
        let Some(served) = self.get(ino) else {
            return reply.error(Errno::ENOENT);
        };
        if served.volume.backing.read_only && flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        // Parallel direct writes: the kernel need not serialise writes to
        // the file (a disk orders nothing either).
        reply.opened(
            FileHandle(0),
            FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES,
        );
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let arrived = Instant::now();
        let Some(served) = self.get(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let len = served.clamp(offset, u64::from(size));
        if len == 0 {
            return reply.data(&[]);
        }
        let quota = Quota {
            read: true,
            bytes: len,
            arrived,
        };
        self.submit(served, Some(quota), move |s| {
            let len_usize = usize::try_from(len).unwrap_or(usize::MAX);
            match s.volume.account(IoKind::Read, len, arrived, || {
                s.volume.read(&s.file, offset, len_usize)
            }) {
                Ok(buf) => reply.data(&buf),
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let arrived = Instant::now();
        let Some(served) = self.get(ino) else {
            return reply.error(Errno::ENOENT);
        };
        if served.volume.backing.read_only {
            return reply.error(Errno::EROFS);
        }
        let len = served.clamp(offset, data.len() as u64);
        if len == 0 {
            // Past the end of a disk: no space, as a block device answers.
            return reply.error(Errno::ENOSPC);
        }
        let data = data[..usize::try_from(len).unwrap_or(data.len())].to_vec();
        let quota = Quota {
            read: false,
            bytes: len,
            arrived,
        };
        self.submit(served, Some(quota), move |s| {
            match s.volume.account(IoKind::Write, len, arrived, || {
                s.volume.write(&s.file, offset, &data)
            }) {
                Ok(()) => reply.written(u32::try_from(len).unwrap_or(u32::MAX)),
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // A close of the file (a loop device letting go): what was written
        // reaches the disk before it is gone.
        self.fsync(_req, ino, FileHandle(0), true, reply);
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let Some(served) = self.get(ino) else {
            return reply.error(Errno::ENOENT);
        };
        // In line with the volume's writes, so that it covers every one
        // answered before it.
        self.submit(served, None, move |s| {
            let synced = if datasync {
                s.file.sync_data()
            } else {
                s.file.sync_all()
            };
            match synced {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let arrived = Instant::now();
        let Some(served) = self.get(ino) else {
            return reply.error(Errno::ENOENT);
        };
        if served.volume.backing.read_only {
            return reply.error(Errno::EROFS);
        }
        // What a loop device sends: discard (punch hole, counted as SPDK
        // counts an unmap) and write zeroes (zero range, which SPDK does
        // not count), both inside the disk; nothing that changes its size.
        let flags = FallocateFlags::from_bits_truncate(mode);
        let punch = flags.contains(FallocateFlags::FALLOC_FL_PUNCH_HOLE);
        let zero = flags.contains(FallocateFlags::FALLOC_FL_ZERO_RANGE);
        // Zeroed ciphertext would read back as noise (mkfs.xfs zeroes its
        // log so): SPDK writes zeroes through a crypto bdev instead.
        let encrypted_zeroes = zero && served.volume.cipher.is_some();
        let (Ok(at), Ok(len)) = (
            i64::try_from(served.volume.backing.offset + offset),
            i64::try_from(length),
        ) else {
            return reply.error(Errno::EINVAL);
        };
        if !(punch || zero) || served.clamp(offset, length) != length {
            return reply.error(Errno::EOPNOTSUPP);
        }
        // Not rate-limited, as SPDK does not limit unmaps.
        self.submit(served, None, move |s| {
            let run = || fallocate(&s.file, flags, at, len).map_err(std::io::Error::from);
            let done = if encrypted_zeroes {
                s.volume.write_zeroes(&s.file, offset, length)
            } else if punch {
                s.volume.account(IoKind::Unmap, length, arrived, run)
            } else {
                run()
            };
            match done {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino.0 != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let mut inos: Vec<u64> = {
            let files = self.files.read().unwrap_or_else(PoisonError::into_inner);
            files.keys().copied().collect()
        };
        inos.sort_unstable();
        let mut entries = vec![
            (ROOT, FileType::Directory, ".".to_owned()),
            (ROOT, FileType::Directory, "..".to_owned()),
        ];
        entries.extend(
            inos.into_iter()
                .map(|i| (i, FileType::RegularFile, format!("d{i}"))),
        );
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_give_the_topmost_fuse_mount() {
        let table = "\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
90 22 0:51 / /var/lib/snap\\040emu/datapath rw,nosuid shared:40 - fuse.snap-emu-datapath snap-emu rw,user_id=0
91 22 0:52 / /var/lib/snap-emu/datapath rw,nosuid shared:41 - fuse.snap-emu-datapath snap-emu rw,user_id=0
92 91 0:53 / /var/lib/snap-emu/datapath rw,nosuid - fuse.snap-emu-datapath snap-emu rw,user_id=0
93 22 8:1 / /var/lib/other rw - ext4 /dev/sda1 rw
94 22 0:54 / /var/lib/other/datapath rw - tmpfs tmpfs rw
";
        let at = |p: &str| mountinfo_dev(table, Path::new(p));
        assert_eq!(
            at("/var/lib/snap emu/datapath"),
            Some(nix::sys::stat::makedev(0, 51))
        );
        assert_eq!(
            at("/var/lib/snap-emu/datapath"),
            Some(nix::sys::stat::makedev(0, 53))
        );
        assert_eq!(at("/var/lib/other/datapath"), None, "not FUSE");
        assert_eq!(at("/var/lib/snap-emu"), None);
        assert_eq!(unescape("a\\134b\\011\\9"), b"a\\b\t\\9");
    }
}
