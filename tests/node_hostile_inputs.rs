//! Every Node RPC fed requests no kubelet means to send: fields missing,
//! empty, oversize (1 MiB ids, maps past CSI's 4 KiB) or hostile (`..`, NUL
//! bytes, paths through a link to /etc or onto a published volume, access
//! modes CSI does not have). Each gets the code the CSI spec names with a
//! message saying what was wrong, and a census taken before and after every
//! call proves nothing changed: not in SNAP (functions, subsystems,
//! controllers, bdevs), not on the host (loop devices, mounts, every file,
//! directory and link under the stack's root, /etc), not in the node's
//! records. A volume staged and published beforehand keeps working, so a
//! call that reached it by a crooked path would show.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use common::node::{NodeStack, mount_capability, publish_request, stage_request};
use snap_csi::node::config::EmulationSetting;
use snap_csi::node::service::{EMULATION_KEY, PLACEMENT_KEY};
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::node_client::NodeClient;
use snap_csi::proto::csi::v1::volume_capability::AccessMode;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;
use tonic::transport::Channel;

const GOOD: &str = "pvc-good";
const MIB: usize = 1 << 20;

/// Everything a hostile call could have changed.
#[derive(Debug, PartialEq)]
struct Census {
    snap: BTreeMap<&'static str, serde_json::Value>,
    loop_devices: Vec<String>,
    mounts: Vec<String>,
    tree: BTreeMap<PathBuf, String>,
    etc: Vec<String>,
}

impl Census {
    async fn take(stack: &NodeStack) -> Census {
        let client = stack.emulator.client();
        let deadline = || tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut snap = BTreeMap::new();
        for method in [
            "emulation_function_list",
            "nvme_subsystem_list",
            "nvme_controller_list",
            "virtio_blk_controller_list",
            "bdev_get_bdevs",
        ] {
            let listing = client.call_raw(method, None, deadline()).await.unwrap();
            snap.insert(method, listing);
        }
        let root = stack.emulator.root();
        let mut tree = BTreeMap::new();
        walk(root, &mut tree);
        let mut etc: Vec<String> = std::fs::read_dir("/etc")
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        etc.sort();
        let mut mounts = common::node::mounts_under(root);
        mounts.extend(common::node::mounts_under(Path::new("/etc")));
        Census {
            snap,
            loop_devices: loop_devices_under(root),
            mounts,
            tree,
            etc,
        }
    }
}

impl Census {
    /// What differs, field by field (the tree entry by entry).
    fn diff(&self, after: &Census) -> String {
        let mut out = Vec::new();
        for (method, listing) in &self.snap {
            if after.snap.get(method) != Some(listing) {
                out.push(format!(
                    "SNAP {method}: {listing} -> {:?}",
                    after.snap.get(method)
                ));
            }
        }
        for (what, before, now) in [
            ("loop devices", &self.loop_devices, &after.loop_devices),
            ("mounts", &self.mounts, &after.mounts),
            ("/etc", &self.etc, &after.etc),
        ] {
            if before != now {
                out.push(format!("{what}: {before:?} -> {now:?}"));
            }
        }
        let paths: std::collections::BTreeSet<_> =
            self.tree.keys().chain(after.tree.keys()).collect();
        for path in paths {
            let (was, is) = (self.tree.get(path), after.tree.get(path));
            if was != is {
                out.push(format!("{}: {was:?} -> {is:?}", path.display()));
            }
        }
        out.join("; ")
    }
}

/// Every entry under `dir` (links not followed): its kind, a file's size, a
/// link's target.
fn walk(dir: &Path, tree: &mut BTreeMap<PathBuf, String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let kind = if meta.is_symlink() {
            format!("link -> {}", std::fs::read_link(&path).unwrap().display())
        } else if meta.is_dir() {
            walk(&path, tree);
            "dir".into()
        } else {
            format!("{:?} {} bytes", meta.file_type(), meta.len())
        };
        tree.insert(path, kind);
    }
}

