//! The `snap-csi-spdk-plugin` binary: flags and environment, serving, and a
//! graceful stop on SIGTERM that removes its socket.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use api::storage_plugin_service_client::StoragePluginServiceClient;
use common::{Emulator, TIMEOUT, timed};
use snap_csi::dpu::plugin::unix_channel;
use snap_csi::proto::nvidia::storage::plugins::v1 as api;

const BINARY: &str = env!("CARGO_BIN_EXE_snap-csi-spdk-plugin");

#[tokio::test]
async fn serves_until_sigterm_and_cleans_up() {
    let snap = Emulator::snap().await;
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
    for _ in 0..500 {
        if socket.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    let mut storage = StoragePluginServiceClient::new(unix_channel(socket.clone()));
    let provider = storage
        .get_snap_provider(timed(api::GetSnapProviderRequest {}, TIMEOUT))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(provider.provider_name, "acme");
    drop(storage);

    let killed = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().expect("running").to_string())
        .status()
        .unwrap();
    assert!(killed.success());
    let output = tokio::time::timeout(TIMEOUT, child.wait_with_output())
        .await
        .expect("the plugin stops on SIGTERM")
        .unwrap();
    let logs = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{:?}: {logs}", output.status);
    assert!(
        logs.lines().all(|l| l.starts_with('{')),
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
