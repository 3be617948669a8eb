//! What an earlier run left, reported at start. Nothing is undone here
//! unless the operator asks: kubelet retries stage or unstage for every
//! volume it still cares about, and those converge; these reports tell an
//! operator what no retry will touch.
//!
//! First the records (what this node staged); then the orphans among them;
//! then, once each DPU answers (in the background: the node serves kubelet
//! meanwhile), the records it holds against the volumes its SNAP exposes
//! under our names.
//!
//! An orphan is a staged volume whose NodeUnstage never came (its pod was
//! force-deleted, the node was out of service): a recorded volume that no
//! mount under the kubelet directory uses, other than its own staging
//! mount. A filesystem volume is used by any such mount of its filesystem
//! (the device number of its staging mount, or of its device); a block
//! volume by any such bind mount of its device node (kubelet's publish
//! paths for block volumes are not under `pods/`, so the rule takes the
//! whole kubelet directory). A volume staged and not yet published fits the
//! rule too, which is why `--unstage-orphans` is off by default: it is for a
//! node whose pods are gone (out of service, drained); the report is for
//! every node. A block volume whose device the host does not show cannot be
//! told apart from a used one and is left out.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::join_all;

use tokio::time::Instant;
use tonic::Status;

use super::fleet::Member;
use super::mountinfo::{self, MountEntry};
use super::records::VolumeRecord;
use super::service::NodeService;
use crate::dpu::names::VolumeNames;
use crate::dpu::{ExposedVolume, Inventory};

/// The inventory is asked with this deadline, again after a failure with
/// a delay growing to the last.
const ASK_TIMEOUT: Duration = Duration::from_secs(10);
const FIRST_RETRY: Duration = Duration::from_secs(1);
const LAST_RETRY: Duration = Duration::from_secs(60);

impl NodeService {
    /// Reports the volumes an earlier run staged and returns their records;
    /// an unreadable record is reported and left for an operator.
    pub fn reconcile(&self) -> Vec<VolumeRecord> {
        let records = match self.records().all() {
            Ok(records) => records,
            Err(e) => {
                tracing::warn!("cannot list volume records: {e}");
                return Vec::new();
            }
        };
        let mut staged = Vec::new();
        for record in records {
            match record {
                Ok(record) => {
                    tracing::info!(volume_id = %record.volume_id, staging = %record.staging_target_path.display(), "volume staged by an earlier run");
                    staged.push(record);
                }
                Err((path, e)) => {
                    tracing::warn!(path = %path.display(), "unreadable volume record: {e}");
                }
            }
        }
        tracing::info!(staged = staged.len(), "reconciled volume records");
        crate::metrics::set_volumes_staged(staged.len());
        staged
    }

