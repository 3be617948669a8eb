//! The CSI Controller service.
//!
//! Every RPC checks its request before it touches a backend (a refused
//! request leaves nothing behind), holds the volume's (or snapshot's) name
//! against a concurrent call on it (ABORTED), and hands the caller's
//! deadline to every backend call. Volumes, snapshots and their ids are
//! described in [`super`] and [`super::ids`].
//!
//! Expansion is ONLINE on both backends: ControllerExpandVolume grows a
//! volume whether or not it is attached, and an attached one's host disk
//! grows with it. NVMe-oF: `bdev_lvol_resize` on the target, whose namespace
//! change SNAP's `bdev_nvme` sees. AIO: the file grows here, and the plugin
//! beside SNAP, which looks at every attached AIO volume's file each period
//! ([`crate::follow`]), `bdev_aio_rescan`s its bdev (the controller has no
//! socket to SNAP). The node then grows a filesystem (node_expansion_required
//! unless the volume is a raw block device). Filesystem volumes: the
//! volume's image and its mounted ext4 grow here ([`super::fs`]), which
//! every host sees at once.
//!
//! CSI's FAILED_PRECONDITION for a volume in use is for a plugin that cannot
//! grow one online. This controller never answers it: the plugin grows
//! every bdev it makes online in every configuration of its binary (its
//! follower cannot be turned off), and without `--dpu-plugin` the controller
//! could not tell a volume in use anyway (it sees neither SNAP nor the node;
//! with it, only DeleteVolume asks, [`super::in_use`]). Two things
//! outside it keep a host disk from following, each said where it is known:
//! a plugin that cannot see SNAP's files (a broken deployment: it logs it),
//! and an encrypted volume, whose crypto vbdev the node stacks on the
//! plugin's bdev and which SPDK v24.09 does not resize with its base, so it
//! grows at its next stage (the node knows it staged one).

use std::collections::HashMap;
use std::time::SystemTime;

use futures::future::try_join_all;
use snap_csi::proto::csi::v1 as csi;
use tonic::{Request, Response, Status};

use super::ids::{check_name, parse_snapshot_id, parse_volume_id, slug, snapshot_id, volume_id};
use super::params::{MULTIPATH_PARAM, Params, check_capabilities, is_block, only_co_metadata};
use super::sizes::Wanted;
use super::store::{Found, SnapshotRecord, Source, VolumeBackend};
use super::{CsiController, max_entries};
use crate::backend::Kind;
use crate::errors::Failure;
use crate::paging::{page_by, parse_token_of};
use crate::qos::QosLimits;
use csi::controller_service_capability::rpc::Type as Capability;
use csi::volume_content_source::Type as ContentType;

/// What this controller does, as ControllerGetCapabilities says it by default.
pub const CAPABILITIES: [Capability; 8] = [
    Capability::CreateDeleteVolume,
    Capability::ListVolumes,
    Capability::GetCapacity,
    Capability::CreateDeleteSnapshot,
    Capability::ListSnapshots,
    Capability::CloneVolume,
    Capability::ExpandVolume,
    Capability::ModifyVolume,
];

/// The capabilities listed: [`CAPABILITIES`], and GET_SNAPSHOT only when
/// told (`--advertise-get-snapshot`). GET_SNAPSHOT is CSI 1.12's, and the
/// sidecars built on CSI v1.11 that users run today crash on a value they
/// do not know (their gRPC logging dereferences nil turning it into text).
/// GetSnapshot itself is always served: a v1.11 sidecar has no such RPC to
/// call, and a newer one calls it only when it is listed.
pub fn capabilities(advertise_get_snapshot: bool) -> Vec<Capability> {
    let mut capabilities = CAPABILITIES.to_vec();
    if advertise_get_snapshot {
        capabilities.push(Capability::GetSnapshot);
    }
    capabilities
}

pub(super) fn volume_key(slug: &str) -> String {
    format!("volume {slug}")
}

fn snapshot_key(slug: &str) -> String {
    format!("snapshot {slug}")
}

/// Every backend but `kind`.
pub(super) fn others(kind: Kind) -> impl Iterator<Item = Kind> {
    Kind::ALL.into_iter().filter(move |k| *k != kind)
}

