//! Values nobody meant to give the `snap-csi` binary: refused with a message
//! naming the setting and exit code 2 (a usage error), never a panic.

use std::process::Command;

/// Runs `snap-csi args...` and returns its exit code and stderr.
fn run(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_snap-csi"))
        .args(args)
        .env_remove("SNAP_CSI_CONFIG")
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn assert_refused(args: &[&str], names: &str) {
    let (code, stderr) = run(args);
    assert_eq!(code, Some(2), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    assert!(stderr.contains(names), "{args:?} names {names}: {stderr}");
}

/// Numbers that are no duration, or one no deadline can be set from:
/// `1e19` seconds fits a `Duration` but overflows `now + timeout`.
const NOT_DURATIONS: [&str; 6] = ["1e19", "NaN", "-1", "inf", "-inf", "31536001"];

#[test]
fn rpc_refuses_a_timeout_that_is_no_duration() {
    for bad in NOT_DURATIONS {
        // `--timeout=` keeps a leading minus from reading as a flag.
        let timeout = format!("--timeout={bad}");
        assert_refused(
            &[
                "rpc",
                "--socket",
                "/nonexistent/spdk.sock",
                &timeout,
                "spdk_get_version",
            ],
            "--timeout",
        );
    }
    // A good one gets as far as the (missing) socket.
    let (code, stderr) = run(&[
        "rpc",
        "--socket",
        "/nonexistent/spdk.sock",
        "--timeout",
        "0.5",
        "spdk_get_version",
    ]);
    assert_eq!(code, Some(1), "{stderr}");
}

#[test]
fn every_seconds_flag_refuses_a_value_that_is_no_duration() {
    for bad in NOT_DURATIONS {
        let value = format!("={bad}");
        let flag = |name: &str| format!("--{name}{value}");
        assert_refused(
            &["node", "--node-id", "n1", &flag("call-timeout")],
            "--call-timeout",
        );
        assert_refused(
            &["node", "--node-id", "n1", &flag("device-wait")],
            "--device-wait",
        );
        assert_refused(
            &[
                "controller",
                "--vendor-endpoint",
                "unix:///run/vendor.sock",
                &flag("call-timeout"),
            ],
            "--call-timeout",
        );
        assert_refused(&["dpu-agent", &flag("call-timeout")], "--call-timeout");
        assert_refused(
            &[
                "plugin-check",
                "--endpoint",
                "unix:///run/plugin.sock",
                &flag("timeout"),
            ],
            "--timeout",
        );
    }
}
