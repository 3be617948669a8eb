//! Usage of a mounted volume, whether its filesystem still works, the size
//! of a block device, and growing a filesystem after its device grew.

use std::ffi::OsStr;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use tokio::time::Instant;

use super::command;
use super::error::NodeError;
use super::format::FsType;
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

/// The major:minor of the block device node `device` (links followed, so
/// `/dev/disk/by-id/...` works). A path that is there but not a block device,
/// such as a block publish target whose bind mount is gone, is a failed
/// precondition.
pub fn block_device_number(device: &Path) -> Result<(u32, u32), NodeError> {
    let meta = std::fs::metadata(device)
        .map_err(|err| NodeError::io(format!("stat {}", device.display()), &err))?;
    if !meta.file_type().is_block_device() {
        return Err(NodeError::FailedPrecondition(format!(
            "{} is not a block device",
            device.display()
        )));
    }
    let rdev = meta.rdev();
    let part = |value: u64| {
        u32::try_from(value).map_err(|_| {
            NodeError::failed(
                format!("stat {}", device.display()),
                format!("device number {rdev:#x} out of range"),
            )
        })
    };
    Ok((
        part(nix::sys::stat::major(rdev))?,
        part(nix::sys::stat::minor(rdev))?,
    ))
}

/// The size in bytes of the block device node `device`, from
/// `/sys/dev/block/M:m/size` (always in 512-byte sectors, whatever the
/// device's logical block size).
pub fn block_device_size(device: &Path) -> Result<u64, NodeError> {
    let (major, minor) = block_device_number(device)?;
    let size_file = format!("/sys/dev/block/{major}:{minor}/size");
    let what = || format!("size of {} ({size_file})", device.display());
    let text = std::fs::read_to_string(&size_file).map_err(|err| NodeError::io(what(), &err))?;
    text.trim()
        .parse::<u64>()
        .ok()
        .and_then(|sectors| sectors.checked_mul(512))
        .ok_or_else(|| NodeError::failed(what(), format!("unexpected content {text:?}")))
}

/// Grows the filesystem on `device`, mounted at `mount_path`, to fill the
/// device, online: `resize2fs DEVICE` for ext4, `xfs_growfs -d MOUNT_PATH`
/// for xfs. Both are no-ops when there is nothing to grow, so a retry is safe.
///
/// Refuses (FailedPrecondition) when `mount_path` does not hold `device`'s
/// filesystem: resizing is only ever done to the volume the caller names.
pub async fn expand_filesystem(
    device: &Path,
    mount_path: &Path,
    fs: FsType,
    deadline: Instant,
) -> Result<(), NodeError> {
    let (dev, mnt) = (device.to_path_buf(), mount_path.to_path_buf());
    command::run_blocking(
        "expand-check",
        &format!(
            "check that {} is mounted at {}",
            device.display(),
            mount_path.display()
        ),
        deadline,
        move || {
            let number = block_device_number(&dev)?;
            match mountinfo::at(&mnt)? {
                Some(m) if (m.major, m.minor) == number => Ok(()),
                Some(m) => Err(NodeError::FailedPrecondition(format!(
                    "{} holds {} ({}), not the filesystem of {}",
                    mnt.display(),
                    m.source,
                    m.fs_type,
                    dev.display()
                ))),
                None => Err(NodeError::FailedPrecondition(format!(
                    "nothing is mounted at {}; the filesystem of {} can only be grown online",
                    mnt.display(),
                    dev.display()
                ))),
            }
        },
    )
    .await?;
    match fs {
        FsType::Ext4 => command::run("resize2fs", &[device.as_os_str()], deadline)
            .await
            .map_err(explain_resize2fs)?,
        FsType::Xfs => {
            command::run(
                "xfs_growfs",
                &[OsStr::new("-d"), mount_path.as_os_str()],
                deadline,
            )
            .await?
        }
    };
    Ok(())
}

