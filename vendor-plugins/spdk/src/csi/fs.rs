//! The filesystem backend: a volume is a filesystem of its own, an ext4 in
//! an image file on the share, loop-mounted on the directory
//! `<share>/<volume id>` that the plugin's CreateDevice serves with
//! `fsdev_aio_create` and SNAP exposes to hosts as virtio-fs. Many hosts
//! may mount it at once (every access mode).
//!
//! Why a filesystem per volume: a volume must not hold more than it was
//! created with, and hosts must see its own size and use in `statfs` (SPDK's
//! fsdev answers statfs with `fstatvfs` of the directory, and kubelet's
//! capacity metrics come from it). A quota on a shared tree gives the
//! first and not the second (btrfs' statfs ignores qgroups), and project
//! quotas, which would give both, need a kernel built with quota support,
//! which the machines we test on lack. An ext4 of the volume's size gives
//! both on any kernel: `df` on a host shows the volume, and a write past it
//! fails with ENOSPC. On a BlueField the DPU reaches the share over NFS (a
//! client mount of the server's export at the same path, exported with
//! `crossmnt` so the volumes' mounts show through) and this controller runs
//! where the filesystem is (the file server), so the images and their mounts
//! are the server's; on one machine the share is a local directory.
//!
//! The share must support reflinks (btrfs, or XFS made with `reflink=1`):
//! snapshots and clones are reflink copies of images, instant and taking no
//! room until written. Probe says so otherwise. Layout:
//! - `.images/<volume id>.img`: a volume's image, sparse, as long as the
//!   volume's size, always whole (made under `.<volume id>.img.tmp`, then
//!   renamed), so a crashed CreateVolume leaves at most a hidden temporary
//!   that the next attempt replaces and DeleteVolume removes;
//! - `<volume id>`: the image's mount point, immutable (`chattr +i`) under
//!   the mount, so if the mount is ever missing (the share's machine
//!   rebooted and this controller has not started yet) nothing writes into
//!   the share's own directory: hosts get EPERM, never a volume that
//!   forgets;
//! - `.snapshots/<snapshot id>.img`: a snapshot, a reflink copy of its
//!   volume's image, never mounted (made the same way), its record in
//!   `.snapshots/records/`;
//! - `.<id>.img.deleting`: an image being removed (renamed there first, so
//!   it is gone from every listing at once).
//!
//! A clone (of a volume or a snapshot) is a reflink copy of its source's
//! image, grown offline (`e2fsck`, `resize2fs`) when asked bigger, then
//! mounted. Expansion grows the image and the mounted ext4 online: hosts see
//! the room at once and nothing grows on the node. (A controller without
//! `CAP_SYS_RESOURCE`, which the kernel wants for that, grows a volume that
//! nothing serves unmounted, and refuses one that is served.) Capacity:
//! `--fs-share-capacity` bytes (default: the filesystem's size) of volume
//! and snapshot images, within the filesystem's free space. QoS limits are
//! for block devices (SPDK's bdev QoS): a filesystem volume has none.
//!
//! A snapshot is cut with its volume frozen (`fsfreeze`): the copy is a
//! clean ext4 of one instant. A group snapshot freezes every member, copies
//! each and thaws them all: one instant for the whole group, whatever is
//! written meanwhile (writes wait for the thaw, a moment later). A freeze
//! never outlives its call ([`fs_image::Frozen`]); one a crash left is thawed
//! at start-up, when every volume's image is mounted again (a reboot loses
//! the mounts): [`VolumeBackend::recover`].

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use snap_csi::json_dir::JsonDir;
use snap_csi::node::service::EMULATION_KEY;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tonic::Status;

use super::aio::{blocking, free_and_total};
use super::fs_image::{self as image, CLEANUP, Frozen, beside, exists, length, rename};
use super::ids::{parse_snapshot_id, parse_volume_id};
use super::sizes::{MIB, Room};
use super::store::{Found, Source, VolumeBackend};
use crate::backend::{BACKEND_KEY, FS, Kind, PATH_KEY};
use crate::errors::Failure;
use crate::qos::QosLimits;

const IMAGES: &str = ".images";
const SNAPSHOTS: &str = ".snapshots";
const RECORDS: &str = "records";
const IMG: &str = ".img";
/// The emulation of every filesystem volume, which the node reads.
pub const VIRTIO_FS: &str = "virtio-fs";

