//! The host side: finding the block device that an emulated PCI function
//! carries. [`HostLocator`] says where a volume is and finds it; [`Sysfs`]
//! reads the kernel's tree (or the emulator's).

mod locator;
mod sysfs;

pub use locator::HostLocator;
pub use sysfs::{BlockDevice, HostError, Sysfs, normalize_bdf};
