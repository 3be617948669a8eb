//! The node's DPU attach layer with this plugin, end to end on the emulator
//! (as root): a volume's device is exposed by SNAP as an NVMe namespace or a
//! virtio-blk disk, the host finds it only through the emulator's sysfs
//! tree, and a detach leaves no bdev, controller or loop device.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use common::dpu::TestDpu;
use common::{
    Plugin, ROUND_TRIP_PERIOD, SIZE, Spdk, aio_context, discovered, equal, eventually, export,
    grow, loop_devices_of, nvmf_context, round_trips,
};
use snap_csi::dpu::plugin::AccessMode;
use snap_csi::dpu::{AttachRequest, Emulation, HostLocator, Placement, VolumeMode};
use snap_csi::host::{BlockDevice, Sysfs};
use tokio::time::Instant;

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

fn request(
    volume_id: &str,
    volume_context: HashMap<String, String>,
    emulation: Emulation,
) -> AttachRequest {
    AttachRequest {
        volume_id: volume_id.into(),
        access_modes: vec![AccessMode::Rwo],
        volume_mode: VolumeMode::Filesystem,
        publish_context: HashMap::new(),
        volume_context,
        storage_parameters: HashMap::new(),
        emulation,
        placement: Placement::Dedicated,
        attached_before: false,
        secrets: HashMap::new(),
    }
}

fn host_device(sysfs: &Sysfs, locator: &HostLocator) -> Option<BlockDevice> {
    locator.find(sysfs).unwrap()
}

async fn attach_and_detach(dpu: &TestDpu, snap: &Spdk, request: &AttachRequest, backing: &Path) {
    let sysfs = Sysfs::new(snap.emulator().sysfs_root());
    assert!(dpu.attach.probe(deadline()).await.unwrap());
    let attached = dpu.attach.attach(request, deadline()).await.unwrap();
    let device = discovered("the host sees the volume", || {
        host_device(&sysfs, &attached.locator)
    })
    .await;
    assert_eq!(device.size_bytes, common::SIZE);
    assert!(device.node.exists(), "{device:?}");
    assert_eq!(snap.host_disks(backing), 1);

    let again = dpu.attach.attach(request, deadline()).await.unwrap();
    assert_eq!(again, attached);
    assert_eq!(snap.host_disks(backing), 1);

    dpu.attach
        .detach(&request.volume_id, Some(&attached.device_name), deadline())
        .await
        .unwrap();
    assert_eq!(host_device(&sysfs, &attached.locator), None);
    assert_eq!(snap.host_disks(backing), 0);
    assert!(
        !snap.bdevs().await.contains(&attached.device_name),
        "bdev {} left",
        attached.device_name
    );
    // Detaching again, also without the device name, is done.
    dpu.attach
        .detach(&request.volume_id, None, deadline())
        .await
        .unwrap();
}

#[tokio::test]
async fn aio_volumes_through_nvme_and_virtio_blk() {
    let snap = Spdk::snap().await;
    let plugin = Plugin::start(snap.socket()).await;
    let dpu = plugin.attach_layer(&snap).await;

    let file = snap.file("pvc-nvme.img");
    let nvme = request("pvc-nvme", aio_context(&file), Emulation::Nvme);
    attach_and_detach(&dpu, &snap, &nvme, &file).await;

    let file = snap.file("pvc-packed.img");
    let packed = packed(request("pvc-packed", aio_context(&file), Emulation::Nvme));
    attach_and_detach(&dpu, &snap, &packed, &file).await;

    let file = snap.file("pvc-vblk.img");
    let vblk = request("pvc-vblk", aio_context(&file), Emulation::VirtioBlk);
    attach_and_detach(&dpu, &snap, &vblk, &file).await;
    assert!(snap.bdevs().await.is_empty());
}

/// The same volume as one namespace on a shared pool controller.
fn packed(request: AttachRequest) -> AttachRequest {
    AttachRequest {
        placement: Placement::Packed {
            namespaces_per_controller: 4,
        },
        ..request
    }
}

