//! A directory of small JSON records, one file per key, each written
//! atomically (temp file, fsync, rename, fsync of the directory) so that a
//! crash leaves the old record or the new one, never half of one.
//!
//! Keys are opaque strings (a CO's volume id may hold `/`): a file is named by
//! the hex of its key's bytes, so every key maps to exactly one safe name.
//! Records carry their own key when their owner needs to list them.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;
use uuid::Uuid;

/// Hex doubles a key, and a file name holds 255 bytes with `.json`: past
/// 125 bytes (CSI's ids go to 128) a key is named by a digest instead. Keys
/// that fit keep the hex names records have always had.
const MAX_HEX_KEY_BYTES: usize = (255 - ".json".len()) / 2;
/// Hex never holds a `-`, so digest names cannot meet hex ones.
const LONG_KEY_PREFIX: &str = "k-";
const LONG_KEYS: Uuid = Uuid::from_u128(0x5f0c_2b1e_8d4a_4c7e_9a61_2f3b_7d90_e418);

/// One directory of records.
#[derive(Debug, Clone)]
pub struct JsonDir {
    dir: PathBuf,
}

impl JsonDir {
    /// Opens (creating) the directory, and removes what writes that crashed
    /// before their rename left. Only here: a temp file found later may be a
    /// write in flight (a metrics scan runs beside the node's RPCs).
    pub fn open(dir: impl Into<PathBuf>) -> io::Result<JsonDir> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            if is_temp(&path) {
                let _ = fs::remove_file(&path);
            }
        }
        Ok(JsonDir { dir })
    }

    /// Another process's directory, to read: neither created nor swept, as
    /// a temp file in it may be its writer's write in flight (the sample
    /// plugin reads the QoS records its controller writes, every period).
    pub fn of_another(dir: impl Into<PathBuf>) -> JsonDir {
        JsonDir { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &str) -> PathBuf {
        let name: String = if key.len() <= MAX_HEX_KEY_BYTES {
            key.bytes().map(|b| format!("{b:02x}")).collect()
        } else {
            format!(
                "{LONG_KEY_PREFIX}{}",
                Uuid::new_v5(&LONG_KEYS, key.as_bytes())
            )
        };
        self.dir.join(format!("{name}.json"))
    }

    /// The record under `key`, or `None` when there is none.
    pub fn load<T: DeserializeOwned>(&self, key: &str) -> io::Result<Option<T>> {
        match fs::read(self.path(key)) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes (or replaces) the record under `key`.
    pub fn store<T: Serialize>(&self, key: &str, record: &T) -> io::Result<()> {
        let path = self.path(key);
        let temp = path.with_extension("tmp");
        let bytes = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
        let mut file = File::create(&temp)?;
        file.write_all(&bytes)?;
        flush(&file)?;
        fs::rename(&temp, &path)?;
        sync_dir(&self.dir)
    }

    /// Removes the record; removing an absent one succeeds.
    pub fn remove(&self, key: &str) -> io::Result<()> {
        match fs::remove_file(self.path(key)) {
            Ok(()) => sync_dir(&self.dir),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// How many records there are, without reading them.
    pub fn count(&self) -> io::Result<usize> {
        let mut count = 0;
        for entry in fs::read_dir(&self.dir)? {
            if entry?.path().extension().is_some_and(|e| e == "json") {
                count += 1;
            }
        }
        Ok(count)
    }

    /// Every record; an unreadable file comes with its error so one bad file
    /// does not hide the others.
    pub fn all<T: DeserializeOwned>(&self) -> io::Result<Vec<Result<T, (PathBuf, io::Error)>>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let path = entry?.path();
            if is_temp(&path) {
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

/// A write not yet renamed into place: never a record.
fn is_temp(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "tmp")
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    flush(&File::open(dir)?)
}

/// A flush waits on the disk: it is recorded as host work, like a mount
/// syscall, not as the process's own time.
fn flush(file: &File) -> io::Result<()> {
    crate::metrics::host_work("fsync", || file.sync_all())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_under_awkward_keys_and_survive_a_crashed_write() {
        let dir = tempfile::tempdir().unwrap();
        let records = JsonDir::open(dir.path().join("r")).unwrap();
        let longest_hex = "h".repeat(MAX_HEX_KEY_BYTES);
        let longest_csi_id = "i".repeat(128);
        let huge = "j".repeat(1 << 20);
        for key in [
            "g-1",
            "a/b/../c",
            "ünïcode key",
            &longest_hex,
            &longest_csi_id,
            &huge,
        ] {
            assert_eq!(records.load::<String>(key).unwrap(), None);
            records.store(key, &key.to_string()).unwrap();
            assert_eq!(records.load::<String>(key).unwrap().as_deref(), Some(key));
        }
        // A write in flight is no record, and a scan leaves it to finish;
        // at the next start it is a crashed write's leftover, and goes.
        let in_flight = records.dir().join("00.tmp");
        std::fs::write(&in_flight, b"{half").unwrap();
        assert_eq!(records.all::<String>().unwrap().len(), 6);
        assert!(in_flight.exists());
        let records = JsonDir::open(records.dir()).unwrap();
        assert!(!in_flight.exists());
        assert_eq!(records.all::<String>().unwrap().len(), 6);
        // A reader of another process's directory leaves its writes in flight.
        std::fs::write(&in_flight, b"{half").unwrap();
        let reader = JsonDir::of_another(records.dir());
        assert_eq!(
            reader.load::<String>("g-1").unwrap().as_deref(),
            Some("g-1")
        );
        assert!(in_flight.exists());
        std::fs::remove_file(&in_flight).unwrap();
        for key in ["a/b/../c", &longest_csi_id] {
            records.remove(key).unwrap();
            records.remove(key).unwrap();
        }
        assert_eq!(records.all::<String>().unwrap().len(), 4);
        // The hex names of records written before long keys existed still load.
        assert!(records.dir().join("672d31.json").exists());
    }
}
