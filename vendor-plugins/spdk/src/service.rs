//! The plugin API's two services over one SPDK socket.
//!
//! Each device call is exactly one SPDK round trip: the node's attach and
//! detach budgets count it. So CreateDevice creates and reads "it exists"
//! (-17 / -114) as "made by an earlier call"; it does not look first or
//! check after. That is sound because a device's name encodes its volume id
//! and backend ([`crate::names`]) and a volume's context is fixed for its
//! life, so only a CreateDevice of this very volume makes that name. Calls
//! that may concern either backend (a DeleteDevice or GetDevice without a
//! device name) send both of their SPDK calls at once: still one round trip.
//!
//! One exception: an AIO volume with QoS limits ([`crate::qos`]) costs a
//! second round trip, `bdev_set_qos_limit` on the bdev once it exists (SPDK
//! has no way to create an AIO bdev with limits, and sending both at once
//! would rely on the order the two requests leave in). Volumes without
//! limits pay nothing. Later changes of an attached AIO volume, its limits
//! and its file's size, are applied by [`crate::follow`], outside any call
//! (also to a bdev CreateDevice finds there, whose size it does not read).
//! NVMe-oF volumes' limits are set on the target by the controller, so
//! their CreateDevice stays one round trip.
//!
//! No per-volume lock: every call is one SPDK call, and SPDK runs them one
//! at a time; the node serialises the calls of each volume anyway.
//!
//! Contexts are not kept: GetDevice answers `volume_mode` "Block" and empty
//! contexts. Nothing here logs a context or a request wholesale.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use snap_csi::deadline::call_deadline;
use snap_csi::jsonrpc::{RpcClient, code};
use snap_csi::proto::nvidia::storage::plugins::v1 as api;
use snap_csi::spdk::app::SpdkGetVersion;
use snap_csi::spdk::bdev::{BdevAioCreate, BdevAioDelete, BdevGetBdevs};
use snap_csi::spdk::nvme::{BdevNvmeAttachController, BdevNvmeDetachController};
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use crate::backend::{BACKENDS, Backend, Kind, NvmfTarget};
use crate::errors::Failure;
use crate::follow::{self, Attached, Followed};
use crate::names::{check_volume_id, device_name, object_name, parse_device_name};
use crate::paging;
use crate::qos;
use api::identity_service_server::IdentityService;
use api::storage_plugin_service_capability::rpc::Type as Capability;
use api::storage_plugin_service_server::StoragePluginService;

/// The name GetPluginInfo answers.
pub const PLUGIN_NAME: &str = "spdk.snap-csi.io";

/// The only volume mode we serve: the node makes filesystems on the host,
/// so every device, also one for a filesystem volume, is a block device.
pub const VOLUME_MODE_BLOCK: &str = "Block";

/// A Probe answers within this even when its caller sets no deadline: a
/// liveness check must not hang on a hung SPDK.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// AIO bdevs get 512-byte blocks: a regular file has none SPDK can detect.
const AIO_BLOCK_SIZE: u32 = 512;

/// What the plugin can do; every RPC of the API is implemented.
pub const CAPABILITIES: [Capability; 3] = [
    Capability::CreateDeleteBlockDevice,
    Capability::GetDeviceStats,
    Capability::ListDevices,
];

/// Settings of the services.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Answered by GetSNAPProvider; empty means NVIDIA's default SNAP.
    pub snap_provider: String,
    /// The longest a call may take, and the time of one without a deadline.
    pub call_timeout: Duration,
    /// How often attached AIO volumes' files and QoS records are looked at,
    /// to grow their bdevs and apply limits live ([`crate::follow`]). Zero:
    /// never, so they change only at the next attach; the binary refuses it
    /// (the controller advertises online expansion), and embedders use it
    /// only to keep SNAP free of background calls (tests counting round trips).
    pub aio_follow_period: Duration,
}

/// Both services; cheap to clone into each server.
#[derive(Debug, Clone)]
pub struct SpdkPlugin {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    spdk: RpcClient,
    config: ServiceConfig,
    followed: Followed,
}

impl SpdkPlugin {
    /// The services over SNAP's SPDK at `spdk`; nothing connects until a call.
    pub fn new(spdk: RpcClient, config: ServiceConfig) -> SpdkPlugin {
        SpdkPlugin {
            inner: Arc::new(Inner {
                spdk,
                config,
                followed: Followed::default(),
            }),
        }
    }

