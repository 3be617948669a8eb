//! The CSI Node service: stage, publish, unpublish, unstage, stats, expand.
//!
//! Stage attaches the volume on the DPU (or takes DPF's attachment from the
//! publish context), waits for the host device in sysfs, and for filesystem
//! volumes formats it if blank and mounts it at the staging path. Publish
//! bind-mounts the staging path (or, for block volumes, the device node) onto
//! the target. Every call is idempotent and converges after a crash at any
//! step: what is true is read from the mount table, SNAP and sysfs; the only
//! thing remembered is the small [`VolumeRecord`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::config::NodeConfig;
use super::error::NodeError;

use super::format::FsType;
use super::records::{Records, VolumeRecord};
use super::recovery::staged_as;
use super::{mount, mountinfo, paths, stats};
use crate::csi_limits::{MAX_MAP_BYTES, required_id, within_map_limit, within_string_limit};
pub(crate) use crate::deadline::call_deadline;
use crate::dpu::{AttachRequest, DpuAttach, DpuError, HostLocator, VolumeMode};
use crate::guard::{Busy, Held, VolumeGuard};
use crate::host::{BlockDevice, Sysfs};
use crate::proto::csi::v1 as csi;
use crate::proto::csi::v1::volume_capability::access_mode::Mode;
use crate::proto::csi::v1::volume_capability::{AccessType, MountVolume};

pub use super::context::{
    DPF_NVME_NSID_KEY, DPF_PCI_ADDRESS_KEY, EMULATION_KEY, PLACEMENT_KEY, TOPOLOGY_KEY,
};

/// The node service; cheap to clone into each call.
#[derive(Debug, Clone)]
pub struct NodeService {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: NodeConfig,
    dpu: Arc<dyn DpuAttach>,
    sysfs: Sysfs,
    records: Records,
    guard: VolumeGuard,
}

/// How a volume is used, from its capability.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Usage {
    Block,
    Filesystem { fs: FsType, flags: Vec<String> },
}

impl NodeService {
    pub fn new(config: NodeConfig, dpu: Arc<dyn DpuAttach>) -> std::io::Result<NodeService> {
        let records = Records::open(config.state_dir.join("volumes"))?;
        let sysfs = Sysfs::new(&config.sysfs_root);
        Ok(NodeService {
            inner: Arc::new(Inner {
                config,
                dpu,
                sysfs,
                records,
                guard: VolumeGuard::default(),
            }),
        })
    }

    /// Publishes how many volumes are staged, from the records.
    pub(super) fn count_staged(&self) {
        match self.inner.records.count() {
            Ok(count) => crate::metrics::set_volumes_staged(count),
            Err(e) => tracing::warn!("cannot count volume records: {e}"),
        }
    }

    pub fn config(&self) -> &NodeConfig {
        &self.inner.config
    }

    pub fn dpu(&self) -> &Arc<dyn DpuAttach> {
        &self.inner.dpu
    }

    pub(super) fn records(&self) -> &Records {
        &self.inner.records
    }

    pub(super) fn sysfs(&self) -> &Sysfs {
        &self.inner.sysfs
    }

    fn deadline<T>(&self, request: &Request<T>) -> Instant {
        call_deadline(request, self.inner.config.call_timeout)
    }

    /// Holds the whole volume: stage, unstage and expand.
    pub(super) fn hold(&self, volume_id: &str) -> Result<Held, Busy> {
        self.inner.guard.try_hold(volume_id)
    }

    /// Holds one target path of the volume: publish and unpublish, which run
    /// together on different targets.
    fn hold_target(&self, volume_id: &str, target: &Path) -> Result<Held, Busy> {
        self.inner.guard.try_hold_target(volume_id, target)
    }

    fn confine(&self, what: &str, path: &str) -> Result<PathBuf, Status> {
        if path.is_empty() {
            return Err(Status::invalid_argument(format!("{what} is required")));
        }
        confine_path(&self.inner.config.kubelet_dir, path)
            .map_err(|e| Status::invalid_argument(format!("{what}: {e}")))
    }