/// A share of volume images.
#[derive(Debug)]
pub struct FsShare {
    dir: PathBuf,
    capacity: Option<u64>,
    records: JsonDir,
    /// Mounting and unmounting one at a time, so a volume is never mounted
    /// twice over itself.
    mounts: Mutex<()>,
    /// Freezes one at a time, so two snapshots never freeze one volume;
    /// also held while a volume's image changes unmounted (an expansion
    /// grown offline). Taken before `mounts` when both are.
    freezes: Mutex<()>,
    /// Whether the start-up recovery ran (see [`VolumeBackend::recover`]).
    recovered: AtomicBool,
}

impl FsShare {
    /// The share at `dir` (absolute, as SNAP sees it too); its image and
    /// snapshot directories are created if missing. Nothing else is checked
    /// here: Probe says whether the share can serve.
    pub fn open(dir: &Path, capacity: Option<u64>) -> io::Result<FsShare> {
        let snapshots = dir.join(SNAPSHOTS);
        fs::create_dir_all(dir.join(IMAGES))?;
        fs::create_dir_all(&snapshots)?;
        Ok(FsShare {
            dir: dir.to_path_buf(),
            capacity,
            records: JsonDir::open(snapshots.join(RECORDS))?,
            mounts: Mutex::new(()),
            freezes: Mutex::new(()),
            recovered: AtomicBool::new(false),
        })
    }

    /// Where the volume is served: its image's mount point.
    fn volume_path(&self, volume_id: &str) -> PathBuf {
        self.dir.join(volume_id)
    }

    fn image_path(&self, volume_id: &str) -> PathBuf {
        self.dir.join(IMAGES).join(format!("{volume_id}{IMG}"))
    }

    fn snapshot_path(&self, snapshot_id: &str) -> PathBuf {
        self.dir.join(SNAPSHOTS).join(format!("{snapshot_id}{IMG}"))
    }

    /// `(id, size)` of the images in `dir` whose ids `ours` accepts.
    async fn images_in(
        &self,
        dir: PathBuf,
        ours: fn(&str) -> bool,
    ) -> Result<Vec<(String, u64)>, Status> {
        blocking(move || {
            let mut out = vec![];
            let entries = fs::read_dir(&dir).map_err(|e| Failure::file("listing", &dir, e))?;
            for entry in entries {
                let entry = entry.map_err(|e| Failure::file("listing", &dir, e))?;
                let name = entry.file_name();
                let Some(id) = name.to_str().and_then(|n| n.strip_suffix(IMG)) else {
                    continue;
                };
                if !ours(id) {
                    continue;
                }
                match entry.metadata() {
                    Ok(meta) => out.push((id.to_string(), meta.len())),
                    // Removed since it was listed.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(Failure::file("looking at", &entry.path(), e).into()),
                }
            }
            out.sort();
            Ok(out)
        })
        .await
    }

    async fn volume_sizes(&self) -> Result<Vec<(String, u64)>, Status> {
        let ours = |n: &str| matches!(parse_volume_id(n), Some((Kind::Fs, _)));
        self.images_in(self.dir.join(IMAGES), ours).await
    }

    async fn snapshot_images(&self) -> Result<Vec<(String, u64)>, Status> {
        let ours = |n: &str| matches!(parse_snapshot_id(n), Some((Kind::Fs, _)));
        self.images_in(self.dir.join(SNAPSHOTS), ours).await
    }

    /// Mounts the volume's image unless it is mounted.
    async fn ensure_mounted(&self, volume_id: &str, deadline: Instant) -> Result<(), Status> {
        let dir = self.volume_path(volume_id);
        let _turn = self.mounts.lock().await;
        if image::mounted(&dir).await?.is_some() {
            return Ok(());
        }
        image::mount(&self.image_path(volume_id), &dir, deadline).await
    }

    /// Reflink copies of each `(volume id or snapshot image, temporary)`
    /// pair, the mounted volumes among the sources frozen around them all:
    /// every copy is of one instant.
    async fn copy_frozen(
        &self,
        copies: &[(Source, PathBuf)],
        deadline: Instant,
    ) -> Result<(), Status> {
        let _turn = self.freezes.lock().await;
        let mut mounts = vec![];
        for (source, _) in copies {
            if let Source::Volume(id) = source {
                let dir = self.volume_path(id);
                if image::mounted(&dir).await?.is_some() {
                    mounts.push(dir);
                }
            }
        }
        let frozen = Frozen::freeze(mounts, deadline).await?;
        let mut copied = Ok(());
        for (source, temp) in copies {
            let from = match source {
                Source::Volume(id) => self.image_path(id),
                Source::Snapshot(id) => self.snapshot_path(id),
            };
            copied = image::reflink(&from, temp, deadline).await;
            if copied.is_err() {
                break;
            }
        }
        frozen.thaw().await;
        copied
    }

