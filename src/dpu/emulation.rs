//! The emulations, each described once: how files, flags and volume
//! contexts name it, how messages name it, which kind of SNAP function it
//! runs on, and whether several volumes can share one of its functions.
//! Every `match` over [`Emulation`] that says something about an emulation
//! is here or at a boundary that must spell it (the agent API in `wire.rs`),
//! so the compiler lists them all when one is added.

use crate::spdk::snap::EmulationType;

/// How SNAP presents a volume to the host; `nvme`, `virtio-blk` or
/// `virtio-fs` in files, flags and volume contexts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(try_from = "String")]
pub enum Emulation {
    Nvme,
    VirtioBlk,
    /// A filesystem device: SNAP serves the plugin's fsdev to the host, which
    /// mounts it by tag (`docs/virtio-fs.md`).
    VirtioFs,
}

impl Emulation {
    /// Every emulation, in the order messages list them.
    pub const ALL: [Emulation; 3] = [Emulation::Nvme, Emulation::VirtioBlk, Emulation::VirtioFs];

    /// Its name in files, flags and volume contexts.
    pub fn name(self) -> &'static str {
        match self {
            Emulation::Nvme => "nvme",
            Emulation::VirtioBlk => "virtio-blk",
            Emulation::VirtioFs => "virtio-fs",
        }
    }

    /// How messages and logs name it.
    pub fn label(self) -> &'static str {
        match self {
            Emulation::Nvme => "NVMe",
            Emulation::VirtioBlk => "virtio-blk",
            Emulation::VirtioFs => "virtio-fs",
        }
    }

    /// The kind of emulated function SNAP lists it on in
    /// `emulation_function_list`; `None` for virtio-fs, whose functions are
    /// hot-plugged per volume and listed by its own service.
    pub fn function_kind(self) -> Option<EmulationType> {
        match self {
            Emulation::Nvme => Some(EmulationType::Nvme),
            Emulation::VirtioBlk => Some(EmulationType::VirtioBlk),
            Emulation::VirtioFs => None,
        }
    }

    /// Whether one function can carry several volumes (the packed
    /// placement): NVMe's namespaces. A virtio-blk function carries one
    /// disk, a virtio-fs function one tag.
    pub fn packs(self) -> bool {
        match self {
            Emulation::Nvme => true,
            Emulation::VirtioBlk | Emulation::VirtioFs => false,
        }
    }

    /// Whether the host gets a filesystem rather than a disk: the plugin
    /// makes a filesystem device, the host mounts it and formats nothing,
    /// and several hosts may mount it at once.
    pub fn serves_files(self) -> bool {
        match self {
            Emulation::Nvme | Emulation::VirtioBlk => false,
            Emulation::VirtioFs => true,
        }
    }

    /// The emulation [`Emulation::name`] names.
    pub fn parse(value: &str) -> Option<Emulation> {
        Emulation::ALL.into_iter().find(|e| e.name() == value)
    }

    /// The emulations that pack.
    pub fn packing() -> impl Iterator<Item = Emulation> {
        Emulation::ALL.into_iter().filter(|e| e.packs())
    }

    /// `what` of each of `emulations` as a message lists choices:
    /// `listed(Emulation::ALL, Emulation::name)` is "nvme, virtio-blk or virtio-fs".
    pub fn listed(
        emulations: impl IntoIterator<Item = Emulation>,
        what: fn(Emulation) -> &'static str,
    ) -> String {
        let items: Vec<&str> = emulations.into_iter().map(what).collect();
        match items.split_last() {
            Some((last, [])) => last.to_string(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        }
    }
}

/// The emulation running on functions of `kind`.
impl From<EmulationType> for Emulation {
    fn from(kind: EmulationType) -> Self {
        match kind {
            EmulationType::Nvme => Emulation::Nvme,
            EmulationType::VirtioBlk => Emulation::VirtioBlk,
        }
    }
}

impl TryFrom<String> for Emulation {
    type Error = String;

    fn try_from(value: String) -> Result<Self, String> {
        Emulation::parse(&value).ok_or_else(|| {
            let names = Emulation::listed(Emulation::ALL, Emulation::name);
            format!("emulation must be {names}, not {value:?}")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_emulation_is_named_once_and_parsed_back() {
        for emulation in Emulation::ALL {
            assert_eq!(Emulation::parse(emulation.name()), Some(emulation));
            if let Some(kind) = emulation.function_kind() {
                assert_eq!(Emulation::from(kind), emulation);
            }
            let json = serde_json::Value::String(emulation.name().into());
            assert_eq!(
                serde_json::from_value::<Emulation>(json).unwrap(),
                emulation
            );
        }
        assert_eq!(Emulation::parse("NVMe"), None);
        assert_eq!(
            Emulation::listed(Emulation::ALL, Emulation::name),
            "nvme, virtio-blk or virtio-fs"
        );
        assert_eq!(
            Emulation::listed(Emulation::packing(), Emulation::label),
            "NVMe"
        );
        let refused = serde_json::from_value::<Emulation>("scsi".into()).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("must be nvme, virtio-blk or virtio-fs"),
            "{refused}"
        );
    }
}
