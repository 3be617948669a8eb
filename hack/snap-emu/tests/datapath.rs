//! The FUSE data path end to end: a disk on it reaches the bdev's bytes
//! through the emulator, `bdev_get_iostat` counts exactly what the host did,
//! `bdev_set_qos_limit` holds the host to its limits, changed live, a
//! crypto bdev's backing holds only ciphertext, and an NVMe-oF namespace's
//! I/O goes through its target, which holds it while paused.
//! Needs root, loop devices and /dev/fuse.

mod common;
#[path = "../../../tests/common/direct_io.rs"]
mod direct_io;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Client, Emu, dev_node, expose_virtio_blk, wait_for_nvme_disk};
use direct_io::{Aligned, assert_limit_held, open_direct, steady_write_rate};
use serde_json::{Value, json};
use snap_emu::{Config, DataPathMode};

const KIB: usize = 1024;

/// Exposes `bdev` as namespace 1 of a subsystem of its own on an NVMe
/// controller (NVIDIA's order: a suspended controller, the namespace, a
/// resume) and returns its device node.
async fn expose_nvme(emu: &Emu, c: &mut Client, bdev: &str) -> PathBuf {
    let nqn = "nqn.2024-01.io.example:dp";
    c.ok("nvme_subsystem_create", json!({"nqn": nqn})).await;
    c.ok(
        "nvme_namespace_create",
        json!({"nqn": nqn, "bdev_type": "spdk", "bdev_name": bdev, "nsid": 1}),
    )
    .await;
    let ctrl = c
        .ok(
            "nvme_controller_create",
            json!({"nqn": nqn, "pf_id": 0, "vf_id": 0, "suspended": true}),
        )
        .await;
    let (ctrl, bdf) = (
        ctrl["ctrl_id"].as_str().unwrap().to_owned(),
        ctrl["pci_bdf"].as_str().unwrap().to_owned(),
    );
    c.ok(
        "nvme_controller_attach_ns",
        json!({"ctrl_id": ctrl, "nsid": 1}),
    )
    .await;
    c.ok("nvme_controller_resume", json!({"ctrl_id": ctrl}))
        .await;
    let function = emu.sysfs_root.join(format!("bus/pci/devices/0000:{bdf}"));
    dev_node(&wait_for_nvme_disk(&function).await.1.join("dev"))
}

/// The file the kernel shows behind a loop device.
fn backing_file_of(dev: &Path) -> String {
    let name = dev.file_name().unwrap().to_str().unwrap();
    std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
        .unwrap()
        .trim()
        .to_owned()
}

async fn iostat(c: &mut Client, bdev: &str) -> Value {
    c.ok("bdev_get_iostat", json!({"name": bdev})).await["bdevs"][0].clone()
}

fn counter(stat: &Value, key: &str) -> u64 {
    stat[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} in {stat}"))
}

