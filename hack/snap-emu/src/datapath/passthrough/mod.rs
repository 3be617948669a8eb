//! A passthrough FUSE filesystem: an fsdev's directory tree served to the
//! host's kernel FUSE client, as SNAP serves it over virtio-fs (which is the
//! FUSE protocol on virtqueues). Every operation a pod makes reaches the
//! backing tree: lookup, forget, getattr/setattr, mknod/mkdir/rmdir,
//! create, open, read, write, flush, fsync, release, unlink, rename,
//! readdir, statfs (the backing filesystem's, so capacity and quotas show),
//! symlink, readlink, link. Extended attributes are off, as
//! `fsdev_aio_create` has them.
//!
//! An inode is its backing file, not a path (`inodes.rs`): it holds an
//! `O_PATH` descriptor of the file, and every operation acts on
//! descriptors. getattr is fstat; `*at` calls take a parent's descriptor
//! and one name; what needs the file itself opened or changed by path
//! (open, opendir, truncate, chmod, utimens, link) goes through
//! `/proc/self/fd/N`, a magic link that reaches the inode even when it has
//! no name left. So a file unlinked while open, a directory deleted under
//! a bind mount (kubelet's subPath) and a file another host renamed behave
//! as on a local filesystem.
//!
//! Confinement: the root's descriptor is the tree's root, and every other
//! one is opened from a known directory's descriptor by a single name
//! (empty, `.`, `..` or one holding `/` is EINVAL) with `O_NOFOLLOW`. No
//! path is resolved beyond that one component and no symlink is followed
//! (`*at` calls do not follow a last component, create is `O_NOFOLLOW`,
//! and a magic link lands on exactly the inode its descriptor holds, a
//! symlink itself included). So every inode a host reaches was reached
//! from the root through the tree's own entries, and no request (a rename
//! names two known directories) can name anything outside it, whatever
//! symlinks or renames other hosts make. That is why no `RESOLVE_BENEATH`
//! is needed any more: nothing is resolved for it to check. Only someone
//! acting on the backing filesystem directly could move a directory the
//! host knows out of the tree, and the host would then still reach what is
//! under it, as a process that holds a directory open does.
//!
//! A new entry's owner and mode are what a local filesystem gives it
//! (fs/inode.c `inode_init_owner`): the caller's fsuid; the parent's group
//! if the parent is setgid (kubelet's fsGroup), else the caller's fsgid; a
//! new directory in a setgid parent is setgid itself; the mode is exactly
//! what the request asks, never the server's umask (the host's VFS has
//! applied the caller's umask, and stripped a setgid bit the caller may not
//! set, `mode_strip_sgid`). The server makes the entry as itself, chowns
//! it, then chmods it, which also puts back the setuid and setgid bits a
//! chown clears. A symlink gets an owner only; link and rename change none.
//!
//! Descriptors: one per inode the kernel knows, so [`serve`] raises the
//! soft `RLIMIT_NOFILE` to the hard limit; running out anyway (EMFILE,
//! ENFILE) answers that request, and the kernel's FORGETs give them back.
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

mod attrs;
mod inodes;
mod ops;

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once, PoisonError};
use std::time::Duration;

use fuser::{Errno, FileAttr, FileHandle, FileType, INodeNo, Request, TimeOrNow};
use nix::errno::Errno as NixErrno;
use nix::fcntl::{AT_FDCWD, AtFlags, OFlag, openat};
use nix::sys::stat::{FchmodatFlags, Mode, UtimensatFlags, fchmodat, fstat};
use nix::unistd::{Gid, Uid, fchownat};

use self::attrs::{attr, file_type_of, timespec};
use self::inodes::{Inodes, Node};

/// Nothing cached: another host's change shows at once.
const TTL: Duration = Duration::ZERO;

type Answer<T> = Result<T, Errno>;

fn err(e: NixErrno) -> Errno {
    Errno::from_i32(e as i32)
}

fn io_err(e: std::io::Error) -> Errno {
    Errno::from(e)
}

/// An open directory: its entries when it was opened.
type Listing = Vec<(u64, FileType, OsString)>;

/// What a request makes, for the mode it gets.
#[derive(Clone, Copy, Debug)]
enum Made {
    Dir(u32),
    Other(u32),
    Symlink,
}

/// The filesystem one device serves.
#[derive(Debug)]
pub(crate) struct Passthrough {
    inodes: Mutex<Inodes>,
    files: Mutex<HashMap<u64, Arc<File>>>,
    dirs: Mutex<HashMap<u64, Arc<Listing>>>,
    next_fh: AtomicU64,
    gone: Arc<AtomicBool>,
}