    /// The record and path of a volume that a call finds by the path it was
    /// staged or published at (stats, expand). That path names where the CO
    /// says the volume is, not a place to make anything: one that cannot hold
    /// a volume of ours (relative, outside the kubelet directory, through a
    /// link) or does not exist means the volume is not there, which CSI
    /// answers with NOT_FOUND, as it does for a volume not staged here.
    fn staged_at(
        &self,
        volume_id: &str,
        volume_path: &str,
    ) -> Result<(VolumeRecord, PathBuf), Status> {
        let record = self.recorded(volume_id)?.ok_or_else(|| {
            Status::not_found(format!("volume {volume_id} is not staged on this node"))
        })?;
        let not_there = |why: String| {
            Status::not_found(format!(
                "volume {volume_id} is not at {volume_path:?}: {why}"
            ))
        };
        let path = match confine_path(&self.inner.config.kubelet_dir, volume_path) {
            Ok(path) => path,
            Err(NodeError::InvalidArgument(why)) => return Err(not_there(why)),
            Err(e) => return Err(e.into()),
        };
        // Only absence: a filesystem that shut down answers EIO even for its
        // mount point, and that volume is there, in a bad state.
        if let Err(e) = std::fs::symlink_metadata(&path)
            && e.kind() == std::io::ErrorKind::NotFound
        {
            return Err(not_there("no such file or directory".into()));
        }
        Ok((record, path))
    }

    /// The host device at `locator`, if sysfs shows it now.
    pub(super) fn find_device(&self, locator: &HostLocator) -> Result<Option<BlockDevice>, Status> {
        match locator {
            HostLocator::Nvme { bdf, nsid, uuid } => {
                self.inner
                    .sysfs
                    .find_nvme_namespace(bdf, *nsid, uuid.as_deref())
            }
            HostLocator::VirtioBlk { bdf, serial } => self.inner.sysfs.find_virtio_blk(bdf, serial),
        }
        .map_err(|e| Status::internal(format!("looking for the host device: {e}")))
    }

    /// Waits (polling, with the deadline) until sysfs shows the device.
    pub(super) async fn wait_for_device(
        &self,
        locator: &HostLocator,
        deadline: Instant,
    ) -> Result<BlockDevice, Status> {
        if let Some(device) = self.find_device(locator)? {
            return Ok(device);
        }
        let device_deadline = deadline.min(Instant::now() + self.inner.config.device_wait);
        let started = Instant::now();
        // A hot-plugged namespace shows up some milliseconds after SNAP's
        // answer; a look costs a few sysfs reads, so look often at first.
        let mut delay = Duration::from_millis(1);
        let found = loop {
            if Instant::now() + delay > device_deadline {
                break Err(Status::deadline_exceeded(format!(
                    "the host did not see the device at {locator:?} in time"
                )));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 3 / 2).min(Duration::from_millis(100));
            if let Some(device) = self.find_device(locator)? {
                break Ok(device);
            }
        };
        // Waiting for the host to discover a hot-plugged disk is host time.
        let outcome = if found.is_ok() { "ok" } else { "timeout" };
        crate::metrics::observe_outbound("host", "device-wait", outcome, started.elapsed());
        found
    }

    /// Where the volume's device is now, from its record (`None` if unstaged).
    pub(super) fn recorded(&self, volume_id: &str) -> Result<Option<VolumeRecord>, NodeError> {
        self.inner
            .records
            .load(volume_id)
            .map_err(|e| NodeError::state("reading the volume record", e))
    }

    fn attach_request(
        &self,
        stage: &csi::NodeStageVolumeRequest,
        capability: &csi::VolumeCapability,
        usage: &Usage,
        attached_before: bool,
    ) -> Result<AttachRequest, Status> {
        let config = &self.inner.config;
        let (emulation, placement) =
            super::context::emulation_and_placement(&stage.volume_context, config)?;
        let mode = access_mode(capability)?;
        Ok(AttachRequest {
            volume_id: stage.volume_id.clone(),
            access_modes: vec![crate::dpu::plugin_access_mode(mode)],
            volume_mode: match usage {
                Usage::Block => VolumeMode::Block,
                Usage::Filesystem { .. } => VolumeMode::Filesystem,
            },
            publish_context: stage.publish_context.clone(),
            volume_context: stage.volume_context.clone(),
            storage_parameters: stage.volume_context.clone(),
            emulation: emulation.into(),
            placement: placement.with(self.inner.config.namespaces_per_controller),
            attached_before,
            secrets: stage.secrets.clone(),
        })
    }
}

