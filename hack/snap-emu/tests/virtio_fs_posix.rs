//! What a pod, and kubelet on its behalf, check of the files on a virtio-fs
//! volume, held to a local filesystem: who owns a new file and with which
//! mode (the pod's uid and primary group; kubelet's fsGroup on a setgid
//! volume root; the pod's umask; setuid and setgid bits it asks for), and
//! files that outlive their name (a file unlinked while open; kubelet's
//! subPath bind mount of a directory another container deleted; a file
//! another host renamed), hard links, and the emulator letting go of every
//! file the host forgets.
//!
//! The oracle: the same steps, as the same credentials (a child under
//! util-linux `setpriv`, with the umask its script sets), in a plain local
//! directory and on a host's mount of a device over the fsdev's tree; what
//! stat says of each entry (owner, group, type and mode bits) must be the
//! same in both, and each test also fixes what it expects. Needs root,
//! /dev/fuse, setpriv and perl.

mod common;

use std::fmt;
use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::VirtioFsFixture;
use nix::mount::{MntFlags, MsFlags};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

/// The emulator's fixture, and a plain directory on a local filesystem
/// beside it: what the mount is held to.
struct Fixture {
    fx: VirtioFsFixture,
    local: PathBuf,
}

impl std::ops::Deref for Fixture {
    type Target = VirtioFsFixture;

    fn deref(&self) -> &VirtioFsFixture {
        &self.fx
    }
}

impl std::ops::DerefMut for Fixture {
    fn deref_mut(&mut self) -> &mut VirtioFsFixture {
        &mut self.fx
    }
}

async fn fixture() -> Fixture {
    let fx = VirtioFsFixture::start().await;
    let local = fx.dir.path().join("local");
    fs::create_dir(&local).unwrap();
    fs::set_permissions(&local, fs::Permissions::from_mode(0o755)).unwrap();
    Fixture { fx, local }
}

/// A process's credentials, as a container runtime sets them.
#[derive(Clone, Copy, Debug)]
struct Creds {
    uid: u32,
    gid: u32,
    groups: &'static [u32],
}

/// kubelet, and a container running as root with no fsGroup.
const ROOT: Creds = Creds {
    uid: 0,
    gid: 0,
    groups: &[],
};
/// `runAsUser: 1000, runAsGroup: 3000, fsGroup: 2000` (issue 36's pod).
const POD: Creds = Creds {
    uid: 1000,
    gid: 3000,
    groups: &[2000],
};
/// `runAsUser: 1000, runAsGroup: 3000` and no fsGroup.
const NO_FS_GROUP: Creds = Creds {
    uid: 1000,
    gid: 3000,
    groups: &[],
};
/// The image's user (root) and `fsGroup: 1000`: fsgroupchangepolicy.go's pods.
const ROOT_POD: Creds = Creds {
    uid: 0,
    gid: 0,
    groups: &[1000],
};

/// `create NAME MODE`: open(2) with O_CREAT|O_EXCL and that mode, which no
/// shell tool asks for (they chmod after creating).
const PRELUDE: &str = r#"create() { perl -MFcntl -e 'sysopen(F, $ARGV[0], O_WRONLY|O_CREAT|O_EXCL, oct $ARGV[1]) or die "$ARGV[0]: $!\n"' "$1" "$2"; }
"#;

/// Runs `script` with `sh -e` in `dir` as `who`: the kernel sees exactly
/// those credentials, as it sees a container's.
fn run(who: Creds, dir: &Path, script: &str) {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid", &who.uid.to_string()])
        .args(["--regid", &who.gid.to_string()]);
    if who.groups.is_empty() {
        cmd.arg("--clear-groups");
    } else {
        let groups: Vec<String> = who.groups.iter().map(u32::to_string).collect();
        cmd.args(["--groups", &groups.join(",")]);
    }
    let out = cmd
        .args(["--", "sh", "-ec", &format!("{PRELUDE}{script}")])
        .current_dir(dir)
        .output()
        .expect("setpriv runs");
    assert!(
        out.status.success(),
        "{who:?} in {}: {script}\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What stat says of an entry (not following a symlink).
#[derive(PartialEq, Eq)]
struct Shown {
    uid: u32,
    gid: u32,
    /// Type and mode bits, setuid, setgid and sticky included.
    mode: u32,
}

impl fmt::Debug for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{} 0o{:o}", self.uid, self.gid, self.mode)
    }
}

