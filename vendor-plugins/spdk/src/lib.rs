//! The sample SPDK vendor plugin: `nvidia.storage.plugins.v1` (Identity and
//! StoragePluginService) on a UNIX socket, turning volumes into SPDK bdevs
//! inside SNAP through SNAP's JSON-RPC socket. Two backends, chosen per
//! volume by its `volume_context` ([`backend`]):
//!
//! - `backend=aio`, `path=<file or block device>`: `bdev_aio_create`.
//! - `backend=nvmf`, `trtype`, `traddr`, `trsvcid`, `adrfam`, `subnqn`
//!   (optional `hostnqn`): `bdev_nvme_attach_controller` to a remote target;
//!   with `extra_paths`, once per path, one multipath bdev over them all.
//!
//! It keeps no state: a device's name is derived from its volume id and
//! maps back to it ([`names`]), so SPDK's own bdev list is the only record,
//! and every call is idempotent across plugin restarts. It works unchanged
//! against real SPDK v24.09 and against `snap-emu`.
//!
//! With `--csi-socket`, the same binary also serves the CSI controller for
//! these backends ([`csi`]: Identity, Controller, GroupController, VolumeGroup), which makes
//! the volumes whose contexts the plugin service reads.
//!
//! Layout: [`service`] (the RPCs), [`nvmf_device`] (an NVMe-oF volume's
//! CreateDevice: one path, or a multipath device), [`backend`] (the volume context),
//! [`names`] (device names), [`paging`] (list tokens), [`qos`] (QoS
//! limits: parameters, records, SPDK's request), [`follow`] (attached AIO
//! volumes grown and their QoS changes applied live), [`paths`] (a remote
//! volume's paths: how each is attached, multipath devices' paths kept
//! attached), [`metrics`] (the `/metrics` page, with every path's state),
//! [`errors`] (every
//! failure → its gRPC code, the service's and the controller's, with the
//! reasons), [`config`] (settings
//! and the binary's flags), [`csi`] (the CSI controller).

pub mod backend;
pub mod config;
pub mod csi;
pub mod errors;
pub mod follow;
pub mod metrics;
pub mod names;
pub mod nvmf_device;
pub mod paging;
pub mod paths;
pub mod qos;
pub mod service;

use std::future::Future;
use std::path::PathBuf;

use snap_csi::jsonrpc::RpcClient;
use snap_csi::proto::csi::v1::controller_server::ControllerServer;
use snap_csi::proto::csi::v1::group_controller_server::GroupControllerServer;
use snap_csi::proto::csi::v1::identity_server::IdentityServer;
use snap_csi::proto::nvidia::storage::plugins::v1::identity_service_server::IdentityServiceServer;
use snap_csi::proto::nvidia::storage::plugins::v1::storage_plugin_service_server::StoragePluginServiceServer;
use snap_csi::proto::volumegroup::controller_server::ControllerServer as VolumeGroupServer;
use snap_csi::server::ServeError;
use tokio::net::UnixListener;

pub use config::Config;
pub use service::SpdkPlugin;

/// A plugin whose socket exists and accepts connections, not yet serving.
#[derive(Debug)]
pub struct Listening {
    plugin: Endpoint,
    /// The CSI controller's, when configured.
    csi: Option<Endpoint>,
    metrics_address: Option<std::net::SocketAddr>,
}

/// One bound socket and what it will serve.
#[derive(Debug)]
struct Endpoint {
    router: snap_csi::server::MeteredRouter,
    listener: UnixListener,
    socket: PathBuf,
    /// The CSI controller, which resumes what a crash left paused once it
    /// serves, and then keeps the target's exports (`csi::reexport`).
    recover: Option<csi::CsiController>,
    /// The plugin service, which follows attached AIO volumes and keeps
    /// multipath devices' paths while it serves.
    follow: Option<SpdkPlugin>,
    /// Where the plugin's `/metrics` reads its devices' paths.
    paths: Option<metrics::PathSource>,
}

