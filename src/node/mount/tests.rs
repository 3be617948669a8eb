//! The mount module's tests, which use its parts together.

use std::ffi::OsStr;
use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::MsFlags;

use super::filesystem::{Preen, preen_verdict};
use super::options::MountOptions;
use super::{bind_mount, mount_filesystem, unmount};
use crate::node::command::testing::{Scratch, deadline, sh};
use crate::node::device::set_block_device_read_only;
use crate::node::error::NodeError;
use crate::node::format::{FsType, format_if_blank};
use crate::node::mountinfo;

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

#[tokio::test]
async fn an_instant_of_busy_is_waited_out_a_lasting_one_is_reported() {
    let mut scratch = Scratch::new();
    let device = scratch.loop_device("disk.img", 16 << 20);
    let target = scratch.path("volume");
    assert!(bind_mount(&device, &target, false).unwrap());

    // Held until the unmount has met EBUSY once, as a probe or a forking
    // neighbour would hold it for an instant.
    let held = fs::File::open(&target).unwrap();
    crate::failpoint::once("unmount:busy", Some(&target), move || drop(held));
    assert!(unmount(&target, deadline()).await.unwrap());
    assert!(
        !crate::failpoint::pending("unmount:busy", Some(&target)),
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
