//! A small vendor plugin for tests: `nvidia.storage.plugins.v1` over real
//! gRPC on a UNIX socket, making SPDK AIO bdevs on the emulator. It stands in
//! until the sample plugin exists.
//!
//! CreateDevice makes bdev `aio-<volume id>` over the file named by the
//! volume context's `path`, or for a filesystem device (`volume_mode`
//! "Filesystem") fsdev `fs-<volume id>` over the directory it names
//! (`fsdev_aio_create`); DeleteDevice removes it; GetDevice and
//! ListDevices read `bdev_get_bdevs` and the fsdev subsystem's configuration
//! (ListDevices in pages, see [`page`]).
//! The default SNAP provider (empty name).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use snap_csi::jsonrpc::{RpcClient, RpcError};
use snap_csi::proto::nvidia::storage::plugins::v1 as api;
use snap_csi::spdk::bdev::{BdevAioCreate, BdevAioDelete, BdevGetBdevs};
use snap_csi::spdk::fsdev::{FrameworkGetConfig, FsdevAioCreate, FsdevAioDelete};
use tokio::net::UnixListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use api::identity_service_server::{IdentityService, IdentityServiceServer};
pub use api::storage_plugin_service_capability::rpc::Type as Capability;
use api::storage_plugin_service_server::{StoragePluginService, StoragePluginServiceServer};

/// Prefix of every bdev this plugin makes.
pub const DEVICE_PREFIX: &str = "aio-";
/// Prefix of every fsdev this plugin makes.
pub const FS_DEVICE_PREFIX: &str = "fs-";
/// The volume context key naming the backing file.
pub const PATH_KEY: &str = "path";
pub const PLUGIN_NAME: &str = "test-plugin.snap-csi.io";