/// A detach that lost the device name finds it through ListDevices.
#[tokio::test]
async fn detach_without_the_device_name_uses_the_plugins_list() {
    let snap = Spdk::snap().await;
    let plugin = Plugin::start(snap.socket()).await;
    let dpu = plugin.attach_layer(&snap).await;
    let file = snap.file("pvc-lost.img");
    // The device exists but SNAP does not expose it (an attach that failed
    // after CreateDevice): only the plugin can say it is there.
    plugin.create("pvc-lost", aio_context(&file)).await.unwrap();
    dpu.attach
        .detach("pvc-lost", None, deadline())
        .await
        .unwrap();
    assert!(snap.bdevs().await.is_empty());
}

#[tokio::test]
async fn nvmf_volume_through_nvme() {
    let target = Spdk::target().await;
    let snap = Spdk::snap().await;
    let nqn = "nqn.2024-01.io.snap-csi:pvc-remote";
    let port = export(&target, "remote", nqn).await;
    let plugin = Plugin::start(snap.socket()).await;
    let dpu = plugin.attach_layer(&snap).await;

    let remote = request("pvc-remote", nvmf_context(port, nqn), Emulation::Nvme);
    // The host's loop device is over the target's file.
    let backing = target.dir.path().join("remote.img");
    attach_and_detach(&dpu, &snap, &remote, &backing).await;
    assert!(snap.nvme_controllers().await.is_empty());
    // Packed, the same remote volume is a namespace on a pool controller.
    attach_and_detach(&dpu, &snap, &packed(remote), &backing).await;
    assert!(snap.nvme_controllers().await.is_empty());
}

/// CreateDevice and DeleteDevice cost one SNAP round trip each, also when
/// repeated, so the node's budgets hold with this plugin.
#[tokio::test]
async fn the_plugin_fits_the_nodes_round_trip_budget() {
    let snap = Spdk::start(|c| c.counting_round_trips(ROUND_TRIP_PERIOD)).await;
    let rounds = || snap.emulator().rounds();
    let plugin = Plugin::start(snap.socket()).await;
    let dpu = plugin.attach_layer(&snap).await;
    assert!(dpu.attach.probe(deadline()).await.unwrap());

    let file = snap.file("pvc-rt.img");
    let request = request("pvc-rt", aio_context(&file), Emulation::Nvme);
    let (first, trips) = round_trips(rounds, dpu.attach.attach(&request, deadline())).await;
    let first = first.unwrap();
    assert_eq!(trips, 5, "new NVMe attach");
    // A retry of a volume the node has a record of (NodeStage again).
    let retry = AttachRequest {
        attached_before: true,
        ..request.clone()
    };
    let (again, trips) = round_trips(rounds, dpu.attach.attach(&retry, deadline())).await;
    assert_eq!(again.unwrap(), first);
    assert_eq!(trips, 1, "repeated NVMe attach");
    let (detached, trips) = round_trips(
        rounds,
        dpu.attach
            .detach("pvc-rt", Some(&first.device_name), deadline()),
    )
    .await;
    detached.unwrap();
    assert_eq!(trips, 4, "NVMe detach");
    assert!(snap.bdevs().await.is_empty());
}

