//! A passthrough FUSE filesystem: an fsdev's directory tree served to the
//! host's kernel FUSE client, as SNAP serves it over virtio-fs (which is the
//! FUSE protocol on virtqueues). Every operation a pod makes reaches the
//! backing tree: lookup, getattr/setattr, mknod/mkdir/rmdir, create, open,
//! read, write, flush, fsync, release, unlink, rename, readdir, statfs (the
//! backing filesystem's, so capacity and quotas show), symlink, readlink,
//! link. Extended attributes are off, as `fsdev_aio_create` has them.
//!
//! Confinement: an inode is remembered by its path under the root, and
//! every path is opened with `openat2(RESOLVE_BENEATH)` from the root's
//! descriptor and acted on with `*at` calls that do not follow the last
//! component, so a symlink or a rename by another host cannot lead outside
//! the tree. Inodes are never forgotten while the device serves: a test's
//! tree is small, and a stale path only answers ENOENT.
//!
//! Coherence between hosts serving the same tree: attributes and entries are
//! never cached (TTL 0), writes are not cached (no writeback cache), and
//! pages cached for reading are dropped at each open: what one host wrote
//! and closed (or fsynced) another reads at its next open, as with NFS's
//! close-to-open consistency. Files are not opened in direct I/O mode, so
//! a pod may map them, shared or not.
//!
//! A device that goes (`gone`) answers ENOTCONN to everything, as a host's
//! mount answers once its virtio-fs device is unplugged.

mod ops;

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileHandle, FileType, INodeNo, Request, TimeOrNow};
use nix::errno::Errno as NixErrno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat, openat2};
use nix::sys::stat::{FileStat, Mode, SFlag, UtimensatFlags, fstat, fstatat};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, fchownat};

const ROOT: u64 = 1;
/// Nothing cached: another host's change shows at once.
const TTL: Duration = Duration::ZERO;

type Answer<T> = Result<T, Errno>;

fn err(e: NixErrno) -> Errno {
    Errno::from_i32(e as i32)
}

fn io_err(e: std::io::Error) -> Errno {
    Errno::from(e)
}

/// Paths by inode, and inodes by the backing file's identity.
#[derive(Debug, Default)]
struct Inodes {
    paths: HashMap<u64, PathBuf>,
    by_id: HashMap<(u64, u64), u64>,
    next: u64,
}

/// An open directory: its entries when it was opened.
type Listing = Vec<(u64, FileType, OsString)>;

/// The filesystem one device serves.
#[derive(Debug)]
pub(crate) struct Passthrough {
    root: OwnedFd,
    inodes: Mutex<Inodes>,
    files: Mutex<HashMap<u64, Arc<File>>>,
    dirs: Mutex<HashMap<u64, Arc<Listing>>>,
    next_fh: AtomicU64,
    gone: Arc<AtomicBool>,
}

impl Passthrough {
    /// Serves the tree at `root`; `gone` set makes it refuse everything.
    pub(crate) fn new(root: &Path, gone: Arc<AtomicBool>) -> std::io::Result<Self> {
        let root = nix::fcntl::open(root, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty())?;
        let mut inodes = Inodes {
            next: ROOT + 1,
            ..Inodes::default()
        };
        inodes.paths.insert(ROOT, PathBuf::new());
        let st = fstat(&root)?;
        inodes.by_id.insert((st.st_dev, st.st_ino), ROOT);
        Ok(Self {
            root,
            inodes: Mutex::new(inodes),
            files: Mutex::default(),
            dirs: Mutex::default(),
            next_fh: AtomicU64::new(1),
            gone,
        })
    }

    fn live(&self) -> Answer<()> {
        if self.gone.load(Ordering::SeqCst) {
            return Err(Errno::from_i32(nix::libc::ENOTCONN));
        }
        Ok(())
    }

    fn path(&self, ino: INodeNo) -> Answer<PathBuf> {
        self.live()?;
        lock(&self.inodes)
            .paths
            .get(&ino.0)
            .cloned()
            .ok_or(Errno::ENOENT)
    }

