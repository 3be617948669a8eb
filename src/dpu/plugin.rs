//! The vendor plugin client (`nvidia.storage.plugins.v1` over a UNIX socket).
//!
//! One lazily connected tonic channel serves both services; tonic reconnects
//! it after the plugin restarts. Every call carries the caller's deadline,
//! and a call the plugin did not answer, or answered UNAVAILABLE or
//! DEADLINE_EXCEEDED, is retried with backoff inside it ([`crate::grpc`]):
//! the API makes every RPC idempotent and explicitly allows retries.
//!
//! What the plugin says about itself (GetPluginInfo, its capabilities, its
//! SNAP provider) is asked once and kept for the life of the client; Probe is
//! asked every time, because readiness is exactly what may change.
//!
//! Request contexts may carry sensitive values: nothing here logs a request.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::attach::AttachRequest;
use super::error::DpuError;
use crate::grpc::{self, Failed};
use crate::proto::csi::v1::volume_capability::access_mode::Mode;
use crate::proto::nvidia::storage::plugins::v1 as api;
use api::identity_service_client::IdentityServiceClient;
use api::storage_plugin_service_capability::rpc::Type as Capability;
use api::storage_plugin_service_client::StoragePluginServiceClient;

pub use api::AccessMode;

/// The provider an empty GetSNAPProvider answer means (NVIDIA's own SNAP).
pub const DEFAULT_SNAP_PROVIDER: &str = "nvidia";

/// Where DPF puts a SNAP provider's socket; `{provider}` is replaced.
pub const DEFAULT_SNAP_SOCKET_TEMPLATE: &str =
    "/var/lib/nvidia/storage/snap/providers/{provider}/snap.sock";

/// The placeholder in a SNAP socket template.
pub const PROVIDER_PLACEHOLDER: &str = "{provider}";

/// `volume_mode` of a CreateDevice that must yield an SPDK bdev. DPF sends
/// Kubernetes' spelling, "Block" or "Filesystem", and a DPF plugin answers
/// "Filesystem" with an fsdev for virtio-fs. NVMe and virtio-blk expose a
/// bdev and the host makes the filesystem, so for them every volume, also a
/// filesystem volume, is a "Block" device to the plugin.
pub const VOLUME_MODE_BLOCK: &str = "Block";
/// `volume_mode` of a CreateDevice that must yield an SPDK fsdev (virtio-fs).
pub const VOLUME_MODE_FILESYSTEM: &str = "Filesystem";

/// ListDevices page size we ask for; the plugin may answer fewer.
pub const LIST_PAGE: i32 = 256;

/// The plugin API's access mode for a CSI access mode.
///
/// The plugin API has Kubernetes' four modes, so this is the inverse of how
/// Kubernetes turns its modes into CSI ones (RWO → SINGLE_NODE_WRITER or
/// SINGLE_NODE_MULTI_WRITER, RWOP → SINGLE_NODE_SINGLE_WRITER, ROX →
/// MULTI_NODE_READER_ONLY, RWX → MULTI_NODE_MULTI_WRITER). The two CSI modes
/// Kubernetes never produces go to the mode with the same write permission,
/// because that is what a plugin can act on (e.g. open its backend read-only):
/// SINGLE_NODE_READER_ONLY → ROX, MULTI_NODE_SINGLE_WRITER → RWX.
pub fn plugin_access_mode(mode: Mode) -> AccessMode {
    match mode {
        Mode::SingleNodeWriter | Mode::SingleNodeMultiWriter => AccessMode::Rwo,
        Mode::SingleNodeSingleWriter => AccessMode::Rwop,
        Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly => AccessMode::Rox,
        Mode::MultiNodeSingleWriter | Mode::MultiNodeMultiWriter => AccessMode::Rwx,
        Mode::Unknown => AccessMode::Unspecified,
    }
}

/// The SNAP socket of `provider` under `template`: an empty provider is the
/// default one; a template without the placeholder names one fixed socket.
///
/// The provider name comes from the plugin and becomes a path component, so
/// it must be a plain name.
pub fn snap_socket_path(template: &str, provider: &str) -> Result<PathBuf, DpuError> {
    let provider = if provider.is_empty() {
        DEFAULT_SNAP_PROVIDER
    } else {
        provider
    };
    let plain = provider
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && provider != "."
        && provider != "..";
    if !plain {
        return Err(DpuError::FailedPrecondition(format!(
            "the vendor plugin names SNAP provider {provider:?}, which is not a plain name"
        )));
    }
    Ok(PathBuf::from(
        template.replace(PROVIDER_PLACEHOLDER, provider),
    ))
}