/// Online expansion of an attached AIO volume keeps the node's budgets: the
/// plugin's follower calls SNAP only when the volume's file has grown (one
/// round trip, `bdev_aio_rescan`), never in a period without a change, and
/// the host's disk takes the new size with no restage.
#[tokio::test]
async fn following_calls_snap_only_when_a_file_grew() {
    let snap = Spdk::start(|c| c.counting_round_trips(ROUND_TRIP_PERIOD)).await;
    let rounds = || snap.emulator().rounds();
    let period = Duration::from_millis(50);
    let plugin = Plugin::start_following(snap.socket(), period).await;
    let dpu = plugin.attach_layer(&snap).await;
    let file = snap.file("pvc-grow.img");
    let request = request("pvc-grow", aio_context(&file), Emulation::Nvme);
    let attached = dpu.attach.attach(&request, deadline()).await.unwrap();
    let sysfs = &Sysfs::new(snap.emulator().sysfs_root());
    let locator = &attached.locator;
    let host_size_becomes = |size: u64| {
        discovered("the host's disk takes the volume's size", move || {
            host_device(sysfs, locator).filter(|d| d.size_bytes == size)
        })
    };
    host_size_becomes(SIZE).await;
    // A growth seen shows the follower at work (its listing after the start
    // done); then periods without a change, which must cost SNAP nothing.
    grow(&file, 2 * SIZE);
    host_size_becomes(2 * SIZE).await;
    // Our own call settles the count: every request SNAP read before it is
    // counted once its reply is here.
    assert_eq!(snap.num_blocks(&attached.device_name).await, 2 * SIZE / 512);
    let quiet = rounds();
    let unchanged_for_periods = |rounds_then: u64| async move {
        tokio::time::sleep(20 * period).await;
        assert_eq!(
            rounds(),
            rounds_then,
            "SNAP called in periods without a change"
        );
    };
    unchanged_for_periods(quiet).await;
    grow(&file, 3 * SIZE);
    host_size_becomes(3 * SIZE).await;
    assert_eq!(loop_devices_of(&file).len(), 1, "the same disk, grown");
    // The emulator counts a round as it answers: the count may follow the
    // host's disk by a moment.
    eventually(
        "round trips for one growth (one bdev_aio_rescan)",
        || async { equal(rounds() - quiet, 1) },
    )
    .await;
    unchanged_for_periods(quiet + 1).await;

    dpu.attach
        .detach("pvc-grow", Some(&attached.device_name), deadline())
        .await
        .unwrap();
    assert!(snap.bdevs().await.is_empty());
}

/// CreateDevice of an AIO volume with QoS limits costs one more round trip
/// (its limits, once the bdev exists), also when repeated; a volume without
/// limits keeps the budget of one. Needs `bdev_set_qos_limit` in the emulator.
#[tokio::test]
async fn only_aio_volumes_with_limits_pay_a_second_round_trip() {
    use snap_csi_spdk_plugin::qos::RW_IOPS_KEY;

    let snap = Spdk::start(|c| c.counting_round_trips(ROUND_TRIP_PERIOD)).await;
    let rounds = || snap.emulator().rounds();
    let plugin = Plugin::start(snap.socket()).await;
    let plain = aio_context(&snap.file("pvc-plain.img"));
    let mut limited = aio_context(&snap.file("pvc-limited.img"));
    limited.insert(RW_IOPS_KEY.into(), "5000".into());
    for _ in 0..2 {
        let (device, trips) = round_trips(rounds, plugin.create("pvc-plain", plain.clone())).await;
        device.unwrap();
        assert_eq!(trips, 1, "an AIO volume without limits");
        let (device, trips) =
            round_trips(rounds, plugin.create("pvc-limited", limited.clone())).await;
        assert_eq!(snap.rate_limits(&device.unwrap()).await, [5000, 0, 0, 0]);
        assert_eq!(trips, 2, "an AIO volume with limits");
    }
    for volume in ["pvc-plain", "pvc-limited"] {
        plugin.delete(volume, "").await.unwrap();
    }
    assert!(snap.bdevs().await.is_empty());
}

/// 2 x 256 bits, the data key then the tweak key.
const KEY: &str = "3b9e1c7f5a2d8e4b6c0f1a9d7e3b5c2a8f6d4e0b1c9a7f5e3d2b8c6a4f0e1d9b\
                   b9d1e0f4a6c8b2d3e5f7a9c1b0e4d6f8a2c5b3e7d9a1f0c6b4e8d2a5f7c1e9b3";

fn encrypted(mut request: AttachRequest) -> AttachRequest {
    use snap_csi::dpu::crypto::{AES_XTS_VALUE, ENCRYPTION, KEY_SECRET};
    request
        .volume_context
        .insert(ENCRYPTION.into(), AES_XTS_VALUE.into());
    request.secrets.insert(KEY_SECRET.into(), KEY.into());
    request
}