    /// Removes the image at `path` and its temporary: renamed aside first,
    /// so a listing never shows a half-removed one.
    async fn remove_image(&self, path: &Path) -> Result<(), Status> {
        let aside = beside(path, "deleting");
        if exists(path).await? {
            rename(path, &aside).await?;
        }
        image::remove_file(&aside).await?;
        image::remove_file(&beside(path, "tmp")).await
    }

    /// The size of the source's image, NOT_FOUND when it is gone.
    async fn source_size(&self, source: &Source) -> Result<u64, Status> {
        let (path, what) = match source {
            Source::Volume(id) => (self.image_path(id), format!("volume {id}")),
            Source::Snapshot(id) => (self.snapshot_path(id), format!("snapshot {id}")),
        };
        length(&path)
            .await?
            .ok_or_else(|| Status::not_found(format!("{what} does not exist")))
    }
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

    async fn room(&self, _deadline: Instant) -> Result<Room, Status> {
        let dir = self.dir.clone();
        let (free, fs_total) = blocking(move || {
            let stat = nix::sys::statvfs::statvfs(&dir).map_err(|e| {
                Failure::file("reading the free space of", &dir, io::Error::from(e))
            })?;
            Ok(free_and_total(&stat))
        })
        .await?;
        let used: u64 = self
            .volume_sizes()
            .await?
            .into_iter()
            .chain(self.snapshot_images().await?)
            .map(|(_, size)| size)
            .sum();
        let total = self.capacity.unwrap_or(fs_total);
        Ok(Room {
            total,
            available: total.saturating_sub(used).min(free),
            unit: MIB,
        })
    }

    /// A volume whose image is not mounted is not complete: CreateVolume
    /// mounts it.
    async fn find(&self, volume_id: &str, _deadline: Instant) -> Result<Option<Found>, Status> {
        let Some(size) = length(&self.image_path(volume_id)).await? else {
            return Ok(None);
        };
        let complete = image::mounted(&self.volume_path(volume_id))
            .await?
            .is_some();
        Ok(Some(Found { size, complete }))
    }

    async fn volumes(&self, _deadline: Instant) -> Result<Vec<(String, u64)>, Status> {
        self.volume_sizes().await
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
        let target = self.image_path(volume_id);
        if length(&target).await?.is_none() {
            let temp = beside(&target, "tmp");
            match source {
                Some(source) => {
                    let from = self.source_size(source).await?;
                    self.copy_frozen(&[(source.clone(), temp.clone())], deadline)
                        .await?;
                    if size > from {
                        image::grow_offline(&temp, size, deadline).await?;
                    }
                }
                None => image::make_empty(&temp, size, deadline).await?,
            }
            rename(&temp, &target).await?;
        }
        self.ensure_mounted(volume_id, deadline).await?;
        length(&target)
            .await?
            .ok_or_else(|| Status::aborted(format!("volume {volume_id} was deleted meanwhile")))
    }

    async fn set_qos(&self, _: &str, _: &QosLimits, _: Instant) -> Result<(), Status> {
        Err(no_qos())
    }

    /// Unmounts (refused while a DPU serves it), then removes the image and
    /// the mount point; each step is skipped when done already.
    async fn delete(&self, volume_id: &str, deadline: Instant) -> Result<(), Status> {
        let dir = self.volume_path(volume_id);
        {
            let _turn = self.mounts.lock().await;
            image::unmount(&dir, deadline).await?;
            self.remove_image(&self.image_path(volume_id)).await?;
        }
        image::remove_mount_point(&dir, deadline).await
    }

