//! The JSON-RPC client and the typed SPDK methods against the real emulator:
//! concurrency over one connection, SPDK's error codes kept intact, and every
//! typed method family accepted by an SPDK-shaped server.

mod common;

use std::time::Duration;

use common::{Emulator, free_tcp_port, sparse_file};
use snap_csi::jsonrpc::{RpcError, code};
use snap_csi::spdk::app::{RpcGetMethods, SpdkGetVersion};
use snap_csi::spdk::bdev::{
    BdevAioCreate, BdevAioDelete, BdevGetBdevs, BdevGetIostat, BdevMallocCreate, BdevMallocDelete,
    BdevNullCreate, BdevNullDelete,
};
use snap_csi::spdk::lvol::{
    BdevLvolCreate, BdevLvolCreateLvstore, BdevLvolDelete, BdevLvolGetLvstores, BdevLvolResize,
};
use snap_csi::spdk::nvme::{
    BdevNvmeAttachController, BdevNvmeDetachController, BdevNvmeGetControllers,
};
use snap_csi::spdk::nvmf::{
    ListenAddress, NvmfCreateSubsystem, NvmfCreateTransport, NvmfDeleteSubsystem,
    NvmfGetSubsystems, NvmfNamespaceParams, NvmfSubsystemAddListener, NvmfSubsystemAddNs,
    NvmfSubsystemRemoveNs,
};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_share_one_client() {
    let emulator = Emulator::start().await;
    let client = emulator.client();
    for i in 0..8 {
        client
            .call(&BdevMallocCreate {
                name: Some(format!("Malloc{i}")),
                num_blocks: 2048,
                block_size: 512,
                uuid: None,
            })
            .await
            .unwrap();
    }
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let name = format!("Malloc{}", i % 8);
                let bdevs = client
                    .call(&BdevGetBdevs {
                        name: Some(name.clone()),
                        timeout: None,
                    })
                    .await?;
                Ok::<_, RpcError>((name, bdevs))
            })
        })
        .collect();
    for task in tasks {
        let (name, bdevs) = task.await.unwrap().unwrap();
        assert_eq!(bdevs.len(), 1);
        assert_eq!(
            bdevs[0].name, name,
            "each reply reached the task that asked"
        );
        assert_eq!(bdevs[0].size_bytes(), Ok(2048 * 512));
    }
    emulator.stop().await;
}

#[tokio::test]
async fn spdk_error_codes_reach_the_caller_intact() {
    let emulator = Emulator::start().await;
    let client = emulator.client();
    let malloc = BdevMallocCreate {
        name: Some("Malloc0".into()),
        num_blocks: 1024,
        block_size: 512,
        uuid: None,
    };
    assert_eq!(client.call(&malloc).await.unwrap(), "Malloc0");
    let exists = client.call(&malloc).await.unwrap_err();
    assert!(exists.is_exists(), "{exists:?}");
    assert_eq!(
        exists.to_string(),
        "bdev_malloc_create: SPDK error -17: File exists"
    );

    let missing = client
        .call(&BdevGetBdevs {
            name: Some("Nope".into()),
            timeout: None,
        })
        .await
        .unwrap_err();
    assert!(missing.is_no_such_device(), "{missing:?}");

    let unknown = client
        .call_raw(
            "no_such_method",
            None,
            Instant::now() + Duration::from_secs(5),
        )
        .await
        .unwrap_err();
    assert!(unknown.is_method_not_found(), "{unknown:?}");

    let no_controller = client
        .call(&BdevNvmeGetControllers {
            name: Some("nvmf-absent".into()),
        })
        .await
        .unwrap_err();
    assert_eq!(no_controller.code(), Some(code::EINVAL_POSITIVE));

    let no_file = client
        .call(&BdevAioCreate {
            name: "AioX".into(),
            filename: "/nonexistent/file".into(),
            block_size: None,
            readonly: None,
        })
        .await
        .unwrap_err();
    assert_eq!(no_file.code(), Some(code::ENOENT));
    assert!(
        !no_file.is_transient(),
        "an answer is not a transient failure"
    );
    emulator.stop().await;
}

