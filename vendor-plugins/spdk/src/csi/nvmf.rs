//! The NVMe-oF backend: a volume is a thin lvol `<lvstore>/<volume id>` on a
//! remote SPDK target, exported as subsystem `nqn.2024-01.io.snap-csi:<volume
//! id>` (any host, one namespace, a TCP listener at each `--nvmf-listen`); a
//! snapshot is an lvol snapshot `<lvstore>/<snapshot id>`, its record kept in
//! the controller's state directory. A volume's context names the first
//! listener as its path (`traddr`, `trsvcid`); with the parameter
//! `nvmf-multipath: "true"` (and more than one listener) also the others
//! (`extra_paths`), which the plugin attaches as one multipath device.
//!
//! Every step is idempotent against SPDK v24.09's own replies to a repeat
//! (`spdk-v24.09-vendor-calls.txt`): an lvol name taken is -17 from
//! `bdev_lvol_create` and -32602 "File exists" from the snapshot and clone
//! callbacks; a second subsystem is -32603 and a second namespace or listener
//! -32602, so those are checked against `nvmf_get_subsystems` before being
//! taken as done; deleting what is gone is -19, or -32602 for a subsystem.
//!
//! Volumes never depend on snapshots or on each other (CSI asks that
//! volumes be independent of snapshots): a volume made from a snapshot is
//! `bdev_lvol_clone`d and then `bdev_lvol_decouple_parent`ed until it has no
//! parent, which copies what it reads from its snapshots and keeps it thin
//! where they are thin. A volume made from a volume clones a temporary
//! snapshot `tmp-<new volume id>` of the source the same way and then
//! deletes it (its one remaining clone, the source, takes its clusters
//! back). So a snapshot's only clone is its source volume (or a later
//! snapshot of it) and SPDK's rule that an lvol with two clones cannot be
//! deleted never stops a DeleteSnapshot or DeleteVolume, except for a
//! snapshot a CreateVolume is copying at that moment (FAILED_PRECONDITION).
//!
//! QoS limits ([`crate::qos`]) are `bdev_set_qos_limit` on the volume's lvol
//! on the target, which enforces them for every I/O the subsystem passes it:
//! live, from the reply on, whether the volume is attached or not; a
//! ModifyVolume changes them the same way. They live in the target's memory
//! like its subsystems: a restarted target keeps its lvols (its blobstore is
//! on its pool) and forgets both, which the volume's record gives back
//! ([`super::nvmf_export`]; the controller looks every few seconds,
//! `super::reexport`). A volume never exported is an interrupted
//! CreateVolume's, which only the next CreateVolume finishes: it may still
//! have to be decoupled or grown.
//!
//! A volume whose lvol exists but whose subsystem is not fully set up is an
//! interrupted CreateVolume: [`NvmfTarget::find`] says it is not complete and
//! the next CreateVolume carries on from where it stopped.
//!
//! Group snapshots are write-order consistent: every member's subsystem is
//! paused (`nvmf_subsystem_pause` answers once the I/O in flight has drained;
//! new I/O waits in the target), each lvol is snapshotted, and every
//! subsystem is resumed. A write the host saw complete is in its snapshot,
//! and no write issued after it completed (the only writes that can depend
//! on it) can reach any member before the resume. Upstream SPDK v24.09 has
//! no such RPC (hack/spdk's patch adds the library's pause and resume as
//! RPCs); a target without it fails the call with FAILED_PRECONDITION,
//! nothing paused. Resume is certain: an intent record naming the
//! subsystems is written (fsynced) before the first pause and removed after
//! the last resume, every path out of the call resumes under a deadline of
//! its own (the caller's may be spent), and a record left by a crash is
//! resumed by [`VolumeBackend::recover`] at start-up and before the next
//! group operation. SPDK's own RPCs that pause internally
//! (`nvmf_subsystem_get_controllers`, `_add_ns`, ...) resume on their way
//! out, which would end our pause early: nothing here calls them, and an
//! operator should not while a group snapshot runs.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use futures::future::{join_all, try_join};
use serde::{Deserialize, Serialize};
use snap_csi::json_dir::JsonDir;
use snap_csi::jsonrpc::{RpcClient, code};
use snap_csi::spdk::app::SpdkGetVersion;
use snap_csi::spdk::bdev::{Bdev, BdevGetBdevs};
use snap_csi::spdk::lvol::{
    BdevLvolClone, BdevLvolCreate, BdevLvolDecoupleParent, BdevLvolDelete, BdevLvolGetLvstores,
    BdevLvolResize, BdevLvolSnapshot,
};
use snap_csi::spdk::nvmf::{NvmfDeleteSubsystem, NvmfSubsystemPause, NvmfSubsystemResume};
use tokio::time::Instant;
use tonic::Status;

