//! The AIO backend: a volume is a sparse file `<pool>/<volume id>.img` that
//! the plugin's CreateDevice hands to `bdev_aio_create`; a snapshot is a
//! sparse copy `<pool>/snapshots/<snapshot id>.img` with its record in
//! `<pool>/snapshots/records/`.
//!
//! Files are made whole under a hidden temporary name and renamed into
//! place, so a file with a volume's name is always a finished volume and a
//! crash leaves at most a temporary file, which the next attempt replaces
//! (and DeleteVolume removes). Copies skip runs of zeroes, so a copy of a
//! thin volume stays thin, and check the caller's deadline as they go. A
//! reflink would be cheaper where the filesystem has it; a plain copy works
//! everywhere and keeps volumes independent of their sources.
//!
//! Group snapshots copy the members one after another, inside the
//! controller's one-group-snapshot-at-a-time lock, as fast as the copies go.
//! That is the best this backend has: the writer of these files is SPDK's
//! `bdev_aio` inside SNAP on the DPU, which the controller does not reach
//! (no socket to SNAP, and `bdev_aio` has no pause), and a file has no
//! freeze the controller could hold while it copies. What it gives: the
//! group is write-order consistent exactly when its members are not written
//! during the call (the workload stopped, or quiesced by the application,
//! as for any AIO snapshot, which copies a file over time). Writes during
//! the call are looked for, not prevented: each member's size and
//! modification time are read before the first copy and after the last,
//! and a change fails the call (FAILED_PRECONDITION, the copies removed),
//! since CSI asks a group snapshot to be consistent or fail. The look is
//! as fine as the filesystem's timestamps (a clock tick, milliseconds): a
//! write landing in the same tick as one just before the first look can go
//! unseen, so an application that needs the guarantee quiesces its writes.
//! The NVMe-oF backend pauses its members and is consistent under writes.
//!
//! QoS limits ([`crate::qos`]) are enforced by SNAP's SPDK on the AIO bdev,
//! which the controller cannot reach: a volume's limits are a JSON record in
//! `<pool>/qos/` (written before the volume's file, so a volume that exists
//! has its record), which the plugin's CreateDevice applies with
//! `bdev_set_qos_limit` on the bdev it makes, and which it follows while the
//! volume is attached ([`crate::follow`]). So a CreateVolume's limits
//! hold from the first attach, and a ModifyVolume's take effect within the
//! plugin's `--aio-follow-period` (a second) on an attached volume, or
//! at the next attach with a plugin that cannot see the pool.
//!
//! Expansion grows the file (never shrinks it); the same follower sees the
//! file grow and `bdev_aio_rescan`s an attached volume's bdev, so SNAP shows
//! the host the new size within a period (see [`super::controller`]).
//!
//! The QoS record, not the volume context, is the truth: the CO never
//! changes a volume's context after CreateVolume.
//!
//! A pool only one DPU reaches (`--aio-dpu` and `--aio-node`: storage on
//! that DPU of that host) makes DPU-local volumes: each carries that DPU's
//! topology (`dpu.snap-csi.io/NAME: NODE_ID`, which the node reports for
//! each of its DPUs: the node id tells hosts whose DPUs share a name apart)
//! and names it in its context (`snap-csi.io/dpu: NAME`), so Kubernetes
//! schedules its pods only to that host, and its node attaches it on that
//! DPU of its several.
//!
//! Capacity: with `--aio-pool-capacity` the pool holds that many bytes of
//! volumes and snapshots (their full sizes, written or not), within the
//! filesystem's free space; without it, the filesystem's free space is the
//! pool, and sparse files may promise more than it has.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use snap_csi::json_dir::JsonDir;
use snap_csi::node::dpus::dpu_segment;
use snap_csi::node::fleet::DPU_KEY;
use tokio::time::Instant;
use tonic::Status;

use super::ids::{parse_snapshot_id, parse_volume_id};
use super::sizes::{MIB, Room};
use super::store::{Found, Source, VolumeBackend};
use crate::backend::{AIO, BACKEND_KEY, Kind, PATH_KEY};
use crate::errors::Failure;
use crate::qos::{self, QosLimits};

const IMAGE: &str = "img";
const SNAPSHOTS: &str = "snapshots";
const RECORDS: &str = "records";
const COPY_CHUNK: usize = 1 << 20;

/// One host's DPU, as its node names it: DPUs are named alike on every
/// host, so the name alone does not say which host's it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostDpu {
    /// The DPU's name among its host's DPUs (`snap-csi.io/dpu`).
    pub name: String,
    /// The node id of its host, the value of the DPU's topology segment.
    pub node_id: String,
}

