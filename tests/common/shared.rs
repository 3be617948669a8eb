//! Small helpers for both test crates, this one and the sample plugin's
//! (which includes this file by path): loop devices, sparse files, free ports
//! and requests with a deadline.

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
