//! `snap-emu`: an SPDK v24.09 / SNAP-4 wire-compatible JSON-RPC server for
//! machines without a BlueField DPU (CI, laptops, the demo).
//!
//! It answers on a UNIX socket exactly as `spdk_tgt` (and SNAP, which is an
//! SPDK application) would for the methods the project uses, framing and
//! quirks included, and it makes everything real: bdevs are files or block
//! devices, NVMe-oF listeners listen on TCP, and a namespace or virtio-blk
//! disk exposed to the "host" becomes a loop device described under a
//! sysfs-shaped tree.
//!
//! Module layout:
//! - [`config`]: [`Config`] for in-process use and the binary's [`Cli`] flags.
//! - `server`: socket setup, per-connection tasks, SPDK's poller, shutdown.
//! - `framing`: the byte-exact JSON-RPC framing and reply encoding.
//! - `dispatch`: the method table, state checks and routing; `rpc`: errors
//!   and parameter decoding with SPDK's conventions.
//! - `state`: the shared emulator state and cross-module rules (hot remove).
//! - `bdev` (registry, aio, malloc, null, iostat), `lvol` (stores and
//!   volumes), `nvmf` (target), `nvmf_tcp` (the emulator-private fabrics
//!   handshake), `bdev_nvme` (initiator).
//! - `snap` (SNAP emulation logic), `snap_api` (every SNAP JSON name),
//!   `functions` (emulated PCI functions and their addresses).
//! - [`host`]: loop devices and the sysfs tree (the host's view).
//! - [`in_process`]: an emulator on its own thread inside a test of another crate.
//!
//! In a test: `let server = snap_emu::bind(Config::for_test(dir)).await?;`
//! then `tokio::spawn(server.serve(shutdown))`, or simply [`run`].

pub mod config;
pub mod host;
pub mod in_process;

mod bdev;
mod bdev_nvme;
mod dispatch;
mod framing;
mod functions;
mod lvol;
mod nvmf;
mod nvmf_tcp;
mod rpc;
mod server;
mod snap;
mod snap_api;
mod state;

pub use config::{Cli, Config, FunctionLayout};
pub use in_process::InProcess;
pub use rpc::RpcError;
pub use server::{Server, bind, run};
