//! The FUSE operations of [`Passthrough`], each a thin answer over its
//! `*at` call (see the parent module for confinement and coherence).

use std::ffi::OsStr;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use nix::fcntl::{AtFlags, RenameFlags as NixRenameFlags, readlinkat, renameat2};
use nix::sys::stat::{Mode, SFlag, mkdirat, mknodat};
use nix::sys::statvfs::fstatvfs;
use nix::unistd::{UnlinkatFlags, linkat, symlinkat, unlinkat};

use super::{Passthrough, TTL, err, io_err, lock};

/// Replies `$ok(value)` or the error.
macro_rules! answer {
    ($reply:ident, $result:expr, |$v:pat_param| $ok:expr) => {
        match $result {
            Ok($v) => $ok,
            Err(e) => $reply.error(e),
        }
    };
}

impl Passthrough {
    fn make(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        make: impl FnOnce(&std::os::fd::OwnedFd) -> nix::Result<()>,
    ) -> Result<fuser::FileAttr, Errno> {
        let dir = self.dir(&self.path(parent)?)?;
        make(&dir).map_err(err)?;
        self.own(parent, name, req)
    }
}

fn masked(mode: u32, umask: u32) -> Mode {
    Mode::from_bits_truncate(mode & !umask & 0o7777)
}

impl Filesystem for Passthrough {
    fn init(&mut self, _req: &Request, _config: &mut KernelConfig) -> std::io::Result<()> {
        // No writeback cache and no other caching capability: see the module docs.
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        answer!(reply, self.entry(parent, name), |a| reply.entry(
            &TTL,
            &a,
            Generation(0)
        ));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let st = match fh {
            // An open file may have no name left (unlinked while open).
            Some(fh) => self
                .file(fh)
                .and_then(|f| nix::sys::stat::fstat(&*f).map_err(err)),
            None => self.stat(ino),
        };
        answer!(reply, st, |st| reply.attr(&TTL, &super::attr(ino.0, &st)));
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
            .place(ino)
            .and_then(|(dir, name)| readlinkat(&dir, name.as_os_str()).map_err(err));
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
        let made = self.make(req, parent, name, |dir| {
            mknodat(dir, name, kind, masked(mode, umask), u64::from(rdev))
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
        let made = self.make(req, parent, name, |dir| {
            mkdirat(dir, name, masked(mode, umask))
        });
        answer!(reply, made, |a| reply.entry(&TTL, &a, Generation(0)));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let done = self
            .path(parent)
            .and_then(|p| self.dir(&p))
            .and_then(|dir| unlinkat(&dir, name, UnlinkatFlags::NoRemoveDir).map_err(err));
        answer!(reply, done, |()| reply.ok());
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let done = self
            .path(parent)
            .and_then(|p| self.dir(&p))
            .and_then(|dir| unlinkat(&dir, name, UnlinkatFlags::RemoveDir).map_err(err));
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
        let made = self.make(req, parent, link_name, |dir| {
            symlinkat(target, dir, link_name)
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
            let (from, to) = (self.path(parent)?, self.path(newparent)?);
            let (from_dir, to_dir) = (self.dir(&from)?, self.dir(&to)?);
            let flags = NixRenameFlags::from_bits_truncate(flags.bits());
            renameat2(&from_dir, name, &to_dir, newname, flags).map_err(err)?;
            self.moved(&from.join(name), &to.join(newname));
            Ok(())
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
            let (dir, name) = self.place(ino)?;
            let to = self.dir(&self.path(newparent)?)?;
            linkat(&dir, name.as_os_str(), &to, newname, AtFlags::empty()).map_err(err)?;
            self.entry(newparent, newname)
        })();
        answer!(reply, made, |a| reply.entry(&TTL, &a, Generation(0)));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let opened = self.place(ino).and_then(|(dir, name)| {
            let flags = flags.0 & !(nix::libc::O_CREAT | nix::libc::O_EXCL);
            Self::open_at(&dir, &name, flags, 0)
        });
        // No FOPEN_KEEP_CACHE: the kernel drops cached pages at each open.
        answer!(reply, opened, |f| reply
            .opened(self.keep_file(f), FopenFlags::empty()));
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
        let st = self.live().and_then(|()| fstatvfs(&self.root).map_err(err));
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
        let made = (|| {
            let dir = self.dir(&self.path(parent)?)?;
            let mode = masked(mode, umask).bits();
            let file = Self::open_at(&dir, name, flags | nix::libc::O_CREAT, mode)?;
            let attr = self.own(parent, name, req)?;
            Ok((attr, self.keep_file(file)))
        })();
        answer!(reply, made, |(a, fh)| reply.created(
            &TTL,
            &a,
            Generation(0),
            fh,
            FopenFlags::empty()
        ));
    }
}