    async fn expand(&self, volume_id: &str, size: u64, deadline: Instant) -> Result<(), Status> {
        let path = self.image_path(volume_id);
        if length(&path).await?.is_none() {
            return Err(Status::not_found(format!(
                "volume {volume_id} does not exist"
            )));
        }
        self.ensure_mounted(volume_id, deadline).await?;
        let dir = self.volume_path(volume_id);
        if image::grow_online(&path, &dir, size, deadline).await? {
            return Ok(());
        }
        // Not permitted online: offline, if nothing serves the volume.
        tracing::warn!(
            %volume_id,
            "the kernel refuses to grow a mounted ext4 (this controller lacks \
             CAP_SYS_RESOURCE): growing it unmounted"
        );
        // No snapshot copies the image while it changes unmounted.
        let _freezes = self.freezes.lock().await;
        let _mounts = self.mounts.lock().await;
        image::unmount(&dir, deadline).await.map_err(|s| {
            Status::failed_precondition(format!(
                "volume {volume_id} cannot grow while it is served: growing a mounted ext4 \
                 needs CAP_SYS_RESOURCE, which this controller lacks ({})",
                s.message()
            ))
        })?;
        let grown = image::grow_offline(&path, size, deadline).await;
        let remounted = image::mount(&path, &dir, deadline).await;
        grown.and(remounted)
    }

    async fn snapshot(
        &self,
        volume_id: &str,
        snapshot_id: &str,
        deadline: Instant,
    ) -> Result<(), Status> {
        let members = [(volume_id.to_string(), snapshot_id.to_string())];
        self.group_snapshot("", &members, deadline).await
    }

    async fn snapshot_sizes(&self, _deadline: Instant) -> Result<HashMap<String, u64>, Status> {
        Ok(self.snapshot_images().await?.into_iter().collect())
    }

    async fn snapshot_size(
        &self,
        snapshot_id: &str,
        _deadline: Instant,
    ) -> Result<Option<u64>, Status> {
        length(&self.snapshot_path(snapshot_id)).await
    }

    async fn delete_snapshot(&self, snapshot_id: &str, _deadline: Instant) -> Result<(), Status> {
        self.remove_image(&self.snapshot_path(snapshot_id)).await
    }

    fn snapshot_records(&self) -> &JsonDir {
        &self.records
    }

    /// Every member frozen at once, each copied, all thawed: one instant.
    /// Members whose snapshot exists are kept (a retry).
    async fn group_snapshot(
        &self,
        _group_snapshot_id: &str,
        members: &[(String, String)],
        deadline: Instant,
    ) -> Result<(), Status> {
        let mut copies = vec![];
        let mut sizes = 0u64;
        for (volume_id, snapshot_id) in members {
            let target = self.snapshot_path(snapshot_id);
            if exists(&target).await? {
                continue;
            }
            let source = Source::Volume(volume_id.clone());
            sizes += self.source_size(&source).await?;
            copies.push((source, beside(&target, "tmp"), target));
        }
        if copies.is_empty() {
            return Ok(());
        }
        // A snapshot takes its source's size from the share, like a volume.
        self.room(deadline).await?.check("a snapshot", sizes)?;
        let pairs: Vec<(Source, PathBuf)> = copies
            .iter()
            .map(|(source, temp, _)| (source.clone(), temp.clone()))
            .collect();
        self.copy_frozen(&pairs, deadline).await?;
        for (_, temp, target) in &copies {
            rename(temp, target).await?;
        }
        Ok(())
    }

    /// At start-up (the first call): thaws what a crash left frozen and
    /// mounts every volume's image that is not mounted (after a reboot,
    /// none is). A volume that cannot be mounted is logged and left to its
    /// next CreateVolume or expansion, which mount it or say why not.
    async fn recover(&self) -> Result<(), Status> {
        let _turn = self.freezes.lock().await;
        if self.recovered.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        for (volume_id, _) in self.volume_sizes().await? {
            let deadline = Instant::now() + CLEANUP;
            let dir = self.volume_path(&volume_id);
            let done = match image::mounted(&dir).await? {
                Some(_) => image::thaw(&dir, deadline).await,
                None => self.ensure_mounted(&volume_id, deadline).await,
            };
            if let Err(status) = done {
                tracing::error!(%volume_id, "recovering the volume's mount: {}", status.message());
            }
        }
        Ok(())
    }

    async fn probe(&self, deadline: Instant) -> Result<(), String> {
        let probe = self.dir.join(IMAGES).join(".probe");
        let clone = beside(&probe, "clone");
        let reflinked = async {
            tokio::fs::write(&probe, b"probe")
                .await
                .map_err(|e| Status::from(Failure::file("writing", &probe, e)))?;
            image::reflink(&probe, &clone, deadline).await
        }
        .await;
        for path in [&probe, &clone] {
            let _ = image::remove_file(path).await;
        }
        reflinked.map_err(|s| {
            format!(
                "filesystem share {} needs reflinks (btrfs, or XFS with reflink=1) for \
                 snapshots and clones: {}",
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