const fn owned(uid: u32, gid: u32, mode: u32) -> Shown {
    Shown { uid, gid, mode }
}

fn shown(path: &Path) -> Shown {
    let m = fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    owned(m.uid(), m.gid(), m.mode())
}

/// Runs `steps` in order in the local directory, then the same on `mount`,
/// and answers what stat says of each of `names` locally, once the mount
/// says the same.
fn same_as_local<'a>(
    fx: &Fixture,
    mount: &Path,
    steps: &[(Creds, &str)],
    names: &[&'a str],
) -> Vec<(&'a str, Shown)> {
    for dir in [&fx.local, mount] {
        for (who, script) in steps {
            run(*who, dir, script);
        }
    }
    let seen = |dir: &Path| -> Vec<(&'a str, Shown)> {
        names.iter().map(|&n| (n, shown(&dir.join(n)))).collect()
    };
    let local = seen(&fx.local);
    assert_eq!(
        seen(mount),
        local,
        "the mount (left) against a local directory (right)"
    );
    local
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_entry_is_its_creators_uid_and_primary_group_with_the_mode_its_umask_leaves() {
    let mut fx = fixture().await;
    let mount = fx.host("a").await;
    let steps = [
        (ROOT, "chmod 0777 ."),
        (
            POD,
            "umask 002; : > file; mkdir dir; ln -s file link; mkfifo fifo",
        ),
    ];
    let shown = same_as_local(&fx, &mount, &steps, &["file", "dir", "link", "fifo"]);
    assert_eq!(
        shown,
        [
            ("file", owned(1000, 3000, 0o100664)),
            ("dir", owned(1000, 3000, 0o40775)),
            ("link", owned(1000, 3000, 0o120777)),
            ("fifo", owned(1000, 3000, 0o10664)),
        ]
    );
    drop(mount);
    fx.fx.emu.stop().await;
}

/// kubelet's fsGroup, as `SetVolumeOwnership` (pkg/volume/volume_linux.go)
/// applies it to a volume's root (the fsGroup as its group, `g+rwxs`), then
/// a pod with `runAsUser: 1000, runAsGroup: 3000, fsGroup: 2000` making a
/// file in the root, a subdirectory and files in it, as the specs of
/// test/e2e/storage/testsuites/fsgroupchangepolicy.go do: everything new is
/// the fsGroup's, and a new directory is setgid in turn (as on ext4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_setgid_volume_root_new_entries_take_the_fs_group_and_new_directories_stay_setgid() {
    let mut fx = fixture().await;
    let mount = fx.host("a").await;
    let steps = [
        (ROOT, "chgrp 2000 . && chmod g+rwxs ."),
        (
            POD,
            "umask 022; echo data > file1; mkdir subdir; echo data > subdir/file2; \
             mkdir subdir/deeper; ln -s file2 subdir/link",
        ),
    ];
    let names = [
        ".",
        "file1",
        "subdir",
        "subdir/file2",
        "subdir/deeper",
        "subdir/link",
    ];
    assert_eq!(
        same_as_local(&fx, &mount, &steps, &names),
        [
            (".", owned(0, 2000, 0o42775)),
            ("file1", owned(1000, 2000, 0o100644)),
            ("subdir", owned(1000, 2000, 0o42755)),
            ("subdir/file2", owned(1000, 2000, 0o100644)),
            ("subdir/deeper", owned(1000, 2000, 0o42755)),
            ("subdir/link", owned(1000, 2000, 0o120777)),
        ]
    );
    drop(mount);
    fx.fx.emu.stop().await;
}