use super::ids::{parse_snapshot_id, parse_volume_id};
use super::nvmf_export::{Exports, NSID, VolumeRecord, alias, nqn};
use super::sizes::{MIB, Room, bdev_bytes, lvol_unit};
use super::store::{Found, Source, VolumeBackend};
use crate::backend::{
    ADRFAM_KEY, BACKEND_KEY, EXTRA_PATHS_KEY, Kind, NVMF, SUBNQN_KEY, TRADDR_KEY, TRSVCID_KEY,
    TRTYPE_KEY,
};
use crate::errors::{Failure, is_absent, is_taken};
use crate::qos::QosLimits;

const TEMP_SNAPSHOT_PREFIX: &str = "tmp-";
/// Decoupling climbs one snapshot per call; no volume has this many.
const MAX_DECOUPLES: usize = 256;
/// Resuming paused subsystems gets this long from when it starts, whatever
/// is left of the caller's deadline: hosts' I/O waits until it is done.
pub const RESUME_TIMEOUT: Duration = Duration::from_secs(10);

/// Subsystems a group snapshot may have paused, recorded before the first
/// pause and removed after the last resume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PauseIntent {
    pub group_snapshot_id: String,
    pub nqns: Vec<String>,
}

/// A remote SPDK target with an lvstore.
#[derive(Debug)]
pub struct NvmfTarget {
    rpc: RpcClient,
    lvstore: String,
    records: JsonDir,
    intents: JsonDir,
    exports: Exports,
}

fn temp_snapshot(volume_id: &str) -> String {
    format!("{TEMP_SNAPSHOT_PREFIX}{volume_id}")
}

fn size_in_mib(size: u64) -> u64 {
    size.div_ceil(MIB)
}

impl NvmfTarget {
    /// The target at `rpc` (nothing is contacted yet); snapshot records go in
    /// `records`, group snapshots' pause intents in `intents`, volumes'
    /// records in `volumes`.
    pub fn new(
        rpc: RpcClient,
        lvstore: String,
        listen: Vec<SocketAddr>,
        records: JsonDir,
        intents: JsonDir,
        volumes: JsonDir,
    ) -> Self {
        NvmfTarget {
            exports: Exports::new(rpc.clone(), lvstore.clone(), listen, volumes),
            rpc,
            lvstore,
            records,
            intents,
        }
    }

    /// Pauses namespace 1 of `volume_id`'s subsystem.
    async fn pause(&self, volume_id: &str, deadline: Instant) -> Result<(), Status> {
        let pause = NvmfSubsystemPause {
            nqn: nqn(volume_id),
            nsid: Some(NSID),
        };
        match self.rpc.call_until(&pause, deadline).await {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some(code::INVALID_PARAMS) => Err(Status::not_found(format!(
                "volume {volume_id} has no subsystem {} to pause",
                pause.nqn
            ))),
            Err(e) if e.code() == Some(code::METHOD_NOT_FOUND) => {
                Err(Status::failed_precondition(format!(
                    "the NVMe-oF target cannot pause subsystems, so it cannot snapshot volumes \
                     together: it lacks nvmf_subsystem_pause (upstream SPDK v24.09 has no such \
                     RPC; hack/spdk's patch adds it) ({e})"
                )))
            }
            Err(e) => Err(Failure::target(format!("pausing {}", pause.nqn), e).into()),
        }
    }

    /// Resumes every subsystem of `nqns` under [`RESUME_TIMEOUT`]; one gone
    /// is resumed already. Tries them all, then reports the first failure.
    async fn resume_all(&self, nqns: &[String]) -> Result<(), Status> {
        let deadline = Instant::now() + RESUME_TIMEOUT;
        let results = join_all(nqns.iter().map(|nqn| async move {
            let resume = NvmfSubsystemResume { nqn: nqn.clone() };
            match self.rpc.call_until(&resume, deadline).await {
                Ok(_) => Ok(()),
                Err(e) if e.code() == Some(code::INVALID_PARAMS) => Ok(()),
                Err(e) => {
                    tracing::error!(%nqn, "resuming a paused subsystem failed: {e}");
                    Err(Failure::target(format!("resuming {nqn}"), e).into())
                }
            }
        }))
        .await;
        results.into_iter().collect()
    }

