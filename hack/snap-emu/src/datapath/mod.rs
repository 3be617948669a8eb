//! The emulator's data path: exposed bdevs whose bytes must pass through the
//! emulator (QoS limits to enforce, data to encrypt, an NVMe-oF target that
//! serves them) reach the host as a loop device over a file that the
//! emulator serves itself through FUSE, so that it sees every read and
//! write, rather than a loop device straight over the bdev's backing file.
//!
//! - `volume`: [`Volume`], what one exposed bdev's file serves, the bdev's
//!   byte range ([`Backing`]) and its [`BdevIo`] layers: the exposed bdev
//!   first, then each bdev under it. Every I/O waits for the QoS quota of
//!   each layer (`qos`, SPDK's timeslice token buckets) and is counted in each
//!   layer's [`IoStats`] (`stats`), which `bdev_get_iostat` reports, as SPDK
//!   counts an I/O at each bdev it passes. A crypto bdev's blocks pass its
//!   `cipher` (AES-XTS), an NVMe-oF namespace's go to its target (`remote`)
//!   over one of its controllers' paths (`paths`, which the initiator keeps
//!   connected), chosen by its multipath policy.
//! - `passthrough`: a directory tree served through FUSE as it is (an
//!   fsdev's tree, which the host mounts as a virtio-fs device).
//! - `fuse`: the FUSE mount (one per host side, `<host state>/datapath`),
//!   one file per exposure, and the crash clean-up of a dead mount.
//! - [`DataPathMode`]: which exposures go through it (`--data-path`; SNAP
//!   decides per exposure). A crypto bdev always does: only the data path
//!   applies its cipher, so the host reads plaintext while the backing holds
//!   ciphertext. By default so does an NVMe-oF namespace: only through the
//!   data path does its I/O reach the target, whose QoS limits, counters and
//!   pause then apply to it as SPDK's target's do.
//!
//! Files are opened with FOPEN_DIRECT_IO, so no page cache sits between the
//! loop device and the emulator, and every read reaches it; the loop device
//! runs in direct I/O mode and the mount takes asynchronous direct I/O and
//! parallel direct writes, so the host's queue of I/O reaches the emulator
//! as requests in flight together, as it reaches SPDK.

pub(crate) mod cipher;
pub(crate) mod fuse;
pub(crate) mod passthrough;
pub(crate) mod paths;
pub(crate) mod qos;
pub(crate) mod remote;
pub(crate) mod stats;
pub(crate) mod volume;

pub use qos::{Qos, RateLimit, TIMESLICE};
pub use stats::{IoKind, IoSnapshot, IoStats, OpSnapshot};
pub use volume::{Backing, BdevIo, Source, Volume};

/// Which exposed bdevs are served through the data path (`--data-path`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DataPathMode {
    /// Those that need it: rate limits to enforce, or an NVMe-oF target's
    /// bytes (the target's own limits apply, and its pause holds I/O); the
    /// rest direct.
    #[default]
    Auto,
    /// Every exposed bdev.
    Fuse,
    /// None but crypto bdevs: loop devices straight over the backing files;
    /// QoS limits are then not enforced.
    Direct,
}