/// What the plugin says about itself; asked once.
#[derive(Debug, Clone)]
pub struct PluginDescription {
    pub name: String,
    pub vendor_version: String,
    pub capabilities: Vec<Capability>,
    /// The SNAP provider's socket, from GetSNAPProvider and the template.
    pub snap_socket: PathBuf,
}

impl PluginDescription {
    pub fn has(&self, capability: Capability) -> bool {
        self.capabilities.contains(&capability)
    }
}

/// A device the plugin lists.
pub type DeviceEntry = api::list_devices_response::Entry;

/// The client of one vendor plugin.
#[derive(Debug)]
pub struct PluginClient {
    socket: PathBuf,
    snap_socket_template: String,
    identity: IdentityServiceClient<Channel>,
    storage: StoragePluginServiceClient<Channel>,
    description: OnceLock<PluginDescription>,
}

impl PluginClient {
    /// A client for the plugin at `socket`; nothing is connected until the
    /// first call. `snap_socket_template` maps its provider to SNAP's socket.
    /// Must be called inside a Tokio runtime: the channel spawns its worker.
    pub fn new(socket: impl Into<PathBuf>, snap_socket_template: impl Into<String>) -> Self {
        let socket = socket.into();
        let channel = grpc::unix_channel(socket.clone());
        PluginClient {
            socket,
            snap_socket_template: snap_socket_template.into(),
            identity: IdentityServiceClient::new(channel.clone()),
            storage: StoragePluginServiceClient::new(channel),
            description: OnceLock::new(),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// GetPluginInfo, capabilities and SNAP provider, asked together on first
    /// use and kept; a failure is not kept, the next call asks again.
    ///
    /// Each caller asks under its own deadline: waiting behind another
    /// caller's first ask would hold this call to that one's deadline (a
    /// node's start-up inventory has a longer one than a stage), and a stage
    /// would then end without an answer instead of with the plugin's reason.
    /// Callers that meet before the first answer each ask; the first
    /// description is kept.
    pub async fn describe(&self, deadline: Instant) -> Result<&PluginDescription, DpuError> {
        if let Some(description) = self.description.get() {
            return Ok(description);
        }
        let (info, capabilities, provider) = tokio::join!(
            self.unary(
                "GetPluginInfo",
                deadline,
                api::GetPluginInfoRequest {},
                |mut c, r| async move { c.identity.get_plugin_info(r).await }
            ),
            self.unary(
                "StoragePluginGetCapabilities",
                deadline,
                api::StoragePluginGetCapabilitiesRequest {},
                |mut c, r| async move { c.storage.storage_plugin_get_capabilities(r).await }
            ),
            self.unary(
                "GetSNAPProvider",
                deadline,
                api::GetSnapProviderRequest {},
                |mut c, r| async move { c.storage.get_snap_provider(r).await }
            ),
        );
        let (info, capabilities, provider) = (info?, capabilities?, provider?);
        let description = PluginDescription {
            name: info.name,
            vendor_version: info.vendor_version,
            capabilities: capabilities
                .capabilities
                .iter()
                .filter_map(|c| match c.r#type {
                    Some(api::storage_plugin_service_capability::Type::Rpc(rpc)) => {
                        Capability::try_from(rpc.r#type).ok()
                    }
                    None => None,
                })
                .collect(),
            snap_socket: snap_socket_path(&self.snap_socket_template, &provider.provider_name)?,
        };
        if self.description.set(description).is_ok()
            && let Some(description) = self.description.get()
        {
            tracing::info!(
                plugin = %description.name,
                version = %description.vendor_version,
                capabilities = ?description.capabilities,
                snap_socket = %description.snap_socket.display(),
                "vendor plugin described itself"
            );
        }
        Ok(self
            .description
            .get()
            .expect("set by this call or by another that met it"))
    }

    /// Whether the plugin says it is ready. An unset `ready` counts as ready,
    /// as CSI's Probe defines it; the plugin API copies that message.
    pub async fn probe(&self, deadline: Instant) -> Result<bool, DpuError> {
        let response = self
            .unary(
                "Probe",
                deadline,
                api::ProbeRequest {},
                |mut c, r| async move { c.identity.probe(r).await },
            )
            .await?;
        Ok(response.ready.unwrap_or(true))
    }

    /// CreateDevice: the plugin makes (or finds, it is idempotent) the
    /// device of the volume inside SNAP and names it: a bdev, or an fsdev
    /// for an emulation that serves files, each only from a plugin that
    /// advertises that kind of device.
    pub async fn create_device(
        &self,
        request: &AttachRequest,
        deadline: Instant,
    ) -> Result<String, DpuError> {
        let (volume_mode, capability) = match request.emulation.serves_files() {
            true => (VOLUME_MODE_FILESYSTEM, Capability::CreateDeleteFsDevice),
            false => (VOLUME_MODE_BLOCK, Capability::CreateDeleteBlockDevice),
        };
        self.require(capability, deadline)
            .await
            .map_err(|e| match e {
                DpuError::FailedPrecondition(m) => DpuError::FailedPrecondition(format!(
                    "{m}: a {} volume needs a {} device from it",
                    request.emulation.label(),
                    volume_mode.to_lowercase()
                )),
                other => other,
            })?;
        let message = api::CreateDeviceRequest {
            volume_id: request.volume_id.clone(),
            access_modes: request.access_modes.iter().map(|m| *m as i32).collect(),
            volume_mode: volume_mode.to_string(),
            publish_context: request.publish_context.clone(),
            volume_context: request.volume_context.clone(),
            storage_parameters: request.storage_parameters.clone(),
        };
        let response = self
            .unary("CreateDevice", deadline, message, |mut c, r| async move {
                c.storage.create_device(r).await
            })
            .await?;
        if response.device_name.is_empty() {
            return Err(DpuError::Internal(format!(
                "vendor plugin at {}: CreateDevice of volume {} answered no device name",
                self.socket.display(),
                request.volume_id
            )));
        }
        Ok(response.device_name)
    }

    /// DeleteDevice; the plugin answers OK when the device is already gone.
    pub async fn delete_device(
        &self,
        volume_id: &str,
        device_name: &str,
        deadline: Instant,
    ) -> Result<(), DpuError> {
        let message = api::DeleteDeviceRequest {
            volume_id: volume_id.to_string(),
            device_name: device_name.to_string(),
        };
        self.unary("DeleteDevice", deadline, message, |mut c, r| async move {
            c.storage.delete_device(r).await
        })
        .await?;
        Ok(())
    }

    /// GetDevice; `None` when the plugin says NOT_FOUND. Needs the
    /// GET_DEVICE_STATS capability.
    pub async fn get_device(
        &self,
        volume_id: &str,
        device_name: &str,
        deadline: Instant,
    ) -> Result<Option<api::GetDeviceResponse>, DpuError> {
        self.require(Capability::GetDeviceStats, deadline).await?;
        let message = api::GetDeviceRequest {
            volume_id: volume_id.to_string(),
            device_name: device_name.to_string(),
        };
        let result = self
            .call("GetDevice", deadline, message, |mut c, r| async move {
                c.storage.get_device(r).await
            })
            .await;
        match result {
            Ok(device) => Ok(Some(device)),
            Err(failed) if failed.status.code() == Code::NotFound => Ok(None),
            Err(failed) => Err(self.error("GetDevice", failed)),
        }
    }

    /// Every device the plugin knows, all pages. Needs LIST_DEVICES.
    pub async fn list_devices(&self, deadline: Instant) -> Result<Vec<DeviceEntry>, DpuError> {
        self.require(Capability::ListDevices, deadline).await?;
        let mut entries = Vec::new();
        let mut token = String::new();
        loop {
            let message = api::ListDevicesRequest {
                max_entries: LIST_PAGE,
                starting_token: token.clone(),
            };
            let page = self
                .unary("ListDevices", deadline, message, |mut c, r| async move {
                    c.storage.list_devices(r).await
                })
                .await?;
            entries.extend(page.entries);
            if page.next_token.is_empty() {
                return Ok(entries);
            }
            if page.next_token == token {
                return Err(DpuError::Internal(format!(
                    "vendor plugin at {}: ListDevices hands out the same page token {:?} again",
                    self.socket.display(),
                    token
                )));
            }
            token = page.next_token;
        }
    }

    async fn require(&self, capability: Capability, deadline: Instant) -> Result<(), DpuError> {
        let description = self.describe(deadline).await?;
        if description.has(capability) {
            return Ok(());
        }
        Err(DpuError::FailedPrecondition(format!(
            "vendor plugin {} at {} lacks capability {}",
            description.name,
            self.socket.display(),
            capability.as_str_name()
        )))
    }

    /// [`PluginClient::call`] with the status classified.
    async fn unary<Req, Resp, F, Fut>(
        &self,
        rpc: &'static str,
        deadline: Instant,
        message: Req,
        send: F,
    ) -> Result<Resp, DpuError>
    where
        Req: Clone,
        F: Fn(Clients, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        self.call(rpc, deadline, message, send)
            .await
            .map_err(|failed| self.error(rpc, failed))
    }

    /// One RPC with the deadline on every attempt and retries inside it of
    /// the calls the plugin did not answer, and of its UNAVAILABLE and
    /// DEADLINE_EXCEEDED (a dependency of its own that timed out).
    async fn call<Req, Resp, F, Fut>(
        &self,
        rpc: &'static str,
        deadline: Instant,
        message: Req,
        send: F,
    ) -> Result<Resp, Failed>
    where
        Req: Clone,
        F: Fn(Clients, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        let transient = |s: &Status| {
            grpc::unanswered(s) || matches!(s.code(), Code::Unavailable | Code::DeadlineExceeded)
        };
        let (response, _attempts) =
            grpc::call_retried("plugin", rpc, deadline, &message, transient, |request| {
                let clients = Clients {
                    identity: self.identity.clone(),
                    storage: self.storage.clone(),
                };
                send(clients, request)
            })
            .await?;
        Ok(response)
    }

    fn error(&self, rpc: &str, Failed { status, .. }: Failed) -> DpuError {
        let socket = self.socket.display();
        if grpc::unanswered(&status) {
            return DpuError::Unavailable(format!(
                "vendor plugin at {socket}: {rpc}: no gRPC answer: {}",
                status.message()
            ));
        }
        let message = format!(
            "vendor plugin at {socket}: {rpc}: {}: {}",
            status.code().description(),
            status.message()
        );
        DpuError::from_code(status.code(), message)
    }
}

/// The generated clients, cloned per attempt (their methods take `&mut`).
struct Clients {
    identity: IdentityServiceClient<Channel>,
    storage: StoragePluginServiceClient<Channel>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_csi_mode_maps_to_the_plugin_mode_with_its_write_permission() {
        let cases = [
            (Mode::SingleNodeWriter, AccessMode::Rwo),
            (Mode::SingleNodeMultiWriter, AccessMode::Rwo),
            (Mode::SingleNodeSingleWriter, AccessMode::Rwop),
            (Mode::SingleNodeReaderOnly, AccessMode::Rox),
            (Mode::MultiNodeReaderOnly, AccessMode::Rox),
            (Mode::MultiNodeSingleWriter, AccessMode::Rwx),
            (Mode::MultiNodeMultiWriter, AccessMode::Rwx),
            (Mode::Unknown, AccessMode::Unspecified),
        ];
        for (csi, plugin) in cases {
            assert_eq!(plugin_access_mode(csi), plugin, "{csi:?}");
        }
    }

    #[test]
    fn providers_map_to_dpf_socket_paths() {
        assert_eq!(
            snap_socket_path(DEFAULT_SNAP_SOCKET_TEMPLATE, "").unwrap(),
            PathBuf::from("/var/lib/nvidia/storage/snap/providers/nvidia/snap.sock")
        );
        assert_eq!(
            snap_socket_path(DEFAULT_SNAP_SOCKET_TEMPLATE, "acme-snap").unwrap(),
            PathBuf::from("/var/lib/nvidia/storage/snap/providers/acme-snap/snap.sock")
        );
        assert_eq!(
            snap_socket_path("/var/tmp/spdk.sock", "acme").unwrap(),
            PathBuf::from("/var/tmp/spdk.sock")
        );
    }

    #[test]
    fn provider_names_cannot_escape_the_template() {
        for bad in ["..", ".", "a/b", "../../etc", "x\0y", "a b"] {
            assert!(
                matches!(
                    snap_socket_path(DEFAULT_SNAP_SOCKET_TEMPLATE, bad),
                    Err(DpuError::FailedPrecondition(_))
                ),
                "{bad:?}"
            );
        }
    }

    /// A first call that waits on a silent plugin under a long deadline (a
    /// node's start-up inventory) does not hold a later call past its own
    /// shorter one (a stage): that one ends by its deadline with the
    /// plugin's name, while the first still waits.
    #[tokio::test]
    async fn a_call_asks_for_the_description_under_its_own_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("plugin.sock");
        // Accepted by the kernel, never answered: a plugin that hangs.
        let _silent = tokio::net::UnixListener::bind(&socket).unwrap();
        let client = std::sync::Arc::new(PluginClient::new(&socket, DEFAULT_SNAP_SOCKET_TEMPLATE));
        let first = tokio::spawn({
            let client = client.clone();
            async move {
                let deadline = Instant::now() + std::time::Duration::from_secs(600);
                client.describe(deadline).await.map(drop)
            }
        });
        tokio::task::yield_now().await;
        let deadline = Instant::now() + std::time::Duration::from_millis(300);
        // Only a guard against a hang: the call ends by its deadline.
        let error = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            client.describe(deadline),
        )
        .await
        .expect("the call waited behind the first one")
        .unwrap_err();
        assert!(
            matches!(&error, DpuError::Unavailable(m) if m.contains(&socket.display().to_string())),
            "{error:?}"
        );
        assert!(!first.is_finished(), "the first call still waits");
        first.abort();
    }
}
