//! The filesystem backend: a volume is a btrfs subvolume
//! `<share>/<volume id>` whose qgroup limit is its capacity, which the
//! plugin's CreateDevice serves with `fsdev_aio_create` and SNAP exposes to
//! hosts as virtio-fs. Many hosts may mount it at once (every access mode).
//!
//! Why btrfs: a shared directory tree needs a quota to hold "a volume cannot
//! hold more than it was created with" (a write past it fails with EDQUOT
//! on every host), and btrfs gives a quota per subvolume (`btrfs qgroup
//! limit`), snapshots that are instant and consistent per volume, and
//! writable snapshots for clones, with one tool and no state of ours. XFS
//! project quotas are the other common choice on a file server; they need
//! a kernel built with quota support, which the machines we test on lack,
//! so they are not offered. On a BlueField the DPU reaches the share over
//! NFS (an NFS client mount of the server's export at the same path, as
//! DPF's NFS-backed plugin does) and this controller runs where the
//! filesystem is (the file server), so its subvolumes and limits are the
//! server's; on one machine the share is a local btrfs directory.
//!
//! The share must be on btrfs with quotas enabled (`btrfs quota enable`):
//! Probe says so otherwise. Layout, every entry a subvolume:
//! - `<volume id>`: a volume, always whole (made under `.<volume id>.tmp`,
//!   its limit set, then renamed), so a crashed CreateVolume leaves at most
//!   a hidden temporary that the next attempt replaces and DeleteVolume
//!   removes;
//! - `.snapshots/<snapshot id>`: a read-only snapshot, limited to its
//!   source's size (made the same way), its record in `.snapshots/records/`;
//! - `.<id>.deleting`: a volume or snapshot being removed (renamed there
//!   first, so it is gone from every listing at once).
//!
//! A clone is a writable snapshot of its source (volume or snapshot), given
//! its own limit. Expansion raises the limit: online, the hosts see the room
//! at once and nothing grows on the node. Capacity: `--fs-share-capacity`
//! bytes (default: the filesystem's size) of volume and snapshot limits,
//! within the filesystem's free space. QoS limits are for block devices
//! (SPDK's bdev QoS): a filesystem volume has none.
//!
//! Deleting a subvolume leaves its qgroup behind ("stale") until btrfs has
//! dropped the subvolume's blocks; every delete clears the stale ones, so at
//! most the last deletions' qgroups wait for the next (they hold no limit
//! on anything that exists).
//!
//! Group snapshots snapshot the members one after another: each member's
//! snapshot is of one instant, the group is of one instant only if no member
//! is written during the call. As with the AIO backend, writes are looked
//! for, not prevented: each member's tree (entries, sizes, newest change
//! time) is read before the first snapshot and after the last, and a change
//! fails the call (FAILED_PRECONDITION, the snapshots removed).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use snap_csi::json_dir::JsonDir;
use snap_csi::node::command;
use snap_csi::node::service::EMULATION_KEY;
use tokio::time::Instant;
use tonic::Status;

use super::aio::{blocking, free_and_total};
use super::ids::{parse_snapshot_id, parse_volume_id};
use super::sizes::{MIB, Room};
use super::store::{Found, Source, VolumeBackend};
use crate::backend::{BACKEND_KEY, FS, Kind, PATH_KEY};
use crate::errors::Failure;
use crate::qos::QosLimits;

const SNAPSHOTS: &str = ".snapshots";
const RECORDS: &str = "records";
/// The emulation of every filesystem volume, which the node reads.
pub const VIRTIO_FS: &str = "virtio-fs";

/// A share of volume subvolumes.
#[derive(Debug)]
pub struct FsShare {
    dir: PathBuf,
    capacity: Option<u64>,
    records: JsonDir,
}

impl FsShare {
    /// The share at `dir` (absolute, as SNAP sees it too); its snapshot
    /// directory is created if missing. Nothing else is checked here: Probe
    /// says whether the share can serve.
    pub fn open(dir: &Path, capacity: Option<u64>) -> io::Result<FsShare> {
        let snapshots = dir.join(SNAPSHOTS);
        fs::create_dir_all(&snapshots)?;
        Ok(FsShare {
            dir: dir.to_path_buf(),
            capacity,
            records: JsonDir::open(snapshots.join(RECORDS))?,
        })
    }

