//! The FUSE operations of [`Passthrough`], each a thin answer over a call
//! on its inodes' descriptors (see the parent module for confinement,
//! ownership and coherence).

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use nix::errno::Errno as NixErrno;
use nix::fcntl::{
    AT_FDCWD, AtFlags, OFlag, RenameFlags as NixRenameFlags, openat, readlinkat, renameat2,
};
use nix::sys::stat::{Mode, SFlag, fstat, mkdirat, mknodat};
use nix::sys::statvfs::fstatvfs;
use nix::unistd::{UnlinkatFlags, linkat, symlinkat, unlinkat};

use super::attrs::attr;
use super::inodes::ROOT;
use super::{Made, Passthrough, TTL, err, io_err, lock, one_name, own, proc_path, reopen};

/// Replies `$ok(value)` or the error.
macro_rules! answer {
    ($reply:ident, $result:expr, |$v:pat_param| $ok:expr) => {
        match $result {
            Ok($v) => $ok,
            Err(e) => $reply.error(e),
        }
    };
}

/// The permission bits a request asks for, after the caller's umask (which
/// the host's VFS applied already, unless FUSE_DONT_MASK, which we do not ask).
fn masked(mode: u32, umask: u32) -> u32 {
    mode & !umask & 0o7777
}

/// What the kernel's open flags mean for a reopen through the magic link:
/// creation is create's, and `O_NOFOLLOW` would refuse the link itself.
fn open_flags(flags: i32) -> OFlag {
    let made = OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOCTTY | OFlag::O_NOFOLLOW;
    OFlag::from_bits_truncate(flags) & !made
}

impl Passthrough {
    /// Removes `name` from `parent`.
    fn remove(&self, parent: INodeNo, name: &OsStr, how: UnlinkatFlags) -> Result<(), Errno> {
        let parent = self.node(parent)?;
        unlinkat(&parent.fd, one_name(name)?, how).map_err(err)
    }