/// The fsgroupchangepolicy.go specs (test/e2e/storage/testsuites), e.g.
/// "(Always)[LinuxOnly], pod created with an initial fsgroup, new pod
/// fsgroup applied to volume contents": the pod runs as the image's root
/// with `fsGroup: 1000`, and the files it makes must be group 1000. Served
/// as the caller's gid they were root's: "Expected root to equal 1000".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_pod_with_an_fs_group_makes_files_of_that_group() {
    let mut fx = fixture().await;
    let mount = fx.host("a").await;
    let steps = [
        (ROOT, "chgrp 1000 . && chmod g+rwxs ."),
        (
            ROOT_POD,
            "umask 022; touch file1; mkdir subdir; touch subdir/file2",
        ),
    ];
    let names = ["file1", "subdir", "subdir/file2"];
    assert_eq!(
        same_as_local(&fx, &mount, &steps, &names),
        [
            ("file1", owned(0, 1000, 0o100644)),
            ("subdir", owned(0, 1000, 0o42755)),
            ("subdir/file2", owned(0, 1000, 0o100644)),
        ]
    );
    drop(mount);
    fx.fx.emu.stop().await;
}

/// The pod's umask, not the server's (the emulator's is 022), and the
/// setuid and setgid bits a file's creator asks for in open(2), which a
/// server's chown to the creator must not take away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_entry_has_the_mode_its_creator_asked_for() {
    let mut fx = fixture().await;
    let mount = fx.host("a").await;
    let steps = [
        (ROOT, "chmod 0777 ."),
        (
            NO_FS_GROUP,
            "umask 002; : > f002; mkdir d002; umask 077; : > f077; mkdir d077; \
             umask 022; create suid 4755; create sgid 2755",
        ),
    ];
    let names = ["f002", "d002", "f077", "d077", "suid", "sgid"];
    assert_eq!(
        same_as_local(&fx, &mount, &steps, &names),
        [
            ("f002", owned(1000, 3000, 0o100664)),
            ("d002", owned(1000, 3000, 0o40775)),
            ("f077", owned(1000, 3000, 0o100600)),
            ("d077", owned(1000, 3000, 0o40700)),
            ("suid", owned(1000, 3000, 0o104755)),
            ("sgid", owned(1000, 3000, 0o102755)),
        ]
    );
    drop(mount);
    fx.fx.emu.stop().await;
}

/// fs/inode.c `mode_strip_sgid`: a file made setgid (and group-executable)
/// in a setgid directory by a creator outside its group is not setgid; one
/// without group-execute keeps the bit, as locally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setgid_file_made_outside_the_directorys_group_is_not_setgid() {
    let mut fx = fixture().await;
    let mount = fx.host("a").await;
    let steps = [
        (ROOT, "chgrp 2000 . && chmod 02777 ."),
        (
            NO_FS_GROUP,
            "umask 022; create sgid 2755; create no-exec 2644",
        ),
    ];
    assert_eq!(
        same_as_local(&fx, &mount, &steps, &["sgid", "no-exec"]),
        [
            ("sgid", owned(1000, 2000, 0o100755)),
            ("no-exec", owned(1000, 2000, 0o102644)),
        ]
    );
    drop(mount);
    fx.fx.emu.stop().await;
}

