//! The `snap-csi-spdk-plugin` binary: flags and environment, serving, and a
//! graceful stop on SIGTERM that removes its socket.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use api::storage_plugin_service_client::StoragePluginServiceClient;
use common::{Spdk, TIMEOUT, timed};
use snap_csi::grpc::unix_channel;
use snap_csi::proto::nvidia::storage::plugins::v1 as api;

const BINARY: &str = env!("CARGO_BIN_EXE_snap-csi-spdk-plugin");

/// Waits up to 5 s for the binary to listen on every one of `sockets`: a
/// connection accepted, not just the file there (a socket is bound before it
/// listens, and a connect in between is refused).
async fn wait_for(sockets: &[&Path]) {
    for _ in 0..500 {
        let mut listening = true;
        for socket in sockets {
            listening &= tokio::net::UnixStream::connect(socket).await.is_ok();
        }
        if listening {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sends SIGTERM to `child` and checks that it exits cleanly in time
/// (`stops` says what timed out otherwise); answers what it logged.
async fn terminate(child: tokio::process::Child, stops: &str) -> String {
    let pid = i32::try_from(child.id().expect("running")).unwrap();
    kill(Pid::from_raw(pid), Signal::SIGTERM).unwrap();
    let output = tokio::time::timeout(TIMEOUT, child.wait_with_output())
        .await
        .expect(stops)
        .unwrap();
    let logs = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{:?}: {logs}", output.status);
    logs
}

#[tokio::test]
async fn serves_until_sigterm_and_cleans_up() {
    let snap = Spdk::snap().await;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("dpu.sock");
    // Killed if the test fails before SIGTERM.
    let child = tokio::process::Command::new(BINARY)
        .arg("--plugin-socket")
        .arg(&socket)
        .arg("--log-format")
        .arg("json")
        .env("SPDK_PLUGIN_SPDK_SOCKET", snap.socket())
        .env("SPDK_PLUGIN_SNAP_PROVIDER", "acme")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_for(&[&socket]).await;
    let mut storage = StoragePluginServiceClient::new(unix_channel(socket.clone()));
    let provider = storage
        .get_snap_provider(timed(api::GetSnapProviderRequest {}, TIMEOUT))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(provider.provider_name, "acme");
    drop(storage);
    // Checked once it serves: the socket is bound (with the umask's mode),
    // then made private, so a look right after it appears can come too early.
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    let logs = terminate(child, "the plugin stops on SIGTERM").await;
    assert!(
        logs.lines().next().is_some() && logs.lines().all(|l| l.starts_with('{')),
        "JSON log lines: {logs}"
    );
    assert!(!socket.exists(), "the socket is removed on SIGTERM");
}

#[test]
fn bad_flags_exit_with_usage_errors() {
    let output = Command::new(BINARY)
        .args(["--snap-provider", "../etc"])
        .env("SPDK_PLUGIN_SOCKET", "/nonexistent/dpu.sock")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--snap-provider"));
}

/// With `--csi-socket`, the binary also serves the CSI controller, configured
/// by flags and environment alike, and removes both sockets on SIGTERM.
#[tokio::test]
async fn serves_the_csi_controller_beside_the_plugin() {
    use snap_csi::proto::csi::v1 as csi;

    let target = common::csi::Target::start(&common::Source::Emulator).await;
    let dir = tempfile::tempdir().unwrap();
    let plugin_socket = dir.path().join("dpu.sock");
    let csi_socket = dir.path().join("csi.sock");
    let pool = dir.path().join("pool");
    let child = tokio::process::Command::new(BINARY)
        .arg("--plugin-socket")
        .arg(&plugin_socket)
        .arg("--csi-socket")
        .arg(&csi_socket)
        .arg("--aio-pool-dir")
        .arg(&pool)
        .arg("--nvmf-lvstore")
        .arg(common::csi::LVSTORE)
        .env("SPDK_PLUGIN_STATE_DIR", dir.path().join("state"))
        .env("SPDK_PLUGIN_AIO_POOL_CAPACITY", (1u64 << 30).to_string())
        .env("SPDK_PLUGIN_NVMF_TARGET_SOCKET", target.spdk.socket())
        .env(
            "SPDK_PLUGIN_NVMF_LISTEN",
            format!("127.0.0.1:{}", target.listen_port),
        )
        .env("SPDK_PLUGIN_DEFAULT_BACKEND", "nvmf")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_for(&[&csi_socket, &plugin_socket]).await;
    let channel = unix_channel(csi_socket.clone());
    let mut identity = csi::identity_client::IdentityClient::new(channel.clone());
    let ready = identity
        .probe(timed(csi::ProbeRequest {}, TIMEOUT))
        .await
        .unwrap()
        .into_inner()
        .ready;
    assert_eq!(ready, Some(true));
    let mut controller = csi::controller_client::ControllerClient::new(channel);
    let created = controller
        .create_volume(timed(
            common::csi::volume("pvc-bin", "", 4 << 20, 0),
            TIMEOUT,
        ))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(created.volume_id, "nvmf-pvc-bin", "the default backend");
    controller
        .delete_volume(timed(
            csi::DeleteVolumeRequest {
                volume_id: created.volume_id,
                ..Default::default()
            },
            TIMEOUT,
        ))
        .await
        .unwrap();
    drop((identity, controller));

    let logs = terminate(child, "the binary stops on SIGTERM").await;
    assert!(!csi_socket.exists() && !plugin_socket.exists());
    // Said once, as it starts: no --dpu-plugin, no in-use check.
    let unchecked = "no --dpu-plugin: DeleteVolume does not check whether a DPU still serves";
    assert_eq!(logs.matches(unchecked).count(), 1, "{logs}");
}

/// The DPUs' plugins, from the environment (comma-separated): the start
/// line names them, and nothing says that DeleteVolume checks nothing.
#[tokio::test]
async fn the_controller_names_the_dpus_it_asks_before_deleting() {
    let dir = tempfile::tempdir().unwrap();
    let plugin_socket = dir.path().join("dpu.sock");
    let csi_socket = dir.path().join("csi.sock");
    let dpus = format!(
        "bf-a={},bf-b={}",
        dir.path().join("a.sock").display(),
        dir.path().join("b.sock").display()
    );
    let child = tokio::process::Command::new(BINARY)
        .arg("--plugin-socket")
        .arg(&plugin_socket)
        .arg("--csi-socket")
        .arg(&csi_socket)
        .arg("--aio-pool-dir")
        .arg(dir.path().join("pool"))
        .env("SPDK_PLUGIN_STATE_DIR", dir.path().join("state"))
        .env("SPDK_PLUGIN_DPU_PLUGIN", dpus)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_for(&[&csi_socket, &plugin_socket]).await;
    let logs = terminate(child, "the binary stops on SIGTERM").await;
    assert!(logs.contains(r#"dpu_plugins=["bf-a", "bf-b"]"#), "{logs}");
    assert!(!logs.contains("no --dpu-plugin"), "{logs}");
}

#[test]
fn incomplete_csi_settings_are_usage_errors() {
    let output = Command::new(BINARY)
        .args(["--csi-socket", "/nonexistent/csi.sock"])
        .args(["--nvmf-target-socket", "/nonexistent/spdk.sock"])
        .env("SPDK_PLUGIN_SOCKET", "/nonexistent/dpu.sock")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--nvmf-listen"));
}
