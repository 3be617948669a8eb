//! The PCI domain the host enumerates a DPU's emulated functions in.
//!
//! SNAP names a function by its BDF alone; the host puts it in the domain of
//! the DPU it sits behind, so a host with two DPUs has `0000:26:00.1` and
//! `0001:26:00.1`. Emulators sharing one sysfs root each own one domain.

use std::fmt;
use std::str::FromStr;

use anyhow::bail;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PciDomain(u16);

impl FromStr for PciDomain {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Self> {
        if !(1..=4).contains(&s.len()) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            bail!("invalid PCI domain {s:?}: expected 1 to 4 hex digits, like \"0001\"");
        }
        Ok(Self(u16::from_str_radix(s, 16)?))
    }
}

impl PciDomain {
    pub(super) fn number(self) -> u16 {
        self.0
    }
}

/// As the kernel names it in sysfs: four lowercase hex digits.
impl fmt::Display for PciDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}", self.0)
    }
}
