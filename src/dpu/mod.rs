//! The DPU attach layer: turns a volume into a block device the host can see.
//!
//! In co-located mode ([`colocated::Colocated`]) this runs in the node process:
//! the vendor plugin (`nvidia.storage.plugins.v1`) makes an SPDK bdev inside
//! SNAP (CreateDevice), then SNAP's JSON-RPC exposes that bdev on a free
//! emulated function as an NVMe namespace or a virtio-blk disk. A later issue
//! moves this behind an authenticated link to an agent on the DPU; the node
//! only ever sees the [`DpuAttach`] trait.
//!
//! - [`plugin`]: the vendor plugin client, CSI → plugin access modes, and the
//!   SNAP provider → socket mapping.
//! - [`colocated`]: [`DpuAttach`] over the plugin and SNAP, with `nvme` and
//!   `virtio` (the SNAP steps of each emulation), `functions` (choosing a free
//!   emulated function under concurrency) and `endpoint` (one SNAP socket).
//! - [`names`]: the SNAP names derived from a volume id.

pub mod colocated;
mod endpoint;
mod functions;
pub mod names;
mod nvme;
pub mod plugin;
mod virtio;

pub use plugin::plugin_access_mode;
// Shared with the controller proxy; children reach it as `super::retry`.
use crate::retry;

use std::collections::HashMap;

use tokio::time::Instant;

/// How SNAP presents the volume to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emulation {
    Nvme,
    VirtioBlk,
}

/// Whether the volume is used as a raw block device or carries a filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeMode {
    Block,
    Filesystem,
}

/// Everything the DPU side needs to attach a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachRequest {
    pub volume_id: String,
    /// CSI access modes mapped to the plugin API's (RWO/ROX/RWX/RWOP).
    pub access_modes: Vec<crate::proto::nvidia::storage::plugins::v1::AccessMode>,
    pub volume_mode: VolumeMode,
    pub publish_context: HashMap<String, String>,
    pub volume_context: HashMap<String, String>,
    pub storage_parameters: HashMap<String, String>,
    pub emulation: Emulation,
    /// The caller attached this volume before (it is retrying a stage): SNAP
    /// most likely has everything, so the attach reads SNAP's state first.
    /// Otherwise it creates first and reads only what SNAP says exists. Only
    /// round trips depend on it: a wrong hint still converges.
    pub attached_before: bool,
}

/// Where the host finds the attached volume.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum HostLocator {
    Nvme {
        /// Host PCI address, without domain (`"26:00.1"`).
        bdf: String,
        nsid: u32,
        /// Namespace UUID when known (verifies a reused function).
        uuid: Option<String>,
    },
    VirtioBlk {
        bdf: String,
        serial: String,
    },
}

/// The result of an attach.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Attachment {
    /// The SPDK bdev the vendor plugin made (its CreateDevice `device_name`).
    pub device_name: String,
    pub locator: HostLocator,
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

    /// How many emulated functions exist in all (NodeGetInfo's max volumes).
    async fn function_count(&self, deadline: Instant) -> Result<u32, DpuError>;
}
