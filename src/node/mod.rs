//! The CSI node service and the host-side operations it is made of.
//!
//! - `service`: [`NodeService`] and what its calls share; the calls by
//!   family: `stage` (stage, unstage), `publish` (publish, unpublish, and a
//!   publish's restage after a reboot), `expand` (online, but for an
//!   encrypted volume, whose device grows only at its next stage),
//!   `volume_stats`;
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
pub mod dpus;
pub mod error;
mod expand;
pub mod fleet;
pub mod format;
pub mod grow;
pub mod health;
pub mod holders;
pub mod identity;
mod io_metrics;
pub mod mount;
pub mod mountinfo;
pub mod paths;
mod placement;
mod placing;
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
pub use fleet::Fleet;
pub use identity::IdentityService;
pub use service::NodeService;

use std::future::Future;
use std::sync::Arc;

use crate::proto::csi::v1::identity_server::IdentityServer;
use crate::proto::csi::v1::node_server::NodeServer;

/// A probe answers within this even if kubelet's livenessprobe sets no deadline.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Serves the Identity and Node services on `config.endpoint` with the given
/// DPUs until `shutdown` completes; calls in flight finish first.
pub async fn serve(
    config: NodeConfig,
    fleet: Fleet,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let fleet = Arc::new(fleet);
    fleet.watch();
    let node = NodeService::new(config.clone(), Arc::clone(&fleet))?;
    let records = node.reconcile();
    node.clear_left_over();
    let orphans = node.find_orphans(&records);
    if config.unstage_orphans {
        tokio::spawn(node.clone().unstage_orphans(orphans));
    }
    tokio::spawn(node.clone().compare_with_dpus(records));
    let _volume_io = crate::metrics::serve_volume_io(Arc::new(io_metrics::NodeVolumeIo::new(
        node.records().clone(),
        Arc::clone(&fleet),
    )));
    let identity = IdentityService::new(config.driver_name.clone(), fleet, PROBE_TIMEOUT);
    let listener = crate::server::bind(&config.endpoint)?;
    tracing::info!(endpoint = %config.endpoint.display(), node_id = %config.node_id, "node service listening");
    let router = crate::server::builder()
        .add_service(IdentityServer::new(identity))
        .add_service(NodeServer::new(node));
    let metrics = crate::metrics::bind(config.metrics_address).await?;
    crate::server::serve(router, listener, &config.endpoint, metrics, shutdown).await?;
    Ok(())
}

/// [`serve`] with the DPUs the configuration names ([`Fleet::from_config`]).
pub async fn run(config: NodeConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let fleet = Fleet::from_config(&config)?;
    serve(config, fleet, shutdown).await
}