    /// A directory under the root, never reached through a symlink or `..`.
    fn dir(&self, rel: &Path) -> Answer<OwnedFd> {
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        openat2(&self.root, rel, how).map_err(err)
    }

    /// The directory holding `ino` and its name there (the root is `.` in itself).
    fn place(&self, ino: INodeNo) -> Answer<(OwnedFd, OsString)> {
        let path = self.path(ino)?;
        match (path.parent(), path.file_name()) {
            (Some(parent), Some(name)) => Ok((self.dir(parent)?, name.to_owned())),
            _ => Ok((self.dir(&path)?, ".".into())),
        }
    }

    fn stat(&self, ino: INodeNo) -> Answer<FileStat> {
        let (dir, name) = self.place(ino)?;
        fstatat(&dir, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW).map_err(err)
    }

    /// The inode of `name` in `parent` after it was looked up or made.
    fn entry(&self, parent: INodeNo, name: &OsStr) -> Answer<FileAttr> {
        let rel = self.path(parent)?.join(name);
        let dir = self.dir(&self.path(parent)?)?;
        let st = fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(err)?;
        let mut inodes = lock(&self.inodes);
        let ino = match inodes.by_id.get(&(st.st_dev, st.st_ino)) {
            Some(&ino) => ino,
            None => {
                let ino = inodes.next;
                inodes.next += 1;
                inodes.by_id.insert((st.st_dev, st.st_ino), ino);
                ino
            }
        };
        // The name it was last reached by: a rename or a link elsewhere
        // (another host's) is learnt here.
        inodes.paths.insert(ino, rel);
        Ok(attr(ino, &st))
    }

    /// What a request made belongs to whoever made it.
    fn own(&self, parent: INodeNo, name: &OsStr, req: &Request) -> Answer<FileAttr> {
        let dir = self.dir(&self.path(parent)?)?;
        fchownat(
            &dir,
            name,
            Some(Uid::from_raw(req.uid())),
            Some(Gid::from_raw(req.gid())),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(err)?;
        self.entry(parent, name)
    }

    fn file(&self, fh: FileHandle) -> Answer<Arc<File>> {
        self.live()?;
        lock(&self.files).get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    fn keep_file(&self, file: File) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&self.files).insert(fh, Arc::new(file));
        FileHandle(fh)
    }

    /// Opens `name` in `dir` as `flags` say, never following a last symlink.
    fn open_at(dir: &OwnedFd, name: &OsStr, flags: i32, mode: u32) -> Answer<File> {
        let flags = OFlag::from_bits_truncate(flags) & !OFlag::O_NOCTTY
            | OFlag::O_NOFOLLOW
            | OFlag::O_CLOEXEC;
        let fd = openat(dir, name, flags, Mode::from_bits_truncate(mode)).map_err(err)?;
        Ok(File::from(fd))
    }

