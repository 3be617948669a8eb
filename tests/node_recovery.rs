//! A node after the host changed under it (issue 11's scenarios 3 and 5),
//! on the real stack: the emulator's loop devices, real mkfs and mounts.
//!
//! - A reboot: the mounts are gone, the records and SNAP's state remain, and
//!   kubelet calls NodePublish without NodeStage. The publish stages the
//!   volume again from its record when they agree, and otherwise says why
//!   not with FAILED_PRECONDITION, changing nothing.
//! - A device renamed after a reconnect (same identity, new kernel name):
//!   stage and publish converge. A staging mount whose device is no longer
//!   the volume's (its function now carries another volume): refused with a
//!   code kubelet retries while a pod still has the old filesystem mounted,
//!   repaired by the next publish once it is unpublished.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::node::{
    NodeStack, block_capability, host_disks, mount_capability, mounts_under, publish_request,
    read_volume, stage_and_publish, stage_request, unpublish, unstage, write_volume,
};
use snap_csi::dpu::names::VolumeNames;
use snap_csi::node::config::EmulationSetting;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use snap_csi::spdk::snap::{NvmeControllerDestroy, NvmeSubsystemList};
use tonic::Code;

/// Sparse, so cheap; big enough for xfs.
const SIZE: u64 = 512 << 20;

fn is_block(capability: &csi::VolumeCapability) -> bool {
    matches!(
        capability.access_type,
        Some(csi::volume_capability::AccessType::Block(_))
    )
}

/// A publish as kubelet sends it after a reboot: the stage's volume context
/// plus the pod information kubelet adds at publish.
fn kubelet_publish(
    stage: &csi::NodeStageVolumeRequest,
    target: &Path,
) -> csi::NodePublishVolumeRequest {
    let mut context = stage.volume_context.clone();
    context.insert("csi.storage.k8s.io/pod.name".into(), "web-0".into());
    csi::NodePublishVolumeRequest {
        volume_id: stage.volume_id.clone(),
        staging_target_path: stage.staging_target_path.clone(),
        target_path: target.display().to_string(),
        volume_capability: stage.volume_capability.clone(),
        volume_context: context,
        ..Default::default()
    }
}

/// A publish that must be refused with FAILED_PRECONDITION naming `why`,
/// leaving no mount behind.
async fn refused(stack: &NodeStack, publish: csi::NodePublishVolumeRequest, why: &str) {
    let error = stack
        .client
        .clone()
        .node_publish_volume(publish)
        .await
        .expect_err(why);
    assert_eq!(error.code(), Code::FailedPrecondition, "{error}");
    assert!(error.message().contains(why), "{why:?} not in: {error}");
    assert!(
        mounts_under(&stack.kubelet).is_empty(),
        "a refused publish mounted something"
    );
}

