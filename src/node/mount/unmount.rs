//! Unmounting every layer at a path, and naming who holds a busy one.

use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;
use nix::mount::MntFlags;
use tokio::time::Instant;

use crate::node::error::NodeError;
use crate::node::{command, device, holders, mountinfo};

/// Unmounts whatever is mounted at `target`, every layer if mounts are
/// stacked there (a retried mount that completed after its deadline leaves
/// two). `Ok(false)`: nothing was mounted, including when `target` does not
/// exist. Removes nothing: the target directory or file is the caller's.
///
/// A mount still in use (EBUSY, after a few short retries) is a
/// `FailedPrecondition` naming the processes /proc shows holding it, and it
/// stays mounted: no lazy unmount (MNT_DETACH) of a live filesystem. A lazy
/// unmount would report success while the filesystem lives on under its
/// holders, and the unstage after it would take the device away from under
/// a live filesystem: lost writes and a dirty filesystem on a volume kubelet
/// believes cleanly unmounted. Refusing keeps every step after the unmount
/// (device, SNAP, record) in place, so the retry after the holder left
/// converges.
///
/// The exception: a filesystem whose device the kernel removed (SNAP went
/// away and the host lost the function, or it was unplugged). Every I/O to
/// it fails at once (a removed disk's requests end with an error; ext4
/// aborts its journal, xfs shuts down), so a normal unmount does not hang on
/// it, but a holder keeps it busy, and waiting for the holder saves nothing:
/// no write can reach that device again. It is detached lazily, and the
/// stage that needs its mount point goes on. A loop device the emulator let
/// go while mounted is not removed (the kernel keeps it until its last
/// user closes it, and writes still reach its file): it stays refused.
pub async fn unmount(target: &Path, deadline: Instant) -> Result<bool, NodeError> {
    /// Far more layers than any retry pattern makes; a bound so that a
    /// mount that keeps coming back cannot loop us forever.
    const MAX_LAYERS: usize = 64;
    let what = format!("unmount {}", target.display());
    let tgt = target.to_path_buf();
    let failed = {
        let what = what.clone();
        move |message: String| NodeError::failed(what.clone(), message)
    };
    command::run_blocking("umount", &what, deadline, move || {
        let mut unmounted = false;
        // A busy mount is often busy for an instant only: a probe (blkid,
        // udev) holding the device, or a child between fork and exec with an
        // inherited descriptor. Look again a few times before saying so.
        let mut busy_pauses = [5, 10, 20, 40, 80, 160]
            .into_iter()
            .map(Duration::from_millis);
        for _ in 0..MAX_LAYERS {
            if !mountinfo::is_mount_point(&tgt)? {
                return Ok(unmounted);
            }
            // NOFOLLOW: a link planted at the target must not redirect us.
            match nix::mount::umount2(tgt.as_path(), MntFlags::UMOUNT_NOFOLLOW) {
                Ok(()) => unmounted = true,
                // Someone else unmounted it between our look and our call.
                Err(Errno::EINVAL | Errno::ENOENT) => return Ok(unmounted),
                Err(Errno::EBUSY) => match busy_pauses.next() {
                    Some(pause) if Instant::now() + pause < deadline => {
                        crate::failpoint::step_on("unmount:busy", &tgt);
                        std::thread::sleep(pause);
                    }
                    _ if on_removed_device(&tgt)? => {
                        tracing::warn!(target = %tgt.display(), "busy, on a device the kernel removed: detaching it lazily");
                        let flags = MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW;
                        nix::mount::umount2(tgt.as_path(), flags)
                            .map_err(|errno| failed(errno.desc().into()))?;
                        unmounted = true;
                    }
                    _ => return Err(busy(&tgt)),
                },
                Err(errno) => return Err(failed(errno.desc().into())),
            }
        }
        Err(failed(format!("still mounted after {MAX_LAYERS} unmounts")))
    })
    .await
}

/// Whether the filesystem mounted at `target` is on a block device the
/// kernel no longer has.
fn on_removed_device(target: &Path) -> Result<bool, NodeError> {
    Ok(mountinfo::at(target)?.is_some_and(|m| device::removed(m.major, m.minor)))
}

/// The error for a mount that stays busy, naming what holds it.
fn busy(target: &Path) -> NodeError {
    let found = holders::find(target);
    let holders = if found.is_empty() {
        "no process this node can see holds it (one in another PID namespace may)".to_string()
    } else {
        holders::describe(&found)
    };
    NodeError::FailedPrecondition(format!(
        "{} is busy: {holders}. It stays mounted; retry once they are gone",
        target.display()
    ))
}