fn bytes(size: u64) -> i64 {
    i64::try_from(size).unwrap_or(i64::MAX)
}

pub(super) fn snapshot_message(record: &SnapshotRecord, size: u64) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: bytes(size),
        snapshot_id: record.snapshot_id.clone(),
        source_volume_id: record.source_volume_id.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: record.created_seconds,
            nanos: record.created_nanos,
        }),
        ready_to_use: true,
        group_snapshot_id: record.group_snapshot_id.clone(),
    }
}

/// Whether a volume reachable from `ours` is reachable from `term`: the
/// term has each of its segments.
fn within(ours: &HashMap<String, String>, term: &HashMap<String, String>) -> bool {
    ours.iter().all(|(key, value)| term.get(key) == Some(value))
}

/// A DPU-local backend can make a volume only for a CreateVolume whose
/// requisite topologies (if any) include its DPU: RESOURCE_EXHAUSTED
/// otherwise, as CSI says for a volume that cannot be made where asked.
fn check_requisite(
    backend: &dyn VolumeBackend,
    requirements: Option<&csi::TopologyRequirement>,
) -> Result<(), Status> {
    let (Some(ours), Some(requirements)) = (backend.topology(), requirements) else {
        return Ok(());
    };
    if requirements.requisite.is_empty()
        || requirements
            .requisite
            .iter()
            .any(|term| within(&ours, &term.segments))
    {
        return Ok(());
    }
    Err(Status::resource_exhausted(format!(
        "the {} backend's volumes can be used only where {ours:?} holds, and no requisite \
         topology has it",
        backend.kind().as_str()
    )))
}

/// The source of a CreateVolume, parsed: an id we could not have issued
/// names nothing that exists.
fn parse_source(source: &csi::VolumeContentSource) -> Result<(Kind, Source), Status> {
    match &source.r#type {
        Some(ContentType::Snapshot(s)) => match parse_snapshot_id(&s.snapshot_id) {
            Some((kind, _)) => Ok((kind, Source::Snapshot(s.snapshot_id.clone()))),
            None => Err(Status::not_found(format!(
                "source snapshot {:?} does not exist",
                s.snapshot_id
            ))),
        },
        Some(ContentType::Volume(v)) => match parse_volume_id(&v.volume_id) {
            Some((kind, _)) => Ok((kind, Source::Volume(v.volume_id.clone()))),
            None => Err(Status::not_found(format!(
                "source volume {:?} does not exist",
                v.volume_id
            ))),
        },
        None => Err(Status::invalid_argument(
            "volume_content_source names neither a snapshot nor a volume",
        )),
    }
}

impl CsiController {
    pub(super) fn volume_message(
        &self,
        backend: &dyn VolumeBackend,
        volume_id: &str,
        size: u64,
        passed: &HashMap<String, String>,
        multipath: bool,
        source: Option<csi::VolumeContentSource>,
    ) -> csi::Volume {
        let mut context = backend.context(volume_id, multipath);
        context.extend(passed.iter().map(|(k, v)| (k.clone(), v.clone())));
        csi::Volume {
            capacity_bytes: bytes(size),
            volume_id: volume_id.to_string(),
            volume_context: context,
            content_source: source,
            accessible_topology: backend
                .topology()
                .map(|segments| csi::Topology { segments })
                .into_iter()
                .collect(),
        }
    }

    /// The size of a CreateVolume's source, which must exist.
    async fn source_size(
        &self,
        backend: &dyn VolumeBackend,
        source: &Source,
        deadline: tokio::time::Instant,
    ) -> Result<u64, Status> {
        let size = match source {
            Source::Snapshot(id) => backend.snapshot_size(id, deadline).await?,
            Source::Volume(id) => backend.find(id, deadline).await?.map(|f| f.size),
        };
        size.ok_or_else(|| {
            let (what, id) = match source {
                Source::Snapshot(id) => ("snapshot", id),
                Source::Volume(id) => ("volume", id),
            };
            Status::not_found(format!("source {what} {id} does not exist"))
        })
    }

