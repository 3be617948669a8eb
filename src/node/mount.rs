//! Mounting a volume's filesystem (staging), bind mounts (publishing), and
//! unmounting, through mount(2)/umount2(2) rather than mount(8): no helper
//! programs, no fstab, no shell parsing of options.
//!
//! Each operation first looks at the mount table: the same thing already
//! mounted at the target is success (a retry after a crash or a timeout),
//! something else there is `AlreadyExists`. Mount and unmount run on the
//! blocking pool under the caller's deadline (they may wait on the device);
//! one that outlives the deadline still completes, and the retry then finds
//! its result. A bind mount touches no device and runs in place.

use std::ffi::OsStr;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::mount::{MntFlags, MsFlags};
use nix::sys::statvfs::FsFlags;
use tokio::time::Instant;

use super::command;
use super::error::NodeError;
use super::format::{self, FsType, Probe};
use super::holders;
use super::mountinfo::{self, MountEntry};
use super::stats::block_device_number;

/// Mounts the `fs` filesystem on `device` at the directory `target`
/// (created if missing; its parent must exist), with the CSI `flags` and
/// read-only when asked or when the flags say `ro`.
///
/// `Ok(true)`: mounted now. `Ok(false)`: `device` was already mounted at
/// `target` with the same read-only setting. For ext4 mounted read-write and
/// mounted nowhere else, `e2fsck -p` runs first: a filesystem left dirty by a
/// crashed node is repaired before use, and one with errors preening cannot
/// fix is refused (`FailedPrecondition`) rather than mounted. (XFS needs no
/// preening: mounting replays its log.)
///
/// Errors: an unknown or malformed mount option is `InvalidArgument`; a device
/// without a mountable `fs` filesystem is `FailedPrecondition`; another
/// mount at `target` is `AlreadyExists`.
pub async fn mount_filesystem(
    device: &Path,
    target: &Path,
    fs: FsType,
    flags: &[String],
    read_only: bool,
    deadline: Instant,
) -> Result<bool, NodeError> {
    let options = MountOptions::parse(flags, read_only)?;
    let read_only = options.flags.contains(MsFlags::MS_RDONLY);
    let what = format!("mount {} at {}", device.display(), target.display());

    let (dev, tgt) = (device.to_path_buf(), target.to_path_buf());
    let mounted_elsewhere = command::run_blocking("mount-prepare", &what, deadline, move || {
        let number = block_device_number(&dev)?;
        let ours = |m: &MountEntry| Ok((m.major, m.minor) == number && m.root == Path::new("/"));
        if already_mounted(&tgt, mountinfo::at(&tgt)?, read_only, ours)? {
            return Ok(None);
        }
        ensure_directory(&tgt)?;
        let table = mountinfo::read()?;
        Ok(Some(table.iter().any(|m| (m.major, m.minor) == number)))
    })
    .await?;
    let Some(mounted_elsewhere) = mounted_elsewhere else {
        return Ok(false);
    };

    // Preening writes to the device: not for a read-only volume, and not
    // under a live mount elsewhere (e2fsck would refuse anyway).
    if fs == FsType::Ext4 && !read_only && !mounted_elsewhere {
        preen_ext4(device, deadline).await?;
    }

    let (dev, tgt) = (device.to_path_buf(), target.to_path_buf());
    // The names of the CO's options only, for explaining a refusal: the
    // kernel knows the ones we add.
    let names = options.data_names();
    let flags = options.flags;
    let data = options.data_string_for(fs);
    let result = command::run_blocking("mount", &what, deadline, move || {
        Ok(nix::mount::mount(
            Some(dev.as_path()),
            tgt.as_path(),
            Some(fs.as_str()),
            flags,
            data.as_deref(),
        ))
    })
    .await?;
    match result {
        Ok(()) => Ok(true),
        Err(Errno::EINVAL) => Err(explain_einval(device, target, fs, &names, deadline).await),
        // Preening trusts a filesystem marked clean; the kernel found otherwise.
        Err(Errno::EUCLEAN) => Err(NodeError::FailedPrecondition(format!(
            "the {fs} filesystem on {} is corrupted (the kernel refused it: {}); it is not \
             mounted. Repair it by hand ({})",
            device.display(),
            Errno::EUCLEAN.desc(),
            match fs {
                FsType::Ext4 => "e2fsck -f",
                FsType::Xfs => "xfs_repair",
            }
        ))),
        Err(errno) => Err(NodeError::errno(what, errno)),
    }
}

/// EINVAL from mount(2) means a bad option, a device without that
/// filesystem, or a damaged one; blkid tells the second apart, and a mount
/// without data options rules out the first.
async fn explain_einval(
    device: &Path,
    target: &Path,
    fs: FsType,
    names: &[String],
    deadline: Instant,
) -> NodeError {
    match format::probe(device, deadline).await {
        Ok(Probe::Filesystem(found)) if found == fs.as_str() && !names.is_empty() => {
            NodeError::InvalidArgument(format!(
                "the kernel refused to mount {} ({fs}) with the given mount flags: one of \
                 the options {} is unknown to {fs} or has a bad value (values not shown)",
                device.display(),
                names.join(", ")
            ))
        }
        Ok(Probe::Filesystem(found)) if found == fs.as_str() => {
            NodeError::FailedPrecondition(format!(
                "the kernel refused to mount the {fs} filesystem on {} at {}: it may be \
                 damaged (the kernel log says why)",
                device.display(),
                target.display()
            ))
        }
        Ok(found) => NodeError::FailedPrecondition(format!(
            "{} carries {found}, so it cannot be mounted as {fs}",
            device.display()
        )),
        Err(err) => NodeError::failed(
            format!("mount {} at {}", device.display(), target.display()),
            format!("invalid argument (EINVAL); probing the device to say why failed too: {err}"),
        ),
    }
}

