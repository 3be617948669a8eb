//! The node service as kubelet drives it, as root on real loop devices with
//! real mkfs and mounts: the SNAP emulator plays the DPU, a test vendor plugin
//! serves `nvidia.storage.plugins.v1` over real gRPC.
//!
//! Each lifecycle: stage -> publish twice (two pods) -> write through one,
//! read through the other -> unpublish both -> unstage (nothing left) ->
//! stage again -> the data is still there. Every call is made twice.

mod common;

use std::fs;
use std::io::{Seek, Write};
use std::path::Path;

use common::loop_devices_of;
use common::node::{
    NodeStack, Tweaks, assert_attached_once, block_capability, expand_request, grow_on_the_dpu,
    mount_capability, mounts_under, publish_request, read_volume, stage_and_publish, stage_request,
    unpublish, unstage, write_volume,
};
use snap_csi::node::config::{EmulationSetting, PlacementSetting};
use snap_csi::node::service::PLACEMENT_KEY;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::node_client::NodeClient;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use snap_csi::spdk::snap::NvmeSubsystemList;
use tonic::transport::Channel;

/// Sparse, so cheap; big enough for xfs (mkfs.xfs wants at least 300 MB).
const SIZE: u64 = 512 << 20;

async fn lifecycle(emulation: EmulationSetting, capability: csi::VolumeCapability) {
    lifecycle_on(NodeStack::start(emulation).await, capability).await;
}