fn require<'a>(value: &'a str, what: &str) -> Result<&'a str, Status> {
    if value.is_empty() {
        Err(Status::invalid_argument(format!("{what} is required")))
    } else {
        Ok(value)
    }
}

/// The contexts and secrets a stage or publish carries, within CSI's limit.
fn maps_within_limits(
    volume_context: &HashMap<String, String>,
    publish_context: &HashMap<String, String>,
    secrets: &HashMap<String, String>,
) -> Result<(), Status> {
    within_map_limit(volume_context, "volume_context")?;
    within_map_limit(publish_context, "publish_context")?;
    within_map_limit(secrets, "secrets")
}

pub(super) fn access_mode(capability: &csi::VolumeCapability) -> Result<Mode, Status> {
    let mode = capability
        .access_mode
        .as_ref()
        .ok_or_else(|| Status::invalid_argument("volume_capability.access_mode is required"))?
        .mode;
    // prost reads a number it does not know as UNKNOWN; say which it was.
    match Mode::try_from(mode) {
        Ok(Mode::Unknown) => Err(Status::invalid_argument(
            "volume_capability.access_mode.mode is required",
        )),
        Ok(mode) => Ok(mode),
        Err(_) => Err(Status::invalid_argument(format!(
            "volume_capability.access_mode.mode {mode} is not an access mode of CSI v1.12"
        ))),
    }
}

pub(super) fn is_read_only_mode(mode: Mode) -> bool {
    matches!(mode, Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly)
}

/// Validates the capability and says how the volume will be used.
fn usage(
    capability: Option<&csi::VolumeCapability>,
) -> Result<(csi::VolumeCapability, Usage), Status> {
    let capability = capability
        .ok_or_else(|| Status::invalid_argument("volume_capability is required"))?
        .clone();
    let mode = access_mode(&capability)?;
    let usage = match &capability.access_type {
        Some(AccessType::Block(_)) => Usage::Block,
        Some(AccessType::Mount(MountVolume {
            fs_type,
            mount_flags,
            volume_mount_group,
        })) => {
            if !volume_mount_group.is_empty() {
                return Err(Status::invalid_argument(
                    "volume_mount_group is not supported (no VOLUME_MOUNT_GROUP capability)",
                ));
            }
            // A local filesystem on a device that several nodes write is corruption.
            if matches!(
                mode,
                Mode::MultiNodeMultiWriter | Mode::MultiNodeSingleWriter
            ) {
                return Err(Status::invalid_argument(format!(
                    "access mode {} needs a shared filesystem; ext4 and xfs volumes are single-node",
                    mode.as_str_name()
                )));
            }
            within_string_limit(fs_type, "fs_type")?;
            let flags_size: usize = mount_flags.iter().map(String::len).sum();
            if flags_size > MAX_MAP_BYTES {
                return Err(Status::invalid_argument(format!(
                    "mount_flags hold {flags_size} bytes; CSI limits them to {MAX_MAP_BYTES}"
                )));
            }
            let fs =
                FsType::from_csi(fs_type).map_err(|e| Status::invalid_argument(e.to_string()))?;
            Usage::Filesystem {
                fs,
                flags: mount_flags.clone(),
            }
        }
        None => {
            return Err(Status::invalid_argument(
                "volume_capability needs an access type (block or mount)",
            ));
        }
    };
    Ok((capability, usage))
}

