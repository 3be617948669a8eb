//! What the filesystem backend ([`super::fs`]) does to one volume's image:
//! an ext4 in a sparse file on the share, loop-mounted on its directory.
//! Every tool runs through [`command::run`] under a deadline; the thaw that
//! ends a freeze has a deadline of its own ([`CLEANUP`]), since it must run
//! even when the caller's has passed.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use snap_csi::node::{command, mountinfo};
use tokio::time::Instant;
use tonic::Status;

use super::aio::blocking;
use crate::errors::Failure;

/// How long a thaw gets, whatever is left of the caller's deadline.
pub(super) const CLEANUP: Duration = Duration::from_secs(10);

fn os<S: AsRef<OsStr> + ?Sized>(s: &S) -> &OsStr {
    s.as_ref()
}

/// `.<name>.<what>` beside `path`: hidden from listings.
pub(super) fn beside(path: &Path, what: &str) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{what}"))
}

pub(super) async fn exists(path: &Path) -> Result<bool, Status> {
    match tokio::fs::symlink_metadata(path).await {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Failure::file("looking at", path, e).into()),
    }
}

/// The length of the file at `path`, if it exists.
pub(super) async fn length(path: &Path) -> Result<Option<u64>, Status> {
    match tokio::fs::metadata(path).await {
        Ok(meta) => Ok(Some(meta.len())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Failure::file("looking at", path, e).into()),
    }
}

/// Removes the file at `path` if it is there.
pub(super) async fn remove_file(path: &Path) -> Result<(), Status> {
    match tokio::fs::remove_file(path).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Failure::file("removing", path, e).into()),
    }
}

/// Renames `from` to `to` and makes the rename durable.
pub(super) async fn rename(from: &Path, to: &Path) -> Result<(), Status> {
    tokio::fs::rename(from, to)
        .await
        .map_err(|e| Failure::file("renaming", from, e))?;
    sync(to.parent().unwrap_or(Path::new("/"))).await
}

/// `fsync` of the file or directory at `path`.
pub(super) async fn sync(path: &Path) -> Result<(), Status> {
    let path = path.to_path_buf();
    blocking(move || {
        fs::File::open(&path)
            .and_then(|f| f.sync_all())
            .map_err(|e| Failure::file("syncing", &path, e).into())
    })
    .await
}

/// Sets the length of the file at `path` (made if missing) to `size` if it
/// is shorter: sparse, nothing written.
async fn at_least(path: &Path, size: u64) -> Result<(), Status> {
    let path = path.to_path_buf();
    blocking(move || {
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| Failure::file("opening", &path, e))?;
        let len = file
            .metadata()
            .map_err(|e| Failure::file("looking at", &path, e))?
            .len();
        if len < size {
            file.set_len(size)
                .and_then(|()| file.sync_all())
                .map_err(|e| Failure::file("growing", &path, e))?;
        }
        Ok(())
    })
    .await
}

/// A new image of `size` bytes at `path` (replacing any file there) holding
/// an empty ext4: no blocks reserved for root (a pod's user may fill it),
/// inode tables and journal zeroed lazily (the file is new, so sparse: it
/// reads as zeros already).
pub(super) async fn make_empty(path: &Path, size: u64, deadline: Instant) -> Result<(), Status> {
    remove_file(path).await?;
    at_least(path, size).await?;
    let args = [
        os("-q"),
        os("-F"),
        // One block size whatever the size (mkfs picks 1 KiB below 512 MiB).
        os("-b"),
        os("4096"),
        os("-m"),
        os("0"),
        os("-E"),
        os("lazy_itable_init=1,lazy_journal_init=1"),
        path.as_os_str(),
    ];
    command::run("mkfs.ext4", &args, deadline).await?;
    sync(path).await
}

