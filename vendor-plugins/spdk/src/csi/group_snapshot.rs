//! CSI GroupController: crash-consistent snapshots of several volumes.
//!
//! A group snapshot is a record in `<state-dir>/group-snapshots/` (its id,
//! name, parameters, creation time and members) and one ordinary snapshot
//! per member: a snapshot id ([`super::ids::member_snapshot_id`]) with a
//! [`SnapshotRecord`] that names the group, so ListSnapshots and GetSnapshot
//! show members with `group_snapshot_id`, CreateVolume restores them, and
//! DeleteSnapshot refuses them (FAILED_PRECONDITION: CSI says a snapshot
//! that carries a group id is deleted only with its group).
//!
//! How the members are cut together is the backend's
//! ([`super::store::VolumeBackend::group_snapshot`]): NVMe-oF pauses every
//! member's subsystem around the snapshots, which is write-order consistent
//! under load, and the filesystem backend freezes every member's ext4
//! around the copies, likewise; AIO copies them in quick succession,
//! consistent only when the members are not written meanwhile (each module
//! says why). All members
//! are on one backend: a group across both could not be cut at one point
//! (FAILED_PRECONDITION, the spec's "cannot snapshot together").
//!
//! Idempotent by name: the same name with the same volumes (in any order)
//! and parameters answers the group made; another set is ALREADY_EXISTS.
//! The records are written before anything is cut; a group whose members
//! are not all there was interrupted, and the retry deletes what it has and
//! cuts every member again, in one window, since members cut at different
//! times would not be consistent. A failed cut removes what it made before
//! answering (the caller has no id to delete), under a deadline of its own.
//! Group snapshot operations run one at a time per controller (each waits
//! for the one before, within its deadline), which lets Create and Delete
//! first undo what an interrupted one left (the backend's `recover`).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use snap_csi::proto::csi::v1 as csi;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::CsiController;
use super::controller::{others, snapshot_message};
use super::ids::{
    check_name, group_snapshot_id, member_snapshot_id, parse_group_snapshot_id, parse_volume_id,
    slug,
};
use super::params::only_co_metadata;
use super::store::{SnapshotRecord, VolumeBackend};
use crate::backend::Kind;
use crate::errors::Failure;
use csi::group_controller_service_capability::rpc::Type as Capability;

/// Removing what a failed cut made gets this long, whatever is left of the
/// caller's deadline.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(10);

/// One group snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSnapshotRecord {
    pub group_snapshot_id: String,
    pub name: String,
    pub parameters: BTreeMap<String, String>,
    /// By volume id.
    pub members: Vec<Member>,
    pub created_seconds: i64,
    pub created_nanos: i32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub volume_id: String,
    pub snapshot_id: String,
}

impl GroupSnapshotRecord {
    /// The snapshot record of one member.
    fn member_record(&self, member: &Member) -> SnapshotRecord {
        SnapshotRecord {
            snapshot_id: member.snapshot_id.clone(),
            name: format!("{}/{}", self.name, member.volume_id),
            source_volume_id: member.volume_id.clone(),
            created_seconds: self.created_seconds,
            created_nanos: self.created_nanos,
            group_snapshot_id: self.group_snapshot_id.clone(),
        }
    }

    fn pairs(&self) -> Vec<(String, String)> {
        self.members
            .iter()
            .map(|m| (m.volume_id.clone(), m.snapshot_id.clone()))
            .collect()
    }

    fn snapshot_ids(&self) -> Vec<&str> {
        let mut ids: Vec<&str> = self
            .members
            .iter()
            .map(|m| m.snapshot_id.as_str())
            .collect();
        ids.sort_unstable();
        ids
    }
}

fn group_key(slug: &str) -> String {
    format!("group snapshot {slug}")
}

fn required_id(id: &str) -> Result<(), Status> {
    if id.is_empty() {
        Err(Status::invalid_argument("group_snapshot_id is required"))
    } else {
        Ok(())
    }
}

/// `snapshot_ids` must be the group's members (CSI: an SP that can detect a
/// mismatch reports it, INVALID_ARGUMENT).
fn check_members(record: &GroupSnapshotRecord, snapshot_ids: &[String]) -> Result<(), Status> {
    let mut given: Vec<&str> = snapshot_ids.iter().map(String::as_str).collect();
    given.sort_unstable();
    given.dedup();
    if given != record.snapshot_ids() {
        return Err(Status::invalid_argument(format!(
            "snapshot_ids {snapshot_ids:?} are not the members of group snapshot {}: {:?}",
            record.group_snapshot_id,
            record.snapshot_ids()
        )));
    }
    Ok(())
}

