//! What the controller asks of a backend, and the records it keeps beside
//! a backend's data.
//!
//! Volumes keep no record: a backend's own objects (the pool's files, the
//! target's lvols and subsystems) are named by volume id and found by it.
//! A snapshot's source volume and creation time are facts SPDK v24.09 has
//! no field for, so each snapshot has a small [`SnapshotRecord`] (where the
//! backend says: the AIO pool keeps them in the pool, the NVMe-oF backend in
//! the state directory). The record is written before the snapshot is cut
//! and removed after its data; a record whose data is missing is an
//! unfinished CreateSnapshot and is neither listed nor binding.

use std::collections::HashMap;
use std::fmt::Debug;

use serde::{Deserialize, Serialize};
use snap_csi::json_dir::JsonDir;
use tokio::time::Instant;
use tonic::Status;

use super::sizes::Room;
use crate::backend::Kind;
use crate::qos::QosLimits;

/// What a new volume is filled from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A snapshot of this backend, by snapshot id.
    Snapshot(String),
    /// A volume of this backend, by volume id.
    Volume(String),
}

/// A volume found in its backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub size: u64,
    /// False while a CreateVolume that was interrupted has not finished it
    /// (an lvol not yet exported): the next CreateVolume finishes it.
    pub complete: bool,
}

/// One backend's volumes and snapshots. Every method is idempotent: making
/// what exists or removing what is absent succeeds.
#[async_trait::async_trait]
pub trait VolumeBackend: Send + Sync + Debug {
    fn kind(&self) -> Kind;

    /// The volume context CreateDevice needs for `volume_id`; with
    /// `multipath`, every path to it the backend has ([`Self::paths`]).
    fn context(&self, volume_id: &str, multipath: bool) -> HashMap<String, String>;

    /// Where the backend's volumes can be used when that is not every host:
    /// the topology segments of a DPU-local backend's one DPU. `None`:
    /// everywhere.
    fn topology(&self) -> Option<HashMap<String, String>> {
        None
    }

    /// How many network paths lead to a volume (an NVMe-oF target's
    /// listeners); a local one has one.
    fn paths(&self) -> usize {
        1
    }

    /// Capacity and allocation unit.
    async fn room(&self, deadline: Instant) -> Result<Room, Status>;

    async fn find(&self, volume_id: &str, deadline: Instant) -> Result<Option<Found>, Status>;

    /// Every volume and its size.
    async fn volumes(&self, deadline: Instant) -> Result<Vec<(String, u64)>, Status>;

    /// Makes the volume, or finishes making it, `size` bytes (at least the
    /// source's) filled from `source`, with QoS limits `qos` (none: no
    /// limits) set before it is complete; answers its size.
    async fn create(
        &self,
        volume_id: &str,
        size: u64,
        source: Option<&Source>,
        qos: &QosLimits,
        deadline: Instant,
    ) -> Result<u64, Status>;

    /// Sets the QoS limits `limits` gives on an existing volume, keeping the
    /// others (each backend's module says when they take effect).
    async fn set_qos(
        &self,
        volume_id: &str,
        limits: &QosLimits,
        deadline: Instant,
    ) -> Result<(), Status>;

    async fn delete(&self, volume_id: &str, deadline: Instant) -> Result<(), Status>;

    /// Grows the volume to `size` bytes.
    async fn expand(&self, volume_id: &str, size: u64, deadline: Instant) -> Result<(), Status>;

    /// Cuts snapshot `snapshot_id` of `volume_id` unless it exists.
    async fn snapshot(
        &self,
        volume_id: &str,
        snapshot_id: &str,
        deadline: Instant,
    ) -> Result<(), Status>;

    /// Sizes of the snapshots whose data exists, by snapshot id.
    async fn snapshot_sizes(&self, deadline: Instant) -> Result<HashMap<String, u64>, Status>;

    /// The size of one snapshot, if its data exists.
    async fn snapshot_size(
        &self,
        snapshot_id: &str,
        deadline: Instant,
    ) -> Result<Option<u64>, Status>;

    async fn delete_snapshot(&self, snapshot_id: &str, deadline: Instant) -> Result<(), Status>;

    /// Cuts every `(volume id, snapshot id)` of `members` (group snapshot
    /// `group_snapshot_id`) at one point of the
    /// stream of writes to them, as far as the backend can (each backend's
    /// module says how far); members whose snapshot exists are cut again
    /// with the rest only after the caller deleted them.
    async fn group_snapshot(
        &self,
        group_snapshot_id: &str,
        members: &[(String, String)],
        deadline: Instant,
    ) -> Result<(), Status>;

    /// Undoes what a group snapshot interrupted by a crash left in force
    /// (NVMe-oF: subsystems left paused). Called at start-up and before
    /// every group snapshot operation, never during one.
    async fn recover(&self) -> Result<(), Status> {
        Ok(())
    }

    /// Volumes whose export the backend lost and which [`Self::export_again`]
    /// restores (an NVMe-oF target restarted); the others never lose one.
    async fn lost_exports(&self, _deadline: Instant) -> Result<Vec<String>, Status> {
        Ok(Vec::new())
    }

    /// Exports `volume_id` again as it was; a volume gone meanwhile stays gone.
    async fn export_again(&self, _volume_id: &str, _deadline: Instant) -> Result<(), Status> {
        Ok(())
    }

    /// Where this backend's snapshot records are.
    fn snapshot_records(&self) -> &JsonDir;

    /// Whether the backend can serve calls now; the reason when not.
    async fn probe(&self, deadline: Instant) -> Result<(), String>;
}

/// A group snapshot by a backend that cannot stop writes: each member
/// snapshotted in turn between two readings of every member's stamp (what
/// a write changes). A member whose stamp moved was written meanwhile, so
/// the snapshots are not of one instant: FAILED_PRECONDITION naming it,
/// ending with `needs` (what the backend needs for one); the caller's
/// cleanup removes the snapshots.
pub async fn snapshot_if_unchanged<B, S, F>(
    backend: &B,
    members: &[(String, String)],
    stamps: impl Fn() -> F,
    (needs, deadline): (&str, Instant),
) -> Result<(), Status>
where
    B: VolumeBackend + ?Sized,
    S: PartialEq,
    F: Future<Output = Result<Vec<S>, Status>>,
{
    let before = stamps().await?;
    for (volume_id, snapshot_id) in members {
        backend.snapshot(volume_id, snapshot_id, deadline).await?;
    }
    let after = stamps().await?;
    match members
        .iter()
        .zip(before.iter().zip(&after))
        .find(|(_, (b, a))| b != a)
    {
        Some(((volume_id, _), _)) => Err(Status::failed_precondition(format!(
            "volume {volume_id} was written while the group was snapshotted, so the snapshots \
             are not of one instant: {needs}"
        ))),
        None => Ok(()),
    }
}

/// What SPDK cannot hold about a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub snapshot_id: String,
    /// The CSI name it was created under.
    pub name: String,
    pub source_volume_id: String,
    pub created_seconds: i64,
    pub created_nanos: i32,
    /// The group snapshot it belongs to, if any: such a snapshot is deleted
    /// only with its group.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group_snapshot_id: String,
}
