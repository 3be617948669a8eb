//! What a mount finds or makes at its target: the same mount already
//! there (a retry), something else there (refused), or the directory or
//! file to mount on.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;

use crate::node::error::NodeError;
use crate::node::mountinfo::MountEntry;

/// Whether what `ours` recognises is already mounted at `target` (whose
/// mount table entry is `existing`) with the wanted read-only setting; an
/// error when something else is there.
pub(super) fn already_mounted(
    target: &Path,
    existing: Option<MountEntry>,
    read_only: bool,
    ours: impl Fn(&MountEntry) -> Result<bool, NodeError>,
) -> Result<bool, NodeError> {
    let Some(mount) = existing else {
        return Ok(false);
    };
    let word = |ro: bool| if ro { "read-only" } else { "read-write" };
    if !ours(&mount)? {
        return Err(NodeError::AlreadyExists(format!(
            "{} already has something else mounted: {} ({}, {})",
            target.display(),
            mount.source,
            mount.fs_type,
            mount.root.display()
        )));
    }
    if mount.is_read_only() != read_only {
        return Err(NodeError::AlreadyExists(format!(
            "{} is already mounted {}, but {} was requested",
            target.display(),
            word(mount.is_read_only()),
            word(read_only)
        )));
    }
    Ok(true)
}

/// Creates the directory `target` if missing (not its parents: the CO
/// creates those). Something else at that path is a failed precondition.
pub(super) fn ensure_directory(target: &Path) -> Result<(), NodeError> {
    ensure(
        target,
        "directory",
        || fs::create_dir(target),
        fs::Metadata::is_dir,
    )
}

/// Creates the empty regular file `target` if missing; an existing one is
/// never opened (it could be a device node) and must be a regular file.
pub(super) fn ensure_file(target: &Path) -> Result<(), NodeError> {
    let create = || {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
            .open(target)
            .map(drop)
    };
    ensure(target, "regular file", create, fs::Metadata::is_file)
}

/// Makes `target` with `create` unless something is already there, which
/// must then be of the `kind` that `is_kind` recognises.
fn ensure(
    target: &Path,
    kind: &str,
    create: impl FnOnce() -> io::Result<()>,
    is_kind: impl FnOnce(&fs::Metadata) -> bool,
) -> Result<(), NodeError> {
    match create() {
        Ok(()) => return Ok(()),
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
        Err(err) => return Err(creation_error(target, kind, &err)),
    }
    let meta = fs::symlink_metadata(target)
        .map_err(|err| NodeError::io(format!("stat {}", target.display()), &err))?;
    if is_kind(&meta) {
        Ok(())
    } else {
        Err(NodeError::FailedPrecondition(format!(
            "{} exists and is not a {kind}",
            target.display()
        )))
    }
}

fn creation_error(target: &Path, kind: &str, err: &io::Error) -> NodeError {
    if err.kind() == io::ErrorKind::NotFound {
        let parent = target.parent().map(PathBuf::from).unwrap_or_default();
        NodeError::FailedPrecondition(format!(
            "cannot create the {kind} {}: its parent {} does not exist",
            target.display(),
            parent.display()
        ))
    } else {
        NodeError::io(format!("create the {kind} {}", target.display()), err)
    }
}