/// The RPCs' bodies; the trait impl below wraps each in a span.
impl NodeService {
    async fn node_stage_volume_inner(
        &self,
        request: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        let volume_id = required_id(&req.volume_id, "volume_id")?;
        maps_within_limits(&req.volume_context, &req.publish_context, &req.secrets)?;
        // Checked here too, not only on the DPU: a refused key changes nothing.
        let encrypted = crate::dpu::crypto::requested(&req.volume_context, &req.secrets)?.is_some();
        let staging = self.confine("staging_target_path", &req.staging_target_path)?;
        let (capability, usage) = usage(req.volume_capability.as_ref())?;
        let read_only = is_read_only_mode(access_mode(&capability)?);
        let _held = self.hold(volume_id)?;

        let (device_name, locator, external) =
            match super::context::dpf_locator(&req.publish_context)
                .map_err(Status::invalid_argument)?
            {
                Some(_) if encrypted => {
                    return Err(Status::invalid_argument(format!(
                        "volume {volume_id} asks for encryption, which snap-csi's DPU attach \
                         does, but DPF attached it already (its publish context names the \
                         function)"
                    )));
                }
                Some(locator) => (None, locator, true),
                None => {
                    let staged_before = self.recorded(volume_id)?.is_some();
                    let attach = self.attach_request(&req, &capability, &usage, staged_before)?;
                    let attachment = match self.inner.dpu.attach(&attach, deadline).await {
                        Ok(attachment) => attachment,
                        Err(e) => {
                            // A definite refusal (no free function, bad
                            // arguments): undo what this attempt made rather
                            // than leave it for an unstage that may never come.
                            // A transient failure is left for the retry.
                            if !staged_before
                                && !matches!(e, DpuError::Unavailable(_))
                                && let Err(undo) =
                                    self.inner.dpu.detach(volume_id, None, deadline).await
                            {
                                tracing::warn!(%volume_id, "undoing a failed attach: {undo}");
                            }
                            return Err(Status::from(e));
                        }
                    };
                    crate::failpoint::step("stage:attach");
                    (Some(attachment.device_name), attachment.locator, false)
                }
            };
        let record = VolumeRecord {
            volume_id: volume_id.to_string(),
            staging_target_path: staging.clone(),
            device_name,
            locator: locator.clone(),
            external_attach: external,
            staged_as: Some(staged_as(&usage, access_mode(&capability)?)),
            volume_context: req.volume_context.clone(),
        };
        if self.recorded(volume_id)?.as_ref() != Some(&record) {
            self.inner
                .records
                .store(&record)
                .map_err(|e| NodeError::state("writing the volume record", e))?;
        }
        crate::failpoint::step("stage:record");
        self.count_staged();
        self.stage_on_host(volume_id, &staging, &locator, &usage, read_only, deadline)
            .await?;
        Ok(Response::new(csi::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume_inner(
        &self,
        request: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        let volume_id = required_id(&req.volume_id, "volume_id")?;
        let staging = self.confine("staging_target_path", &req.staging_target_path)?;
        let _held = self.hold(volume_id)?;
        self.unstage_held(volume_id, &staging, deadline).await?;
        Ok(Response::new(csi::NodeUnstageVolumeResponse {}))
    }

    /// NodeUnstageVolume's work, for a caller holding the volume.
    pub(super) async fn unstage_held(
        &self,
        volume_id: &str,
        staging: &Path,
        deadline: Instant,
    ) -> Result<(), Status> {
        // Stacked mounts (a stage retried after a crash) all go.
        while mount::unmount(staging, deadline).await? {}
        crate::failpoint::step("unstage:unmount");
        let record = self.recorded(volume_id)?;
        // Stage may have made the device read-only; give it back as found.
        if let Some(record) = &record
            && let Some(device) = self.find_device(&record.locator)?
        {
            mount::set_block_device_read_only(&device.node, false, deadline).await?;
        }
        if !record.as_ref().is_some_and(|r| r.external_attach) {
            let device_name = record.as_ref().and_then(|r| r.device_name.as_deref());
            self.inner
                .dpu
                .detach(volume_id, device_name, deadline)
                .await
                .map_err(Status::from)?;
            crate::failpoint::step("unstage:detach");
        }
        self.inner
            .records
            .remove(volume_id)
            .map_err(|e| NodeError::state("removing the volume record", e))?;
        self.count_staged();
        crate::metrics::forget_volume_condition(volume_id);
        Ok(())
    }

    async fn node_publish_volume_inner(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        // The REQUIRED fields first (INVALID_ARGUMENT), then the staging
        // path that STAGE_UNSTAGE_VOLUME makes necessary (FAILED_PRECONDITION).
        let volume_id = required_id(&req.volume_id, "volume_id")?;
        maps_within_limits(&req.volume_context, &req.publish_context, &req.secrets)?;
        require(&req.target_path, "target_path")?;
        let (capability, usage) = usage(req.volume_capability.as_ref())?;
        if req.staging_target_path.is_empty() {
            return Err(Status::failed_precondition(
                "staging_target_path is required: this plugin stages volumes (STAGE_UNSTAGE_VOLUME)",
            ));
        }
        let target = self.confine("target_path", &req.target_path)?;
        let staging = self.confine("staging_target_path", &req.staging_target_path)?;
        let read_only = req.readonly || is_read_only_mode(access_mode(&capability)?);
        let _held = self.hold_target(volume_id, &target)?;

        let source = self
            .staged_for_publish(
                volume_id,
                &staging,
                (&capability, &usage),
                &req.volume_context,
                deadline,
            )
            .await?;
        // Already published here with the same source and setting: done;
        // anything else there is ALREADY_EXISTS (bind_mount looks once).
        mount::bind_mount(&source, &target, read_only)?;
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume_inner(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        let volume_id = required_id(&req.volume_id, "volume_id")?;
        let target = self.confine("target_path", &req.target_path)?;
        let _held = self.hold_target(volume_id, &target)?;
        while mount::unmount(&target, deadline).await? {}
        crate::failpoint::step("unpublish:unmount");
        remove_mount_point(&target).map_err(|e| NodeError::state("removing the target path", e))?;
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats_inner(
        &self,
        request: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        let volume_id = required_id(&req.volume_id, "volume_id")?;
        require(&req.volume_path, "volume_path")?;
        let (_, path) = self.staged_at(volume_id, &req.volume_path)?;
        let response = super::volume_stats::volume_stats(&path, deadline).await?;
        let abnormal = response
            .volume_condition
            .as_ref()
            .is_some_and(|c| c.abnormal);
        crate::metrics::set_volume_condition(volume_id, abnormal);
        Ok(Response::new(response))
    }

    async fn node_expand_volume_inner(
        &self,
        request: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        let volume_id = required_id(&req.volume_id, "volume_id")?;
        require(&req.volume_path, "volume_path")?;
        let _held = self.hold(volume_id)?;
        let (record, path) = self.staged_at(volume_id, &req.volume_path)?;
        let device = self.wait_for_device(&record.locator, deadline).await?;
        let required = match &req.capacity_range {
            None => 0,
            Some(range) => u64::try_from(range.required_bytes).map_err(|_| {
                Status::invalid_argument(format!(
                    "capacity_range.required_bytes {} is negative",
                    range.required_bytes
                ))
            })?,
        };
        if device.size_bytes < required {
            return Err(Status::failed_precondition(format!(
                "the device is {} bytes, less than the {required} asked: expand the volume on the controller first",
                device.size_bytes
            )));
        }
        if path.is_dir() {
            let entry = mountinfo::at(&path)?
                .ok_or_else(|| Status::not_found(format!("{} is not mounted", path.display())))?;
            let fs = FsType::from_csi(&entry.fs_type).map_err(|e| {
                Status::failed_precondition(format!("cannot grow this filesystem: {e}"))
            })?;
            stats::expand_filesystem(&device.node, &path, fs, deadline).await?;
        }
        Ok(Response::new(csi::NodeExpandVolumeResponse {
            capacity_bytes: i64::try_from(device.size_bytes).unwrap_or(i64::MAX),
        }))
    }

    async fn node_get_capabilities_inner(
        &self,
        _request: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        use csi::node_service_capability::rpc::Type;
        let capabilities = [
            Type::StageUnstageVolume,
            Type::GetVolumeStats,
            Type::ExpandVolume,
            Type::VolumeCondition,
            Type::SingleNodeMultiWriter,
        ]
        .into_iter()
        .map(|t| csi::NodeServiceCapability {
            r#type: Some(csi::node_service_capability::Type::Rpc(
                csi::node_service_capability::Rpc { r#type: t as i32 },
            )),
        })
        .collect();
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn node_get_info_inner(
        &self,
        request: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        let deadline = self.deadline(&request);
        let config = &self.inner.config;
        let max_volumes_per_node = match config.max_volumes_per_node {
            // Checked at start to fit CSI's int64.
            Some(max) => i64::try_from(max).unwrap_or(i64::MAX),
            None => {
                let inventory = self
                    .inner
                    .dpu
                    .inventory(deadline)
                    .await
                    .map_err(Status::from)?;
                super::capacity::max_volumes(config, &inventory)
            }
        };
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: config.node_id.clone(),
            max_volumes_per_node,
            accessible_topology: Some(csi::Topology {
                segments: [(TOPOLOGY_KEY.to_string(), self.inner.config.dpu_name.clone())].into(),
            }),
        }))
    }
}

#[tonic::async_trait]
impl csi::node_server::Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let span = tracing::info_span!(
            "NodeStageVolume",
            volume_id = logged_id(&request.get_ref().volume_id)
        );
        traced(span, self.node_stage_volume_inner(request)).await
    }

