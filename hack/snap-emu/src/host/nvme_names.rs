//! How the host's kernel names an NVMe namespace's disk, as Linux 6.12 does
//! (seen in the guest host, `tests/guest_host.rs`):
//!
//! ```text
//! native multipath (nvme_core.multipath=Y, the default where it is built in):
//!   <root>/bus/pci/devices/<domain>:<bdf>/nvme/nvme<C>/nvme<S>c<C>n<N>/{nsid,uuid,size}
//!   <root>/block/nvme<S>n<N>/{nsid,uuid,size,dev}
//! without (nvme_core.multipath=N):
//!   <root>/bus/pci/devices/<domain>:<bdf>/nvme/nvme<C>/nvme<C>n<N>/{nsid,uuid,size,dev}
//! ```
//!
//! With native multipath a controller of a subsystem that allows several
//! (SNAP's do) lists its namespace as a path, a hidden disk without a device
//! node; the disk is the subsystem's head, under `block`. `S` is the
//! subsystem's instance: the instance of the controller that first brought it,
//! here its one controller's (`S = C`). `N` counts per subsystem from 1 and
//! need not be the NSID.
//!
//! Controller instances are machine-wide on a host, and heads share `block`:
//! emulators on one root (a host with two DPUs) each name theirs from their
//! domain's base, `domain << 16` (domain 0000 names `nvme0` as a host would).

use super::domain::PciDomain;

/// Which of the kernel's two namings the host uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NvmeNaming {
    #[default]
    NativeMultipath,
    /// One disk per controller (`nvme_core.multipath=N`).
    PerController,
}

/// Controller instances per domain.
const DOMAIN_SHIFT: u32 = 16;

/// Where the multipath heads are, under the root.
pub(super) const HEADS_DIR: &str = "block";

/// The names of one emulator's NVMe disks.
#[derive(Debug, Clone, Copy)]
pub(super) struct NvmeNames {
    pub(super) domain: PciDomain,
    pub(super) naming: NvmeNaming,
}

impl NvmeNames {
    /// The host's instance of the emulator's controller instance `ctrl`.
    fn instance(self, ctrl: u32) -> u32 {
        (u32::from(self.domain.number()) << DOMAIN_SHIFT) | ctrl
    }

    /// The emulator's controller instance of the host's `instance`, if ours.
    fn ctrl(self, instance: u32) -> Option<u32> {
        (instance >> DOMAIN_SHIFT == u32::from(self.domain.number()))
            .then_some(instance & ((1 << DOMAIN_SHIFT) - 1))
    }

    /// `nvme<C>`, and the namespace's directory under it.
    pub(super) fn dirs(self, ctrl: u32, ns: u32) -> [String; 2] {
        let c = self.instance(ctrl);
        let namespace = match self.naming {
            NvmeNaming::NativeMultipath => format!("nvme{c}c{c}n{ns}"),
            NvmeNaming::PerController => format!("nvme{c}n{ns}"),
        };
        [format!("nvme{c}"), namespace]
    }

    /// `(ctrl, ns)` of the directories [`dirs`](Self::dirs) names, spelt
    /// exactly so.
    pub(super) fn parse(self, controller: &str, namespace: &str) -> Option<(u32, u32)> {
        let instance = number(controller.strip_prefix("nvme")?)?;
        let ctrl = self.ctrl(instance)?;
        let ns = number(namespace.rsplit_once('n')?.1)?;
        (self.dirs(ctrl, ns) == [controller, namespace]).then_some((ctrl, ns))
    }

    /// The multipath head's name (`nvme<S>n<N>`), if the naming has heads.
    pub(super) fn head(self, ctrl: u32, ns: u32) -> Option<String> {
        (self.naming == NvmeNaming::NativeMultipath)
            .then(|| format!("nvme{}n{ns}", self.instance(ctrl)))
    }

    /// Whether `name` under [`HEADS_DIR`] is a head of ours, whichever
    /// naming made it (a restart may change it).
    pub(super) fn is_our_head(self, name: &str) -> bool {
        let Some((s, n)) = name.strip_prefix("nvme").and_then(|r| r.split_once('n')) else {
            return false;
        };
        number(n).is_some() && number(s).and_then(|s| self.ctrl(s)).is_some()
    }
}

/// A decimal number spelt without sign or leading zeros.
pub(super) fn number(s: &str) -> Option<u32> {
    let canonical = s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    canonical.then(|| s.parse().ok())?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(domain: &str, naming: NvmeNaming) -> NvmeNames {
        NvmeNames {
            domain: domain.parse().unwrap(),
            naming,
        }
    }

    #[test]
    fn domain_0000_names_as_a_host_and_another_domain_names_apart() {
        let host = names("0", NvmeNaming::NativeMultipath);
        assert_eq!(host.dirs(1, 2), ["nvme1", "nvme1c1n2"]);
        assert_eq!(host.head(1, 2).as_deref(), Some("nvme1n2"));
        let second = names("1", NvmeNaming::NativeMultipath);
        assert_eq!(second.dirs(0, 1), ["nvme65536", "nvme65536c65536n1"]);
        assert_eq!(second.head(0, 1).as_deref(), Some("nvme65536n1"));
        assert!(second.is_our_head("nvme65536n1") && !second.is_our_head("nvme0n1"));
        assert!(host.is_our_head("nvme0n1") && !host.is_our_head("nvme65536n1"));
        let off = names("0", NvmeNaming::PerController);
        assert_eq!(off.dirs(3, 2), ["nvme3", "nvme3n2"]);
        assert_eq!(off.head(3, 2), None);
    }

    #[test]
    fn parses_only_its_own_spelling() {
        let on = names("1", NvmeNaming::NativeMultipath);
        let off = names("1", NvmeNaming::PerController);
        assert_eq!(on.parse("nvme65539", "nvme65539c65539n12"), Some((3, 12)));
        assert_eq!(off.parse("nvme65539", "nvme65539n12"), Some((3, 12)));
        for (c, n) in [
            ("nvme65539", "nvme65539n12"),
            ("nvme3", "nvme3c3n1"),
            ("nvme65539", "nvme65538c65539n1"),
            ("nvme065539", "nvme065539c065539n1"),
            ("nvme65539", "nvme65539c65539n01"),
            ("nvme65539", "nvme65539c65539n+1"),
        ] {
            assert_eq!(on.parse(c, n), None, "{c}/{n}");
        }
        assert_eq!(off.parse("nvme65539", "nvme65539c65539n1"), None);
    }
}
