//! What an earlier run left, reported at start. Nothing is undone here:
//! kubelet retries stage or unstage for every volume it still cares about,
//! and those converge; these reports tell an operator what no retry will
//! touch.
//!
//! First the records (what this node staged); then, once the DPU answers
//! (in the background: the node serves kubelet meanwhile), the records
//! against the volumes SNAP exposes under our names.

use std::collections::HashSet;
use std::time::Duration;

use tokio::time::Instant;

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

    /// Compares `records` with what SNAP exposes, as soon as the DPU
    /// answers, and reports the differences (log lines and
    /// `snap_csi_dpu_drift`).
    pub async fn compare_with_dpu(self, records: Vec<VolumeRecord>) {
        let mut delay = FIRST_RETRY;
        let inventory = loop {
            match self.dpu().inventory(Instant::now() + ASK_TIMEOUT).await {
                Ok(inventory) => break inventory,
                Err(e) => {
                    tracing::debug!("comparing records with the DPU waits for it: {e}");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(LAST_RETRY);
                }
            }
        };
        let drift = Drift::between(&records, &inventory);
        for volume in &drift.unrecorded {
            tracing::warn!(volume_key = %volume.key, devices = ?volume.device_names, bdf = ?volume.bdf, "SNAP exposes a volume this node has no record of (a stage whose record was lost, or a volume of another node on this DPU); left as it is");
        }
        for record in &drift.unattached {
            tracing::warn!(volume_id = %record.volume_id, "staged here, but SNAP no longer exposes it; the next stage of it attaches it again");
        }
        tracing::info!(
            exposed = inventory.volumes.len(),
            unrecorded = drift.unrecorded.len(),
            unattached = drift.unattached.len(),
            "compared volume records with the DPU"
        );
        crate::metrics::set_dpu_drift("unrecorded", drift.unrecorded.len());
        crate::metrics::set_dpu_drift("unattached", drift.unattached.len());
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
            if !exposed.contains(names.nqn.as_str()) && !exposed.contains(names.serial.as_str()) {
                unattached.push(record);
            }
            recorded.extend([names.nqn, names.serial]);
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
            },
            external_attach,
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
            record("lost-on-dpu", false),
            record("dpf-attached", true),
        ];
        let inventory = Inventory {
            functions: Vec::new(),
            volumes: vec![
                exposed(VolumeNames::new("nvme-ok").nqn, Emulation::Nvme),
                exposed(VolumeNames::new("virtio-ok").serial, Emulation::VirtioBlk),
                exposed(VolumeNames::new("no-record").nqn, Emulation::Nvme),
            ],
        };
        let drift = Drift::between(&records, &inventory);
        assert_eq!(drift.unattached, [&records[2]]);
        assert_eq!(drift.unrecorded, [&inventory.volumes[2]]);
    }
}