/// A pool directory of volume files.
#[derive(Debug)]
pub struct AioPool {
    dir: PathBuf,
    capacity: Option<u64>,
    /// The one DPU that reaches the pool, if only one does.
    dpu: Option<HostDpu>,
    records: JsonDir,
    /// Volumes' QoS limits, by volume id, where the plugin reads them.
    qos: JsonDir,
}

impl AioPool {
    /// The pool at `dir` (absolute, as SNAP sees it too), created if missing.
    pub fn open(dir: &Path, capacity: Option<u64>, dpu: Option<HostDpu>) -> io::Result<AioPool> {
        fs::create_dir_all(dir.join(SNAPSHOTS))?;
        Ok(AioPool {
            dir: dir.to_path_buf(),
            capacity,
            dpu,
            records: JsonDir::open(dir.join(SNAPSHOTS).join(RECORDS))?,
            qos: JsonDir::open(qos::records_in(dir))?,
        })
    }

    fn volume_path(&self, volume_id: &str) -> PathBuf {
        self.dir.join(format!("{volume_id}.{IMAGE}"))
    }

    fn snapshot_path(&self, snapshot_id: &str) -> PathBuf {
        self.dir
            .join(SNAPSHOTS)
            .join(format!("{snapshot_id}.{IMAGE}"))
    }

    fn source_path(&self, source: &Source) -> PathBuf {
        match source {
            Source::Snapshot(id) => self.snapshot_path(id),
            Source::Volume(id) => self.volume_path(id),
        }
    }
}

impl AioPool {
    /// Size and modification time of every member's file: a write changes
    /// the time (at the filesystem's timestamp granularity).
    async fn stamps(
        &self,
        members: &[(String, String)],
    ) -> Result<Vec<(u64, Option<SystemTime>)>, Status> {
        let paths: Vec<PathBuf> = members.iter().map(|(v, _)| self.volume_path(v)).collect();
        blocking(move || {
            paths
                .iter()
                .map(|path| {
                    let meta =
                        fs::metadata(path).map_err(|e| Failure::file("looking at", path, e))?;
                    Ok((meta.len(), meta.modified().ok()))
                })
                .collect()
        })
        .await
    }
}

/// `.<name>.tmp` beside `path`: hidden from listings, replaced by a retry.
fn temp_of(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp"))
}

fn sync_dir(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) => File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// Writes `target` whole: `size` bytes, the first filled from `source`.
fn fill(target: &Path, size: u64, source: Option<&Path>, deadline: Instant) -> io::Result<()> {
    let temp = temp_of(target);
    let result = (|| {
        let mut out = File::create(&temp)?;
        if let Some(source) = source {
            copy_sparse(source, &mut out, deadline)?;
        }
        out.set_len(size.max(out.metadata()?.len()))?;
        out.sync_all()?;
        fs::rename(&temp, target)?;
        sync_dir(target)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

/// Copies `source` into `out` leaving holes where it reads zeroes; gives up
/// with `TimedOut` once `deadline` passes.
fn copy_sparse(source: &Path, out: &mut File, deadline: Instant) -> io::Result<()> {
    let mut input = File::open(source)?;
    let len = input.metadata()?.len();
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut offset = 0u64;
    while offset < len {
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("copied {offset} of {len} bytes before the call's deadline"),
            ));
        }
        let want = usize::try_from(len - offset).map_or(COPY_CHUNK, |n| n.min(COPY_CHUNK));
        input.read_exact(&mut buf[..want])?;
        if buf[..want].iter().any(|&b| b != 0) {
            out.seek(SeekFrom::Start(offset))?;
            out.write_all(&buf[..want])?;
        }
        offset += want as u64;
    }
    out.set_len(len)
}

fn size_of(path: &Path) -> io::Result<Option<u64>> {
    match fs::metadata(path) {
        Ok(meta) => Ok(Some(meta.len())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn remove(path: &Path) -> io::Result<()> {
    for p in [path.to_path_buf(), temp_of(path)] {
        match fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    sync_dir(path)
}

/// `(stem, size)` of every finished image in `dir` whose stem `ours` accepts.
fn images(dir: &Path, ours: impl Fn(&str) -> bool) -> io::Result<Vec<(String, u64)>> {
    let mut out = vec![];
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(stem) = name
            .to_str()
            .and_then(|n| n.strip_suffix(&format!(".{IMAGE}")))
        else {
            continue;
        };
        if ours(stem) && entry.file_type()?.is_file() {
            out.push((stem.to_string(), entry.metadata()?.len()));
        }
    }
    Ok(out)
}

/// Free (to unprivileged users) and total bytes of a filesystem.
#[allow(
    clippy::useless_conversion,
    reason = "statvfs's field types are narrower than u64 on some targets"
)]
pub(super) fn free_and_total(stat: &nix::sys::statvfs::Statvfs) -> (u64, u64) {
    let frsize = u64::from(stat.fragment_size());
    (
        u64::from(stat.blocks_available()).saturating_mul(frsize),
        u64::from(stat.blocks()).saturating_mul(frsize),
    )
}

/// Runs blocking file work off the async workers.
pub(super) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(Status::internal(format!("file work failed: {e}"))))
}

