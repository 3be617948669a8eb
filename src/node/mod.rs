//! The CSI node service and the host-side operations it is made of.
//!
//! - `service`: [`NodeService`] and what its calls share; the calls by
//!   family: `stage` (stage, unstage), `publish` (publish, unpublish, and a
//!   publish's restage after a reboot), `expand`, `volume_stats`;
//!   `shared_fs`: their host half for a filesystem device (virtio-fs,
//!   mounted by tag); `identity`: the Identity RPCs.
//! - `request`: what a stage or publish asks for, checked.
//! - `config`: settings (defaults, config file, env, flags).
//! - `records`: the small per-volume record of what cannot be derived;
//!   `reconcile`: what an earlier run left, against the records and the DPU;
//!   `recovery`: the check that a staging mount sits on the volume's device.
//! - `context`: the volume and publish context keys the node reads;
//!   `capacity`: how many volumes NodeGetInfo says fit;
//!   `io_metrics`: the per-volume I/O series of the metrics page.
//! - `error`: the node's error and its CSI codes, in one place.
//! - host operations, split by concern: `command` (external tools with a
//!   deadline), `paths` (confining CO-supplied paths), `format` (probe and
//!   mkfs), `mount` (mounts, bind mounts, unmounts), `holders` (who keeps a
//!   mount busy), `mountinfo` (the mount table), `device` (a block device's
//!   number, size and read-only flag), `health` (a mounted filesystem's
//!   usage and whether it still works), `grow` (growing a filesystem).

mod capacity;
pub mod command;
pub mod config;
mod context;
pub mod device;
pub mod error;
mod expand;
pub mod format;
pub mod grow;
pub mod health;
pub mod holders;
pub mod identity;
mod io_metrics;
pub mod mount;
pub mod mountinfo;
pub mod paths;
mod publish;
mod reconcile;
pub mod records;
mod recovery;
mod request;
pub mod service;
mod shared_fs;
mod stage;
mod volume_stats;

pub use config::{NodeArgs, NodeConfig};
pub use identity::IdentityService;
pub use service::NodeService;

use std::future::Future;
use std::sync::Arc;

use crate::dpu::DpuAttach;
use crate::dpu::colocated::Colocated;
use crate::dpu::remote::RemoteDpu;
use crate::proto::csi::v1::identity_server::IdentityServer;
use crate::proto::csi::v1::node_server::NodeServer;

/// A probe answers within this even if kubelet's livenessprobe sets no deadline.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Serves the Identity and Node services on `config.endpoint` with the given
/// DPU attach layer until `shutdown` completes; calls in flight finish first.
pub async fn serve(
    config: NodeConfig,
    dpu: Arc<dyn DpuAttach>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let node = NodeService::new(config.clone(), Arc::clone(&dpu))?;
    let records = node.reconcile();
    let orphans = node.find_orphans(&records);
    if config.unstage_orphans {
        tokio::spawn(node.clone().unstage_orphans(orphans));
    }
    tokio::spawn(node.clone().compare_with_dpu(records));
    let _volume_io = crate::metrics::serve_volume_io(Arc::new(io_metrics::NodeVolumeIo::new(
        node.records().clone(),
        Arc::clone(&dpu),
    )));
    let identity = IdentityService::new(config.driver_name.clone(), dpu, PROBE_TIMEOUT);
    let listener = crate::server::bind(&config.endpoint)?;
    tracing::info!(endpoint = %config.endpoint.display(), node_id = %config.node_id, "node service listening");
    let router = crate::server::builder()
        .add_service(IdentityServer::new(identity))
        .add_service(NodeServer::new(node));
    let metrics = crate::metrics::bind(config.metrics_address).await?;
    crate::server::serve(router, listener, &config.endpoint, metrics, shutdown).await?;
    Ok(())
}

/// [`serve`] with the DPU attach layer the configuration names ([`dpu_layer`]).
pub async fn run(config: NodeConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let dpu = dpu_layer(&config)?;
    serve(config, dpu, shutdown).await
}

/// The DPU attach layer the configuration names: the DPU agent when
/// `dpu_endpoint` is set (split mode), else the co-located one over the
/// vendor plugin's and SNAP's sockets on this host. Must be called inside
/// the runtime that serves: the layer's connections run there.
pub fn dpu_layer(config: &NodeConfig) -> anyhow::Result<Arc<dyn DpuAttach>> {
    Ok(match config.dpu_link().map_err(anyhow::Error::msg)? {
        Some(address) => {
            tracing::info!(agent = %address, dpu = %config.dpu_name, "split mode: the DPU attach layer is the DPU agent");
            Arc::new(RemoteDpu::new(address, &config.dpu_name, &config.dpu_tls)?)
        }
        None => Arc::new(Colocated::new(
            config.plugin_socket.clone(),
            config.snap_socket_template.clone(),
        )),
    })
}
