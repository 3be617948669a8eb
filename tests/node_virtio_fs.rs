//! Filesystem devices (virtio-fs) as kubelet drives the node: the test
//! plugin makes an SPDK fsdev over a directory (`fsdev_aio_create`), SNAP's
//! emulator serves it as a hot-plugged virtio-fs device, the node mounts it
//! by tag (a real kernel FUSE mount whose connection the emulator serves,
//! `docs/virtio-fs.md`), binds it into pods, and takes it all down, kubelet's
//! mount-reference check holding before each unstage.
//! Several node stacks (each its own kubelet directory, its own emulated DPU
//! with its own functions) share one backing directory as hosts share a
//! ReadWriteMany volume. `SNAP_CSI_TEST_DPU=split` runs the same through DPU
//! agents.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::node::{Tweaks, block_capability, mount_capability, mounts_under, unstage};
use common::plugin::{CAPABILITIES, Capability, PLUGIN_NAME};
use common::virtio_fs::{Host, fs_type_at, stage_request, write_file};
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use snap_csi::spdk::fsdev::FsdevAioCreate;
use snap_csi::spdk::snap::{
    VIRTIO_FS_TRANSPORT, VirtioFsDeviceCreate, VirtioFsDeviceDestroy, VirtioFsGetDevices,
    VirtioFsTransportCreate,
};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filesystem_device_is_staged_published_used_and_taken_down_idempotently() {
    let host = Host::start().await;
    let share = tempfile::tempdir().unwrap();
    let rwo = mount_capability("", Mode::SingleNodeWriter);
    for _ in 0..2 {
        host.stage(rwo.clone(), share.path()).await.unwrap();
    }
    assert_eq!(
        host.snap_objects().await,
        (1, 1),
        "one device on one function"
    );
    assert_eq!(fs_type_at(&host.staging), "fuse.virtiofs");
    for _ in 0..2 {
        host.publish(rwo.clone(), share.path(), false)
            .await
            .unwrap();
    }
    let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 251) as u8).collect();
    write_file(&host.target, "data.bin", &data);
    assert_eq!(
        std::fs::read(share.path().join("data.bin")).unwrap(),
        data,
        "the backend holds it"
    );
    assert_eq!(std::fs::read(host.staging.join("data.bin")).unwrap(), data);

    let mut node = host.stack.client.clone();
    let stats = node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: "pvc-fs".into(),
            volume_path: host.target.display().to_string(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let condition = stats.volume_condition.unwrap();
    assert!(!condition.abnormal, "{condition:?}");
    let bytes = stats
        .usage
        .iter()
        .find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32)
        .unwrap();
    assert!(bytes.total > 0 && bytes.used > 0, "{bytes:?}");
    // Nothing grows on the host: the size it shows is the backend's.
    let expanded = node
        .node_expand_volume(csi::NodeExpandVolumeRequest {
            volume_id: "pvc-fs".into(),
            volume_path: host.target.display().to_string(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: bytes.total,
                limit_bytes: 0,
            }),
            staging_target_path: host.staging.display().to_string(),
            volume_capability: Some(rwo.clone()),
            secrets: HashMap::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(expanded.capacity_bytes, bytes.total);

    for _ in 0..2 {
        host.take_down().await;
    }
    host.assert_nothing_left().await;
    assert_eq!(
        std::fs::read(share.path().join("data.bin")).unwrap(),
        data,
        "the data stays in the share"
    );

    // Staged again, the same tree is there.
    host.stage_and_publish(rwo, share.path()).await;
    assert_eq!(std::fs::read(host.target.join("data.bin")).unwrap(), data);
    host.take_down().await;
    host.assert_nothing_left().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_snap_lost_is_attached_and_mounted_again_by_the_next_publish_or_stage() {
    let mut host = Host::start().await;
    let share = tempfile::tempdir().unwrap();
    write_file(share.path(), "kept.txt", b"kept");
    let rwo = mount_capability("", Mode::SingleNodeWriter);
    let kept = |dir: &Path| std::fs::read(dir.join("kept.txt")).map_err(|e| e.raw_os_error());
    host.stage(rwo.clone(), share.path()).await.unwrap();
    host.stack.emulator.restart_empty().await;
    assert_eq!(
        kept(&host.staging),
        Err(Some(nix::errno::Errno::ENOTCONN as i32)),
        "lost"
    );
    // kubelet sends no stage for a volume it believes staged: the publish
    // attaches it again.
    host.publish(rwo.clone(), share.path(), false)
        .await
        .unwrap();
    assert_eq!(kept(&host.target), Ok(b"kept".to_vec()));
    assert_eq!(host.snap_objects().await, (1, 1));
    // A stage retried after SNAP came back does too.
    host.stack.emulator.restart_empty().await;
    assert_eq!(
        kept(&host.staging),
        Err(Some(nix::errno::Errno::ENOTCONN as i32)),
        "lost"
    );
    host.stage(rwo, share.path()).await.unwrap();
    assert_eq!(kept(&host.staging), Ok(b"kept".to_vec()));
    assert_eq!(host.snap_objects().await, (1, 1));
    host.take_down().await;
    host.assert_nothing_left().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capability_a_filesystem_device_cannot_serve_is_refused_and_changes_nothing() {
    let host = Host::start().await;
    let share = tempfile::tempdir().unwrap();
    let refused = [
        (mount_capability("ext4", Mode::SingleNodeWriter), "fs_type"),
        (block_capability(Mode::SingleNodeWriter), "mount capability"),
    ];
    for (capability, says) in refused {
        let error = host.stage(capability, share.path()).await.unwrap_err();
        assert_eq!(error.code(), Code::InvalidArgument, "{error:?}");
        assert!(error.message().contains(says), "{error:?}");
    }
    let mut encrypted = stage_request(
        "pvc-fs",
        &host.staging,
        mount_capability("virtiofs", Mode::SingleNodeWriter),
        share.path(),
    );
    encrypted
        .volume_context
        .insert("snap-csi.io/encryption".into(), "aes-xts".into());
    let error = host
        .stack
        .client
        .clone()
        .node_stage_volume(encrypted)
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument, "{error:?}");
    assert!(
        error.message().contains("snap-csi.io/encryption"),
        "{error:?}"
    );

    assert!(
        host.stack.plugin.as_ref().unwrap().calls().is_empty(),
        "the plugin was asked"
    );
    host.assert_nothing_left().await;
}

/// The node's wrong-device guard: a staging path that holds another volume's tag
/// is not taken for this volume's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_volumes_tag_at_the_staging_path_is_refused() {
    let host = Host::start().await;
    let (share, other_share) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let rwo = mount_capability("", Mode::SingleNodeWriter);
    host.stage(rwo.clone(), share.path()).await.unwrap();
    let mut node = host.stack.client.clone();
    let other = stage_request("pvc-other", &host.staging, rwo, other_share.path());
    let error = node.node_stage_volume(other).await.unwrap_err();
    assert_eq!(error.code(), Code::AlreadyExists, "{error:?}");
    let ours = snap_csi::dpu::names::VolumeNames::new("pvc-fs").fs_tag;
    assert!(error.message().contains(&ours), "{error:?}");
    assert_eq!(fs_type_at(&host.staging), "fuse.virtiofs");
    // The other volume was never mounted: its unstage elsewhere detaches it.
    let elsewhere = host.stack.path("plugins/staging/pvc-other");
    unstage(&mut node, "pvc-other", &elsewhere).await;
    unstage(&mut node, "pvc-fs", &host.staging).await;
    host.assert_nothing_left().await;
}

