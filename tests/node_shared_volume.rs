//! Several pods on one volume (issue 11, scenario 13): their publishes and
//! unpublishes run together, each on its own target path, on the one
//! staging mount; a stage (or unstage) meanwhile is refused; the last
//! unpublish leaves the staging mount alone. Real stack: the SNAP emulator,
//! the test plugin, loop devices, mkfs and mounts.

mod common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use common::node::{
    NodeStack, block_capability, mount_capability, mounts_under, publish_request, stage_request,
    unstage,
};
use futures::future::join_all;
use snap_csi::node::config::EmulationSetting;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::node_client::NodeClient;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use tokio::task::JoinSet;
use tonic::transport::Channel;

/// As many pods as the report that filed scenario 13 had on one volume.
const PODS: usize = 7;
const SIZE: u64 = 256 << 20;

fn targets(stack: &NodeStack, volume_id: &str) -> Vec<PathBuf> {
    (0..PODS)
        .map(|i| stack.path(&format!("pods/pod-{i}/volumes/{volume_id}")))
        .collect()
}

/// Every target published at once; each call's outcome.
async fn publish_all(
    node: &NodeClient<Channel>,
    volume_id: &str,
    staging: &Path,
    targets: &[PathBuf],
    capability: &csi::VolumeCapability,
) -> Vec<Result<(), tonic::Status>> {
    join_all(targets.iter().map(|target| {
        let mut node = node.clone();
        let request = publish_request(volume_id, staging, target, capability.clone(), false);
        async move { node.node_publish_volume(request).await.map(drop) }
    }))
    .await
}

/// Every target unpublished at once; each call's outcome.
async fn unpublish_all(
    node: &NodeClient<Channel>,
    volume_id: &str,
    targets: &[PathBuf],
) -> Vec<Result<(), tonic::Status>> {
    join_all(targets.iter().map(|target| {
        let mut node = node.clone();
        let request = csi::NodeUnpublishVolumeRequest {
            volume_id: volume_id.into(),
            target_path: target.display().to_string(),
        };
        async move { node.node_unpublish_volume(request).await.map(drop) }
    }))
    .await
}