/// Loop devices whose backing file lies under `root`.
fn loop_devices_under(root: &Path) -> Vec<String> {
    let out = std::process::Command::new("losetup")
        .args(["--list", "--noheadings", "--output", "NAME,BACK-FILE"])
        .output()
        .unwrap();
    let root = root.display().to_string();
    let mut devices: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| line.contains(&root))
        .map(str::to_string)
        .collect();
    devices.sort();
    devices
}

/// One hostile call of any Node RPC.
enum Call {
    Stage(csi::NodeStageVolumeRequest),
    Unstage(csi::NodeUnstageVolumeRequest),
    Publish(csi::NodePublishVolumeRequest),
    Unpublish(csi::NodeUnpublishVolumeRequest),
    Stats(csi::NodeGetVolumeStatsRequest),
    Expand(csi::NodeExpandVolumeRequest),
}

impl Call {
    async fn send(self, node: &mut NodeClient<Channel>) -> Result<(), tonic::Status> {
        match self {
            Call::Stage(r) => node.node_stage_volume(r).await.map(drop),
            Call::Unstage(r) => node.node_unstage_volume(r).await.map(drop),
            Call::Publish(r) => node.node_publish_volume(r).await.map(drop),
            Call::Unpublish(r) => node.node_unpublish_volume(r).await.map(drop),
            Call::Stats(r) => node.node_get_volume_stats(r).await.map(drop),
            Call::Expand(r) => node.node_expand_volume(r).await.map(drop),
        }
    }
}

fn huge_map() -> HashMap<String, String> {
    (0..1024)
        .map(|i| (format!("key-{i}"), "v".repeat(1024)))
        .collect()
}

fn unstage(volume_id: &str, path: &str) -> Call {
    Call::Unstage(csi::NodeUnstageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: path.into(),
    })
}

fn unpublish(volume_id: &str, path: &str) -> Call {
    Call::Unpublish(csi::NodeUnpublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: path.into(),
    })
}

fn stats(volume_id: &str, path: &str) -> Call {
    Call::Stats(csi::NodeGetVolumeStatsRequest {
        volume_id: volume_id.into(),
        volume_path: path.into(),
        staging_target_path: String::new(),
    })
}