/// The DPU-side guard: SNAP already has a device of the volume's name (and
/// tag) serving another fsdev, as a leftover of another volume's or an
/// operator's would. The stage is refused, naming both, and that device is
/// left as it was: not started, not bound, not plugged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_of_the_volumes_name_serving_another_fsdev_is_refused_and_left_alone() {
    let host = Host::start().await;
    let (share, stray_root) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let snap = host.stack.emulator.client();
    let names = snap_csi::dpu::names::VolumeNames::new("pvc-fs");
    snap.call(&FsdevAioCreate {
        name: "stray".into(),
        root_path: stray_root.path().display().to_string(),
    })
    .await
    .unwrap();
    snap.call(&VirtioFsTransportCreate {
        transport_name: VIRTIO_FS_TRANSPORT.into(),
    })
    .await
    .unwrap();
    snap.call(&VirtioFsDeviceCreate {
        transport_name: VIRTIO_FS_TRANSPORT.into(),
        dev_name: names.fs_device.clone(),
        tag: names.fs_tag.clone(),
        fsdev: "stray".into(),
        num_request_queues: 1,
        queue_size: 64,
        driver_platform: "x86_64".into(),
    })
    .await
    .unwrap();
    let rwo = mount_capability("", Mode::SingleNodeWriter);

    let error = host.stage(rwo.clone(), share.path()).await.unwrap_err();
    assert_eq!(error.code(), Code::FailedPrecondition, "{error:?}");
    assert!(
        error.message().contains("serves fsdev stray") && error.message().contains(&names.fs_tag),
        "{error:?}"
    );
    let devices = snap.call(&VirtioFsGetDevices {}).await.unwrap();
    assert_eq!(devices.len(), 1, "{devices:?}");
    assert_eq!(devices[0].fsdev.as_deref(), Some("stray"));
    assert_ne!(devices[0].state.as_deref(), Some("running"), "{devices:?}");
    assert_eq!(host.snap_objects().await, (1, 0), "no function bound");
    assert!(mounts_under(&host.stack.kubelet).is_empty());

    // Once the stray device goes, the volume's own comes.
    snap.call(&VirtioFsDeviceDestroy {
        dev_name: names.fs_device.clone(),
    })
    .await
    .unwrap();
    host.stage(rwo, share.path()).await.unwrap();
    assert_eq!(fs_type_at(&host.staging), "fuse.virtiofs");
    host.take_down().await;
    host.assert_nothing_left().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_without_filesystem_devices_is_named_in_a_failed_precondition() {
    let block_only: Vec<Capability> = CAPABILITIES
        .into_iter()
        .filter(|c| *c != Capability::CreateDeleteFsDevice)
        .collect();
    let host = Host::start_with(Tweaks {
        plugin_capabilities: Some(block_only),
        ..Tweaks::default()
    })
    .await;
    let share = tempfile::tempdir().unwrap();
    let error = host
        .stage(
            mount_capability("virtiofs", Mode::SingleNodeWriter),
            share.path(),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::FailedPrecondition, "{error:?}");
    assert!(
        error.message().contains(PLUGIN_NAME)
            && error.message().contains("CREATE_DELETE_FS_DEVICE"),
        "{error:?}"
    );
    let calls = host.stack.plugin.as_ref().unwrap().calls();
    assert!(
        !calls.iter().any(|c| c.starts_with("CreateDevice")),
        "{calls:?}"
    );
    host.assert_nothing_left().await;
}

