//! Recovery, beside the records it reads (`records`): every loop device is
//! recorded in `<state_dir>/host-disks/` before we rely on it, and the
//! intent (backing file and offset) before `losetup` runs, so a restarted
//! emulator detaches what a crashed one left, and only that: a loop device
//! counts as ours only while its backing file, inode and offset still match
//! the record ([`Target`], [`live_state`]). Releasing a record ([`release`])
//! detaches what it owns, also a device an attach made but never recorded.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::loopdev::{self, LoopState};
use super::records::{DiskRecord, Records};
use super::tree::SECTOR;
use crate::datapath::fuse::DataPath;
use crate::datapath::volume::Backing;

/// How long `detach` keeps retrying a busy `losetup -d` before it falls back
/// to autoclear.
const DETACH_PATIENCE: Duration = Duration::from_secs(3);
/// How long a detach deferred to the last close may take before we stop
/// waiting for it and report it as deferred.
const DETACH_SETTLE: Duration = Duration::from_secs(1);

/// A validated backing byte range.
#[derive(Debug)]
pub(super) struct Target {
    /// Canonical, because that is what the kernel shows as `backing_file`.
    pub(super) path: PathBuf,
    pub(super) dev: u64,
    pub(super) ino: u64,
    pub(super) offset: u64,
    pub(super) size: u64,
    pub(super) read_only: bool,
    /// A file of our live data path mount (see `loop_matches`).
    served: bool,
}

impl Target {
    /// `backing`, checked; a file of our own data path (`datapath`) is
    /// described by what it knows, never asked (see `served_file`).
    pub(super) fn of(backing: &Backing, datapath: &DataPath) -> anyhow::Result<Self> {
        let shown = backing.path.display();
        if backing.size == 0 || !backing.size.is_multiple_of(SECTOR) {
            bail!(
                "backing {shown}: size {} is not a positive multiple of {SECTOR} bytes",
                backing.size
            );
        }
        // A file on our own FUSE mount is not even looked up, let alone
        // stat'ed or opened: each is a request to our own session threads,
        // and a SIGKILL while one waits leaves the caller waiting for dead
        // threads, the process never exiting. The data path knows what
        // `stat` would say (the same as a loop device over it shows).
        let (path, dev, ino, len, served) = match datapath.served_file(&backing.path) {
            Some(served) => {
                let served = served.with_context(|| format!("backing {shown}"))?;
                (served.path, served.dev, served.ino, served.len, true)
            }
            None => {
                let (path, dev, ino, len) = Self::stat(backing)?;
                (path, dev, ino, len, false)
            }
        };
        if path.to_str().is_none() {
            bail!("backing {shown}: path is not UTF-8");
        }
        let fits = backing
            .offset
            .checked_add(backing.size)
            .is_some_and(|end| end <= len);
        if !fits {
            bail!(
                "backing {shown}: {} bytes at offset {} go past its end ({len} bytes); \
                 a loop device would come out short",
                backing.size,
                backing.offset
            );
        }
        Ok(Self {
            path,
            dev,
            ino,
            offset: backing.offset,
            size: backing.size,
            read_only: backing.read_only,
            served,
        })
    }

    /// The canonical path, `st_dev`, `st_ino` and length of a backing that
    /// is not on our data path: a regular file or a block device.
    fn stat(backing: &Backing) -> anyhow::Result<(PathBuf, u64, u64, u64)> {
        let shown = backing.path.display();
        let path = fs::canonicalize(&backing.path)
            .with_context(|| format!("backing {shown} cannot be resolved"))?;
        let meta = fs::metadata(&path).with_context(|| format!("backing {shown}"))?;
        let file_type = meta.file_type();
        if !file_type.is_file() && !file_type.is_block_device() {
            bail!("backing {shown} is neither a regular file nor a block device");
        }
        // A file is measured by its attributes, never opened (a close may
        // wait on whatever serves it); a block device's size is where a
        // seek ends.
        let len = if file_type.is_file() {
            meta.len()
        } else {
            File::open(&path)
                .and_then(|mut file| file.seek(SeekFrom::End(0)))
                .with_context(|| format!("measuring backing {shown}"))?
        };
        Ok((path, meta.dev(), meta.ino(), len))
    }

    /// The record written before `losetup` runs: the bytes, no device yet.
    pub(super) fn intent(&self, sysfs_dir: PathBuf, preexisting: Vec<String>) -> DiskRecord {
        DiskRecord {
            sysfs_dir,
            backing_path: self.path.clone(),
            backing_dev: self.dev,
            backing_ino: self.ino,
            offset: self.offset,
            size: self.size,
            read_only: self.read_only,
            loop_device: None,
            preexisting,
        }
    }

    /// Same bytes as the record (size aside).
    pub(super) fn is_record(&self, record: &DiskRecord) -> bool {
        self.path == record.backing_path
            && self.ino == record.backing_ino
            && loopdev::split_dev(self.dev) == loopdev::split_dev(record.backing_dev)
            && self.offset == record.offset
    }

    pub(super) fn owns(&self, state: &LoopState) -> bool {
        loop_matches(
            state,
            &self.path,
            self.dev,
            self.ino,
            self.offset,
            self.served,
        )
    }
}

