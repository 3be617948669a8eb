//! A mounted filesystem as the kernel shows it: how full it is, and whether
//! it still works.

use std::path::{Path, PathBuf};

use nix::errno::Errno;
use tokio::time::Instant;

use super::command;
use super::error::NodeError;
use super::mountinfo::{self, MountEntry};

/// Capacity and use of a mounted filesystem, in CSI's signed integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub total_bytes: i64,
    /// What an unprivileged writer can still use (reserved blocks excluded).
    pub available_bytes: i64,
    pub used_bytes: i64,
    pub total_inodes: i64,
    pub free_inodes: i64,
    pub used_inodes: i64,
}

/// Bytes and inodes of the filesystem holding `path`, from statvfs(3).
pub fn filesystem_usage(path: &Path) -> Result<Usage, NodeError> {
    let st = nix::sys::statvfs::statvfs(path)
        .map_err(|errno| NodeError::errno(format!("statvfs {}", path.display()), errno))?;
    // f_blocks, f_bfree and f_bavail count fragments, not f_bsize blocks.
    // (All of these are u64 on the 64-bit hosts a BlueField sits in.)
    let unit = st.fragment_size();
    let bytes = |count: u64| saturate(count.saturating_mul(unit));
    let (blocks, free_blocks) = (st.blocks(), st.blocks_free());
    let (inodes, free_inodes) = (st.files(), st.files_free());
    Ok(Usage {
        total_bytes: bytes(blocks),
        available_bytes: bytes(st.blocks_available()),
        used_bytes: bytes(blocks.saturating_sub(free_blocks)),
        total_inodes: saturate(inodes),
        free_inodes: saturate(free_inodes),
        used_inodes: saturate(inodes.saturating_sub(free_inodes)),
    })
}

/// Why the filesystem mounted at `path` (the mount `entry`) no longer works
/// as it was mounted; `None` while it does.
///
/// How it is told, each look read-only and cheap enough for kubelet's
/// periodic stats:
/// - The filesystem's block device still on the host (`/sys/dev/block`):
///   a function removed under a mount (SNAP's function deleted, a surprise
///   removal) takes its disk away while the mount stays. A 6.12 kernel then
///   answers the flush below with EIO, which alone would read as a
///   filesystem that shut down by itself.
/// - An fsync of the mount's root directory. A filesystem that shut down
///   (after an I/O error it could not survive, or on request: the
///   `XFS_IOC_GOINGDOWN`/`EXT4_IOC_SHUTDOWN` ioctl) answers EIO to it, to
///   opening the directory on xfs, and to everything else but statfs, which
///   still answers, so usage alone cannot tell. This is the only sign xfs
///   gives: its mount table line and sysfs stay as they were. On a healthy
///   filesystem with nothing to write it costs no I/O.
/// - The mount table: the kernel made the whole filesystem read-only (its
///   superblock options say `ro`, or `emergency_ro`) while a mount of it was
///   made read-write: ext4's `errors=remount-ro` at work.
/// - ext4's own count of the errors it met (`/sys/fs/ext4/DEV/errors_count`):
///   with `errors=continue` the filesystem goes on, damaged. e2fsck clears it.
///
/// A look the deadline cuts short is a fault too: a filesystem that cannot
/// flush an empty directory in time sits on a stuck device.
pub async fn filesystem_fault(
    path: &Path,
    entry: &MountEntry,
    deadline: Instant,
) -> Result<Option<String>, NodeError> {
    let (dir, mount) = (path.to_path_buf(), entry.clone());
    let what = format!("check the filesystem at {}", path.display());
    match command::run_blocking("fs-check", &what, deadline, move || fault(&dir, &mount)).await {
        Err(NodeError::Timeout { .. }) => Ok(Some(format!(
            "the {} filesystem at {} did not answer a flush in time: its device may be stuck",
            entry.fs_type,
            path.display()
        ))),
        other => other,
    }
}

fn fault(path: &Path, entry: &MountEntry) -> Result<Option<String>, NodeError> {
    let fs = &entry.fs_type;
    // Major 0 is no disk's: a virtio-fs, tmpfs or network mount.
    let (major, minor) = (entry.major, entry.minor);
    if major != 0 && !Path::new(&format!("/sys/dev/block/{major}:{minor}")).exists() {
        return Ok(Some(format!(
            "the {fs} filesystem's block device {major}:{minor} is gone from the host \
             (its PCI function was removed)"
        )));
    }
    match std::fs::File::open(path).and_then(|dir| dir.sync_all()) {
        Ok(()) => {}
        Err(err) if err.raw_os_error() == Some(Errno::EIO as i32) => {
            return Ok(Some(format!(
                "the {fs} filesystem has shut down: it answers every use with an I/O error \
                 ({err}), after an I/O error it could not survive or a shutdown request"
            )));
        }
        // A read-only filesystem may refuse the flush; the table says why.
        Err(err) if err.raw_os_error() == Some(Errno::EROFS as i32) => {}
        Err(err) => return Err(NodeError::io(format!("fsync {}", path.display()), &err)),
    }
    // Newer kernels (6.x) leave ext4's `rw` and add `emergency_ro`.
    let forced_read_only = entry
        .super_options
        .iter()
        .any(|o| o == "ro" || o == "emergency_ro")
        && mountinfo::read()?
            .iter()
            .any(|m| (m.major, m.minor) == (entry.major, entry.minor) && !m.is_read_only_mount());
    if forced_read_only {
        return Ok(Some(format!(
            "the kernel made the {fs} filesystem read-only after errors"
        )));
    }
    if fs == "ext4"
        && let Some(errors) = ext4_errors(entry.major, entry.minor)
    {
        return Ok(Some(format!("the ext4 filesystem recorded {errors}")));
    }
    Ok(None)
}

/// ext4's count of errors on device `major:minor` since its last check, and
/// where the last one was, when there are any.
fn ext4_errors(major: u32, minor: u32) -> Option<String> {
    let device = std::fs::read_link(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    let dir = PathBuf::from("/sys/fs/ext4").join(device.file_name()?);
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    let count: u64 = read("errors_count")?.trim().parse().ok()?;
    if count == 0 {
        return None;
    }
    let last = read("last_error_func").unwrap_or_default();
    Some(match last.trim() {
        "" => format!("{count} error(s)"),
        function => format!("{count} error(s), the last in {function}"),
    })
}

/// CSI's fields are int64; a value past that is reported as the largest one
/// rather than wrapping negative.
fn saturate(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saturates_instead_of_wrapping() {
        assert_eq!(saturate(5), 5);
        assert_eq!(saturate(u64::MAX), i64::MAX);
    }

    #[test]
    fn a_filesystem_whose_device_left_the_host_says_so() {
        let table = mountinfo::parse(b"36 35 259:1048575 / /tmp rw - ext4 /dev/gone rw\n").unwrap();
        let why = fault(Path::new("/tmp"), &table[0]).unwrap().unwrap();
        assert!(why.contains("259:1048575 is gone from the host"), "{why}");
    }

    #[test]
    fn usage_of_a_missing_path_is_not_found() {
        let err = filesystem_usage(Path::new("/nonexistent-snap-csi")).unwrap_err();
        assert!(matches!(err, NodeError::NotFound(_)), "{err:?}");
    }
}