#[async_trait::async_trait]
impl VolumeBackend for AioPool {
    fn kind(&self) -> Kind {
        Kind::Aio
    }

    fn context(&self, volume_id: &str, _multipath: bool) -> HashMap<String, String> {
        let mut context = HashMap::from([
            (BACKEND_KEY.to_string(), AIO.to_string()),
            (
                PATH_KEY.to_string(),
                self.volume_path(volume_id).display().to_string(),
            ),
        ]);
        if let Some(dpu) = &self.dpu {
            context.insert(DPU_KEY.to_string(), dpu.name.clone());
        }
        context
    }

    fn topology(&self) -> Option<HashMap<String, String>> {
        let dpu = self.dpu.as_ref()?;
        Some(HashMap::from([dpu_segment(&dpu.name, &dpu.node_id)]))
    }

    async fn room(&self, _deadline: Instant) -> Result<Room, Status> {
        let dir = self.dir.clone();
        let capacity = self.capacity;
        blocking(move || {
            let stat = nix::sys::statvfs::statvfs(&dir).map_err(|e| {
                Failure::file("reading the free space of", &dir, io::Error::from(e))
            })?;
            let (free, fs_total) = free_and_total(&stat);
            let Some(capacity) = capacity else {
                return Ok(Room {
                    total: fs_total,
                    available: free,
                    unit: MIB,
                });
            };
            let listed = |d: &Path| images(d, |_| true).map_err(|e| Failure::file("listing", d, e));
            let used: u64 = listed(&dir)?
                .into_iter()
                .chain(listed(&dir.join(SNAPSHOTS))?)
                .map(|(_, size)| size)
                .sum();
            Ok(Room {
                total: capacity,
                available: capacity.saturating_sub(used).min(free),
                unit: MIB,
            })
        })
        .await
    }

    async fn find(&self, volume_id: &str, _deadline: Instant) -> Result<Option<Found>, Status> {
        let path = self.volume_path(volume_id);
        blocking(move || {
            let size = size_of(&path).map_err(|e| Failure::file("looking at", &path, e))?;
            Ok(size.map(|size| Found {
                size,
                complete: true,
            }))
        })
        .await
    }

    async fn volumes(&self, _deadline: Instant) -> Result<Vec<(String, u64)>, Status> {
        let dir = self.dir.clone();
        blocking(move || {
            images(&dir, |stem| {
                matches!(parse_volume_id(stem), Some((Kind::Aio, _)))
            })
            .map_err(|e| Failure::file("listing", &dir, e).into())
        })
        .await
    }

    async fn create(
        &self,
        volume_id: &str,
        size: u64,
        source: Option<&Source>,
        qos: &QosLimits,
        deadline: Instant,
    ) -> Result<u64, Status> {
        let path = self.volume_path(volume_id);
        let source = source.map(|s| self.source_path(s));
        let (records, volume_id, qos) = (self.qos.clone(), volume_id.to_string(), *qos);
        blocking(move || {
            // The record first: the file's existence says the volume is
            // whole, limits included. A record a crashed DeleteVolume left
            // is replaced or removed here.
            let recorded = if qos.is_empty() {
                records.remove(&volume_id)
            } else {
                records.store(&volume_id, &qos)
            };
            recorded.map_err(|e| Failure::record("writing the volume's QoS record", e))?;
            fill(&path, size, source.as_deref(), deadline)
                .map_err(|e| Failure::file("making", &path, e))?;
            let size = size_of(&path).map_err(|e| Failure::file("looking at", &path, e))?;
            Ok(size.unwrap_or_default())
        })
        .await
    }

    async fn delete(&self, volume_id: &str, _deadline: Instant) -> Result<(), Status> {
        let path = self.volume_path(volume_id);
        let (records, volume_id) = (self.qos.clone(), volume_id.to_string());
        blocking(move || {
            remove(&path).map_err(|e| Failure::file("removing", &path, e))?;
            records
                .remove(&volume_id)
                .map_err(|e| Failure::record("removing the volume's QoS record", e).into())
        })
        .await
    }

    async fn set_qos(
        &self,
        volume_id: &str,
        limits: &QosLimits,
        _deadline: Instant,
    ) -> Result<(), Status> {
        let path = self.volume_path(volume_id);
        let (records, volume_id, limits) = (self.qos.clone(), volume_id.to_string(), *limits);
        blocking(move || {
            if size_of(&path)
                .map_err(|e| Failure::file("looking at", &path, e))?
                .is_none()
            {
                return Err(Status::not_found(format!(
                    "volume {volume_id} does not exist"
                )));
            }
            let old: QosLimits = records
                .load(&volume_id)
                .map_err(|e| Failure::record("reading the volume's QoS record", e))?
                .unwrap_or_default();
            records
                .store(&volume_id, &old.overlaid(limits))
                .map_err(|e| Failure::record("writing the volume's QoS record", e))?;
            tracing::info!(%volume_id, ?limits, "QoS limits recorded for the plugin to apply");
            Ok(())
        })
        .await
    }

