//! snap-csi: a Kubernetes CSI driver that bridges pods to BlueField DPU storage.
//!
//! A storage vendor's plugin turns a volume into an SPDK bdev inside SNAP;
//! SNAP exposes it to the host as an emulated NVMe or virtio-blk PCI function;
//! the node service finds the block device on the host, formats and mounts it.
//! See `ARCHITECTURE.md` at the repository root for the map and the rules.
//!
//! Layout:
//! - [`proto`]: generated CSI v1.12, `nvidia.storage.plugins.v1` and
//!   VolumeGroup types and gRPC stubs (secrets never print through `Debug`).
//! - [`jsonrpc`]: the JSON-RPC 2.0 client for SPDK/SNAP UNIX sockets: framing,
//!   deadlines, many calls in flight, reconnect, typed errors.
//! - [`spdk`]: typed params and results of every SPDK and SNAP-4 method we use.
//! - [`host`]: finding the block device an emulated function carries, through
//!   sysfs (root configurable, so the same code reads the emulator's tree).
//! - [`dpu`]: the DPU attach layer behind the [`dpu::DpuAttach`] trait: the
//!   vendor plugin client and one SNAP exposure per emulation and placement.
//! - [`agent`]: `snap-csi dpu-agent`, that layer served to one host over
//!   [`tls`] (mutual TLS whose settings follow their PEM files).
//! - [`node`]: the CSI Identity and Node services and the host-side operations
//!   (format, mount, mount table, stats) they are made of.
//! - [`controller`]: the controller proxy: CSI Identity, Controller,
//!   GroupController and VolumeGroup forwarded to the vendor's CSI controller.
//! - [`server`]: serving gRPC on a UNIX socket (0600, stale socket, shutdown);
//!   [`deadline`]: the deadline of an incoming call, for every call it makes;
//!   [`grpc`]: the one gRPC client core (addresses, connecting, a deadline
//!   on every call, retries inside it) every client of ours is built on.
//! - [`guard`]: one operation per volume, and a busy volume's code;
//!   [`csi_limits`]: CSI's size limits, checked before a request does
//!   anything; [`failpoint`]: the crash points and steps tests arm.
//! - [`metrics`]: the Prometheus registry, served-call and outbound timings.
//! - [`json_dir`]: small JSON records written atomically, one file per key
//!   (the node's volume records, the sample plugin's controller state).
//! - `retry` (backoff inside a deadline) and `settings` (config file and
//!   seconds, layered under flags): small pieces the services share.
//! - [`plugin_check`]: `snap-csi plugin-check`, a conformance check of a
//!   vendor plugin against the `nvidia.storage.plugins.v1` API text.

pub use settings::DRIVER_NAME;

pub mod agent;
pub mod controller;
pub mod csi_limits;
pub mod deadline;
pub mod dpu;
pub mod failpoint;
pub mod grpc;
pub mod guard;
pub mod host;
pub mod json_dir;
pub mod jsonrpc;
pub mod metrics;
pub mod node;
pub mod plugin_check;
pub mod proto;
pub(crate) mod retry;
pub mod server;
pub mod settings;
pub mod spdk;
pub mod tls;
