//! Mounting a volume's filesystem (staging), bind mounts (publishing), and
//! unmounting, through mount(2)/umount2(2) rather than mount(8): no helper
//! programs, no fstab, no shell parsing of options.
//!
//! Each operation first looks at the mount table: the same thing already
//! mounted at the target is success (a retry after a crash or a timeout),
//! something else there is `AlreadyExists`. Mount and unmount run on the
//! blocking pool under the caller's deadline (they may wait on the device);
//! one that outlives the deadline still completes, and the retry then finds
//! its result. A bind mount touches no device and runs in place.
//!
//! - `filesystem`: a volume's filesystem at its staging path, preened first;
//!   `options`: the CO's mount flags as mount(2) arguments;
//! - `virtiofs`: a virtio-fs device's tree at its staging path, by tag;
//! - `bind`: bind mounts of a staged filesystem or a device node (publish);
//! - `unmount`: every layer at a path, and who holds a busy one;
//! - `target`: what each of them finds or makes at its target.

mod bind;
mod filesystem;
mod options;
mod target;
#[cfg(test)]
mod tests;
mod unmount;
mod virtiofs;

pub use bind::bind_mount;
pub use filesystem::mount_filesystem;
pub use unmount::unmount;
pub use virtiofs::{VIRTIOFS, is_tag_mount, lost_its_device, mount_virtio_fs};