async fn reboot(emulation: EmulationSetting, capability: csi::VolumeCapability) {
    let mut stack = NodeStack::start(emulation).await;
    let backing = stack.backing_file("vol.img", SIZE);
    let staging = stack.path("plugins/staging/pvc-r");
    let target = stack.path("pods/a/volumes/pvc-r");
    let block = is_block(&capability);
    if !block {
        std::fs::create_dir_all(&staging).unwrap();
    }
    let stage = stage_request("pvc-r", &staging, capability.clone(), &backing);
    let mut node = stack.client.clone();
    if block {
        // A read-only block volume: its data is written beforehand, and the
        // device's read-only flag, which a reboot clears, must come back.
        write_volume(&backing, b"written before the reboot");
    }
    stage_and_publish(
        &mut node,
        "pvc-r",
        (&staging, &target),
        capability.clone(),
        &backing,
        false,
    )
    .await;
    if !block {
        write_volume(&target, b"written before the reboot");
    }

    stack.reboot_host().await;
    assert!(mounts_under(&stack.kubelet).is_empty());

    // Each way the request can disagree with the record: refused, nothing mounted.
    let elsewhere = stack.path("plugins/staging/elsewhere");
    let mut moved = kubelet_publish(&stage, &target);
    moved.staging_target_path = elsewhere.display().to_string();
    refused(&stack, moved, "it was staged at").await;
    let mut other_use = kubelet_publish(&stage, &target);
    other_use.volume_capability = Some(if block {
        mount_capability("ext4", Mode::SingleNodeWriter)
    } else {
        block_capability(Mode::SingleNodeWriter)
    });
    refused(&stack, other_use, "it was staged as").await;
    let mut other_context = kubelet_publish(&stage, &target);
    other_context
        .volume_context
        .insert("path".into(), "/somewhere/else.img".into());
    refused(&stack, other_context, "its volume context has path=").await;
    let mut unknown = kubelet_publish(&stage, &target);
    unknown.volume_id = "pvc-never-staged".into();
    refused(&stack, unknown, "no record").await;

    // What kubelet sends: the volume is staged again and published.
    for _ in 0..2 {
        node = stack.client.clone();
        node.node_publish_volume(kubelet_publish(&stage, &target))
            .await
            .expect("publish after the reboot restages from the record");
    }
    assert_eq!(read_volume(&target, 25), b"written before the reboot");
    if block {
        use std::io::Write;
        let write = std::fs::OpenOptions::new()
            .write(true)
            .open(&target)
            .and_then(|mut device| {
                device
                    .write_all(&[1u8; 4096])
                    .and_then(|()| device.sync_all())
            });
        assert!(write.is_err(), "the restaged device is read-only again");
    }
    assert_eq!(
        mounts_under(&staging).len(),
        usize::from(!block),
        "a filesystem volume is mounted at its staging path again"
    );
    // A stage kubelet retries as well converges on what the publish made.
    node.node_stage_volume(stage.clone()).await.unwrap();

    unpublish(&mut node, "pvc-r", &target).await;
    unstage(&mut node, "pvc-r", &staging).await;
    stack.assert_nothing_left(&backing).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_reboot_publish_restages_a_filesystem_volume_from_its_record() {
    reboot(
        EmulationSetting::Nvme,
        mount_capability("ext4", Mode::SingleNodeWriter),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_reboot_publish_restages_a_block_volume_from_its_record() {
    reboot(
        EmulationSetting::VirtioBlk,
        block_capability(Mode::SingleNodeReaderOnly),
    )
    .await;
}

/// A device renamed after a reconnect is the same device: a stage retry and
/// a new publish converge, the data is there.
async fn renamed(emulation: EmulationSetting) {
    let stack = NodeStack::start(emulation).await;
    let mut node = stack.client.clone();
    let backing = stack.backing_file("vol.img", SIZE);
    let staging = stack.path("plugins/staging/pvc-n");
    std::fs::create_dir_all(&staging).unwrap();
    let (pod_a, pod_b) = (stack.path("pods/a/pvc-n"), stack.path("pods/b/pvc-n"));
    let capability = mount_capability("ext4", Mode::SingleNodeWriter);
    stage_and_publish(
        &mut node,
        "pvc-n",
        (&staging, &pod_a),
        capability.clone(),
        &backing,
        false,
    )
    .await;
    write_volume(&pod_a, b"before the rename");
    let before = host_disks(&stack.emulator.sysfs_root);

    stack.emulator.rename_host_disks().await;
    let after = host_disks(&stack.emulator.sysfs_root);
    assert_eq!(after.len(), 1, "{after:?}");
    assert_ne!(
        before[0].name, after[0].name,
        "the host names the disk anew"
    );
    assert_eq!(
        (before[0].major, before[0].minor),
        (after[0].major, after[0].minor),
        "the same device"
    );

    node.node_stage_volume(stage_request(
        "pvc-n",
        &staging,
        capability.clone(),
        &backing,
    ))
    .await
    .expect("a stage retried after the rename converges");
    node.node_publish_volume(publish_request(
        "pvc-n",
        &staging,
        &pod_b,
        capability.clone(),
        false,
    ))
    .await
    .expect("a publish after the rename converges");
    assert_eq!(read_volume(&pod_b, 17), b"before the rename");

    for pod in [&pod_a, &pod_b] {
        unpublish(&mut node, "pvc-n", pod).await;
    }
    unstage(&mut node, "pvc-n", &staging).await;
    stack.assert_nothing_left(&backing).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nvme_namespace_renamed_after_a_reconnect_converges() {
    renamed(EmulationSetting::Nvme).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtio_blk_disk_renamed_after_a_reconnect_converges() {
    renamed(EmulationSetting::VirtioBlk).await;
}

/// The volume's controller is taken away on the DPU behind the node's back
/// and its function handed to another volume: the staging mount now sits
/// on a device that is not the volume's. While a pod still has the old
/// filesystem mounted, publish and a stage retry refuse with ABORTED (not
/// final: kubelet retries, and unstages the volume when its pods go); once
/// it is unpublished, a publish repairs the volume: attached again, and the
/// data written before is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staging_mount_no_longer_on_the_volumes_device_waits_for_its_pods_then_is_repaired() {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let capability = mount_capability("ext4", Mode::SingleNodeWriter);
    let backing_a = stack.backing_file("a.img", SIZE);
    let backing_b = stack.backing_file("b.img", SIZE);
    let (staging_a, staging_b) = (
        stack.path("plugins/staging/pvc-a"),
        stack.path("plugins/staging/pvc-b"),
    );
    std::fs::create_dir_all(&staging_a).unwrap();
    std::fs::create_dir_all(&staging_b).unwrap();
    let (pod_1, pod_2) = (stack.path("pods/1/pvc-a"), stack.path("pods/2/pvc-a"));
    stage_and_publish(
        &mut node,
        "pvc-a",
        (&staging_a, &pod_1),
        capability.clone(),
        &backing_a,
        false,
    )
    .await;
    write_volume(&pod_1, b"volume a");
    let function_a = controller_function(&stack, "pvc-a").await;

    let snap = stack.emulator.client();
    let subsystems = snap.call(&NvmeSubsystemList {}).await.unwrap();
    let nqn = VolumeNames::new("pvc-a").nqn;
    let subsystem = subsystems.iter().find(|s| s.nqn == nqn).unwrap();
    for controller in &subsystem.controllers {
        snap.call(&NvmeControllerDestroy {
            ctrl_id: controller.ctrl_id.clone(),
            force: Some(true),
        })
        .await
        .unwrap();
    }
    node.node_stage_volume(stage_request(
        "pvc-b",
        &staging_b,
        capability.clone(),
        &backing_b,
    ))
    .await
    .unwrap();
    assert_eq!(
        controller_function(&stack, "pvc-b").await,
        function_a,
        "the function is reused for another volume"
    );

    let publish = publish_request("pvc-a", &staging_a, &pod_2, capability.clone(), false);
    let error = node.node_publish_volume(publish.clone()).await.unwrap_err();
    assert_eq!(error.code(), Code::Aborted, "{error}");
    let uuid_a = VolumeNames::new("pvc-a").namespace_uuid;
    let pod_1_path = pod_1.display().to_string();
    for part in [
        "staging mount",
        uuid_a.as_str(),
        "is not on the host",
        "still mounted at",
        &pod_1_path,
    ] {
        assert!(error.message().contains(part), "{part:?} not in: {error}");
    }
    assert!(mounts_under(&pod_2).is_empty(), "a refused publish mounted");

    let retry = stage_request("pvc-a", &staging_a, capability.clone(), &backing_a);
    let error = node.node_stage_volume(retry).await.unwrap_err();
    assert_eq!(error.code(), Code::Aborted, "{error}");
    for part in ["staging mount", "no longer shows", &pod_1_path] {
        assert!(error.message().contains(part), "{part:?} not in: {error}");
    }
    assert_eq!(
        mounts_under(&staging_a).len(),
        1,
        "the stage changed nothing"
    );
    assert_eq!(
        read_volume(&pod_1, 8),
        b"volume a",
        "the pod keeps its data"
    );

    // The pod gone, the next pod's publish repairs the volume.
    unpublish(&mut node, "pvc-a", &pod_1).await;
    node.node_publish_volume(publish)
        .await
        .expect("the publish repairs the volume");
    assert_eq!(read_volume(&pod_2, 8), b"volume a", "the data is there");
    assert_ne!(
        controller_function(&stack, "pvc-a").await,
        function_a,
        "attached again, on a free function"
    );
    unpublish(&mut node, "pvc-a", &pod_2).await;
    unstage(&mut node, "pvc-a", &staging_a).await;
    unstage(&mut node, "pvc-b", &staging_b).await;
    stack.assert_nothing_left(&backing_a).await;
    assert!(common::loop_devices_of(&backing_b).is_empty());
}

/// The PCI function of the volume's NVMe controller, from SNAP.
async fn controller_function(stack: &NodeStack, volume_id: &str) -> String {
    let record: HashMap<String, serde_json::Value> =
        std::fs::read_dir(stack.config.state_dir.join("volumes"))
            .unwrap()
            .filter_map(|e| {
                let text = std::fs::read_to_string(e.unwrap().path()).ok()?;
                serde_json::from_str::<HashMap<String, serde_json::Value>>(&text).ok()
            })
            .find(|r| r["volume_id"] == volume_id)
            .expect("the volume has a record");
    record["locator"]["bdf"]
        .as_str()
        .unwrap_or_else(|| panic!("an NVMe locator: {record:?}"))
        .to_string()
}
