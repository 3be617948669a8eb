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
//! - `attach`: the seam itself ([`DpuAttach`]) and the types that cross it;
//!   `error`: [`DpuError`] and the gRPC code of each.
//! - [`plugin`]: the vendor plugin client, CSI → plugin access modes, and the
//!   SNAP provider → socket mapping.
//! - [`colocated`]: [`DpuAttach`] over the plugin and SNAP: it chooses how a
//!   volume is exposed and does the plugin's steps around that.
//! - `exposure`: the seam between the two, the `Exposure` trait; and
//!   `exposures`, the registry of its implementations, one per emulation and
//!   placement:
//!   `nvme` (dedicated NVMe: a subsystem and a function per volume),
//!   `packed` (packed NVMe: a namespace on a pool controller shared with
//!   other volumes), `virtio` (virtio-blk) and `virtiofs` (virtio-fs: the
//!   plugin's fsdev on a hot-plugged function, mounted by tag).
//! - `emulation`: [`Emulation`], each emulation described once.
//! - `endpoint` (one SNAP socket: its client, function pools and the
//!   listings concurrent calls share), `functions` (choosing a free emulated
//!   function, or a pool's namespace slot, under concurrency) and `inventory`
//!   (every exposure's census joined into the [`Inventory`]).
//! - [`crypto`]: encryption on the DPU (SPDK's accel key and a crypto vbdev
//!   that whichever exposure serves).
//! - [`names`]: the SNAP names derived from a volume id.
//! - [`remote`]: [`DpuAttach`] as calls to the DPU agent; [`wire`]: the
//!   agent API's messages and statuses to and from these types, for both ends.
//!
//! Besides attaching, the layer reads SNAP's per-bdev I/O counters in one
//! call ([`DpuAttach::io_stats`]) for the node's per-volume metrics.

mod attach;
pub mod colocated;
pub mod crypto;
mod emulation;
mod endpoint;
mod error;
mod exposure;
mod exposures;
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

pub use attach::{
    AttachRequest, Attachment, DpuAttach, ExposedVolume, FunctionUse, Inventory, Placement,
    PoolUse, VolumeMode,
};
pub use emulation::Emulation;
pub use error::DpuError;
pub use packed::DEFAULT_NAMESPACES_PER_CONTROLLER;
pub use plugin::plugin_access_mode;

/// Where the host finds the attached volume (it lives with the host's
/// lookup, which it drives).
pub use crate::host::HostLocator;
/// The I/O counters of every bdev ([`DpuAttach::io_stats`]).
pub use crate::spdk::bdev::{BdevIostat, Iostat as IoStats};
