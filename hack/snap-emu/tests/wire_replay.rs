//! Replays every case of the real SPDK v24.09 wire capture against the
//! emulator over a raw UNIX socket and compares the bytes.

mod common;

use std::time::Duration;

use common::{Emu, bytes_literal, mask_uuids};
use serde_json::json;
use snap_emu::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const TRANSCRIPT: &str = include_str!("fixtures/spdk-v24.09-wire.txt");
const EOF_MARKER: &[u8] = b"<EOF: server closed connection>";

#[derive(Debug)]
struct Case {
    name: String,
    writes: Vec<Vec<u8>>,
    read: Vec<u8>,
}

fn parse_cases() -> Vec<Case> {
    let mut cases: Vec<Case> = vec![];
    for line in TRANSCRIPT.lines() {
        let t = line.trim_start();
        if let Some(name) = t.strip_prefix("CASE: ") {
            cases.push(Case {
                name: name.to_owned(),
                writes: vec![],
                read: vec![],
            });
        } else if t.starts_with(">>> write[") {
            let c = cases.last_mut().expect("write inside a case");
            c.writes.push(bytes_literal(t));
        } else if t.starts_with("<<< read") {
            let c = cases.last_mut().expect("read inside a case");
            c.read = bytes_literal(t);
        }
    }
    cases
}

#[test]
fn transcript_parses_completely() {
    let cases = parse_cases();
    assert_eq!(cases.len(), 25);
    for c in &cases {
        assert!(!c.writes.is_empty(), "{} has no writes", c.name);
    }
    // Declared byte counts match what the parser decoded.
    for line in TRANSCRIPT.lines().map(str::trim_start) {
        if line.starts_with(">>> write[") || line.starts_with("<<< read") {
            let n: usize = line
                .split_whitespace()
                .find_map(|w| w.parse().ok())
                .expect("byte count");
            assert_eq!(bytes_literal(line).len(), n, "{line}");
        }
    }
}

async fn start_target(dir: &std::path::Path) -> Emu {
    let emu = Emu::start(Config::for_test(dir).without_snap()).await;
    let mut c = emu.client().await;
    // The capture's target had Malloc0 exported through cnode1 (hence claimed).
    c.ok(
        "bdev_malloc_create",
        json!({"name": "Malloc0", "num_blocks": 131072, "block_size": 512}),
    )
    .await;
    c.ok("nvmf_create_transport", json!({"trtype": "TCP"}))
        .await;
    c.ok(
        "nvmf_create_subsystem",
        json!({"nqn": "nqn.2016-06.io.spdk:cnode1", "allow_any_host": true}),
    )
    .await;
    c.ok(
        "nvmf_subsystem_add_ns",
        json!({"nqn": "nqn.2016-06.io.spdk:cnode1", "namespace": {"bdev_name": "Malloc0"}}),
    )
    .await;
    emu
}

/// Reads until `want` bytes arrived, the server closed, or the wait ran out.
async fn read_reply(stream: &mut UnixStream, want: usize, wait: Duration) -> (Vec<u8>, bool) {
    let deadline = tokio::time::Instant::now() + wait;
    let mut got = vec![];
    let mut chunk = [0u8; 4096];
    while got.len() < want.max(1) {
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Err(_) => return (got, false),
            Ok(Ok(0)) | Ok(Err(_)) => return (got, true),
            Ok(Ok(n)) => got.extend_from_slice(&chunk[..n]),
        }
    }
    // Nothing more may follow the expected bytes.
    match tokio::time::timeout(Duration::from_millis(100), stream.read(&mut chunk)).await {
        Ok(Ok(n)) if n > 0 => got.extend_from_slice(&chunk[..n]),
        Ok(Ok(0)) => return (got, true),
        _ => {}
    }
    (got, false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_replays_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let emu = start_target(dir.path()).await;
    for case in parse_cases() {
        let mut stream = UnixStream::connect(&emu.socket).await.unwrap();
        for (i, w) in case.writes.iter().enumerate() {
            if i > 0 {
                // Separate writes must reach the server as separate reads.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            stream.write_all(w).await.unwrap();
        }
        if case.read == EOF_MARKER {
            let (got, closed) = read_reply(&mut stream, 0, Duration::from_secs(5)).await;
            assert!(got.is_empty(), "{}: unexpected reply {got:?}", case.name);
            assert!(closed, "{}: server kept the connection open", case.name);
        } else if case.read.is_empty() {
            let (got, closed) = read_reply(&mut stream, 0, Duration::from_millis(500)).await;
            assert!(
                got.is_empty() && !closed,
                "{}: expected silence, got {got:?} closed={closed}",
                case.name
            );
        } else {
            let (got, _) = read_reply(&mut stream, case.read.len(), Duration::from_secs(5)).await;
            assert_eq!(
                String::from_utf8_lossy(&mask_uuids(&got)),
                String::from_utf8_lossy(&mask_uuids(&case.read)),
                "case {}",
                case.name
            );
        }
    }
    emu.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malloc0_reports_one_uuid_as_alias_and_uuid() {
    let dir = tempfile::tempdir().unwrap();
    let emu = start_target(dir.path()).await;
    let mut c = emu.client().await;
    let b = c.ok("bdev_get_bdevs", json!({"name": "Malloc0"})).await;
    assert_eq!(b[0]["aliases"][0], b[0]["uuid"]);
    // Looking a bdev up by its UUID alias finds the same bdev.
    let by_uuid = c.ok("bdev_get_bdevs", json!({"name": b[0]["uuid"]})).await;
    assert_eq!(by_uuid[0]["name"], "Malloc0");
    emu.stop().await;
}

/// Requests no client means to send: one that never ends (past the 4 MiB
/// limit) and one nested past the depth limit. The request before them is
/// answered, then the connection closes without a reply, as SPDK closes a
/// stream it cannot parse; the server serves the next connection as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_or_too_deep_request_closes_only_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let emu = Emu::start(Config::for_test(dir.path()).without_snap()).await;
    let version = br#"{"jsonrpc":"2.0","method":"spdk_get_version","id":1}"#;
    let endless: &[&[u8]] = &[version, br#"{"jsonrpc":"2.0","method":"x","params":{"s":""#];
    let deep = [&version[..], &[b'['; 100][..]].concat();
    for (name, hostile, endless) in [("endless", endless.concat(), true), ("deep", deep, false)] {
        let mut stream = UnixStream::connect(&emu.socket).await.unwrap();
        stream.write_all(&hostile).await.unwrap();
        if endless {
            // Past the limit, until the server hangs up.
            let chunk = vec![b'a'; 64 * 1024];
            let mut sent = 0usize;
            while stream.write_all(&chunk).await.is_ok() {
                sent += chunk.len();
                assert!(sent < 64 << 20, "{name}: still reading after {sent} bytes");
            }
        }
        let (got, closed) = read_reply(&mut stream, usize::MAX, Duration::from_secs(10)).await;
        let got = String::from_utf8_lossy(&got);
        assert!(closed, "{name}: the connection stayed open");
        assert_eq!(got.matches("\"id\":1,").count(), 1, "{name}: {got}");
        assert!(
            got.ends_with("}\n"),
            "{name}: more than the one reply: {got}"
        );
    }
    let mut c = emu.client().await;
    c.ok("spdk_get_version", json!(null)).await;
    emu.stop().await;
}
