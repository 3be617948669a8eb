//! A filesystem device (virtio-fs) under kubelet's own hands, step by step as
//! Kubernetes' external storage e2e specs drive it, where a real kubelet
//! cannot run here: the node stages and publishes the volume over the
//! emulated host; kubelet's work between the CSI calls (fsGroup applied to
//! the volume, subPath mounts made and cleaned up, the mount-reference check
//! before unstaging) is `kubelet_fs`, which follows kubelet's code; and
//! each pod's commands run in a process with the pod's uid, gid and
//! supplementary groups (util-linux `setpriv`), as a container's do.
//! `SNAP_CSI_TEST_DPU=split` runs the same through a DPU agent. Needs root
//! and /dev/fuse.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use common::kubelet_fs::{self, FsGroupChangePolicy};
use common::node::mount_capability;
use common::virtio_fs::Host;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;

/// A pod's security context: `runAsUser`, `runAsGroup`, and its
/// supplementary groups (`fsGroup` among them).
#[derive(Debug, Clone)]
struct Pod {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

impl Pod {
    /// A pod with no runAsUser: root, with its fsGroup (if any) as a
    /// supplementary group.
    fn root_with(fs_group: Option<u32>) -> Pod {
        Pod {
            uid: 0,
            gid: 0,
            groups: fs_group.into_iter().collect(),
        }
    }

