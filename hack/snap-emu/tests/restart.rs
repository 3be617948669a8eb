//! The binary: a SIGKILLed emulator's loop devices (and its dead data path
//! mount, its virtio-fs devices' mounts and sysfs entries) are cleaned up by
//! the next one on the same state directory; SIGTERM shuts down gracefully; a second
//! emulator on a busy state directory or a non-socket path is refused.

mod common;

use std::path::Path;
use std::process::Command;

use common::binary::{connect, spawn, spawn_with, terminate, wait_exit};
use common::{Client, HostMount, losetup_all};
use serde_json::json;

/// The disk a killed emulator leaves: an AIO bdev over `img` on a
/// virtio-blk controller.
async fn expose_a_disk(c: &mut Client, img: &Path) {
    c.ok(
        "bdev_aio_create",
        json!({"name": "k", "filename": img, "block_size": 512}),
    )
    .await;
    c.ok(
        "virtio_blk_controller_create",
        json!({"pf_id": 0, "vf_id": 3, "bdev": "k", "vblk_id": "killed"}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_cleans_up_after_a_killed_emulator() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("spdk.sock");
    let state = dir.path().join("state");
    let img = dir.path().join("killed.img");
    common::sparse_file(&img, 8 << 20);
    let img_str = img.to_str().unwrap().to_owned();

    let mut first = spawn(&socket, &state);
    let mut c = connect(&socket, &mut first).await;
    expose_a_disk(&mut c, &img).await;
    common::wait_until("the loop device appearing", || {
        losetup_all().contains(&img_str)
    })
    .await;

    // A second emulator may not take over a live one's state directory.
    let other_socket = dir.path().join("other.sock");
    let mut second = spawn(&other_socket, &state);
    assert!(!wait_exit(&mut second).success());

    drop(c);
    first.kill().expect("SIGKILL");
    first.wait().expect("reap");
    assert!(
        losetup_all().contains(&img_str),
        "SIGKILL leaves the loop device"
    );
    assert!(socket.exists(), "SIGKILL leaves the socket");

    let mut again = spawn(&socket, &state);
    let mut c = connect(&socket, &mut again).await;
    assert!(!losetup_all().contains(&img_str), "the restart detached it");
    // A restarted emulator starts empty, like SPDK.
    assert_eq!(c.ok("bdev_get_bdevs", json!({})).await, json!([]));
    assert_eq!(
        c.ok("virtio_blk_controller_list", json!({})).await,
        json!([])
    );
    drop(c);

    terminate(again);
    assert!(!socket.exists(), "graceful shutdown removes the socket");
}

fn mounted(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").expect("mounts");
    let path = path.to_str().unwrap();
    mounts.lines().any(|l| l.split(' ').nth(1) == Some(path))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_cleans_up_a_killed_emulators_data_path() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("spdk.sock");
    let state = dir.path().join("state");
    let mountpoint = state.join("host/datapath");
    let img = dir.path().join("killed.img");
    common::sparse_file(&img, 8 << 20);

    let mut first = spawn_with(&socket, &state, &["--data-path", "fuse"]);
    let mut c = connect(&socket, &mut first).await;
    expose_a_disk(&mut c, &img).await;
    let served = mountpoint.to_str().unwrap().to_owned();
    common::wait_until("the loop device on the data path", || {
        losetup_all().contains(&served)
    })
    .await;
    assert!(mounted(&mountpoint));
    let listing = losetup_all();
    let line = listing.lines().find(|l| l.contains(&served)).unwrap();
    let device = line.split(':').next().unwrap().trim_start_matches("/dev/");
    let backing = std::path::PathBuf::from(format!("/sys/block/{device}/loop/backing_file"));
    let file_name = std::fs::read_to_string(&backing).unwrap();
    let file_name = file_name.trim().rsplit('/').next().unwrap().to_owned();

    drop(c);
    first.kill().expect("SIGKILL");
    first.wait().expect("reap");
    assert!(
        losetup_all().contains(&served),
        "SIGKILL leaves the loop device"
    );
    assert_eq!(
        std::fs::metadata(&mountpoint)
            .map_err(|e| e.raw_os_error())
            .err(),
        Some(Some(nix::errno::Errno::ENOTCONN as i32)),
        "SIGKILL leaves the mount dead"
    );

    let mut again = spawn_with(&socket, &state, &["--data-path", "fuse"]);
    let c = connect(&socket, &mut again).await;
    // Detached, not merely shown elsewhere (a lazily unmounted file shows
    // as "/dN"); the device may since serve another test's file.
    let now = std::fs::read_to_string(&backing).unwrap_or_default();
    assert!(
        !now.trim().ends_with(&format!("/{file_name}")),
        "the restart detached {} (now {now:?})",
        backing.display()
    );
    assert!(
        !mounted(&mountpoint),
        "the restart unmounted the dead mount"
    );
    drop(c);

    terminate(again);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_that_is_not_a_socket_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let not_socket = dir.path().join("precious.txt");
    std::fs::write(&not_socket, b"keep me").unwrap();
    let mut child = spawn(&not_socket, &dir.path().join("state"));
    assert!(!wait_exit(&mut child).success());
    assert_eq!(std::fs::read(&not_socket).unwrap(), b"keep me");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_socket_is_not_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let first = common::Emu::start(snap_emu::Config::for_test(dir.path()).without_snap()).await;
    let other =
        snap_emu::Config::new(first.socket.clone(), dir.path().join("other")).without_snap();
    let err = snap_emu::bind(other)
        .await
        .expect_err("the socket is taken");
    assert!(err.to_string().contains("in use"), "{err:#}");
    let mut c = first.client().await;
    c.ok("spdk_get_version", serde_json::Value::Null).await;
    drop(c);
    first.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_cleans_up_a_killed_emulators_virtio_fs_devices() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("spdk.sock");
    let state = dir.path().join("state");
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    let devices = state.join("host/virtiofs");
    let entry = state.join("sysfs/fs/virtiofs/0");
    let dead = |mount: &Path| {
        std::fs::metadata(mount.join("kept"))
            .is_err_and(|e| e.raw_os_error() == Some(nix::libc::ENOTCONN))
    };

    std::fs::write(share.join("kept"), b"kept").unwrap();
    let mut first = spawn(&socket, &state);
    let mut c = connect(&socket, &mut first).await;
    common::virtio_fs_ready(&mut c, &share).await;
    common::virtio_fs_attach(&mut c, "d", "killed").await;
    let host = HostMount::new(&devices, "killed", &dir.path().join("host"));
    assert_eq!(std::fs::read(host.join("kept")).unwrap(), b"kept");
    assert_eq!(
        std::fs::read_to_string(entry.join("tag")).unwrap(),
        "killed\n"
    );

    drop(c);
    first.kill().expect("SIGKILL");
    first.wait().expect("reap");
    assert!(dead(&host), "the host's mount dies with its server");
    assert!(devices.join("killed").exists(), "SIGKILL leaves the socket");

    let mut again = spawn(&socket, &state);
    let c = connect(&socket, &mut again).await;
    assert!(
        !devices.join("killed").exists(),
        "the restart removed the socket"
    );
    assert!(!entry.exists(), "the restart removed its sysfs entry");
    assert!(dead(&host), "a restart serves no earlier mount");
    drop(host);
    drop(c);
    terminate(again);
}

/// A killed NVMe-oF target started again with its `--json` configuration
/// (its pool's aio bdev) finds its lvol store and lvols again, bytes and
/// snapshots included, as a real target finds its blobstore on the pool
/// file; a store deleted for real is not found again and leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_started_again_finds_its_lvol_store_and_lvols() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("spdk.sock");
    let state = dir.path().join("state");
    let pool = dir.path().join("pool.img");
    common::sparse_file(&pool, 64 << 20);
    let config = dir.path().join("target.json");
    let pool_bdev = json!({"name": "pool0", "filename": pool, "block_size": 4096});
    let saved = json!({"subsystems": [{"subsystem": "bdev", "config": [
        {"method": "bdev_aio_create", "params": pool_bdev}
    ]}]});
    std::fs::write(&config, saved.to_string()).unwrap();
    let args = ["--no-snap", "--json", config.to_str().unwrap()];

    let mut first = spawn_with(&socket, &state, &args);
    let mut c = connect(&socket, &mut first).await;
    let lvs = c
        .ok(
            "bdev_lvol_create_lvstore",
            json!({"bdev_name": "pool0", "lvs_name": "lvs0"}),
        )
        .await;
    let lvol = c
        .ok(
            "bdev_lvol_create",
            json!({"lvol_name": "v1", "size_in_mib": 8, "lvs_name": "lvs0", "thin_provision": true}),
        )
        .await;
    let (lvs, lvol) = (lvs.as_str().unwrap(), lvol.as_str().unwrap());
    // The lvol's bytes, where the store keeps them.
    let file = state.join(format!("lvstores/lvs-{lvs}/{lvol}.img"));
    let written: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    std::os::unix::fs::FileExt::write_all_at(
        &std::fs::OpenOptions::new().write(true).open(&file).unwrap(),
        &written,
        4096,
    )
    .unwrap();
    c.ok(
        "bdev_lvol_snapshot",
        json!({"lvol_name": "lvs0/v1", "snapshot_name": "s1"}),
    )
    .await;
    let stores = c
        .ok("bdev_lvol_get_lvstores", serde_json::Value::Null)
        .await;
    let lvols = c.ok("bdev_lvol_get_lvols", json!({})).await;
    let bdev = c.ok("bdev_get_bdevs", json!({"name": "lvs0/v1"})).await;
    assert_eq!(lvols.as_array().map(Vec::len), Some(2), "{lvols}");

    drop(c);
    first.kill().expect("SIGKILL");
    first.wait().expect("reap");
    let mut again = spawn_with(&socket, &state, &args);
    let mut c = connect(&socket, &mut again).await;
    assert_eq!(
        c.ok("bdev_lvol_get_lvstores", serde_json::Value::Null)
            .await,
        stores
    );
    assert_eq!(c.ok("bdev_lvol_get_lvols", json!({})).await, lvols);
    let mut found = c.ok("bdev_get_bdevs", json!({"name": "lvs0/v1"})).await;
    // Counters start again at zero; everything else is as it was.
    for b in [&mut found[0], &mut bdev.clone()[0]] {
        b.as_object_mut().unwrap().remove("claimed");
    }
    assert_eq!(found[0]["uuid"], bdev[0]["uuid"]);
    assert_eq!(found[0]["driver_specific"], bdev[0]["driver_specific"]);
    let mut read = vec![0; written.len()];
    std::os::unix::fs::FileExt::read_exact_at(
        &std::fs::File::open(&file).unwrap(),
        &mut read,
        4096,
    )
    .unwrap();
    assert!(read == written, "the lvol's bytes are what was written");

    // Deleted for real, the store is gone from the pool and from the disk.
    c.ok("bdev_lvol_delete_lvstore", json!({"lvs_name": "lvs0"}))
        .await;
    assert_eq!(
        std::fs::read_dir(state.join("lvstores")).unwrap().count(),
        0,
        "the store's directory went with it"
    );
    drop(c);
    again.kill().expect("SIGKILL");
    again.wait().expect("reap");
    let mut third = spawn_with(&socket, &state, &args);
    let mut c = connect(&socket, &mut third).await;
    assert_eq!(
        c.ok("bdev_lvol_get_lvstores", serde_json::Value::Null)
            .await,
        json!([])
    );
    assert_eq!(
        c.ok("bdev_get_bdevs", json!({}))
            .await
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    drop(c);
    terminate(third);
}

/// A `--json` configuration that fails stops the start, naming the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_configuration_that_fails_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("target.json");
    let saved = json!({"subsystems": [{"subsystem": "bdev", "config": [
        {"method": "bdev_aio_create", "params": {"name": "pool0", "filename": "/nonexistent/pool.img"}}
    ]}]});
    std::fs::write(&config, saved.to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_snap-emu"))
        .args(["--no-snap", "--json", config.to_str().unwrap(), "--socket"])
        .arg(dir.path().join("spdk.sock"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .output()
        .expect("run snap-emu");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bdev bdev_aio_create"), "{stderr}");
    assert!(!dir.path().join("spdk.sock").exists(), "{stderr}");
}