impl Endpoint {
    async fn serve(
        self,
        metrics: Option<tokio::net::TcpListener>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ServeError> {
        let keep = self.recover.map(|controller| {
            tokio::spawn(async move {
                controller.recover_at_start().await;
                controller.keep_exports().await;
            })
        });
        let follow = self.follow.map(|plugin| {
            tokio::spawn(async move {
                tokio::join!(plugin.follow_aio_volumes(), plugin.keep_paths());
            })
        });
        // They end with the serving, also when it is cancelled (dropped).
        let _background = Background([keep, follow].into_iter().flatten().collect());
        let shutdown = futures::FutureExt::shared(shutdown);
        // The plugin's page has its paths: served here, not by the server.
        let (metrics, paths) = match (metrics, self.paths) {
            (Some(listener), Some(source)) => (None, Some((listener, source))),
            (metrics, _) => (metrics, None),
        };
        let page = async {
            match paths {
                Some((listener, source)) => {
                    metrics::serve(listener, source, shutdown.clone()).await
                }
                None => Ok(()),
            }
        };
        let (served, page) = tokio::join!(
            snap_csi::server::serve(
                self.router,
                self.listener,
                &self.socket,
                metrics,
                shutdown.clone()
            ),
            page
        );
        let page = page.map_err(|source| ServeError::Metrics { source });
        served.and(page)
    }
}

/// Background tasks of a serving endpoint, aborted when it ends.
struct Background(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Background {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Binds the plugin's socket (mode 0600; a stale socket is replaced, any
/// other file refused). SPDK is not contacted: the plugin starts, and Probe
/// says "not ready", while SNAP is still down.
pub fn bind(config: &Config) -> Result<Listening, ServeError> {
    let listener = snap_csi::server::bind(&config.plugin_socket)?;
    let spdk = RpcClient::with_timeout(&config.spdk_socket, config.service.call_timeout);
    let plugin = SpdkPlugin::new(spdk.clone(), config.service.clone());
    let paths = metrics::PathSource {
        spdk,
        kept: plugin.kept_paths(),
    };
    let router = snap_csi::server::builder()
        .add_service(IdentityServiceServer::new(plugin.clone()))
        .add_service(StoragePluginServiceServer::new(plugin.clone()));
    tracing::info!(
        socket = %config.plugin_socket.display(),
        spdk = %config.spdk_socket.display(),
        provider = %config.service.snap_provider,
        "SPDK vendor plugin listening"
    );
    let csi = config.csi.as_ref().map(bind_csi).transpose()?;
    Ok(Listening {
        plugin: Endpoint {
            router,
            listener,
            socket: config.plugin_socket.clone(),
            recover: None,
            follow: Some(plugin),
            paths: Some(paths),
        },
        csi,
        metrics_address: config.metrics_address,
    })
}

/// Binds the CSI controller's socket; no backend is contacted.
fn bind_csi(config: &csi::CsiConfig) -> Result<Endpoint, ServeError> {
    let controller = csi::CsiController::new(config).map_err(|source| ServeError::Listen {
        path: config.state_dir.clone(),
        source,
    })?;
    let listener = snap_csi::server::bind(&config.socket)?;
    let router = snap_csi::server::builder()
        .add_service(IdentityServer::new(controller.clone()))
        .add_service(ControllerServer::new(controller.clone()))
        .add_service(GroupControllerServer::new(controller.clone()))
        .add_service(VolumeGroupServer::new(controller.clone()));
    tracing::info!(
        socket = %config.socket.display(),
        aio_pool = ?config.aio.as_ref().map(|a| &a.pool_dir),
        nvmf_target = ?config.nvmf.as_ref().map(|n| &n.target_socket),
        default_backend = config.default_backend.as_str(),
        dpu_plugins = ?config.dpu_plugins.iter().map(|p| &p.name).collect::<Vec<_>>(),
        "CSI controller listening"
    );
    if config.dpu_plugins.is_empty() {
        tracing::info!(
            "no --dpu-plugin: DeleteVolume does not check whether a DPU still serves the volume \
             (a volume staged on a host is deleted)"
        );
    }
    Ok(Endpoint {
        router,
        listener,
        socket: config.socket.clone(),
        recover: Some(controller),
        follow: None,
        paths: None,
    })
}

impl Listening {
    /// Serves until `shutdown` completes and the calls in flight have
    /// finished, then removes the socket.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> Result<(), ServeError> {
        let metrics = snap_csi::metrics::bind(self.metrics_address)
            .await
            .map_err(|source| ServeError::Metrics { source })?;
        let shutdown = futures::FutureExt::shared(shutdown);
        match self.csi {
            Some(csi) => {
                let (plugin, csi) = tokio::join!(
                    self.plugin.serve(metrics, shutdown.clone()),
                    csi.serve(None, shutdown)
                );
                plugin.and(csi)
            }
            None => self.plugin.serve(metrics, shutdown).await,
        }
    }
}

/// [`bind`] and [`Listening::serve`].
pub async fn run(config: &Config, shutdown: impl Future<Output = ()>) -> Result<(), ServeError> {
    bind(config)?.serve(shutdown).await
}