/// Three hosts, each with its own DPU, over one share: two write and read
/// each other's files; one unstages while the other keeps writing; a third
/// mounts read-only and cannot write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_share_a_read_write_many_volume_and_a_read_only_one_cannot_write() {
    let (a, b, c) = tokio::join!(Host::start(), Host::start(), Host::start());
    let share = tempfile::tempdir().unwrap();
    let rwx = mount_capability("virtiofs", Mode::MultiNodeMultiWriter);
    tokio::join!(
        a.stage_and_publish(rwx.clone(), share.path()),
        b.stage_and_publish(rwx.clone(), share.path())
    );
    write_file(&a.target, "from-a", b"written on host a");
    assert_eq!(
        std::fs::read(b.target.join("from-a")).unwrap(),
        b"written on host a"
    );
    write_file(&b.target, "from-b", b"written on host b");
    assert_eq!(
        std::fs::read(a.target.join("from-b")).unwrap(),
        b"written on host b"
    );

    let rox = mount_capability("", Mode::MultiNodeReaderOnly);
    c.stage(rox.clone(), share.path()).await.unwrap();
    c.publish(rox, share.path(), true).await.unwrap();
    assert_eq!(
        std::fs::read(c.target.join("from-b")).unwrap(),
        b"written on host b"
    );
    let refused = std::fs::write(c.target.join("from-c"), b"no");
    let erofs = nix::errno::Errno::EROFS as i32;
    assert_eq!(
        refused.unwrap_err().raw_os_error(),
        Some(erofs),
        "a read-only pod wrote"
    );

    // a goes away; b keeps writing, and c reads what b wrote after.
    a.take_down().await;
    a.assert_nothing_left().await;
    write_file(&b.target, "after-a", b"b still writes");
    assert_eq!(
        std::fs::read(c.target.join("after-a")).unwrap(),
        b"b still writes"
    );
    assert_eq!(b.snap_objects().await, (1, 1));

    tokio::join!(b.take_down(), c.take_down());
    b.assert_nothing_left().await;
    c.assert_nothing_left().await;
    let mut kept: Vec<String> = std::fs::read_dir(share.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    kept.sort();
    assert_eq!(kept, ["after-a", "from-a", "from-b"]);
}