/// Online ext4 resizing is an ioctl that wants CAP_SYS_RESOURCE; resize2fs
/// only says "Permission denied", which reads like a file permission problem.
/// The node's container lacks a capability: a precondition, not a bug.
fn explain_resize2fs(err: NodeError) -> NodeError {
    match err {
        NodeError::Failed { message, .. } if message.contains("Permission denied to resize") => {
            NodeError::FailedPrecondition(format!(
                "{message} (online ext4 resizing needs CAP_SYS_RESOURCE, which this process lacks; \
                 the filesystem grows at its next stage instead)"
            ))
        }
        other => other,
    }
}

/// Grows an unmounted ext4 filesystem to fill its device, if the device grew.
///
/// This is how a volume expanded while unstaged gets its space: at the next
/// stage, before mounting. Offline resizing needs no CAP_SYS_RESOURCE, and
/// resize2fs insists on a forced check first. Returns whether it grew.
pub async fn grow_ext4_offline(device: &Path, deadline: Instant) -> Result<bool, NodeError> {
    let header = command::run(
        "dumpe2fs",
        &[OsStr::new("-h"), device.as_os_str()],
        deadline,
    )
    .await?;
    let header = String::from_utf8_lossy(&header.stdout);
    let field = |name: &str| -> Option<u64> {
        header
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().parse().ok())
    };
    let (Some(blocks), Some(block_size)) = (field("Block count:"), field("Block size:")) else {
        return Err(NodeError::Failed {
            what: format!("reading the ext4 size of {}", device.display()),
            message: "dumpe2fs printed no block count or block size".into(),
        });
    };
    let device_bytes = block_device_size(device)?;
    if blocks.saturating_add(1).saturating_mul(block_size) > device_bytes {
        return Ok(false);
    }
    let check = command::run_unchecked(
        "e2fsck",
        &[OsStr::new("-f"), OsStr::new("-p"), device.as_os_str()],
        deadline,
    )
    .await?;
    // 0: clean, 1: errors corrected; anything else needs a human (e2fsck(8)).
    if !matches!(check.status.code(), Some(0 | 1)) {
        return Err(NodeError::FailedPrecondition(format!(
            "e2fsck -f -p {} before growing it: {}",
            device.display(),
            String::from_utf8_lossy(&check.stdout).trim()
        )));
    }
    command::run("resize2fs", &[device.as_os_str()], deadline).await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::super::command::testing::{Scratch, deadline};
    use super::super::format::format_if_blank;
    use super::super::mount::{mount_filesystem, unmount};
    use super::*;

    fn has_cap_sys_resource() -> bool {
        const CAP_SYS_RESOURCE: u32 = 24;
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let effective = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .unwrap();
        effective & (1 << CAP_SYS_RESOURCE) != 0
    }

    #[test]
    fn saturates_instead_of_wrapping() {
        assert_eq!(saturate(5), 5);
        assert_eq!(saturate(u64::MAX), i64::MAX);
    }

    #[test]
    fn usage_of_a_missing_path_is_not_found() {
        let err = filesystem_usage(Path::new("/nonexistent-snap-csi")).unwrap_err();
        assert!(matches!(err, NodeError::NotFound(_)), "{err:?}");
    }

    #[test]
    fn block_device_questions_about_non_devices() {
        let err = block_device_size(Path::new("/nonexistent-snap-csi")).unwrap_err();
        assert!(matches!(err, NodeError::NotFound(_)), "{err:?}");
        let file = tempfile::NamedTempFile::new().unwrap();
        let err = block_device_size(file.path()).unwrap_err();
        assert!(matches!(err, NodeError::FailedPrecondition(_)), "{err:?}");
    }

    #[test]
    fn block_device_size_of_a_loop_device() {
        let mut scratch = Scratch::new();
        let device = scratch.loop_device("disk.img", 48 << 20);
        assert_eq!(block_device_size(&device).unwrap(), 48 << 20);
        scratch.grow(&device, "disk.img", 80 << 20);
        assert_eq!(block_device_size(&device).unwrap(), 80 << 20);
    }

    /// Formats, mounts, checks usage, grows the device and the filesystem,
    /// checks usage again; expanding twice is fine.
    async fn usage_and_expansion(fs: FsType, size: u64) {
        let mut scratch = Scratch::new();
        let device = scratch.loop_device("disk.img", size);
        let target = scratch.path("mnt");
        assert!(format_if_blank(&device, fs, deadline()).await.unwrap());
        mount_filesystem(&device, &target, fs, &[], false, deadline())
            .await
            .unwrap();

        let before = filesystem_usage(&target).unwrap();
        assert!(
            before.total_bytes > 0 && before.total_bytes <= size as i64,
            "{before:?}"
        );
        assert!(before.available_bytes > 0 && before.available_bytes <= before.total_bytes);
        // A fresh filesystem already holds its own metadata (journal, inode tables).
        assert!(before.used_bytes > 0 && before.used_bytes < before.total_bytes);
        assert!(before.total_inodes > 0 && before.free_inodes <= before.total_inodes);
        assert_eq!(before.used_inodes, before.total_inodes - before.free_inodes);

        let data = vec![7u8; 8 << 20];
        std::fs::write(target.join("data"), &data).unwrap();
        nix::unistd::sync();
        let written = filesystem_usage(&target).unwrap();
        assert!(
            written.used_bytes >= before.used_bytes + (8 << 20) - (1 << 20),
            "{written:?}"
        );
        assert!(written.used_inodes > before.used_inodes);

        scratch.grow(&device, "disk.img", size * 2);
        if fs == FsType::Ext4 && !has_cap_sys_resource() {
            // Kubernetes runs the node plugin privileged; some sandboxes drop this.
            let err = expand_filesystem(&device, &target, fs, deadline())
                .await
                .unwrap_err();
            assert!(err.to_string().contains("needs CAP_SYS_RESOURCE"), "{err}");
            eprintln!("NOTE: online ext4 growth not exercised: no CAP_SYS_RESOURCE here");
            return;
        }
        expand_filesystem(&device, &target, fs, deadline())
            .await
            .unwrap();
        let after = filesystem_usage(&target).unwrap();
        assert!(
            after.total_bytes > before.total_bytes + (size as i64) * 9 / 10,
            "{before:?} -> {after:?}"
        );
        // Nothing left to grow: still fine.
        expand_filesystem(&device, &target, fs, deadline())
            .await
            .unwrap();
        assert_eq!(std::fs::read(target.join("data")).unwrap(), data);

        assert!(unmount(&target, deadline()).await.unwrap());
        let err = expand_filesystem(&device, &target, fs, deadline())
            .await
            .unwrap_err();
        assert!(matches!(err, NodeError::FailedPrecondition(_)), "{err:?}");
    }

    #[tokio::test]
    async fn usage_and_online_expansion_ext4() {
        usage_and_expansion(FsType::Ext4, 64 << 20).await;
    }

    #[tokio::test]
    async fn usage_and_online_expansion_xfs() {
        // mkfs.xfs refuses filesystems under 300 MiB.
        usage_and_expansion(FsType::Xfs, 320 << 20).await;
    }

    #[tokio::test]
    async fn expand_refuses_a_mount_of_another_device() {
        let mut scratch = Scratch::new();
        let mounted = scratch.loop_device("a.img", 32 << 20);
        let other = scratch.loop_device("b.img", 32 << 20);
        let target = scratch.path("mnt");
        format_if_blank(&mounted, FsType::Ext4, deadline())
            .await
            .unwrap();
        mount_filesystem(&mounted, &target, FsType::Ext4, &[], false, deadline())
            .await
            .unwrap();
        let err = expand_filesystem(&other, &target, FsType::Ext4, deadline())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, NodeError::FailedPrecondition(m) if m.contains("not the filesystem of")),
            "{err:?}"
        );
    }
}