fn expand(volume_id: &str, path: &str, required_bytes: i64) -> Call {
    Call::Expand(csi::NodeExpandVolumeRequest {
        volume_id: volume_id.into(),
        volume_path: path.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes,
            limit_bytes: 0,
        }),
        staging_target_path: String::new(),
        volume_capability: None,
        secrets: HashMap::new(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_get_the_spec_code_and_change_nothing() {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let kubelet = stack.kubelet.display().to_string();
    let capability = mount_capability("ext4", Mode::SingleNodeWriter);

    // A volume in use, for crooked paths to aim at.
    let backing = stack.backing_file("good.img", 64 << 20);
    let staging = stack.path("plugins/csi/pv/good/globalmount");
    let target = stack.path("pods/p1/volumes/good/mount");
    common::node::stage_and_publish(
        &mut node,
        GOOD,
        (&staging, &target),
        capability.clone(),
        &backing,
        false,
    )
    .await;
    let spare = stack.backing_file("spare.img", 64 << 20);
    let fresh_staging = stack.path("plugins/csi/pv/fresh/globalmount");

    // Planted links: a parent that is a link to /etc, and links onto the
    // volume's staging and target paths.
    std::os::unix::fs::symlink("/etc", stack.kubelet.join("pods/p1/volumes/etc")).unwrap();
    std::os::unix::fs::symlink(&staging, stack.kubelet.join("plugins/csi/pv/alias")).unwrap();
    std::os::unix::fs::symlink(&target, stack.kubelet.join("pods/p1/volumes/alias")).unwrap();
    let through_etc = format!("{kubelet}/pods/p1/volumes/etc/snap-csi-hostile");
    let staging_alias = format!("{kubelet}/plugins/csi/pv/alias");
    let target_alias = format!("{kubelet}/pods/p1/volumes/alias");
    let staging_dotdot = format!("{kubelet}/plugins/csi/pv/fresh/../good/globalmount");
    let target_dotdot = format!("{kubelet}/pods/p1/volumes/../volumes/good/mount");
    let escape = format!("{kubelet}/../../snap-csi-hostile");
    let outside = "/etc/snap-csi-hostile".to_string();
    let with_nul = format!("{kubelet}/pods/p1/volumes/x\0y");
    let huge_path = format!("{kubelet}/{}", "a".repeat(MIB));
    let huge_id = "v".repeat(MIB);
    let too_long_id = "v".repeat(129);
    let fresh = fresh_staging.display().to_string();

    let stage = |edit: &dyn Fn(&mut csi::NodeStageVolumeRequest)| {
        let mut request = stage_request("pvc-fresh", &fresh_staging, capability.clone(), &spare);
        edit(&mut request);
        Call::Stage(request)
    };
    let fresh_target = stack.path("pods/p3/volumes/fresh/mount");
    let publish = |edit: &dyn Fn(&mut csi::NodePublishVolumeRequest)| {
        let mut request = publish_request(GOOD, &staging, &fresh_target, capability.clone(), false);
        edit(&mut request);
        Call::Publish(request)
    };
    let capability_with = |edit: &dyn Fn(&mut csi::VolumeCapability)| {
        let mut capability = capability.clone();
        edit(&mut capability);
        Some(capability)
    };
    let good_staging = staging.display().to_string();
    let good_target = target.display().to_string();

    use Code::{FailedPrecondition, InvalidArgument, NotFound};
    let cases: Vec<(&str, Call, Code, &str)> = vec![
        // NodeStageVolume
        (
            "stage: no volume id",
            stage(&|r| r.volume_id.clear()),
            InvalidArgument,
            "volume_id is required",
        ),
        (
            "stage: 1 MiB volume id",
            stage(&|r| r.volume_id = huge_id.clone()),
            InvalidArgument,
            "volume_id is 1048576 bytes; CSI limits it to 128",
        ),
        (
            "stage: 129-byte volume id",
            stage(&|r| r.volume_id = too_long_id.clone()),
            InvalidArgument,
            "volume_id is 129 bytes",
        ),
        (
            "stage: no staging path",
            stage(&|r| r.staging_target_path.clear()),
            InvalidArgument,
            "staging_target_path is required",
        ),
        (
            "stage: staging path with ..",
            stage(&|r| r.staging_target_path = staging_dotdot.clone()),
            InvalidArgument,
            "contains '..'",
        ),
        (
            "stage: staging path escaping with ..",
            stage(&|r| r.staging_target_path = escape.clone()),
            InvalidArgument,
            "contains '..'",
        ),
        (
            "stage: staging path in /etc",
            stage(&|r| r.staging_target_path = outside.clone()),
            InvalidArgument,
            "is not under",
        ),
        (
            "stage: staging path through a link to /etc",
            stage(&|r| r.staging_target_path = through_etc.clone()),
            InvalidArgument,
            "goes through the symbolic link",
        ),
        (
            "stage: staging path is a link to a staged volume",
            stage(&|r| r.staging_target_path = staging_alias.clone()),
            InvalidArgument,
            "goes through the symbolic link",
        ),
        (
            "stage: NUL in the staging path",
            stage(&|r| r.staging_target_path = with_nul.clone()),
            InvalidArgument,
            "contains a NUL byte",
        ),
        (
            "stage: 1 MiB staging path",
            stage(&|r| r.staging_target_path = huge_path.clone()),
            InvalidArgument,
            "bytes, longer than 4095",
        ),
        (
            "stage: no capability",
            stage(&|r| r.volume_capability = None),
            InvalidArgument,
            "volume_capability is required",
        ),
        (
            "stage: no access type",
            stage(&|r| r.volume_capability = capability_with(&|c| c.access_type = None)),
            InvalidArgument,
            "needs an access type",
        ),
        (
            "stage: no access mode",
            stage(&|r| r.volume_capability = capability_with(&|c| c.access_mode = None)),
            InvalidArgument,
            "access_mode is required",
        ),
        (
            "stage: an access mode CSI does not have",
            stage(&|r| {
                r.volume_capability =
                    capability_with(&|c| c.access_mode = Some(AccessMode { mode: 99 }))
            }),
            InvalidArgument,
            "mode 99 is not an access mode",
        ),
        (
            "stage: a filesystem we do not make",
            stage(&|r| {
                r.volume_capability = Some(mount_capability("../../etc", Mode::SingleNodeWriter))
            }),
            InvalidArgument,
            "unsupported fs_type \"../../etc\"",
        ),
        (
            "stage: 1 MiB fs_type",
            stage(&|r| {
                r.volume_capability = Some(mount_capability(&huge_id, Mode::SingleNodeWriter))
            }),
            InvalidArgument,
            "fs_type is 1048576 bytes",
        ),
        (
            "publish: 1 MiB of mount flags",
            publish(&|r| {
                r.volume_capability = capability_with(&|c| {
                    if let Some(csi::volume_capability::AccessType::Mount(mount)) =
                        &mut c.access_type
                    {
                        mount.mount_flags = vec!["o".repeat(MIB)];
                    }
                })
            }),
            InvalidArgument,
            "mount_flags hold 1048576 bytes",
        ),
        (
            "stage: a placement we do not have",
            stage(&|r| {
                r.volume_context
                    .insert(PLACEMENT_KEY.into(), "sparse".into());
            }),
            InvalidArgument,
            "snap-csi.io/placement must be dedicated or packed, not \"sparse\"",
        ),
        (
            "stage: packed virtio-blk",
            stage(&|r| {
                r.volume_context.extend([
                    (PLACEMENT_KEY.to_string(), "packed".to_string()),
                    (EMULATION_KEY.to_string(), "virtio-blk".to_string()),
                ]);
            }),
            InvalidArgument,
            "packed needs NVMe: a virtio-blk function carries one disk",
        ),
        (
            "stage: 1 MiB volume context",
            stage(&|r| r.volume_context.extend(huge_map())),
            InvalidArgument,
            "volume_context holds",
        ),
        (
            "stage: 1 MiB publish context",
            stage(&|r| r.publish_context = huge_map()),
            InvalidArgument,
            "publish_context holds",
        ),
        (
            "stage: 1 MiB of secrets",
            stage(&|r| r.secrets = huge_map()),
            InvalidArgument,
            "secrets holds",
        ),
        // NodeUnstageVolume
        (
            "unstage: no volume id",
            unstage("", &good_staging),
            InvalidArgument,
            "volume_id is required",
        ),
        (
            "unstage: 1 MiB volume id",
            unstage(&huge_id, &good_staging),
            InvalidArgument,
            "volume_id is 1048576 bytes",
        ),
        (
            "unstage: no staging path",
            unstage(GOOD, ""),
            InvalidArgument,
            "staging_target_path is required",
        ),
        (
            "unstage: staged volume reached with ..",
            unstage(GOOD, &staging_dotdot),
            InvalidArgument,
            "contains '..'",
        ),
        (
            "unstage: staged volume reached through a link",
            unstage(GOOD, &staging_alias),
            InvalidArgument,
            "goes through the symbolic link",
        ),
        (
            "unstage: a path in /etc",
            unstage(GOOD, "/etc"),
            InvalidArgument,
            "is not under",
        ),
        (
            "unstage: NUL in the path",
            unstage(GOOD, &with_nul),
            InvalidArgument,
            "contains a NUL byte",
        ),
        // NodePublishVolume
        (
            "publish: no volume id",
            publish(&|r| r.volume_id.clear()),
            InvalidArgument,
            "volume_id is required",
        ),
        (
            "publish: 1 MiB volume id",
            publish(&|r| r.volume_id = huge_id.clone()),
            InvalidArgument,
            "volume_id is 1048576 bytes",
        ),
        (
            "publish: no target path",
            publish(&|r| r.target_path.clear()),
            InvalidArgument,
            "target_path is required",
        ),
        (
            "publish: no capability",
            publish(&|r| r.volume_capability = None),
            InvalidArgument,
            "volume_capability is required",
        ),
        (
            "publish: an access mode CSI does not have",
            publish(&|r| {
                r.volume_capability =
                    capability_with(&|c| c.access_mode = Some(AccessMode { mode: -3 }))
            }),
            InvalidArgument,
            "mode -3 is not an access mode",
        ),
        (
            "publish: no staging path",
            publish(&|r| r.staging_target_path.clear()),
            FailedPrecondition,
            "staging_target_path is required",
        ),
        (
            "publish: target through a link to /etc",
            publish(&|r| r.target_path = through_etc.clone()),
            InvalidArgument,
            "goes through the symbolic link",
        ),
        (
            "publish: target in /etc",
            publish(&|r| r.target_path = outside.clone()),
            InvalidArgument,
            "is not under",
        ),
        (
            "publish: target escaping with ..",
            publish(&|r| r.target_path = escape.clone()),
            InvalidArgument,
            "contains '..'",
        ),
        (
            "publish: NUL in the target",
            publish(&|r| r.target_path = with_nul.clone()),
            InvalidArgument,
            "contains a NUL byte",
        ),
        (
            "publish: 1 MiB target",
            publish(&|r| r.target_path = huge_path.clone()),
            InvalidArgument,
            "longer than 4095",
        ),
        (
            "publish: staging path through a link",
            publish(&|r| r.staging_target_path = staging_alias.clone()),
            InvalidArgument,
            "goes through the symbolic link",
        ),
        (
            "publish: staging path in /etc",
            publish(&|r| r.staging_target_path = "/etc".into()),
            InvalidArgument,
            "is not under",
        ),
        (
            "publish: 1 MiB volume context",
            publish(&|r| r.volume_context = huge_map()),
            InvalidArgument,
            "volume_context holds",
        ),
        (
            "publish: 1 MiB of secrets",
            publish(&|r| r.secrets = huge_map()),
            InvalidArgument,
            "secrets holds",
        ),
        // NodeUnpublishVolume
        (
            "unpublish: no volume id",
            unpublish("", &good_target),
            InvalidArgument,
            "volume_id is required",
        ),
        (
            "unpublish: 1 MiB volume id",
            unpublish(&huge_id, &good_target),
            InvalidArgument,
            "volume_id is 1048576 bytes",
        ),
        (
            "unpublish: no target path",
            unpublish(GOOD, ""),
            InvalidArgument,
            "target_path is required",
        ),
        (
            "unpublish: published volume reached with ..",
            unpublish(GOOD, &target_dotdot),
            InvalidArgument,
            "contains '..'",
        ),
        (
            "unpublish: published volume reached through a link",
            unpublish(GOOD, &target_alias),
            InvalidArgument,
            "goes through the symbolic link",
        ),
        (
            "unpublish: /etc/passwd",
            unpublish(GOOD, "/etc/passwd"),
            InvalidArgument,
            "is not under",
        ),
        (
            "unpublish: through a link to /etc",
            unpublish(GOOD, &through_etc),
            InvalidArgument,
            "goes through the symbolic link",
        ),
        (
            "unpublish: NUL in the target",
            unpublish(GOOD, &with_nul),
            InvalidArgument,
            "contains a NUL byte",
        ),
        // NodeGetVolumeStats
        (
            "stats: no volume id",
            stats("", &good_target),
            InvalidArgument,
            "volume_id is required",
        ),
        (
            "stats: 1 MiB volume id",
            stats(&huge_id, &good_target),
            InvalidArgument,
            "volume_id is 1048576 bytes",
        ),
        (
            "stats: no volume path",
            stats(GOOD, ""),
            InvalidArgument,
            "volume_path is required",
        ),
        (
            "stats: a volume never staged",
            stats("pvc-nobody", &good_target),
            NotFound,
            "is not staged on this node",
        ),
        ("stats: /etc", stats(GOOD, "/etc"), NotFound, "is not under"),
        (
            "stats: through a link",
            stats(GOOD, &target_alias),
            NotFound,
            "goes through the symbolic link",
        ),
        (
            "stats: with ..",
            stats(GOOD, &target_dotdot),
            NotFound,
            "contains '..'",
        ),
        (
            "stats: a path that does not exist",
            stats(GOOD, &fresh),
            NotFound,
            "no such file or directory",
        ),
        // NodeExpandVolume
        (
            "expand: no volume id",
            expand("", &good_target, 0),
            InvalidArgument,
            "volume_id is required",
        ),
        (
            "expand: 1 MiB volume id",
            expand(&huge_id, &good_target, 0),
            InvalidArgument,
            "volume_id is 1048576 bytes",
        ),
        (
            "expand: no volume path",
            expand(GOOD, "", 0),
            InvalidArgument,
            "volume_path is required",
        ),
        (
            "expand: a volume never staged",
            expand("pvc-nobody", &good_target, 0),
            NotFound,
            "is not staged on this node",
        ),
        (
            "expand: /etc",
            expand(GOOD, "/etc", 0),
            NotFound,
            "is not under",
        ),
        (
            "expand: through a link to /etc",
            expand(GOOD, &through_etc, 0),
            NotFound,
            "goes through the symbolic link",
        ),
        (
            "expand: negative size",
            expand(GOOD, &good_target, -1),
            InvalidArgument,
            "required_bytes -1 is negative",
        ),
    ];

    let mut census = Census::take(&stack).await;
    let mut failures = Vec::new();
    for (name, call, code, reason) in cases {
        let outcome = call.send(&mut node).await;
        match &outcome {
            Err(status) if status.code() == code && status.message().contains(reason) => {
                // A message names the problem; it never echoes a huge value back.
                assert!(
                    status.message().len() < 4096,
                    "{name}: {} bytes",
                    status.message().len()
                );
            }
            _ => failures.push(format!(
                "{name}: expected {code:?} with {reason:?}, got {outcome:?}"
            )),
        }
        let after = Census::take(&stack).await;
        if after != census {
            failures.push(format!("{name} changed {}", census.diff(&after)));
            census = after;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(!Path::new(&outside).exists());

    // The volume the crooked paths aimed at still works, and goes cleanly.
    std::fs::write(target.join("still-here"), b"data").unwrap();
    assert_eq!(std::fs::read(staging.join("still-here")).unwrap(), b"data");
    common::node::unpublish(&mut node, GOOD, &target).await;
    common::node::unstage(&mut node, GOOD, &staging).await;
    let census = Census::take(&stack).await;
    assert!(census.mounts.is_empty(), "{census:#?}");
    assert!(census.loop_devices.is_empty(), "{census:#?}");
    assert_eq!(census.snap["bdev_get_bdevs"], serde_json::json!([]));
}

/// The other side of the limit: an id of exactly 128 bytes, the most CSI
/// allows, goes through a whole lifecycle and leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_at_csis_limit_goes_through_a_whole_lifecycle() {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let volume_id = format!("pvc-{}", "x".repeat(124));
    assert_eq!(volume_id.len(), 128);
    let backing = stack.backing_file("long.img", 64 << 20);
    let staging = stack.path("plugins/csi/pv/long/globalmount");
    let target = stack.path("pods/p1/volumes/long/mount");
    let capability = mount_capability("ext4", Mode::SingleNodeWriter);
    common::node::stage_and_publish(
        &mut node,
        &volume_id,
        (&staging, &target),
        capability,
        &backing,
        false,
    )
    .await;
    std::fs::write(target.join("data"), b"long").unwrap();
    common::node::unpublish(&mut node, &volume_id, &target).await;
    common::node::unstage(&mut node, &volume_id, &staging).await;
    let census = Census::take(&stack).await;
    assert!(census.mounts.is_empty(), "{census:#?}");
    assert!(census.loop_devices.is_empty(), "{census:#?}");
    assert_eq!(census.snap["bdev_get_bdevs"], serde_json::json!([]));
    let records = std::fs::read_dir(stack.config.state_dir.join("volumes")).unwrap();
    assert_eq!(records.count(), 0, "records");
}