    /// Grows attached AIO volumes' bdevs and applies their QoS changes live
    /// until aborted (returns at once when the period is zero).
    pub async fn follow_aio_volumes(&self) {
        let config = &self.inner.config;
        if config.aio_follow_period.is_zero() {
            return;
        }
        follow::run(
            &self.inner.followed,
            self.spdk(),
            config.aio_follow_period,
            config.call_timeout,
        )
        .await;
    }

    fn spdk(&self) -> &RpcClient {
        &self.inner.spdk
    }

    fn deadline<T>(&self, request: &Request<T>) -> Instant {
        call_deadline(request, self.inner.config.call_timeout)
    }

    async fn create_aio(
        &self,
        volume_id: &str,
        path: &str,
        context: &HashMap<String, String>,
        deadline: Instant,
    ) -> Result<String, Status> {
        let name = device_name(Kind::Aio, volume_id);
        let given = qos::context_limits(volume_id, context)?;
        let limits = qos::with_record(given, volume_id, path)?;
        // SPDK takes an empty file as a bdev of no blocks, which the host
        // would then wait for in vain. A file this process cannot see is
        // left for SPDK to judge. Read before the create, the size is at
        // most the bdev's: the follower grows the bdev if the file is larger.
        let size = follow::backing_size(std::path::Path::new(path)).ok();
        if size == Some(0) {
            return Err(Status::invalid_argument(format!(
                "creating AIO bdev {name} over {path}: the file is empty (a volume needs at least \
                 one {AIO_BLOCK_SIZE}-byte block)"
            )));
        }
        let create = BdevAioCreate {
            name: name.clone(),
            filename: path.to_string(),
            block_size: Some(AIO_BLOCK_SIZE),
            readonly: None,
        };
        let blocks = match self.spdk().call_until(&create, deadline).await {
            Ok(_) => {
                tracing::info!(%volume_id, device = %name, "AIO bdev created");
                size.map(|s| s / u64::from(AIO_BLOCK_SIZE))
            }
            Err(e) if e.is_exists() => {
                tracing::debug!(%volume_id, device = %name, "AIO bdev already there");
                None
            }
            Err(e) if e.code() == Some(code::EINVAL) => {
                return Err(Status::invalid_argument(format!(
                    "creating AIO bdev {name} over {path}: SPDK refuses the file: it is not a \
                     whole number of {AIO_BLOCK_SIZE}-byte blocks, or a block device with larger \
                     logical blocks ({e})"
                )));
            }
            Err(e) => {
                return Err(
                    Failure::snap(format!("creating AIO bdev {name} over {path}"), e).into(),
                );
            }
        };
        // Also on a bdev an earlier call made: that call may have stopped
        // before its limits, and they may have changed since.
        if !limits.is_empty() {
            self.spdk()
                .call_until(&limits.request(&name), deadline)
                .await
                .map_err(|e| Failure::qos(format!("AIO bdev {name}"), e))?;
            tracing::info!(%volume_id, device = %name, ?limits, "QoS limits set");
        }
        self.inner.followed.follow(Attached {
            device: &name,
            volume_id,
            path,
            block_size: AIO_BLOCK_SIZE,
            blocks,
            given,
            applied: limits,
        });
        Ok(name)
    }

    async fn create_nvmf(
        &self,
        volume_id: &str,
        target: &NvmfTarget,
        deadline: Instant,
    ) -> Result<String, Status> {
        let controller = object_name(Kind::Nvmf, volume_id);
        let device = device_name(Kind::Nvmf, volume_id);
        let what = format!(
            "attaching NVMe-oF controller {controller} to {} {}:{} {}",
            target.trtype, target.traddr, target.trsvcid, target.subnqn
        );
        let attach = BdevNvmeAttachController {
            name: controller.clone(),
            trtype: target.trtype.clone(),
            traddr: target.traddr.clone(),
            adrfam: Some(target.adrfam.clone()),
            trsvcid: Some(target.trsvcid.clone()),
            subnqn: Some(target.subnqn.clone()),
            hostnqn: target.hostnqn.clone(),
        };
        match self.spdk().call_until(&attach, deadline).await {
            Ok(bdevs) if bdevs.contains(&device) => {
                tracing::info!(%volume_id, %device, "NVMe-oF controller attached");
                Ok(device)
            }
            Ok(bdevs) => {
                // A device that is not there would fail later in SNAP with
                // a far worse message; leave nothing attached on a refusal.
                self.delete_object(Kind::Nvmf, volume_id, deadline).await?;
                Err(Status::failed_precondition(format!(
                    "{what}: the subsystem has no namespace 1 (SPDK made bdevs {bdevs:?})"
                )))
            }
            Err(e) if e.is_already_attached() => {
                tracing::debug!(%volume_id, %device, "NVMe-oF controller already attached");
                Ok(device)
            }
            Err(e) => Err(Failure::attach(what, e).into()),
        }
    }

