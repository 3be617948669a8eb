//! The seam between the attach layer and the ways SNAP exposes a volume's
//! bdev to the host, after openebs/mayastor's node `dev.rs` (one trait, one
//! file per transport): an [`Exposure`] per emulation and placement, each in
//! a file of its own (`nvme`: dedicated NVMe, `packed`: packed NVMe,
//! `virtio`: virtio-blk, `virtiofs`: virtio-fs), registered in
//! `exposures`. [`super::colocated::Colocated`] only chooses among them and
//! does the vendor plugin's steps around the choice; the crypto layer
//! (`crypto`) makes the bdev whichever one exposes. The node's census
//! (`inventory`) is every exposure's [`Exposure::census`], joined.
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
//! Adding an emulation: a file implementing [`Exposure`], its line in
//! `Exposures::new`, its variant in [`Emulation`] and in
//! [`crate::host::HostLocator`] (and the agent API's `Emulation` and
//! `HostLocator`, `wire.rs`).

use std::sync::Arc;

use futures::future::{BoxFuture, Shared};
use tokio::time::Instant;

use super::attach::{ExposedVolume, FunctionUse, Placement, PoolUse};
use super::emulation::Emulation;
use super::endpoint::SnapEndpoint;
use super::error::DpuError;
use super::functions::FunctionListing;
use super::names::VolumeNames;
use crate::host::HostLocator;

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

    /// What SNAP holds this way, for the node's census (`inventory`): every
    /// volume it exposes under our names (also half-made ones), what its
    /// controllers on `emulation_function_list`'s functions carry, and its
    /// own functions and pools.
    async fn census(&self, survey: &Survey<'_>) -> Result<Census, DpuError>;
}

/// What every [`Exposure::census`] of one inventory reads from.
pub(crate) struct Survey<'a> {
    pub snap: &'a SnapEndpoint,
    /// `emulation_function_list`, asked for once for every census (where a
    /// function is, by its controller).
    pub functions: Shared<BoxFuture<'a, Result<Arc<FunctionListing>, DpuError>>>,
    /// When the inventory began: a listing that censuses share is one
    /// started no earlier (SNAP renders it once).
    pub began: Instant,
    pub deadline: Instant,
}

impl Survey<'_> {
    pub async fn functions(&self) -> Result<Arc<FunctionListing>, DpuError> {
        self.functions.clone().await
    }
}

/// One exposure's part of the [`super::Inventory`].
#[derive(Debug, Default)]
pub(crate) struct Census {
    /// Functions of the emulation's own, beyond `emulation_function_list`.
    pub functions: Vec<FunctionUse>,
    /// What its controllers on `emulation_function_list`'s functions carry.
    pub controllers: Vec<ControllerUse>,
    pub volumes: Vec<ExposedVolume>,
    pub pools: Vec<PoolUse>,
}

/// What one controller carries: one of our volumes, or a pool.
#[derive(Debug)]
pub(crate) struct ControllerUse {
    pub emulation: Emulation,
    pub controller: String,
    /// The [`ExposedVolume::key`] of the volume it serves.
    pub volume_key: Option<String>,
    /// The pool subsystem's NQN.
    pub pool: Option<String>,
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