/// What a process sees of a file it unlinked while holding it open:
/// (contents after a write, its link count, its mode after fchmod, its
/// size and contents after ftruncate).
fn unlinked_while_open(dir: &Path) -> (Vec<u8>, u64, u32, u64, Vec<u8>) {
    let path = dir.join("scratch");
    let mut f = fs::File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    f.write_all(b"before").unwrap();
    fs::remove_file(&path).unwrap();
    let gone = fs::symlink_metadata(&path).unwrap_err();
    assert_eq!(gone.kind(), ErrorKind::NotFound, "{}", path.display());
    f.write_all_at(b" after", 6).unwrap();
    let mut written = vec![0; 12];
    f.read_exact_at(&mut written, 0).unwrap();
    let nlink = f.metadata().expect("fstat of an unlinked file").nlink();
    f.set_permissions(fs::Permissions::from_mode(0o600))
        .expect("fchmod of an unlinked file");
    let mode = f.metadata().unwrap().mode();
    f.set_len(3).expect("ftruncate of an unlinked file");
    let size = f.metadata().unwrap().len();
    let mut all = vec![0; 3];
    f.read_exact_at(&mut all, 0).unwrap();
    (written, nlink, mode, size, all)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_unlinked_while_open_is_read_written_and_changed_through_its_descriptor() {
    let mut fx = fixture().await;
    let mount = fx.host("a").await;
    let local = unlinked_while_open(&fx.local);
    assert_eq!(
        local,
        (b"before after".to_vec(), 0, 0o100600, 3, b"bef".to_vec())
    );
    assert_eq!(unlinked_while_open(&mount), local);
    drop(mount);
    fx.fx.emu.stop().await;
}

/// A bind mount taken away (lazily) if a test fails before it unmounts it.
struct Bound(Option<PathBuf>);

impl Drop for Bound {
    fn drop(&mut self) {
        if let Some(at) = self.0.take() {
            let _ = nix::mount::umount2(&at, MntFlags::MNT_DETACH);
        }
    }
}

/// kubelet's subPath: `sub` of the volume `vol` bind-mounted at `at`; then
/// another container removes `sub`; kubelet's cleanup stats the bind mount
/// and unmounts it. Answers stat's link count and whether it is a directory.
fn subpath_deleted_under_its_bind_mount(vol: &Path, at: &Path) -> (u64, bool) {
    fs::create_dir(vol.join("sub")).unwrap();
    fs::write(vol.join("sub/file"), b"x").unwrap();
    fs::create_dir(at).unwrap();
    let source = vol.join("sub");
    nix::mount::mount(
        Some(&source),
        at,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
    let mut bound = Bound(Some(at.to_owned()));
    run(ROOT, vol, "rm -r sub");
    let st = fs::metadata(at)
        .unwrap_or_else(|e| panic!("stat of the subPath mount {}: {e}", at.display()));
    nix::mount::umount2(at, MntFlags::empty())
        .unwrap_or_else(|e| panic!("unmounting the subPath mount {}: {e}", at.display()));
    bound.0 = None;
    (st.nlink(), st.is_dir())
}

/// test/e2e/storage/testsuites/subpath.go, "should be able to unmount after
/// the subpath directory is deleted": a directory removed while bind-mounted
/// elsewhere still answers stat (a deleted directory, no links), and its
/// bind mount unmounts without MNT_DETACH. Answering ENOENT, kubelet took
/// the mount for gone, never unmounted it, and the pod never terminated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subpath_directory_deleted_under_its_bind_mount_still_stats_and_unmounts() {
    let mut fx = fixture().await;
    let mount = fx.host("a").await;
    let binds = fx.dir.path().join("binds");
    fs::create_dir(&binds).unwrap();
    let local = subpath_deleted_under_its_bind_mount(&fx.local, &binds.join("local"));
    assert_eq!(local, (0, true));
    let mounted = subpath_deleted_under_its_bind_mount(&mount, &binds.join("mounted"));
    assert_eq!(mounted, local);
    drop(mount);
    fx.fx.emu.stop().await;
}

/// Another host's rename moves the name, not the file: the first host's
/// open descriptor is the same file (fstat, read), found under its new name
/// and gone from the old. A hard link is one inode under both names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_renamed_by_another_host_stays_open_and_is_found_under_its_new_name() {
    let mut fx = fixture().await;
    let a = fx.host("a").await;
    let b = fx.host("b").await;
    fs::write(a.join("old"), b"written by a").unwrap();
    let open = fs::File::open(a.join("old")).unwrap();
    let ino = open.metadata().unwrap().ino();

    fs::rename(b.join("old"), b.join("new")).unwrap();
    let after = open
        .metadata()
        .expect("fstat of a file another host renamed");
    assert_eq!((after.ino(), after.len()), (ino, 12));
    let mut read = String::new();
    (&open).read_to_string(&mut read).unwrap();
    assert_eq!(read, "written by a");
    assert_eq!(fs::metadata(a.join("new")).unwrap().ino(), ino);
    let old = fs::symlink_metadata(a.join("old")).unwrap_err();
    assert_eq!(old.kind(), ErrorKind::NotFound);

    fs::hard_link(a.join("new"), a.join("linked")).unwrap();
    let linked = fs::symlink_metadata(a.join("linked")).unwrap();
    assert_eq!((linked.ino(), linked.nlink()), (ino, 2));
    assert_eq!(open.metadata().unwrap().nlink(), 2);
    let on_b = |name: &str| fs::symlink_metadata(b.join(name)).unwrap();
    assert_eq!(on_b("new").ino(), on_b("linked").ino());
    assert_eq!(on_b("linked").nlink(), 2);
    drop(open);
    drop((a, b));
    fx.fx.emu.stop().await;
}

