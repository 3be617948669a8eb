//! The one thing the node remembers per staged volume: what cannot be
//! derived again from the mount table, SNAP's lists or the vendor plugin.
//!
//! That is the plugin's device name (DeleteDevice needs it after SNAP's
//! objects are gone), where the host finds the device, and whether the
//! attachment was ours or handed to us by DPF's controller-side attach (then
//! unstage must not detach it). Records are written atomically (temp file,
//! fsync, rename, fsync of the directory) so a crash leaves the old record or
//! the new one, never half of one.

use std::io;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::dpu::HostLocator;
use crate::json_dir::JsonDir;

/// What the node keeps about one staged volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub volume_id: String,
    pub staging_target_path: PathBuf,
    /// The vendor plugin's device (bdev) name; `None` when DPF attached it.
    pub device_name: Option<String>,
    pub locator: HostLocator,
    /// True when the publish context carried DPF's attachment: not ours to undo.
    pub external_attach: bool,
}

/// A directory of records, one file per volume (named by the hex of the
/// volume id, which is an opaque CO string).
#[derive(Debug, Clone)]
pub struct Records {
    dir: JsonDir,
}

impl Records {
    /// Opens (creating) the record directory.
    pub fn open(dir: impl Into<PathBuf>) -> io::Result<Records> {
        Ok(Records {
            dir: JsonDir::open(dir)?,
        })
    }

    pub fn load(&self, volume_id: &str) -> io::Result<Option<VolumeRecord>> {
        self.dir.load(volume_id)
    }

    pub fn store(&self, record: &VolumeRecord) -> io::Result<()> {
        self.dir.store(&record.volume_id, record)
    }

    /// Removes the record; removing an absent one succeeds.
    pub fn remove(&self, volume_id: &str) -> io::Result<()> {
        self.dir.remove(volume_id)
    }

    /// How many volumes have a record (for the staged-volumes gauge).
    pub fn count(&self) -> io::Result<usize> {
        self.dir.count()
    }

    /// Every record, for reconciliation at start; unreadable files are skipped
    /// with their error so one bad file does not hide the others.
    pub fn all(&self) -> io::Result<Vec<Result<VolumeRecord, (PathBuf, io::Error)>>> {
        self.dir.all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> VolumeRecord {
        VolumeRecord {
            volume_id: id.into(),
            staging_target_path: "/var/lib/kubelet/staging/x".into(),
            device_name: Some("aio-x".into()),
            locator: HostLocator::Nvme {
                bdf: "26:00.1".into(),
                nsid: 1,
                uuid: Some("6a1f3c2e-5b6d-4e8f-9a0b-1c2d3e4f5a6b".into()),
            },
            external_attach: false,
        }
    }

    #[test]
    fn store_load_remove_round_trip_with_awkward_ids() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::open(dir.path()).unwrap();
        for id in ["pvc-1", "a/b/../c", "ünïcode id"] {
            assert_eq!(records.load(id).unwrap(), None);
            records.store(&record(id)).unwrap();
            assert_eq!(records.load(id).unwrap(), Some(record(id)));
        }
        assert_eq!(records.all().unwrap().len(), 3);
        records.remove("a/b/../c").unwrap();
        records.remove("a/b/../c").unwrap();
        assert_eq!(records.load("a/b/../c").unwrap(), None);
        assert_eq!(records.all().unwrap().len(), 2);
    }
}