/// Bind-mounts `source` at `target`, read-only when asked. A directory
/// source (a staged filesystem) gets a directory target; anything else (a
/// block device node) gets a file target, the empty file created if missing.
///
/// `Ok(false)`: `source` is already bound there with the same read-only
/// setting. Another mount at `target`, or the same one with the other
/// setting, is `AlreadyExists`.
///
/// Read-only on a device node only marks the mount: the kernel checks a
/// mount's read-only flag for files and directories, not for writes through
/// device nodes. [`set_block_device_read_only`] makes the device refuse them.
///
/// Runs on the caller's thread: a bind only links objects the kernel holds
/// already (a mounted filesystem's root, a device node) and reads or writes
/// no volume, so unlike mount and umount it cannot hang on a sick device,
/// and the trip to the blocking pool and back would cost more than the work.
pub fn bind_mount(source: &Path, target: &Path, read_only: bool) -> Result<bool, NodeError> {
    let (src, tgt) = (source, target);
    crate::metrics::host_work("bind-mount", || {
        let source_meta = fs::metadata(src)
            .map_err(|err| NodeError::io(format!("bind mount source {}", src.display()), &err))?;
        let ours = |_: &MountEntry| {
            // A bind mount shows the very inode of its source.
            let meta = fs::metadata(tgt)
                .map_err(|err| NodeError::io(format!("stat {}", tgt.display()), &err))?;
            Ok((meta.dev(), meta.ino()) == (source_meta.dev(), source_meta.ino()))
        };
        // A read-write bind of this very source where read-only is asked is
        // this publish's own, cut short between the bind and its remount (the
        // kernel takes two calls): finish it. Making a mount read-only never
        // grants access, so this cannot widen what a pod holds.
        let existing = mountinfo::at(tgt)?;
        if read_only
            && let Some(mount) = &existing
            && !mount.is_read_only()
            && ours(mount)?
        {
            remount_read_only(tgt)?;
            return Ok(true);
        }
        if already_mounted(tgt, existing, read_only, ours)? {
            return Ok(false);
        }
        if source_meta.is_dir() {
            ensure_directory(tgt)?;
        } else {
            ensure_file(tgt)?;
        }
        crate::failpoint::step("publish:target");
        nix::mount::mount(Some(src), tgt, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(
            |errno| {
                NodeError::errno(
                    format!("bind {} at {}", src.display(), tgt.display()),
                    errno,
                )
            },
        )?;
        crate::failpoint::step("publish:bind");
        if read_only && let Err(err) = remount_read_only(tgt) {
            // A writable bind where read-only was asked must not stay.
            let _ = nix::mount::umount2(tgt, MntFlags::UMOUNT_NOFOLLOW);
            return Err(err);
        }
        Ok(true)
    })
}

/// The kernel ignores MS_RDONLY when creating a bind mount; it takes a
/// remount. A bind remount sets the mount's flags to exactly those given, so
/// nosuid/nodev/noexec inherited from the source are passed again (the
/// kernel keeps the atime setting when no atime flag is given).
fn remount_read_only(target: &Path) -> Result<(), NodeError> {
    let what = || format!("remount {} read-only", target.display());
    let current =
        nix::sys::statvfs::statvfs(target).map_err(|errno| NodeError::errno(what(), errno))?;
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY;
    for (kept, flag) in [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
    ] {
        if current.flags().contains(kept) {
            flags |= flag;
        }
    }
    nix::mount::mount(None::<&str>, target, None::<&str>, flags, None::<&str>)
        .map_err(|errno| NodeError::errno(what(), errno))
}

/// Unmounts whatever is mounted at `target`, every layer if mounts are
/// stacked there (a retried mount that completed after its deadline leaves
/// two). `Ok(false)`: nothing was mounted, including when `target` does not
/// exist. Removes nothing: the target directory or file is the caller's.
///
/// A mount still in use (EBUSY, after a few short retries) is a
/// `FailedPrecondition` naming the processes /proc shows holding it, and it
/// stays mounted: never a lazy unmount (MNT_DETACH). A lazy unmount would
/// report success while the filesystem lives on under its holders, and the
/// unstage after it would take the device away from under a live
/// filesystem: lost writes and a dirty filesystem on a volume kubelet
/// believes cleanly unmounted. Refusing keeps every step after the unmount
/// (device, SNAP, record) in place, so the retry after the holder left
/// converges.
pub async fn unmount(target: &Path, deadline: Instant) -> Result<bool, NodeError> {
    /// Far more layers than any retry pattern makes; a bound so that a
    /// mount that keeps coming back cannot loop us forever.
    const MAX_LAYERS: usize = 64;
    let what = format!("unmount {}", target.display());
    let tgt = target.to_path_buf();
    let failed = {
        let what = what.clone();
        move |message: String| NodeError::failed(what.clone(), message)
    };
    command::run_blocking("umount", &what, deadline, move || {
        let mut unmounted = false;
        // A busy mount is often busy for an instant only: a probe (blkid,
        // udev) holding the device, or a child between fork and exec with an
        // inherited descriptor. Look again a few times before saying so.
        let mut busy_pauses = [5, 10, 20, 40, 80, 160]
            .into_iter()
            .map(Duration::from_millis);
        for _ in 0..MAX_LAYERS {
            if !mountinfo::is_mount_point(&tgt)? {
                return Ok(unmounted);
            }
            // NOFOLLOW: a link planted at the target must not redirect us.
            match nix::mount::umount2(tgt.as_path(), MntFlags::UMOUNT_NOFOLLOW) {
                Ok(()) => unmounted = true,
                // Someone else unmounted it between our look and our call.
                Err(Errno::EINVAL | Errno::ENOENT) => return Ok(unmounted),
                Err(Errno::EBUSY) => match busy_pauses.next() {
                    Some(pause) if Instant::now() + pause < deadline => {
                        #[cfg(test)]
                        tests::on_busy(&tgt);
                        std::thread::sleep(pause);
                    }
                    _ => return Err(busy(&tgt)),
                },
                Err(errno) => return Err(failed(errno.desc().into())),
            }
        }
        Err(failed(format!("still mounted after {MAX_LAYERS} unmounts")))
    })
    .await
}

/// The error for a mount that stays busy, naming what holds it.
fn busy(target: &Path) -> NodeError {
    let found = holders::find(target);
    let holders = if found.is_empty() {
        "no process this node can see holds it (one in another PID namespace may)".to_string()
    } else {
        holders::describe(&found)
    };
    NodeError::FailedPrecondition(format!(
        "{} is busy: {holders}. It stays mounted; retry once they are gone",
        target.display()
    ))
}

/// Marks the block device `device` read-only (or writable again) for every
/// opener on this host, with `blockdev --setro`/`--setrw`: the way to make a
/// read-only raw block volume refuse writes (EPERM), which a read-only bind
/// mount of its node cannot. Idempotent, and runs nothing when the kernel
/// already shows the wanted setting: a stage or unstage almost always finds
/// it so, and the tool costs a process (~1 ms) each time.
pub async fn set_block_device_read_only(
    device: &Path,
    read_only: bool,
    deadline: Instant,
) -> Result<(), NodeError> {
    let (major, minor) = block_device_number(device)?;
    if kernel_read_only(major, minor) == Some(read_only) {
        return Ok(());
    }
    let flag = if read_only { "--setro" } else { "--setrw" };
    command::run(
        "blockdev",
        &[OsStr::new(flag), device.as_os_str()],
        deadline,
    )
    .await?;
    Ok(())
}

/// The device's read-only flag as the kernel reports it (the real sysfs,
/// whatever tree locates devices); `None` if it cannot be read, and then the
/// tool runs anyway.
fn kernel_read_only(major: u32, minor: u32) -> Option<bool> {
    match fs::read(format!("/sys/dev/block/{major}:{minor}/ro"))
        .ok()?
        .as_slice()
    {
        b"0\n" => Some(false),
        b"1\n" => Some(true),
        _ => None,
    }
}

/// Whether what `ours` recognises is already mounted at `target` (whose
/// mount table entry is `existing`) with the wanted read-only setting; an
/// error when something else is there.
fn already_mounted(
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
fn ensure_directory(target: &Path) -> Result<(), NodeError> {
    ensure(
        target,
        "directory",
        || fs::create_dir(target),
        fs::Metadata::is_dir,
    )
}

/// Creates the empty regular file `target` if missing; an existing one is
/// never opened (it could be a device node) and must be a regular file.
fn ensure_file(target: &Path) -> Result<(), NodeError> {
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

/// What e2fsck's exit code (a bit mask, e2fsck(8)) means for mounting.
#[derive(Debug, PartialEq, Eq)]
enum Preen {
    /// 0: clean.
    Clean,
    /// 1 or 2 (with 3 their union): errors were fixed. "Reboot" (2) is for a
    /// mounted root filesystem, not a volume that is not mounted.
    Repaired,
    /// 4: errors left; preening stops at anything it may not fix alone.
    ErrorsLeft,
    /// 8 and up: e2fsck itself failed (operational, usage, cancelled, library).
    Failed,
}

fn preen_verdict(code: i32) -> Preen {
    match code {
        0 => Preen::Clean,
        1..=3 => Preen::Repaired,
        c if c > 0 && c & 4 != 0 => Preen::ErrorsLeft,
        _ => Preen::Failed,
    }
}

/// `e2fsck -p DEVICE`: repairs what is safe to repair unattended.
async fn preen_ext4(device: &Path, deadline: Instant) -> Result<(), NodeError> {
    let output =
        command::run_unchecked("e2fsck", &[OsStr::new("-p"), device.as_os_str()], deadline).await?;
    // run_unchecked makes a death by signal an error: there is a code.
    let code = output.status.code().unwrap_or(-1);
    let said = command::tool_output(&output);
    match preen_verdict(code) {
        Preen::Clean => Ok(()),
        Preen::Repaired => {
            tracing::warn!(
                device = %device.display(),
                code,
                output = %said,
                "e2fsck repaired the filesystem"
            );
            Ok(())
        }
        Preen::ErrorsLeft => Err(NodeError::FailedPrecondition(format!(
            "the ext4 filesystem on {} has errors that e2fsck -p may not repair unattended \
             (exit status {code}); it is not mounted. Repair it by hand (e2fsck -f {}): {said}",
            device.display(),
            device.display()
        ))),
        Preen::Failed => Err(NodeError::failed(
            format!("e2fsck -p {}", device.display()),
            format!("exit status {code}: {said}"),
        )),
    }
}

/// CSI mount flags turned into mount(2) arguments: the generic options
/// become MsFlags, the rest is the filesystem's data string.
///
/// No `Debug`: mount flags may carry secrets (the CSI spec says so), and the
/// data string holds their values.
struct MountOptions {
    flags: MsFlags,
    data: Vec<String>,
}

/// What one generic option does to MsFlags.
enum Generic {
    /// Sets `set`, then clears `clear` (later options win, as in mount(8)).
    Flags { set: MsFlags, clear: MsFlags },
    /// Meaningful to mount(8) or fstab only; the kernel would reject it.
    Ignored,
    /// Would change what kind of mount this is; the driver decides that.
    Refused,
}

fn generic(option: &str) -> Option<Generic> {
    use MsFlags as M;
    let set = |set: MsFlags| Generic::Flags {
        set,
        clear: M::empty(),
    };
    let clear = |clear: MsFlags| Generic::Flags {
        set: M::empty(),
        clear,
    };
    let atime = M::MS_NOATIME | M::MS_RELATIME | M::MS_STRICTATIME;
    let only = |one: MsFlags| Generic::Flags {
        set: one,
        clear: atime.difference(one),
    };
    Some(match option {
        "ro" => set(M::MS_RDONLY),
        "rw" => clear(M::MS_RDONLY),
        "nosuid" => set(M::MS_NOSUID),
        "suid" => clear(M::MS_NOSUID),
        "nodev" => set(M::MS_NODEV),
        "dev" => clear(M::MS_NODEV),
        "noexec" => set(M::MS_NOEXEC),
        "exec" => clear(M::MS_NOEXEC),
        "sync" => set(M::MS_SYNCHRONOUS),
        "async" => clear(M::MS_SYNCHRONOUS),
        "dirsync" => set(M::MS_DIRSYNC),
        "mand" => set(M::MS_MANDLOCK),
        "nomand" => clear(M::MS_MANDLOCK),
        "noatime" => only(M::MS_NOATIME),
        "relatime" => only(M::MS_RELATIME),
        "strictatime" => only(M::MS_STRICTATIME),
        "atime" => clear(M::MS_NOATIME),
        "norelatime" => clear(M::MS_RELATIME),
        "nostrictatime" => clear(M::MS_STRICTATIME),
        "nodiratime" => set(M::MS_NODIRATIME),
        "diratime" => clear(M::MS_NODIRATIME),
        "lazytime" => set(M::MS_LAZYTIME),
        "nolazytime" => clear(M::MS_LAZYTIME),
        "iversion" => set(M::MS_I_VERSION),
        "noiversion" => clear(M::MS_I_VERSION),
        "silent" => set(M::MS_SILENT),
        "loud" => clear(M::MS_SILENT),
        "defaults" | "auto" | "noauto" | "nofail" | "_netdev" => Generic::Ignored,
        o if o.starts_with("x-") || o.starts_with("X-") => Generic::Ignored,
        "bind" | "rbind" | "move" | "remount" | "shared" | "rshared" | "private" | "rprivate"
        | "slave" | "rslave" | "unbindable" | "runbindable" => Generic::Refused,
        _ => return None,
    })
}

impl MountOptions {
    /// Each CSI flag may itself hold a comma-separated list, as in fstab.
    fn parse(flags: &[String], read_only: bool) -> Result<MountOptions, NodeError> {
        let mut options = MountOptions {
            flags: MsFlags::empty(),
            data: Vec::new(),
        };
        for option in flags.iter().flat_map(|f| f.split(',')).map(str::trim) {
            if option.is_empty() {
                continue;
            }
            if option.contains('\0') {
                return Err(NodeError::InvalidArgument(
                    "a mount flag contains a NUL byte".into(),
                ));
            }
            match generic(option) {
                Some(Generic::Flags { set, clear }) => {
                    options.flags.insert(set);
                    options.flags.remove(clear);
                }
                Some(Generic::Ignored) => {}
                Some(Generic::Refused) => {
                    return Err(NodeError::InvalidArgument(format!(
                        "mount flag {option:?} is not allowed: the driver decides how the volume is mounted"
                    )));
                }
                None => options.data.push(option.to_owned()),
            }
        }
        if read_only {
            options.flags.insert(MsFlags::MS_RDONLY);
        }
        Ok(options)
    }

    fn data_string(&self) -> Option<String> {
        (!self.data.is_empty()).then(|| self.data.join(","))
    }

    /// The data string with what every mount of `fs` needs.
    ///
    /// xfs always gets `nouuid`. XFS refuses to mount a filesystem whose
    /// UUID a mounted one already has, and every clone of a volume (a
    /// snapshot restored, a volume cloned, a copy of the backing file) has
    /// its source's UUID, so without it a pod cannot use a clone on a node
    /// where the source is mounted. The option only skips that check: a
    /// volume is identified by its device (found from SNAP's names and
    /// sysfs), never by its filesystem UUID, and log recovery is unaffected.
    /// Rewriting the clone's UUID instead (`xfs_admin -U generate`) would
    /// change the user's data and needs a clean log, which a clone of a
    /// mounted volume does not have. (The EBS and GCE PD drivers do the same.)
    fn data_string_for(mut self, fs: FsType) -> Option<String> {
        if fs == FsType::Xfs && !self.data.iter().any(|o| o == "nouuid") {
            self.data.push("nouuid".into());
        }
        self.data_string()
    }

    /// The data options' names without their values, for messages.
    fn data_names(&self) -> Vec<String> {
        self.data
            .iter()
            .map(|o| o.split('=').next().unwrap_or_default().to_owned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::fs::FileTypeExt;

    use super::super::command::testing::{Scratch, deadline, sh};
    use super::super::format::format_if_blank;
    use super::*;

    fn strings(flags: &[&str]) -> Vec<String> {
        flags.iter().map(|s| s.to_string()).collect()
    }

    fn parsed(flags: &[&str], read_only: bool) -> (MsFlags, Option<String>) {
        let options = MountOptions::parse(&strings(flags), read_only).unwrap();
        let data = options.data_string();
        (options.flags, data)
    }

    #[test]
    fn options_split_into_flags_and_data() {
        use MsFlags as M;
        assert_eq!(parsed(&[], false), (M::empty(), None));
        assert_eq!(
            parsed(
                &["noatime", "nosuid,nodev", " commit=7 ", "", "discard"],
                false
            ),
            (
                M::MS_NOATIME | M::MS_NOSUID | M::MS_NODEV,
                Some("commit=7,discard".into())
            )
        );
        assert_eq!(parsed(&["ro"], false).0, M::MS_RDONLY);
        // Later wins, and read_only from the request wins over everything.
        assert_eq!(parsed(&["ro", "rw"], false).0, M::empty());
        assert_eq!(parsed(&["rw"], true).0, M::MS_RDONLY);
        assert_eq!(parsed(&["noatime", "relatime"], false).0, M::MS_RELATIME);
        assert_eq!(
            parsed(&["relatime", "strictatime"], false).0,
            M::MS_STRICTATIME
        );
        assert_eq!(parsed(&["strictatime", "noatime"], false).0, M::MS_NOATIME);
        assert_eq!(parsed(&["noatime", "atime"], false).0, M::empty());
        assert_eq!(
            parsed(&["sync,dirsync,nodiratime,lazytime,noexec"], false).0,
            M::MS_SYNCHRONOUS | M::MS_DIRSYNC | M::MS_NODIRATIME | M::MS_LAZYTIME | M::MS_NOEXEC
        );
        assert_eq!(
            parsed(&["defaults", "nofail", "_netdev", "x-systemd.foo"], false),
            (M::empty(), None)
        );
    }

    #[test]
    fn options_that_change_the_kind_of_mount_are_refused() {
        for bad in ["bind", "rbind", "remount", "move", "rshared", "private"] {
            let err = MountOptions::parse(&strings(&["noatime", bad]), false).err();
            assert!(
                matches!(&err, Some(NodeError::InvalidArgument(m)) if m.contains(bad)),
                "{bad}: {err:?}"
            );
        }
        let err = MountOptions::parse(&strings(&["a\0b"]), false).err();
        assert!(
            matches!(err, Some(NodeError::InvalidArgument(_))),
            "{err:?}"
        );
    }

    #[test]
    fn data_names_hide_values() {
        let options =
            MountOptions::parse(&strings(&["user=me,password=s3cret", "noatime"]), false).unwrap();
        assert_eq!(options.data_names(), ["user", "password"]);
    }

    #[test]
    fn e2fsck_exit_codes() {
        assert_eq!(preen_verdict(0), Preen::Clean);
        assert_eq!(preen_verdict(1), Preen::Repaired);
        assert_eq!(preen_verdict(2), Preen::Repaired);
        assert_eq!(preen_verdict(3), Preen::Repaired);
        assert_eq!(preen_verdict(4), Preen::ErrorsLeft);
        assert_eq!(preen_verdict(5), Preen::ErrorsLeft);
        assert_eq!(preen_verdict(12), Preen::ErrorsLeft);
        assert_eq!(preen_verdict(8), Preen::Failed);
        assert_eq!(preen_verdict(16), Preen::Failed);
        assert_eq!(preen_verdict(32), Preen::Failed);
        assert_eq!(preen_verdict(-1), Preen::Failed);
    }

    /// Edits the unmounted ext4 filesystem on `device` behind the kernel's back.
    fn debugfs(device: &Path, request: &str) {
        let args = [
            "-w".as_ref(),
            "-R".as_ref(),
            OsStr::new(request),
            device.as_os_str(),
        ];
        sh("debugfs", &args);
    }

    fn write_error(path: &Path) -> Option<Errno> {
        fs::write(path, b"x")
            .err()
            .map(|e| Errno::from_raw(e.raw_os_error().unwrap_or(0)))
    }

    /// A loop device over a new image, formatted with `fs`.
    async fn formatted(scratch: &mut Scratch, size: u64, fs: FsType) -> PathBuf {
        let device = scratch.loop_device("disk.img", size);
        assert!(format_if_blank(&device, fs, deadline()).await.unwrap());
        device
    }

    /// Format, mount with flags, check the table, remount idempotently,
    /// unmount twice, mount again: the data is still there.
    async fn mount_with_flags(fs: FsType, size: u64, data_option: &str) {
        let mut scratch = Scratch::new();
        let device = formatted(&mut scratch, size, fs).await;
        let staging = scratch.path("staging");
        let flags = strings(&["noatime", "nosuid,nodev", data_option]);

        assert!(
            mount_filesystem(&device, &staging, fs, &flags, false, deadline())
                .await
                .unwrap()
        );
        let entry = mountinfo::at(&staging).unwrap().expect("mounted");
        assert_eq!(entry.fs_type, fs.as_str());
        assert_eq!(entry.source, device.to_string_lossy());
        for option in ["rw", "noatime", "nosuid", "nodev"] {
            assert!(
                entry.options.iter().any(|o| o == option),
                "{option}: {entry:?}"
            );
        }
        assert!(
            entry.super_options.iter().any(|o| o == data_option),
            "{entry:?}"
        );
        fs::write(staging.join("file"), b"kept").unwrap();

        // A retry finds it mounted; a different read-only setting conflicts.
        assert!(
            !mount_filesystem(&device, &staging, fs, &flags, false, deadline())
                .await
                .unwrap()
        );
        let err = mount_filesystem(&device, &staging, fs, &flags, true, deadline())
            .await
            .unwrap_err();
        assert!(matches!(err, NodeError::AlreadyExists(_)), "{err:?}");

        assert!(unmount(&staging, deadline()).await.unwrap());
        assert!(!unmount(&staging, deadline()).await.unwrap());
        assert!(staging.is_dir(), "unmount removes nothing");

        assert!(!format_if_blank(&device, fs, deadline()).await.unwrap());
        assert!(
            mount_filesystem(&device, &staging, fs, &[], false, deadline())
                .await
                .unwrap()
        );
        assert_eq!(fs::read(staging.join("file")).unwrap(), b"kept");
        assert!(unmount(&staging, deadline()).await.unwrap());
    }

    #[tokio::test]
    async fn mount_ext4_with_flags_idempotently() {
        mount_with_flags(FsType::Ext4, 64 << 20, "commit=7").await;
    }

    #[tokio::test]
    async fn mount_xfs_with_flags_idempotently() {
        mount_with_flags(FsType::Xfs, 320 << 20, "logbsize=64k").await;
    }

    #[tokio::test]
    async fn read_only_mount_refuses_writes() {
        let mut scratch = Scratch::new();
        let device = formatted(&mut scratch, 64 << 20, FsType::Ext4).await;
        let staging = scratch.path("staging");
        assert!(
            mount_filesystem(&device, &staging, FsType::Ext4, &[], true, deadline())
                .await
                .unwrap()
        );
        assert!(mountinfo::at(&staging).unwrap().unwrap().is_read_only());
        assert_eq!(write_error(&staging.join("f")), Some(Errno::EROFS));
        // "ro" among the flags means the same as read_only.
        let ro = strings(&["ro"]);
        assert!(
            !mount_filesystem(&device, &staging, FsType::Ext4, &ro, false, deadline())
                .await
                .unwrap()
        );
    }

    #[tokio::test]
    async fn bad_options_are_invalid_argument_and_leave_nothing_mounted() {
        let mut scratch = Scratch::new();
        let device = formatted(&mut scratch, 64 << 20, FsType::Ext4).await;
        let staging = scratch.path("staging");
        for bad in [
            &["noatime", "no_such_option"][..],
            &["commit=notanumber"],
            &["bind"],
        ] {
            let err = mount_filesystem(
                &device,
                &staging,
                FsType::Ext4,
                &strings(bad),
                false,
                deadline(),
            )
            .await
            .unwrap_err();
            assert!(
                matches!(err, NodeError::InvalidArgument(_)),
                "{bad:?}: {err:?}"
            );
            assert!(
                !err.to_string().contains("notanumber"),
                "values stay out: {err}"
            );
            assert!(mountinfo::at(&staging).unwrap().is_none());
        }
    }

    #[tokio::test]
    async fn mounting_the_wrong_filesystem_type_says_what_is_there() {
        let mut scratch = Scratch::new();
        let device = scratch.loop_device("disk.img", 64 << 20);
        let staging = scratch.path("staging");
        let err = mount_filesystem(&device, &staging, FsType::Ext4, &[], true, deadline())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, NodeError::FailedPrecondition(m) if m.contains("no signature")),
            "{err:?}"
        );
        format_if_blank(&device, FsType::Ext4, deadline())
            .await
            .unwrap();
        let err = mount_filesystem(&device, &staging, FsType::Xfs, &[], false, deadline())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, NodeError::FailedPrecondition(m) if m.contains("existing ext4 filesystem")),
            "{err:?}"
        );
        assert!(mountinfo::at(&staging).unwrap().is_none());
    }

    #[tokio::test]
    async fn another_mount_at_the_target_is_already_exists() {
        let mut scratch = Scratch::new();
        let one = scratch.loop_device("one.img", 64 << 20);
        let two = scratch.loop_device("two.img", 64 << 20);
        let staging = scratch.path("staging");
        for device in [&one, &two] {
            format_if_blank(device, FsType::Ext4, deadline())
                .await
                .unwrap();
        }
        mount_filesystem(&one, &staging, FsType::Ext4, &[], false, deadline())
            .await
            .unwrap();
        let err = mount_filesystem(&two, &staging, FsType::Ext4, &[], false, deadline())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, NodeError::AlreadyExists(m) if m.contains(&*one.to_string_lossy())),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn ext4_with_errors_preening_cannot_fix_is_not_mounted() {
        let mut scratch = Scratch::new();
        let device = formatted(&mut scratch, 64 << 20, FsType::Ext4).await;
        let staging = scratch.path("staging");
        // A cleared root inode is beyond what preening may repair alone.
        debugfs(&device, "clri <2>");
        // Marked clean, preening skips it; mounting finds the damage.
        let err = mount_filesystem(&device, &staging, FsType::Ext4, &[], false, deadline())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, NodeError::FailedPrecondition(m) if m.contains("corrupted")),
            "{err:?}"
        );
        // Marked not clean (a crash), preening checks and gives up.
        debugfs(&device, "ssv state 0");
        let err = mount_filesystem(&device, &staging, FsType::Ext4, &[], false, deadline())
            .await
            .unwrap_err();
        let NodeError::FailedPrecondition(message) = &err else {
            panic!("{err:?}");
        };
        assert!(message.contains("UNEXPECTED INCONSISTENCY"), "{message}");
        assert!(mountinfo::at(&staging).unwrap().is_none());
    }

    #[tokio::test]
    async fn ext4_left_dirty_is_preened_and_mounted() {
        let mut scratch = Scratch::new();
        let device = formatted(&mut scratch, 64 << 20, FsType::Ext4).await;
        let staging = scratch.path("staging");
        // A wrong free-blocks count is what a crash leaves; preening fixes it.
        debugfs(&device, "ssv free_blocks_count 1");
        debugfs(&device, "ssv state 0");
        assert!(
            mount_filesystem(&device, &staging, FsType::Ext4, &[], false, deadline())
                .await
                .unwrap()
        );
        fs::write(staging.join("f"), b"ok").unwrap();
        assert!(unmount(&staging, deadline()).await.unwrap());
        // Unchecked, the kernel would have mounted it and left it "not clean".
        let args = ["-h".as_ref(), device.as_os_str()];
        let header = sh("dumpe2fs", &args);
        assert!(
            header
                .lines()
                .any(|l| l.starts_with("Filesystem state:") && l.trim_end().ends_with(" clean")),
            "{header}"
        );
    }

    #[tokio::test]
    async fn bind_mounts_read_write_and_read_only() {
        let mut scratch = Scratch::new();
        let device = formatted(&mut scratch, 64 << 20, FsType::Ext4).await;
        let staging = scratch.path("staging");
        let (rw, ro) = (scratch.path("pod-rw"), scratch.path("pod-ro"));
        let flags = strings(&["nosuid", "nodev", "noatime"]);
        mount_filesystem(&device, &staging, FsType::Ext4, &flags, false, deadline())
            .await
            .unwrap();

        assert!(bind_mount(&staging, &rw, false).unwrap());
        fs::write(rw.join("through-bind"), b"hello").unwrap();
        assert_eq!(fs::read(staging.join("through-bind")).unwrap(), b"hello");

        assert!(bind_mount(&staging, &ro, true).unwrap());
        let entry = mountinfo::at(&ro).unwrap().unwrap();
        assert!(entry.is_read_only());
        // The remount to read-only kept what the staged mount had.
        for option in ["ro", "nosuid", "nodev", "noatime"] {
            assert!(
                entry.options.iter().any(|o| o == option),
                "{option}: {entry:?}"
            );
        }
        assert_eq!(fs::read(ro.join("through-bind")).unwrap(), b"hello");
        assert_eq!(write_error(&ro.join("refused")), Some(Errno::EROFS));
        assert_eq!(write_error(&ro.join("through-bind")), Some(Errno::EROFS));
        assert!(!mountinfo::at(&staging).unwrap().unwrap().is_read_only());

        // Retries succeed; the other read-only setting or another source conflicts.
        assert!(!bind_mount(&staging, &rw, false).unwrap());
        assert!(!bind_mount(&staging, &ro, true).unwrap());
        let err = bind_mount(&staging, &ro, false).unwrap_err();
        assert!(matches!(err, NodeError::AlreadyExists(_)), "{err:?}");
        let elsewhere = scratch.path("elsewhere");
        fs::create_dir(&elsewhere).unwrap();
        let err = bind_mount(&elsewhere, &rw, false).unwrap_err();
        assert!(matches!(err, NodeError::AlreadyExists(_)), "{err:?}");

        for target in [&rw, &ro] {
            assert!(unmount(target, deadline()).await.unwrap());
            assert!(!unmount(target, deadline()).await.unwrap());
        }
        assert!(unmount(&staging, deadline()).await.unwrap());
    }

    #[tokio::test]
    async fn block_bind_mount_onto_a_file_exposes_the_device() {
        let mut scratch = Scratch::new();
        let device = scratch.loop_device("disk.img", 16 << 20);
        let publish = scratch.path("block-publish");
        let target = publish.join("volume");
        fs::create_dir(&publish).unwrap();

        assert!(bind_mount(&device, &target, false).unwrap());
        let meta = fs::metadata(&target).unwrap();
        assert!(meta.file_type().is_block_device());
        assert_eq!(meta.rdev(), fs::metadata(&device).unwrap().rdev());
        {
            let mut through = OpenOptions::new().write(true).open(&target).unwrap();
            through.write_all(b"raw block").unwrap();
            through.sync_all().unwrap();
            let mut back = [0u8; 9];
            fs::File::open(&device)
                .unwrap()
                .read_exact(&mut back)
                .unwrap();
            assert_eq!(&back, b"raw block");
        }
        assert!(!bind_mount(&device, &target, false).unwrap());

        assert!(unmount(&target, deadline()).await.unwrap());
        assert!(!unmount(&target, deadline()).await.unwrap());
        let meta = fs::symlink_metadata(&target).unwrap();
        assert!(
            meta.is_file() && meta.len() == 0,
            "the placeholder file stays"
        );

        // A second bind onto the existing placeholder file works too.
        assert!(bind_mount(&device, &target, true).unwrap());
        assert!(mountinfo::at(&target).unwrap().unwrap().is_read_only());
        assert!(unmount(&target, deadline()).await.unwrap());
    }

    /// Pins the kernel behaviour documented on `bind_mount`: a read-only
    /// bind of a device node does not stop writes; the device flag does.
    #[tokio::test]
    async fn read_only_block_needs_the_device_flag() {
        let mut scratch = Scratch::new();
        let device = scratch.loop_device("disk.img", 16 << 20);
        let target = scratch.path("volume");
        assert!(bind_mount(&device, &target, true).unwrap());
        let write = |path: &Path| {
            OpenOptions::new()
                .write(true)
                .open(path)
                .and_then(|mut f| f.write_all(b"x").and_then(|()| f.sync_all()))
                .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(0)))
        };
        assert_eq!(
            write(&target),
            Ok(()),
            "the kernel changed: update bind_mount's doc"
        );

        set_block_device_read_only(&device, true, deadline())
            .await
            .unwrap();
        let refused = write(&target);
        assert!(
            matches!(refused, Err(Errno::EPERM | Errno::EACCES | Errno::EROFS)),
            "{refused:?}"
        );
        set_block_device_read_only(&device, false, deadline())
            .await
            .unwrap();
        assert_eq!(write(&target), Ok(()));
        assert!(unmount(&target, deadline()).await.unwrap());
    }

    #[tokio::test]
    async fn targets_of_the_wrong_kind_or_without_parent() {
        let mut scratch = Scratch::new();
        let device = scratch.loop_device("disk.img", 16 << 20);
        let file = scratch.path("file");
        fs::write(&file, b"").unwrap();
        let dir = scratch.path("dir");
        fs::create_dir(&dir).unwrap();

        let err = bind_mount(&device, &dir, false).unwrap_err();
        assert!(matches!(err, NodeError::FailedPrecondition(_)), "{err:?}");
        let err = bind_mount(scratch.root(), &file, false).unwrap_err();
        assert!(matches!(err, NodeError::FailedPrecondition(_)), "{err:?}");
        let orphan = scratch.path("missing-parent/target");
        let err = bind_mount(&device, &orphan, false).unwrap_err();
        assert!(
            matches!(&err, NodeError::FailedPrecondition(m) if m.contains("parent")),
            "{err:?}"
        );
        let err = bind_mount(&scratch.path("no-source"), &dir, false).unwrap_err();
        assert!(matches!(err, NodeError::NotFound(_)), "{err:?}");
        assert!(scratch.mounts().is_empty());
    }

    #[tokio::test]
    async fn unmount_of_nothing_is_false() {
        let scratch = Scratch::new();
        assert!(
            !unmount(&scratch.path("never-created"), deadline())
                .await
                .unwrap()
        );
        assert!(!unmount(scratch.root(), deadline()).await.unwrap());
        assert!(
            !unmount(Path::new("/nonexistent-snap-csi/x"), deadline())
                .await
                .unwrap()
        );
    }

    #[tokio::test]
    async fn unmount_takes_every_stacked_layer() {
        let mut scratch = Scratch::new();
        let device = scratch.loop_device("disk.img", 16 << 20);
        let target = scratch.path("volume");
        assert!(bind_mount(&device, &target, false).unwrap());
        // A second layer, as a mount that finished after its deadline leaves.
        nix::mount::mount(
            Some(device.as_path()),
            target.as_path(),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
        assert_eq!(scratch.mounts().len(), 2);
        assert!(unmount(&target, deadline()).await.unwrap());
        assert!(scratch.mounts().is_empty());
    }

    type BusyHook = (PathBuf, Box<dyn FnOnce() + Send>);

    /// What to do when an unmount of a target first meets EBUSY, before it
    /// pauses: a test's seam to end a holder's hold at exactly that point.
    static BUSY_HOOKS: std::sync::Mutex<Vec<BusyHook>> = std::sync::Mutex::new(Vec::new());

    fn when_busy(target: &Path, hook: impl FnOnce() + Send + 'static) {
        BUSY_HOOKS
            .lock()
            .unwrap()
            .push((target.to_path_buf(), Box::new(hook)));
    }

    /// Called by [`unmount`] on EBUSY: runs the hook set for `target`, once.
    pub(super) fn on_busy(target: &Path) {
        let hook = {
            let mut hooks = BUSY_HOOKS.lock().unwrap();
            let found = hooks.iter().position(|(t, _)| t == target);
            found.map(|i| hooks.swap_remove(i).1)
        };
        if let Some(hook) = hook {
            hook();
        }
    }

    #[tokio::test]
    async fn an_instant_of_busy_is_waited_out_a_lasting_one_is_reported() {
        let mut scratch = Scratch::new();
        let device = scratch.loop_device("disk.img", 16 << 20);
        let target = scratch.path("volume");
        assert!(bind_mount(&device, &target, false).unwrap());

        // Held until the unmount has met EBUSY once, as a probe or a forking
        // neighbour would hold it for an instant.
        let held = fs::File::open(&target).unwrap();
        when_busy(&target, move || drop(held));
        assert!(unmount(&target, deadline()).await.unwrap());
        assert!(
            !BUSY_HOOKS.lock().unwrap().iter().any(|(t, _)| *t == target),
            "the unmount met the busy mount"
        );
        assert!(scratch.mounts().is_empty());

        // Held throughout: reported, and the mount stays.
        assert!(bind_mount(&device, &target, false).unwrap());
        let held = fs::File::open(&target).unwrap();
        let err = unmount(&target, deadline()).await.unwrap_err();
        assert!(
            matches!(&err, NodeError::FailedPrecondition(m) if m.contains("is busy: pid ")),
            "{err:?}"
        );
        assert_eq!(scratch.mounts().len(), 1);
        drop(held);
        assert!(unmount(&target, deadline()).await.unwrap());
        assert!(scratch.mounts().is_empty());
    }
}