    /// A volume name already used on another backend is ALREADY_EXISTS.
    async fn refuse_other_backends(
        &self,
        kind: Kind,
        name: &str,
        deadline: tokio::time::Instant,
    ) -> Result<(), Status> {
        for backend in others(kind).filter_map(|k| self.backend(k)) {
            let id = volume_id(backend.kind(), name);
            if backend.find(&id, deadline).await?.is_some() {
                return Err(Status::already_exists(format!(
                    "a volume named {name:?} exists on the {} backend ({id})",
                    backend.kind().as_str()
                )));
            }
        }
        Ok(())
    }

    /// Whether a volume group holds `volume_id`.
    pub(super) fn group_of(&self, volume_id: &str) -> Result<Option<String>, Status> {
        let groups = self
            .inner
            .groups
            .all::<super::volume_group::GroupRecord>()
            .map_err(|e| Failure::record("reading volume groups", e))?;
        Ok(groups
            .into_iter()
            .flatten()
            .find(|g| g.volume_ids.iter().any(|v| v == volume_id))
            .map(|g| g.group_id))
    }

    /// Deletes a volume of ours; `volume_id` parsed to `kind`.
    pub(super) async fn delete_volume_of(
        &self,
        kind: Kind,
        volume_id: &str,
        deadline: tokio::time::Instant,
    ) -> Result<(), Status> {
        let backend = self.backend_of(kind, &format!("volume {volume_id}"))?;
        backend.delete(volume_id, deadline).await?;
        tracing::info!(%volume_id, "volume deleted");
        Ok(())
    }

    /// A snapshot whose data exists, with its record.
    async fn snapshot_of(
        &self,
        backend: &dyn VolumeBackend,
        snapshot_id: &str,
        deadline: tokio::time::Instant,
    ) -> Result<Option<(SnapshotRecord, u64)>, Status> {
        let record: Option<SnapshotRecord> = backend
            .snapshot_records()
            .load(snapshot_id)
            .map_err(|e| Failure::record("reading a snapshot record", e))?;
        let Some(record) = record else {
            return Ok(None);
        };
        let size = backend.snapshot_size(snapshot_id, deadline).await?;
        Ok(size.map(|size| (record, size)))
    }

    /// Every finished snapshot of every backend.
    async fn all_snapshots(
        &self,
        deadline: tokio::time::Instant,
    ) -> Result<Vec<csi::Snapshot>, Status> {
        let per_backend = try_join_all(self.backends().map(|backend| async move {
            let sizes = backend.snapshot_sizes(deadline).await?;
            let records = backend
                .snapshot_records()
                .all::<SnapshotRecord>()
                .map_err(|e| Failure::record("reading snapshot records", e))?;
            Ok::<_, Status>(
                records
                    .into_iter()
                    .filter_map(|r| {
                        r.inspect_err(|(path, e)| {
                            tracing::warn!(path = %path.display(), "unreadable snapshot record: {e}");
                        })
                        .ok()
                    })
                    .filter_map(|r| sizes.get(&r.snapshot_id).map(|&s| snapshot_message(&r, s)))
                    .collect::<Vec<_>>(),
            )
        }))
        .await?;
        Ok(per_backend.into_iter().flatten().collect())
    }
}

