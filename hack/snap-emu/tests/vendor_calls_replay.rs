//! Replays the vendor-plugin transcript of a real SPDK v24.09 pair (a remote
//! NVMe-oF target and the SPDK inside SNAP) against two emulator instances.
//!
//! Substitutions: the target listens on a free port instead of 4420, 4499 is
//! replaced by another port nothing listens on, and the image files under
//! /var/lib/example are temporary files of the right size. Replies are
//! compared token by token in order; UUIDs (and the host NQN built from one)
//! compare by shape, as do counters, ticks and latencies, which are random on
//! real SPDK. Replies cut with `...` are compared as far as they go.

mod common;

use common::{Emu, compare_prefix, free_port, sparse_file};
use snap_emu::Config;
use tokio::io::AsyncWriteExt;

const TRANSCRIPT: &str = include_str!("fixtures/spdk-v24.09-vendor-calls.txt");

/// Numbers that differ run to run on real SPDK.
const RANDOM_KEYS: &[&str] = &[
    "tick_rate",
    "ticks",
    "bytes_read",
    "num_read_ops",
    "bytes_written",
    "num_write_ops",
    "read_latency_ticks",
    "max_read_latency_ticks",
    "min_read_latency_ticks",
    "write_latency_ticks",
    "max_write_latency_ticks",
    "min_write_latency_ticks",
];

#[derive(Debug)]
struct Call {
    label: String,
    role: String,
    request: String,
    reply: String,
    cut: bool,
}

fn parse_calls() -> Vec<Call> {
    let mut calls = vec![];
    let mut lines = TRANSCRIPT.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(rest) = line.strip_prefix("--- ") else {
            continue;
        };
        let (head, request) = rest.split_once(" >>> ").expect("request marker");
        let open = head.find('[').expect("role");
        let close = head.find(']').expect("role");
        let reply_line = lines.next().expect("reply line");
        let reply = reply_line.strip_prefix("<<< ").expect("reply marker");
        let (reply, cut) = match reply.strip_suffix("...") {
            Some(r) => (r, true),
            None => (reply, false),
        };
        calls.push(Call {
            label: head[..open].trim().to_owned(),
            role: head[open + 1..close].to_owned(),
            request: request.to_owned(),
            reply: reply.to_owned(),
            cut,
        });
    }
    calls
}

#[test]
fn transcript_parses_completely() {
    let calls = parse_calls();
    assert_eq!(calls.len(), 37);
    assert_eq!(calls.iter().filter(|c| c.role == "target").count(), 21);
    assert_eq!(calls.iter().filter(|c| c.role == "snap-dpu").count(), 16);
    assert_eq!(calls.iter().filter(|c| c.cut).count(), 5);
    assert!(calls.iter().any(|c| c.label == "unknown nqn"));
}

#[test]
fn comparison_catches_differences_and_allows_cuts() {
    let uuid_a = r#"{"id":1,"result":"4a77070d-ff49-4e10-9d3f-c2a59eeaa46d"}"#;
    let uuid_b = r#"{"id":1,"result":"bea3c3aa-216f-4e9d-a03a-85e01f630f8b"}"#;
    assert!(compare_prefix(uuid_a, uuid_b, false, &[]).is_ok());
    assert!(
        compare_prefix(
            r#"{"id":1,"result":1}"#,
            r#"{"id":1,"result":2}"#,
            false,
            &[]
        )
        .is_err()
    );
    assert!(compare_prefix(r#"{"ticks":1}"#, r#"{"ticks":2}"#, false, RANDOM_KEYS).is_ok());
    assert!(
        compare_prefix(
            r#"{"a":[{"read":true,"w"#,
            r#"{"a":[{"read":true,"write":true}]}"#,
            true,
            &[]
        )
        .is_ok()
    );
    assert!(
        compare_prefix(
            r#"{"a":[{"read":true,"x"#,
            r#"{"a":[{"read":true,"write":true}]}"#,
            true,
            &[]
        )
        .is_err()
    );
    assert!(compare_prefix(r#"{"a":1}"#, r#"{"a":1,"b":2}"#, false, &[]).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_roles_replay_against_two_emulators() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("pool.img");
    let vol1 = dir.path().join("vol1.img");
    sparse_file(&pool, 256 << 20);
    sparse_file(&vol1, 64 << 20);
    let target_port = free_port().to_string();
    let dead_port = loop {
        let p = free_port().to_string();
        if p != target_port {
            break p;
        }
    };
    let substitute = |s: &str| {
        s.replace("/var/lib/example/pool.img", &pool.to_string_lossy())
            .replace("/var/lib/example/vol1.img", &vol1.to_string_lossy())
            .replace("\"4420\"", &format!("\"{target_port}\""))
            .replace("\"4499\"", &format!("\"{dead_port}\""))
    };

    let (target, dpu) = Emu::start_target_and_dpu(dir.path()).await;
    let mut clients = [target.client().await, dpu.client().await];

    let mut compared = 0;
    for call in parse_calls() {
        let client = match call.role.as_str() {
            "target" => &mut clients[0],
            "snap-dpu" => &mut clients[1],
            other => panic!("unknown role {other}"),
        };
        client.send_raw(substitute(&call.request).as_bytes()).await;
        let reply = client.read_value().await;
        let actual = serde_json::to_string(&reply).unwrap();
        if let Err(why) = compare_prefix(&substitute(&call.reply), &actual, call.cut, RANDOM_KEYS) {
            panic!("[{}] {} {}: {why}", call.role, call.label, call.request);
        }
        compared += 1;
    }
    assert_eq!(compared, 37);

    // Deleting the lvol gave its clusters back.
    let mut t = target.client().await;
    let stores = t
        .ok(
            "bdev_lvol_get_lvstores",
            serde_json::json!({"lvs_name": "lvs0"}),
        )
        .await;
    assert_eq!(stores[0]["free_clusters"], stores[0]["total_data_clusters"]);

    drop(clients);
    target.stop().await;
    dpu.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_arrive_on_one_connection_in_order_when_pipelined() {
    let dir = tempfile::tempdir().unwrap();
    let emu = Emu::start(Config::for_test(dir.path()).without_snap()).await;
    let mut c = emu.client().await;
    let mut batch = Vec::new();
    for id in 0..64 {
        batch.extend_from_slice(
            format!(r#"{{"jsonrpc":"2.0","method":"bdev_get_bdevs","id":{id}}}"#).as_bytes(),
        );
    }
    c.send_raw(&batch).await;
    for id in 0..64 {
        assert_eq!(c.read_value().await["id"], id);
    }
    let mut raw = tokio::net::UnixStream::connect(&emu.socket).await.unwrap();
    raw.write_all(b"{").await.unwrap();
    drop(raw);
    emu.stop().await;
}
