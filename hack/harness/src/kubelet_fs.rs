//! What kubelet itself does to a volume's mounts and files on the node, apart
//! from its CSI calls (`kubelet.rs`): the check before it unstages a
//! filesystem volume, a pod's subPath mounts made and cleaned up, and a pod's
//! fsGroup applied to the volume. Each follows kubelet's code (v1.28, which
//! the issue that asked for them ran, to v1.33) and k8s.io/mount-utils, so
//! that a test that passes here passes under a real kubelet; the crash tests
//! include this file by path, beside `kubelet.rs`.

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::mount::MsFlags;

use super::kubelet::Failure;

/// The mounts that keep kubelet from unstaging the filesystem volume staged
/// at `device_mount_path`, as kubelet finds them before NodeUnstageVolume
/// (`operation_generator.go` `GenerateUnmountDeviceFunc`, `kubelet.rs`):
/// k8s.io/mount-utils `GetMountRefs` and `SearchMountPoints` (v0.28 to
/// v0.33), filtered by kubelet's `util.HasMountRefs`. A path that is gone or
/// whose mount is corrupted (ENOTCONN and the like) has none.
pub fn device_mount_refs(device_mount_path: &Path) -> io::Result<Vec<PathBuf>> {
    use std::io::ErrorKind;
    match fs::metadata(device_mount_path) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) if is_corrupted_mount(&e) => return Ok(Vec::new()),
        Err(e) => return Err(e),
        Ok(_) => {}
    }
    let path = fs::canonicalize(device_mount_path)?;
    let table = snap_csi::node::mountinfo::read().map_err(io::Error::other)?;
    // The last mount the path is on or under (later mounts cover earlier ones).
    let Some(own) = table
        .iter()
        .rev()
        .find(|m| path.starts_with(&m.mount_point))
    else {
        return Ok(Vec::new());
    };
    let rest = path.strip_prefix(&own.mount_point).unwrap_or(Path::new(""));
    let root = if rest.as_os_str().is_empty() {
        own.root.clone()
    } else {
        own.root.join(rest)
    };
    // kubelet's own mounts of the device (another kubelet root's path to it)
    // hold the staging path's `/plugins/kubernetes.io/...` tail.
    let text = path.to_string_lossy();
    let tail = text
        .find("/plugins/kubernetes.io/")
        .map_or(&*text, |i| &text[i..]);
    Ok(table
        .iter()
        .filter(|m| m.mount_id != own.mount_id)
        .filter(|m| (m.major, m.minor, &m.root) == (own.major, own.minor, &root))
        .filter(|m| !m.mount_point.to_string_lossy().contains(tail))
        .map(|m| m.mount_point.clone())
        .collect())
}

/// mount-utils' `IsCorruptedMnt`: a mount whose filesystem went away.
fn is_corrupted_mount(e: &io::Error) -> bool {
    use nix::libc::{EACCES, EHOSTDOWN, EIO, ENOTCONN, ESTALE};
    matches!(
        e.raw_os_error(),
        Some(ENOTCONN | ESTALE | EIO | EACCES | EHOSTDOWN)
    )
}

/// kubelet's UnmountDevice before its NodeUnstageVolume: a failure, with
/// kubelet's words, while [`device_mount_refs`] finds any.
pub(crate) fn check_device_mount_refs(device_mount_path: &Path) -> Result<(), Failure> {
    let refs = device_mount_refs(device_mount_path).map_err(|e| Failure {
        code: None,
        message: format!("GetDeviceMountRefs check failed: {e}"),
    })?;
    if refs.is_empty() {
        return Ok(());
    }
    Err(Failure {
        code: None,
        message: format!(
            "GetDeviceMountRefs check failed: the device mount path {:?} is still mounted by \
             other references {refs:?}",
            device_mount_path
        ),
    })
}

