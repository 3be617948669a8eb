//! The CSI Node service: [`NodeService`], what its calls share (the
//! volume guard, deadlines, confined paths, finding the device), and the
//! gRPC trait, each call in its span. The calls themselves live by family:
//! `stage` (NodeStageVolume, NodeUnstageVolume), `publish`
//! (NodeUnpublishVolume, NodePublishVolume), `expand`, `volume_stats`;
//! NodeGetCapabilities and NodeGetInfo, a few lines each, here.
//!
//! Every call is idempotent and converges after a crash at any step: what
//! is true is read from the mount table, SNAP and sysfs; the only thing
//! remembered is the small [`VolumeRecord`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::config::NodeConfig;
use super::error::NodeError;
use super::fleet::Fleet;
use super::placing::Placing;
use super::records::{Records, VolumeRecord};
use super::{mountinfo, paths};
pub(crate) use crate::deadline::call_deadline;
use crate::dpu::HostLocator;
use crate::guard::{Busy, Held, VolumeGuard};
use crate::host::{BlockDevice, HostError, Sysfs};
use crate::proto::csi::v1 as csi;

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
    fleet: Arc<Fleet>,
    sysfs: Sysfs,
    records: Records,
    placing: Placing,
    guard: VolumeGuard,
}

impl NodeService {
    pub fn new(config: NodeConfig, fleet: Arc<Fleet>) -> std::io::Result<NodeService> {
        let records = Records::open(config.state_dir.join("volumes"))?;
        let placing = Placing::open(&config.state_dir.join("placing"))?;
        let sysfs = Sysfs::new(&config.sysfs_root);
        Ok(NodeService {
            inner: Arc::new(Inner {
                config,
                fleet,
                sysfs,
                records,
                placing,
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

    pub fn fleet(&self) -> &Arc<Fleet> {
        &self.inner.fleet
    }

    pub(super) fn records(&self) -> &Records {
        &self.inner.records
    }

    pub(super) fn placing(&self) -> &Placing {
        &self.inner.placing
    }

    pub(super) fn sysfs(&self) -> &Sysfs {
        &self.inner.sysfs
    }

    pub(super) fn deadline<T>(&self, request: &Request<T>) -> Instant {
        call_deadline(request, self.inner.config.call_timeout)
    }

    /// Holds the whole volume: stage, unstage and expand.
    pub(super) fn hold(&self, volume_id: &str) -> Result<Held, Busy> {
        self.inner.guard.try_hold(volume_id)
    }

    /// Holds one target path of the volume: publish and unpublish, which run
    /// together on different targets.
    pub(super) fn hold_target(&self, volume_id: &str, target: &Path) -> Result<Held, Busy> {
        self.inner.guard.try_hold_target(volume_id, target)
    }

    pub(super) fn confine(&self, what: &str, path: &str) -> Result<PathBuf, Status> {
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
    pub(super) fn staged_at(
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
        locator.find(&self.inner.sysfs).map_err(|e| match e {
            // Waiting cannot help, and the volume is fine: the host is not.
            HostError::NoUuid { .. } => Status::failed_precondition(e.to_string()),
            e => Status::internal(format!("looking for the host device: {e}")),
        })
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
        let started = Instant::now();
        let device_deadline = deadline.min(started + self.inner.config.device_wait);
        let found = self.poll_device(locator, device_deadline, |_| true).await?;
        // Waiting for the host to discover a hot-plugged disk is host time.
        let outcome = if found.is_ok() { "ok" } else { "timeout" };
        crate::metrics::observe_outbound("host", "device-wait", outcome, started.elapsed());
        found.map_err(|_| {
            Status::deadline_exceeded(format!(
                "the host did not see the device at {locator:?} in time"
            ))
        })
    }

    /// Looks at sysfs until it shows the device at `locator` in a state
    /// `ready` accepts, or `until` passes: that device, or else the last one
    /// seen (`None` if none was).
    pub(super) async fn poll_device(
        &self,
        locator: &HostLocator,
        until: Instant,
        ready: impl Fn(&BlockDevice) -> bool,
    ) -> Result<Result<BlockDevice, Option<BlockDevice>>, Status> {
        let mut last = None;
        let found = poll_until(until, || {
            Ok(match self.find_device(locator)? {
                Some(device) if ready(&device) => Some(device),
                seen => {
                    last = seen.or(last.take());
                    None
                }
            })
        })
        .await?;
        Ok(found.ok_or(last))
    }

    /// Where the volume's device is now, from its record (`None` if unstaged).
    pub(super) fn recorded(&self, volume_id: &str) -> Result<Option<VolumeRecord>, NodeError> {
        self.inner
            .records
            .load(volume_id)
            .map_err(|e| NodeError::state("reading the volume record", e))
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
            None => self.fleet_capacity(deadline).await?,
        };
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: config.node_id.clone(),
            max_volumes_per_node,
            accessible_topology: Some(csi::Topology {
                segments: self.fleet().topology(TOPOLOGY_KEY, &config.node_id),
            }),
        }))
    }

    /// The sum of every DPU's capacity ([`super::capacity`]). A DPU that
    /// does not answer adds nothing, so the limit never promises what it
    /// cannot stage (kubelet asks again when the node plugin restarts);
    /// none answering is that DPU's error.
    async fn fleet_capacity(&self, deadline: Instant) -> Result<i64, Status> {
        let members = self.fleet().members();
        let inventories =
            futures::future::join_all(members.iter().map(|m| m.dpu().inventory(deadline))).await;
        let mut sum: Option<i64> = None;
        let mut last_error = None;
        for (member, inventory) in members.iter().zip(inventories) {
            match inventory {
                Ok(inventory) => {
                    let max = super::capacity::max_volumes(&self.inner.config, &inventory);
                    sum = Some(sum.unwrap_or(0).saturating_add(max));
                }
                Err(e) => {
                    tracing::warn!(dpu = %member.name(), "NodeGetInfo counts without this DPU, which did not answer: {e}");
                    last_error = Some(e);
                }
            }
        }
        match (sum, last_error) {
            (Some(sum), _) => Ok(sum),
            (None, Some(e)) => Err(e.into()),
            (None, None) => unreachable!("a fleet has at least one DPU"),
        }
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

/// Looks until `look` finds what it looks for or `until` passes: what it
/// found, or `None`. Something hot-plugged shows up on the host some
/// milliseconds after SNAP's answer and a look costs a few sysfs reads, so
/// it looks often at first.
pub(super) async fn poll_until<T>(
    until: Instant,
    mut look: impl FnMut() -> Result<Option<T>, Status>,
) -> Result<Option<T>, Status> {
    let mut delay = Duration::from_millis(1);
    loop {
        if let Some(found) = look()? {
            return Ok(Some(found));
        }
        if Instant::now() + delay > until {
            return Ok(None);
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 3 / 2).min(Duration::from_millis(100));
    }
}
