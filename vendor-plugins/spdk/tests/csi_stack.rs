//! The CSI controller with both backends: its identity, names shared across
//! backends, a restart, the whole surface through `snap-csi controller` (the
//! proxy Kubernetes talks to), and the volumes it makes attached on a node
//! by the plugin service and the node's DPU layer (as root: SNAP's host side
//! makes real loop devices).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::csi::{
    Backends, Csi, GIB, MIB, assert_code, block, expand_through, from_snapshot, read_at, volume,
    write_at,
};
use common::dpu::TestDpu;
use common::proxy::Proxy;
use common::{Plugin, Spdk, TIMEOUT, eventually, every_page, timed};
use snap_csi::dpu::plugin::AccessMode;
use snap_csi::dpu::{AttachRequest, Emulation, HostLocator, Placement, VolumeMode};
use snap_csi::host::Sysfs;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::volumegroup as vg;
use tokio::time::Instant;
use tonic::Code;

use csi::controller_service_capability::rpc::Type as Capability;

#[tokio::test]
async fn identity_says_what_it_serves_and_probe_follows_the_backends() {
    let mut csi = Csi::start(Backends::BOTH).await;
    let info = csi
        .identity
        .clone()
        .get_plugin_info(timed(csi::GetPluginInfoRequest {}, TIMEOUT))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "spdk.snap-csi.io");
    assert_eq!(info.manifest["backends"], "aio,nvmf");
    assert_eq!(info.manifest["default-backend"], "aio");
    let plugin = csi
        .identity
        .clone()
        .get_plugin_capabilities(timed(csi::GetPluginCapabilitiesRequest {}, TIMEOUT))
        .await
        .unwrap()
        .into_inner();
    use csi::plugin_capability::{Service, Type, VolumeExpansion, service, volume_expansion};
    let service = |t: service::Type| csi::PluginCapability {
        r#type: Some(Type::Service(Service { r#type: t as i32 })),
    };
    assert_eq!(
        plugin.capabilities,
        [
            service(service::Type::ControllerService),
            service(service::Type::GroupControllerService),
            csi::PluginCapability {
                r#type: Some(Type::VolumeExpansion(VolumeExpansion {
                    r#type: volume_expansion::Type::Online as i32
                })),
            },
        ]
    );
    let controller = csi
        .controller
        .clone()
        .controller_get_capabilities(timed(csi::ControllerGetCapabilitiesRequest {}, TIMEOUT))
        .await
        .unwrap()
        .into_inner();
    let rpcs: Vec<Capability> = controller
        .capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(csi::controller_service_capability::Type::Rpc(r)) => r.r#type.try_into().ok(),
            None => None,
        })
        .collect();
    for wanted in [
        Capability::CreateDeleteVolume,
        Capability::ListVolumes,
        Capability::GetCapacity,
        Capability::CreateDeleteSnapshot,
        Capability::ListSnapshots,
        Capability::CloneVolume,
        Capability::ExpandVolume,
        Capability::ModifyVolume,
    ] {
        assert!(rpcs.contains(&wanted), "{wanted:?} in {rpcs:?}");
    }
    let publish = csi
        .controller
        .clone()
        .controller_publish_volume(timed(Default::default(), TIMEOUT))
        .await;
    assert_code(publish, Code::Unimplemented, "not advertised");

    let probe = |csi: &Csi| {
        let mut identity = csi.identity.clone();
        async move {
            identity
                .probe(timed(csi::ProbeRequest {}, TIMEOUT))
                .await
                .unwrap()
                .into_inner()
                .ready
        }
    };
    assert_eq!(probe(&csi).await, Some(true));
    // The target gone, the controller is up but not ready.
    drop(csi.target.take());
    assert_eq!(probe(&csi).await, Some(false));
}