/// `to` (replaced) becomes a reflink copy of `from`: it shares every block
/// until either is written, and takes no time whatever the size.
pub(super) async fn reflink(from: &Path, to: &Path, deadline: Instant) -> Result<(), Status> {
    remove_file(to).await?;
    let args = [os("--reflink=always"), from.as_os_str(), to.as_os_str()];
    command::run("cp", &args, deadline).await?;
    sync(to).await
}

/// Grows the unmounted image at `path` to `size` bytes, its ext4 with it
/// (`resize2fs` wants a checked filesystem first); idempotent.
pub(super) async fn grow_offline(path: &Path, size: u64, deadline: Instant) -> Result<(), Status> {
    at_least(path, size).await?;
    let output = command::run_unchecked("e2fsck", &[os("-fy"), path.as_os_str()], deadline).await?;
    // 0: clean; 1: errors corrected (a journal replayed). More is a failure.
    if output.status.code().is_none_or(|c| c > 1) {
        return Err(Status::internal(format!(
            "e2fsck -fy {} found errors it could not correct ({:?}): {}",
            path.display(),
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).trim()
        )));
    }
    command::run("resize2fs", &[path.as_os_str()], deadline).await?;
    Ok(())
}

/// Grows the image at `path`, mounted at `mount_point`, to `size` bytes and
/// its ext4 online: the loop device learns the new size (`losetup -c`),
/// then `resize2fs` fills it. Each step is a no-op when done already.
/// False when the kernel refuses to resize a mounted ext4 for want of
/// `CAP_SYS_RESOURCE` (a controller not privileged enough; some sandboxes).
pub(super) async fn grow_online(
    path: &Path,
    mount_point: &Path,
    size: u64,
    deadline: Instant,
) -> Result<bool, Status> {
    let device = match mounted(mount_point).await? {
        Some(entry) if entry.source.starts_with("/dev/loop") => entry.source,
        other => {
            return Err(Status::internal(format!(
                "{} is not mounted from a loop device ({other:?}), so its image cannot grow online",
                mount_point.display()
            )));
        }
    };
    at_least(path, size).await?;
    command::run("losetup", &[os("-c"), os(&device)], deadline).await?;
    let output = command::run_unchecked("resize2fs", &[os(&device)], deadline).await?;
    let said = String::from_utf8_lossy(&output.stderr);
    if output.status.success() {
        Ok(true)
    } else if said.contains("Permission denied to resize") {
        Ok(false)
    } else {
        Err(Status::internal(format!(
            "resize2fs {device} (mounted at {}): {}",
            mount_point.display(),
            said.trim()
        )))
    }
}

/// What is mounted at `dir`, if anything.
pub(super) async fn mounted(dir: &Path) -> Result<Option<mountinfo::MountEntry>, Status> {
    let dir = dir.to_path_buf();
    blocking(move || Ok(mountinfo::at(&dir)?)).await
}

/// Mounts the image at `path` on `dir`, which must be an empty directory;
/// `dir` is made immutable first (`chattr +i`), so while it is not mounted
/// nothing can write into it and what SPDK serves from it is refused
/// rather than written into the share's own directory.
pub(super) async fn mount(path: &Path, dir: &Path, deadline: Instant) -> Result<(), Status> {
    match tokio::fs::create_dir(dir).await {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Failure::file("making the mount point", dir, e).into()),
    }
    let empty = {
        let dir = dir.to_path_buf();
        blocking(move || {
            let mut entries = fs::read_dir(&dir).map_err(|e| Failure::file("listing", &dir, e))?;
            Ok(entries.next().is_none())
        })
        .await?
    };
    if !empty {
        return Err(Status::internal(format!(
            "{} holds files of its own, so its image is not mounted over them: it is not a \
             volume directory of this controller",
            dir.display()
        )));
    }
    command::run("chattr", &[os("+i"), dir.as_os_str()], deadline).await?;
    let args = [
        os("-t"),
        os("ext4"),
        os("-o"),
        os("loop"),
        path.as_os_str(),
        dir.as_os_str(),
    ];
    command::run("mount", &args, deadline).await?;
    Ok(())
}

