//! The plugin over real gRPC against the SNAP emulator, AIO backend: every
//! RPC, idempotency of create and delete, NOT_FOUND, paging and its tokens,
//! and bad input refused with nothing created.

mod common;

use std::collections::HashMap;

use common::{Emulator, Plugin, TIMEOUT, aio_context, timed};
use snap_csi::proto::nvidia::storage::plugins::v1 as api;
use snap_csi_spdk_plugin::backend::{BACKEND_KEY, PATH_KEY};
use snap_csi_spdk_plugin::service::{CAPABILITIES, PLUGIN_NAME};
use tonic::Code;

#[tokio::test]
async fn identity_capabilities_and_provider() {
    let snap = Emulator::snap().await;
    let plugin = Plugin::start_with(snap.socket(), "acme-snap").await;

    let info = plugin
        .identity
        .clone()
        .get_plugin_info(timed(api::GetPluginInfoRequest {}, TIMEOUT))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, PLUGIN_NAME);
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(info.manifest["backends"], "aio,nvmf");

    assert_eq!(plugin.probe(TIMEOUT).await.unwrap(), Some(true));

    let capabilities = plugin
        .storage
        .clone()
        .storage_plugin_get_capabilities(timed(
            api::StoragePluginGetCapabilitiesRequest {},
            TIMEOUT,
        ))
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    let types: Vec<i32> = capabilities
        .iter()
        .map(|c| match c.r#type {
            Some(api::storage_plugin_service_capability::Type::Rpc(rpc)) => rpc.r#type,
            None => panic!("capability without a type"),
        })
        .collect();
    assert_eq!(types, CAPABILITIES.map(|c| c as i32));

    assert_eq!(plugin.provider().await.unwrap(), "acme-snap");
    plugin.stop().await;

    // The default provider is the empty name.
    let plugin = Plugin::start(snap.socket()).await;
    assert_eq!(plugin.provider().await.unwrap(), "");
}

#[tokio::test]
async fn create_get_delete_are_idempotent() {
    let snap = Emulator::snap().await;
    let plugin = Plugin::start(snap.socket()).await;
    let file = snap.file("vol-1.img");

    let device = plugin.create("vol-1", aio_context(&file)).await.unwrap();
    assert_eq!(device, "snapcsi-aio-vol-1");
    let again = plugin.create("vol-1", aio_context(&file)).await.unwrap();
    assert_eq!(again, device);
    let bdevs = snap.bdevs().await;
    assert_eq!(
        bdevs.iter().filter(|b| **b == device).count(),
        1,
        "{bdevs:?}"
    );
    let bdev = &snap
        .client()
        .call(&snap_csi::spdk::bdev::BdevGetBdevs {
            name: Some(device.clone()),
            timeout: None,
        })
        .await
        .unwrap()[0];
    assert_eq!((bdev.block_size, bdev.size_bytes()), (512, common::SIZE));

    // By name, and by volume id alone.
    let found = plugin.get("vol-1", &device).await.unwrap();
    assert_eq!(found.volume_mode, "Block");
    plugin.get("vol-1", "").await.unwrap();
    // Another volume's name, or a name that is not ours: not this volume's device.
    for name in ["snapcsi-aio-vol-2", "Malloc0"] {
        let status = plugin.get("vol-1", name).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{name}: {status:?}");
    }

    // A plugin restart changes nothing: the name is derived, not remembered.
    plugin.stop().await;
    let plugin = Plugin::start(snap.socket()).await;
    assert_eq!(
        plugin.create("vol-1", aio_context(&file)).await.unwrap(),
        device
    );

    plugin.delete("vol-1", &device).await.unwrap();
    assert!(!snap.bdevs().await.contains(&device));
    plugin.delete("vol-1", &device).await.unwrap();
    let status = plugin.get("vol-1", &device).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let status = plugin.get("vol-1", "").await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");

    // Never created: done. Without a device name: done.
    plugin.delete("vol-never", "").await.unwrap();
    plugin
        .delete("vol-never", "snapcsi-aio-vol-never")
        .await
        .unwrap();
    // Without a name, DeleteDevice still finds the volume's device.
    plugin.create("vol-1", aio_context(&file)).await.unwrap();
    plugin.delete("vol-1", "").await.unwrap();
    assert!(!snap.bdevs().await.contains(&device));
}