    /// Pauses every member, snapshots each, resumes them all whatever happened.
    async fn paused_snapshots(
        &self,
        members: &[(String, String)],
        deadline: Instant,
    ) -> Result<(), Status> {
        let paused = join_all(members.iter().map(|(v, _)| self.pause(v, deadline))).await;
        paused.into_iter().collect::<Result<(), Status>>()?;
        let cut = join_all(
            members
                .iter()
                .map(|(v, s)| VolumeBackend::snapshot(self, v, s, deadline)),
        )
        .await;
        cut.into_iter().collect()
    }

    fn alias(&self, lvol: &str) -> String {
        alias(&self.lvstore, lvol)
    }

    async fn lvol(&self, name: &str, deadline: Instant) -> Result<Option<Bdev>, Status> {
        let query = BdevGetBdevs {
            name: Some(self.alias(name)),
            timeout: None,
        };
        match self.rpc.call_until(&query, deadline).await {
            Ok(bdevs) => Ok(bdevs.into_iter().next()),
            Err(e) if is_absent(&e) => Ok(None),
            Err(e) => {
                Err(Failure::target(format!("looking up lvol {}", self.alias(name)), e).into())
            }
        }
    }

    /// `(lvol name, bdev)` of every lvol in our lvstore.
    async fn lvols(&self, deadline: Instant) -> Result<Vec<(String, Bdev)>, Status> {
        let bdevs = self
            .rpc
            .call_until(&BdevGetBdevs::default(), deadline)
            .await
            .map_err(|e| Failure::target("listing the target's bdevs", e))?;
        let prefix = format!("{}/", self.lvstore);
        Ok(bdevs
            .into_iter()
            .filter_map(|b| {
                let name = b.aliases.iter().find_map(|a| a.strip_prefix(&prefix))?;
                Some((name.to_string(), b.clone()))
            })
            .collect())
    }

    /// Makes the lvol of a new volume, from its source if it has one.
    async fn make_lvol(
        &self,
        volume_id: &str,
        size: u64,
        source: Option<&Source>,
        deadline: Instant,
    ) -> Result<(), Status> {
        match source {
            None => {
                let create = BdevLvolCreate {
                    lvol_name: volume_id.to_string(),
                    size_in_mib: size_in_mib(size),
                    lvs_name: Some(self.lvstore.clone()),
                    uuid: None,
                    thin_provision: Some(true),
                };
                match self.rpc.call_until(&create, deadline).await {
                    Ok(_) => Ok(()),
                    Err(e) if is_taken(&e) => Ok(()),
                    Err(e) => Err(Failure::target(
                        format!("creating lvol {}", self.alias(volume_id)),
                        e,
                    )
                    .into()),
                }
            }
            Some(Source::Snapshot(snapshot_id)) => {
                self.clone_lvol(snapshot_id, volume_id, deadline).await
            }
            Some(Source::Volume(source_id)) => {
                let temp = temp_snapshot(volume_id);
                self.snapshot(source_id, &temp, deadline).await?;
                self.clone_lvol(&temp, volume_id, deadline).await
            }
        }
    }

    async fn clone_lvol(
        &self,
        snapshot: &str,
        volume_id: &str,
        deadline: Instant,
    ) -> Result<(), Status> {
        let clone = BdevLvolClone {
            snapshot_name: self.alias(snapshot),
            clone_name: volume_id.to_string(),
        };
        match self.rpc.call_until(&clone, deadline).await {
            Ok(_) => Ok(()),
            Err(e) if is_taken(&e) => Ok(()),
            Err(e) if is_absent(&e) => Err(Status::not_found(format!(
                "snapshot {} is gone",
                self.alias(snapshot)
            ))),
            Err(e) => Err(Failure::target(
                format!("cloning {} into {volume_id}", self.alias(snapshot)),
                e,
            )
            .into()),
        }
    }