    /// Removes what CreateDevice made for `kind`; absent is done.
    async fn delete_object(
        &self,
        kind: Kind,
        volume_id: &str,
        deadline: Instant,
    ) -> Result<(), Status> {
        let name = object_name(kind, volume_id);
        let (result, what) = match kind {
            Kind::Aio => (
                self.spdk()
                    .call_until(&BdevAioDelete { name: name.clone() }, deadline)
                    .await
                    .map(drop),
                "deleting AIO bdev",
            ),
            Kind::Nvmf => (
                self.spdk()
                    .call_until(&BdevNvmeDetachController { name: name.clone() }, deadline)
                    .await
                    .map(drop),
                "detaching NVMe-oF controller",
            ),
        };
        if kind == Kind::Aio
            && (result.is_ok() || result.as_ref().is_err_and(|e| e.is_no_such_device()))
        {
            self.inner.followed.forget(&name);
        }
        match result {
            Ok(()) => {
                tracing::info!(%volume_id, object = %name, "{what}: done");
                Ok(())
            }
            Err(e) if e.is_no_such_device() => Ok(()),
            Err(e) => Err(Failure::snap(format!("{what} {name}"), e).into()),
        }
    }

    /// Whether the device of `volume_id` for `kind` exists.
    async fn device_exists(
        &self,
        kind: Kind,
        volume_id: &str,
        deadline: Instant,
    ) -> Result<bool, Status> {
        let name = device_name(kind, volume_id);
        let query = BdevGetBdevs {
            name: Some(name.clone()),
            timeout: None,
        };
        match self.spdk().call_until(&query, deadline).await {
            Ok(bdevs) => Ok(!bdevs.is_empty()),
            Err(e) if e.is_no_such_device() => Ok(false),
            Err(e) => Err(Failure::snap(format!("looking up bdev {name}"), e).into()),
        }
    }
}

/// The backends a request about `volume_id` and `device_name` may concern: both
/// without a name, the name's when it is this volume's, none when it is not.
fn kinds_of(volume_id: &str, device_name: &str) -> Vec<Kind> {
    if device_name.is_empty() {
        return Kind::ALL.to_vec();
    }
    match parse_device_name(device_name) {
        Some((kind, owner)) if owner == volume_id => vec![kind],
        _ => vec![],
    }
}

fn checked_volume_id(volume_id: &str) -> Result<(), Status> {
    check_volume_id(volume_id).map_err(Status::invalid_argument)
}

fn capability(c: Capability) -> api::StoragePluginServiceCapability {
    api::StoragePluginServiceCapability {
        r#type: Some(api::storage_plugin_service_capability::Type::Rpc(
            api::storage_plugin_service_capability::Rpc { r#type: c as i32 },
        )),
    }
}

#[tonic::async_trait]
impl IdentityService for SpdkPlugin {
    async fn get_plugin_info(
        &self,
        _: Request<api::GetPluginInfoRequest>,
    ) -> Result<Response<api::GetPluginInfoResponse>, Status> {
        Ok(Response::new(api::GetPluginInfoResponse {
            name: PLUGIN_NAME.into(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: HashMap::from([("backends".to_string(), BACKENDS.join(","))]),
        }))
    }

    /// Ready exactly when SNAP's SPDK answers; an unreachable SPDK is "not
    /// ready", never an error, so the caller waits rather than restarts us.
    async fn probe(
        &self,
        request: Request<api::ProbeRequest>,
    ) -> Result<Response<api::ProbeResponse>, Status> {
        let deadline = call_deadline(&request, PROBE_TIMEOUT);
        let ready = match self.spdk().call_until(&SpdkGetVersion {}, deadline).await {
            Ok(_) => true,
            Err(e) => {
                tracing::debug!("probe: SPDK does not answer: {e}");
                false
            }
        };
        Ok(Response::new(api::ProbeResponse { ready: Some(ready) }))
    }
}

#[tonic::async_trait]
impl StoragePluginService for SpdkPlugin {
    async fn storage_plugin_get_capabilities(
        &self,
        _: Request<api::StoragePluginGetCapabilitiesRequest>,
    ) -> Result<Response<api::StoragePluginGetCapabilitiesResponse>, Status> {
        Ok(Response::new(api::StoragePluginGetCapabilitiesResponse {
            capabilities: CAPABILITIES.into_iter().map(capability).collect(),
        }))
    }

