//! Bind mounts: a staged filesystem or a block device node at a pod's
//! target (publish).

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::mount::{MntFlags, MsFlags};
use nix::sys::statvfs::FsFlags;

use super::target::{already_mounted, ensure_directory, ensure_file};
use crate::node::error::NodeError;
use crate::node::mountinfo::{self, MountEntry};

/// Bind-mounts `source` at `target`, read-only when asked. A directory
/// source (a staged filesystem) gets a directory target; anything else (a
/// block device node) gets a file target, the empty file created if missing.
///
/// `Ok(false)`: `source` is already bound there with the same read-only
/// setting. Another mount at `target`, or the same one with the other
/// setting, is `AlreadyExists`.
///
/// Read-only on a device node only marks the mount: the kernel checks a
/// mount's read-only flag for files and directories, not for writes through
/// device nodes. [`crate::node::device::set_block_device_read_only`] makes the device refuse them.
///
/// Runs on the caller's thread: a bind only links objects the kernel holds
/// already (a mounted filesystem's root, a device node) and reads or writes
/// no volume, so unlike mount and umount it cannot hang on a sick device,
/// and the trip to the blocking pool and back would cost more than the work.
pub fn bind_mount(source: &Path, target: &Path, read_only: bool) -> Result<bool, NodeError> {
    let (src, tgt) = (source, target);
    crate::metrics::host_work("bind-mount", || {
        let source_meta = fs::metadata(src)
            .map_err(|err| NodeError::io(format!("bind mount source {}", src.display()), &err))?;
        let ours = |_: &MountEntry| {
            // A bind mount shows the very inode of its source.
            let meta = fs::metadata(tgt)
                .map_err(|err| NodeError::io(format!("stat {}", tgt.display()), &err))?;
            Ok((meta.dev(), meta.ino()) == (source_meta.dev(), source_meta.ino()))
        };
        // A read-write bind of this very source where read-only is asked is
        // this publish's own, cut short between the bind and its remount (the
        // kernel takes two calls): finish it. Making a mount read-only never
        // grants access, so this cannot widen what a pod holds.
        let existing = mountinfo::at(tgt)?;
        if read_only
            && let Some(mount) = &existing
            && !mount.is_read_only()
            && ours(mount)?
        {
            remount_read_only(tgt)?;
            return Ok(true);
        }
        if already_mounted(tgt, existing, read_only, ours)? {
            return Ok(false);
        }
        if source_meta.is_dir() {
            ensure_directory(tgt)?;
        } else {
            ensure_file(tgt)?;
        }
        crate::failpoint::step("publish:target");
        nix::mount::mount(Some(src), tgt, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(
            |errno| {
                NodeError::errno(
                    format!("bind {} at {}", src.display(), tgt.display()),
                    errno,
                )
            },
        )?;
        crate::failpoint::step("publish:bind");
        if read_only && let Err(err) = remount_read_only(tgt) {
            // A writable bind where read-only was asked must not stay.
            let _ = nix::mount::umount2(tgt, MntFlags::UMOUNT_NOFOLLOW);
            return Err(err);
        }
        Ok(true)
    })
}

/// The kernel ignores MS_RDONLY when creating a bind mount; it takes a
/// remount. A bind remount sets the mount's flags to exactly those given, so
/// nosuid/nodev/noexec inherited from the source are passed again (the
/// kernel keeps the atime setting when no atime flag is given).
fn remount_read_only(target: &Path) -> Result<(), NodeError> {
    let what = || format!("remount {} read-only", target.display());
    let current =
        nix::sys::statvfs::statvfs(target).map_err(|errno| NodeError::errno(what(), errno))?;
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY;
    for (kept, flag) in [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
    ] {
        if current.flags().contains(kept) {
            flags |= flag;
        }
    }
    nix::mount::mount(None::<&str>, target, None::<&str>, flags, None::<&str>)
        .map_err(|errno| NodeError::errno(what(), errno))
}
