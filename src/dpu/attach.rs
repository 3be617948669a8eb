//! The attach layer's seam, [`DpuAttach`], and what crosses it: a request to
//! attach, where the host finds the result, and what SNAP holds.

use std::collections::HashMap;

use tokio::time::Instant;

use super::emulation::Emulation;
use super::error::DpuError;
use crate::host::HostLocator;
use crate::spdk::bdev::Iostat as IoStats;

/// Whether the volume is used as a raw block device or carries a filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeMode {
    Block,
    Filesystem,
}

/// How an NVMe volume is placed on SNAP's emulated functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Its own subsystem and controller on a function of its own (hot-plugged
    /// into the host per volume): the strongest isolation.
    Dedicated,
    /// One namespace on a pool controller that already runs on the host,
    /// shared with other packed volumes; a pool carries at most this many.
    Packed { namespaces_per_controller: u32 },
}

/// Everything the DPU side needs to attach a volume.
#[derive(Clone, PartialEq, Eq)]
pub struct AttachRequest {
    pub volume_id: String,
    /// CSI access modes mapped to the plugin API's (RWO/ROX/RWX/RWOP).
    pub access_modes: Vec<crate::proto::nvidia::storage::plugins::v1::AccessMode>,
    pub volume_mode: VolumeMode,
    pub publish_context: HashMap<String, String>,
    pub volume_context: HashMap<String, String>,
    pub storage_parameters: HashMap<String, String>,
    pub emulation: Emulation,
    /// Packed only for an emulation that [`Emulation::packs`]; the others are
    /// always dedicated.
    pub placement: Placement,
    /// The caller attached this volume before (it is retrying a stage): SNAP
    /// most likely has everything, so the attach reads SNAP's state first.
    /// Otherwise it creates first and reads only what SNAP says exists. Only
    /// round trips depend on it: a wrong hint still converges.
    pub attached_before: bool,
    /// NodeStageVolume's secrets, for the DPU side only (never logged; the
    /// `Debug` below prints how many there are).
    pub secrets: HashMap<String, String>,
}

impl std::fmt::Debug for AttachRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachRequest")
            .field("volume_id", &self.volume_id)
            .field("access_modes", &self.access_modes)
            .field("volume_mode", &self.volume_mode)
            .field("publish_context", &self.publish_context)
            .field("volume_context", &self.volume_context)
            .field("storage_parameters", &self.storage_parameters)
            .field("emulation", &self.emulation)
            .field("placement", &self.placement)
            .field("attached_before", &self.attached_before)
            .field("secrets", &crate::proto::Redacted(self.secrets.len()))
            .finish()
    }
}

/// The result of an attach.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Attachment {
    /// The SPDK bdev the vendor plugin made (its CreateDevice `device_name`).
    pub device_name: String,
    pub locator: HostLocator,
}

/// What SNAP on the DPU holds: every emulated function with its use, every
/// volume exposed under our names (also half-made ones), and the pools that
/// carry packed volumes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    pub functions: Vec<FunctionUse>,
    pub volumes: Vec<ExposedVolume>,
    pub pools: Vec<PoolUse>,
}

/// A pool subsystem of packed volumes, as SNAP lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolUse {
    /// `nqn.2022-10.io.snap-csi:pool-<k>`.
    pub nqn: String,
    /// Namespaces it carries now.
    pub namespaces: u32,
    /// Namespaces SNAP lets it carry (the lower of its `nn` and `mnan`).
    pub capacity: u32,
    /// Host PCI address of its controller's function, once it has one.
    pub bdf: Option<String>,
}

/// One emulated PF or VF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionUse {
    pub emulation: Emulation,
    /// Host PCI address, without domain.
    pub bdf: String,
    /// The controller on it; `None` when free.
    pub controller: Option<String>,
    /// The [`ExposedVolume::key`] of the controller's volume, when it is ours.
    pub volume_key: Option<String>,
    /// The pool subsystem's NQN, when the controller is a pool's (in use by
    /// packed volumes, or kept warm for the next ones).
    pub pool: Option<String>,
}

/// A volume SNAP exposes under the names derived from its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExposedVolume {
    /// Subsystem NQN (dedicated NVMe), namespace UUID (packed NVMe) or
    /// serial (virtio-blk), from [`super::names::VolumeNames`].
    pub key: String,
    pub emulation: Emulation,
    /// The bdevs SNAP serves for it.
    pub device_names: Vec<String>,
    /// Host PCI address of its function, once it has a controller.
    pub bdf: Option<String>,
}

/// The seam between the node service and whatever attaches volumes on the DPU.
#[async_trait::async_trait]
pub trait DpuAttach: Send + Sync + std::fmt::Debug {
    /// Attaches the volume; idempotent: a retry (also after a crash at any
    /// step) converges on the same attachment without creating a second anything.
    async fn attach(
        &self,
        request: &AttachRequest,
        deadline: Instant,
    ) -> Result<Attachment, DpuError>;

    /// Undoes [`DpuAttach::attach`] in reverse; every step tolerates its object
    /// being gone. `device_name` is the plugin's device when the caller knows it.
    async fn detach(
        &self,
        volume_id: &str,
        device_name: Option<&str>,
        deadline: Instant,
    ) -> Result<(), DpuError>;

    /// Ready when the vendor plugin's Probe says ready and SNAP answers.
    async fn probe(&self, deadline: Instant) -> Result<bool, DpuError>;

    /// Every emulated function with its use and every volume SNAP exposes
    /// under our names (NodeGetInfo's limit, the node's reconciliation).
    async fn inventory(&self, deadline: Instant) -> Result<Inventory, DpuError>;

    /// The I/O counters of every bdev SNAP holds, as SPDK's
    /// `bdev_get_iostat` gives them, from one call whatever their number:
    /// the node's per-volume metrics. Not retried: the next scrape asks again.
    async fn io_stats(&self, deadline: Instant) -> Result<IoStats, DpuError>;
}