fn assert_all_ok(what: &str, outcomes: &[Result<(), tonic::Status>]) {
    for (pod, outcome) in outcomes.iter().enumerate() {
        if let Err(status) = outcome {
            panic!(
                "{what} for pod {pod}: {:?} {}",
                status.code(),
                status.message()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seven_pods_share_one_staging_mount_and_leave_it_when_they_go() {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let backing = stack.backing_file("shared.img", SIZE);
    let staging = stack.path("staging/pvc-shared");
    fs::create_dir_all(&staging).unwrap();
    let capability = mount_capability("ext4", Mode::SingleNodeMultiWriter);
    node.node_stage_volume(stage_request(
        "pvc-shared",
        &staging,
        capability.clone(),
        &backing,
    ))
    .await
    .unwrap();
    let targets = targets(&stack, "pvc-shared");

    let published = publish_all(&node, "pvc-shared", &staging, &targets, &capability).await;
    assert_all_ok("publish", &published);
    // Each pod writes through its own target and sees every other pod's file.
    for (pod, target) in targets.iter().enumerate() {
        fs::write(target.join(format!("pod-{pod}")), format!("from pod {pod}")).unwrap();
    }
    for target in &targets {
        for pod in 0..PODS {
            let read = fs::read_to_string(target.join(format!("pod-{pod}"))).unwrap();
            assert_eq!(
                read,
                format!("from pod {pod}"),
                "through {}",
                target.display()
            );
        }
    }

    let started = Instant::now();
    let unpublished = unpublish_all(&node, "pvc-shared", &targets).await;
    let took = started.elapsed();
    assert_all_ok("unpublish", &unpublished);
    println!("{PODS} concurrent unpublishes of one volume took {took:?}");
    for target in &targets {
        assert!(!target.exists(), "{} is left", target.display());
    }
    // The last pod's unpublish leaves the volume staged, its data there.
    assert_eq!(
        mounts_under(&stack.kubelet),
        [staging.display().to_string()]
    );
    assert_eq!(
        fs::read_to_string(staging.join("pod-3")).unwrap(),
        "from pod 3"
    );
    // A pod that comes back later finds the data.
    let again = publish_all(&node, "pvc-shared", &staging, &targets[..1], &capability).await;
    assert_all_ok("publish again", &again);
    assert_eq!(
        fs::read_to_string(targets[0].join("pod-6")).unwrap(),
        "from pod 6"
    );
    assert_all_ok(
        "unpublish again",
        &unpublish_all(&node, "pvc-shared", &targets[..1]).await,
    );
    unstage(&mut node, "pvc-shared", &staging).await;
    assert!(mounts_under(&stack.kubelet).is_empty());
}

/// Resolves at the first open of a volume record in `records_dir`: a publish
/// of a block volume reads its record right after it took its hold on the
/// volume, so then a publish is inside the node. (Only the first: inotify
/// merges identical events not yet read, so it cannot count opens.)
fn first_record_read(records_dir: &Path) -> tokio::sync::oneshot::Receiver<()> {
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC).unwrap();
    inotify
        .add_watch(records_dir, AddWatchFlags::IN_OPEN)
        .unwrap();
    let (send, read) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        while let Ok(events) = inotify.read_events() {
            let record = |name: &std::ffi::OsString| name.to_string_lossy().ends_with(".json");
            if events.iter().any(|e| e.name.as_ref().is_some_and(record)) {
                let _ = send.send(());
                return;
            }
        }
    });
    read
}

/// The `size` file of the disk the emulator described for `backing`'s loop
/// device: what the node's device lookup reads.
fn sysfs_size_file(stack: &NodeStack, backing: &Path) -> PathBuf {
    let loops = common::loop_devices_of(backing);
    let name = loops[0]
        .split(':')
        .next()
        .unwrap()
        .trim_start_matches("/dev/");
    let dev = fs::read_to_string(format!("/sys/block/{name}/dev")).unwrap();
    fn find(dir: &Path, dev: &str) -> Option<PathBuf> {
        if fs::read_to_string(dir.join("dev")).ok().as_deref() == Some(dev)
            && dir.join("size").is_file()
        {
            return Some(dir.join("size"));
        }
        fs::read_dir(dir)
            .ok()?
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .find_map(|e| find(&e.path(), dev))
    }
    find(&stack.emulator.sysfs_root, &dev).expect("the disk in the emulator's sysfs tree")
}

/// Replaces the file's content at once, as sysfs does: a reader never sees
/// it empty.
fn replace(file: &Path, content: &str) {
    let temp = file.with_extension("new");
    fs::write(&temp, content).unwrap();
    fs::rename(&temp, file).unwrap();
}

fn write_at(target: &Path, offset: u64, data: &[u8]) {
    let mut device = fs::OpenOptions::new().write(true).open(target).unwrap();
    device.seek(SeekFrom::Start(offset)).unwrap();
    device.write_all(data).unwrap();
    device.sync_all().unwrap();
}

fn read_at(target: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut device = fs::File::open(target).unwrap();
    device.seek(SeekFrom::Start(offset)).unwrap();
    let mut data = vec![0; len];
    device.read_exact(&mut data).unwrap();
    data
}

/// The publishes are held inside the node by a device the host does not
/// show yet (a namespace reporting size zero), so all seven are provably in
/// flight at once: none is refused, a stage meanwhile is (saying how many
/// publishes run), and so is a second publish at a target being published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_in_flight_together_exclude_a_stage_but_not_each_other() {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let backing = stack.backing_file("block.img", SIZE);
    let staging = stack.path("staging/pvc-block");
    let capability = block_capability(Mode::SingleNodeMultiWriter);
    let stage = stage_request("pvc-block", &staging, capability.clone(), &backing);
    node.node_stage_volume(stage.clone()).await.unwrap();
    let targets = targets(&stack, "pvc-block");

    let size_file = sysfs_size_file(&stack, &backing);
    let size = fs::read_to_string(&size_file).unwrap();
    replace(&size_file, "0\n");
    let inside = first_record_read(&stack.config.state_dir.join("volumes"));
    let mut publishes = JoinSet::new();
    let mut publish = |target: &Path| {
        let mut node = node.clone();
        let request = publish_request("pvc-block", &staging, target, capability.clone(), false);
        publishes.spawn(async move { node.node_publish_volume(request).await.map(drop) });
    };
    publish(&targets[0]);
    inside.await.unwrap();
    for target in &targets[1..] {
        publish(target);
    }
    // The first publish holds its target until the device shows: every
    // stage meanwhile is refused, and says how many publishes run. Until all
    // seven do (none may have answered: each waits for the device).
    loop {
        if let Some(answered) = publishes.try_join_next() {
            panic!("a publish answered while the device was missing: {answered:?}");
        }
        let refused = node.node_stage_volume(stage.clone()).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Aborted, "{refused:?}");
        if refused.message().contains(&format!("{PODS} publishes")) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let unstage_refused = node
        .node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: "pvc-block".into(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(unstage_refused.code(), tonic::Code::Aborted);
    let same_target = node
        .node_publish_volume(publish_request(
            "pvc-block",
            &staging,
            &targets[0],
            capability.clone(),
            false,
        ))
        .await
        .unwrap_err();
    assert_eq!(same_target.code(), tonic::Code::Aborted, "{same_target:?}");
    assert!(
        same_target
            .message()
            .contains(&*targets[0].to_string_lossy()),
        "{same_target:?}"
    );

    replace(&size_file, &size);
    let outcomes = publishes.join_all().await;
    assert_all_ok("publish", &outcomes);
    // Each target is the device: what one pod writes, every other reads.
    for (pod, target) in targets.iter().enumerate() {
        write_at(
            target,
            (1 << 20) + pod as u64 * 4096,
            &[pod as u8 + 1; 4096],
        );
    }
    for target in &targets {
        for pod in 0..PODS {
            let offset = (1 << 20) + pod as u64 * 4096;
            assert_eq!(read_at(target, offset, 4096), [pod as u8 + 1; 4096]);
        }
    }

    assert_all_ok(
        "unpublish",
        &unpublish_all(&node, "pvc-block", &targets).await,
    );
    for target in &targets {
        assert!(!target.exists(), "{} is left", target.display());
    }
    unstage(&mut node, "pvc-block", &staging).await;
    assert!(common::loop_devices_of(&backing).is_empty());
}