    #[allow(clippy::too_many_arguments)]
    fn set(
        &self,
        ino: INodeNo,
        mode: Option<u32>,
        ids: (Option<u32>, Option<u32>),
        size: Option<u64>,
        times: (Option<TimeOrNow>, Option<TimeOrNow>),
        fh: Option<FileHandle>,
    ) -> Answer<FileAttr> {
        let (dir, name) = self.place(ino)?;
        let name = name.as_os_str();
        if let Some(mode) = mode {
            // chmod(2) on the path: a symlink's own mode cannot change.
            let path = proc_path(&dir, name);
            std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .map_err(io_err)?;
        }
        if ids.0.is_some() || ids.1.is_some() {
            let (uid, gid) = (ids.0.map(Uid::from_raw), ids.1.map(Gid::from_raw));
            fchownat(&dir, name, uid, gid, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(err)?;
        }
        if let Some(size) = size {
            let file = match fh {
                Some(fh) => self.file(fh)?,
                None => Arc::new(Self::open_at(&dir, name, nix::libc::O_WRONLY, 0)?),
            };
            file.set_len(size).map_err(io_err)?;
        }
        if times.0.is_some() || times.1.is_some() {
            let (atime, mtime) = (timespec(times.0), timespec(times.1));
            nix::sys::stat::utimensat(&dir, name, &atime, &mtime, UtimensatFlags::NoFollowSymlink)
                .map_err(err)?;
        }
        let st = fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(err)?;
        Ok(attr(ino.0, &st))
    }

    fn list(&self, ino: INodeNo) -> Answer<Listing> {
        let dir = self.dir(&self.path(ino)?)?;
        let mut listing = vec![
            (ino.0, FileType::Directory, ".".into()),
            (ino.0, FileType::Directory, "..".into()),
        ];
        let known = |id| lock(&self.inodes).by_id.get(&id).copied();
        let st = fstat(&dir).map_err(err)?;
        for entry in std::fs::read_dir(proc_path(&dir, OsStr::new(""))).map_err(io_err)? {
            let entry = entry.map_err(io_err)?;
            let kind = entry.file_type().map_err(io_err)?;
            let backing = std::os::unix::fs::DirEntryExt::ino(&entry);
            // Informative only (lookup gives the inode a name has).
            let ino = known((st.st_dev, backing)).unwrap_or(backing);
            listing.push((ino, file_type_of(kind), entry.file_name()));
        }
        Ok(listing)
    }

    /// Paths under `from` are now under `to` (a rename of ours).
    fn moved(&self, from: &Path, to: &Path) {
        let mut inodes = lock(&self.inodes);
        for path in inodes.paths.values_mut() {
            if let Ok(rest) = path.strip_prefix(from) {
                *path = to.join(rest);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A path naming `name` in the directory `dir` already resolved beneath the root.
fn proc_path(dir: &OwnedFd, name: &OsStr) -> PathBuf {
    Path::new(&format!("/proc/self/fd/{}", dir.as_fd().as_raw_fd())).join(name)
}

fn timespec(t: Option<TimeOrNow>) -> TimeSpec {
    match t {
        None => TimeSpec::UTIME_OMIT,
        Some(TimeOrNow::Now) => TimeSpec::UTIME_NOW,
        Some(TimeOrNow::SpecificTime(t)) => {
            let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
            TimeSpec::from_duration(d)
        }
    }
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    let nanos = u32::try_from(nsecs).unwrap_or(0);
    match u64::try_from(secs) {
        Ok(s) => UNIX_EPOCH + Duration::new(s, nanos),
        Err(_) => UNIX_EPOCH,
    }
}

fn file_type_of(t: std::fs::FileType) -> FileType {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        FileType::Directory
    } else if t.is_symlink() {
        FileType::Symlink
    } else if t.is_block_device() {
        FileType::BlockDevice
    } else if t.is_char_device() {
        FileType::CharDevice
    } else if t.is_fifo() {
        FileType::NamedPipe
    } else if t.is_socket() {
        FileType::Socket
    } else {
        FileType::RegularFile
    }
}

fn attr(ino: u64, st: &FileStat) -> FileAttr {
    let kind = match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFDIR => FileType::Directory,
        SFlag::S_IFLNK => FileType::Symlink,
        SFlag::S_IFBLK => FileType::BlockDevice,
        SFlag::S_IFCHR => FileType::CharDevice,
        SFlag::S_IFIFO => FileType::NamedPipe,
        SFlag::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    };
    FileAttr {
        ino: INodeNo(ino),
        size: u64::try_from(st.st_size).unwrap_or(0),
        blocks: u64::try_from(st.st_blocks).unwrap_or(0),
        atime: time(st.st_atime, st.st_atime_nsec),
        mtime: time(st.st_mtime, st.st_mtime_nsec),
        ctime: time(st.st_ctime, st.st_ctime_nsec),
        crtime: time(st.st_ctime, st.st_ctime_nsec),
        kind,
        perm: (st.st_mode & 0o7777) as u16,
        nlink: u32::try_from(st.st_nlink).unwrap_or(u32::MAX),
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: u32::try_from(st.st_rdev).unwrap_or(0),
        blksize: u32::try_from(st.st_blksize).unwrap_or(4096),
        flags: 0,
    }
}