#[tokio::test]
async fn delete_never_touches_another_volumes_device() {
    let snap = Emulator::snap().await;
    let plugin = Plugin::start(snap.socket()).await;
    let file = snap.file("vol-a.img");
    let device = plugin.create("vol-a", aio_context(&file)).await.unwrap();
    plugin.delete("vol-b", &device).await.unwrap();
    assert!(snap.bdevs().await.contains(&device));
    plugin.delete("vol-a", &device).await.unwrap();
}

#[tokio::test]
async fn list_pages_one_at_a_time_and_aborts_foreign_tokens() {
    let snap = Emulator::snap().await;
    let plugin = Plugin::start(snap.socket()).await;
    // Someone else's bdev is not listed.
    snap.client()
        .call(&snap_csi::spdk::bdev::BdevAioCreate {
            name: "foreign".into(),
            filename: snap.file("foreign.img").display().to_string(),
            block_size: Some(512),
            readonly: None,
        })
        .await
        .unwrap();
    // An id that is not a plain name maps back all the same.
    let ids = ["vol-c", "vol-a", "ns/vol b"];
    let mut expected = vec![];
    for (i, id) in ids.iter().enumerate() {
        let file = snap.file(&format!("{i}.img"));
        let device = plugin.create(id, aio_context(&file)).await.unwrap();
        expected.push((id.to_string(), device));
    }
    expected.sort_by(|a, b| a.1.cmp(&b.1));

    let first = plugin.list(1, "").await.unwrap();
    assert_eq!(first.entries.len(), 1);
    assert!(!first.next_token.is_empty());
    assert_eq!(plugin.list_all(1).await, expected);
    assert_eq!(plugin.list_all(2).await, expected);
    assert_eq!(plugin.list_all(0).await, expected);

    // A token survives the device it names: the next page follows it.
    let (first_id, first_device) = &expected[0];
    plugin.delete(first_id, first_device).await.unwrap();
    let second = plugin.list(1, &first.next_token).await.unwrap();
    assert_eq!(second.entries[0].device_name, expected[1].1);

    for bad in ["garbage", "after:Malloc0", &expected[1].1] {
        let status = plugin.list(1, bad).await.unwrap_err();
        assert_eq!(status.code(), Code::Aborted, "{bad}: {status:?}");
    }
    let status = plugin.list(-1, "").await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
}

#[tokio::test]
async fn bad_input_is_invalid_argument_and_creates_nothing() {
    let snap = Emulator::snap().await;
    let plugin = Plugin::start(snap.socket()).await;
    let file = snap.file("vol.img");
    let before = snap.bdevs().await;

    let context = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let path = file.display().to_string();
    let long = "x".repeat(129);
    let cases: Vec<(&str, HashMap<String, String>, &str)> = vec![
        ("", aio_context(&file), "volume_id"),
        (&long, aio_context(&file), "128"),
        ("vol", HashMap::new(), "backend"),
        ("vol", context(&[(BACKEND_KEY, "ceph")]), "ceph"),
        ("vol", context(&[(BACKEND_KEY, "aio")]), "path"),
        (
            "vol",
            context(&[(BACKEND_KEY, "aio"), (PATH_KEY, "relative.img")]),
            "absolute",
        ),
        (
            "vol",
            context(&[(BACKEND_KEY, "nvmf"), (PATH_KEY, &path)]),
            "trtype",
        ),
    ];
    for (volume_id, volume_context, says) in cases {
        let status = plugin.create(volume_id, volume_context).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(says), "{says}: {status:?}");
    }
    let filesystem = api::CreateDeviceRequest {
        volume_id: "vol".into(),
        volume_mode: "Filesystem".into(),
        volume_context: aio_context(&file),
        ..Default::default()
    };
    let status = plugin
        .create_request(filesystem, TIMEOUT)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    for status in [
        plugin.delete("", "").await.unwrap_err(),
        plugin.get("", "").await.unwrap_err(),
    ] {
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    }

    // SPDK refuses what looks fine: a missing file, an empty one.
    let missing = snap.dir.path().join("missing.img");
    let status = plugin
        .create("vol", aio_context(&missing))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    let empty = snap.dir.path().join("empty.img");
    std::fs::File::create(&empty).unwrap();
    let status = plugin.create("vol", aio_context(&empty)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("empty"), "{status:?}");

    assert_eq!(snap.bdevs().await, before);
    assert!(plugin.list_all(0).await.is_empty());
}
