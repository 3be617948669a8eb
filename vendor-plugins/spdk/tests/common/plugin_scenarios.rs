//! The plugin service's behaviour, written once and run on the emulator
//! (`plugin_aio.rs`, `plugin_nvmf.rs`, `plugin_check.rs`) and on real
//! `spdk_tgt` processes (`real_spdk.rs`): over real gRPC, every RPC for both
//! backends, idempotency of create and delete, NOT_FOUND, paging and its
//! tokens, bad input refused with nothing created, AIO QoS limits set at
//! attach, AIO bdevs grown with their files (`bdev_aio_rescan`), and
//! `plugin-check`.

use std::collections::HashMap;
use std::time::Duration;

use snap_csi::plugin_check::{self, Verdict};
use snap_csi::proto::nvidia::storage::plugins::v1 as api;
use snap_csi::spdk::bdev::BdevGetBdevs;
use snap_csi::spdk::nvmf::{NvmfCreateSubsystem, NvmfCreateTransport};
use snap_csi_spdk_plugin::backend::{AIO, BACKEND_KEY, PATH_KEY};
use snap_csi_spdk_plugin::qos::{self, QosLimits};
use snap_csi_spdk_plugin::service::PLUGIN_NAME;
use tonic::Code;

use snap_csi_spdk_plugin::backend::Devices;

use super::{
    Plugin, SIZE, Source, Spdk, TIMEOUT, aio_context, export, free_tcp_port, fs_context, grow,
    listen, nvmf_context, timed,
};

/// Defines one `#[tokio::test]` per scenario of a group (`aio`, `nvmf`,
/// `check`), each with the SPDK processes of `$source` (an
/// `Option<Source>`: `None` skips), so the emulator's tests and the real
/// ones run the same list.
#[macro_export]
macro_rules! plugin_scenario_tests {
    (aio, $source:expr) => {
        $crate::plugin_scenario_tests!(
            @each $source,
            identity_capabilities_and_provider,
            create_get_delete_are_idempotent,
            delete_never_touches_another_volumes_device,
            list_pages_one_at_a_time_and_aborts_foreign_tokens,
            bad_input_is_invalid_argument_and_creates_nothing,
            aio_qos_limits_are_set_at_attach_from_the_record,
            aio_bdevs_grow_with_their_files,
        );
    };
    (nvmf, $source:expr) => {
        $crate::plugin_scenario_tests!(
            @each $source,
            attach_is_idempotent_and_detach_leaves_nothing,
            unreachable_targets_and_unknown_subsystems_create_nothing,
            a_subsystem_without_namespace_1_is_refused_and_left_detached,
            both_backends_list_together,
        );
    };
    (fs, $source:expr) => {
        $crate::plugin_scenario_tests!(
            @each $source,
            fs_devices_are_made_found_and_removed_idempotently,
            each_plugin_advertises_and_accepts_the_kinds_it_makes,
            fs_requests_it_cannot_serve_are_refused_and_create_nothing,
        );
    };
    (check, $source:expr) => {
        $crate::plugin_scenario_tests!(@each $source, the_sample_plugin_passes_plugin_check,);
    };
    (check_fs, $source:expr) => {
        $crate::plugin_scenario_tests!(
            @each $source,
            plugin_check_judges_block_only_fs_only_and_both,
        );
    };
    (@each $source:expr, $($scenario:ident,)+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                let Some(source) = $source else {
                    return;
                };
                $crate::common::plugin_scenarios::$scenario(&source).await;
            }
        )+
    };
}

pub async fn identity_capabilities_and_provider(source: &Source) {
    let snap = source.snap().await;
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
    use api::storage_plugin_service_capability::rpc::Type;
    let block_only = [
        Type::CreateDeleteBlockDevice,
        Type::GetDeviceStats,
        Type::ListDevices,
    ];
    assert_eq!(types, block_only.map(|c| c as i32));

    assert_eq!(plugin.provider().await.unwrap(), "acme-snap");
    plugin.stop().await;

    // The default provider is the empty name.
    let plugin = Plugin::start(snap.socket()).await;
    assert_eq!(plugin.provider().await.unwrap(), "");
}