/// The source volumes of a CreateVolumeGroupSnapshot, checked and sorted,
/// and the one backend they are on.
fn parse_sources(ids: &[String]) -> Result<(Kind, Vec<String>), Status> {
    if ids.is_empty() {
        return Err(Status::invalid_argument("source_volume_ids is required"));
    }
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    if let Some(pair) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(Status::invalid_argument(format!(
            "source_volume_ids lists volume {:?} twice",
            pair[0]
        )));
    }
    let mut kinds = Vec::new();
    for id in &sorted {
        if id.is_empty() {
            return Err(Status::invalid_argument(
                "source_volume_ids holds an empty volume id",
            ));
        }
        let (kind, _) = parse_volume_id(id)
            .ok_or_else(|| Status::not_found(format!("source volume {id} does not exist")))?;
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    match kinds.as_slice() {
        [kind] => Ok((*kind, sorted)),
        _ => Err(Status::failed_precondition(
            "the source volumes are on different backends, which cannot be snapshotted at one \
             point in time: group volumes of one backend",
        )),
    }
}

fn now() -> (i64, i32) {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    (
        i64::try_from(now.as_secs()).unwrap_or(i64::MAX),
        i32::try_from(now.subsec_nanos()).unwrap_or(0),
    )
}

impl CsiController {
    fn group_snapshot_record(&self, id: &str) -> Result<Option<GroupSnapshotRecord>, Status> {
        self.inner
            .group_snapshots
            .load(id)
            .map_err(|e| Failure::record("reading the group snapshot", e).into())
    }