    /// Decouples the lvol from its snapshots, one parent per call, until it
    /// has none; answers its bdev.
    async fn stand_alone(&self, volume_id: &str, deadline: Instant) -> Result<Bdev, Status> {
        for _ in 0..MAX_DECOUPLES {
            let bdev = self.lvol(volume_id, deadline).await?.ok_or_else(|| {
                Status::aborted(format!(
                    "lvol {} vanished while being created",
                    self.alias(volume_id)
                ))
            })?;
            let is_clone = bdev.driver_specific.lvol.as_ref().is_some_and(|l| l.clone);
            if !is_clone {
                return Ok(bdev);
            }
            let decouple = BdevLvolDecoupleParent {
                name: self.alias(volume_id),
            };
            self.rpc
                .call_until(&decouple, deadline)
                .await
                .map_err(|e| Failure::target(format!("decoupling {}", self.alias(volume_id)), e))?;
        }
        Err(Status::internal(format!(
            "lvol {} still has a parent after {MAX_DECOUPLES} decouplings",
            self.alias(volume_id)
        )))
    }

    async fn delete_lvol(&self, name: &str, deadline: Instant) -> Result<(), Status> {
        let delete = BdevLvolDelete {
            name: self.alias(name),
        };
        match self.rpc.call_until(&delete, deadline).await {
            Ok(_) => Ok(()),
            Err(e) if is_absent(&e) => Ok(()),
            Err(e) => Err(Failure::target(format!("deleting lvol {}", self.alias(name)), e).into()),
        }
    }
}

fn is_snapshot(bdev: &Bdev) -> bool {
    bdev.driver_specific
        .lvol
        .as_ref()
        .is_some_and(|l| l.snapshot)
}

#[async_trait::async_trait]
impl VolumeBackend for NvmfTarget {
    fn kind(&self) -> Kind {
        Kind::Nvmf
    }

