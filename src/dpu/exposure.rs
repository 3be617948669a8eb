//! The seam between the attach layer and the ways SNAP exposes a volume's
//! bdev to the host, after openebs/mayastor's node `dev.rs` (one trait, one
//! file per transport): an [`Exposure`] per emulation and placement, each in
//! a file of its own (`nvme`: dedicated NVMe, `packed`: packed NVMe,
//! `virtio`: virtio-blk). [`super::colocated::Colocated`] only chooses from
//! [`Exposures`] and does the vendor plugin's steps around the choice; the
//! crypto layer (`crypto`) makes the bdev whichever one exposes.
//!
//! An exposure reads what SNAP holds of a volume its way ([`Exposure::find`]);
//! the result, a [`Found`], says whether the volume is exposed that way and
//! on which bdevs, and exposes or releases it from there. An attach and a
//! detach read every candidate at once, beside the plugin's calls, so the
//! round trips are the same whatever the number of exposures; exposures that
//! read the same listing share it (SNAP answers it once, `endpoint`). A
//! detach does not know how the volume was exposed: it asks every exposure
//! and releases what each holds.
//!
//! Adding an emulation: a file implementing [`Exposure`] (with its
//! [`Exposure::census`]), its line in [`Exposures::new`], its variant in
//! [`Emulation`] and in [`super::HostLocator`] (and the agent API's
//! `Emulation` and `HostLocator`, `wire.rs`).

use std::sync::Arc;

use tokio::time::Instant;

use super::endpoint::SnapEndpoint;
use super::functions::FunctionListing;
use super::names::VolumeNames;
use super::{
    AttachRequest, DpuError, Emulation, ExposedVolume, FunctionUse, HostLocator, Placement,
    PoolUse, nvme, packed, virtio, virtiofs,
};

/// How much of SNAP's state [`Exposure::find`] reads.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Read {
    /// Nothing: the volume is most likely new to SNAP, and the exposure
    /// asked for creates first (SNAP's answer says when there is state).
    Skip,
    /// What an attach places the volume from, from listings started no
    /// earlier than this (so they show whatever an earlier call for the
    /// volume did).
    ToPlace(Instant),
    /// Only the volume's own part, from listings started no earlier than
    /// this: a listing holds every volume on the DPU, and a detach must not
    /// keep one while its calls wait on SNAP (64 concurrent detaches would
    /// pin tens of MiB).
    ToRelease(Instant),
}

impl Read {
    /// When the listings read must have started; `None`: read nothing.
    pub fn since(self) -> Option<Instant> {
        match self {
            Read::Skip => None,
            Read::ToPlace(since) | Read::ToRelease(since) => Some(since),
        }
    }
}

/// One way SNAP exposes a volume's bdev to the host: an emulation under a
/// placement.
#[async_trait::async_trait]
pub(crate) trait Exposure: Send + Sync + std::fmt::Debug {
    /// What the host sees.
    fn emulation(&self) -> Emulation;

    /// Whether it is the packed placement (several volumes on one function)
    /// rather than the dedicated one.
    fn packed(&self) -> bool {
        false
    }

    /// Whether placing a volume that is new to SNAP needs this exposure's
    /// state first; `false` where the first create's answer says when there
    /// is state to read.
    fn reads_first(&self) -> bool;

    /// What SNAP holds of the volume this way, as `read` asks.
    async fn find<'a>(
        &'a self,
        snap: &'a SnapEndpoint,
        names: &'a VolumeNames,
        read: Read,
        deadline: Instant,
    ) -> Result<Box<dyn Found + 'a>, DpuError>;

    /// What SNAP holds this way beyond the functions of
    /// `emulation_function_list` and what `inventory` joins from them: the
    /// emulation's own functions and every volume it exposes under our names
    /// (also half-made ones), for the node's census.
    async fn census(&self, _snap: &SnapEndpoint, _deadline: Instant) -> Result<Census, DpuError> {
        Ok(Census::default())
    }
}

/// One exposure's part of the [`super::Inventory`].
#[derive(Debug, Default)]
pub(crate) struct Census {
    pub functions: Vec<FunctionUse>,
    pub volumes: Vec<ExposedVolume>,
    pub pools: Vec<PoolUse>,
}

/// What SNAP holds of one volume one way, as [`Exposure::find`] read it.
#[async_trait::async_trait]
pub(crate) trait Found: Send + Sync {
    /// SNAP exposes the volume this way, or an earlier attempt began to.
    fn holds(&self) -> bool;

    /// The bdevs SNAP serves for the volume this way (normally at most one).
    fn bdevs(&self) -> Vec<&str>;

    /// Exposes `bdev`, continuing from what was found, and says where the
    /// host finds it. `functions` was read beside the plugin's CreateDevice.
    async fn expose(
        self: Box<Self>,
        placement: Placement,
        bdev: &str,
        functions: Arc<FunctionListing>,
        deadline: Instant,
    ) -> Result<HostLocator, DpuError>;

    /// Takes the volume away from SNAP, each step skipped when already
    /// done; afterwards SNAP no longer uses its bdevs.
    async fn release(&self, deadline: Instant) -> Result<(), DpuError>;

    /// What [`Found::release`] leaves that does not use the bdevs (a
    /// dedicated volume's empty subsystem): removed beside DeleteDevice.
    async fn remove_rest(&self, _deadline: Instant) -> Result<(), DpuError> {
        Ok(())
    }
}

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
            volume_mode: super::super::VolumeMode::Block,
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
