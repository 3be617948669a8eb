//! The one thing the node remembers per staged volume: what cannot be
//! derived again from the mount table, SNAP's lists or the vendor plugin.
//!
//! That is the plugin's device name (DeleteDevice needs it after SNAP's
//! objects are gone), where the host finds the device, and whether the
//! attachment was ours or handed to us by DPF's controller-side attach (then
//! unstage must not detach it). Records are written atomically (temp file,
//! fsync, rename, fsync of the directory) so a crash leaves the old record or
//! the new one, never half of one.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::dpu::HostLocator;

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

/// A directory of records, one file per volume.
#[derive(Debug, Clone)]
pub struct Records {
    dir: PathBuf,
}

impl Records {
    /// Opens (creating) the record directory.
    pub fn open(dir: impl Into<PathBuf>) -> io::Result<Records> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        Ok(Records { dir })
    }

    /// Volume ids are opaque CO strings (may hold `/`): the file name is a
    /// hex encoding, so every id maps to exactly one safe name.
    fn path(&self, volume_id: &str) -> PathBuf {
        let name: String = volume_id.bytes().map(|b| format!("{b:02x}")).collect();
        self.dir.join(format!("{name}.json"))
    }

    pub fn load(&self, volume_id: &str) -> io::Result<Option<VolumeRecord>> {
        match fs::read(self.path(volume_id)) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn store(&self, record: &VolumeRecord) -> io::Result<()> {
        let path = self.path(&record.volume_id);
        let temp = path.with_extension("tmp");
        let bytes = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
        let mut file = File::create(&temp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        fs::rename(&temp, &path)?;
        sync_dir(&self.dir)
    }

    /// Removes the record; removing an absent one succeeds.
    pub fn remove(&self, volume_id: &str) -> io::Result<()> {
        match fs::remove_file(self.path(volume_id)) {
            Ok(()) => sync_dir(&self.dir),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Every record, for reconciliation at start; unreadable files are skipped
    /// with their error so one bad file does not hide the others.
    pub fn all(&self) -> io::Result<Vec<Result<VolumeRecord, (PathBuf, io::Error)>>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "tmp") {
                // A write that crashed before its rename: never a valid record.
                let _ = fs::remove_file(&path);
                continue;
            }
            let parsed = fs::read(&path).and_then(|bytes| {
                serde_json::from_slice(&bytes)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
            });
            out.push(parsed.map_err(|e| (path, e)));
        }
        Ok(out)
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
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
