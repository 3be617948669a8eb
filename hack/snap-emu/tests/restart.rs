//! The binary: a SIGKILLed emulator's loop devices (and its dead data path
//! mount, its virtio-fs devices' mounts and sysfs entries) are cleaned up by
//! the next one on the same state directory; SIGTERM shuts down gracefully; a second
//! emulator on a busy state directory or a non-socket path is refused.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Client, losetup_all};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

fn spawn(socket: &Path, state: &Path) -> Child {
    spawn_with(socket, state, &[])
}

fn spawn_with(socket: &Path, state: &Path, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_snap-emu"))
        .args(args)
        .arg("--socket")
        .arg(socket)
        .arg("--state-dir")
        .arg(state)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn snap-emu")
}

/// Waits until the emulator answers on its socket.
async fn connect(socket: &Path, child: &mut Child) -> Client {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(s) = tokio::net::UnixStream::connect(socket).await {
            drop(s);
            return Client::connect(socket).await;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("snap-emu exited early: {status}");
        }
        assert!(Instant::now() < deadline, "snap-emu did not come up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        assert!(Instant::now() < deadline, "snap-emu did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

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

    let pid = i32::try_from(again.id()).unwrap();
    kill(Pid::from_raw(pid), Signal::SIGTERM).expect("SIGTERM");
    assert!(wait_exit(&mut again).success());
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

    let pid = i32::try_from(again.id()).unwrap();
    kill(Pid::from_raw(pid), Signal::SIGTERM).expect("SIGTERM");
    assert!(wait_exit(&mut again).success());
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
    let mountpoint = state.join("host/virtiofs/killed");
    let entry = state.join("sysfs/fs/virtiofs/0");

    let mut first = spawn(&socket, &state);
    let mut c = connect(&socket, &mut first).await;
    c.ok(
        "fsdev_aio_create",
        json!({"name": "fs0", "root_path": share}),
    )
    .await;
    let doca = json!({"transport_name": "DOCA"});
    c.ok("virtio_fs_transport_create", doca.clone()).await;
    c.ok("virtio_fs_transport_start", doca).await;
    let manager = json!({"manager": "mlx5_0"});
    c.ok("virtio_fs_doca_manager_create", manager.clone()).await;
    let vuid = c.ok("virtio_fs_doca_function_create", manager).await;
    let device =
        json!({"transport_name": "DOCA", "dev_name": "d", "tag": "killed", "fsdev": "fs0"});
    c.ok("virtio_fs_device_create", device).await;
    let bind = json!({"dev_name": "d", "manager": "mlx5_0", "vuid": vuid});
    c.ok("virtio_fs_doca_device_modify", bind).await;
    c.ok("virtio_fs_device_start", json!({"dev_name": "d"}))
        .await;
    let plug = json!({"dev_name": "d", "wait_for_done": true});
    c.ok("virtio_fs_doca_device_hotplug", plug).await;
    assert!(mounted(&mountpoint), "the device is mounted on the host");
    assert_eq!(
        std::fs::read_to_string(entry.join("tag")).unwrap(),
        "killed\n"
    );

    drop(c);
    first.kill().expect("SIGKILL");
    first.wait().expect("reap");
    assert!(mounted(&mountpoint), "SIGKILL leaves the mount, dead");

    let mut again = spawn(&socket, &state);
    let c = connect(&socket, &mut again).await;
    assert!(!mounted(&mountpoint), "the restart unmounted it");
    assert!(!entry.exists(), "the restart removed its sysfs entry");
    drop(c);
    let pid = i32::try_from(again.id()).unwrap();
    kill(Pid::from_raw(pid), Signal::SIGTERM).expect("SIGTERM");
    assert!(wait_exit(&mut again).success());
}
