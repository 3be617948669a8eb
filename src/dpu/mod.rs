//! The DPU attach layer: turns a volume into a block device the host can see.
//!
//! [`colocated::Colocated`] is the one implementation of the DPU steps: the
//! vendor plugin (`nvidia.storage.plugins.v1`) makes an SPDK bdev inside
//! SNAP (CreateDevice), then SNAP's JSON-RPC exposes that bdev on a free
//! emulated function as an NVMe namespace or a virtio-blk disk. It runs
//! where SNAP's sockets are: in the node process (co-located mode), or in the
//! DPU agent on the BlueField (split mode, [`crate::agent`]), which the node
//! reaches through [`remote::RemoteDpu`] over mutual TLS. The node only ever
//! sees the [`DpuAttach`] trait.
//!
//! Every submodule:
//! - [`plugin`]: the vendor plugin client, CSI → plugin access modes, and the
//!   SNAP provider → socket mapping.
//! - [`colocated`]: [`DpuAttach`] over the plugin and SNAP: it chooses how a
//!   volume is exposed and does the plugin's steps around that.
//! - `exposure`: the seam between the two, the `Exposure` trait and the
//!   registry of its implementations, one per emulation and placement:
//!   `nvme` (dedicated NVMe: a subsystem and a function per volume),
//!   `packed` (packed NVMe: a namespace on a pool controller shared with
//!   other volumes), `virtio` (virtio-blk) and `virtiofs` (virtio-fs: the
//!   plugin's fsdev on a hot-plugged function, mounted by tag).
//! - `emulation`: [`Emulation`], each emulation described once.
//! - `endpoint` (one SNAP socket: its client, function pools and the
//!   listings concurrent calls share), `functions` (choosing a free emulated
//!   function, or a pool's namespace slot, under concurrency) and `inventory`
//!   (SNAP's listings joined into the [`Inventory`]).
//! - [`crypto`]: encryption on the DPU (SPDK's accel key and a crypto vbdev
//!   that whichever exposure serves).
//! - [`names`]: the SNAP names derived from a volume id.
//! - [`remote`]: [`DpuAttach`] as calls to the DPU agent; [`wire`]: the
//!   agent API's messages and statuses to and from these types, for both ends.
//!
//! Besides attaching, the layer reads SNAP's per-bdev I/O counters in one
//! call ([`DpuAttach::io_stats`]) for the node's per-volume metrics.

pub mod colocated;
pub mod crypto;
mod emulation;
mod endpoint;
mod exposure;
mod functions;
mod inventory;
pub mod names;
mod nvme;
mod packed;
pub mod plugin;
pub mod remote;
mod virtio;
mod virtiofs;
pub mod wire;

pub use emulation::Emulation;
pub use packed::DEFAULT_NAMESPACES_PER_CONTROLLER;
pub use plugin::plugin_access_mode;
// Shared with the gRPC clients; `colocated` reaches it as `super::retry`.
use crate::retry;

use std::collections::HashMap;

use tokio::time::Instant;

/// The I/O counters of every bdev ([`DpuAttach::io_stats`]).
pub use crate::spdk::bdev::{BdevIostat, Iostat as IoStats};

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

/// Where the host finds the attached volume (it lives with the host's
/// lookup, which it drives).
pub use crate::host::HostLocator;

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
    /// serial (virtio-blk), from [`names::VolumeNames`].
    pub key: String,
    pub emulation: Emulation,
    /// The bdevs SNAP serves for it.
    pub device_names: Vec<String>,
    /// Host PCI address of its function, once it has a controller.
    pub bdf: Option<String>,
}

/// Why an attach or detach failed, classified for the CSI status code.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DpuError {
    /// The vendor plugin or SNAP cannot be reached (or did not answer in time).
    #[error("{0}")]
    Unavailable(String),
    /// No free emulated function of the requested kind.
    #[error("{0}")]
    Exhausted(String),
    /// The vendor plugin rejected the request's arguments.
    #[error("{0}")]
    InvalidArgument(String),
    /// The request cannot be served in the current state (e.g. the plugin lacks a capability).
    #[error("{0}")]
    FailedPrecondition(String),
    /// Anything else; the message says what.
    #[error("{0}")]
    Internal(String),
}

impl DpuError {
    /// Classifies a status from a gRPC peer below us (the vendor plugin, or
    /// the DPU agent, which answers with [`Status::from`] of these): a peer
    /// that is unreachable, late or cancelled is Unavailable, as are statuses
    /// that say so; `message` says who answered what.
    pub(crate) fn from_code(code: tonic::Code, message: String) -> DpuError {
        use tonic::Code;
        match code {
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
                DpuError::Unavailable(message)
            }
            Code::InvalidArgument | Code::OutOfRange => DpuError::InvalidArgument(message),
            Code::FailedPrecondition | Code::Unimplemented => DpuError::FailedPrecondition(message),
            Code::ResourceExhausted => DpuError::Exhausted(message),
            _ => DpuError::Internal(message),
        }
    }
}

/// The CSI code of each failure: what the node answers kubelet, and what the
/// agent answers the node.
impl From<DpuError> for tonic::Status {
    fn from(error: DpuError) -> Self {
        match error {
            DpuError::Unavailable(m) => tonic::Status::unavailable(m),
            DpuError::Exhausted(m) => tonic::Status::resource_exhausted(m),
            DpuError::InvalidArgument(m) => tonic::Status::invalid_argument(m),
            DpuError::FailedPrecondition(m) => tonic::Status::failed_precondition(m),
            DpuError::Internal(m) => tonic::Status::internal(m),
        }
    }
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
