//! The host side: finding the block device that an emulated PCI function
//! carries.

mod sysfs;

pub use sysfs::{BlockDevice, HostError, Sysfs, normalize_bdf};