pub async fn create_get_delete_are_idempotent(source: &Source) {
    let snap = source.snap().await;
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
    assert_eq!((bdev.block_size, bdev.size_bytes()), (512, Ok(SIZE)));

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

pub async fn delete_never_touches_another_volumes_device(source: &Source) {
    let snap = source.snap().await;
    let plugin = Plugin::start(snap.socket()).await;
    let file = snap.file("vol-a.img");
    let device = plugin.create("vol-a", aio_context(&file)).await.unwrap();
    plugin.delete("vol-b", &device).await.unwrap();
    assert!(snap.bdevs().await.contains(&device));
    plugin.delete("vol-a", &device).await.unwrap();
}

pub async fn list_pages_one_at_a_time_and_aborts_foreign_tokens(source: &Source) {
    let snap = source.snap().await;
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

pub async fn bad_input_is_invalid_argument_and_creates_nothing(source: &Source) {
    let snap = source.snap().await;
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
        (
            "vol",
            context(&[
                (BACKEND_KEY, "aio"),
                (PATH_KEY, &path),
                (qos::RW_IOPS_KEY, "1500"),
            ]),
            qos::RW_IOPS_KEY,
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

    // SPDK refuses what looks fine: a missing file, one that is not whole
    // blocks; the plugin refuses an empty one, which SPDK would take as a
    // bdev of no blocks.
    let missing = snap.dir.path().join("missing.img");
    let status = plugin
        .create("vol", aio_context(&missing))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    let partial = snap.dir.path().join("partial.img");
    std::fs::write(&partial, [0u8; 100]).unwrap();
    let status = plugin
        .create("vol", aio_context(&partial))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("whole number"), "{status:?}");
    let empty = snap.dir.path().join("empty.img");
    std::fs::write(&empty, []).unwrap();
    let status = plugin.create("vol", aio_context(&empty)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("is empty"), "{status:?}");

    assert_eq!(snap.bdevs().await, before);
    assert!(plugin.list_all(0).await.is_empty());
}

/// An AIO volume's limits are set on the bdev CreateDevice makes: the
/// volume context's (CreateVolume's), overlaid key by key with the AIO
/// backend's record beside the file (ModifyVolume's), also on a bdev an
/// earlier call made, and again at the next attach; and a change of the
/// record reaches the attached bdev live, also one made before the plugin
/// started. Needs `bdev_set_qos_limit` in SNAP's SPDK.
pub async fn aio_qos_limits_are_set_at_attach_from_the_record(source: &Source) {
    let snap = source.snap().await;
    let plugin = Plugin::start(snap.socket()).await;
    let file = snap.file("vol-q.img");
    let mut context = aio_context(&file);
    context.insert(qos::RW_IOPS_KEY.into(), "2000".into());
    context.insert(qos::W_MBYTES_KEY.into(), "10".into());
    let device = plugin.create("vol-q", context.clone()).await.unwrap();
    assert_eq!(snap.rate_limits(&device).await, [2000, 0, 0, 10]);

    // A ModifyVolume since: the controller's record in the pool.
    let records = snap_csi::json_dir::JsonDir::open(qos::record_dir(&file).unwrap()).unwrap();
    let modified = QosLimits {
        rw_ios_per_sec: Some(0),
        r_mbytes_per_sec: Some(5),
        ..Default::default()
    };
    records.store("vol-q", &modified).unwrap();
    // A CreateDevice retried on the bdev there applies it ...
    assert_eq!(
        plugin.create("vol-q", context.clone()).await.unwrap(),
        device
    );
    assert_eq!(snap.rate_limits(&device).await, [0, 0, 5, 10]);
    // ... and so does the next attach, to a new bdev.
    plugin.delete("vol-q", &device).await.unwrap();
    assert_eq!(plugin.create("vol-q", context).await.unwrap(), device);
    assert_eq!(snap.rate_limits(&device).await, [0, 0, 5, 10]);

    // A volume without limits has none.
    let plain = plugin
        .create("vol-plain", aio_context(&snap.file("vol-plain.img")))
        .await
        .unwrap();
    assert_eq!(snap.rate_limits(&plain).await, [0; 4]);
    plugin.delete("vol-plain", &plain).await.unwrap();

    // A plugin that follows the records: one started after the attach
    // adopts the bdev and applies a change without any call to it.
    plugin.stop().await;
    let plugin = Plugin::start_following(snap.socket(), Duration::from_millis(50)).await;
    let live = QosLimits {
        w_mbytes_per_sec: Some(0),
        rw_mbytes_per_sec: Some(40),
        ..modified
    };
    records.store("vol-q", &live).unwrap();
    snap.rate_limits_become(&device, [0, 40, 5, 0]).await;
    plugin.delete("vol-q", &device).await.unwrap();
    assert!(plugin.list_all(0).await.is_empty());
}

/// Online expansion of AIO volumes: a followed bdev grows with its file
/// (ControllerExpandVolume's) within periods, with no call to the plugin;
/// so does one whose file grew while no plugin ran (listed at the next
/// start), and one CreateDevice found there without knowing its size (made
/// by another plugin since that start).
pub async fn aio_bdevs_grow_with_their_files(source: &Source) {
    const BLOCK: u64 = 512;
    let period = Duration::from_millis(50);
    let snap = source.snap().await;
    let plugin = Plugin::start_following(snap.socket(), period).await;
    let file = snap.file("vol-g.img");
    let context = aio_context(&file);
    let device = plugin.create("vol-g", context.clone()).await.unwrap();
    assert_eq!(snap.num_blocks(&device).await, SIZE / BLOCK);
    grow(&file, 2 * SIZE);
    snap.num_blocks_become(&device, 2 * SIZE / BLOCK).await;

    plugin.stop().await;
    grow(&file, 3 * SIZE);
    assert_eq!(snap.num_blocks(&device).await, 2 * SIZE / BLOCK);
    let plugin = Plugin::start_following(snap.socket(), period).await;
    snap.num_blocks_become(&device, 3 * SIZE / BLOCK).await;

    // Made by a plugin that does not follow, after this one listed SNAP's
    // bdevs; the file grows before this one's CreateDevice finds the bdev.
    let other = Plugin::start(snap.socket()).await;
    let late = snap.file("vol-late.img");
    let late_device = other.create("vol-late", aio_context(&late)).await.unwrap();
    other.stop().await;
    grow(&late, 2 * SIZE);
    assert_eq!(
        plugin.create("vol-late", aio_context(&late)).await.unwrap(),
        late_device
    );
    snap.num_blocks_become(&late_device, 2 * SIZE / BLOCK).await;
    // The first one still followed, after a CreateDevice that found it.
    assert_eq!(plugin.create("vol-g", context).await.unwrap(), device);
    grow(&file, 4 * SIZE);
    snap.num_blocks_become(&device, 4 * SIZE / BLOCK).await;

    for (volume, name) in [("vol-g", &device), ("vol-late", &late_device)] {
        plugin.delete(volume, name).await.unwrap();
    }
    assert!(plugin.list_all(0).await.is_empty());
}

const NQN: &str = "nqn.2024-01.io.snap-csi:pvc-nvmf-1";

pub async fn attach_is_idempotent_and_detach_leaves_nothing(source: &Source) {
    let target = source.target().await;
    let snap = source.snap().await;
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
    assert_eq!(bdev.size_bytes(), Ok(SIZE));

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

pub async fn unreachable_targets_and_unknown_subsystems_create_nothing(source: &Source) {
    let target = source.target().await;
    let snap = source.snap().await;
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
pub async fn a_subsystem_without_namespace_1_is_refused_and_left_detached(source: &Source) {
    let target = source.target().await;
    let snap = source.snap().await;
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
pub async fn both_backends_list_together(source: &Source) {
    let target = source.target().await;
    let snap = source.snap().await;
    let port = export(&target, "vol1", NQN).await;
    let plugin = Plugin::start(snap.socket()).await;
    let file = snap.file("aio.img");
    let aio = plugin.create("pvc-1", aio_context(&file)).await.unwrap();
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

pub async fn the_sample_plugin_passes_plugin_check(source: &Source) {
    let snap = source.snap().await;
    let plugin = Plugin::start(snap.socket()).await;
    let file = snap.file("check.img");
    let config = plugin_check::Config {
        socket: plugin.socket.clone(),
        volume_context: HashMap::from([
            (BACKEND_KEY.to_string(), AIO.to_string()),
            (PATH_KEY.to_string(), file.display().to_string()),
        ]),
        fs_volume_context: HashMap::new(),
        timeout: Duration::from_secs(30),
    };
    let report = plugin_check::run(&config, &mut |result| println!("{result}"))
        .await
        .unwrap();
    assert_eq!(report.failed(), 0, "{report}");
    assert!(report.passed() >= 17, "{report}");
    assert!(report.names(Verdict::Fail).is_empty());
    assert!(
        snap.bdevs().await.is_empty(),
        "plugin-check cleaned up after itself"
    );
}

/// A share in `snap`'s directory and the devices of a plugin serving it,
/// with block devices or without.
fn share(snap: &Spdk, block: bool) -> (std::path::PathBuf, Devices) {
    let share = snap.dir.path().join("share");
    std::fs::create_dir_all(&share).unwrap();
    let devices = Devices {
        block,
        fs_share: Some(share.clone()),
        fs_nfs_server: None,
    };
    (share, devices)
}

/// A volume's directory in the share, with a file in it.
fn volume_dir(share: &std::path::Path, volume_id: &str) -> std::path::PathBuf {
    let dir = share.join(volume_id);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("hello"), b"kept").unwrap();
    dir
}

/// Filesystem devices: `fsdev_aio_create` over the volume's directory,
/// found by GetDevice (volume_mode "Filesystem") and ListDevices beside
/// block devices, made and removed once however often asked, across a
/// plugin restart; the tree is the volume's and stays.
pub async fn fs_devices_are_made_found_and_removed_idempotently(source: &Source) {
    let snap = source.snap().await;
    let (share, devices) = share(&snap, true);
    let plugin = Plugin::start_making(snap.socket(), devices.clone()).await;
    let dir = volume_dir(&share, "pvc-fs");

    let device = plugin
        .create_as("pvc-fs", "Filesystem", fs_context(&dir))
        .await
        .unwrap();
    assert_eq!(device, "snapcsi-fs-pvc-fs");
    let again = plugin
        .create_as("pvc-fs", "Filesystem", fs_context(&dir))
        .await
        .unwrap();
    assert_eq!(again, device);
    assert_eq!(snap.fsdevs().await, std::slice::from_ref(&device));
    assert!(snap.bdevs().await.is_empty());

    let found = plugin.get("pvc-fs", &device).await.unwrap();
    assert_eq!(found.volume_mode, "Filesystem");
    assert_eq!(
        plugin.get("pvc-fs", "").await.unwrap().volume_mode,
        "Filesystem"
    );
    let status = plugin.get("pvc-other", "").await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");

    // Listed with a block device, in name order.
    let file = snap.file("blk.img");
    let block = plugin.create("pvc-blk", aio_context(&file)).await.unwrap();
    assert_eq!(
        plugin.list_all(1).await,
        [
            ("pvc-blk".to_string(), block.clone()),
            ("pvc-fs".to_string(), device.clone())
        ]
    );
    assert_eq!(
        plugin.get("pvc-blk", "").await.unwrap().volume_mode,
        "Block"
    );

    // Derived, not remembered: a restarted plugin finds it.
    plugin.stop().await;
    let plugin = Plugin::start_making(snap.socket(), devices).await;
    assert_eq!(
        plugin
            .create_as("pvc-fs", "Filesystem", fs_context(&dir))
            .await
            .unwrap(),
        device
    );

    plugin.delete("pvc-fs", &device).await.unwrap();
    assert!(snap.fsdevs().await.is_empty());
    plugin.delete("pvc-fs", &device).await.unwrap();
    plugin.delete("pvc-fs", "").await.unwrap();
    let status = plugin.get("pvc-fs", &device).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    // The device goes, the volume's data stays.
    assert_eq!(std::fs::read(dir.join("hello")).unwrap(), b"kept");

    // Without a device name, DeleteDevice finds either kind.
    plugin
        .create_as("pvc-fs", "Filesystem", fs_context(&dir))
        .await
        .unwrap();
    plugin.delete("pvc-fs", "").await.unwrap();
    plugin.delete("pvc-blk", "").await.unwrap();
    assert!(snap.fsdevs().await.is_empty());
    assert!(snap.bdevs().await.is_empty());
    assert!(plugin.list_all(0).await.is_empty());
}

/// Block only, filesystem only, or both: StoragePluginGetCapabilities and
/// the manifest name what the plugin makes, and CreateDevice makes only that.
pub async fn each_plugin_advertises_and_accepts_the_kinds_it_makes(source: &Source) {
    use api::storage_plugin_service_capability::rpc::Type;
    let snap = source.snap().await;
    let (share, fs_only) = share(&snap, false);
    let both = Devices {
        block: true,
        ..fs_only.clone()
    };
    let dir = volume_dir(&share, "pvc-k");
    let file = snap.file("k.img");
    let fs = Type::CreateDeleteFsDevice;
    let block = Type::CreateDeleteBlockDevice;
    let cases = [
        (Devices::default(), vec![block], "aio,nvmf"),
        (fs_only, vec![fs], "fs"),
        (both, vec![block, fs], "aio,nvmf,fs"),
    ];
    for (devices, makes, backends) in cases {
        let plugin = Plugin::start_making(snap.socket(), devices.clone()).await;
        let info = plugin
            .identity
            .clone()
            .get_plugin_info(timed(api::GetPluginInfoRequest {}, TIMEOUT))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.manifest["backends"], backends);
        let capabilities: Vec<i32> = plugin
            .storage
            .clone()
            .storage_plugin_get_capabilities(timed(
                api::StoragePluginGetCapabilitiesRequest {},
                TIMEOUT,
            ))
            .await
            .unwrap()
            .into_inner()
            .capabilities
            .into_iter()
            .map(|c| match c.r#type {
                Some(api::storage_plugin_service_capability::Type::Rpc(rpc)) => rpc.r#type,
                None => panic!("capability without a type"),
            })
            .collect();
        let mut expected: Vec<i32> = makes.iter().map(|t| *t as i32).collect();
        expected.extend([Type::GetDeviceStats as i32, Type::ListDevices as i32]);
        assert_eq!(capabilities, expected, "{devices:?}");

        let made_fs = plugin
            .create_as("pvc-k", "Filesystem", fs_context(&dir))
            .await;
        let made_block = plugin.create("pvc-b", aio_context(&file)).await;
        for (made, kind) in [(made_fs, fs), (made_block, block)] {
            if makes.contains(&kind) {
                made.unwrap();
            } else {
                let status = made.unwrap_err();
                assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
                assert!(status.message().contains("not configured"), "{status:?}");
            }
        }
        plugin.delete("pvc-k", "").await.unwrap();
        plugin.delete("pvc-b", "").await.unwrap();
        assert!(plugin.list_all(0).await.is_empty(), "{devices:?}");
    }
    assert!(snap.fsdevs().await.is_empty());
    assert!(snap.bdevs().await.is_empty());
}

/// The wrong volume_mode for the backend, a directory outside the share, a
/// file, a missing directory: refused with a code that says whose fault,
/// and nothing made.
pub async fn fs_requests_it_cannot_serve_are_refused_and_create_nothing(source: &Source) {
    let snap = source.snap().await;
    let (share, devices) = share(&snap, true);
    let plugin = Plugin::start_making(snap.socket(), devices).await;
    let dir = volume_dir(&share, "pvc-r");
    let file = snap.file("r.img");
    let outside = snap.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let not_a_dir = share.join("file");
    std::fs::write(&not_a_dir, b"x").unwrap();

    let invalid = [
        ("Filesystem", aio_context(&file), "makes Block devices only"),
        ("Block", fs_context(&dir), "makes Filesystem devices only"),
        ("Filesystem", fs_context(&outside), "not inside"),
        ("Filesystem", fs_context(&share), "not inside"),
        ("Filesystem", fs_context(&not_a_dir), "not a directory"),
    ];
    for (mode, context, says) in invalid {
        let status = plugin.create_as("pvc-r", mode, context).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{says}: {status:?}");
        assert!(status.message().contains(says), "{says}: {status:?}");
    }
    // SPDK's refusal: a directory that is gone (or a share not mounted).
    let status = plugin
        .create_as("pvc-r", "Filesystem", fs_context(&share.join("gone")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("directory"), "{status:?}");

    assert!(snap.fsdevs().await.is_empty());
    assert!(snap.bdevs().await.is_empty());
    assert!(plugin.list_all(0).await.is_empty());
}

/// plugin-check on the sample plugin making block devices only, filesystem
/// devices only, and both: every check that applies passes, `fs-device` runs
/// exactly where filesystem devices are advertised, `unoffered-kind-refused`
/// where one kind is, and nothing is left behind.
pub async fn plugin_check_judges_block_only_fs_only_and_both(source: &Source) {
    let snap = source.snap().await;
    let (share, fs_only) = share(&snap, false);
    let both = Devices {
        block: true,
        ..fs_only.clone()
    };
    let file = snap.file("check.img");
    let dir = volume_dir(&share, "check");
    let block_context = aio_context(&file);
    let cases = [
        (Devices::default(), block_context.clone(), HashMap::new()),
        // A plugin of one kind: --volume-context serves it.
        (fs_only, fs_context(&dir), HashMap::new()),
        (both, block_context, fs_context(&dir)),
    ];
    for (devices, volume_context, fs_volume_context) in cases {
        let plugin = Plugin::start_making(snap.socket(), devices.clone()).await;
        let config = plugin_check::Config {
            socket: plugin.socket.clone(),
            volume_context,
            fs_volume_context,
            timeout: Duration::from_secs(30),
        };
        let report = plugin_check::run(&config, &mut |result| println!("{result}"))
            .await
            .unwrap();
        assert_eq!(report.failed(), 0, "{devices:?}\n{report}");
        let passed = report.names(Verdict::Pass);
        let fs = devices.fs_share.is_some();
        assert_eq!(
            passed.contains(&plugin_check::checks::FS_DEVICE),
            fs,
            "{devices:?}\n{report}"
        );
        assert_eq!(
            passed.contains(&plugin_check::checks::CREATE_DEVICE),
            devices.block,
            "{devices:?}\n{report}"
        );
        assert_eq!(
            passed.contains(&plugin_check::checks::UNOFFERED_KIND_REFUSED),
            !(fs && devices.block),
            "{devices:?}\n{report}"
        );
        assert!(passed.contains(&plugin_check::checks::DELETE_DEVICE_ABSENT));
        assert!(snap.fsdevs().await.is_empty(), "{devices:?}");
        assert!(snap.bdevs().await.is_empty(), "{devices:?}");
    }
}
