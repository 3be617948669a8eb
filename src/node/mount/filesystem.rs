//! A volume's filesystem mounted at its staging path, ext4 preened first.

use std::ffi::OsStr;
use std::path::Path;

use nix::errno::Errno;
use nix::mount::MsFlags;
use tokio::time::Instant;

use super::options::MountOptions;
use super::target::{already_mounted, ensure_directory};
use crate::node::command;
use crate::node::device::block_device_number;
use crate::node::error::NodeError;
use crate::node::format::{self, FsType, Probe};
use crate::node::mountinfo::{self, MountEntry};

/// Mounts the `fs` filesystem on `device` at the directory `target`
/// (created if missing; its parent must exist), with the CSI `flags` and
/// read-only when asked or when the flags say `ro`.
///
/// `Ok(true)`: mounted now. `Ok(false)`: `device` was already mounted at
/// `target` with the same read-only setting. For ext4 mounted read-write and
/// mounted nowhere else, `e2fsck -p` runs first: a filesystem left dirty by a
/// crashed node is repaired before use, and one with errors preening cannot
/// fix is refused (`FailedPrecondition`) rather than mounted. (XFS needs no
/// preening: mounting replays its log.)
///
/// Errors: an unknown or malformed mount option is `InvalidArgument`; a device
/// without a mountable `fs` filesystem is `FailedPrecondition`; another
/// mount at `target` is `AlreadyExists`.
pub async fn mount_filesystem(
    device: &Path,
    target: &Path,
    fs: FsType,
    flags: &[String],
    read_only: bool,
    deadline: Instant,
) -> Result<bool, NodeError> {
    let options = MountOptions::parse(flags, read_only)?;
    let read_only = options.flags.contains(MsFlags::MS_RDONLY);
    let what = format!("mount {} at {}", device.display(), target.display());

    let (dev, tgt) = (device.to_path_buf(), target.to_path_buf());
    let mounted_elsewhere = command::run_blocking("mount-prepare", &what, deadline, move || {
        let number = block_device_number(&dev)?;
        let ours = |m: &MountEntry| Ok((m.major, m.minor) == number && m.root == Path::new("/"));
        if already_mounted(&tgt, mountinfo::at(&tgt)?, read_only, ours)? {
            return Ok(None);
        }
        ensure_directory(&tgt)?;
        let table = mountinfo::read()?;
        Ok(Some(table.iter().any(|m| (m.major, m.minor) == number)))
    })
    .await?;
    let Some(mounted_elsewhere) = mounted_elsewhere else {
        return Ok(false);
    };

    // Preening writes to the device: not for a read-only volume, and not
    // under a live mount elsewhere (e2fsck would refuse anyway).
    if fs == FsType::Ext4 && !read_only && !mounted_elsewhere {
        preen_ext4(device, deadline).await?;
    }

    let (dev, tgt) = (device.to_path_buf(), target.to_path_buf());
    // The names of the CO's options only, for explaining a refusal: the
    // kernel knows the ones we add.
    let names = options.data_names();
    let flags = options.flags;
    let data = options.data_string_for(fs);
    let result = command::run_blocking("mount", &what, deadline, move || {
        Ok(nix::mount::mount(
            Some(dev.as_path()),
            tgt.as_path(),
            Some(fs.as_str()),
            flags,
            data.as_deref(),
        ))
    })
    .await?;
    match result {
        Ok(()) => Ok(true),
        Err(Errno::EINVAL) => Err(explain_einval(device, target, fs, &names, deadline).await),
        // Preening trusts a filesystem marked clean; the kernel found otherwise.
        Err(Errno::EUCLEAN) => Err(NodeError::FailedPrecondition(format!(
            "the {fs} filesystem on {} is corrupted (the kernel refused it: {}); it is not \
             mounted. Repair it by hand ({})",
            device.display(),
            Errno::EUCLEAN.desc(),
            match fs {
                FsType::Ext4 => "e2fsck -f",
                FsType::Xfs => "xfs_repair",
            }
        ))),
        Err(errno) => Err(NodeError::errno(what, errno)),
    }
}

/// EINVAL from mount(2) means a bad option, a device without that
/// filesystem, or a damaged one; blkid tells the second apart, and a mount
/// without data options rules out the first.
async fn explain_einval(
    device: &Path,
    target: &Path,
    fs: FsType,
    names: &[String],
    deadline: Instant,
) -> NodeError {
    match format::probe(device, deadline).await {
        Ok(Probe::Filesystem(found)) if found == fs.as_str() && !names.is_empty() => {
            NodeError::InvalidArgument(format!(
                "the kernel refused to mount {} ({fs}) with the given mount flags: one of \
                 the options {} is unknown to {fs} or has a bad value (values not shown)",
                device.display(),
                names.join(", ")
            ))
        }
        Ok(Probe::Filesystem(found)) if found == fs.as_str() => {
            NodeError::FailedPrecondition(format!(
                "the kernel refused to mount the {fs} filesystem on {} at {}: it may be \
                 damaged (the kernel log says why)",
                device.display(),
                target.display()
            ))
        }
        Ok(found) => NodeError::FailedPrecondition(format!(
            "{} carries {found}, so it cannot be mounted as {fs}",
            device.display()
        )),
        Err(err) => NodeError::failed(
            format!("mount {} at {}", device.display(), target.display()),
            format!("invalid argument (EINVAL); probing the device to say why failed too: {err}"),
        ),
    }
}

/// What e2fsck's exit code (a bit mask, e2fsck(8)) means for mounting.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Preen {
    /// 0: clean.
    Clean,
    /// 1 or 2 (with 3 their union): errors were fixed. "Reboot" (2) is for a
    /// mounted root filesystem, not a volume that is not mounted.
    Repaired,
    /// 4: errors left; preening stops at anything it may not fix alone.
    ErrorsLeft,
    /// 8 and up: e2fsck itself failed (operational, usage, cancelled, library).
    Failed,
}

pub(super) fn preen_verdict(code: i32) -> Preen {
    match code {
        0 => Preen::Clean,
        1..=3 => Preen::Repaired,
        c if c > 0 && c & 4 != 0 => Preen::ErrorsLeft,
        _ => Preen::Failed,
    }
}

/// `e2fsck -p DEVICE`: repairs what is safe to repair unattended.
async fn preen_ext4(device: &Path, deadline: Instant) -> Result<(), NodeError> {
    let output =
        command::run_unchecked("e2fsck", &[OsStr::new("-p"), device.as_os_str()], deadline).await?;
    // run_unchecked makes a death by signal an error: there is a code.
    let code = output.status.code().unwrap_or(-1);
    let said = command::tool_output(&output);
    match preen_verdict(code) {
        Preen::Clean => Ok(()),
        Preen::Repaired => {
            tracing::warn!(
                device = %device.display(),
                code,
                output = %said,
                "e2fsck repaired the filesystem"
            );
            Ok(())
        }
        Preen::ErrorsLeft => Err(NodeError::FailedPrecondition(format!(
            "the ext4 filesystem on {} has errors that e2fsck -p may not repair unattended \
             (exit status {code}); it is not mounted. Repair it by hand (e2fsck -f {}): {said}",
            device.display(),
            device.display()
        ))),
        Preen::Failed => Err(NodeError::failed(
            format!("e2fsck -p {}", device.display()),
            format!("exit status {code}: {said}"),
        )),
    }
}
