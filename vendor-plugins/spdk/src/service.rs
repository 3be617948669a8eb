//! The plugin API's two services over one SPDK socket.
//!
//! Each device call is exactly one dependent SPDK round trip (requests sent
//! together count once): the node's attach and detach budgets count it.
//! So CreateDevice creates and reads "it exists" (-17 / -114) as "made by
//! an earlier call"; it does not look first or check after. That is sound
//! because a device's name encodes its volume id and backend
//! ([`crate::names`]) and a volume's context is fixed for its life, so only
//! a CreateDevice of this very volume makes that name. Calls that may
//! concern either backend (a DeleteDevice or GetDevice without a device
//! name) send both of their SPDK calls at once: still one round trip.
//!
//! A multipath NVMe-oF volume (its context lists `extra_paths`) costs two,
//! whatever its number of paths, a retry too: every path's
//! `bdev_nvme_attach_controller` at once (the first to connect makes the
//! controller and its bdev, the others join it; a path there already answers
//! -114 or -17), then `bdev_nvme_set_multipath_policy` on the bdev, which
//! only exists once a path is attached. Its DeleteDevice is still one (a
//! detach by name takes every path). A path that cannot be reached does not
//! fail the call while another is attached: [`crate::paths`] attaches it
//! once it answers.
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
//! at a time; the node serialises the calls of each volume anyway. The one
//! turn taken is a multipath device's, between its DeleteDevice and the
//! keeper attaching a missing path ([`crate::paths::Kept::turn`]).
//!
//! Filesystem devices (backend `fs`, only with a share configured) are SPDK
//! aio fsdevs over the volume's directory: `fsdev_aio_create` and
//! `fsdev_aio_delete`, one round trip each too; with an NFS server
//! configured, DOCA SNAP's NFS fsdevs of the volume's directory in the
//! server's export (`fsdev_nfs_create`, `fsdev_nfs_delete`), as DPF's plugin
//! makes them. SPDK v24.09 lists fsdevs
//! only in `framework_get_config` of subsystem `fsdev`, which GetDevice and
//! ListDevices read beside `bdev_get_bdevs` (sent at once). What a plugin
//! offers is configured ([`Devices`]): it advertises CREATE_DELETE_BLOCK_DEVICE
//! and CREATE_DELETE_FS_DEVICE for exactly the kinds it serves.
//!
//! Contexts are not kept: GetDevice answers the `volume_mode` of the kind of
//! device it found, and empty contexts. Nothing here logs a context or a
//! request wholesale.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use snap_csi::deadline::call_deadline;
use snap_csi::jsonrpc::{RpcClient, code};
use snap_csi::proto::nvidia::storage::plugins::v1 as api;
use snap_csi::spdk::app::SpdkGetVersion;
use snap_csi::spdk::bdev::{BdevAioCreate, BdevAioDelete, BdevGetBdevs};
use snap_csi::spdk::fsdev::{
    ConfigCall, FrameworkGetConfig, FsdevAioCreate, FsdevAioDelete, FsdevNfsCreate, FsdevNfsDelete,
};
use snap_csi::spdk::nvme::BdevNvmeDetachController;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use crate::backend::{Backend, Devices, Kind, NvmfTarget};
use crate::errors::{Failure, is_fsdev_taken};
use crate::follow::{self, Attached, Followed};
use crate::names::{check_volume_id, device_name, object_name, parse_device_name};
use crate::paging;
use crate::paths::{self, Kept};
use crate::qos;
use api::identity_service_server::IdentityService;
use api::storage_plugin_service_capability::rpc::Type as Capability;
use api::storage_plugin_service_server::StoragePluginService;

/// The name GetPluginInfo answers.
pub const PLUGIN_NAME: &str = "spdk.snap-csi.io";

/// A Probe answers within this even when its caller sets no deadline: a
/// liveness check must not hang on a hung SPDK.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// AIO bdevs get 512-byte blocks: a regular file has none SPDK can detect.
const AIO_BLOCK_SIZE: u32 = 512;
/// What a plugin serving `devices` can do; every RPC of the API is implemented.
pub fn capabilities(devices: &Devices) -> Vec<Capability> {
    let mut capabilities = vec![];
    if devices.block {
        capabilities.push(Capability::CreateDeleteBlockDevice);
    }
    if devices.fs_share.is_some() {
        capabilities.push(Capability::CreateDeleteFsDevice);
    }
    capabilities.extend([Capability::GetDeviceStats, Capability::ListDevices]);
    capabilities
}

/// The fsdev subsystem, whose configuration lists the fsdevs.
const FSDEV_SUBSYSTEM: &str = "fsdev";

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
    /// only to keep SNAP free of background calls (tests counting round
    /// trips): zero also stops the keeping of multipath devices' paths
    /// ([`crate::paths`]), the plugin's other background calls.
    pub aio_follow_period: Duration,
    /// The kinds of device made and advertised.
    pub devices: Devices,
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
    /// Multipath devices whose paths are kept attached.
    paths: Arc<Kept>,
}

