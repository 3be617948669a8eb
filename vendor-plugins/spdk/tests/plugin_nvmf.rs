//! The NVMe-oF backend: the DPU's SNAP emulator attaches, over real TCP, to a
//! second emulator playing the remote SPDK target that exports the volume.

mod common;

use common::{Emulator, Plugin, export, free_tcp_port, listen, nvmf_context};
use snap_csi::spdk::bdev::BdevGetBdevs;
use snap_csi::spdk::nvmf::{NvmfCreateSubsystem, NvmfCreateTransport};
use tonic::Code;

const NQN: &str = "nqn.2024-01.io.snap-csi:pvc-nvmf-1";

#[tokio::test]
async fn attach_is_idempotent_and_detach_leaves_nothing() {
    let target = Emulator::target().await;
    let snap = Emulator::snap().await;
    let port = export(&target, "vol1", NQN).await;
    let plugin = Plugin::start(snap.socket()).await;

    let device = plugin
        .create("pvc-nvmf-1", nvmf_context(port, NQN))
        .await
        .unwrap();
    assert_eq!(device, "snapcsi-nvmf-pvc-nvmf-1n1");
    let again = plugin
        .create("pvc-nvmf-1", nvmf_context(port, NQN))
        .await
        .unwrap();
    assert_eq!(again, device);
    let spdk = snap.client();
    let controllers = snap.nvme_controllers().await;
    assert_eq!(controllers.len(), 1, "{controllers:?}");
    assert_eq!(controllers[0].ctrlrs[0].trid.subnqn.as_deref(), Some(NQN));
    let bdev = &spdk
        .call(&BdevGetBdevs {
            name: Some(device.clone()),
            timeout: None,
        })
        .await
        .unwrap()[0];
    assert_eq!(bdev.size_bytes(), common::SIZE);

    assert_eq!(
        plugin.get("pvc-nvmf-1", &device).await.unwrap().volume_mode,
        "Block"
    );
    assert_eq!(
        plugin.list_all(1).await,
        [("pvc-nvmf-1".to_string(), device.clone())]
    );

    plugin.delete("pvc-nvmf-1", &device).await.unwrap();
    plugin.delete("pvc-nvmf-1", &device).await.unwrap();
    plugin.delete("pvc-nvmf-1", "").await.unwrap();
    assert!(snap.nvme_controllers().await.is_empty());
    assert!(snap.bdevs().await.is_empty());
    let status = plugin.get("pvc-nvmf-1", &device).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(plugin.list_all(0).await.is_empty());
}

#[tokio::test]
async fn unreachable_targets_and_unknown_subsystems_create_nothing() {
    let target = Emulator::target().await;
    let snap = Emulator::snap().await;
    let port = export(&target, "vol1", NQN).await;
    let plugin = Plugin::start(snap.socket()).await;

    // Nothing listens there: the target may be on its way, so retry.
    let status = plugin
        .create("pvc-x", nvmf_context(free_tcp_port(), NQN))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("nothing answers"), "{status:?}");

    // The target answers but has no such subsystem: retrying will not help.
    let status = plugin
        .create(
            "pvc-x",
            nvmf_context(port, "nqn.2024-01.io.snap-csi:no-such"),
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");

    assert!(snap.nvme_controllers().await.is_empty());
    assert!(snap.bdevs().await.is_empty());
}

/// A subsystem without namespace 1 has no device to give: the controller
/// SPDK attached anyway is detached again.
#[tokio::test]
async fn a_subsystem_without_namespace_1_is_refused_and_left_detached() {
    let target = Emulator::target().await;
    let snap = Emulator::snap().await;
    let t = target.client();
    t.call(&NvmfCreateTransport {
        trtype: "TCP".into(),
    })
    .await
    .unwrap();
    t.call(&NvmfCreateSubsystem {
        nqn: NQN.into(),
        serial_number: None,
        model_number: None,
        allow_any_host: Some(true),
        max_namespaces: None,
    })
    .await
    .unwrap();
    let port = listen(&target, NQN).await;
    let plugin = Plugin::start(snap.socket()).await;
    let status = plugin
        .create("pvc-empty", nvmf_context(port, NQN))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("namespace 1"), "{status:?}");
    assert!(snap.nvme_controllers().await.is_empty());
}

/// Both backends side by side, listed together.
#[tokio::test]
async fn both_backends_list_together() {
    let target = Emulator::target().await;
    let snap = Emulator::snap().await;
    let port = export(&target, "vol1", NQN).await;
    let plugin = Plugin::start(snap.socket()).await;
    let file = snap.file("aio.img");
    let aio = plugin
        .create("pvc-1", common::aio_context(&file))
        .await
        .unwrap();
    let nvmf = plugin
        .create("pvc-2", nvmf_context(port, NQN))
        .await
        .unwrap();
    assert_eq!(
        plugin.list_all(1).await,
        [
            ("pvc-1".to_string(), aio.clone()),
            ("pvc-2".to_string(), nvmf.clone())
        ]
    );
    // Without a name, GetDevice finds either backend's device.
    plugin.get("pvc-1", "").await.unwrap();
    plugin.get("pvc-2", "").await.unwrap();
    plugin.delete("pvc-1", "").await.unwrap();
    plugin.delete("pvc-2", "").await.unwrap();
    assert!(snap.bdevs().await.is_empty());
}
