//! The one thing the node remembers per staged volume: what cannot be
//! derived again from the mount table, SNAP's lists or the vendor plugin.
//!
//! That is the plugin's device name (DeleteDevice needs it after SNAP's
//! objects are gone), where the host finds the device, and whether the
//! attachment was ours or handed to us by DPF's controller-side attach (then
//! unstage must not detach it). It also keeps what the stage was asked for
//! (how the volume is used, its volume context), so that a publish after a
//! reboot, which kubelet sends without a stage, can stage the volume again
//! from the record when the record and the request agree. Records are written atomically (temp file,
//! fsync, rename, fsync of the directory) so a crash leaves the old record or
//! the new one, never half of one.

use std::collections::HashMap;
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
    /// The DPU that holds it (its name); `None` in a record of a node
    /// that knew only one DPU, which is then the first.
    #[serde(default)]
    pub dpu: Option<String>,
    /// True when the publish context carried DPF's attachment: not ours to undo.
    pub external_attach: bool,
    /// How the stage used the volume; `None` in a record of an older node,
    /// which then cannot be staged again from its record.
    #[serde(default)]
    pub staged_as: Option<StagedAs>,
    /// The stage's volume context (no secrets: those are never kept).
    #[serde(default)]
    pub volume_context: HashMap<String, String>,
    /// A mkfs began on the volume's device, which the probe found blank,
    /// and was not seen to end (a crash, or SNAP taking the device away
    /// mid-write): the next stage makes the filesystem again over whatever
    /// half of one is there. Nothing was mounted from it, so nothing is lost.
    #[serde(default)]
    pub formatting: bool,
}

/// The volume capability a stage was given, as the record keeps it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedAs {
    /// The filesystem (`ext4`, `xfs`); `None` for a block volume.
    pub fs_type: Option<String>,
    pub mount_flags: Vec<String>,
    /// The CSI access mode's name (`SINGLE_NODE_WRITER`, ...).
    pub access_mode: String,
}

/// Mount flags are not printed, as for the CSI messages that carry them.
impl std::fmt::Debug for StagedAs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagedAs")
            .field("fs_type", &self.fs_type)
            .field(
                "mount_flags",
                &format_args!("<{} flags>", self.mount_flags.len()),
            )
            .field("access_mode", &self.access_mode)
            .finish()
    }
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

/// A record as a stage of an ext4 volume writes it, for the node's tests.
#[cfg(test)]
pub(super) fn sample(id: &str) -> VolumeRecord {
    VolumeRecord {
        volume_id: id.into(),
        staging_target_path: "/var/lib/kubelet/staging/x".into(),
        device_name: Some("aio-x".into()),
        locator: HostLocator::Nvme {
            bdf: "26:00.1".into(),
            nsid: 1,
            uuid: Some("6a1f3c2e-5b6d-4e8f-9a0b-1c2d3e4f5a6b".into()),
            serial: None,
        },
        external_attach: false,
        dpu: None,
        staged_as: Some(StagedAs {
            fs_type: Some("ext4".into()),
            mount_flags: vec!["password=hunter2".into()],
            access_mode: "SINGLE_NODE_WRITER".into(),
        }),
        volume_context: [("path".to_string(), "/img".to_string())].into(),
        formatting: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> VolumeRecord {
        sample(id)
    }

    #[test]
    fn a_record_of_an_older_node_loads_without_what_it_did_not_keep() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::open(dir.path()).unwrap();
        let mut old = serde_json::to_value(record("old")).unwrap();
        let fields = old.as_object_mut().unwrap();
        fields.remove("staged_as");
        fields.remove("volume_context");
        fields.remove("formatting");
        JsonDir::open(dir.path())
            .unwrap()
            .store("old", &old)
            .unwrap();
        let loaded = records.load("old").unwrap().unwrap();
        assert_eq!(loaded.staged_as, None);
        assert!(loaded.volume_context.is_empty());
        assert!(!loaded.formatting);
        assert!(!format!("{:?}", record("x")).contains("hunter2"));
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