    /// create(2): made here (and owned by the caller), or opened as another
    /// host made it an instant before, unless the caller asked `O_EXCL`.
    fn create_file(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> Result<(fuser::FileAttr, FileHandle), Errno> {
        let parent = self.node(parent)?;
        let name = one_name(name)?;
        let exclusive = flags & nix::libc::O_EXCL != 0;
        let flags = open_flags(flags) | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let new = flags | OFlag::O_CREAT | OFlag::O_EXCL;
        let file = match openat(&parent.fd, name, new, Mode::from_bits_truncate(mode)) {
            Ok(file) => {
                own(&parent, &file, Made::Other(mode), req)?;
                file
            }
            Err(NixErrno::EEXIST) if !exclusive => {
                openat(&parent.fd, name, flags, Mode::empty()).map_err(err)?
            }
            Err(e) => return Err(err(e)),
        };
        let attr = self.remember(reopen(&file, OFlag::O_PATH)?)?;
        Ok((attr, self.keep_file(File::from(file))))
    }
}

impl Filesystem for Passthrough {
    fn init(&mut self, _req: &Request, _config: &mut KernelConfig) -> std::io::Result<()> {
        // No writeback cache and no other caching capability: see the module docs.
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = self
            .node(parent)
            .and_then(|parent| self.lookup_in(&parent, name));
        answer!(reply, found, |a| reply.entry(&TTL, &a, Generation(0)));
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.forgotten(ino, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        // The inode's own descriptor: a file without a name left has one too.
        let st = self.node(ino).and_then(|node| fstat(&node.fd).map_err(err));
        answer!(reply, st, |st| reply.attr(&TTL, &attr(ino.0, &st)));
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = self.set(ino, mode, (uid, gid), size, (atime, mtime), fh);
        answer!(reply, set, |a| reply.attr(&TTL, &a));
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let target = self
            .node(ino)
            .and_then(|node| readlinkat(&node.fd, "").map_err(err));
        answer!(reply, target, |t| reply
            .data(std::os::unix::ffi::OsStrExt::as_bytes(t.as_os_str())));
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let kind = SFlag::from_bits_truncate(mode & SFlag::S_IFMT.bits());
        let perm = masked(mode, umask);
        let made = self.make(req, parent, name, Made::Other(perm), |dir, name| {
            let perm = Mode::from_bits_truncate(perm);
            mknodat(dir, name, kind, perm, u64::from(rdev))
        });
        answer!(reply, made, |a| reply.entry(&TTL, &a, Generation(0)));
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let perm = masked(mode, umask);
        let made = self.make(req, parent, name, Made::Dir(perm), |dir, name| {
            mkdirat(dir, name, Mode::from_bits_truncate(perm))
        });
        answer!(reply, made, |a| reply.entry(&TTL, &a, Generation(0)));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let done = self.remove(parent, name, UnlinkatFlags::NoRemoveDir);
        answer!(reply, done, |()| reply.ok());
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let done = self.remove(parent, name, UnlinkatFlags::RemoveDir);
        answer!(reply, done, |()| reply.ok());
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let made = self.make(req, parent, link_name, Made::Symlink, |dir, name| {
            symlinkat(target, dir, name)
        });
        answer!(reply, made, |a| reply.entry(&TTL, &a, Generation(0)));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let done = (|| {
            let (from, to) = (self.node(parent)?, self.node(newparent)?);
            let (name, newname) = (one_name(name)?, one_name(newname)?);
            let flags = NixRenameFlags::from_bits_truncate(flags.bits());
            renameat2(&from.fd, name, &to.fd, newname, flags).map_err(err)
        })();
        answer!(reply, done, |()| reply.ok());
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let made = (|| {
            let (node, to) = (self.node(ino)?, self.node(newparent)?);
            let newname = one_name(newname)?;
            // Through the magic link: AT_EMPTY_PATH would need CAP_DAC_READ_SEARCH.
            let follow = AtFlags::AT_SYMLINK_FOLLOW;
            linkat(AT_FDCWD, &proc_path(&node.fd), &to.fd, newname, follow).map_err(err)?;
            // The same inode under one more name: one more lookup of it.
            self.remember(node.fd.try_clone().map_err(io_err)?)
        })();
        answer!(reply, made, |a| reply.entry(&TTL, &a, Generation(0)));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let opened = self
            .node(ino)
            .and_then(|node| reopen(&node.fd, open_flags(flags.0)));
        // No FOPEN_KEEP_CACHE: the kernel drops cached pages at each open.
        answer!(reply, opened, |f| reply
            .opened(self.keep_file(File::from(f)), FopenFlags::empty()));
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let read = self.file(fh).and_then(|f| {
            let mut buf = vec![0; size as usize];
            let mut done = 0;
            while done < buf.len() {
                match f.read_at(&mut buf[done..], offset + done as u64) {
                    Ok(0) => break,
                    Ok(n) => done += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(io_err(e)),
                }
            }
            buf.truncate(done);
            Ok(buf)
        });
        answer!(reply, read, |buf| reply.data(&buf));
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let written = self
            .file(fh)
            .and_then(|f| f.write_all_at(data, offset).map_err(io_err));
        answer!(reply, written, |()| reply.written(data.len() as u32));
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Writes are not cached here: each reached the backing file already.
        answer!(reply, self.file(fh), |_| reply.ok());
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        lock(&self.files).remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let synced = self.file(fh).and_then(|f| {
            if datasync {
                f.sync_data()
            } else {
                f.sync_all()
            }
            .map_err(io_err)
        });
        answer!(reply, synced, |()| reply.ok());
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let listed = self.list(ino).map(|listing| {
            let fh = self
                .next_fh
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            lock(&self.dirs).insert(fh, Arc::new(listing));
            FileHandle(fh)
        });
        answer!(reply, listed, |fh| reply.opened(fh, FopenFlags::empty()));
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listing = self
            .live()
            .and_then(|()| lock(&self.dirs).get(&fh.0).cloned().ok_or(Errno::EBADF));
        let listing = match listing {
            Ok(listing) => listing,
            Err(e) => return reply.error(e),
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, (ino, kind, name)) in listing.iter().enumerate().skip(start) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        lock(&self.dirs).remove(&fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let st = self
            .node(INodeNo(ROOT))
            .and_then(|root| fstatvfs(&root.fd).map_err(err));
        answer!(reply, st, |s| reply.statfs(
            s.blocks(),
            s.blocks_free(),
            s.blocks_available(),
            s.files(),
            s.files_free(),
            s.block_size() as u32,
            s.name_max() as u32,
            s.fragment_size() as u32,
        ));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let made = self.create_file(req, parent, name, masked(mode, umask), flags);
        answer!(reply, made, |(a, fh)| reply.created(
            &TTL,
            &a,
            Generation(0),
            fh,
            FopenFlags::empty()
        ));
    }
}
