//! What the kernel is told of a backing file: its attributes in FUSE's
//! terms, and times in both directions.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo, TimeOrNow};
use nix::sys::stat::{FileStat, SFlag};
use nix::sys::time::TimeSpec;

pub(super) fn timespec(t: Option<TimeOrNow>) -> TimeSpec {
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

pub(super) fn file_type_of(t: std::fs::FileType) -> FileType {
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

pub(super) fn attr(ino: u64, st: &FileStat) -> FileAttr {
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