#[tokio::test]
async fn app_and_bdev_methods_round_trip() {
    let emulator = Emulator::start().await;
    let client = emulator.client();
    let version = client.call(&SpdkGetVersion {}).await.unwrap();
    assert_eq!(version.version, "SPDK v24.09");
    let methods = client.call(&RpcGetMethods::default()).await.unwrap();
    for name in [
        "bdev_aio_create",
        "nvmf_create_subsystem",
        "nvme_controller_create",
    ] {
        assert!(methods.iter().any(|m| m == name), "{name} missing");
    }

    let file = emulator.root().join("vol.img");
    sparse_file(&file, 32 << 20);
    let aio = BdevAioCreate {
        name: "aio0".into(),
        filename: file.display().to_string(),
        block_size: Some(4096),
        readonly: None,
    };
    assert_eq!(client.call(&aio).await.unwrap(), "aio0");
    let bdev = &client
        .call(&BdevGetBdevs {
            name: Some("aio0".into()),
            timeout: None,
        })
        .await
        .unwrap()[0];
    assert_eq!((bdev.block_size, bdev.num_blocks), (4096, 8192));
    assert_eq!(bdev.product_name, "AIO disk");
    let iostat = client
        .call(&BdevGetIostat {
            name: Some("aio0".into()),
        })
        .await
        .unwrap();
    assert_eq!(iostat.bdevs[0].name, "aio0");

    client
        .call(&BdevNullCreate {
            name: "null0".into(),
            num_blocks: 1024,
            block_size: 512,
            uuid: None,
        })
        .await
        .unwrap();
    let all = client.call(&BdevGetBdevs::default()).await.unwrap();
    assert_eq!(all.len(), 2);
    assert!(
        client
            .call(&BdevNullDelete {
                name: "null0".into()
            })
            .await
            .unwrap()
    );
    assert!(
        client
            .call(&BdevAioDelete {
                name: "aio0".into()
            })
            .await
            .unwrap()
    );
    let again = client
        .call(&BdevAioDelete {
            name: "aio0".into(),
        })
        .await
        .unwrap_err();
    assert!(again.is_no_such_device(), "{again:?}");
    let malloc_again = client
        .call(&BdevMallocDelete {
            name: "Malloc9".into(),
        })
        .await
        .unwrap_err();
    assert!(malloc_again.is_no_such_device());
    emulator.stop().await;
}

#[tokio::test]
async fn lvol_methods_round_trip() {
    let emulator = Emulator::start().await;
    let client = emulator.client();
    let pool = emulator.root().join("pool.img");
    sparse_file(&pool, 256 << 20);
    client
        .call(&BdevAioCreate {
            name: "pool0".into(),
            filename: pool.display().to_string(),
            block_size: Some(4096),
            readonly: None,
        })
        .await
        .unwrap();
    let lvs_uuid = client
        .call(&BdevLvolCreateLvstore {
            bdev_name: "pool0".into(),
            lvs_name: "lvs0".into(),
            cluster_sz: None,
        })
        .await
        .unwrap();
    // No fields set: no params at all are sent (an empty object answers -22).
    let stores = client.call(&BdevLvolGetLvstores::default()).await.unwrap();
    assert_eq!(stores.len(), 1);
    assert_eq!(
        (stores[0].uuid.as_str(), stores[0].name.as_str()),
        (lvs_uuid.as_str(), "lvs0")
    );
    let free_before = stores[0].free_clusters;

    let create = BdevLvolCreate {
        lvol_name: "pvc-123".into(),
        size_in_mib: 16,
        lvs_name: Some("lvs0".into()),
        uuid: None,
        thin_provision: Some(false),
    };
    let lvol = client.call(&create).await.unwrap();
    assert!(client.call(&create).await.unwrap_err().is_exists());
    let by_alias = &client
        .call(&BdevGetBdevs {
            name: Some("lvs0/pvc-123".into()),
            timeout: None,
        })
        .await
        .unwrap()[0];
    assert_eq!(by_alias.name, lvol);
    assert_eq!(by_alias.size_bytes(), Ok(16 << 20));
    assert!(
        client
            .call(&BdevLvolResize {
                name: "lvs0/pvc-123".into(),
                size_in_mib: 32,
            })
            .await
            .unwrap()
    );
    let stores = client
        .call(&BdevLvolGetLvstores {
            uuid: None,
            lvs_name: Some("lvs0".into()),
        })
        .await
        .unwrap();
    assert!(stores[0].free_clusters < free_before);
    assert!(
        client
            .call(&BdevLvolDelete {
                name: "lvs0/pvc-123".into(),
            })
            .await
            .unwrap()
    );
    let again = client
        .call(&BdevLvolDelete {
            name: "lvs0/pvc-123".into(),
        })
        .await
        .unwrap_err();
    assert!(again.is_no_such_device(), "{again:?}");
    emulator.stop().await;
}