#[tokio::test]
async fn names_are_one_volume_across_backends_and_survive_a_restart() {
    let mut csi = Csi::start(Backends::BOTH).await;
    // Without a backend parameter, the default (aio) is used.
    let aio = csi
        .create(volume("pvc-shared", "", 8 * MIB, 0))
        .await
        .unwrap();
    assert_eq!(aio.volume_id, "aio-pvc-shared");
    assert_code(
        csi.create(volume("pvc-shared", "nvmf", 8 * MIB, 0)).await,
        Code::AlreadyExists,
        "the name on the other backend",
    );
    let nvmf = csi
        .create(volume("pvc-remote", "nvmf", 8 * MIB, 0))
        .await
        .unwrap();
    let snap = csi.snapshot("snap-shared", &aio.volume_id).await.unwrap();
    assert_code(
        csi.snapshot("snap-shared", &nvmf.volume_id).await,
        Code::AlreadyExists,
        "the snapshot name on the other backend",
    );
    let mut listed = csi.list_all(1).await;
    listed.sort();
    assert_eq!(listed, ["aio-pvc-shared", "nvmf-pvc-remote"]);

    // A new controller finds everything by name alone.
    csi.restart().await;
    assert_eq!(
        csi.create(volume("pvc-shared", "", 8 * MIB, 0))
            .await
            .unwrap(),
        aio
    );
    assert_eq!(
        csi.create(volume("pvc-remote", "nvmf", 8 * MIB, 0))
            .await
            .unwrap(),
        nvmf
    );
    assert_eq!(
        csi.snapshot("snap-shared", &aio.volume_id).await.unwrap(),
        snap
    );
    assert_eq!(csi.list_all(0).await.len(), 2);

    csi.delete_snapshot(&snap.snapshot_id).await.unwrap();
    for v in [&aio, &nvmf] {
        csi.delete(&v.volume_id).await.unwrap();
    }
    assert!(
        csi.leftovers().await.is_empty(),
        "{:?}",
        csi.leftovers().await
    );
}

