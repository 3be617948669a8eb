//! A mount a process still uses (issue 11, scenario 9): unpublish and
//! unstage answer FAILED_PRECONDITION naming the process, tear nothing down
//! (the mount, the device, SNAP's objects and the record stay), and the
//! retry after the process left converges. Real stack: the SNAP emulator,
//! the test plugin, loop devices, mkfs and mounts.

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::loop_devices_of;
use common::node::{
    NodeStack, mount_capability, mounts_under, stage_and_publish, unpublish, unstage,
};
use common::shared::KillOnDrop;
use snap_csi::node::config::EmulationSetting;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use snap_csi::spdk::snap::NvmeSubsystemList;

fn sleeper(configure: impl FnOnce(&mut Command) -> &mut Command) -> KillOnDrop {
    let mut command = Command::new("sleep");
    command.arg("600");
    KillOnDrop(configure(&mut command).spawn().unwrap())
}

fn records(stack: &NodeStack) -> usize {
    fs::read_dir(stack.config.state_dir.join("volumes"))
        .unwrap()
        .count()
}

fn assert_refused_naming(status: &tonic::Status, holder: &KillOnDrop, how: &str) {
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    let named = format!("pid {} (sleep): {how}", holder.0.id());
    assert!(
        status.message().contains(&named),
        "{named} not in {status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mount_in_use_is_refused_naming_the_process_and_the_retry_converges() {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let backing = stack.backing_file("busy.img", 256 << 20);
    let staging = stack.path("staging/pvc-busy");
    fs::create_dir_all(&staging).unwrap();
    let target = stack.path("pods/p/volumes/pvc-busy");
    stage_and_publish(
        &mut node,
        "pvc-busy",
        (&staging, &target),
        mount_capability("ext4", Mode::SingleNodeWriter),
        &backing,
        false,
    )
    .await;
    fs::write(target.join("data"), b"still here").unwrap();
    let unpublish_request = csi::NodeUnpublishVolumeRequest {
        volume_id: "pvc-busy".into(),
        target_path: target.display().to_string(),
    };
    let unstage_request = csi::NodeUnstageVolumeRequest {
        volume_id: "pvc-busy".into(),
        staging_target_path: staging.display().to_string(),
    };

    // Someone's shell left in the pod's volume directory on the host.
    let shell = sleeper(|c| c.current_dir(&target));
    for _ in 0..2 {
        let refused = node
            .node_unpublish_volume(unpublish_request.clone())
            .await
            .unwrap_err();
        assert_refused_naming(&refused, &shell, "working directory");
        assert_eq!(mounts_under(&target).len(), 1, "the target stays mounted");
        assert_eq!(fs::read(target.join("data")).unwrap(), b"still here");
    }
    drop(shell);
    unpublish(&mut node, "pvc-busy", &target).await;
    assert!(!target.exists());

    // A reader of a file on the staged volume holds the staging mount.
    let reader = sleeper(|c| c.stdin(fs::File::open(staging.join("data")).unwrap()));
    for _ in 0..2 {
        let refused = node
            .node_unstage_volume(unstage_request.clone())
            .await
            .unwrap_err();
        let how = format!("open file {}", staging.join("data").display());
        assert_refused_naming(&refused, &reader, &how);
        assert_staged(&stack, &staging, &backing).await;
    }
    drop(reader);
    unstage(&mut node, "pvc-busy", &staging).await;
    assert!(mounts_under(&stack.kubelet).is_empty());
    assert!(loop_devices_of(&backing).is_empty(), "detached");
    assert_eq!(records(&stack), 0);
}

/// Nothing of the volume was torn down: the staging mount, the record,
/// SNAP's exposure and the host device are all there.
async fn assert_staged(stack: &NodeStack, staging: &Path, backing: &Path) {
    assert_eq!(mounts_under(staging).len(), 1, "the staging mount stays");
    assert_eq!(records(stack), 1, "the record stays");
    assert_eq!(loop_devices_of(backing).len(), 1, "the device stays");
    let subsystems = stack
        .emulator
        .client()
        .call(&NvmeSubsystemList {})
        .await
        .unwrap();
    let namespaces: usize = subsystems.iter().map(|s| s.namespaces.len()).sum();
    assert_eq!(namespaces, 1, "SNAP still exposes it: {subsystems:?}");
    assert_eq!(
        fs::read(staging.join("data")).unwrap(),
        b"still here",
        "and the data is readable"
    );
}