    async fn node_unstage_volume(
        &self,
        request: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let span = tracing::info_span!(
            "NodeUnstageVolume",
            volume_id = logged_id(&request.get_ref().volume_id)
        );
        traced(span, self.node_unstage_volume_inner(request)).await
    }

    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let span = tracing::info_span!(
            "NodePublishVolume",
            volume_id = logged_id(&request.get_ref().volume_id)
        );
        traced(span, self.node_publish_volume_inner(request)).await
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let span = tracing::info_span!(
            "NodeUnpublishVolume",
            volume_id = logged_id(&request.get_ref().volume_id)
        );
        traced(span, self.node_unpublish_volume_inner(request)).await
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        let span = tracing::info_span!(
            "NodeGetVolumeStats",
            volume_id = logged_id(&request.get_ref().volume_id)
        );
        self.node_get_volume_stats_inner(request)
            .instrument(span)
            .await
    }

    async fn node_expand_volume(
        &self,
        request: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let span = tracing::info_span!(
            "NodeExpandVolume",
            volume_id = logged_id(&request.get_ref().volume_id)
        );
        traced(span, self.node_expand_volume_inner(request)).await
    }

    async fn node_get_capabilities(
        &self,
        request: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        let span = tracing::debug_span!("NodeGetCapabilities");
        self.node_get_capabilities_inner(request)
            .instrument(span)
            .await
    }

    async fn node_get_info(
        &self,
        request: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        let span = tracing::debug_span!("NodeGetInfo");
        self.node_get_info_inner(request).instrument(span).await
    }
}