#[tokio::test]
async fn the_whole_surface_works_through_the_proxy() {
    let csi = Csi::start(Backends::BOTH).await;
    let proxy = Proxy::start(&csi).await;
    let info = proxy
        .identity
        .clone()
        .get_plugin_info(timed(csi::GetPluginInfoRequest {}, TIMEOUT))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "csi.snap-csi.io");

    for backend in ["aio", "nvmf"] {
        let name = format!("pvc-proxy-{backend}");
        let created = proxy
            .create(volume(&name, backend, 16 * MIB, 0))
            .await
            .unwrap();
        assert_eq!(created.volume_id, format!("{backend}-{name}"));
        assert_eq!(
            proxy
                .create(volume(&name, backend, 16 * MIB, 0))
                .await
                .unwrap(),
            created
        );
        // The vendor's code and message come through untouched.
        let status = assert_code(
            proxy.create(volume(&name, backend, 64 * MIB, 0)).await,
            Code::AlreadyExists,
            "incompatible through the proxy",
        );
        assert!(status.message().contains(&created.volume_id), "{status:?}");
        assert_code(
            proxy.create(volume("pvc-huge", backend, 8 * GIB, 0)).await,
            Code::OutOfRange,
            "over the pool through the proxy",
        );
        write_at(&csi.backing(&created).await, MIB, b"through the proxy");
        let snapshot = proxy
            .controller
            .clone()
            .create_snapshot(timed(
                csi::CreateSnapshotRequest {
                    source_volume_id: created.volume_id.clone(),
                    name: format!("snap-{backend}"),
                    ..Default::default()
                },
                TIMEOUT,
            ))
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap();
        let restored = proxy
            .create(from_snapshot(
                volume(&format!("{name}-restored"), backend, 16 * MIB, 0),
                &snapshot.snapshot_id,
            ))
            .await
            .unwrap();
        assert_eq!(
            read_at(&csi.backing(&restored).await, MIB, 17),
            b"through the proxy"
        );
        let listed = proxy
            .controller
            .clone()
            .list_snapshots(timed(
                csi::ListSnapshotsRequest {
                    source_volume_id: created.volume_id.clone(),
                    ..Default::default()
                },
                TIMEOUT,
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(listed.entries.len(), 1);
        let expanded = expand_through(
            &proxy.controller,
            &restored.volume_id,
            32 * MIB,
            Some(block()),
        )
        .await
        .unwrap();
        assert_eq!(expanded.capacity_bytes, (32 * MIB) as i64);
        proxy
            .controller
            .clone()
            .delete_snapshot(timed(
                csi::DeleteSnapshotRequest {
                    snapshot_id: snapshot.snapshot_id,
                    secrets: HashMap::from([("token".to_string(), "s3cr3t".to_string())]),
                },
                TIMEOUT,
            ))
            .await
            .unwrap();
    }

    // Paging through the proxy, and its refusal of a token we never issued.
    let ids: Vec<String> = every_page(String::new(), |token| {
        let mut controller = proxy.controller.clone();
        async move {
            let page = controller
                .list_volumes(timed(
                    csi::ListVolumesRequest {
                        max_entries: 3,
                        starting_token: token,
                    },
                    TIMEOUT,
                ))
                .await
                .unwrap()
                .into_inner();
            assert!(page.entries.len() <= 3);
            let ids = page
                .entries
                .into_iter()
                .map(|e| e.volume.unwrap().volume_id)
                .collect();
            (ids, page.next_token)
        }
    })
    .await;
    assert_eq!(ids.len(), 4, "{ids:?}");
    let bad = proxy
        .controller
        .clone()
        .list_volumes(timed(
            csi::ListVolumesRequest {
                max_entries: 1,
                starting_token: "forged".into(),
            },
            TIMEOUT,
        ))
        .await;
    assert_code(bad, Code::Aborted, "a forged token through the proxy");

    // A volume group through the proxy takes its volumes with it.
    let group = proxy
        .groups
        .clone()
        .create_volume_group(timed(
            vg::CreateVolumeGroupRequest {
                name: "proxied".into(),
                ..Default::default()
            },
            TIMEOUT,
        ))
        .await
        .unwrap()
        .into_inner()
        .volume_group
        .unwrap();
    proxy
        .groups
        .clone()
        .modify_volume_group_membership(timed(
            vg::ModifyVolumeGroupMembershipRequest {
                volume_group_id: group.volume_group_id.clone(),
                volume_ids: ids.clone(),
                ..Default::default()
            },
            TIMEOUT,
        ))
        .await
        .unwrap();
    let delete = proxy
        .controller
        .clone()
        .delete_volume(timed(
            csi::DeleteVolumeRequest {
                volume_id: ids[0].clone(),
                ..Default::default()
            },
            TIMEOUT,
        ))
        .await;
    assert_code(delete, Code::FailedPrecondition, "a group member");
    proxy
        .groups
        .clone()
        .delete_volume_group(timed(
            vg::DeleteVolumeGroupRequest {
                volume_group_id: group.volume_group_id,
                ..Default::default()
            },
            TIMEOUT,
        ))
        .await
        .unwrap();
    assert!(csi.list_all(0).await.is_empty());
    assert!(
        csi.leftovers().await.is_empty(),
        "{:?}",
        csi.leftovers().await
    );
    proxy.stop().await;
    csi.stop().await;
}

/// CreateVolume's context attaches through the plugin service and SNAP: the
/// host sees a disk of the volume's size holding the volume's bytes.
async fn attach_created_volume(backend: &str, emulation: Emulation) {
    let csi = Csi::start(Backends::BOTH).await;
    let snap = Spdk::snap().await;
    let plugin = Plugin::start(snap.socket()).await;
    let TestDpu { attach: dpu, .. } = &plugin.attach_layer(&snap).await;
    let deadline = || Instant::now() + Duration::from_secs(30);

    let created = csi
        .create(volume(&format!("pvc-node-{backend}"), backend, 24 * MIB, 0))
        .await
        .unwrap();
    let backing = csi.backing(&created).await;
    write_at(&backing, 2 * MIB, b"made by the controller");
    let request = AttachRequest {
        volume_id: created.volume_id.clone(),
        access_modes: vec![AccessMode::Rwo],
        volume_mode: VolumeMode::Filesystem,
        publish_context: HashMap::new(),
        volume_context: created.volume_context.clone(),
        storage_parameters: HashMap::new(),
        emulation,
        placement: Placement::Dedicated,
        attached_before: false,
        secrets: HashMap::new(),
    };
    assert!(dpu.probe(deadline()).await.unwrap());
    let attached = dpu.attach(&request, deadline()).await.unwrap();
    let sysfs = Sysfs::new(snap.emulator().sysfs_root());
    let device = common::discovered("the host sees the volume", || {
        attached.locator.find(&sysfs).unwrap()
    })
    .await;
    assert_eq!(device.size_bytes, 24 * MIB);
    assert_eq!(
        read_at(&device.node, 2 * MIB, 22),
        b"made by the controller"
    );
    assert_eq!(snap.host_disks(&backing), 1);

    dpu.detach(&created.volume_id, Some(&attached.device_name), deadline())
        .await
        .unwrap();
    assert_eq!(snap.host_disks(&backing), 0);
    assert!(snap.bdevs().await.is_empty());
    csi.delete(&created.volume_id).await.unwrap();
    assert!(csi.leftovers().await.is_empty());
}

#[tokio::test]
async fn an_aio_volume_attaches_on_the_node() {
    attach_created_volume("aio", Emulation::VirtioBlk).await;
}

#[tokio::test]
async fn an_nvmf_volume_attaches_on_the_node() {
    attach_created_volume("nvmf", Emulation::Nvme).await;
}

/// An AIO volume's QoS limits go from its StorageClass parameters and a
/// ModifyVolume through the proxy to SNAP's bdev: the controller cannot
/// reach SNAP, so the plugin applies the pool's record when it makes the
/// bdev, and follows it while the volume is attached (live), or, told not
/// to follow, at the next attach. Needs `bdev_set_qos_limit` in the emulator.
#[tokio::test]
async fn aio_qos_limits_reach_snap_live_or_at_the_next_attach() {
    use snap_csi_spdk_plugin::qos::{RW_IOPS_KEY, W_MBYTES_KEY};

    let csi = Csi::start(Backends::BOTH).await;
    let proxy = Proxy::start(&csi).await;
    let snap = Spdk::snap().await;
    let plugin = Plugin::start(snap.socket()).await;
    let TestDpu { attach: dpu, .. } = &plugin.attach_layer(&snap).await;
    let deadline = || Instant::now() + Duration::from_secs(30);

    let mut request = volume("pvc-qos-node", "aio", 24 * MIB, 0);
    request.parameters.insert(RW_IOPS_KEY.into(), "3000".into());
    let created = proxy.create(request).await.unwrap();
    let attach = block_attach(&created, Emulation::Nvme);
    let attached = dpu.attach(&attach, deadline()).await.unwrap();
    assert_eq!(
        snap.rate_limits(&attached.device_name).await,
        [3000, 0, 0, 0]
    );

    modify(&proxy, &created.volume_id, &[(W_MBYTES_KEY, "40")]).await;
    // Not following: the bdev attached keeps its limits until the next attach.
    assert_eq!(
        snap.rate_limits(&attached.device_name).await,
        [3000, 0, 0, 0]
    );
    dpu.detach(&created.volume_id, Some(&attached.device_name), deadline())
        .await
        .unwrap();
    let attached = dpu.attach(&attach, deadline()).await.unwrap();
    assert_eq!(
        snap.rate_limits(&attached.device_name).await,
        [3000, 0, 0, 40]
    );
    // Following (the binary's default): live.
    let follower = Plugin::start_following(snap.socket(), Duration::from_millis(50)).await;
    modify(
        &proxy,
        &created.volume_id,
        &[(RW_IOPS_KEY, "0"), (W_MBYTES_KEY, "15")],
    )
    .await;
    snap.rate_limits_become(&attached.device_name, [0, 0, 0, 15])
        .await;
    follower.stop().await;

    dpu.detach(&created.volume_id, Some(&attached.device_name), deadline())
        .await
        .unwrap();
    assert!(snap.bdevs().await.is_empty());
    proxy.stop().await;
    csi.delete(&created.volume_id).await.unwrap();
    assert!(csi.leftovers().await.is_empty());
}

/// The node's attach of a block volume the controller made.
/// A ControllerModifyVolume of `volume_id` through the proxy, setting
/// `limits` (QoS keys and values).
async fn modify(proxy: &Proxy, volume_id: &str, limits: &[(&str, &str)]) {
    let request = csi::ControllerModifyVolumeRequest {
        volume_id: volume_id.to_string(),
        secrets: HashMap::new(),
        mutable_parameters: limits
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    proxy
        .controller
        .clone()
        .controller_modify_volume(timed(request, TIMEOUT))
        .await
        .unwrap();
}

fn block_attach(created: &csi::Volume, emulation: Emulation) -> AttachRequest {
    AttachRequest {
        volume_id: created.volume_id.clone(),
        access_modes: vec![AccessMode::Rwo],
        volume_mode: VolumeMode::Block,
        publish_context: HashMap::new(),
        volume_context: created.volume_context.clone(),
        storage_parameters: HashMap::new(),
        emulation,
        placement: Placement::Dedicated,
        attached_before: false,
        secrets: HashMap::new(),
    }
}

/// What a user sees of QoS: writes through the host device are held to the
/// StorageClass's limit, then to the one a ControllerModifyVolume sets (the
/// plugin following the controller's records, live), and run free once the
/// limits are lifted: the emulator enforces them in its data path, as SPDK
/// does in SNAP.
///
/// Each rate is a steady one: 32 writers in flight, as a host keeps a queue,
/// counted over 3 s after a warm-up, so that neither the start, the end nor a
/// stall of one writer moves it. QoS guarantees a ceiling, the limit, which
/// is held (`assert_limit_held`); it guarantees no floor, as a host that
/// cannot offer the limit gets less (1000 IOPS, SPDK's smallest IOPS limit, is
/// 1000 round trips a second through the loop device, FUSE and the one thread
/// the emulator serves a throttled volume's queue on: with two CPU hogs and
/// builds beside, 760 to 1000), so the rate reached is printed, and only one
/// under a quarter of the limit fails. Lifting the limits shows the writes
/// go past the IOPS ceiling, measured the same way on the same machine
/// moments later, so that it held something back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_writes_run_at_the_limit_and_at_the_new_one_after_a_modify() {
    use common::direct_io::{assert_limit_held, steady_write_rate};
    use snap_csi_spdk_plugin::qos::{RW_IOPS_KEY, W_MBYTES_KEY};

    let csi = Csi::start(Backends::BOTH).await;
    let proxy = Proxy::start(&csi).await;
    let snap = Spdk::snap().await;
    let plugin = Plugin::start_following(snap.socket(), Duration::from_millis(50)).await;
    let TestDpu { attach: dpu, .. } = &plugin.attach_layer(&snap).await;
    let deadline = || Instant::now() + Duration::from_secs(30);

    // Room for each writer's MiB.
    let mut request = volume("pvc-qos-rate", "aio", 64 * MIB, 0);
    request.parameters.insert(RW_IOPS_KEY.into(), "1000".into());
    let created = proxy.create(request).await.unwrap();
    let attach = block_attach(&created, Emulation::VirtioBlk);
    let attached = dpu.attach(&attach, deadline()).await.unwrap();
    let sysfs = Sysfs::new(snap.emulator().sysfs_root());
    assert!(matches!(attached.locator, HostLocator::VirtioBlk { .. }));
    let device = common::discovered("the host sees the volume", || {
        attached.locator.find(&sysfs).unwrap()
    })
    .await;
    // Writes of `size` a second.
    let rate = |size: usize| {
        let node = device.node.clone();
        let (warmup, window) = (Duration::from_millis(500), Duration::from_secs(3));
        async move {
            tokio::task::spawn_blocking(move || steady_write_rate(&node, size, 32, warmup, window))
                .await
                .unwrap()
        }
    };

    let iops = rate(4096).await;
    assert_limit_held("4 KiB writes a second", iops, 1000.0);

    modify(
        &proxy,
        &created.volume_id,
        &[(RW_IOPS_KEY, "0"), (W_MBYTES_KEY, "4")],
    )
    .await;
    snap.rate_limits_become(&attached.device_name, [0, 0, 0, 4])
        .await;
    let mib_per_sec = rate(128 << 10).await * (128 << 10) as f64 / MIB as f64;
    assert_limit_held("MiB/s", mib_per_sec, 4.0);

    modify(
        &proxy,
        &created.volume_id,
        &[(RW_IOPS_KEY, "0"), (W_MBYTES_KEY, "0")],
    )
    .await;
    snap.rate_limits_become(&attached.device_name, [0, 0, 0, 0])
        .await;
    let free = rate(4096).await;
    println!("4 KiB writes without limits: {free:.1} a second");
    assert!(
        free >= iops * 1.25,
        "without limits the writes ran at {free:.1} a second, under the limit {iops:.1}: \
         the IOPS ceiling held nothing back"
    );

    dpu.detach(&created.volume_id, Some(&attached.device_name), deadline())
        .await
        .unwrap();
    plugin.stop().await;
    proxy.stop().await;
    csi.delete(&created.volume_id).await.unwrap();
}

/// Online expansion end to end: an AIO volume attached through the node's
/// DPU layer, written by the host without pause, grows under a
/// ControllerExpandVolume through the proxy. The host's disk takes the new
/// size without a restage (the plugin beside SNAP rescans the bdev), no
/// write fails, and the host's writes reach the new end of the volume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_aio_volume_grows_online_while_written() {
    use std::os::unix::fs::FileExt;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use common::direct_io::{Aligned, open_direct};

    const CHUNK: usize = 64 << 10;
    let csi = Csi::start(Backends::BOTH).await;
    let proxy = Proxy::start(&csi).await;
    let snap = Spdk::snap().await;
    let plugin = Plugin::start_following(snap.socket(), Duration::from_millis(50)).await;
    let TestDpu { attach: dpu, .. } = &plugin.attach_layer(&snap).await;
    let deadline = || Instant::now() + Duration::from_secs(30);

    let created = proxy
        .create(volume("pvc-online", "aio", 24 * MIB, 0))
        .await
        .unwrap();
    let attached = dpu
        .attach(&block_attach(&created, Emulation::Nvme), deadline())
        .await
        .unwrap();
    let sysfs = Sysfs::new(snap.emulator().sysfs_root());
    assert!(matches!(attached.locator, HostLocator::Nvme { .. }));
    let find = || attached.locator.find(&sysfs).unwrap();
    let device = common::discovered("the host sees the volume", find).await;
    assert_eq!(device.size_bytes, 24 * MIB);

    // The host writes its first 16 MiB over and over until told to stop, a
    // write a millisecond (not flat out: other tests here measure rates).
    let (stop, written) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let writer = {
        let (node, stop, written) = (device.node.clone(), stop.clone(), written.clone());
        tokio::task::spawn_blocking(move || {
            let disk = open_direct(&node);
            let data = Aligned::new(CHUNK, 0x3c);
            let slots = 16 * MIB / CHUNK as u64;
            while !stop.load(Ordering::Relaxed) {
                let at = written.load(Ordering::Relaxed) % slots * CHUNK as u64;
                disk.write_all_at(data.get(), at).unwrap();
                written.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let writes_go_on = |since: u64| {
        let written = written.clone();
        eventually("the host's writes go on", move || {
            let now = written.load(Ordering::Relaxed);
            async move {
                (now > since)
                    .then_some(())
                    .ok_or(format!("{now} writes, none since {since}"))
            }
        })
    };
    writes_go_on(0).await;

    let expanded = expand_through(
        &proxy.controller,
        &created.volume_id,
        40 * MIB,
        Some(block()),
    )
    .await
    .unwrap();
    assert_eq!(expanded.capacity_bytes, (40 * MIB) as i64);
    assert!(!expanded.node_expansion_required, "a block volume");
    let grown = common::discovered("the host's disk grows", || {
        find().filter(|d| d.size_bytes == 40 * MIB)
    })
    .await;
    assert_eq!(grown.node, device.node, "the same disk, not a new one");
    writes_go_on(written.load(Ordering::Relaxed)).await;
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();

    // The grown end is the volume's: what the host writes there is in the file.
    let end = 40 * MIB - CHUNK as u64;
    let node = grown.node.clone();
    tokio::task::spawn_blocking(move || {
        open_direct(&node)
            .write_all_at(Aligned::new(CHUNK, 0xe5).get(), end)
            .unwrap();
    })
    .await
    .unwrap();
    assert_eq!(
        read_at(&csi.backing(&created).await, end, CHUNK),
        vec![0xe5; CHUNK]
    );

    dpu.detach(&created.volume_id, Some(&attached.device_name), deadline())
        .await
        .unwrap();
    assert!(snap.bdevs().await.is_empty());
    plugin.stop().await;
    proxy.stop().await;
    csi.delete(&created.volume_id).await.unwrap();
    assert!(csi.leftovers().await.is_empty());
}