    /// The volumes of `records` that nothing under the kubelet directory
    /// uses (see the module doc), each reported with a log line and counted
    /// in `snap_csi_orphaned_volumes`.
    pub fn find_orphans(&self, records: &[VolumeRecord]) -> Vec<VolumeRecord> {
        let table = match mountinfo::read() {
            Ok(table) => table,
            Err(e) => {
                tracing::warn!("cannot read the mount table to look for orphaned volumes: {e}");
                return Vec::new();
            }
        };
        let mut orphans = Vec::new();
        for record in records {
            match self.in_use(record, &table) {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(volume_id = %record.volume_id, staging = %record.staging_target_path.display(), "volume staged here, but nothing under the kubelet directory uses it (its NodeUnstage never came?); --unstage-orphans unstages such volumes at start");
                    orphans.push(record.clone());
                }
                Err(e) => {
                    tracing::warn!(volume_id = %record.volume_id, "cannot tell whether the volume is in use: {e}");
                }
            }
        }
        crate::metrics::set_orphaned_volumes(orphans.len());
        orphans
    }

    /// Whether a mount under the kubelet directory other than the staging
    /// mount uses the recorded volume; a block volume whose device is not
    /// on the host counts as used, since nothing tells.
    fn in_use(&self, record: &VolumeRecord, table: &[MountEntry]) -> Result<bool, Status> {
        let staging = &record.staging_target_path;
        let device = self.find_device(&record.locator)?;
        let staging_mount = mountinfo::at(staging)?;
        let block = record
            .staged_as
            .as_ref()
            .is_some_and(|s| s.fs_type.is_none());
        if block && device.is_none() {
            return Ok(true);
        }
        let filesystems: Vec<(u32, u32)> = staging_mount
            .as_ref()
            .into_iter()
            .map(|m| (m.major, m.minor))
            .chain(device.iter().map(|d| (d.major, d.minor)))
            .collect();
        // A bind mount of a device node shows the node's path in /dev as
        // its root, on the filesystem that holds /dev.
        let node_in_dev = device.as_ref().and_then(|d| {
            d.node
                .strip_prefix("/dev")
                .ok()
                .map(|n| Path::new("/").join(n))
        });
        // The table shows resolved paths: a kubelet directory reached
        // through a link must not make every volume look unused.
        let kubelet_dir = &self.config().kubelet_dir;
        let kubelet_dir =
            std::fs::canonicalize(kubelet_dir).unwrap_or_else(|_| kubelet_dir.clone());
        let staging = staging_mount.map_or_else(|| staging.clone(), |m| m.mount_point);
        Ok(table.iter().any(|m| {
            let under_kubelet = m.mount_point.starts_with(&kubelet_dir) && m.mount_point != staging;
            let of_filesystem = !block && filesystems.contains(&(m.major, m.minor));
            let of_node = block
                && matches!(m.fs_type.as_str(), "devtmpfs" | "tmpfs")
                && node_in_dev.as_deref() == Some(m.root.as_path());
            under_kubelet && (of_filesystem || of_node)
        }))
    }

    /// Unstages the orphans (`--unstage-orphans`), each after checking again,
    /// while holding it, that nothing has started using it since; one that
    /// kubelet is busy with, or that fails, is logged and left.
    pub async fn unstage_orphans(self, orphans: Vec<VolumeRecord>) {
        let mut left = orphans.len();
        for record in orphans {
            let volume_id = &record.volume_id;
            let unstaged = async {
                let _held = self.hold(volume_id)?;
                let table = mountinfo::read()?;
                if self.in_use(&record, &table)? {
                    return Ok(false);
                }
                let deadline = Instant::now() + self.config().call_timeout;
                self.unstage_held(volume_id, &record.staging_target_path, deadline)
                    .await
                    .map(|()| true)
            };
            match unstaged.await {
                Ok(true) => {
                    tracing::info!(%volume_id, staging = %record.staging_target_path.display(), "unstaged an orphaned volume");
                    left -= 1;
                }
                Ok(false) => {
                    tracing::info!(%volume_id, "an orphaned volume is in use again; left staged");
                    left -= 1;
                }
                Err(e) => tracing::warn!(%volume_id, "cannot unstage an orphaned volume: {e}"),
            }
            crate::metrics::set_orphaned_volumes(left);
        }
    }

    /// Compares `records` with what each DPU's SNAP exposes, as soon as
    /// that DPU answers, and reports the differences (log lines and
    /// `snap_csi_dpu_drift`, summed over the DPUs that answered so far).
    pub async fn compare_with_dpus(self, records: Vec<VolumeRecord>) {
        let totals = Mutex::new((0, 0));
        let fleet = Arc::clone(self.fleet());
        let compared = fleet.members().iter().map(|member| {
            let held: Vec<VolumeRecord> = records
                .iter()
                .filter(|r| match fleet.recorded(r.dpu.as_deref()) {
                    Ok(on) => std::ptr::eq(on, member),
                    Err(e) => {
                        // Once, from the first DPU's pass.
                        if std::ptr::eq(member, &fleet.members()[0]) {
                            tracing::warn!(volume_id = %r.volume_id, "{}", e.message());
                        }
                        false
                    }
                })
                .cloned()
                .collect();
            let (node, totals) = (&self, &totals);
            async move {
                let (unrecorded, unattached) = node.compare_with(member, &held).await;
                let mut totals = totals.lock().unwrap_or_else(PoisonError::into_inner);
                totals.0 += unrecorded;
                totals.1 += unattached;
                crate::metrics::set_dpu_drift("unrecorded", totals.0);
                crate::metrics::set_dpu_drift("unattached", totals.1);
            }
        });
        join_all(compared).await;
    }

    /// One DPU's comparison; how many volumes it exposes unrecorded, and
    /// how many recorded on it it no longer exposes.
    async fn compare_with(&self, member: &Member, records: &[VolumeRecord]) -> (usize, usize) {
        let dpu = member.name();
        let mut delay = FIRST_RETRY;
        let inventory = loop {
            match member.dpu().inventory(Instant::now() + ASK_TIMEOUT).await {
                Ok(inventory) => break inventory,
                Err(e) => {
                    tracing::debug!(%dpu, "comparing records with the DPU waits for it: {e}");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(LAST_RETRY);
                }
            }
        };
        let drift = Drift::between(records, &inventory);
        for volume in &drift.unrecorded {
            tracing::warn!(%dpu, volume_key = %volume.key, devices = ?volume.device_names, bdf = ?volume.bdf, "SNAP exposes a volume this node has no record of on this DPU (a stage whose record was lost, or a volume of another node on this DPU); left as it is");
        }
        for record in &drift.unattached {
            tracing::warn!(%dpu, volume_id = %record.volume_id, "staged here, but SNAP no longer exposes it; the next stage of it attaches it again");
        }
        tracing::info!(
            %dpu,
            exposed = inventory.volumes.len(),
            unrecorded = drift.unrecorded.len(),
            unattached = drift.unattached.len(),
            "compared volume records with the DPU"
        );
        (drift.unrecorded.len(), drift.unattached.len())
    }
}