impl Passthrough {
    /// Serves the tree at `root`; `gone` set makes it refuse everything.
    pub(crate) fn new(root: &Path, gone: Arc<AtomicBool>) -> std::io::Result<Self> {
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let root = nix::fcntl::open(root, flags, Mode::empty())?;
        let st = fstat(&root)?;
        Ok(Self {
            inodes: Mutex::new(Inodes::new(root, (st.st_dev, st.st_ino))),
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

    /// An inode the kernel knows (ESTALE for one it forgot: it never asks).
    fn node(&self, ino: INodeNo) -> Answer<Arc<Node>> {
        self.live()?;
        lock(&self.inodes).get(ino.0).ok_or(Errno::ESTALE)
    }

    /// `name` in the directory `parent`, counted as one more lookup.
    fn lookup_in(&self, parent: &Node, name: &OsStr) -> Answer<FileAttr> {
        let fd = openat(&parent.fd, one_name(name)?, held(), Mode::empty()).map_err(err)?;
        self.remember(fd)
    }

    /// The file `fd` holds, counted as one more lookup.
    fn remember(&self, fd: OwnedFd) -> Answer<FileAttr> {
        let st = fstat(&fd).map_err(err)?;
        let ino = lock(&self.inodes).looked_up(fd, (st.st_dev, st.st_ino));
        Ok(attr(ino, &st))
    }

    /// The kernel dropped `n` lookups of `ino`.
    fn forgotten(&self, ino: INodeNo, n: u64) {
        // Closed once the table is unlocked: see `Inodes::forget`.
        let last = lock(&self.inodes).forget(ino.0, n);
        drop(last);
    }

    /// Makes `name` in `parent` with `make`, then gives it its owner and mode.
    fn make(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        made: Made,
        make: impl FnOnce(&OwnedFd, &OsStr) -> nix::Result<()>,
    ) -> Answer<FileAttr> {
        let parent = self.node(parent)?;
        let name = one_name(name)?;
        make(&parent.fd, name).map_err(err)?;
        // Failing from here (EMFILE) leaves the entry made but the request
        // refused, as a server dying at this instant would.
        let fd = openat(&parent.fd, name, held(), Mode::empty()).map_err(err)?;
        own(&parent, &fd, made, req)?;
        self.remember(fd)
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

    fn set(
        &self,
        ino: INodeNo,
        mode: Option<u32>,
        ids: (Option<u32>, Option<u32>),
        size: Option<u64>,
        times: (Option<TimeOrNow>, Option<TimeOrNow>),
        fh: Option<FileHandle>,
    ) -> Answer<FileAttr> {
        let node = self.node(ino)?;
        let path = proc_path(&node.fd);
        if let Some(mode) = mode {
            // A symlink's own mode cannot change (EOPNOTSUPP), as locally.
            let mode = Mode::from_bits_truncate(mode);
            fchmodat(AT_FDCWD, &path, mode, FchmodatFlags::FollowSymlink).map_err(err)?;
        }
        if ids.0.is_some() || ids.1.is_some() {
            let (uid, gid) = (ids.0.map(Uid::from_raw), ids.1.map(Gid::from_raw));
            fchownat(&node.fd, "", uid, gid, on_itself()).map_err(err)?;
        }
        if let Some(size) = size {
            match fh {
                Some(fh) => self.file(fh)?.set_len(size).map_err(io_err)?,
                None => {
                    let size = i64::try_from(size).map_err(|_| Errno::EFBIG)?;
                    nix::unistd::truncate(&path, size).map_err(err)?;
                }
            }
        }
        if times.0.is_some() || times.1.is_some() {
            let (atime, mtime) = (timespec(times.0), timespec(times.1));
            // The magic link's target is the inode itself, a symlink's too.
            let follow = UtimensatFlags::FollowSymlink;
            nix::sys::stat::utimensat(AT_FDCWD, &path, &atime, &mtime, follow).map_err(err)?;
        }
        let st = fstat(&node.fd).map_err(err)?;
        Ok(attr(ino.0, &st))
    }

    fn list(&self, ino: INodeNo) -> Answer<Listing> {
        let node = self.node(ino)?;
        let dev = fstat(&node.fd).map_err(err)?.st_dev;
        let mut entries = vec![];
        for entry in std::fs::read_dir(proc_path(&node.fd)).map_err(io_err)? {
            let entry = entry.map_err(io_err)?;
            let kind = entry.file_type().map_err(io_err)?;
            let backing = std::os::unix::fs::DirEntryExt::ino(&entry);
            entries.push((backing, file_type_of(kind), entry.file_name()));
        }
        let inodes = lock(&self.inodes);
        let mut listing = vec![
            (ino.0, FileType::Directory, ".".into()),
            (ino.0, FileType::Directory, "..".into()),
        ];
        // Informative only (lookup gives the inode a name has).
        listing.extend(entries.into_iter().map(|(backing, kind, name)| {
            (inodes.of((dev, backing)).unwrap_or(backing), kind, name)
        }));
        Ok(listing)
    }
}

/// How an inode's descriptor is opened: by name, never opened for I/O, a
/// last symlink held rather than followed.
fn held() -> OFlag {
    OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// `*at` flags that act on the descriptor's own file, even a symlink.
fn on_itself() -> AtFlags {
    AtFlags::AT_EMPTY_PATH | AtFlags::AT_SYMLINK_NOFOLLOW
}

/// One component of a name, so that no path is resolved beyond it.
fn one_name(name: &OsStr) -> Answer<&OsStr> {
    match name.as_bytes() {
        b"" | b"." | b".." => Err(Errno::EINVAL),
        bytes if bytes.contains(&b'/') => Err(Errno::EINVAL),
        _ => Ok(name),
    }
}

/// Opens the inode `fd` holds as `flags` say, through its magic link.
fn reopen(fd: &impl AsFd, flags: OFlag) -> Answer<OwnedFd> {
    let flags = flags | OFlag::O_CLOEXEC;
    openat(AT_FDCWD, &proc_path(fd), flags, Mode::empty()).map_err(err)
}

/// Gives `new`, just made in `parent` by `req`, the owner and mode a local
/// filesystem would (see the module docs).
fn own(parent: &Node, new: &impl AsFd, made: Made, req: &Request) -> Answer<()> {
    let dir = fstat(&parent.fd).map_err(err)?;
    let setgid = dir.st_mode & Mode::S_ISGID.bits() != 0;
    let gid = if setgid { dir.st_gid } else { req.gid() };
    let (uid, gid) = (Uid::from_raw(req.uid()), Gid::from_raw(gid));
    fchownat(new, "", Some(uid), Some(gid), on_itself()).map_err(err)?;
    let mode = match made {
        Made::Symlink => return Ok(()),
        Made::Dir(mode) if setgid => mode | Mode::S_ISGID.bits(),
        Made::Dir(mode) | Made::Other(mode) => mode,
    };
    let mode = Mode::from_bits_truncate(mode);
    fchmodat(
        AT_FDCWD,
        &proc_path(new),
        mode,
        FchmodatFlags::FollowSymlink,
    )
    .map_err(err)
}

/// Serves `fs` on the FUSE connection `fuse` (its `/dev/fuse` descriptor,
/// mounted by a host) on threads of its own, until the host unmounts it.
/// Answers once the kernel's INIT is answered: the mount works from then on.
pub(crate) fn serve(fs: Passthrough, fuse: OwnedFd) -> std::io::Result<()> {
    static RAISED: Once = Once::new();
    RAISED.call_once(raise_descriptor_limit);
    let mut config = fuser::Config::default();
    config.n_threads = Some(2);
    config.clone_fd = true;
    let session = fuser::Session::from_fd(fs, fuse, fuser::SessionACL::All, config)?;
    std::thread::Builder::new()
        .name("virtiofs-session".into())
        .spawn(move || {
            if let Err(e) = session.run() {
                tracing::warn!("a virtio-fs FUSE session ended with an error: {e}");
            }
        })?;
    Ok(())
}

/// Every inode a host knows holds a descriptor, and the soft limit (often
/// 1024) is soon reached by a host walking a tree; the hard limit is what
/// the process is allowed. Nothing here uses select(2), the one reason to
/// keep the soft limit low.
fn raise_descriptor_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::info!("open files limit raised from {soft} to {hard}"),
            Err(e) => tracing::warn!("open files limit stays {soft}: {e}"),
        },
        Ok(_) => {}
        Err(e) => tracing::warn!("reading the open files limit: {e}"),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `/proc/self/fd/N`: a magic link to the inode `fd` holds, which reaches
/// it even with no name left, and lands on a symlink itself.
fn proc_path(fd: &impl AsFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_one_component_and_nothing_else() {
        for bad in ["", ".", "..", "a/b", "/", "../x", "x/"] {
            assert_eq!(one_name(OsStr::new(bad)), Err(Errno::EINVAL), "{bad:?}");
        }
        for good in ["a", "...", ".hidden", "a b", "..x"] {
            assert_eq!(one_name(OsStr::new(good)), Ok(OsStr::new(good)));
        }
    }
}
