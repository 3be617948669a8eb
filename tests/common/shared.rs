//! Small helpers for both test crates, this one and the sample plugin's
//! (which includes this file by path): loop devices, sparse files, free ports,
//! requests with a deadline and waiting for the host to see a disk.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// Loop devices currently backed by `file` (`losetup -j`).
pub fn loop_devices_of(file: &Path) -> Vec<String> {
    let out = std::process::Command::new("losetup")
        .arg("-j")
        .arg(file)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Loop devices over any file below `dir` (a data path's FUSE files too,
/// which `losetup -j` on the bdev's backing file cannot see).
pub fn loop_devices_under(dir: &Path) -> Vec<String> {
    let out = std::process::Command::new("losetup")
        .args(["--list", "--noheadings", "--output", "NAME,BACK-FILE"])
        .output()
        .unwrap();
    let dir = dir.display().to_string();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|f| f.starts_with(&dir))
        })
        .map(str::to_string)
        .collect()
}

/// A sparse file of `size` bytes.
pub fn sparse_file(path: &Path, size: u64) {
    let file = std::fs::File::create(path).unwrap();
    file.set_len(size).unwrap();
}

/// A loopback address with a port nobody listens on right now.
pub fn free_local_address() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A TCP port of 127.0.0.1 nobody listens on right now.
pub fn free_tcp_port() -> u16 {
    free_local_address().port()
}

/// A request carrying a deadline (`grpc-timeout`), as kubelet, the sidecars
/// and the node send them.
pub fn timed<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

/// How late past its deadline a call may end on a loaded machine and still
/// count as having kept it: generous, so that no scheduling delay fails a
/// test, and far below the 20 s and more a call that ignored its deadline
/// would wait (the timeouts of every client and service in the tests).
pub const DEADLINE_SLACK: Duration = Duration::from_secs(5);

/// Asserts that a call started at `started` with `deadline` to keep ended by
/// it, give or take [`DEADLINE_SLACK`]. The callers also check the answer's
/// code and message: a call cut short by anything but its own deadline
/// handling would give another one.
pub fn assert_kept_deadline(
    what: &str,
    started: impl Into<std::time::Instant>,
    deadline: Duration,
) {
    let took = started.into().elapsed();
    assert!(
        took < deadline + DEADLINE_SLACK,
        "{what}: answered after {took:?}, its deadline was {deadline:?}"
    );
}

/// The period of an emulator counting round trips
/// (`snap_emu::Config::counting_round_trips`): requests a client sends
/// together must reach it within one period to count as one round, so it is
/// long next to any scheduling delay; each dependent round trip costs one to
/// two periods.
pub const ROUND_TRIP_PERIOD: Duration = Duration::from_millis(200);

/// Runs `call` and returns its output and how many dependent SNAP/SPDK round
/// trips it made, as the emulator's poller counted them (`rounds` reads its
/// count): a request that waited for an earlier reply is one more, requests
/// sent together are one.
pub async fn round_trips<T>(
    rounds: impl Fn() -> u64,
    call: impl std::future::Future<Output = T>,
) -> (T, u64) {
    let before = rounds();
    let out = call.await;
    (out, rounds() - before)
}

/// How long the host may take to discover a disk after SNAP exposed it.
pub const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// Polls until `find` sees a host device, as the node does after an attach:
/// SNAP (and the emulator) answers before the host's driver has found the
/// namespace or disk, so a lookup right after the reply may come up empty.
pub async fn discovered<T>(what: &str, mut find: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + DISCOVERY_TIMEOUT;
    loop {
        if let Some(found) = find() {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {DISCOVERY_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A child process killed (and reaped) when dropped, also when a test fails.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