/// Where the records and SNAP disagree.
#[derive(Debug, PartialEq, Eq)]
struct Drift<'a> {
    /// Exposed under our names, without a record here.
    unrecorded: Vec<&'a ExposedVolume>,
    /// Recorded as attached by us, not exposed.
    unattached: Vec<&'a VolumeRecord>,
}

impl<'a> Drift<'a> {
    fn between(records: &'a [VolumeRecord], inventory: &'a Inventory) -> Drift<'a> {
        let exposed: HashSet<&str> = inventory.volumes.iter().map(|v| v.key.as_str()).collect();
        let mut recorded = HashSet::new();
        let mut unattached = Vec::new();
        // DPF's controller-side attachments are not under our names.
        for record in records.iter().filter(|r| !r.external_attach) {
            let names = VolumeNames::new(&record.volume_id);
            // A packed volume is exposed under its namespace UUID.
            let keys = names.keys();
            if !keys.iter().any(|k| exposed.contains(k)) {
                unattached.push(record);
            }
            recorded.extend(keys.map(str::to_string));
        }
        let unrecorded = inventory
            .volumes
            .iter()
            .filter(|v| !recorded.contains(&v.key))
            .collect();
        Drift {
            unrecorded,
            unattached,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dpu::{Emulation, HostLocator};

    fn record(volume_id: &str, external_attach: bool) -> VolumeRecord {
        VolumeRecord {
            volume_id: volume_id.into(),
            staging_target_path: "/var/lib/kubelet/staging".into(),
            device_name: None,
            locator: HostLocator::Nvme {
                bdf: "26:00.2".into(),
                nsid: 1,
                uuid: None,
                serial: None,
            },
            external_attach,
            dpu: None,
            staged_as: None,
            volume_context: Default::default(),
            formatting: false,
        }
    }

    fn exposed(key: String, emulation: Emulation) -> ExposedVolume {
        ExposedVolume {
            key,
            emulation,
            device_names: vec!["dev".into()],
            bdf: None,
        }
    }

    #[test]
    fn records_and_snap_are_matched_by_the_names_derived_from_the_volume_id() {
        let records = [
            record("nvme-ok", false),
            record("virtio-ok", false),
            record("packed-ok", false),
            record("lost-on-dpu", false),
            record("dpf-attached", true),
        ];
        let inventory = Inventory {
            functions: Vec::new(),
            volumes: vec![
                exposed(VolumeNames::new("nvme-ok").nqn, Emulation::Nvme),
                exposed(VolumeNames::new("virtio-ok").serial, Emulation::VirtioBlk),
                exposed(
                    VolumeNames::new("packed-ok").namespace_uuid,
                    Emulation::Nvme,
                ),
                exposed(VolumeNames::new("no-record").nqn, Emulation::Nvme),
                exposed(
                    VolumeNames::new("packed-no-record").namespace_uuid,
                    Emulation::Nvme,
                ),
            ],
            pools: Vec::new(),
        };
        let drift = Drift::between(&records, &inventory);
        assert_eq!(drift.unattached, [&records[3]]);
        assert_eq!(
            drift.unrecorded,
            [&inventory.volumes[3], &inventory.volumes[4]]
        );
    }
}