/// One emulator plays the remote NVMe-oF target, another the SPDK inside SNAP
/// that attaches to it: the attached bdev has the target's size.
#[tokio::test]
async fn nvmf_export_and_attach_between_two_emulators() {
    let target = Emulator::start().await;
    let dpu = Emulator::start().await;
    let t = target.client();
    let file = target.root().join("vol.img");
    sparse_file(&file, 8 << 20);
    t.call(&BdevAioCreate {
        name: "vol".into(),
        filename: file.display().to_string(),
        block_size: Some(512),
        readonly: None,
    })
    .await
    .unwrap();
    t.call(&NvmfCreateTransport {
        trtype: "TCP".into(),
    })
    .await
    .unwrap();
    let nqn = "nqn.2024-01.io.snap-csi:vol";
    t.call(&NvmfCreateSubsystem {
        nqn: nqn.into(),
        serial_number: Some("SN1".into()),
        model_number: None,
        allow_any_host: Some(true),
        max_namespaces: Some(1),
    })
    .await
    .unwrap();
    let nsid = t
        .call(&NvmfSubsystemAddNs {
            nqn: nqn.into(),
            namespace: NvmfNamespaceParams {
                bdev_name: "vol".into(),
                nsid: None,
                uuid: Some("7f1a3c2e-5b6d-4e8f-9a0b-1c2d3e4f5a6b".into()),
            },
        })
        .await
        .unwrap();
    assert_eq!(nsid, 1);
    let port = free_tcp_port();
    let listen = ListenAddress {
        trtype: "tcp".into(),
        adrfam: "ipv4".into(),
        traddr: "127.0.0.1".into(),
        trsvcid: port.to_string(),
    };
    t.call(&NvmfSubsystemAddListener {
        nqn: nqn.into(),
        listen_address: listen.clone(),
    })
    .await
    .unwrap();
    let subsystem = &t
        .call(&NvmfGetSubsystems {
            nqn: Some(nqn.into()),
        })
        .await
        .unwrap()[0];
    assert_eq!(subsystem.namespaces[0].nsid, 1);
    assert_eq!(subsystem.listen_addresses[0].trtype, "TCP");

    let d = dpu.client();
    let attach = BdevNvmeAttachController {
        name: "nvmf-vol".into(),
        trtype: "tcp".into(),
        traddr: "127.0.0.1".into(),
        adrfam: Some("ipv4".into()),
        trsvcid: Some(port.to_string()),
        subnqn: Some(nqn.into()),
        hostnqn: None,
        ctrlr_loss_timeout_sec: None,
        reconnect_delay_sec: None,
    };
    assert_eq!(d.call(&attach).await.unwrap(), ["nvmf-voln1"]);
    assert!(d.call(&attach).await.unwrap_err().is_already_attached());
    let bdev = &d
        .call(&BdevGetBdevs {
            name: Some("nvmf-voln1".into()),
            timeout: None,
        })
        .await
        .unwrap()[0];
    assert_eq!(bdev.size_bytes(), Ok(8 << 20));
    let controllers = d
        .call(&BdevNvmeGetControllers {
            name: Some("nvmf-vol".into()),
        })
        .await
        .unwrap();
    assert_eq!(controllers[0].ctrlrs[0].trid.subnqn.as_deref(), Some(nqn));
    assert!(
        d.call(&BdevNvmeDetachController {
            name: "nvmf-vol".into()
        })
        .await
        .unwrap()
    );

    t.call(&NvmfSubsystemRemoveNs {
        nqn: nqn.into(),
        nsid: 1,
    })
    .await
    .unwrap();
    t.call(&NvmfDeleteSubsystem { nqn: nqn.into() })
        .await
        .unwrap();
    let again = t
        .call(&NvmfDeleteSubsystem { nqn: nqn.into() })
        .await
        .unwrap_err();
    assert_eq!(again.code(), Some(code::INVALID_PARAMS));
    dpu.stop().await;
    target.stop().await;
}

#[tokio::test]
async fn the_client_reconnects_to_a_restarted_emulator() {
    let dir = tempfile::tempdir().unwrap();
    let first = Emulator::start_in(dir.path()).await;
    let client = first.client();
    client.call(&SpdkGetVersion {}).await.unwrap();
    first.stop().await;
    let down = client.call(&SpdkGetVersion {}).await.unwrap_err();
    assert!(down.is_transient(), "{down:?}");

    let second = Emulator::start_in(dir.path()).await;
    let version = client.call(&SpdkGetVersion {}).await.unwrap();
    assert_eq!(version.version, "SPDK v24.09");
    second.stop().await;
}