    async fn get_snap_provider(
        &self,
        _: Request<api::GetSnapProviderRequest>,
    ) -> Result<Response<api::GetSnapProviderResponse>, Status> {
        Ok(Response::new(api::GetSnapProviderResponse {
            provider_name: self.inner.config.snap_provider.clone(),
        }))
    }

    async fn create_device(
        &self,
        request: Request<api::CreateDeviceRequest>,
    ) -> Result<Response<api::CreateDeviceResponse>, Status> {
        let deadline = self.deadline(&request);
        let request = request.into_inner();
        checked_volume_id(&request.volume_id)?;
        let mode = request.volume_mode.as_str();
        if !(mode.is_empty() || mode.eq_ignore_ascii_case(VOLUME_MODE_BLOCK)) {
            return Err(Status::invalid_argument(format!(
                "volume_mode {mode:?}: this plugin makes block devices only"
            )));
        }
        let backend = Backend::from_context(&request.volume_context)
            .map_err(|e| Status::invalid_argument(format!("volume {}: {e}", request.volume_id)))?;
        let device = match &backend {
            Backend::Aio { path } => {
                self.create_aio(&request.volume_id, path, &request.volume_context, deadline)
                    .await
            }
            Backend::Nvmf(target) => self.create_nvmf(&request.volume_id, target, deadline).await,
        }
        .inspect_err(
            |s| tracing::warn!(volume_id = %request.volume_id, "CreateDevice: {}", s.message()),
        )?;
        Ok(Response::new(api::CreateDeviceResponse {
            device_name: device,
        }))
    }

    async fn delete_device(
        &self,
        request: Request<api::DeleteDeviceRequest>,
    ) -> Result<Response<api::DeleteDeviceResponse>, Status> {
        let deadline = self.deadline(&request);
        let request = request.into_inner();
        checked_volume_id(&request.volume_id)?;
        let kinds = kinds_of(&request.volume_id, &request.device_name);
        if kinds.is_empty() {
            // Nothing of this volume has that name: the API says "done".
            tracing::warn!(
                volume_id = %request.volume_id,
                device = %request.device_name,
                "DeleteDevice of a device that is not this volume's: nothing to do"
            );
        }
        let results = join_all(
            kinds
                .into_iter()
                .map(|kind| self.delete_object(kind, &request.volume_id, deadline)),
        )
        .await;
        for result in results {
            result.inspect_err(
                |s| tracing::warn!(volume_id = %request.volume_id, "DeleteDevice: {}", s.message()),
            )?;
        }
        Ok(Response::new(api::DeleteDeviceResponse {}))
    }

    async fn get_device(
        &self,
        request: Request<api::GetDeviceRequest>,
    ) -> Result<Response<api::GetDeviceResponse>, Status> {
        let deadline = self.deadline(&request);
        let request = request.into_inner();
        checked_volume_id(&request.volume_id)?;
        let kinds = kinds_of(&request.volume_id, &request.device_name);
        let found = join_all(
            kinds
                .into_iter()
                .map(|kind| self.device_exists(kind, &request.volume_id, deadline)),
        )
        .await;
        let mut exists = false;
        for result in found {
            exists |= result?;
        }
        if !exists {
            return Err(Status::not_found(format!(
                "volume {} has no device{}",
                request.volume_id,
                if request.device_name.is_empty() {
                    String::new()
                } else {
                    format!(" {}", request.device_name)
                }
            )));
        }
        Ok(Response::new(api::GetDeviceResponse {
            volume_mode: VOLUME_MODE_BLOCK.into(),
            ..Default::default()
        }))
    }

    async fn list_devices(
        &self,
        request: Request<api::ListDevicesRequest>,
    ) -> Result<Response<api::ListDevicesResponse>, Status> {
        let deadline = self.deadline(&request);
        let request = request.into_inner();
        let max_entries = usize::try_from(request.max_entries).map_err(|_| {
            Status::invalid_argument(format!(
                "max_entries is {}; it must not be negative",
                request.max_entries
            ))
        })?;
        let after = paging::parse_token(&request.starting_token)?;
        let bdevs = self
            .spdk()
            .call_until(&BdevGetBdevs::default(), deadline)
            .await
            .map_err(|e| Failure::snap("listing bdevs", e))?;
        let ours = bdevs
            .into_iter()
            .filter_map(|bdev| {
                let (_, volume_id) = parse_device_name(&bdev.name)?;
                Some(api::list_devices_response::Entry {
                    volume_id,
                    device_name: bdev.name,
                })
            })
            .collect();
        let (entries, next_token) = paging::page(ours, after, max_entries);
        Ok(Response::new(api::ListDevicesResponse {
            entries,
            next_token,
        }))
    }
}