/// An encrypted volume's host device takes plaintext while `backing` (the
/// AIO file, or the NVMe-oF target's) gets ciphertext only, and the same key
/// reads it back after a detach and a new attach; a detach leaves neither
/// the crypto vbdev nor the key in SPDK.
async fn ciphertext_only(dpu: &TestDpu, snap: &Spdk, request: &AttachRequest, backing: &Path) {
    use std::os::unix::fs::FileExt;
    let sysfs = Sysfs::new(snap.emulator().sysfs_root());
    let plaintext: Vec<u8> = (0..256u32 << 10)
        .map(|i| b"plaintext the storage must never hold. "[(i % 39) as usize])
        .collect();
    let mut read_back = vec![0u8; plaintext.len()];
    for write in [true, false] {
        let attached = dpu.attach.attach(request, deadline()).await.unwrap();
        let device = discovered("the host sees the volume", || {
            host_device(&sysfs, &attached.locator)
        })
        .await;
        let disk = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&device.node)
            .unwrap();
        if write {
            disk.write_all_at(&plaintext, 1 << 20).unwrap();
            disk.sync_all().unwrap();
        }
        disk.read_exact_at(&mut read_back, 1 << 20).unwrap();
        assert_eq!(read_back, plaintext, "read back through the host device");
        drop(disk);
        dpu.attach
            .detach(&request.volume_id, Some(&attached.device_name), deadline())
            .await
            .unwrap();
        assert!(snap.bdevs().await.is_empty(), "a bdev is left");
        let stored = std::fs::read(backing).unwrap();
        assert!(
            stored[1 << 20..(1 << 20) + plaintext.len()]
                .iter()
                .any(|b| *b != 0)
        );
        assert!(
            !stored.windows(40).any(|w| w == &plaintext[..40]),
            "plaintext on the storage"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_aio_volumes_hold_ciphertext_only_through_nvme_and_virtio_blk() {
    let snap = Spdk::snap().await;
    let plugin = Plugin::start(snap.socket()).await;
    let dpu = plugin.attach_layer(&snap).await;
    for (id, emulation, pack) in [
        ("pvc-enc-nvme", Emulation::Nvme, false),
        ("pvc-enc-packed", Emulation::Nvme, true),
        ("pvc-enc-vblk", Emulation::VirtioBlk, false),
    ] {
        let file = snap.file(&format!("{id}.img"));
        let mut request = encrypted(request(id, aio_context(&file), emulation));
        if pack {
            request = packed(request);
        }
        ciphertext_only(&dpu, &snap, &request, &file).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_nvmf_volumes_hold_ciphertext_only_through_nvme_and_virtio_blk() {
    let target = Spdk::target().await;
    let snap = Spdk::snap().await;
    let plugin = Plugin::start(snap.socket()).await;
    let dpu = plugin.attach_layer(&snap).await;
    for (name, emulation) in [
        ("enc-nvme", Emulation::Nvme),
        ("enc-vblk", Emulation::VirtioBlk),
    ] {
        let nqn = format!("nqn.2024-01.io.snap-csi:{name}");
        let port = export(&target, name, &nqn).await;
        let request = encrypted(request(
            &format!("pvc-{name}"),
            nvmf_context(port, &nqn),
            emulation,
        ));
        let backing = target.dir.path().join(format!("{name}.img"));
        ciphertext_only(&dpu, &snap, &request, &backing).await;
    }
}

/// Encryption costs one dependent round trip more each way: the crypto
/// vbdev after CreateDevice (the key goes beside it), and before DeleteDevice.
#[tokio::test]
async fn an_encrypted_volume_pays_one_round_trip_more_each_way() {
    let snap = Spdk::start(|c| c.counting_round_trips(ROUND_TRIP_PERIOD)).await;
    let rounds = || snap.emulator().rounds();
    let plugin = Plugin::start(snap.socket()).await;
    let dpu = plugin.attach_layer(&snap).await;
    assert!(dpu.attach.probe(deadline()).await.unwrap());
    let file = snap.file("pvc-enc-rt.img");
    let request = encrypted(request("pvc-enc-rt", aio_context(&file), Emulation::Nvme));
    let (attached, trips) = round_trips(rounds, dpu.attach.attach(&request, deadline())).await;
    let attached = attached.unwrap();
    assert_eq!(trips, 6, "new encrypted NVMe attach");
    let (detached, trips) = round_trips(
        rounds,
        dpu.attach
            .detach("pvc-enc-rt", Some(&attached.device_name), deadline()),
    )
    .await;
    detached.unwrap();
    assert_eq!(trips, 5, "encrypted NVMe detach");
    assert!(snap.bdevs().await.is_empty());
}