    /// Runs `script` with `sh` in the pod's volume at `dir`, umask 022 (a
    /// container's default) unless the script sets one.
    fn run(&self, dir: &Path, script: &str) {
        let groups: Vec<String> = self.groups.iter().map(u32::to_string).collect();
        let groups = match groups.is_empty() {
            true => vec!["--clear-groups".to_string()],
            false => vec!["--groups".to_string(), groups.join(",")],
        };
        let output = Command::new("setpriv")
            .args([
                "--reuid",
                &self.uid.to_string(),
                "--regid",
                &self.gid.to_string(),
            ])
            .args(groups)
            .args(["--", "sh", "-ec", &format!("umask 022; {script}")])
            .current_dir(dir)
            .output()
            .expect("setpriv (util-linux)");
        assert!(
            output.status.success(),
            "{self:?} ran {script:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

fn gid_of(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().gid()
}

/// One row of test/e2e/storage/testsuites/fsgroupchangepolicy.go's table.
struct Spec {
    policy: FsGroupChangePolicy,
    initial: u32,
    /// The groups a first pod's `chgrp` gives `file1` and `subdir/file2` (0: none).
    changed: (u32, u32),
    second: u32,
    expected: (u32, u32),
}

fn specs() -> [Spec; 6] {
    use FsGroupChangePolicy::{Always, OnRootMismatch};
    let spec = |policy, initial, changed, second, expected| Spec {
        policy,
        initial,
        changed,
        second,
        expected,
    };
    [
        // "pod created with an initial fsgroup, new pod fsgroup applied to volume contents"
        spec(Always, 1000, (0, 0), 2000, (2000, 2000)),
        // "... volume contents ownership changed via chgrp in first pod, new pod with same
        // fsgroup applied to the volume contents"
        spec(Always, 1000, (2000, 3000), 1000, (1000, 1000)),
        // "... new pod with different fsgroup applied to the volume contents"
        spec(Always, 1000, (2000, 3000), 4000, (4000, 4000)),
        spec(OnRootMismatch, 1000, (0, 0), 2000, (2000, 2000)),
        // "... new pod with same fsgroup skips ownership changes to the volume contents"
        spec(OnRootMismatch, 1000, (2000, 3000), 1000, (2000, 3000)),
        spec(OnRootMismatch, 1000, (2000, 3000), 4000, (4000, 4000)),
    ]
}

/// The six `[Feature:FSGroupChangePolicy]` specs ("Expected root to equal
/// 1000" under a real kubelet before new entries took a setgid directory's
/// group): a first pod (root, fsGroup as its supplementary group) makes
/// `file1` and `subdir/file2`, which must carry the fsGroup, and may chgrp
/// them; the pod goes (unpublish, unstage); a second pod with another
/// fsGroup finds the groups the policy gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fsgroupchangepolicy_specs_pass_as_kubelet_runs_them() {
    let host = Host::start().await;
    let rwo = mount_capability("virtiofs", Mode::SingleNodeWriter);
    for (n, spec) in specs().iter().enumerate() {
        let share = tempfile::tempdir().unwrap();
        let case = format!("spec {n} ({:?}, {})", spec.policy, spec.initial);

        host.stage_and_publish(rwo.clone(), share.path()).await;
        kubelet_fs::set_volume_ownership(&host.target, spec.initial, spec.policy, false).unwrap();
        let first = Pod::root_with(Some(spec.initial));
        first.run(
            &host.target,
            "touch file1; mkdir subdir; touch subdir/file2",
        );
        let made = (
            gid_of(&host.target.join("file1")),
            gid_of(&host.target.join("subdir/file2")),
        );
        assert_eq!(
            made,
            (spec.initial, spec.initial),
            "{case}: the new files' group"
        );
        for (file, group) in [("file1", spec.changed.0), ("subdir/file2", spec.changed.1)] {
            if group != 0 {
                first.run(&host.target, &format!("chgrp {group} {file}"));
            }
        }
        host.take_down().await;

        host.stage_and_publish(rwo.clone(), share.path()).await;
        kubelet_fs::set_volume_ownership(&host.target, spec.second, spec.policy, false).unwrap();
        let found = (
            gid_of(&host.target.join("file1")),
            gid_of(&host.target.join("subdir/file2")),
        );
        assert_eq!(found, spec.expected, "{case}: the second pod's view");
        host.take_down().await;
        host.assert_nothing_left().await;
    }
}

/// A pod with `runAsUser: 1000, runAsGroup: 3000, fsGroup: 2000` (the
/// issue's): what it makes takes group 2000 from the setgid root, its
/// directories stay setgid, and with umask 002 another user of the fsGroup
/// writes into them, as on a local filesystem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_new_files_take_its_fs_group_and_another_member_writes_them() {
    let host = Host::start().await;
    let share = tempfile::tempdir().unwrap();
    let rwx = mount_capability("virtiofs", Mode::MultiNodeMultiWriter);
    host.stage_and_publish(rwx, share.path()).await;
    let policy = FsGroupChangePolicy::Always;
    kubelet_fs::set_volume_ownership(&host.target, 2000, policy, false).unwrap();
    let root = std::fs::metadata(&host.target).unwrap();
    assert_eq!((root.gid(), root.mode() & 0o2070), (2000, 0o2070));

    let writer = Pod {
        uid: 1000,
        gid: 3000,
        groups: vec![2000],
    };
    writer.run(
        &host.target,
        "umask 002; echo one > shared; mkdir -p dir/deeper; echo two > dir/deeper/f",
    );
    for made in ["shared", "dir", "dir/deeper", "dir/deeper/f"] {
        let meta = std::fs::metadata(host.target.join(made)).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (1000, 2000), "{made}");
        let group = if meta.is_dir() { 0o2070 } else { 0o060 };
        assert_eq!(meta.permissions().mode() & 0o2070, group, "{made}");
    }
    let other = Pod {
        uid: 1001,
        gid: 3001,
        groups: vec![2000],
    };
    other.run(
        &host.target,
        "echo three >> shared; echo four > dir/deeper/g",
    );
    assert_eq!(
        std::fs::read_to_string(share.path().join("shared")).unwrap(),
        "one\nthree\n"
    );
    assert_eq!(gid_of(&share.path().join("dir/deeper/g")), 2000);
    host.take_down().await;
    host.assert_nothing_left().await;
}

/// "should be able to unmount after the subpath directory is deleted"
/// (test/e2e/storage/testsuites/subpath.go): a pod mounts a subPath of the
/// volume, another container of it `rm -r`s that directory through the
/// whole volume, and the pod goes: kubelet must clean the subPath mount up
/// (a timeout under a real kubelet before entries were held by descriptor:
/// "error cleaning subpath mount ... directory not empty"), then unpublish
/// and unstage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subpath_whose_directory_was_deleted_is_unmounted_when_its_pod_goes() {
    let host = Host::start().await;
    let share = tempfile::tempdir().unwrap();
    let rwo = mount_capability("virtiofs", Mode::SingleNodeWriter);
    host.stage_and_publish(rwo, share.path()).await;
    let pod = Pod::root_with(None);
    pod.run(
        &host.target,
        "mkdir -p provisioning/sub && echo x > provisioning/sub/f",
    );
    let container = host
        .stack
        .path("pods/a/volume-subpaths/pvc-fs/test-container-subpath");
    let subpath = container.join("0");
    kubelet_fs::bind_subpath(&host.target, Path::new("provisioning"), &subpath).unwrap();
    assert_eq!(
        std::fs::read_to_string(subpath.join("sub/f")).unwrap(),
        "x\n"
    );

    pod.run(&host.target, "rm -r provisioning");
    let stat = std::fs::metadata(&subpath).map(|m| m.nlink());
    assert_eq!(
        stat.ok(),
        Some(0),
        "the subPath's root, deleted, as stat(2) sees it"
    );
    kubelet_fs::clean_subpaths(&container).unwrap();
    assert!(
        !container.exists(),
        "kubelet removed the container's subpaths"
    );
    host.take_down().await;
    host.assert_nothing_left().await;
}