/// Whether the bound loop device `state` is over `path` (same inode) at `offset`.
///
/// A file on a dead FUSE mount (a killed emulator's data path) cannot say
/// its inode (ENOTCONN): its path, in a mount no one else makes files in,
/// is identity enough. So is the path of a file of our live data path mount
/// (`served`), which the device is never asked for its file's inode:
/// LOOP_GET_STATUS64 stats the file, a request to our own session threads,
/// which a SIGKILL in that instant would leave the caller waiting for (see
/// `datapath::fuse`). No other file shows that path: every earlier mount
/// there was unmounted (lazily) before ours was made, and a file of a
/// detached mount shows its path inside that mount (`/d2`).
fn loop_matches(
    state: &LoopState,
    path: &Path,
    dev: u64,
    ino: u64,
    offset: u64,
    served: bool,
) -> bool {
    state.offset == offset
        && loopdev::backing_is(&state.backing_file, path)
        // Checked last: it opens the device, the cheap sysfs tests came first.
        && (served
            || match loopdev::backing_identity(&state.name) {
                Ok((have_dev, have_ino)) => {
                    have_ino == ino && loopdev::split_dev(have_dev) == loopdev::split_dev(dev)
                }
                Err(e) => e.raw_os_error() == Some(ENOTCONN),
            })
}

const ENOTCONN: i32 = 107;

/// Whether the record's bytes are a file of our live data path mount
/// (served or no longer; not of an earlier run's mount at the same path).
fn is_served(record: &DiskRecord, datapath: &DataPath) -> bool {
    datapath.is_on_mount(&record.backing_path, record.backing_dev, record.backing_ino)
}

fn record_owns(record: &DiskRecord, served: bool, state: &LoopState) -> bool {
    loop_matches(
        state,
        &record.backing_path,
        record.backing_dev,
        record.backing_ino,
        record.offset,
        served,
    )
}

/// The recorded loop device's state, if it is still bound to the recorded bytes.
pub(super) fn live_state(
    record: &DiskRecord,
    datapath: &DataPath,
) -> anyhow::Result<Option<LoopState>> {
    let Some(name) = &record.loop_device else {
        return Ok(None);
    };
    let served = is_served(record, datapath);
    Ok(loopdev::state(name)?.filter(|state| record_owns(record, served, state)))
}

/// Detaches `name` if it is still the record's device; a device that is gone,
/// or now someone else's, counts as detached.
///
/// Since Linux 5.x LOOP_CLR_FD on an open device sets autoclear and succeeds,
/// and the device goes away on its last close; older kernels answer EBUSY, so
/// after retrying we set autoclear ourselves. Either way nothing leaks. Probes
/// (`losetup -l`, blkid) open devices for a moment, so a deferred detach is
/// given a second to complete before we report it as deferred.
fn detach_loop(name: &str, record: &DiskRecord, served: bool) -> anyhow::Result<()> {
    let device = loopdev::dev_path(name);
    let deadline = Instant::now() + DETACH_PATIENCE;
    let mut nap = Duration::from_millis(20);
    let mut asked_at: Option<Instant> = None;
    let mut refusal = String::new();
    loop {
        let Some(state) = loopdev::state(name)? else {
            return Ok(());
        };
        if !record_owns(record, served, &state) {
            return Ok(());
        }
        if let Some(asked_at) = asked_at
            && state.autoclear
        {
            if asked_at.elapsed() >= DETACH_SETTLE {
                tracing::warn!(device = %device.display(), "still open; the kernel detaches it on last close");
                return Ok(());
            }
            thread::sleep(Duration::from_millis(5));
            continue;
        }
        if Instant::now() >= deadline {
            break;
        }
        if asked_at.is_some() {
            thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(200));
        }
        if let Err(why) = loopdev::detach(name)? {
            refusal = why;
        }
        asked_at.get_or_insert_with(Instant::now);
    }
    let failure = || {
        format!(
            "could not detach {} (backing {} at offset {}){}",
            device.display(),
            record.backing_path.display(),
            record.offset,
            if refusal.is_empty() {
                String::new()
            } else {
                format!(": losetup said {refusal}")
            }
        )
    };
    loopdev::set_autoclear(name).with_context(failure)?;
    match loopdev::state(name)? {
        Some(state) if record_owns(record, served, &state) && !state.autoclear => {
            bail!("{}; autoclear did not stick", failure())
        }
        _ => {
            tracing::warn!(device = %device.display(), "busy; set autoclear so the kernel detaches it on last close");
            Ok(())
        }
    }
}

/// Detaches what a record owns, then drops the record.
pub(super) fn release(
    records: &Records,
    datapath: &DataPath,
    key: &str,
    record: &DiskRecord,
) -> anyhow::Result<()> {
    let candidates = match &record.loop_device {
        Some(name) => vec![name.clone()],
        // Only the intent was recorded: losetup may have attached a device
        // we never learnt of. Any device over the same bytes that was not
        // there before, and that no other record claims, is that one. (A
        // second attach of the same bytes racing this one, between its
        // losetup and its record, could still be mistaken for it: exposing
        // one bdev twice at once is not something SNAP does.)
        None => {
            let claimed: HashSet<String> = records
                .list()?
                .into_iter()
                .filter_map(|(_, other)| other.ok()?.loop_device)
                .collect();
            loopdev::all_bound()?
                .into_iter()
                .filter(|state| {
                    !record.preexisting.contains(&state.name) && !claimed.contains(&state.name)
                })
                .map(|state| state.name)
                .collect()
        }
    };
    let served = is_served(record, datapath);
    for name in candidates {
        detach_loop(&name, record, served)?;
    }
    datapath.remove(&record.backing_path);
    records.remove(key)
}
