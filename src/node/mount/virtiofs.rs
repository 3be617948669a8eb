//! A virtio-fs device's filesystem mounted at its staging path by its tag:
//! `mount(tag, staging, "virtiofs")`, the kernel's virtio-fs client. No
//! device node, no filesystem to make or preen: the DPU serves the tree.
//!
//! On the emulator (`--virtiofs-emulated-dir`), a device is the
//! emulator's socket `<dir>/<tag>`: the stage mounts FUSE at the staging path
//! itself (`fuse.virtiofs`, source the tag: virtio-fs is FUSE over
//! virtqueues) and hands the connection to the emulated device, which serves
//! it (crate `fuse-handoff`). That is the whole seam; everything around it is
//! the code a BlueField host runs, and the staging path is the only mount of
//! the volume's filesystem, as on a real host.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::mount::MsFlags;
use tokio::time::Instant;

use super::options::MountOptions;
use super::target::{already_mounted, ensure_directory};
use crate::host::Sysfs;
use crate::node::command;
use crate::node::error::NodeError;
use crate::node::mountinfo::{self, MountEntry};

/// The kernel's virtio-fs filesystem type.
pub const VIRTIOFS: &str = "virtiofs";
/// What mountinfo shows for the emulated host's FUSE mount of a tag.
const EMULATED_VIRTIOFS: &str = "fuse.virtiofs";

/// Whether `entry` is a mount of the virtio-fs device with `tag`.
pub fn is_tag_mount(entry: &MountEntry, tag: &str) -> bool {
    entry.source == tag && [VIRTIOFS, EMULATED_VIRTIOFS].contains(&entry.fs_type.as_str())
}

/// Whether the filesystem mounted at `path` lost its device: a FUSE
/// connection (the kernel's virtio-fs client's, or the emulated host's)
/// answers ENOTCONN for good once its device is gone (hot-unplugged, or
/// SNAP restarted empty under it).
pub async fn lost_its_device(path: &Path, deadline: Instant) -> Result<bool, NodeError> {
    let what = format!("statfs {}", path.display());
    let path = path.to_path_buf();
    command::run_blocking("statfs", &what, deadline, move || {
        Ok(matches!(
            nix::sys::statfs::statfs(&path),
            Err(Errno::ENOTCONN)
        ))
    })
    .await
}

/// Mounts the virtio-fs device with `tag` at the directory `target`, with
/// the CSI `flags`, read-only when asked. A freshly hot-plugged device may
/// answer "tag not found" for seconds (DOCA's release notes): the mount is
/// tried again until `until`. `emulated` is the emulator's directory of
/// tag mounts, `None` on a real host.
///
/// `Ok(false)`: the tag was already mounted there with the same setting;
/// another mount there is `AlreadyExists` (a different tag: not this
/// volume's filesystem).
pub async fn mount_virtio_fs(
    tag: &str,
    target: &Path,
    (flags, read_only): (&[String], bool),
    (emulated, sysfs): (Option<&Path>, &Sysfs),
    until: Instant,
    deadline: Instant,
) -> Result<bool, NodeError> {
    let options = MountOptions::parse(flags, read_only)?;
    let read_only = options.flags.contains(MsFlags::MS_RDONLY);
    let what = format!("mount virtio-fs tag {tag} at {}", target.display());
    let (name, tgt) = (tag.to_string(), target.to_path_buf());
    let mounted = command::run_blocking("mount-prepare", &what, deadline, move || {
        let ours = |m: &MountEntry| Ok(is_tag_mount(m, &name));
        if already_mounted(&tgt, mountinfo::at(&tgt)?, read_only, ours)? {
            return Ok(true);
        }
        ensure_directory(&tgt)?;
        Ok(false)
    })
    .await?;
    if mounted {
        return Ok(false);
    }
    let source = match emulated {
        Some(dir) => Source::Emulated(dir.to_path_buf()),
        None => Source::Kernel,
    };
    let data = options.data_string();
    let mut delay = Duration::from_millis(5);
    loop {
        let (source, tgt, sent) = (source.clone(), target.to_path_buf(), data.clone());
        let (flags, name) = (options.flags, tag.to_string());
        let tried = command::run_blocking("mount", &what, deadline, move || {
            Ok(source.mount(&name, &tgt, flags, sent.as_deref(), deadline))
        })
        .await?;
        let errno = match tried {
            Ok(()) => return Ok(true),
            Err(errno) => errno,
        };
        let not_found = tag_not_found(errno, || sysfs.virtio_fs_tag_shown(tag).ok().flatten());
        if errno == Errno::ENODEV {
            // The kernel knows no filesystem type "virtiofs".
            return Err(NodeError::failed(
                what,
                "the host's kernel has no virtio-fs client (No such device): load the \
                 virtiofs module (modprobe virtiofs; Linux 5.4 or later)",
            ));
        }
        if !not_found {
            return Err(NodeError::errno(what, errno));
        }
        if Instant::now() + delay > until.min(deadline) {
            return Err(NodeError::Timeout {
                what: format!(
                    "{what}: the host does not find the tag ({}); the device was hot-plugged \
                     but the host's virtio-fs driver has not taken it yet{}",
                    errno.desc(),
                    if errno == Errno::EINVAL && data.is_some() {
                        ", or the kernel refuses the mount options"
                    } else {
                        ""
                    }
                ),
            });
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(200));
    }
}

/// Whether a failed mount means the host does not know the tag (yet).
/// Linux 6.12 answers an unknown tag with EINVAL ("tag <x> not found"), as
/// it does an option it refuses (older kernels: ENOENT). Where the kernel
/// lists its tags (6.9+, `tag_shown`) that tells the two apart; where it
/// cannot, the mount is tried again until the device wait ends.
fn tag_not_found(errno: Errno, tag_shown: impl FnOnce() -> Option<bool>) -> bool {
    match errno {
        Errno::ENOENT => true,
        Errno::EINVAL => tag_shown() != Some(true),
        _ => false,
    }
}

/// Where a tag's filesystem comes from.
#[derive(Debug, Clone)]
enum Source {
    /// The kernel's virtio-fs client finds the device by tag.
    Kernel,
    /// The emulator's directory of devices, a socket per tag.
    Emulated(PathBuf),
}

impl Source {
    fn mount(
        &self,
        tag: &str,
        target: &Path,
        flags: MsFlags,
        data: Option<&str>,
        deadline: Instant,
    ) -> Result<(), Errno> {
        match self {
            Source::Kernel => nix::mount::mount(Some(tag), target, Some(VIRTIOFS), flags, data),
            // FUSE knows none of virtio-fs's own options (dax, ...): the
            // emulated mount takes the flags only.
            Source::Emulated(devices) => {
                let left = deadline.saturating_duration_since(Instant::now());
                fuse_handoff::mount(devices, tag, target, flags, left)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_tag_is_waited_for_whatever_the_options() {
        // What Linux 6.12 answers (tests/guest_host.rs checks it on the
        // guest): EINVAL for a tag it does not know, options or not.
        assert!(tag_not_found(Errno::ENOENT, || None));
        assert!(tag_not_found(Errno::EINVAL, || Some(false)));
        assert!(
            tag_not_found(Errno::EINVAL, || None),
            "a kernel before 6.9 cannot tell"
        );
        assert!(
            !tag_not_found(Errno::EINVAL, || Some(true)),
            "the tag is there: the options are refused"
        );
        assert!(!tag_not_found(Errno::EACCES, || Some(false)));
    }
}