#[tonic::async_trait]
impl csi::controller_server::Controller for CsiController {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        check_name("name", &req.name).map_err(Status::invalid_argument)?;
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities is required"));
        }
        let mut params = Params::parse(&req.parameters).map_err(Status::invalid_argument)?;
        // CSI: mutable parameters take precedence over the parameters.
        params.qos = params.qos.overlaid(
            QosLimits::from_mutable(&req.mutable_parameters).map_err(Status::invalid_argument)?,
        );
        let wanted = Wanted::from_range(req.capacity_range.as_ref())?;
        let source = req
            .volume_content_source
            .as_ref()
            .map(parse_source)
            .transpose()?;
        let kind = params
            .kind(source.as_ref().map(|(k, _)| *k), self.inner.default_backend)
            .map_err(Status::invalid_argument)?;
        check_capabilities(kind, &req.volume_capabilities).map_err(Status::invalid_argument)?;
        params.passed.extend(params.qos.context());
        if let Some((source_kind, _)) = &source
            && *source_kind != kind
        {
            return Err(Status::invalid_argument(format!(
                "a {} volume cannot be made from a source on the {} backend",
                kind.as_str(),
                source_kind.as_str()
            )));
        }
        let backend = self.backend(kind).ok_or_else(|| {
            Status::invalid_argument(format!(
                "backend {:?} is not configured on this controller",
                kind.as_str()
            ))
        })?;
        if params.multipath && backend.paths() < 2 {
            return Err(Status::invalid_argument(format!(
                "parameter {MULTIPATH_PARAM:?} asks for two paths or more to the volume, but \
                 this controller's NVMe-oF target has one listener (give --nvmf-listen once per \
                 listener)"
            )));
        }
        check_requisite(backend, req.accessibility_requirements.as_ref())?;
        let source = source.map(|(_, s)| s);
        let id = volume_id(kind, &req.name);
        let _held = self.hold(volume_key(&slug(&req.name)))?;
        self.refuse_other_backends(kind, &req.name, deadline)
            .await?;

        let found = backend.find(&id, deadline).await?;
        let reply = |size| {
            Ok(Response::new(csi::CreateVolumeResponse {
                volume: Some(self.volume_message(
                    backend,
                    &id,
                    size,
                    &params.passed,
                    params.multipath,
                    req.volume_content_source.clone(),
                )),
            }))
        };
        match found {
            Some(Found {
                size,
                complete: true,
            }) => {
                if wanted.admits(size) {
                    return reply(size);
                }
                return Err(Status::already_exists(format!(
                    "volume {id} (name {:?}) exists with {size} bytes, outside the capacity range asked",
                    req.name
                )));
            }
            Some(Found { size, .. }) if wanted.limit.is_some_and(|l| size > l) => {
                return Err(Status::already_exists(format!(
                    "volume {id} exists with {size} bytes, more than the limit asked"
                )));
            }
            _ => {}
        }
        let room = backend.room(deadline).await?;
        let floor = match &source {
            Some(source) => self.source_size(backend, source, deadline).await?,
            None => 0,
        };
        let size = wanted.choose(room.unit, floor)?;
        if found.is_none() {
            room.check("a volume", size)?;
        }
        let size = backend
            .create(&id, size, source.as_ref(), &params.qos, deadline)
            .await
            .inspect_err(|s| tracing::warn!(volume_id = %id, "CreateVolume: {}", s.message()))?;
        tracing::info!(volume_id = %id, size, "volume created");
        reply(size)
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        // Not an id we issue: no such volume, which is done.
        let Some((kind, slug)) = parse_volume_id(&req.volume_id) else {
            return Ok(Response::new(csi::DeleteVolumeResponse {}));
        };
        // A backend not configured here is refused before any DPU is asked.
        self.backend_of(kind, &format!("volume {}", req.volume_id))?;
        self.refuse_in_use(&[&req.volume_id], deadline).await?;
        let _held = self.hold(volume_key(slug))?;
        if let Some(group) = self.group_of(&req.volume_id)? {
            return Err(Status::failed_precondition(format!(
                "volume {} belongs to volume group {group}: remove it from the group first",
                req.volume_id
            )));
        }
        self.delete_volume_of(kind, &req.volume_id, deadline)
            .await
            .inspect_err(
                |s| tracing::warn!(volume_id = %req.volume_id, "DeleteVolume: {}", s.message()),
            )?;
        Ok(Response::new(csi::DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        _: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "volumes need no controller publish: the node attaches them through SNAP",
        ))
    }

    async fn controller_unpublish_volume(
        &self,
        _: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "volumes need no controller unpublish: the node detaches them",
        ))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities is required"));
        }
        let not_found = || Status::not_found(format!("volume {} does not exist", req.volume_id));
        let (kind, _) = parse_volume_id(&req.volume_id).ok_or_else(not_found)?;
        let backend = self.backend(kind).ok_or_else(not_found)?;
        backend
            .find(&req.volume_id, deadline)
            .await?
            .ok_or_else(not_found)?;
        let verdict = check_capabilities(kind, &req.volume_capabilities).and_then(|()| {
            let mut params = Params::parse(&req.parameters)?;
            params.qos = params
                .qos
                .overlaid(QosLimits::from_mutable(&req.mutable_parameters)?);
            params.check_for(kind)
        });
        let response = match verdict {
            Ok(()) => csi::ValidateVolumeCapabilitiesResponse {
                confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                    mutable_parameters: req.mutable_parameters,
                }),
                message: String::new(),
            },
            Err(why) => csi::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: why,
            },
        };
        Ok(Response::new(response))
    }

    async fn list_volumes(
        &self,
        request: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        let max = max_entries(req.max_entries)?;
        let after = parse_token_of(&req.starting_token, |t| parse_volume_id(t).is_some())?;
        let listed = try_join_all(self.backends().map(|backend| async move {
            let volumes = backend.volumes(deadline).await?;
            Ok::<_, Status>(
                volumes
                    .into_iter()
                    .map(|(id, size)| {
                        self.volume_message(backend, &id, size, &HashMap::new(), false, None)
                    })
                    .collect::<Vec<_>>(),
            )
        }))
        .await?;
        let all: Vec<csi::Volume> = listed.into_iter().flatten().collect();
        let (page, next_token) = page_by(all, |v| v.volume_id.as_str(), after, max);
        Ok(Response::new(csi::ListVolumesResponse {
            entries: page
                .into_iter()
                .map(|volume| csi::list_volumes_response::Entry {
                    volume: Some(volume),
                    status: None,
                })
                .collect(),
            next_token,
        }))
    }

    async fn get_capacity(
        &self,
        request: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        let kind = Params::parse(&req.parameters)
            .and_then(|p| p.kind(None, self.inner.default_backend))
            .map_err(Status::invalid_argument)?;
        let nothing = Response::new(csi::GetCapacityResponse {
            available_capacity: 0,
            maximum_volume_size: None,
            minimum_volume_size: None,
        });
        let Some(backend) = self.backend(kind) else {
            return Ok(nothing);
        };
        if !req.volume_capabilities.is_empty()
            && check_capabilities(kind, &req.volume_capabilities).is_err()
        {
            return Ok(nothing);
        }
        // A DPU-local pool has nothing for a segment its DPU is not in.
        if let (Some(ours), Some(asked)) = (backend.topology(), &req.accessible_topology)
            && !within(&ours, &asked.segments)
        {
            return Ok(nothing);
        }
        let room = backend.room(deadline).await?;
        Ok(Response::new(csi::GetCapacityResponse {
            available_capacity: bytes(room.available),
            maximum_volume_size: Some(bytes(room.available.min(room.total))),
            minimum_volume_size: Some(bytes(room.unit)),
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        let capabilities = capabilities(self.inner.advertise_get_snapshot)
            .into_iter()
            .map(|c| csi::ControllerServiceCapability {
                r#type: Some(csi::controller_service_capability::Type::Rpc(
                    csi::controller_service_capability::Rpc { r#type: c as i32 },
                )),
            })
            .collect();
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn create_snapshot(
        &self,
        request: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        if req.source_volume_id.is_empty() {
            return Err(Status::invalid_argument("source_volume_id is required"));
        }
        check_name("name", &req.name).map_err(Status::invalid_argument)?;
        only_co_metadata("snapshot", &req.parameters)?;
        let source = &req.source_volume_id;
        let not_found = || Status::not_found(format!("source volume {source} does not exist"));
        let (kind, _) = parse_volume_id(source).ok_or_else(not_found)?;
        let backend = self.backend(kind).ok_or_else(not_found)?;
        let id = snapshot_id(kind, &req.name);
        let _held = self.hold(snapshot_key(&slug(&req.name)))?;
        for other in others(kind).filter_map(|k| self.backend(k)) {
            let other_id = snapshot_id(other.kind(), &req.name);
            if self
                .snapshot_of(other, &other_id, deadline)
                .await?
                .is_some()
            {
                return Err(Status::already_exists(format!(
                    "a snapshot named {:?} exists on the {} backend ({other_id})",
                    req.name,
                    other.kind().as_str()
                )));
            }
        }
        if let Some((record, size)) = self.snapshot_of(backend, &id, deadline).await? {
            if record.source_volume_id != *source {
                return Err(Status::already_exists(format!(
                    "snapshot {id} (name {:?}) is of volume {}, not {source}",
                    req.name, record.source_volume_id
                )));
            }
            return Ok(Response::new(csi::CreateSnapshotResponse {
                snapshot: Some(snapshot_message(&record, size)),
            }));
        }
        backend
            .find(source, deadline)
            .await?
            .ok_or_else(not_found)?;
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let record = SnapshotRecord {
            snapshot_id: id.clone(),
            name: req.name.clone(),
            source_volume_id: source.clone(),
            created_seconds: i64::try_from(now.as_secs()).unwrap_or(i64::MAX),
            created_nanos: i32::try_from(now.subsec_nanos()).unwrap_or(0),
            group_snapshot_id: String::new(),
        };
        // The record first: data without a record could not say its source.
        backend
            .snapshot_records()
            .store(&id, &record)
            .map_err(|e| Failure::record("writing the snapshot record", e))?;
        backend.snapshot(source, &id, deadline).await.inspect_err(
            |s| tracing::warn!(snapshot_id = %id, "CreateSnapshot: {}", s.message()),
        )?;
        let size = backend
            .snapshot_size(&id, deadline)
            .await?
            .ok_or_else(|| Status::aborted(format!("snapshot {id} vanished as it was made")))?;
        tracing::info!(snapshot_id = %id, source_volume_id = %source, "snapshot created");
        Ok(Response::new(csi::CreateSnapshotResponse {
            snapshot: Some(snapshot_message(&record, size)),
        }))
    }

    async fn delete_snapshot(
        &self,
        request: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        if req.snapshot_id.is_empty() {
            return Err(Status::invalid_argument("snapshot_id is required"));
        }
        let Some((kind, slug)) = parse_snapshot_id(&req.snapshot_id) else {
            return Ok(Response::new(csi::DeleteSnapshotResponse {}));
        };
        let backend = self.backend_of(kind, &format!("snapshot {}", req.snapshot_id))?;
        let _held = self.hold(snapshot_key(slug))?;
        let record: Option<SnapshotRecord> = backend
            .snapshot_records()
            .load(&req.snapshot_id)
            .map_err(|e| Failure::record("reading the snapshot record", e))?;
        if let Some(group) = record
            .map(|r| r.group_snapshot_id)
            .filter(|g| !g.is_empty())
        {
            return Err(Status::failed_precondition(format!(
                "snapshot {} belongs to group snapshot {group}: delete the group snapshot",
                req.snapshot_id
            )));
        }
        backend
            .delete_snapshot(&req.snapshot_id, deadline)
            .await
            .inspect_err(|s| {
                tracing::warn!(snapshot_id = %req.snapshot_id, "DeleteSnapshot: {}", s.message())
            })?;
        backend
            .snapshot_records()
            .remove(&req.snapshot_id)
            .map_err(|e| Failure::record("removing the snapshot record", e))?;
        tracing::info!(snapshot_id = %req.snapshot_id, "snapshot deleted");
        Ok(Response::new(csi::DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        request: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        let max = max_entries(req.max_entries)?;
        let after = parse_token_of(&req.starting_token, |t| parse_snapshot_id(t).is_some())?;
        let snapshots = if req.snapshot_id.is_empty() {
            self.all_snapshots(deadline).await?
        } else {
            let one = match parse_snapshot_id(&req.snapshot_id)
                .and_then(|(kind, _)| self.backend(kind))
            {
                Some(backend) => {
                    self.snapshot_of(backend, &req.snapshot_id, deadline)
                        .await?
                }
                None => None,
            };
            one.map(|(record, size)| snapshot_message(&record, size))
                .into_iter()
                .collect()
        };
        let matching: Vec<csi::Snapshot> = snapshots
            .into_iter()
            .filter(|s| {
                req.source_volume_id.is_empty() || s.source_volume_id == req.source_volume_id
            })
            .collect();
        let (page, next_token) = page_by(matching, |s| s.snapshot_id.as_str(), after, max);
        Ok(Response::new(csi::ListSnapshotsResponse {
            entries: page
                .into_iter()
                .map(|s| csi::list_snapshots_response::Entry { snapshot: Some(s) })
                .collect(),
            next_token,
        }))
    }

    async fn get_snapshot(
        &self,
        request: Request<csi::GetSnapshotRequest>,
    ) -> Result<Response<csi::GetSnapshotResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        if req.snapshot_id.is_empty() {
            return Err(Status::invalid_argument("snapshot_id is required"));
        }
        let not_found =
            || Status::not_found(format!("snapshot {} does not exist", req.snapshot_id));
        let (kind, _) = parse_snapshot_id(&req.snapshot_id).ok_or_else(not_found)?;
        let backend = self.backend(kind).ok_or_else(not_found)?;
        let (record, size) = self
            .snapshot_of(backend, &req.snapshot_id, deadline)
            .await?
            .ok_or_else(not_found)?;
        Ok(Response::new(csi::GetSnapshotResponse {
            snapshot: Some(snapshot_message(&record, size)),
        }))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        let range = req
            .capacity_range
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("capacity_range is required"))?;
        let wanted = Wanted::from_range(Some(range))?;
        let not_found = || Status::not_found(format!("volume {} does not exist", req.volume_id));
        let (kind, slug) = parse_volume_id(&req.volume_id).ok_or_else(not_found)?;
        if let Some(capability) = &req.volume_capability {
            check_capabilities(kind, std::slice::from_ref(capability))
                .map_err(Status::invalid_argument)?;
        }
        let backend = self.backend(kind).ok_or_else(not_found)?;
        let _held = self.hold(volume_key(slug))?;
        let found = backend
            .find(&req.volume_id, deadline)
            .await?
            .ok_or_else(not_found)?;
        let reply = |size| {
            Ok(Response::new(csi::ControllerExpandVolumeResponse {
                capacity_bytes: bytes(size),
                // A filesystem volume grows on the share: nothing to grow on the node.
                node_expansion_required: kind.is_block()
                    && !is_block(req.volume_capability.as_ref()),
            }))
        };
        if found.size >= wanted.required {
            if wanted.limit.is_some_and(|l| found.size > l) {
                return Err(Status::out_of_range(format!(
                    "volume {} has {} bytes already, more than limit_bytes; volumes do not shrink",
                    req.volume_id, found.size
                )));
            }
            return reply(found.size);
        }
        let room = backend.room(deadline).await?;
        let size = wanted.choose(room.unit, found.size)?;
        if size > room.total {
            room.check("the expanded volume", size)?;
        }
        room.check("the growth", size - found.size)?;
        backend
            .expand(&req.volume_id, size, deadline)
            .await
            .inspect_err(
                |s| tracing::warn!(volume_id = %req.volume_id, "ControllerExpandVolume: {}", s.message()),
            )?;
        tracing::info!(volume_id = %req.volume_id, size, "volume expanded");
        reply(size)
    }

    async fn controller_get_volume(
        &self,
        _: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        Err(Status::unimplemented("ControllerGetVolume is not offered"))
    }

    async fn controller_modify_volume(
        &self,
        request: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        self.modify_volume(request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_must_be_ids_we_issue() {
        let snapshot = csi::VolumeContentSource {
            r#type: Some(ContentType::Snapshot(
                csi::volume_content_source::SnapshotSource {
                    snapshot_id: snapshot_id(Kind::Nvmf, "s1"),
                },
            )),
        };
        assert_eq!(
            parse_source(&snapshot).unwrap(),
            (Kind::Nvmf, Source::Snapshot("snap-nvmf-s1".into()))
        );
        let foreign = csi::VolumeContentSource {
            r#type: Some(ContentType::Volume(
                csi::volume_content_source::VolumeSource {
                    volume_id: "pvc-1".into(),
                },
            )),
        };
        assert_eq!(
            parse_source(&foreign).unwrap_err().code(),
            tonic::Code::NotFound
        );
        let empty = csi::VolumeContentSource { r#type: None };
        assert_eq!(
            parse_source(&empty).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}
