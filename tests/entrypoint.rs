//! The `snap-csi` binary as a user first meets it in an image: `--version`
//! names the commit it was built from, `--help` works, an unknown flag is
//! refused, and each service's first line says what runs and with what.

#[path = "common/entrypoint.rs"]
mod entrypoint;

use std::process::Command;

use entrypoint::{assert_unknown_flag_refused, assert_version, expected_version, start_line};

const BINARY: &str = env!("CARGO_BIN_EXE_snap-csi");

/// The binary with none of the caller's `SNAP_*` settings.
fn snap_csi() -> Command {
    entrypoint::command(BINARY, &["SNAP_"])
}

#[test]
fn version_names_the_crate_version_and_the_commit() {
    let mut command = snap_csi();
    command.arg("--version");
    assert_version(command, "snap-csi");
    // A service's too, as an image whose command names it is asked.
    let mut command = snap_csi();
    command.args(["node", "--version"]);
    assert_version(command, "snap-csi-node");
}

#[test]
fn help_succeeds_and_lists_the_subcommands() {
    let output = snap_csi().arg("--help").output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    for subcommand in [
        "node",
        "dpu-agent",
        "controller",
        "rpc",
        "find-device",
        "plugin-check",
    ] {
        assert!(
            stdout
                .lines()
                .any(|l| l.trim_start().starts_with(subcommand)),
            "--help lists {subcommand}: {stdout}"
        );
    }
    for service in ["node", "dpu-agent", "controller"] {
        let output = snap_csi().args([service, "--help"]).output().unwrap();
        assert_eq!(
            output.status.code(),
            Some(0),
            "{service} --help: {output:?}"
        );
    }
}

#[test]
fn an_unknown_flag_is_a_usage_error_that_names_it() {
    for args in [&[][..], &["controller"], &["node"]] {
        let mut command = snap_csi();
        command.args(args);
        assert_unknown_flag_refused(command);
    }
}

/// Each service's first line: the build (version and commit) and the
/// settings it runs with, flags and defaults alike.
#[test]
fn each_service_logs_its_build_and_settings_as_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let version = format!("version=\"{}\"", expected_version());
    let start = |args: &[&str], marker| {
        let mut command = snap_csi();
        command.args(args);
        start_line(command, marker)
    };

    let endpoint = path("controller.sock");
    let vendor = format!("unix://{}", path("vendor.sock"));
    let line = start(
        &[
            "controller",
            "--endpoint",
            &endpoint,
            "--vendor-endpoint",
            &vendor,
            "--driver-name",
            "entrypoint.test.example",
        ],
        "starting controller proxy",
    );
    assert!(line.contains(" INFO "), "{line}");
    assert!(line.contains(&version), "{line}");
    assert!(line.contains(&format!("endpoint: {endpoint:?}")), "{line}");
    assert!(
        line.contains(&format!("vendor_endpoint: {vendor:?}")),
        "{line}"
    );
    assert!(
        line.contains("driver_name: \"entrypoint.test.example\""),
        "{line}"
    );
    // A default it was not given, and a key by its path only.
    assert!(line.contains("call_timeout: 120s"), "{line}");
    assert!(
        line.contains("key: \"/etc/snap-csi/tls/tls.key\""),
        "{line}"
    );

    let listen = format!("unix://{}", path("agent.sock"));
    let line = start(
        &[
            "dpu-agent",
            "--listen",
            &listen,
            "--plugin-socket",
            &path("plugin.sock"),
        ],
        "starting DPU agent",
    );
    assert!(line.contains(&version), "{line}");
    assert!(line.contains(&format!("listen: {listen:?}")), "{line}");
    assert!(
        line.contains(&format!("plugin_socket: {:?}", path("plugin.sock"))),
        "{line}"
    );

    let endpoint = path("node.sock");
    let line = start(
        &[
            "node",
            "--endpoint",
            &endpoint,
            "--node-id",
            "entrypoint-node",
            "--state-dir",
            &path("state"),
            "--kubelet-dir",
            &path("kubelet"),
            "--plugin-socket",
            &path("plugin.sock"),
            "--log-format",
            "json",
        ],
        "starting node service",
    );
    // One JSON object, the settings one string field of it.
    assert!(line.starts_with('{') && line.ends_with('}'), "{line}");
    assert!(
        line.contains(&format!("\"version\":\"{}\"", expected_version())),
        "{line}"
    );
    assert!(line.contains("node_id: \\\"entrypoint-node\\\""), "{line}");
}

/// The only secret a flag could carry is credentials in an endpoint's
/// address; the links authenticate by certificate, so the address is refused
/// before anything logs it, and the error does not repeat it.
#[test]
fn credentials_in_an_endpoint_are_refused_and_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = dir.path().join("csi.sock");
    let secret = "s3cret-entrypoint";
    let address = format!("https://user:{secret}@dpu.example:9830");
    for args in [
        vec!["node", "--dpu-endpoint", &address],
        vec![
            "controller",
            "--vendor-endpoint",
            &address,
            "--vendor-name",
            "vendor.example",
        ],
    ] {
        let output = snap_csi()
            .args(&args)
            .arg("--endpoint")
            .arg(&endpoint)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("no user or password"), "{args:?}: {stderr}");
        assert!(!stderr.contains(secret), "{args:?}: {stderr}");
        assert!(!String::from_utf8_lossy(&output.stdout).contains(secret));
    }
}

/// A DPU's topology segment is valued with the node id
/// (`dpu.snap-csi.io/NAME: NODE_ID`), which kubelet makes a Node label: a
/// node id that cannot be a label value is refused before the node serves.
#[test]
fn a_node_id_that_cannot_be_a_label_value_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    // A file, not a socket: a node that went on would stop there, not serve.
    let endpoint = dir.path().join("csi.sock");
    std::fs::write(&endpoint, "").unwrap();
    let output = snap_csi()
        .args(["node", "--dpu-name", "bf3-a", "--node-id", &"n".repeat(64)])
        .arg("--endpoint")
        .arg(&endpoint)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--kubelet-dir")
        .arg(dir.path().join("kubelet"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    for part in ["--node-id", "at most 63", "dpu.snap-csi.io/bf3-a"] {
        assert!(stderr.contains(part), "{part}: {stderr}");
    }
}