    fn volume_path(&self, volume_id: &str) -> PathBuf {
        self.dir.join(volume_id)
    }

    fn snapshot_path(&self, snapshot_id: &str) -> PathBuf {
        self.dir.join(SNAPSHOTS).join(snapshot_id)
    }

    fn source_path(&self, source: &Source) -> PathBuf {
        match source {
            Source::Snapshot(id) => self.snapshot_path(id),
            Source::Volume(id) => self.volume_path(id),
        }
    }

    /// `(id, limit)` of the subvolumes in `dir` whose names `ours` accepts.
    async fn limits_in(
        &self,
        dir: PathBuf,
        ours: fn(&str) -> bool,
        deadline: Instant,
    ) -> Result<Vec<(String, u64)>, Status> {
        let names = {
            let dir = dir.clone();
            blocking(move || {
                let mut names = vec![];
                let entries = fs::read_dir(&dir).map_err(|e| Failure::file("listing", &dir, e))?;
                for entry in entries {
                    let entry = entry.map_err(|e| Failure::file("listing", &dir, e))?;
                    if let Some(name) = entry.file_name().to_str().filter(|n| ours(n)) {
                        names.push(name.to_string());
                    }
                }
                Ok(names)
            })
            .await?
        };
        let mut out = vec![];
        for name in names {
            if let Some(limit) = limit_of(&dir.join(&name), deadline).await? {
                out.push((name, limit));
            }
        }
        Ok(out)
    }

    async fn volume_limits(&self, deadline: Instant) -> Result<Vec<(String, u64)>, Status> {
        let ours = |n: &str| matches!(parse_volume_id(n), Some((Kind::Fs, _)));
        self.limits_in(self.dir.clone(), ours, deadline).await
    }

    async fn snapshot_limits(&self, deadline: Instant) -> Result<Vec<(String, u64)>, Status> {
        let ours = |n: &str| matches!(parse_snapshot_id(n), Some((Kind::Fs, _)));
        self.limits_in(self.dir.join(SNAPSHOTS), ours, deadline)
            .await
    }

    /// Removes `path` and its temporary: each renamed aside first, so a
    /// listing never shows a half-removed subvolume; then the stale qgroups.
    async fn remove(&self, path: &Path, deadline: Instant) -> Result<(), Status> {
        let aside = beside(path, "deleting");
        if exists(path).await? {
            rename(path, &aside).await?;
        }
        for leftover in [aside, beside(path, "tmp")] {
            if exists(&leftover).await? {
                btrfs(&["subvolume", "delete"], &leftover, deadline).await?;
            }
        }
        // Best effort: a qgroup whose blocks btrfs has not dropped yet stays
        // stale until a later delete clears it.
        if let Err(status) = btrfs(&["qgroup", "clear-stale"], &self.dir, deadline).await {
            tracing::debug!("clearing stale qgroups: {}", status.message());
        }
        Ok(())
    }
}

/// `.<name>.<what>` beside `path`: hidden from listings.
fn beside(path: &Path, what: &str) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{what}"))
}

async fn exists(path: &Path) -> Result<bool, Status> {
    match tokio::fs::symlink_metadata(path).await {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Failure::file("looking at", path, e).into()),
    }
}

/// Renames `from` to `to` and makes the rename durable.
async fn rename(from: &Path, to: &Path) -> Result<(), Status> {
    tokio::fs::rename(from, to)
        .await
        .map_err(|e| Failure::file("renaming", from, e))?;
    let dir = to.parent().unwrap_or(Path::new("/")).to_path_buf();
    blocking(move || {
        fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Failure::file("syncing", &dir, e).into())
    })
    .await
}

