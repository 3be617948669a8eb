//! Facts about a block device node the kernel keeps: its device number,
//! its size, and its read-only flag.

use std::ffi::OsStr;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use tokio::time::Instant;

use super::command;
use super::error::NodeError;

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

/// Marks the block device `device` read-only (or writable again) for every
/// opener on this host, with `blockdev --setro`/`--setrw`: the way to make a
/// read-only raw block volume refuse writes (EPERM), which a read-only bind
/// mount of its node cannot. Idempotent, and runs nothing when the kernel
/// already shows the wanted setting: a stage or unstage almost always finds
/// it so, and the tool costs a process (~1 ms) each time.
pub async fn set_block_device_read_only(
    device: &Path,
    read_only: bool,
    deadline: Instant,
) -> Result<(), NodeError> {
    let (major, minor) = block_device_number(device)?;
    if kernel_read_only(major, minor) == Some(read_only) {
        return Ok(());
    }
    let flag = if read_only { "--setro" } else { "--setrw" };
    command::run(
        "blockdev",
        &[OsStr::new(flag), device.as_os_str()],
        deadline,
    )
    .await?;
    Ok(())
}

/// The device's read-only flag as the kernel reports it (the real sysfs,
/// whatever tree locates devices); `None` if it cannot be read, and then the
/// tool runs anyway.
fn kernel_read_only(major: u32, minor: u32) -> Option<bool> {
    match std::fs::read(format!("/sys/dev/block/{major}:{minor}/ro"))
        .ok()?
        .as_slice()
    {
        b"0\n" => Some(false),
        b"1\n" => Some(true),
        _ => None,
    }
}

/// Whether `major:minor` names a block device the kernel removed: not an
/// anonymous device (major 0: tmpfs, overlay, a bind of a device node shows
/// its devtmpfs), and absent from the real `/sys/dev/block`, which the
/// kernel keeps while the disk exists (whatever tree locates devices).
pub fn removed(major: u32, minor: u32) -> bool {
    major != 0 && !Path::new(&format!("/sys/dev/block/{major}:{minor}")).exists()
}

#[cfg(test)]
mod tests {
    use super::super::command::testing::Scratch;
    use super::*;

    #[test]
    fn block_device_questions_about_non_devices() {
        let err = block_device_size(Path::new("/nonexistent-snap-csi")).unwrap_err();
        assert!(matches!(err, NodeError::NotFound(_)), "{err:?}");
        let file = tempfile::NamedTempFile::new().unwrap();
        let err = block_device_size(file.path()).unwrap_err();
        assert!(matches!(err, NodeError::FailedPrecondition(_)), "{err:?}");
    }

    #[test]
    fn a_device_is_removed_only_when_the_kernel_no_longer_has_it() {
        let mut scratch = Scratch::new();
        let device = scratch.loop_device("disk.img", 16 << 20);
        let (major, minor) = block_device_number(&device).unwrap();
        assert!(!removed(major, minor), "an attached loop device");
        assert!(!removed(0, 42), "anonymous devices are never block devices");
        // Minors past what the loop driver hands out (1 << 20 is its limit).
        assert!(removed(major, (1 << 20) + 7));
    }

    #[test]
    fn block_device_size_of_a_loop_device() {
        let mut scratch = Scratch::new();
        let device = scratch.loop_device("disk.img", 48 << 20);
        assert_eq!(block_device_size(&device).unwrap(), 48 << 20);
        scratch.grow(&device, "disk.img", 80 << 20);
        assert_eq!(block_device_size(&device).unwrap(), 80 << 20);
    }
}