async fn aio_bdev(c: &mut Client, dir: &Path, name: &str, size: u64) -> PathBuf {
    let img = dir.join(format!("{name}.img"));
    common::sparse_file(&img, size);
    c.ok(
        "bdev_aio_create",
        json!({"name": name, "filename": img, "block_size": 512}),
    )
    .await;
    img
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_reaches_the_bytes_through_the_emulator_and_iostat_counts_them() {
    let dir = tempfile::tempdir().unwrap();
    let emu =
        Emu::start(Config::for_test(&dir.path().join("emu")).with_data_path(DataPathMode::Fuse))
            .await;
    let mut c = emu.client().await;
    let img = aio_bdev(&mut c, dir.path(), "a0", 16 << 20).await;
    let dev = expose_virtio_blk(&emu, &mut c, "a0").await;
    assert!(
        backing_file_of(&dev).starts_with(emu.state_dir.to_str().unwrap()),
        "the loop device is on the data path's file, not {}",
        backing_file_of(&dev)
    );
    let name = dev.file_name().unwrap().to_str().unwrap();
    assert_eq!(
        std::fs::read_to_string(format!("/sys/block/{name}/loop/dio")).unwrap(),
        "1\n",
        "the loop device sends its requests to the data path in parallel"
    );

    let before = iostat(&mut c, "a0").await;
    let dev2 = dev.clone();
    tokio::task::spawn_blocking(move || {
        let f = open_direct(&dev2);
        for (i, size) in [4 * KIB, 8 * KIB, 64 * KIB].into_iter().enumerate() {
            let buf = Aligned::new(size, b'a' + i as u8);
            f.write_all_at(buf.get(), (i * 128 * KIB) as u64).unwrap();
        }
        f.sync_all().unwrap();
        let mut back = Aligned::new(8 * KIB, 0);
        f.read_exact_at(back.get_mut(), 128 * KIB as u64).unwrap();
        assert!(
            back.get().iter().all(|&b| b == b'b'),
            "read back through the device"
        );
        let mut back = Aligned::new(4 * KIB, 0);
        f.read_exact_at(back.get_mut(), 0).unwrap();
        assert!(back.get().iter().all(|&b| b == b'a'));
    })
    .await
    .unwrap();
    let after = iostat(&mut c, "a0").await;

    // The bytes are in the bdev's file, where the host put them.
    let file = File::open(&img).unwrap();
    let mut got = vec![0; 64 * KIB];
    file.read_exact_at(&mut got, 256 * KIB as u64).unwrap();
    assert!(got.iter().all(|&b| b == b'c'));

    let delta = |key: &str| counter(&after, key) - counter(&before, key);
    assert_eq!(delta("bytes_written"), (4 + 8 + 64) as u64 * KIB as u64);
    assert_eq!(delta("num_write_ops"), 3);
    assert_eq!(delta("bytes_read"), (8 + 4) as u64 * KIB as u64);
    assert_eq!(delta("num_read_ops"), 2);
    assert!(counter(&after, "write_latency_ticks") > counter(&before, "write_latency_ticks"));
    let (max, min) = (
        counter(&after, "max_write_latency_ticks"),
        counter(&after, "min_write_latency_ticks"),
    );
    assert!(0 < min && min <= max, "min {min} max {max}");

    drop(c);
    let state = emu.state_dir.clone();
    emu.stop().await;
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        !mounts.contains(state.to_str().unwrap()),
        "a graceful stop unmounts the data path"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_lvol_on_the_data_path_is_counted_at_its_store_bdev_too() {
    let dir = tempfile::tempdir().unwrap();
    let emu =
        Emu::start(Config::for_test(&dir.path().join("emu")).with_data_path(DataPathMode::Fuse))
            .await;
    let mut c = emu.client().await;
    aio_bdev(&mut c, dir.path(), "base", 64 << 20).await;
    c.ok(
        "bdev_lvol_create_lvstore",
        json!({"bdev_name": "base", "lvs_name": "lvs", "cluster_sz": 1 << 20}),
    )
    .await;
    let lvol = c
        .ok(
            "bdev_lvol_create",
            json!({"lvol_name": "v", "size_in_mib": 8, "lvs_name": "lvs"}),
        )
        .await;
    let lvol = lvol.as_str().unwrap().to_owned();
    let dev = expose_virtio_blk(&emu, &mut c, &lvol).await;
    let base_before = iostat(&mut c, "base").await;
    let lvol_before = iostat(&mut c, &lvol).await;
    tokio::task::spawn_blocking(move || {
        let f = open_direct(&dev);
        f.write_all_at(Aligned::new(16 * KIB, 7).get(), 0).unwrap();
    })
    .await
    .unwrap();
    for (bdev, before) in [("base", base_before), (lvol.as_str(), lvol_before)] {
        let after = iostat(&mut c, bdev).await;
        assert_eq!(
            counter(&after, "bytes_written") - counter(&before, "bytes_written"),
            16 * KIB as u64,
            "{bdev}"
        );
    }
    drop(c);
    emu.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crypto_bdev_shows_the_host_plaintext_and_keeps_ciphertext() {
    let dir = tempfile::tempdir().unwrap();
    // `direct`: a crypto bdev goes through the data path all the same.
    let emu =
        Emu::start(Config::for_test(&dir.path().join("emu")).with_data_path(DataPathMode::Direct))
            .await;
    let mut c = emu.client().await;
    let img = dir.path().join("base.img");
    common::sparse_file(&img, 8 << 20);
    // 4 KiB blocks under a host that writes 512-byte sectors: partial
    // blocks are read, decrypted, merged and encrypted again.
    c.ok(
        "bdev_aio_create",
        json!({"name": "base", "filename": img, "block_size": 4096}),
    )
    .await;
    c.ok(
        "accel_crypto_key_create",
        json!({"name": "k0", "cipher": "AES_XTS", "key": "00112233445566778899aabbccddeeff", "key2": "ffeeddccbbaa99887766554433221100"}),
    )
    .await;
    c.ok(
        "bdev_crypto_create",
        json!({"base_bdev_name": "base", "name": "c0", "key_name": "k0"}),
    )
    .await;
    let dev = expose_virtio_blk(&emu, &mut c, "c0").await;
    assert!(backing_file_of(&dev).starts_with(emu.state_dir.to_str().unwrap()));

    let pattern: Vec<u8> = b"snap-csi secret "
        .iter()
        .copied()
        .cycle()
        .take(16 * KIB)
        .collect();
    let d = dev.clone();
    let p = pattern.clone();
    let back = tokio::task::spawn_blocking(move || {
        let f = open_direct(&d);
        let mut buf = Aligned::new(16 * KIB, 0);
        buf.get_mut().copy_from_slice(&p);
        f.write_all_at(buf.get(), 64 * KIB as u64).unwrap();
        // One sector in the middle of a block.
        let sector = Aligned::new(512, b'#');
        f.write_all_at(sector.get(), (64 * KIB + 1024) as u64)
            .unwrap();
        f.sync_all().unwrap();
        let mut back = Aligned::new(16 * KIB, 0);
        f.read_exact_at(back.get_mut(), 64 * KIB as u64).unwrap();
        back.get().to_vec()
    })
    .await
    .unwrap();
    let mut expected = pattern.clone();
    expected[1024..1536].fill(b'#');
    assert_eq!(back, expected, "the host reads back what it wrote");

    let raw = std::fs::read(&img).unwrap();
    let needle = &pattern[..64];
    assert!(
        !raw.windows(needle.len()).any(|w| w == needle),
        "the backing file holds no plaintext"
    );
    assert!(
        raw[64 * KIB..80 * KIB].iter().any(|&b| b != 0),
        "the backing file holds the ciphertext"
    );
    // Counted at the crypto bdev and at its base.
    for bdev in ["c0", "base"] {
        let stat = iostat(&mut c, bdev).await;
        assert!(
            counter(&stat, "bytes_written") >= (16 * KIB + 512) as u64,
            "{bdev}: {stat}"
        );
    }

    // Write-zeroes (BLKZEROOUT, as mkfs.xfs zeroes its log) reads back as
    // zeroes: written encrypted, as SPDK's bdev layer does for a crypto
    // bdev, never zeroed ciphertext, which would decrypt to noise.
    let d = dev.clone();
    let zeroed = tokio::task::spawn_blocking(move || {
        use nix::fcntl::{FallocateFlags, fallocate};
        let f = open_direct(&d);
        fallocate(
            &f,
            FallocateFlags::FALLOC_FL_ZERO_RANGE,
            64 * KIB as i64,
            8 * KIB as i64,
        )
        .unwrap();
        let mut back = Aligned::new(16 * KIB, 1);
        f.read_exact_at(back.get_mut(), 64 * KIB as u64).unwrap();
        back.get().to_vec()
    })
    .await
    .unwrap();
    assert!(
        zeroed[..8 * KIB].iter().all(|&b| b == 0),
        "zeroes read back"
    );
    assert_eq!(zeroed[8 * KIB..], expected[8 * KIB..], "the rest is kept");
    let raw = std::fs::read(&img).unwrap();
    assert!(
        raw[64 * KIB..72 * KIB].iter().any(|&b| b != 0),
        "the backing file holds the zeroes' ciphertext"
    );
    drop(c);
    emu.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_subsystem_holds_the_hosts_io_until_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let target = Emu::start(Config::for_test(&dir.path().join("target")).without_snap()).await;
    let dpu =
        Emu::start(Config::for_test(&dir.path().join("dpu")).with_data_path(DataPathMode::Fuse))
            .await;
    let mut t = target.client().await;
    let img = aio_bdev(&mut t, dir.path(), "vol", 8 << 20).await;
    let nqn = "nqn.2024-01.io.example:paused";
    let port = common::free_port().to_string();
    t.export_over_tcp("vol", nqn, &port).await;
    let mut d = dpu.client().await;
    d.ok(
        "bdev_nvme_attach_controller",
        json!({"name": "r", "trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": port, "subnqn": nqn}),
    )
    .await;
    let dev = expose_virtio_blk(&dpu, &mut d, "rn1").await;
    let before = iostat(&mut t, "vol").await;

    t.ok("nvmf_subsystem_pause", json!({"nqn": nqn})).await;
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let writer = std::thread::spawn(move || {
        let f = open_direct(&dev);
        f.write_all_at(Aligned::new(4 * KIB, b'p').get(), 4 * KIB as u64)
            .unwrap();
        done_tx.send(()).unwrap();
    });
    // Nothing to wait for but time: the write must not complete while paused.
    assert!(
        done_rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "the write completed while the subsystem was paused"
    );
    let mut got = vec![0; 4 * KIB];
    File::open(&img)
        .unwrap()
        .read_exact_at(&mut got, 4 * KIB as u64)
        .unwrap();
    assert!(
        got.iter().all(|&b| b == 0),
        "nothing reached the target's bdev"
    );
    t.ok("nvmf_subsystem_resume", json!({"nqn": nqn})).await;
    done_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the write completes after the resume");
    writer.join().unwrap();
    File::open(&img)
        .unwrap()
        .read_exact_at(&mut got, 4 * KIB as u64)
        .unwrap();
    assert!(
        got.iter().all(|&b| b == b'p'),
        "the write reached the target's bdev"
    );
    // The target counted it, as SPDK's target bdev would.
    let after = iostat(&mut t, "vol").await;
    assert_eq!(
        counter(&after, "bytes_written") - counter(&before, "bytes_written"),
        4 * KIB as u64
    );
    drop((t, d));
    // The target first: its end of the DPU's I/O connection must not keep
    // a thread (and so this test's runtime) alive.
    target.stop().await;
    dpu.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos_limits_hold_the_host_to_its_rate_and_change_live() {
    let dir = tempfile::tempdir().unwrap();
    // `auto`: the limit set before the exposure puts the disk on the data path.
    let emu = Emu::start(Config::for_test(&dir.path().join("emu"))).await;
    let mut c = emu.client().await;
    aio_bdev(&mut c, dir.path(), "q0", 16 << 20).await;
    c.ok(
        "bdev_set_qos_limit",
        json!({"name": "q0", "rw_ios_per_sec": 1000}),
    )
    .await;
    let limits = &c.ok("bdev_get_bdevs", json!({"name": "q0"})).await[0]["assigned_rate_limits"];
    assert_eq!(
        *limits,
        json!({"rw_ios_per_sec": 1000, "rw_mbytes_per_sec": 0, "r_mbytes_per_sec": 0, "w_mbytes_per_sec": 0})
    );
    let dev = expose_virtio_blk(&emu, &mut c, "q0").await;

    let d = dev.clone();
    let iops = tokio::task::spawn_blocking(move || {
        steady_write_rate(
            &d,
            4 * KIB,
            16,
            Duration::from_millis(500),
            Duration::from_secs(2),
        )
    })
    .await
    .unwrap();
    assert_limit_held("IOPS at 1000", iops, 1000.0);

    // Live: bandwidth instead of IOPS, on the disk the host holds.
    c.ok(
        "bdev_set_qos_limit",
        json!({"name": "q0", "rw_ios_per_sec": 0, "w_mbytes_per_sec": 4}),
    )
    .await;
    let d = dev.clone();
    let iops = tokio::task::spawn_blocking(move || {
        steady_write_rate(
            &d,
            64 * KIB,
            8,
            Duration::from_millis(500),
            Duration::from_secs(2),
        )
    })
    .await
    .unwrap();
    let mib_per_sec = iops * (64 * KIB) as f64 / (1 << 20) as f64;
    assert_limit_held("MiB/s at 4", mib_per_sec, 4.0);
    assert!(
        iops < 100.0,
        "the IOPS limit is gone and the bandwidth one rules"
    );

    // And lifted: the same writes go much faster.
    c.ok(
        "bdev_set_qos_limit",
        json!({"name": "q0", "w_mbytes_per_sec": 0}),
    )
    .await;
    let iops = tokio::task::spawn_blocking(move || {
        steady_write_rate(
            &dev,
            64 * KIB,
            8,
            Duration::from_millis(200),
            Duration::from_millis(500),
        )
    })
    .await
    .unwrap();
    let mib_per_sec = iops * (64 * KIB) as f64 / (1 << 20) as f64;
    assert!(mib_per_sec > 8.0, "unlimited: {mib_per_sec:.1} MiB/s");
    drop(c);
    emu.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bdev_set_qos_limit_checks_its_params_like_spdk() {
    let dir = tempfile::tempdir().unwrap();
    let emu = Emu::start(Config::for_test(&dir.path().join("emu"))).await;
    let mut c = emu.client().await;
    aio_bdev(&mut c, dir.path(), "q1", 4 << 20).await;
    assert_eq!(
        c.err("bdev_set_qos_limit", json!({"name": "q1"})).await,
        (-22, "No rate limits specified".to_owned())
    );
    assert_eq!(
        c.err(
            "bdev_set_qos_limit",
            json!({"name": "nope", "rw_ios_per_sec": 1000})
        )
        .await,
        (-19, "No such device".to_owned())
    );
    for bad in [
        json!({"name": "q1", "rw_ios_per_sec": -1}),
        json!({"name": "q1", "rw_ios_per_sec": "1000"}),
        json!({"name": "q1", "bogus": 1}),
        json!({"rw_ios_per_sec": 1000}),
    ] {
        assert_eq!(
            c.err("bdev_set_qos_limit", bad).await,
            (-32603, "spdk_json_decode_object failed".to_owned())
        );
    }
    // IOPS round up to a multiple of 1000, as SPDK rounds them.
    c.ok(
        "bdev_set_qos_limit",
        json!({"name": "q1", "rw_ios_per_sec": 1500, "r_mbytes_per_sec": 7}),
    )
    .await;
    let limits = &c.ok("bdev_get_bdevs", json!({"name": "q1"})).await[0]["assigned_rate_limits"];
    assert_eq!(
        *limits,
        json!({"rw_ios_per_sec": 2000, "rw_mbytes_per_sec": 0, "r_mbytes_per_sec": 7, "w_mbytes_per_sec": 0})
    );
    drop(c);
    emu.stop().await;
}

/// QoS on an NVMe-oF volume holds on the default data path: the DPU's
/// exposure of a remote namespace reads and writes through its target, so
/// a write limit set on the target's lvol (as the sample controller sets
/// it) holds the host's O_DIRECT writes, from the moment it is set on the
/// exposed volume; so does one set on the initiator's bdev in SNAP. Each
/// rate is the writers' steady one, held under its limit
/// (`assert_limit_held`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos_on_an_nvmf_volume_holds_the_host_on_the_default_data_path() {
    let dir = tempfile::tempdir().unwrap();
    let target = Emu::start(Config::for_test(&dir.path().join("target")).without_snap()).await;
    let dpu = Emu::start(Config::for_test(&dir.path().join("dpu"))).await;
    let mut t = target.client().await;
    aio_bdev(&mut t, dir.path(), "pool", 128 << 20).await;
    t.ok(
        "bdev_lvol_create_lvstore",
        json!({"bdev_name": "pool", "lvs_name": "lvs", "cluster_sz": 1 << 20}),
    )
    .await;
    let lvol = t
        .ok(
            "bdev_lvol_create",
            json!({"lvol_name": "vol", "size_in_mib": 32, "lvs_name": "lvs", "thin_provision": true}),
        )
        .await;
    let lvol = lvol.as_str().unwrap().to_owned();
    let nqn = "nqn.2024-01.io.example:limited";
    let port = common::free_port().to_string();
    t.export_over_tcp(&lvol, nqn, &port).await;
    let mut d = dpu.client().await;
    d.ok(
        "bdev_nvme_attach_controller",
        json!({"name": "r", "trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": port, "subnqn": nqn}),
    )
    .await;
    let dev = expose_nvme(&dpu, &mut d, "rn1").await;
    assert!(
        backing_file_of(&dev).starts_with(dpu.state_dir.to_str().unwrap()),
        "an NVMe-oF namespace reaches the host through the data path, not {}",
        backing_file_of(&dev)
    );
    let write_rate = |dev: PathBuf| async move {
        let iops = tokio::task::spawn_blocking(move || {
            steady_write_rate(
                &dev,
                128 * KIB,
                8,
                Duration::from_secs(1),
                Duration::from_secs(3),
            )
        })
        .await
        .unwrap();
        iops * (128 * KIB) as f64 / (1 << 20) as f64
    };

    // Set on the target's lvol while the host holds the disk.
    t.ok(
        "bdev_set_qos_limit",
        json!({"name": lvol, "w_mbytes_per_sec": 20}),
    )
    .await;
    let mib_per_sec = write_rate(dev.clone()).await;
    assert_limit_held("MiB/s under the target's limit", mib_per_sec, 20.0);

    // Lifted there, set on the initiator's bdev in SNAP instead.
    t.ok(
        "bdev_set_qos_limit",
        json!({"name": lvol, "w_mbytes_per_sec": 0}),
    )
    .await;
    d.ok(
        "bdev_set_qos_limit",
        json!({"name": "rn1", "w_mbytes_per_sec": 8}),
    )
    .await;
    let mib_per_sec = write_rate(dev.clone()).await;
    assert_limit_held("MiB/s under SNAP's limit", mib_per_sec, 8.0);

    // The target counted what the host wrote, as SPDK's target bdev would.
    let written = counter(&iostat(&mut t, &lvol).await, "bytes_written");
    assert!(
        written >= 60 << 20,
        "the target's lvol counted {written} bytes"
    );
    drop((t, d));
    // The target first: its end of the DPU's I/O connection must not keep
    // a thread (and so this test's runtime) alive.
    target.stop().await;
    dpu.stop().await;
}