/// A running test plugin; stops when dropped.
pub struct TestPlugin {
    pub socket: PathBuf,
    /// One line per device call received (`"CreateDevice vol-1"`,
    /// `"DeleteDevice vol-1 aio-vol-1"`, `"GetDevice vol-1 "`, `"ListDevices"`).
    pub calls: Arc<Mutex<Vec<String>>>,
    /// Holds CreateDevice and DeleteDevice while a test keeps it closed.
    pub gate: Gate,
    /// Holds every RPC unanswered while `true` (see [`TestPlugin::stall`]).
    stalled: Option<watch::Sender<bool>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

/// The bdev name for a volume: its id with anything SPDK might mind replaced.
pub fn device_name(volume_id: &str) -> String {
    format!("{DEVICE_PREFIX}{}", safe_name(volume_id))
}

/// The fsdev name for a filesystem device's volume.
pub fn fs_device_name(volume_id: &str) -> String {
    format!("{FS_DEVICE_PREFIX}{}", safe_name(volume_id))
}

/// The fsdevs SPDK holds, by name: `framework_get_config` of subsystem
/// `fsdev` is SPDK v24.09's only listing of them.
async fn fsdev_names(spdk: &RpcClient) -> Result<Vec<String>, Status> {
    let config = FrameworkGetConfig {
        name: "fsdev".into(),
    };
    let calls = spdk
        .call(&config)
        .await
        .map_err(|e| spdk_status("framework_get_config", e))?;
    Ok(calls
        .iter()
        .filter_map(|c| c.fsdev().map(|(name, _)| name.to_string()))
        .collect())
}

fn safe_name(volume_id: &str) -> String {
    volume_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// What the plugin can do unless a test says otherwise.
pub const CAPABILITIES: [Capability; 4] = [
    Capability::CreateDeleteBlockDevice,
    Capability::CreateDeleteFsDevice,
    Capability::GetDeviceStats,
    Capability::ListDevices,
];

/// Starts the plugin on `<dir>/plugin.sock`, talking to the emulator at
/// `emulator_socket`; it listens when this returns.
pub async fn start(emulator_socket: &Path, dir: &Path) -> TestPlugin {
    start_with(emulator_socket, dir, &CAPABILITIES).await
}

/// [`start`] with other capabilities (the RPCs answer all the same: a caller
/// that honours capabilities never sends the others).
pub async fn start_with(
    emulator_socket: &Path,
    dir: &Path,
    capabilities: &[Capability],
) -> TestPlugin {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let gate = Gate::default();
    let (stalled, stall) = watch::channel(false);
    let plugin = Plugin {
        spdk: RpcClient::with_timeout(emulator_socket, Duration::from_secs(30)),
        calls: Arc::clone(&calls),
        capabilities: capabilities.to_vec(),
        gate: gate.clone(),
        stall,
    };
    let mut running = serve(dir.join("plugin.sock"), plugin, calls);
    running.gate = gate;
    running.stalled = Some(stalled);
    running
}

/// Lets a test act while a device call is surely inside the plugin: closed,
/// it holds CreateDevice and DeleteDevice (after recording them) until it
/// opens again; open, it costs a lock that is never contended.
#[derive(Clone, Debug, Default)]
pub struct Gate {
    closed: Arc<tokio::sync::RwLock<()>>,
    entered: Arc<tokio::sync::Notify>,
}

impl Gate {
    /// Closes the gate until the returned guard is dropped.
    pub async fn close(&self) -> tokio::sync::OwnedRwLockWriteGuard<()> {
        Arc::clone(&self.closed).write_owned().await
    }

    /// Returns once a device call is held at the closed gate.
    pub async fn entered(&self) {
        self.entered.notified().await
    }

    /// Passes a device call: at once when open; when closed, says so and
    /// waits for it to open (only then, so no stale notice is left behind).
    async fn pass(&self) {
        if self.closed.try_read().is_ok() {
            return;
        }
        self.entered.notify_one();
        drop(self.closed.read().await);
    }
}

/// Serves `plugin` as both plugin services on `socket` (replacing a stale
/// one); it listens when this returns. `calls` is what the handle reports.
pub fn serve<P>(socket: PathBuf, plugin: P, calls: Arc<Mutex<Vec<String>>>) -> TestPlugin
where
    P: IdentityService + StoragePluginService + Clone,
{
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(IdentityServiceServer::new(plugin.clone()))
            .add_service(StoragePluginServiceServer::new(plugin))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = stopped.await;
            })
            .await;
        if let Err(e) = served {
            eprintln!("test plugin: {e}");
        }
    });
    TestPlugin {
        socket,
        calls,
        gate: Gate::default(),
        stalled: None,
        stop: Some(stop),
        task: Some(task),
    }
}

/// The StoragePluginGetCapabilities answer advertising `capabilities`.
pub fn capabilities_response(
    capabilities: &[Capability],
) -> api::StoragePluginGetCapabilitiesResponse {
    let capabilities = capabilities
        .iter()
        .map(|c| api::StoragePluginServiceCapability {
            r#type: Some(api::storage_plugin_service_capability::Type::Rpc(
                api::storage_plugin_service_capability::Rpc { r#type: *c as i32 },
            )),
        })
        .collect();
    api::StoragePluginGetCapabilitiesResponse { capabilities }
}

/// One ListDevices page of `entries` (sorted here, so pages follow one
/// order). The token is the index of the next entry; any other token was not
/// handed out and gets ABORTED, as the API requires. An index past the end
/// (devices deleted meanwhile) is an empty last page.
pub fn page(
    mut entries: Vec<api::list_devices_response::Entry>,
    request: &api::ListDevicesRequest,
) -> Result<api::ListDevicesResponse, Status> {
    entries.sort_by(|a, b| a.device_name.cmp(&b.device_name));
    let start = match request.starting_token.as_str() {
        "" => 0,
        token => token
            .parse::<usize>()
            .map_err(|_| Status::aborted(format!("starting_token {token:?} was not handed out")))?,
    };
    let max_entries = usize::try_from(request.max_entries)
        .map_err(|_| Status::invalid_argument("max_entries must not be negative"))?;
    let start = start.min(entries.len());
    let end = match max_entries {
        0 => entries.len(),
        n => start.saturating_add(n).min(entries.len()),
    };
    let next_token = if end < entries.len() {
        end.to_string()
    } else {
        String::new()
    };
    Ok(api::ListDevicesResponse {
        entries: entries.drain(start..end).collect(),
        next_token,
    })
}