/// A volume id as logs show it: cut to CSI's limit, since an oversize id is
/// refused, not worth a megabyte of log line.
fn logged_id(volume_id: &str) -> &str {
    let mut end = volume_id.len().min(crate::csi_limits::MAX_STRING_BYTES);
    while !volume_id.is_char_boundary(end) {
        end -= 1;
    }
    &volume_id[..end]
}

/// Runs an RPC's body in its span and logs a failure there, once: kubelet
/// retries without a word, so without this line an operator could not see
/// why a stage keeps failing. (Messages name objects, never secrets.)
async fn traced<T>(
    span: tracing::Span,
    body: impl std::future::Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    let result = body.instrument(span.clone()).await;
    if let Err(status) = &result {
        span.in_scope(
            || tracing::warn!(code = ?status.code(), "call failed: {}", status.message()),
        );
    }
    result
}

/// [`paths::confine`], which looks at each component of the path, except
/// that the mount point of a filesystem that shut down (xfs answers EIO even
/// to an lstat of it) is taken when its parent confines and the mount table
/// shows a mount exactly there: the root of a mount is a directory or a
/// device node, never a link. Unpublish, unstage and stats must reach it.
fn confine_path(root: &Path, requested: &str) -> Result<PathBuf, NodeError> {
    let error = match paths::confine(root, requested) {
        Err(error @ NodeError::Failed { .. }) => error,
        other => return other,
    };
    let requested = Path::new(requested);
    let (Some(parent), Some(name)) = (requested.parent(), requested.file_name()) else {
        return Err(error);
    };
    let Some(parent) = parent.to_str().and_then(|p| paths::confine(root, p).ok()) else {
        return Err(error);
    };
    let path = parent.join(name);
    match mountinfo::at(&path) {
        Ok(Some(_)) => Ok(path),
        _ => Err(error),
    }
}

/// Removes an empty mount point (a directory for filesystems, a file for
/// block volumes) once nothing is mounted on it; an absent one is fine.
fn remove_mount_point(target: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(target) {
        Ok(meta) if meta.is_dir() => match std::fs::remove_dir(target) {
            Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => Ok(()),
            other => other,
        },
        Ok(meta) if meta.is_file() && meta.len() == 0 => std::fs::remove_file(target),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}
