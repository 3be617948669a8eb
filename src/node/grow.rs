//! Growing a filesystem after its device grew: online while it is mounted
//! (NodeExpandVolume), offline for ext4 at the next stage.

use std::ffi::OsStr;
use std::path::Path;

use tokio::time::Instant;

use super::command;
use super::device::{block_device_number, block_device_size};
use super::error::NodeError;
use super::format::FsType;
use super::mountinfo;

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
    use super::super::health::filesystem_usage;
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