/// How many descriptors this process (the emulator serves in it) holds on
/// files under `tree`, deleted ones included.
fn descriptors_under(tree: &Path) -> usize {
    fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|fd| fs::read_link(fd.path()).is_ok_and(|to| to.starts_with(tree)))
        .count()
}

/// Waits until `count` watched files are freed (IN_DELETE_SELF: a deleted
/// file's last reference went, here the emulator's descriptor).
fn wait_until_freed(inotify: &Inotify, mut count: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while count > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "{count} files still held after 60 s");
        let mut fds = [nix::poll::PollFd::new(
            inotify.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let timeout = nix::poll::PollTimeout::try_from(left).unwrap();
        match nix::poll::poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => panic!("poll: {e}"),
        }
        match inotify.read_events() {
            Ok(events) => {
                let freed = events
                    .iter()
                    .filter(|e| e.mask.contains(AddWatchFlags::IN_DELETE_SELF));
                count -= freed.count();
            }
            Err(nix::errno::Errno::EAGAIN) => {}
            Err(e) => panic!("reading inotify events: {e}"),
        }
    }
}

/// Every inode the host looks up costs the emulator a descriptor while the
/// host knows it; when the host forgets it (here: the host deletes the
/// files and drops their inodes, which sends FORGET), the descriptor is
/// closed, so a long-lived mount does not run out of descriptors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forgotten_inodes_close_their_descriptors() {
    const FILES: usize = 2000;
    let mut fx = fixture().await;
    let many = fx.share.join("many");
    fs::create_dir(&many).unwrap();
    for i in 0..FILES {
        fs::File::create(many.join(i.to_string())).unwrap();
    }
    let mount = fx.host("a").await;
    let before = descriptors_under(&fx.share);
    for i in 0..FILES {
        fs::symlink_metadata(mount.join("many").join(i.to_string())).unwrap();
    }
    let held = descriptors_under(&fx.share);
    assert!(
        held > before + FILES,
        "{held} descriptors under the tree with {FILES} files looked up, {before} before"
    );

    let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).unwrap();
    inotify
        .add_watch(&many, AddWatchFlags::IN_DELETE_SELF)
        .unwrap();
    for i in 0..FILES {
        let file = many.join(i.to_string());
        inotify
            .add_watch(&file, AddWatchFlags::IN_DELETE_SELF)
            .unwrap();
    }
    fs::remove_dir_all(mount.join("many")).unwrap();
    wait_until_freed(&inotify, FILES + 1);
    assert_eq!(descriptors_under(&fx.share), before);
    drop(mount);
    fx.fx.emu.stop().await;
}
