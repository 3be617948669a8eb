//! The registry of [`Exposure`]s, one per emulation and placement, and the
//! choice among them for one attach.
//!
//! Adding an emulation: its file (an [`Exposure`]) and its line in
//! [`Exposures::new`].

use tokio::time::Instant;

use super::attach::{AttachRequest, Placement};
use super::emulation::Emulation;
use super::error::DpuError;
use super::exposure::{Exposure, Read};
use super::{nvme, packed, virtio, virtiofs};

/// Every exposure, in the order in which a volume found exposed several
/// ways continues: where its first stage placed it (a dedicated subsystem
/// before a namespace in a pool).
#[derive(Debug)]
pub(crate) struct Exposures(Vec<Box<dyn Exposure>>);

impl Exposures {
    pub fn new() -> Self {
        Exposures(vec![
            Box::new(nvme::Dedicated),
            Box::new(packed::Packed::default()),
            Box::new(virtio::VirtioBlk),
            Box::new(virtiofs::VirtioFs),
        ])
    }

    pub fn all(&self) -> impl Iterator<Item = &dyn Exposure> {
        self.0.iter().map(|e| &**e)
    }

    /// The exposures an attach of `request` reads and the one it asks for;
    /// InvalidArgument for a placement its emulation does not have.
    pub fn for_attach(&self, request: &AttachRequest) -> Result<Choice<'_>, DpuError> {
        // A volume stays where its first stage placed it, also when the
        // node's default placement has changed since: every placement of
        // the emulation is a candidate.
        let family: Vec<&dyn Exposure> = self
            .all()
            .filter(|e| e.emulation() == request.emulation)
            .collect();
        let packed = matches!(request.placement, Placement::Packed { .. });
        let requested = family.iter().position(|e| e.packed() == packed);
        let requested = requested.ok_or_else(|| {
            DpuError::InvalidArgument(format!(
                "a {} function carries one disk: the packed placement is {} only",
                request.emulation.label(),
                Emulation::listed(Emulation::packing(), Emulation::label)
            ))
        })?;
        Ok(Choice { family, requested })
    }
}

/// The exposures of one attach.
#[derive(Debug)]
pub(crate) struct Choice<'a> {
    /// Every placement of the requested emulation, in [`Exposures`] order.
    pub family: Vec<&'a dyn Exposure>,
    /// Which of them the request asks for.
    pub requested: usize,
}

impl Choice<'_> {
    /// What an attach reads first: only what placing needs, unless the
    /// caller attached the volume before (then SNAP most likely has it all).
    pub fn read(&self, request: &AttachRequest, began: Instant) -> Read {
        match request.attached_before || self.family[self.requested].reads_first() {
            true => Read::ToPlace(began),
            false => Read::Skip,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_emulation_has_a_dedicated_exposure_and_a_packed_one_when_it_packs() {
        let exposures = Exposures::new();
        let request = |emulation, placement| AttachRequest {
            volume_id: "pvc-1".into(),
            access_modes: Vec::new(),
            volume_mode: crate::dpu::attach::VolumeMode::Block,
            publish_context: Default::default(),
            volume_context: Default::default(),
            storage_parameters: Default::default(),
            emulation,
            placement,
            attached_before: false,
            secrets: Default::default(),
        };
        let packed = Placement::Packed {
            namespaces_per_controller: 4,
        };
        for emulation in Emulation::ALL {
            let dedicated = exposures
                .for_attach(&request(emulation, Placement::Dedicated))
                .unwrap();
            assert!(!dedicated.family[dedicated.requested].packed());
            match exposures.for_attach(&request(emulation, packed)) {
                Ok(choice) => {
                    assert!(emulation.packs(), "{emulation:?} packs");
                    assert!(choice.family[choice.requested].packed());
                }
                Err(e) => {
                    assert!(!emulation.packs(), "{emulation:?}: {e}");
                    assert!(matches!(e, DpuError::InvalidArgument(_)), "{e:?}");
                }
            }
        }
        // One exposure per emulation and placement, or the later never runs.
        for (i, a) in exposures.all().enumerate() {
            for b in exposures.all().skip(i + 1) {
                assert!(
                    (a.emulation(), a.packed()) != (b.emulation(), b.packed()),
                    "{a:?} and {b:?}"
                );
            }
        }
    }
}