    async fn expand(&self, volume_id: &str, size: u64, _deadline: Instant) -> Result<(), Status> {
        let path = self.volume_path(volume_id);
        blocking(move || {
            let grow = || {
                let file = fs::OpenOptions::new().write(true).open(&path)?;
                if file.metadata()?.len() < size {
                    file.set_len(size)?;
                    file.sync_all()?;
                }
                Ok(())
            };
            grow().map_err(|e: io::Error| Failure::file("growing", &path, e).into())
        })
        .await
    }

    async fn snapshot(
        &self,
        volume_id: &str,
        snapshot_id: &str,
        deadline: Instant,
    ) -> Result<(), Status> {
        let volume = self.volume_path(volume_id);
        let snapshot = self.snapshot_path(snapshot_id);
        let (have, size) = {
            let (volume, snapshot) = (volume.clone(), snapshot.clone());
            blocking(move || {
                let have = size_of(&snapshot)
                    .map_err(|e| Failure::file("looking at", &snapshot, e))?
                    .is_some();
                let size = size_of(&volume).map_err(|e| Failure::file("looking at", &volume, e))?;
                Ok((have, size))
            })
            .await?
        };
        if have {
            return Ok(());
        }
        let size =
            size.ok_or_else(|| Status::not_found(format!("volume {volume_id} does not exist")))?;
        // A copy takes its full size from the pool, like a volume.
        self.room(deadline).await?.check("a snapshot", size)?;
        blocking(move || {
            fill(&snapshot, 0, Some(&volume), deadline)
                .map_err(|e| Failure::file("copying a snapshot into", &snapshot, e).into())
        })
        .await
    }

    async fn snapshot_sizes(&self, _deadline: Instant) -> Result<HashMap<String, u64>, Status> {
        let dir = self.dir.join(SNAPSHOTS);
        blocking(move || {
            let found = images(&dir, |stem| {
                matches!(parse_snapshot_id(stem), Some((Kind::Aio, _)))
            })
            .map_err(|e| Failure::file("listing", &dir, e))?;
            Ok(found.into_iter().collect())
        })
        .await
    }

    async fn snapshot_size(
        &self,
        snapshot_id: &str,
        _deadline: Instant,
    ) -> Result<Option<u64>, Status> {
        let path = self.snapshot_path(snapshot_id);
        blocking(move || size_of(&path).map_err(|e| Failure::file("looking at", &path, e).into()))
            .await
    }

    async fn delete_snapshot(&self, snapshot_id: &str, _deadline: Instant) -> Result<(), Status> {
        let path = self.snapshot_path(snapshot_id);
        blocking(move || remove(&path).map_err(|e| Failure::file("removing", &path, e).into()))
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
        let needs = "AIO group snapshots need their volumes' writes stopped (the controller \
                     cannot pause SNAP's bdev_aio)";
        super::store::snapshot_if_unchanged(
            self,
            members,
            || self.stamps(members),
            (needs, deadline),
        )
        .await
    }

    async fn probe(&self, _deadline: Instant) -> Result<(), String> {
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || {
            nix::unistd::access(&dir, nix::unistd::AccessFlags::W_OK)
                .map_err(|e| format!("AIO pool {} is not writable: {e}", dir.display()))
        })
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn copies_keep_data_and_holes_and_stop_at_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("src.img");
        let mut f = File::create(&source).unwrap();
        f.set_len(64 * MIB).unwrap();
        f.seek(SeekFrom::Start(40 * MIB)).unwrap();
        f.write_all(b"payload").unwrap();
        let target = dir.path().join("dst.img");
        let later = Instant::now() + std::time::Duration::from_secs(30);
        fill(&target, 80 * MIB, Some(&source), later).unwrap();
        let copy = fs::read(&target).unwrap();
        assert_eq!(copy.len() as u64, 80 * MIB);
        assert_eq!(&copy[(40 * MIB) as usize..][..7], b"payload");
        let blocks = std::os::unix::fs::MetadataExt::blocks(&fs::metadata(&target).unwrap());
        assert!(
            blocks * 512 < 8 * MIB,
            "the copy is sparse: {blocks} blocks"
        );
        assert!(!temp_of(&target).exists());

        let late = dir.path().join("late.img");
        let error = fill(&late, 0, Some(&source), Instant::now()).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(!late.exists() && !temp_of(&late).exists());
    }
}