async fn lifecycle_on(stack: NodeStack, capability: csi::VolumeCapability) {
    let mut node = stack.client.clone();
    let backing = stack.backing_file("vol.img", SIZE);
    let staging = stack.path("plugins/staging/pvc-1");
    let pod_a = stack.path("pods/a/volumes/pvc-1");
    let pod_b = stack.path("pods/b/volumes/pvc-1");
    let block = matches!(
        capability.access_type,
        Some(csi::volume_capability::AccessType::Block(_))
    );
    if !block {
        fs::create_dir_all(&staging).unwrap();
    }
    let data: Vec<u8> = (0..256 * 1024u32).map(|i| (i % 251) as u8).collect();

    for round in 0..2 {
        for _ in 0..2 {
            node.node_stage_volume(stage_request(
                "pvc-1",
                &staging,
                capability.clone(),
                &backing,
            ))
            .await
            .unwrap_or_else(|e| panic!("stage (round {round}): {e}"));
        }
        assert_attached_once(&stack, &backing, &staging, block).await;
        for target in [&pod_a, &pod_b] {
            for _ in 0..2 {
                node.node_publish_volume(publish_request(
                    "pvc-1",
                    &staging,
                    target,
                    capability.clone(),
                    false,
                ))
                .await
                .unwrap_or_else(|e| panic!("publish {}: {e}", target.display()));
            }
        }
        if round == 0 {
            write_volume(&pod_a, &data);
        }
        assert_eq!(read_volume(&pod_b, data.len()), data, "round {round}");

        for target in [&pod_a, &pod_b] {
            for _ in 0..2 {
                unpublish(&mut node, "pvc-1", target).await;
            }
            assert!(!target.exists(), "unpublish removes the target");
        }
        for _ in 0..2 {
            unstage(&mut node, "pvc-1", &staging).await;
        }
        stack.assert_nothing_left(&backing).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext4_over_nvme() {
    lifecycle(
        EmulationSetting::Nvme,
        mount_capability("ext4", Mode::SingleNodeWriter),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xfs_over_virtio_blk() {
    lifecycle(
        EmulationSetting::VirtioBlk,
        mount_capability("xfs", Mode::SingleNodeWriter),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_over_nvme() {
    lifecycle(
        EmulationSetting::Nvme,
        block_capability(Mode::SingleNodeWriter),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_over_virtio_blk() {
    lifecycle(
        EmulationSetting::VirtioBlk,
        block_capability(Mode::MultiNodeMultiWriter),
    )
    .await;
}

fn packed() -> Tweaks {
    Tweaks {
        placement: Some(PlacementSetting::Packed),
        namespaces_per_controller: Some(4),
        ..Tweaks::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext4_packed_over_nvme() {
    let stack = NodeStack::start_with(EmulationSetting::Nvme, packed()).await;
    lifecycle_on(stack, mount_capability("ext4", Mode::SingleNodeWriter)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_packed_over_nvme() {
    let stack = NodeStack::start_with(EmulationSetting::Nvme, packed()).await;
    lifecycle_on(stack, block_capability(Mode::SingleNodeWriter)).await;
}

/// Volumes asked to be packed by their context (the node's default is
/// dedicated) share one pool controller; staged together, each keeps its
/// own data when another is unstaged and when it is restaged itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packed_volumes_share_a_controller_and_keep_their_data_when_one_leaves() {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let capability = mount_capability("ext4", Mode::SingleNodeWriter);
    let ids: Vec<String> = (0..5).map(|i| format!("pvc-p{i}")).collect();
    let volume = |id: &str| {
        let backing = stack.backing_file(&format!("{id}.img"), 64 << 20);
        let staging = stack.path(&format!("staging/{id}"));
        fs::create_dir_all(&staging).unwrap();
        let mut stage = stage_request(id, &staging, capability.clone(), &backing);
        stage
            .volume_context
            .insert(PLACEMENT_KEY.into(), "packed".into());
        let target = stack.path(&format!("pods/{id}/volumes/{id}"));
        (stage, staging, target, backing)
    };
    let volumes: Vec<_> = ids.iter().map(|id| volume(id)).collect();
    // Staged all at once, as kubelet does for a pod with many volumes.
    let staged = futures::future::join_all(volumes.iter().map(|(stage, ..)| {
        let mut node = stack.client.clone();
        let stage = stage.clone();
        async move { node.node_stage_volume(stage).await }
    }))
    .await;
    for (id, result) in ids.iter().zip(staged) {
        result.unwrap_or_else(|e| panic!("stage {id}: {e}"));
    }
    let mut node = stack.client.clone();
    let publish = |i: usize| {
        let mut node = stack.client.clone();
        let (_, staging, target, _) = &volumes[i];
        let request = publish_request(&ids[i], staging, target, capability.clone(), false);
        async move { node.node_publish_volume(request).await.unwrap() }
    };
    for (i, (id, (_, _, target, _))) in ids.iter().zip(&volumes).enumerate() {
        publish(i).await;
        write_volume(target, id.as_bytes());
    }
    let subsystems = stack.subsystems().await;
    assert_eq!(subsystems.len(), 1, "one pool: {subsystems:?}");
    assert_eq!(subsystems[0].controllers.len(), 1);
    assert_eq!(subsystems[0].namespaces.len(), 5);

    // The second leaves; the others keep their disks and data.
    let (_, staging, target, backing) = &volumes[1];
    unpublish(&mut node, &ids[1], target).await;
    unstage(&mut node, &ids[1], staging).await;
    assert!(loop_devices_of(backing).is_empty());
    for (i, (id, (_, _, target, _))) in ids.iter().zip(&volumes).enumerate() {
        if i != 1 {
            assert_eq!(read_volume(target, id.len()), id.as_bytes(), "{id}");
        }
    }
    // The third goes and comes back: same data, a slot in the same pool.
    let (stage, staging, target, _) = &volumes[2];
    unpublish(&mut node, &ids[2], target).await;
    unstage(&mut node, &ids[2], staging).await;
    node.node_stage_volume(stage.clone()).await.unwrap();
    publish(2).await;
    assert_eq!(read_volume(target, ids[2].len()), ids[2].as_bytes());
    let subsystems = stack.subsystems().await;
    assert_eq!((subsystems.len(), subsystems[0].namespaces.len()), (1, 4));

    for (i, (id, (_, staging, target, _))) in ids.iter().zip(&volumes).enumerate() {
        if i != 1 {
            unpublish(&mut node, id, target).await;
            unstage(&mut node, id, staging).await;
        }
    }
    for (_, _, _, backing) in &volumes {
        stack.assert_nothing_left(backing).await;
    }
}

/// NodeGetInfo's limit follows the default placement: NVMe functions times
/// the namespaces a pool carries; `--max-volumes-per-node` overrides it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_info_counts_the_default_placement_or_the_operator_setting() {
    let mut stack = NodeStack::start_with(EmulationSetting::Nvme, packed()).await;
    let info = |mut node: NodeClient<Channel>| async move {
        node.node_get_info(csi::NodeGetInfoRequest {})
            .await
            .unwrap()
            .into_inner()
            .max_volumes_per_node
    };
    assert_eq!(info(stack.client.clone()).await, 17 * 4);
    stack
        .restart_node(|c| c.emulation = EmulationSetting::VirtioBlk)
        .await;
    assert_eq!(
        info(stack.client.clone()).await,
        17,
        "virtio-blk volumes are never packed"
    );
    stack
        .restart_node(|c| c.max_volumes_per_node = Some(1000))
        .await;
    assert_eq!(info(stack.client.clone()).await, 1000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_publish_refuses_writes() {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let backing = stack.backing_file("vol.img", SIZE);
    let staging = stack.path("staging/pvc-ro");
    fs::create_dir_all(&staging).unwrap();
    let target = stack.path("pods/ro/volumes/pvc-ro");
    let capability = mount_capability("ext4", Mode::SingleNodeWriter);
    stage_and_publish(
        &mut node,
        "pvc-ro",
        (&staging, &target),
        capability.clone(),
        &backing,
        true,
    )
    .await;
    let error = fs::write(target.join("x"), b"no").unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc_erofs()), "{error}");
    // The same target asked read-write is a different publish: ALREADY_EXISTS.
    let conflict = node
        .node_publish_volume(publish_request(
            "pvc-ro", &staging, &target, capability, false,
        ))
        .await
        .unwrap_err();
    assert_eq!(conflict.code(), tonic::Code::AlreadyExists, "{conflict}");
    unpublish(&mut node, "pvc-ro", &target).await;
    unstage(&mut node, "pvc-ro", &staging).await;
    stack.assert_nothing_left(&backing).await;
}

/// EROFS, without a libc dependency for one constant.
fn libc_erofs() -> i32 {
    nix::errno::Errno::EROFS as i32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_report_usage_and_identity_and_info_answer() {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let backing = stack.backing_file("vol.img", SIZE);
    let staging = stack.path("staging/pvc-s");
    fs::create_dir_all(&staging).unwrap();
    let target = stack.path("pods/s/volumes/pvc-s");
    let capability = mount_capability("ext4", Mode::SingleNodeWriter);
    stage_and_publish(
        &mut node,
        "pvc-s",
        (&staging, &target),
        capability,
        &backing,
        false,
    )
    .await;
    let stats = node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: "pvc-s".into(),
            volume_path: target.display().to_string(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let bytes = stats
        .usage
        .iter()
        .find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32)
        .unwrap();
    assert!(bytes.total > 0 && bytes.total <= SIZE as i64, "{bytes:?}");
    // What df shows for the mount: statvfs, in fragments.
    let fs = nix::sys::statvfs::statvfs(&target).unwrap();
    let bytes_of = |count: u64| i64::try_from(count * fs.fragment_size()).unwrap();
    assert_eq!(
        (bytes.total, bytes.available, bytes.used),
        (
            bytes_of(fs.blocks()),
            bytes_of(fs.blocks_available()),
            bytes_of(fs.blocks() - fs.blocks_free())
        ),
        "{bytes:?}"
    );
    assert!(
        bytes.used > 0,
        "a fresh filesystem's metadata takes room: {bytes:?}"
    );
    assert!(
        stats
            .usage
            .iter()
            .any(|u| u.unit == csi::volume_usage::Unit::Inodes as i32)
    );
    assert_eq!(stats.volume_condition.map(|c| c.abnormal), Some(false));

    let info = node
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, "node-1");
    assert_eq!(
        info.max_volumes_per_node, 17,
        "1 NVMe PF + 16 VFs: the default emulation's, not the 16 + 1 virtio-blk ones too"
    );
    let capabilities = node
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(!capabilities.capabilities.is_empty());

    unpublish(&mut node, "pvc-s", &target).await;
    unstage(&mut node, "pvc-s", &staging).await;
    stack.assert_nothing_left(&backing).await;
}

/// When the host sees a volume grow, against NodeExpandVolume.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// Before kubelet asks the node.
    Before,
    /// While the node waits for it (the vendor side rescans then).
    WhileTheNodeWaits,
}

/// The vendor side grows the bdev (the backing file grows and SPDK rescans);
/// NodeExpandVolume then grows the mounted filesystem online.
async fn expand(emulation: EmulationSetting, fs_type: &str, seen: Seen) {
    let stack = NodeStack::start(emulation).await;
    let mut node = stack.client.clone();
    let backing = stack.backing_file("vol.img", SIZE);
    let staging = stack.path("staging/pvc-e");
    fs::create_dir_all(&staging).unwrap();
    let target = stack.path("pods/e/volumes/pvc-e");
    let capability = mount_capability(fs_type, Mode::SingleNodeWriter);
    stage_and_publish(
        &mut node,
        "pvc-e",
        (&staging, &target),
        capability,
        &backing,
        false,
    )
    .await;
    let total = |stats: csi::NodeGetVolumeStatsResponse| {
        stats
            .usage
            .iter()
            .find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32)
            .unwrap()
            .total
    };
    let stats_request = csi::NodeGetVolumeStatsRequest {
        volume_id: "pvc-e".into(),
        volume_path: target.display().to_string(),
        staging_target_path: String::new(),
    };
    let before = total(
        node.node_get_volume_stats(stats_request.clone())
            .await
            .unwrap()
            .into_inner(),
    );

    let expand = expand_request("pvc-e", &target, &staging, 2 * SIZE);
    let expanded = match seen {
        Seen::Before => {
            grow_on_the_dpu(&stack.emulator, &backing, 2 * SIZE).await;
            node.node_expand_volume(expand.clone())
                .await
                .map(tonic::Response::into_inner)
        }
        Seen::WhileTheNodeWaits => {
            expand_grown_meanwhile(&stack, expand.clone(), &backing, 2 * SIZE).await
        }
    };
    match expanded {
        Ok(response) => {
            assert_eq!(response.capacity_bytes, (2 * SIZE) as i64);
            let again = node.node_expand_volume(expand.clone()).await.unwrap();
            assert_eq!(again.into_inner().capacity_bytes, (2 * SIZE) as i64);
        }
        // Online ext4 growth is an ioctl that needs CAP_SYS_RESOURCE, which
        // a sandbox may withhold even from root: then the node must say so,
        // and the filesystem must grow when the volume is next staged.
        Err(status) if fs_type == "ext4" && !has_cap_sys_resource() => {
            assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
            assert!(status.message().contains("CAP_SYS_RESOURCE"), "{status:?}");
            println!("NOTE: no CAP_SYS_RESOURCE here: ext4 grows at the next stage instead");
            restage(&mut node, &staging, &target, &backing, fs_type).await;
        }
        Err(status) => panic!("{fs_type} expand: {status:?}"),
    }
    let after = total(
        node.node_get_volume_stats(stats_request)
            .await
            .unwrap()
            .into_inner(),
    );
    assert!(
        after > before + (SIZE as i64) / 2,
        "{fs_type}: {before} -> {after}"
    );

    unpublish(&mut node, "pvc-e", &target).await;
    unstage(&mut node, "pvc-e", &staging).await;
    stack.assert_nothing_left(&backing).await;
}

/// Unpublish, unstage, stage and publish again.
async fn restage(
    node: &mut snap_csi::proto::csi::v1::node_client::NodeClient<tonic::transport::Channel>,
    staging: &Path,
    target: &Path,
    backing: &Path,
    fs_type: &str,
) {
    let capability = mount_capability(fs_type, Mode::SingleNodeWriter);
    unpublish(node, "pvc-e", target).await;
    unstage(node, "pvc-e", staging).await;
    stage_and_publish(node, "pvc-e", (staging, target), capability, backing, false).await;
}

/// Whether this process may resize a mounted ext4 (capability bit 24).
fn has_cap_sys_resource() -> bool {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap();
    effective & (1 << 24) != 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expand_ext4_over_nvme() {
    expand(EmulationSetting::Nvme, "ext4", Seen::Before).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expand_xfs_over_virtio_blk() {
    expand(EmulationSetting::VirtioBlk, "xfs", Seen::Before).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expand_waits_for_the_host_to_see_the_device_grow() {
    expand(EmulationSetting::Nvme, "xfs", Seen::WhileTheNodeWaits).await;
}

/// A raw block volume published to a pod: NodeExpandVolume waits for the
/// host to see the device grow and answers its new size, which the pod's
/// device shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expand_of_a_block_volume_waits_for_its_new_size() {
    let stack = NodeStack::start(EmulationSetting::VirtioBlk).await;
    let mut node = stack.client.clone();
    let backing = stack.backing_file("vol.img", SIZE);
    let staging = stack.path("staging/pvc-eb");
    let target = stack.path("pods/eb/volumes/pvc-eb");
    let capability = block_capability(Mode::SingleNodeWriter);
    stage_and_publish(
        &mut node,
        "pvc-eb",
        (&staging, &target),
        capability,
        &backing,
        false,
    )
    .await;
    let expand = expand_request("pvc-eb", &target, &staging, 2 * SIZE);
    let response = expand_grown_meanwhile(&stack, expand, &backing, 2 * SIZE)
        .await
        .unwrap();
    assert_eq!(response.capacity_bytes, (2 * SIZE) as i64);
    let size = fs::File::open(&target)
        .unwrap()
        .seek(std::io::SeekFrom::End(0))
        .unwrap();
    assert_eq!(size, 2 * SIZE, "the pod's device shows the new size");
    unpublish(&mut node, "pvc-eb", &target).await;
    unstage(&mut node, "pvc-eb", &staging).await;
    stack.assert_nothing_left(&backing).await;
}

/// A volume the controller grew whose new size never reaches the host: the
/// node waits for it until its deadline, then names what is missing (the
/// vendor side's rescan), not the controller expansion kubelet already did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expand_that_the_host_never_sees_names_the_missing_rescan() {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let backing = stack.backing_file("vol.img", SIZE);
    let staging = stack.path("staging/pvc-en");
    fs::create_dir_all(&staging).unwrap();
    let target = stack.path("pods/en/volumes/pvc-en");
    let capability = mount_capability("ext4", Mode::SingleNodeWriter);
    stage_and_publish(
        &mut node,
        "pvc-en",
        (&staging, &target),
        capability,
        &backing,
        false,
    )
    .await;
    let expand = expand_request("pvc-en", &target, &staging, 2 * SIZE);
    let status = node
        .node_expand_volume(common::timed(expand, std::time::Duration::from_secs(3)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    for part in ["did not see it grow", "bdev_aio_rescan", "next stage"] {
        assert!(
            status.message().contains(part),
            "{part:?} not in {status:?}"
        );
    }
    assert!(
        !status.message().contains("on the controller first"),
        "{status:?}"
    );
    unpublish(&mut node, "pvc-en", &target).await;
    unstage(&mut node, "pvc-en", &staging).await;
    stack.assert_nothing_left(&backing).await;
}

/// NodeExpandVolume asked before the host saw the volume grow: the DPU
/// grows it once the node is waiting for the new size.
async fn expand_grown_meanwhile(
    stack: &NodeStack,
    expand: csi::NodeExpandVolumeRequest,
    backing: &Path,
    size: u64,
) -> Result<csi::NodeExpandVolumeResponse, tonic::Status> {
    let (waiting, node_waits) = tokio::sync::oneshot::channel::<()>();
    let target = Path::new(&expand.volume_path);
    snap_csi::failpoint::once("expand:wait-size", Some(target), move || {
        let _ = waiting.send(());
    });
    let mut node = stack.client.clone();
    let mut call = tokio::spawn(async move { node.node_expand_volume(expand).await });
    tokio::select! {
        waits = node_waits => waits.expect("the hook ran"),
        answer = &mut call => panic!("the node did not wait for the new size: {answer:?}"),
    }
    grow_on_the_dpu(&stack.emulator, backing, size).await;
    call.await.unwrap().map(tonic::Response::into_inner)
}

/// A read-only bind mount of a device node does not stop writes to the
/// device; a reader-only access mode must, through the device's own flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_block_volume_refuses_writes() {
    let stack = NodeStack::start(EmulationSetting::VirtioBlk).await;
    let mut node = stack.client.clone();
    let backing = stack.backing_file("vol.img", SIZE);
    let staging = stack.path("staging/pvc-rob");
    let target = stack.path("pods/rob/volumes/pvc-rob");
    let capability = block_capability(Mode::MultiNodeReaderOnly);
    stage_and_publish(
        &mut node,
        "pvc-rob",
        (&staging, &target),
        capability,
        &backing,
        true,
    )
    .await;
    let error = fs::OpenOptions::new()
        .write(true)
        .open(&target)
        .and_then(|mut device| {
            device
                .write_all(&[1u8; 4096])
                .and_then(|()| device.sync_all())
        })
        .unwrap_err();
    assert!(
        matches!(error.raw_os_error(), Some(e) if e == libc_erofs() || e == nix::errno::Errno::EPERM as i32 || e == nix::errno::Errno::EACCES as i32),
        "{error}"
    );
    assert_eq!(
        read_volume(&target, 16),
        vec![0; 16],
        "readable, and unchanged"
    );
    unpublish(&mut node, "pvc-rob", &target).await;
    unstage(&mut node, "pvc-rob", &staging).await;
    stack.assert_nothing_left(&backing).await;
}

/// Behind NVIDIA DPF the controller attaches the volume on the DPU and hands
/// the node the function and namespace in the publish context: the node only
/// finds the device, and unstage leaves DPF's attachment alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dpf_publish_context_skips_the_attach() {
    use snap_csi::spdk::bdev::BdevAioCreate;
    use snap_csi::spdk::snap::{
        NvmeControllerAttachNs, NvmeControllerCreate, NvmeControllerResume, NvmeNamespaceCreate,
        NvmeSubsystemCreate,
    };
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let backing = stack.backing_file("dpf.img", SIZE);
    let snap = stack.emulator.client();
    // What DPF's controller-side attach does on the DPU.
    snap.call(&BdevAioCreate {
        name: "dpf-vol".into(),
        filename: backing.display().to_string(),
        block_size: Some(512),
        readonly: None,
    })
    .await
    .unwrap();
    let nqn = "nqn.2022-10.io.nvda.nvme:dpf-vol".to_string();
    snap.call(&NvmeSubsystemCreate {
        nqn: nqn.clone(),
        mn: None,
        sn: None,
        nn: None,
        mnan: None,
    })
    .await
    .unwrap();
    snap.call(&NvmeNamespaceCreate {
        bdev_type: "spdk".into(),
        nqn: nqn.clone(),
        nsid: 3,
        uuid: "0d1f0a52-8c5e-4a43-9a43-5d1a8c1f0003".into(),
        bdev_name: "dpf-vol".into(),
    })
    .await
    .unwrap();
    let ctrl_id = snap
        .call(&NvmeControllerCreate {
            nqn: nqn.clone(),
            pci_bdf: Some("26:00.5".into()),
            suspended: Some(true),
            ..Default::default()
        })
        .await
        .unwrap()
        .ctrl_id;
    snap.call(&NvmeControllerAttachNs {
        ctrl_id: ctrl_id.clone(),
        nsid: 3,
    })
    .await
    .unwrap();
    snap.call(&NvmeControllerResume { ctrl_id }).await.unwrap();

    let staging = stack.path("staging/pvc-dpf");
    fs::create_dir_all(&staging).unwrap();
    let target = stack.path("pods/dpf/volumes/pvc-dpf");
    let capability = mount_capability("ext4", Mode::SingleNodeWriter);
    let mut request = stage_request("pvc-dpf", &staging, capability.clone(), &backing);
    request.publish_context = [
        ("nv-pciDeviceAddress".to_string(), "26:00.5".to_string()),
        ("nv-nvmeNsID".to_string(), "3".to_string()),
    ]
    .into();
    node.node_stage_volume(request).await.unwrap();
    node.node_publish_volume(publish_request(
        "pvc-dpf", &staging, &target, capability, false,
    ))
    .await
    .unwrap();
    write_volume(&target, b"through DPF's attachment");
    unpublish(&mut node, "pvc-dpf", &target).await;
    unstage(&mut node, "pvc-dpf", &staging).await;
    let plugin_calls = stack.plugin.as_ref().unwrap().calls();
    assert!(
        plugin_calls.is_empty(),
        "the vendor plugin was not asked: {plugin_calls:?}"
    );
    let subsystems = snap.call(&NvmeSubsystemList {}).await.unwrap();
    assert_eq!(subsystems.len(), 1, "DPF's attachment is not ours to undo");
    assert!(mounts_under(&stack.kubelet).is_empty());
}
