//! The `snap-csi-spdk-plugin` binary as a user first meets it in an image:
//! `--version` names the commit it was built from, `--help` works, an
//! unknown flag is refused, and serving starts with a line saying what runs
//! and with what (the plugin alone, and with the CSI controller).

#[path = "../../../tests/common/entrypoint.rs"]
mod entrypoint;

use std::process::Command;

use entrypoint::{assert_unknown_flag_refused, assert_version, expected_version, start_line};

const BINARY: &str = env!("CARGO_BIN_EXE_snap-csi-spdk-plugin");

/// The binary with none of the caller's `SPDK_PLUGIN_*` settings.
fn plugin() -> Command {
    entrypoint::command(BINARY, &["SPDK_PLUGIN_"])
}

#[test]
fn version_names_the_crate_version_and_the_commit() {
    let mut command = plugin();
    command.arg("--version");
    assert_version(command, "snap-csi-spdk-plugin");
}

#[test]
fn help_succeeds_and_lists_the_serving_flags() {
    let output = plugin().arg("--help").output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    for flag in [
        "--plugin-socket",
        "--spdk-socket",
        "--csi-socket",
        "--version",
    ] {
        assert!(stdout.contains(flag), "--help lists {flag}: {stdout}");
    }
}

#[test]
fn an_unknown_flag_is_a_usage_error_that_names_it() {
    assert_unknown_flag_refused(plugin());
}

/// Its first line: the build (version and commit) and the settings it
/// serves with, flags, environment and defaults alike. No setting is a
/// secret (sockets, directories, an NFS server's name).
#[test]
fn serving_logs_its_build_and_settings_as_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let version = format!("version=\"{}\"", expected_version());

    let socket = path("dpu.sock");
    let mut command = plugin();
    command
        .args(["--plugin-socket", &socket])
        .args(["--spdk-socket", &path("spdk.sock")])
        .env("SPDK_PLUGIN_SNAP_PROVIDER", "acme-entrypoint");
    let line = start_line(command, "snap_csi_spdk_plugin: starting ");
    assert!(line.contains(" INFO "), "{line}");
    assert!(line.contains(&version), "{line}");
    assert!(
        line.contains(&format!("plugin_socket: {socket:?}")),
        "{line}"
    );
    assert!(
        line.contains("snap_provider: \"acme-entrypoint\""),
        "{line}"
    );
    assert!(line.contains("call_timeout: 30s"), "{line}");
    assert!(line.contains("csi: None"), "{line}");

    // With the CSI controller too, in JSON: one object, the settings one field.
    let csi_socket = path("csi.sock");
    let pool = path("pool");
    std::fs::create_dir(&pool).unwrap();
    let mut command = plugin();
    command
        .args(["--plugin-socket", &path("dpu2.sock")])
        .args(["--spdk-socket", &path("spdk.sock")])
        .args(["--csi-socket", &csi_socket])
        .args(["--aio-pool-dir", &pool])
        .args(["--state-dir", &path("state")])
        .args(["--log-format", "json"]);
    let line = start_line(command, "\"message\":\"starting\"");
    assert!(line.starts_with('{') && line.ends_with('}'), "{line}");
    assert!(
        line.contains(&format!("\"version\":\"{}\"", expected_version())),
        "{line}"
    );
    assert!(
        line.contains(&format!("socket: \\\"{csi_socket}\\\"")),
        "{line}"
    );
    assert!(line.contains("default_backend: Aio"), "{line}");
}
