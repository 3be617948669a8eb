//! One small JSON file per disk in `<state_dir>/host-disks/`, written
//! atomically, so that a restarted emulator knows which loop devices a crashed
//! one made.
//!
//! A file per disk rather than one file for all: an update never rewrites
//! another disk's record, so updates for different PCI functions need no common
//! lock. Updates for one disk are serialised by the caller's per-function lock.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// What we attached, or are about to attach, for one disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct DiskRecord {
    /// The disk's directory in the tree, for messages and for clean-up.
    pub sysfs_dir: PathBuf,
    /// Canonical path, as the kernel will show it in `loop/backing_file`.
    pub backing_path: PathBuf,
    pub backing_dev: u64,
    pub backing_ino: u64,
    pub offset: u64,
    pub size: u64,
    pub read_only: bool,
    /// `None` while only the intent is recorded: `losetup` may have attached a
    /// device that we never learnt the name of.
    pub loop_device: Option<String>,
    /// Loop devices over the same byte range that existed before we ran
    /// `losetup`: never ours, whatever the intent says.
    #[serde(default)]
    pub preexisting: Vec<String>,
}

#[derive(Debug)]
pub(super) struct Records {
    dir: PathBuf,
}

impl Records {
    pub(super) fn open(dir: PathBuf) -> anyhow::Result<Self> {
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self { dir })
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.json"))
    }

    pub(super) fn load(&self, key: &str) -> anyhow::Result<Option<DiskRecord>> {
        let path = self.path(key);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .with_context(|| format!("parsing {}", path.display())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Replaces the record: temp file, fsync, rename, fsync of the directory,
    /// so that after a crash the record is either the old one or the new one.
    pub(super) fn store(&self, key: &str, record: &DiskRecord) -> anyhow::Result<()> {
        let path = self.path(key);
        let tmp = self.dir.join(format!(".{key}.json.tmp"));
        let bytes = serde_json::to_vec_pretty(record)
            .with_context(|| format!("encoding record {}", path.display()))?;
        let write = || -> io::Result<()> {
            let mut file = File::create(&tmp)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
            fs::rename(&tmp, &path)?;
            sync_dir(&self.dir)
        };
        write().with_context(|| format!("writing {}", path.display()))
    }

    pub(super) fn remove(&self, key: &str) -> anyhow::Result<()> {
        let path = self.path(key);
        match fs::remove_file(&path) {
            Ok(()) => {
                sync_dir(&self.dir).with_context(|| format!("syncing {}", self.dir.display()))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
        }
    }

    /// Deletes the temp files of writes that never reached their rename. Only
    /// for start-up: at any other time they may be writes in flight.
    pub(super) fn sweep_temp_files(&self) -> anyhow::Result<()> {
        let entries =
            fs::read_dir(&self.dir).with_context(|| format!("listing {}", self.dir.display()))?;
        for entry in entries {
            let entry = entry.with_context(|| format!("listing {}", self.dir.display()))?;
            let name = entry.file_name();
            if name
                .to_str()
                .is_some_and(|n| n.starts_with('.') && n.ends_with(".tmp"))
            {
                fs::remove_file(entry.path())
                    .with_context(|| format!("removing {}", entry.path().display()))?;
            }
        }
        Ok(())
    }

    /// Every record, by key. A record that cannot be parsed comes back as an
    /// error of its own rather than failing the listing.
    pub(super) fn list(&self) -> anyhow::Result<Vec<(String, anyhow::Result<DiskRecord>)>> {
        let entries =
            fs::read_dir(&self.dir).with_context(|| format!("listing {}", self.dir.display()))?;
        let mut records = Vec::new();
        for entry in entries {
            let entry = entry.with_context(|| format!("listing {}", self.dir.display()))?;
            let name = entry.file_name();
            let Some(key) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            if key.starts_with('.') {
                continue;
            }
            // A record removed since read_dir is simply not there any more.
            let record = match self.load(key) {
                Ok(Some(record)) => Ok(record),
                Ok(None) => continue,
                Err(e) => Err(e),
            };
            records.push((key.to_owned(), record));
        }
        records.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(records)
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}