    fn context(&self, volume_id: &str, multipath: bool) -> HashMap<String, String> {
        let first = self.exports.listen_addresses().swap_remove(0);
        let mut context = HashMap::from([
            (BACKEND_KEY.to_string(), NVMF.to_string()),
            (TRTYPE_KEY.to_string(), first.trtype),
            (ADRFAM_KEY.to_string(), first.adrfam),
            (TRADDR_KEY.to_string(), first.traddr),
            (TRSVCID_KEY.to_string(), first.trsvcid),
            (SUBNQN_KEY.to_string(), nqn(volume_id)),
        ]);
        let extra = self.exports.extra_listeners();
        if multipath && !extra.is_empty() {
            let listed = extra
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",");
            context.insert(EXTRA_PATHS_KEY.to_string(), listed);
        }
        context
    }

    fn paths(&self) -> usize {
        1 + self.exports.extra_listeners().len()
    }

    async fn room(&self, deadline: Instant) -> Result<Room, Status> {
        let query = BdevLvolGetLvstores {
            uuid: None,
            lvs_name: Some(self.lvstore.clone()),
        };
        let stores = match self.rpc.call_until(&query, deadline).await {
            Ok(stores) => stores,
            Err(e) if is_absent(&e) => {
                return Err(Status::failed_precondition(format!(
                    "the target has no lvstore {:?}: create it (bdev_lvol_create_lvstore) \
                     or fix --nvmf-lvstore",
                    self.lvstore
                )));
            }
            Err(e) => return Err(Failure::target("reading the lvstore", e).into()),
        };
        let store = stores.into_iter().next().ok_or_else(|| {
            Status::internal(format!("bdev_lvol_get_lvstores gave no {}", self.lvstore))
        })?;
        Ok(Room {
            total: store.total_data_clusters.saturating_mul(store.cluster_size),
            available: store.free_clusters.saturating_mul(store.cluster_size),
            unit: lvol_unit(store.cluster_size)?,
        })
    }

    async fn find(&self, volume_id: &str, deadline: Instant) -> Result<Option<Found>, Status> {
        let (lvol, subsystem) = try_join(
            self.lvol(volume_id, deadline),
            self.exports.subsystem(volume_id, deadline),
        )
        .await?;
        lvol.map(|bdev| {
            Ok(Found {
                size: bdev_bytes(&bdev)?,
                complete: subsystem.is_some_and(|s| self.exports.complete(&s, &bdev)),
            })
        })
        .transpose()
    }

    async fn volumes(&self, deadline: Instant) -> Result<Vec<(String, u64)>, Status> {
        self.lvols(deadline)
            .await?
            .into_iter()
            .filter(|(name, bdev)| {
                matches!(parse_volume_id(name), Some((Kind::Nvmf, _))) && !is_snapshot(bdev)
            })
            .map(|(name, bdev)| Ok((name, bdev_bytes(&bdev)?)))
            .collect::<Result<_, Status>>()
    }

    async fn create(
        &self,
        volume_id: &str,
        size: u64,
        source: Option<&Source>,
        qos: &QosLimits,
        deadline: Instant,
    ) -> Result<u64, Status> {
        if self.lvol(volume_id, deadline).await?.is_none() {
            self.make_lvol(volume_id, size, source, deadline).await?;
        }
        let mut bdev = self.stand_alone(volume_id, deadline).await?;
        if matches!(source, Some(Source::Volume(_))) {
            self.delete_lvol(&temp_snapshot(volume_id), deadline)
                .await?;
        }
        if bdev_bytes(&bdev)? < size {
            self.expand(volume_id, size, deadline).await?;
            bdev = self.stand_alone(volume_id, deadline).await?;
        }
        // Before the export, which makes the volume complete: a CreateVolume
        // that stopped in between sets them again, one after it never does
        // (so it never undoes a ModifyVolume).
        if !qos.is_empty() {
            self.set_qos(volume_id, qos, deadline).await?;
        }
        self.exports.export(volume_id, &bdev, deadline).await?;
        let record = self.exports.record(volume_id).await?;
        if !record.exported {
            let exported = VolumeRecord {
                exported: true,
                ..record
            };
            self.exports.keep_record(volume_id, Some(exported)).await?;
        }
        bdev_bytes(&bdev)
    }

    async fn set_qos(
        &self,
        volume_id: &str,
        limits: &QosLimits,
        deadline: Instant,
    ) -> Result<(), Status> {
        if self.lvol(volume_id, deadline).await?.is_none() {
            return Err(Status::not_found(format!(
                "volume {volume_id} has no lvol {}",
                self.alias(volume_id)
            )));
        }
        let mut record = self.exports.record(volume_id).await?;
        record.qos = record.qos.overlaid(*limits);
        self.exports.keep_record(volume_id, Some(record)).await?;
        self.exports.limit(volume_id, limits, deadline).await
    }

    async fn delete(&self, volume_id: &str, deadline: Instant) -> Result<(), Status> {
        let nqn = nqn(volume_id);
        let delete = NvmfDeleteSubsystem { nqn: nqn.clone() };
        match self.rpc.call_until(&delete, deadline).await {
            Ok(_) => {}
            Err(e) if is_absent(&e) || e.code() == Some(code::INVALID_PARAMS) => {}
            Err(e) => return Err(Failure::target(format!("deleting subsystem {nqn}"), e).into()),
        }
        self.delete_lvol(volume_id, deadline).await?;
        // Left by a CreateVolume from a volume that was interrupted and given up.
        self.delete_lvol(&temp_snapshot(volume_id), deadline)
            .await?;
        self.exports.keep_record(volume_id, None).await
    }

    async fn expand(&self, volume_id: &str, size: u64, deadline: Instant) -> Result<(), Status> {
        let resize = BdevLvolResize {
            name: self.alias(volume_id),
            size_in_mib: size_in_mib(size),
        };
        match self.rpc.call_until(&resize, deadline).await {
            Ok(_) => Ok(()),
            Err(e) if is_absent(&e) => Err(Status::not_found(format!(
                "volume {volume_id} has no lvol {}",
                self.alias(volume_id)
            ))),
            Err(e) => Err(Failure::target(format!("resizing {}", self.alias(volume_id)), e).into()),
        }
    }

    async fn snapshot(
        &self,
        volume_id: &str,
        snapshot_id: &str,
        deadline: Instant,
    ) -> Result<(), Status> {
        if self.lvol(snapshot_id, deadline).await?.is_some() {
            return Ok(());
        }
        let snapshot = BdevLvolSnapshot {
            lvol_name: self.alias(volume_id),
            snapshot_name: snapshot_id.to_string(),
        };
        match self.rpc.call_until(&snapshot, deadline).await {
            Ok(_) => Ok(()),
            Err(e) if is_taken(&e) => Ok(()),
            Err(e) if is_absent(&e) => Err(Status::not_found(format!(
                "volume {volume_id} has no lvol {}",
                self.alias(volume_id)
            ))),
            Err(e) => Err(Failure::target(
                format!(
                    "snapshotting {} as {}",
                    self.alias(volume_id),
                    self.alias(snapshot_id)
                ),
                e,
            )
            .into()),
        }
    }

    async fn snapshot_sizes(&self, deadline: Instant) -> Result<HashMap<String, u64>, Status> {
        self.lvols(deadline)
            .await?
            .into_iter()
            .filter(|(name, bdev)| {
                matches!(parse_snapshot_id(name), Some((Kind::Nvmf, _))) && is_snapshot(bdev)
            })
            .map(|(name, bdev)| Ok((name, bdev_bytes(&bdev)?)))
            .collect::<Result<_, Status>>()
    }

    async fn snapshot_size(
        &self,
        snapshot_id: &str,
        deadline: Instant,
    ) -> Result<Option<u64>, Status> {
        self.lvol(snapshot_id, deadline)
            .await?
            .filter(is_snapshot)
            .map(|b| bdev_bytes(&b))
            .transpose()
    }

    async fn delete_snapshot(&self, snapshot_id: &str, deadline: Instant) -> Result<(), Status> {
        self.delete_lvol(snapshot_id, deadline).await
    }

    fn snapshot_records(&self) -> &JsonDir {
        &self.records
    }

    async fn group_snapshot(
        &self,
        group_snapshot_id: &str,
        members: &[(String, String)],
        deadline: Instant,
    ) -> Result<(), Status> {
        let nqns: Vec<String> = members.iter().map(|(v, _)| nqn(v)).collect();
        let key = group_snapshot_id;
        let intent = PauseIntent {
            group_snapshot_id: key.to_string(),
            nqns: nqns.clone(),
        };
        self.intents
            .store(key, &intent)
            .map_err(|e| Failure::record("writing the pause intent", e))?;
        let result = self.paused_snapshots(members, deadline).await;
        let resumed = self.resume_all(&nqns).await;
        if resumed.is_ok() {
            self.intents
                .remove(key)
                .map_err(|e| Failure::record("removing the pause intent", e))?;
        }
        result.and(resumed)
    }

    async fn recover(&self) -> Result<(), Status> {
        let intents = self
            .intents
            .all::<PauseIntent>()
            .map_err(|e| Failure::record("reading pause intents", e))?;
        for intent in intents {
            let intent = intent.map_err(|(path, e)| {
                Failure::record(format!("reading pause intent {}", path.display()), e)
            })?;
            self.resume_all(&intent.nqns).await?;
            self.intents
                .remove(&intent.group_snapshot_id)
                .map_err(|e| Failure::record("removing the pause intent", e))?;
            tracing::warn!(
                subsystems = ?intent.nqns,
                "resumed the subsystems an interrupted group snapshot had paused"
            );
        }
        Ok(())
    }

    async fn lost_exports(&self, deadline: Instant) -> Result<Vec<String>, Status> {
        let volumes = self
            .lvols(deadline)
            .await?
            .into_iter()
            .filter(|(name, bdev)| {
                matches!(parse_volume_id(name), Some((Kind::Nvmf, _))) && !is_snapshot(bdev)
            })
            .collect();
        self.exports.lost(volumes, deadline).await
    }

    async fn export_again(&self, volume_id: &str, deadline: Instant) -> Result<(), Status> {
        match self.lvol(volume_id, deadline).await? {
            Some(bdev) => self.exports.again(volume_id, &bdev, deadline).await,
            // Deleted meanwhile: left gone.
            None => Ok(()),
        }
    }

    async fn probe(&self, deadline: Instant) -> Result<(), String> {
        self.rpc
            .call_until(&SpdkGetVersion {}, deadline)
            .await
            .map_err(|e| format!("the NVMe-oF target does not answer: {e}"))?;
        self.room(deadline)
            .await
            .map(drop)
            .map_err(|s| s.message().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lvol_names_fit_spdks_fields() {
        assert!(temp_snapshot(&"x".repeat(57)).len() <= 63);
        assert_eq!(size_in_mib(4 * MIB), 4);
        assert_eq!(size_in_mib(4 * MIB + 1), 5);
    }
}
