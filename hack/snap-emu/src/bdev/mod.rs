//! SPDK's bdev layer and the families of bdev methods.
//!
//! - `registry`: the bdevs every family sees, and the part of
//!   `bdev_get_bdevs` common to all of them.
//! - `info` (`bdev_get_bdevs`, `bdev_wait_for_examine`), `iostat`
//!   (`bdev_get_iostat`), `qos` (`bdev_set_qos_limit`).
//! - The modules that make bdevs: `modules` (aio, malloc, null), `crypto`
//!   (the accel keyring and the crypto vbdev), `lvol` (stores and volumes:
//!   their methods; `lvol_store`, what a store holds; `lvol_disk`, what it
//!   keeps on disk to be found again), `nvme` (the NVMe-oF initiator).

pub(crate) mod crypto;
pub(crate) mod info;
pub(crate) mod iostat;
pub(crate) mod lvol;
pub(crate) mod lvol_disk;
pub(crate) mod lvol_store;
pub(crate) mod modules;
pub(crate) mod nvme;
pub(crate) mod qos;
pub(crate) mod registry;