/// kubelet's `doBindSubPath` (pkg/volume/util/subpath/subpath_linux.go):
/// the pod's subPath `sub` of the volume published at `volume`, opened
/// without following a symlink or leaving the volume, bind-mounted at `at`
/// (`pods/<uid>/volume-subpaths/<volume>/<container>/<n>`) through its
/// descriptor.
pub fn bind_subpath(volume: &Path, sub: &Path, at: &Path) -> io::Result<()> {
    let root = nix::fcntl::open(
        volume,
        OFlag::O_PATH | OFlag::O_DIRECTORY,
        nix::sys::stat::Mode::empty(),
    )?;
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
    let opened = nix::fcntl::openat2(&root, sub, how)?;
    let by_fd = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&opened)
    ));
    if by_fd.is_dir() {
        fs::create_dir_all(at)?;
    } else {
        fs::create_dir_all(at.parent().unwrap_or(Path::new("/")))?;
        fs::File::create(at)?;
    }
    nix::mount::mount(
        Some(&by_fd),
        at,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )?;
    Ok(())
}

/// kubelet's `doCleanSubPaths` for one container's directory of subPath
/// mounts (`pods/<uid>/volume-subpaths/<volume>/<container>`) when its pod
/// goes: each mount cleaned up as mount-utils' `CleanupMountPoint` does (a
/// path that stat(2) says is gone is skipped; a corrupted one unmounted; a
/// mount point unmounted, then removed), then the directory removed. Until
/// it succeeds kubelet keeps the pod terminating and tries again.
pub fn clean_subpaths(container_dir: &Path) -> Result<(), String> {
    let entries = fs::read_dir(container_dir)
        .map_err(|e| format!("error reading {}: {e}", container_dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        cleanup_mount_point(&path)
            .map_err(|e| format!("error cleaning subpath mount {}: {e}", path.display()))?;
    }
    fs::remove_dir(container_dir)
        .map_err(|e| format!("error deleting {}: {e}", container_dir.display()))
}

fn cleanup_mount_point(path: &Path) -> io::Result<()> {
    let corrupted = match fs::metadata(path) {
        Ok(_) => false,
        // mount-utils: "mount cleanup skipped because path does not exist".
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) if is_corrupted_mount(&e) => true,
        Err(e) => return Err(e),
    };
    let mounted = corrupted || is_mount_point(path)?;
    if mounted {
        nix::mount::umount(path)?;
    }
    if path.is_dir() {
        fs::remove_dir(path)
    } else {
        fs::remove_file(path)
    }
}

fn is_mount_point(path: &Path) -> io::Result<bool> {
    let path = fs::canonicalize(path)?;
    let table = snap_csi::node::mountinfo::read().map_err(io::Error::other)?;
    Ok(table.iter().any(|m| m.mount_point == path))
}

/// A pod's `fsGroupChangePolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsGroupChangePolicy {
    Always,
    OnRootMismatch,
}

/// kubelet's `SetVolumeOwnership` (pkg/volume/volume_linux.go) on the
/// volume published at `dir` for a pod with `fs_group`, as a driver whose
/// CSIDriver says `fsGroupPolicy: File` gets it: every file and directory,
/// the root first, given the group (symlinks too) and group read-write (read
/// with `read_only`), directories also group search and setgid; with
/// `OnRootMismatch`, nothing when the root already has all of that.
pub fn set_volume_ownership(
    dir: &Path,
    fs_group: u32,
    policy: FsGroupChangePolicy,
    read_only: bool,
) -> io::Result<()> {
    let rw = if read_only { 0o440 } else { 0o660 };
    if policy == FsGroupChangePolicy::OnRootMismatch {
        let root = fs::metadata(dir)?;
        let wanted = rw | 0o110;
        let mode = root.mode();
        if root.is_dir() && root.gid() == fs_group && mode & wanted == wanted && mode & 0o2000 != 0
        {
            return Ok(());
        }
    }
    walk(dir, &mut |path, meta| {
        std::os::unix::fs::lchown(path, None, Some(fs_group))?;
        if meta.file_type().is_symlink() {
            return Ok(());
        }
        let mask = if meta.is_dir() { rw | 0o2110 } else { rw };
        fs::set_permissions(
            path,
            fs::Permissions::from_mode(meta.mode() & 0o7777 | mask),
        )
    })
}

/// `path`, then everything under it, never following a symlink.
fn walk(
    path: &Path,
    visit: &mut impl FnMut(&Path, &fs::Metadata) -> io::Result<()>,
) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    visit(path, &meta)?;
    if meta.is_dir() {
        for entry in fs::read_dir(path)? {
            walk(&entry?.path(), visit)?;
        }
    }
    Ok(())
}