    /// Waits (within `deadline`) for the group snapshot operation before,
    /// then undoes what an interrupted one left.
    async fn group_snapshot_turn(
        &self,
        deadline: Instant,
    ) -> Result<tokio::sync::MutexGuard<'_, ()>, Status> {
        let turn = tokio::time::timeout_at(deadline, self.inner.group_snapshot_turn.lock())
            .await
            .map_err(|_| {
                Status::deadline_exceeded(
                    "another group snapshot operation was still running at the call's deadline",
                )
            })?;
        self.recover_group_snapshots().await?;
        Ok(turn)
    }

    /// Every backend's [`VolumeBackend::recover`]; the caller holds the turn.
    async fn recover_group_snapshots(&self) -> Result<(), Status> {
        for backend in self.backends() {
            backend.recover().await?;
        }
        Ok(())
    }

    /// Undoes what a group snapshot interrupted by the last run's crash left,
    /// before any call can start one; a failure is logged, and the next group
    /// snapshot operation tries again.
    pub async fn recover_at_start(&self) {
        let _turn = self.inner.group_snapshot_turn.lock().await;
        if let Err(status) = self.recover_group_snapshots().await {
            tracing::error!(
                "resuming what an interrupted group snapshot paused failed: {}; the next \
                 group snapshot operation retries",
                status.message()
            );
        }
    }

    async fn group_snapshot_message(
        &self,
        backend: &dyn VolumeBackend,
        record: &GroupSnapshotRecord,
        deadline: Instant,
    ) -> Result<csi::VolumeGroupSnapshot, Status> {
        let mut snapshots = Vec::with_capacity(record.members.len());
        for member in &record.members {
            let size = backend.snapshot_size(&member.snapshot_id, deadline).await?;
            let mut snapshot = snapshot_message(&record.member_record(member), size.unwrap_or(0));
            snapshot.ready_to_use = size.is_some();
            snapshots.push(snapshot);
        }
        Ok(csi::VolumeGroupSnapshot {
            group_snapshot_id: record.group_snapshot_id.clone(),
            ready_to_use: snapshots.iter().all(|s| s.ready_to_use),
            snapshots,
            creation_time: Some(prost_types::Timestamp {
                seconds: record.created_seconds,
                nanos: record.created_nanos,
            }),
        })
    }

    /// Removes the members' snapshots and records, then the group's record.
    async fn remove_group_snapshot(
        &self,
        backend: &dyn VolumeBackend,
        record: &GroupSnapshotRecord,
        deadline: Instant,
    ) -> Result<(), Status> {
        for member in &record.members {
            backend
                .delete_snapshot(&member.snapshot_id, deadline)
                .await?;
            backend
                .snapshot_records()
                .remove(&member.snapshot_id)
                .map_err(|e| Failure::record("removing a member's snapshot record", e))?;
        }
        self.inner
            .group_snapshots
            .remove(&record.group_snapshot_id)
            .map_err(|e| Failure::record("removing the group snapshot record", e).into())
    }

    /// Writes the records, then cuts every member in one window; on failure
    /// removes what it made.
    async fn cut_group(
        &self,
        backend: &dyn VolumeBackend,
        record: &GroupSnapshotRecord,
        deadline: Instant,
    ) -> Result<(), Status> {
        self.inner
            .group_snapshots
            .store(&record.group_snapshot_id, record)
            .map_err(|e| Failure::record("writing the group snapshot record", e))?;
        for member in &record.members {
            backend
                .snapshot_records()
                .store(&member.snapshot_id, &record.member_record(member))
                .map_err(|e| Failure::record("writing a member's snapshot record", e))?;
        }
        let cut = backend
            .group_snapshot(&record.group_snapshot_id, &record.pairs(), deadline)
            .await;
        if let Err(status) = cut {
            let cleanup = Instant::now() + CLEANUP_TIMEOUT;
            if let Err(left) = self.remove_group_snapshot(backend, record, cleanup).await {
                tracing::error!(
                    group_snapshot_id = %record.group_snapshot_id,
                    "removing a failed group snapshot: {}; a retry or DeleteVolumeGroupSnapshot \
                     removes the rest",
                    left.message()
                );
            }
            return Err(status);
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl csi::group_controller_server::GroupController for CsiController {
    async fn group_controller_get_capabilities(
        &self,
        _: Request<csi::GroupControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::GroupControllerGetCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::GroupControllerGetCapabilitiesResponse {
            capabilities: vec![csi::GroupControllerServiceCapability {
                r#type: Some(csi::group_controller_service_capability::Type::Rpc(
                    csi::group_controller_service_capability::Rpc {
                        r#type: Capability::CreateDeleteGetVolumeGroupSnapshot as i32,
                    },
                )),
            }],
        }))
    }

    async fn create_volume_group_snapshot(
        &self,
        request: Request<csi::CreateVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::CreateVolumeGroupSnapshotResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        check_name("name", &req.name).map_err(Status::invalid_argument)?;
        only_co_metadata("group snapshot", &req.parameters)?;
        let (kind, volumes) = parse_sources(&req.source_volume_ids)?;
        let backend = self.backend(kind).ok_or_else(|| {
            Status::not_found(format!(
                "source volume {} is on the {} backend, which this controller is not configured for",
                volumes[0],
                kind.as_str()
            ))
        })?;
        let id = group_snapshot_id(kind, &req.name);
        let _held = self.hold(group_key(&slug(&req.name)))?;
        let _turn = self.group_snapshot_turn(deadline).await?;
        for other in others(kind).map(|k| group_snapshot_id(k, &req.name)) {
            if self.group_snapshot_record(&other)?.is_some() {
                return Err(Status::already_exists(format!(
                    "a group snapshot named {:?} exists on another backend ({other})",
                    req.name
                )));
            }
        }
        let parameters: BTreeMap<String, String> = req.parameters.into_iter().collect();
        let existing = self.group_snapshot_record(&id)?;
        if let Some(existing) = &existing {
            let theirs: Vec<&str> = existing
                .members
                .iter()
                .map(|m| m.volume_id.as_str())
                .collect();
            if theirs != volumes || existing.parameters != parameters {
                return Err(Status::already_exists(format!(
                    "group snapshot {id} (name {:?}) exists of volumes {theirs:?} with its own \
                     parameters, not of {volumes:?} with these",
                    req.name
                )));
            }
            let message = self
                .group_snapshot_message(backend, existing, deadline)
                .await?;
            if message.ready_to_use {
                return Ok(Response::new(csi::CreateVolumeGroupSnapshotResponse {
                    group_snapshot: Some(message),
                }));
            }
            // Interrupted: its members were not all cut in one window.
            self.remove_group_snapshot(backend, existing, deadline)
                .await?;
        }
        for volume in &volumes {
            if backend.find(volume, deadline).await?.is_none() {
                return Err(Status::not_found(format!(
                    "source volume {volume} does not exist"
                )));
            }
        }
        let (created_seconds, created_nanos) = now();
        let record = GroupSnapshotRecord {
            group_snapshot_id: id.clone(),
            members: volumes
                .iter()
                .map(|v| Member {
                    volume_id: v.clone(),
                    snapshot_id: member_snapshot_id(kind, &req.name, v),
                })
                .collect(),
            name: req.name,
            parameters,
            created_seconds,
            created_nanos,
        };
        self.cut_group(backend, &record, deadline)
            .await
            .inspect_err(|s| {
                tracing::warn!(group_snapshot_id = %id, "CreateVolumeGroupSnapshot: {}", s.message())
            })?;
        tracing::info!(group_snapshot_id = %id, members = record.members.len(), "group snapshot created");
        let message = self
            .group_snapshot_message(backend, &record, deadline)
            .await?;
        if !message.ready_to_use {
            return Err(Status::aborted(format!(
                "a member of group snapshot {id} vanished as it was made"
            )));
        }
        Ok(Response::new(csi::CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(message),
        }))
    }

    async fn delete_volume_group_snapshot(
        &self,
        request: Request<csi::DeleteVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::DeleteVolumeGroupSnapshotResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        required_id(&req.group_snapshot_id)?;
        // Not an id we issue: no such group snapshot, which is done.
        let Some((kind, slug)) = parse_group_snapshot_id(&req.group_snapshot_id) else {
            return Ok(Response::new(csi::DeleteVolumeGroupSnapshotResponse {}));
        };
        let _held = self.hold(group_key(slug))?;
        let _turn = self.group_snapshot_turn(deadline).await?;
        let Some(record) = self.group_snapshot_record(&req.group_snapshot_id)? else {
            return Ok(Response::new(csi::DeleteVolumeGroupSnapshotResponse {}));
        };
        check_members(&record, &req.snapshot_ids)?;
        let backend =
            self.backend_of(kind, &format!("group snapshot {}", req.group_snapshot_id))?;
        self.remove_group_snapshot(backend, &record, deadline)
            .await
            .inspect_err(|s| {
                tracing::warn!(
                    group_snapshot_id = %req.group_snapshot_id,
                    "DeleteVolumeGroupSnapshot: {}",
                    s.message()
                )
            })?;
        tracing::info!(group_snapshot_id = %req.group_snapshot_id, "group snapshot deleted");
        Ok(Response::new(csi::DeleteVolumeGroupSnapshotResponse {}))
    }

    async fn get_volume_group_snapshot(
        &self,
        request: Request<csi::GetVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::GetVolumeGroupSnapshotResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        required_id(&req.group_snapshot_id)?;
        let not_found = || {
            Status::not_found(format!(
                "group snapshot {} does not exist",
                req.group_snapshot_id
            ))
        };
        let (kind, _) = parse_group_snapshot_id(&req.group_snapshot_id).ok_or_else(not_found)?;
        let backend = self.backend(kind).ok_or_else(not_found)?;
        let record = self
            .group_snapshot_record(&req.group_snapshot_id)?
            .ok_or_else(not_found)?;
        check_members(&record, &req.snapshot_ids)?;
        Ok(Response::new(csi::GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(
                self.group_snapshot_message(backend, &record, deadline)
                    .await?,
            ),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_one_backends_distinct_volumes() {
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            parse_sources(&ids(&["nvmf-b", "nvmf-a"])).unwrap(),
            (Kind::Nvmf, ids(&["nvmf-a", "nvmf-b"]))
        );
        let code = |v: &[&str]| parse_sources(&ids(v)).unwrap_err().code();
        assert_eq!(code(&[]), tonic::Code::InvalidArgument);
        assert_eq!(code(&["aio-a", "aio-a"]), tonic::Code::InvalidArgument);
        assert_eq!(code(&["aio-a", ""]), tonic::Code::InvalidArgument);
        assert_eq!(code(&["pvc-1"]), tonic::Code::NotFound);
        assert_eq!(code(&["aio-a", "nvmf-b"]), tonic::Code::FailedPrecondition);
    }
}
