//! What the entrypoint tests of both binaries share (this crate's and the
//! sample plugin's): the build they should name, and a service's start line.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a service may take to log its start line.
const START: Duration = Duration::from_secs(30);

/// `binary` with none of the caller's settings whose variables start with
/// one of `prefixes` (a developer's would change what it does or logs),
/// logging at info.
pub fn command(binary: &str, prefixes: &[&str]) -> Command {
    let mut command = Command::new(binary);
    for (name, _) in std::env::vars_os() {
        let name_text = name.to_string_lossy();
        if prefixes.iter().any(|p| name_text.starts_with(p)) {
            command.env_remove(&name);
        }
    }
    command
        .env("RUST_LOG", "info")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null());
    command
}

/// The commit a binary built from `dir` should name: the one the build was
/// told (`SNAP_CSI_GIT_COMMIT`), else the checkout's HEAD, else `unknown`.
pub fn expected_commit(dir: &Path) -> String {
    let given = std::env::var("SNAP_CSI_GIT_COMMIT").unwrap_or_default();
    let given = given.trim();
    if !given.is_empty() && given != "unknown" {
        return given.to_string();
    }
    Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(dir)
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".to_string())
}

/// `VERSION (commit HASH)`, as `--version` and the start line show it, for
/// the crate that includes this file (`env!` expands there).
pub fn expected_version() -> String {
    format!(
        "{} (commit {})",
        env!("CARGO_PKG_VERSION"),
        expected_commit(Path::new(env!("CARGO_MANIFEST_DIR")))
    )
}

/// `command` (with `--version` among its arguments) prints `NAME VERSION
/// (commit HASH)`.
pub fn assert_version(mut command: Command, name: &str) {
    let output = command.output().unwrap();
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(stdout, format!("{name} {}\n", expected_version()));
}

/// `command` followed by an unknown flag is a usage error (exit 2) that
/// names the flag.
pub fn assert_unknown_flag_refused(mut command: Command) {
    let output = command.arg("--no-such-flag").output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{command:?}: {stderr}");
    assert!(stderr.contains("--no-such-flag"), "{command:?}: {stderr}");
}

/// Starts `command`, reads its stderr until a line contains `marker`
/// (failing after a while, or if it exits first), kills it and answers the
/// line.
pub fn start_line(mut command: Command, marker: &str) -> String {
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (lines, read) = mpsc::channel();
    // Ends when the child does (its stderr closes), or once nobody reads.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            if line.map(|line| lines.send(line)).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + START;
    let mut seen = Vec::new();
    let found = loop {
        match read.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.contains(marker) => break Some(line),
            Ok(line) => seen.push(line),
            // Timed out, or it exited without the line.
            Err(_) => break None,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    found.unwrap_or_else(|| panic!("{command:?} logged no {marker:?} line: {seen:#?}"))
}