/// `btrfs ARGS... PATH`, its standard output.
async fn btrfs(args: &[&str], path: &Path, deadline: Instant) -> Result<String, Status> {
    let mut all: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    all.push(path.as_os_str());
    let output = command::run("btrfs", &all, deadline).await?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The qgroup limit (max referenced bytes) of the subvolume at `path`, if
/// it exists; one without a limit is not one of ours.
async fn limit_of(path: &Path, deadline: Instant) -> Result<Option<u64>, Status> {
    if !exists(path).await? {
        return Ok(None);
    }
    let shown = btrfs(&["subvolume", "show", "--raw"], path, deadline).await?;
    let limit = shown
        .lines()
        .find_map(|l| l.trim().strip_prefix("Limit referenced:"))
        .and_then(|v| v.trim().parse::<u64>().ok());
    match limit {
        Some(limit) => Ok(Some(limit)),
        None => Err(Status::internal(format!(
            "{} is in the share without a quota limit: it is not a volume of this controller",
            path.display()
        ))),
    }
}

/// Makes `target` whole: a subvolume (a snapshot of `from`, read-only when
/// `read_only`) under its temporary name, limited to `size` bytes, then
/// renamed into place.
async fn make(
    target: &Path,
    from: Option<&Path>,
    read_only: bool,
    size: u64,
    deadline: Instant,
) -> Result<(), Status> {
    let temp = beside(target, "tmp");
    if exists(&temp).await? {
        btrfs(&["subvolume", "delete"], &temp, deadline).await?;
    }
    let mut args: Vec<&OsStr> = vec![OsStr::new("subvolume")];
    match from {
        Some(source) => {
            args.push(OsStr::new("snapshot"));
            if read_only {
                args.push(OsStr::new("-r"));
            }
            args.push(source.as_os_str());
        }
        None => args.push(OsStr::new("create")),
    }
    args.push(temp.as_os_str());
    command::run("btrfs", &args, deadline).await?;
    btrfs(&["qgroup", "limit", &size.to_string()], &temp, deadline).await?;
    rename(&temp, target).await
}

/// What a write anywhere in a tree changes: its entries, their sizes and
/// the newest change time (a write, a rename or a removal sets one).
fn stamp(root: &Path) -> io::Result<(u64, u64, i64, i64)> {
    let (mut entries, mut bytes, mut newest) = (0u64, 0u64, (i64::MIN, i64::MIN));
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let meta = fs::symlink_metadata(&dir)?;
        newest = newest.max((meta.ctime(), meta.ctime_nsec()));
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            entries += 1;
            bytes += meta.len();
            newest = newest.max((meta.ctime(), meta.ctime_nsec()));
            if meta.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    Ok((entries, bytes, newest.0, newest.1))
}

#[async_trait::async_trait]
impl VolumeBackend for FsShare {
    fn kind(&self) -> Kind {
        Kind::Fs
    }

    fn context(&self, volume_id: &str, _multipath: bool) -> HashMap<String, String> {
        HashMap::from([
            (BACKEND_KEY.to_string(), FS.to_string()),
            (
                PATH_KEY.to_string(),
                self.volume_path(volume_id).display().to_string(),
            ),
            (EMULATION_KEY.to_string(), VIRTIO_FS.to_string()),
        ])
    }

    async fn room(&self, deadline: Instant) -> Result<Room, Status> {
        let dir = self.dir.clone();
        let (free, fs_total) = blocking(move || {
            let stat = nix::sys::statvfs::statvfs(&dir).map_err(|e| {
                Failure::file("reading the free space of", &dir, io::Error::from(e))
            })?;
            Ok(free_and_total(&stat))
        })
        .await?;
        let used: u64 = self
            .volume_limits(deadline)
            .await?
            .into_iter()
            .chain(self.snapshot_limits(deadline).await?)
            .map(|(_, limit)| limit)
            .sum();
        let total = self.capacity.unwrap_or(fs_total);
        Ok(Room {
            total,
            available: total.saturating_sub(used).min(free),
            unit: MIB,
        })
    }

    async fn find(&self, volume_id: &str, deadline: Instant) -> Result<Option<Found>, Status> {
        let limit = limit_of(&self.volume_path(volume_id), deadline).await?;
        Ok(limit.map(|size| Found {
            size,
            complete: true,
        }))
    }

    async fn volumes(&self, deadline: Instant) -> Result<Vec<(String, u64)>, Status> {
        self.volume_limits(deadline).await
    }

    async fn create(
        &self,
        volume_id: &str,
        size: u64,
        source: Option<&Source>,
        qos: &QosLimits,
        deadline: Instant,
    ) -> Result<u64, Status> {
        if !qos.is_empty() {
            return Err(no_qos());
        }
        let target = self.volume_path(volume_id);
        let source = source.map(|s| self.source_path(s));
        make(&target, source.as_deref(), false, size, deadline).await?;
        Ok(size)
    }

    async fn set_qos(&self, _: &str, _: &QosLimits, _: Instant) -> Result<(), Status> {
        Err(no_qos())
    }

    async fn delete(&self, volume_id: &str, deadline: Instant) -> Result<(), Status> {
        self.remove(&self.volume_path(volume_id), deadline).await
    }

    async fn expand(&self, volume_id: &str, size: u64, deadline: Instant) -> Result<(), Status> {
        let path = self.volume_path(volume_id);
        btrfs(&["qgroup", "limit", &size.to_string()], &path, deadline)
            .await
            .map(drop)
    }

    async fn snapshot(
        &self,
        volume_id: &str,
        snapshot_id: &str,
        deadline: Instant,
    ) -> Result<(), Status> {
        let target = self.snapshot_path(snapshot_id);
        if exists(&target).await? {
            return Ok(());
        }
        let volume = self.volume_path(volume_id);
        let size = limit_of(&volume, deadline)
            .await?
            .ok_or_else(|| Status::not_found(format!("volume {volume_id} does not exist")))?;
        // A snapshot takes its source's size from the share, like a volume.
        self.room(deadline).await?.check("a snapshot", size)?;
        make(&target, Some(&volume), true, size, deadline).await
    }

    async fn snapshot_sizes(&self, deadline: Instant) -> Result<HashMap<String, u64>, Status> {
        Ok(self.snapshot_limits(deadline).await?.into_iter().collect())
    }

    async fn snapshot_size(
        &self,
        snapshot_id: &str,
        deadline: Instant,
    ) -> Result<Option<u64>, Status> {
        limit_of(&self.snapshot_path(snapshot_id), deadline).await
    }

    async fn delete_snapshot(&self, snapshot_id: &str, deadline: Instant) -> Result<(), Status> {
        self.remove(&self.snapshot_path(snapshot_id), deadline)
            .await
    }

    fn snapshot_records(&self) -> &JsonDir {
        &self.records
    }

    async fn group_snapshot(
        &self,
        _group_snapshot_id: &str,
        members: &[(String, String)],
        deadline: Instant,
    ) -> Result<(), Status> {
        let roots: Vec<PathBuf> = members.iter().map(|(v, _)| self.volume_path(v)).collect();
        let stamps = |roots: Vec<PathBuf>| {
            blocking(move || {
                roots
                    .iter()
                    .map(|r| {
                        stamp(r).map_err(|e| Failure::file("reading the tree of", r, e).into())
                    })
                    .collect::<Result<Vec<_>, Status>>()
            })
        };
        let needs = "filesystem group snapshots need their volumes' writes stopped";
        super::store::snapshot_if_unchanged(
            self,
            members,
            || stamps(roots.clone()),
            (needs, deadline),
        )
        .await
    }

    async fn probe(&self, deadline: Instant) -> Result<(), String> {
        btrfs(&["qgroup", "show"], &self.dir, deadline)
            .await
            .map(drop)
            .map_err(|s| {
                format!(
                    "filesystem share {} needs btrfs with quotas enabled (btrfs quota enable): {}",
                    self.dir.display(),
                    s.message()
                )
            })
    }
}

fn no_qos() -> Status {
    Status::invalid_argument(
        "QoS limits are for block devices (SPDK's bdev QoS): a filesystem volume (backend fs) \
         takes none",
    )
}