/// Unmounts `dir` if something is mounted there (its loop device goes with
/// it); busy means a DPU still serves it (SPDK's fsdev holds it open).
pub(super) async fn unmount(dir: &Path, deadline: Instant) -> Result<(), Status> {
    while mounted(dir).await?.is_some() {
        let output = command::run_unchecked("umount", &[dir.as_os_str()], deadline).await?;
        if output.status.success() {
            continue;
        }
        let said = String::from_utf8_lossy(&output.stderr);
        if said.contains("busy") {
            return Err(Status::failed_precondition(format!(
                "{} is busy: something still serves the volume (a DPU's fsdev, or a process on \
                 the share's machine): {}",
                dir.display(),
                said.trim()
            )));
        }
        return Err(Status::internal(format!(
            "umount {}: {}",
            dir.display(),
            said.trim()
        )));
    }
    Ok(())
}

/// Removes the (unmounted) mount point `dir` and its immutable flag.
pub(super) async fn remove_mount_point(dir: &Path, deadline: Instant) -> Result<(), Status> {
    if !exists(dir).await? {
        return Ok(());
    }
    command::run("chattr", &[os("-i"), dir.as_os_str()], deadline).await?;
    match tokio::fs::remove_dir(dir).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Failure::file("removing the mount point", dir, e).into()),
    }
}

/// Mounted volumes frozen (`fsfreeze -f`): writes to them wait until they
/// are thawed. Thawed by [`Frozen::thaw`], or when dropped (a call given
/// up on) by a task of its own, so a freeze never outlives its call.
#[derive(Debug)]
pub(super) struct Frozen {
    mounts: Vec<PathBuf>,
}

impl Frozen {
    /// Freezes every mount of `mounts`; if one fails, those frozen are
    /// thawed before the error is answered.
    pub(super) async fn freeze(mounts: Vec<PathBuf>, deadline: Instant) -> Result<Frozen, Status> {
        let mut frozen = Frozen { mounts: vec![] };
        for mount in mounts {
            let freeze = command::run("fsfreeze", &[os("-f"), mount.as_os_str()], deadline).await;
            if let Err(error) = freeze {
                frozen.thaw().await;
                return Err(error.into());
            }
            frozen.mounts.push(mount);
        }
        Ok(frozen)
    }

    /// Thaws them all, each tried whatever the others did; a failure is
    /// logged (the volume stays frozen: writes to it wait).
    pub(super) async fn thaw(mut self) {
        thaw_all(std::mem::take(&mut self.mounts)).await;
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let mounts = std::mem::take(&mut self.mounts);
        if mounts.is_empty() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(thaw_all(mounts))),
            Err(_) => tracing::error!("volumes left frozen, no runtime to thaw them: {mounts:?}"),
        }
    }
}

async fn thaw_all(mounts: Vec<PathBuf>) {
    let deadline = Instant::now() + CLEANUP;
    for mount in mounts {
        if let Err(status) = thaw(&mount, deadline).await {
            tracing::error!(
                "thawing {} failed; writes to it wait until it is thawed: {}",
                mount.display(),
                status.message()
            );
        }
    }
}

/// `fsfreeze -u`: a mount that is not frozen is refused with EINVAL, which
/// is taken as done.
pub(super) async fn thaw(mount: &Path, deadline: Instant) -> Result<(), Status> {
    let output =
        command::run_unchecked("fsfreeze", &[os("-u"), mount.as_os_str()], deadline).await?;
    let said = String::from_utf8_lossy(&output.stderr);
    if output.status.success() || said.contains("Invalid argument") {
        Ok(())
    } else {
        Err(Status::internal(format!(
            "fsfreeze -u {}: {}",
            mount.display(),
            said.trim()
        )))
    }
}