impl TestPlugin {
    /// Stops serving and removes the socket; clients then get UNAVAILABLE.
    pub async fn stop(mut self) {
        self.signal_stop();
        if let Some(task) = self.task.take() {
            // Graceful shutdown waits for clients to close their connection.
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(2), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }

    /// While `on`, every RPC waits unanswered (a plugin stuck behind a slow
    /// backend: callers see their deadline pass); the waiting ones are
    /// answered once it is switched off.
    pub fn stall(&self, on: bool) {
        self.stalled
            .as_ref()
            .expect("only the test plugin stalls")
            .send_replace(on);
    }

    /// The device calls received so far.
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn signal_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for TestPlugin {
    fn drop(&mut self) {
        self.signal_stop();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

#[derive(Debug, Clone)]
struct Plugin {
    spdk: RpcClient,
    calls: Arc<Mutex<Vec<String>>>,
    capabilities: Vec<Capability>,
    gate: Gate,
    stall: watch::Receiver<bool>,
}

impl Plugin {
    fn record(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }

    /// Waits while the test stalls the plugin.
    async fn pass(&self) {
        let _ = self.stall.clone().wait_for(|stalled| !stalled).await;
    }
}

fn spdk_status(what: &str, e: RpcError) -> Status {
    let message = format!("{what}: {e}");
    if e.is_transient() {
        Status::unavailable(message)
    } else {
        Status::internal(message)
    }
}

#[tonic::async_trait]
impl IdentityService for Plugin {
    async fn get_plugin_info(
        &self,
        _: Request<api::GetPluginInfoRequest>,
    ) -> Result<Response<api::GetPluginInfoResponse>, Status> {
        self.pass().await;
        Ok(Response::new(api::GetPluginInfoResponse {
            name: PLUGIN_NAME.into(),
            vendor_version: "0.1.0".into(),
            manifest: Default::default(),
        }))
    }

    async fn probe(
        &self,
        _: Request<api::ProbeRequest>,
    ) -> Result<Response<api::ProbeResponse>, Status> {
        self.pass().await;
        Ok(Response::new(api::ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl StoragePluginService for Plugin {
    async fn storage_plugin_get_capabilities(
        &self,
        _: Request<api::StoragePluginGetCapabilitiesRequest>,
    ) -> Result<Response<api::StoragePluginGetCapabilitiesResponse>, Status> {
        self.pass().await;
        Ok(Response::new(capabilities_response(&self.capabilities)))
    }

    async fn get_snap_provider(
        &self,
        _: Request<api::GetSnapProviderRequest>,
    ) -> Result<Response<api::GetSnapProviderResponse>, Status> {
        self.pass().await;
        Ok(Response::new(api::GetSnapProviderResponse {
            provider_name: String::new(),
        }))
    }

    async fn create_device(
        &self,
        request: Request<api::CreateDeviceRequest>,
    ) -> Result<Response<api::CreateDeviceResponse>, Status> {
        self.pass().await;
        let request = request.into_inner();
        self.record(format!("CreateDevice {}", request.volume_id));
        self.gate.pass().await;
        if request.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        let Some(path) = request.volume_context.get(PATH_KEY) else {
            return Err(Status::invalid_argument(format!(
                "volume_context[{PATH_KEY:?}] is required"
            )));
        };
        match request.volume_mode.as_str() {
            "Block" => {}
            "Filesystem" => {
                let name = fs_device_name(&request.volume_id);
                let create = FsdevAioCreate {
                    name: name.clone(),
                    root_path: path.clone(),
                };
                match self.spdk.call(&create).await {
                    Ok(_) => {}
                    // SPDK answers a name in use with -32603 "File exists".
                    Err(e) if e.is_exists() || e.to_string().contains("File exists") => {}
                    Err(e) => return Err(spdk_status("fsdev_aio_create", e)),
                }
                return Ok(Response::new(api::CreateDeviceResponse {
                    device_name: name,
                }));
            }
            other => {
                return Err(Status::invalid_argument(format!("volume_mode {other:?}")));
            }
        }
        let name = device_name(&request.volume_id);
        let create = BdevAioCreate {
            name: name.clone(),
            filename: path.clone(),
            // SPDK detects no block size in a regular file: it must be given.
            block_size: Some(512),
            readonly: None,
        };
        match self.spdk.call(&create).await {
            Ok(_) => {}
            // Made by an earlier call: CreateDevice is idempotent.
            Err(e) if e.is_exists() => {}
            Err(e) => return Err(spdk_status("bdev_aio_create", e)),
        }
        Ok(Response::new(api::CreateDeviceResponse {
            device_name: name,
        }))
    }

    async fn delete_device(
        &self,
        request: Request<api::DeleteDeviceRequest>,
    ) -> Result<Response<api::DeleteDeviceResponse>, Status> {
        self.pass().await;
        let request = request.into_inner();
        self.record(format!(
            "DeleteDevice {} {}",
            request.volume_id, request.device_name
        ));
        self.gate.pass().await;
        let names = match request.device_name.is_empty() {
            true => vec![
                device_name(&request.volume_id),
                fs_device_name(&request.volume_id),
            ],
            false => vec![request.device_name],
        };
        for name in names {
            let deleted = match name.starts_with(FS_DEVICE_PREFIX) {
                true => self.spdk.call(&FsdevAioDelete { name }).await.map(drop),
                false => self.spdk.call(&BdevAioDelete { name }).await.map(drop),
            };
            match deleted {
                Ok(_) => {}
                Err(e) if e.is_no_such_device() => {}
                Err(e) => return Err(spdk_status("deleting the device", e)),
            }
        }
        Ok(Response::new(api::DeleteDeviceResponse {}))
    }

    async fn get_device(
        &self,
        request: Request<api::GetDeviceRequest>,
    ) -> Result<Response<api::GetDeviceResponse>, Status> {
        self.pass().await;
        let request = request.into_inner();
        self.record(format!(
            "GetDevice {} {}",
            request.volume_id, request.device_name
        ));
        let name = if request.device_name.is_empty() {
            device_name(&request.volume_id)
        } else {
            request.device_name
        };
        if name.starts_with(FS_DEVICE_PREFIX) {
            return match fsdev_names(&self.spdk).await?.contains(&name) {
                true => Ok(Response::new(api::GetDeviceResponse {
                    volume_mode: "Filesystem".into(),
                    ..Default::default()
                })),
                false => Err(Status::not_found(format!("no device {name}"))),
            };
        }
        let query = BdevGetBdevs {
            name: Some(name.clone()),
            timeout: None,
        };
        match self.spdk.call(&query).await {
            Ok(_) => Ok(Response::new(api::GetDeviceResponse {
                volume_mode: "Block".into(),
                ..Default::default()
            })),
            Err(e) if e.is_no_such_device() => Err(Status::not_found(format!("no device {name}"))),
            Err(e) => Err(spdk_status("bdev_get_bdevs", e)),
        }
    }

    async fn list_devices(
        &self,
        request: Request<api::ListDevicesRequest>,
    ) -> Result<Response<api::ListDevicesResponse>, Status> {
        self.pass().await;
        self.record("ListDevices".to_string());
        let bdevs = self
            .spdk
            .call(&BdevGetBdevs::default())
            .await
            .map_err(|e| spdk_status("bdev_get_bdevs", e))?;
        let fsdevs = fsdev_names(&self.spdk).await?;
        let entries = bdevs
            .into_iter()
            .map(|b| (DEVICE_PREFIX, b.name))
            .chain(fsdevs.into_iter().map(|name| (FS_DEVICE_PREFIX, name)))
            .filter_map(|(prefix, name)| {
                let volume_id = name.strip_prefix(prefix)?.to_string();
                Some(api::list_devices_response::Entry {
                    volume_id,
                    device_name: name,
                })
            })
            .collect();
        page(entries, request.get_ref()).map(Response::new)
    }
}