impl SpdkPlugin {
    /// The services over SNAP's SPDK at `spdk`; nothing connects until a call.
    pub fn new(spdk: RpcClient, config: ServiceConfig) -> SpdkPlugin {
        SpdkPlugin {
            inner: Arc::new(Inner {
                spdk,
                config,
                followed: Followed::default(),
                paths: Arc::default(),
            }),
        }
    }

    /// Keeps multipath devices' paths attached until aborted (returns at
    /// once without background calls: `aio_follow_period` zero).
    pub async fn keep_paths(&self) {
        let config = &self.inner.config;
        if config.aio_follow_period.is_zero() {
            return;
        }
        paths::run(&self.inner.paths, self.spdk(), config.call_timeout).await;
    }

    /// Keeps the paths of the multipath device `controller` attached
    /// (nothing without background calls: `aio_follow_period` zero).
    pub(crate) fn keep_paths_of(&self, controller: &str, volume_id: &str, target: &NvmfTarget) {
        if !self.inner.config.aio_follow_period.is_zero() {
            self.inner.paths.keep(controller, volume_id, target);
        }
    }

    /// The multipath devices whose paths are kept (what the metrics show
    /// of a path SPDK has not attached).
    pub fn kept_paths(&self) -> Arc<Kept> {
        Arc::clone(&self.inner.paths)
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

    pub(crate) fn spdk(&self) -> &RpcClient {
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

    /// An fsdev over the volume's directory, which must lie inside the share.
    async fn create_fs(
        &self,
        volume_id: &str,
        root: &str,
        deadline: Instant,
    ) -> Result<String, Status> {
        let name = device_name(Kind::Fs, volume_id);
        let share = self.inner.config.devices.fs_share.as_deref();
        let root_path = std::path::Path::new(root);
        if !share.is_some_and(|share| root_path.starts_with(share) && root_path != share) {
            return Err(Status::invalid_argument(format!(
                "volume {volume_id}: the directory {root} is not inside this plugin's share {}",
                share.map_or("(none)".into(), |s| s.display().to_string())
            )));
        }
        let created = match &self.inner.config.devices.fs_nfs_server {
            // The directory is the server's: SNAP's NFS client judges it.
            Some(server) => {
                let create = FsdevNfsCreate {
                    name: name.clone(),
                    server: server.clone(),
                    exportname: root.to_string(),
                };
                self.spdk().call_until(&create, deadline).await.map(drop)
            }
            None => {
                // SPDK serves any root it can open, a regular file too, which
                // the host would then fail to mount. One it cannot see is
                // SPDK's to judge.
                if std::fs::metadata(root_path).is_ok_and(|m| !m.is_dir()) {
                    return Err(Status::invalid_argument(format!(
                        "volume {volume_id}: {root} is not a directory"
                    )));
                }
                let create = FsdevAioCreate {
                    name: name.clone(),
                    root_path: root.to_string(),
                };
                self.spdk().call_until(&create, deadline).await.map(drop)
            }
        };
        match created {
            Ok(_) => tracing::info!(%volume_id, device = %name, "fsdev created"),
            Err(e) if is_fsdev_taken(&e) => {
                tracing::debug!(%volume_id, device = %name, "fsdev already there");
            }
            Err(e) => {
                return Err(Failure::fsdev(format!("creating fsdev {name} over {root}"), e).into());
            }
        }
        Ok(name)
    }

    /// Removes what CreateDevice made for `kind`; absent is done.
    pub(crate) async fn delete_object(
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
            Kind::Nvmf => {
                // The keeper attaches no path of it meanwhile, nor after.
                let _turn = self.inner.paths.turn(&name, deadline).await.map_err(|_| {
                    Status::deadline_exceeded(format!(
                        "detaching NVMe-oF controller {name}: its paths were being \
                             attached until the deadline"
                    ))
                })?;
                let result = self
                    .spdk()
                    .call_until(&BdevNvmeDetachController { name: name.clone() }, deadline)
                    .await
                    .map(drop);
                if result.is_ok() || result.as_ref().is_err_and(|e| e.is_no_such_device()) {
                    self.inner.paths.forget(&name);
                }
                (result, "detaching NVMe-oF controller (every path)")
            }
            Kind::Fs if self.inner.config.devices.fs_nfs_server.is_some() => (
                self.spdk()
                    .call_until(&FsdevNfsDelete { name: name.clone() }, deadline)
                    .await
                    .map(drop),
                "deleting NFS fsdev",
            ),
            Kind::Fs => (
                self.spdk()
                    .call_until(&FsdevAioDelete { name: name.clone() }, deadline)
                    .await
                    .map(drop),
                "deleting fsdev",
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
        if !kind.is_block() {
            return Ok(self.fsdevs(deadline).await?.contains(&name));
        }
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

    /// The names of SNAP's bdevs, or none when this plugin makes no block devices.
    async fn bdevs(&self, deadline: Instant) -> Result<Vec<String>, Status> {
        if !self.inner.config.devices.block {
            return Ok(vec![]);
        }
        let bdevs = self
            .spdk()
            .call_until(&BdevGetBdevs::default(), deadline)
            .await
            .map_err(|e| Failure::snap("listing bdevs", e))?;
        Ok(bdevs.into_iter().map(|b| b.name).collect())
    }

    /// The names of SNAP's fsdevs, or none when this plugin makes no
    /// filesystem devices.
    async fn fsdevs(&self, deadline: Instant) -> Result<Vec<String>, Status> {
        if self.inner.config.devices.fs_share.is_none() {
            return Ok(vec![]);
        }
        let query = FrameworkGetConfig {
            name: FSDEV_SUBSYSTEM.into(),
        };
        let calls = self
            .spdk()
            .call_until(&query, deadline)
            .await
            .map_err(|e| Failure::snap("listing fsdevs", e))?;
        Ok(calls
            .iter()
            .filter_map(ConfigCall::fsdev)
            .map(|(name, _)| name.to_string())
            .collect())
    }

    /// The backends a request about `volume_id` and `device_name` may
    /// concern: every one served without a name, the name's when it is this
    /// volume's and of a kind served, none otherwise.
    fn kinds_of(&self, volume_id: &str, device_name: &str) -> Vec<Kind> {
        let served = self.inner.config.devices.kinds();
        if device_name.is_empty() {
            return served;
        }
        match parse_device_name(device_name) {
            Some((kind, owner)) if owner == volume_id && served.contains(&kind) => vec![kind],
            _ => vec![],
        }
    }
}

/// Refuses a `volume_mode` the volume's backend does not make ("" lets the
/// backend choose), and a backend this plugin does not serve.
fn check_mode(devices: &Devices, volume_id: &str, mode: &str, kind: Kind) -> Result<(), Status> {
    if !(mode.is_empty() || mode.eq_ignore_ascii_case(kind.volume_mode())) {
        return Err(Status::invalid_argument(format!(
            "volume {volume_id}: volume_mode {mode:?}, but its backend {} makes {} devices only",
            kind.as_str(),
            kind.volume_mode()
        )));
    }
    if !devices.serves(kind) {
        return Err(Status::failed_precondition(format!(
            "volume {volume_id}: backend {}: this plugin is not configured for {} devices ({})",
            kind.as_str(),
            kind.volume_mode(),
            if kind.is_block() {
                "it runs with --no-block-devices"
            } else {
                "it runs without --fs-share"
            }
        )));
    }
    Ok(())
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
            manifest: HashMap::from([(
                "backends".to_string(),
                self.inner
                    .config
                    .devices
                    .kinds()
                    .into_iter()
                    .map(Kind::as_str)
                    .collect::<Vec<_>>()
                    .join(","),
            )]),
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
            capabilities: capabilities(&self.inner.config.devices)
                .into_iter()
                .map(capability)
                .collect(),
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
        let backend = Backend::from_context(&request.volume_context)
            .map_err(|e| Status::invalid_argument(format!("volume {}: {e}", request.volume_id)))?;
        check_mode(
            &self.inner.config.devices,
            &request.volume_id,
            &request.volume_mode,
            backend.kind(),
        )?;
        let device = match &backend {
            Backend::Aio { path } => {
                self.create_aio(&request.volume_id, path, &request.volume_context, deadline)
                    .await
            }
            Backend::Nvmf(target) => self.create_nvmf(&request.volume_id, target, deadline).await,
            Backend::Fs { root } => self.create_fs(&request.volume_id, root, deadline).await,
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
        let kinds = self.kinds_of(&request.volume_id, &request.device_name);
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
        let kinds = self.kinds_of(&request.volume_id, &request.device_name);
        let volume_id = &request.volume_id;
        let found = join_all(kinds.iter().map(|kind| async move {
            self.device_exists(*kind, volume_id, deadline)
                .await
                .map(|exists| exists.then_some(*kind))
        }))
        .await;
        let mut kind = None;
        for result in found {
            kind = kind.or(result?);
        }
        let Some(kind) = kind else {
            return Err(Status::not_found(format!(
                "volume {} has no device{}",
                request.volume_id,
                if request.device_name.is_empty() {
                    String::new()
                } else {
                    format!(" {}", request.device_name)
                }
            )));
        };
        Ok(Response::new(api::GetDeviceResponse {
            volume_mode: kind.volume_mode().into(),
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
        let (bdevs, fsdevs) = tokio::join!(self.bdevs(deadline), self.fsdevs(deadline));
        let ours = bdevs?
            .into_iter()
            .chain(fsdevs?)
            .filter_map(|name| {
                let (_, volume_id) = parse_device_name(&name)?;
                Some(api::list_devices_response::Entry {
                    volume_id,
                    device_name: name,
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
