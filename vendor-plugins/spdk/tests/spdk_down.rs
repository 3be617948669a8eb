//! SNAP's SPDK down or hung: Probe says "not ready" (never an error), and
//! device calls fail with a code the node retries, inside the caller's deadline.

mod common;

use std::time::{Duration, Instant};

use common::{Plugin, Spdk, TIMEOUT, aio_context, assert_kept_deadline};
use tonic::Code;

#[tokio::test]
async fn spdk_down_is_not_ready_and_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("spdk.sock");
    let plugin = Plugin::start(&socket).await;

    assert_eq!(
        plugin.probe(Duration::from_secs(2)).await.unwrap(),
        Some(false)
    );
    let started = Instant::now();
    let status = plugin
        .create("vol", aio_context(&dir.path().join("vol.img")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("unreachable"), "{status:?}");
    // No socket is no SNAP: said at once, not after retrying until the
    // caller's deadline.
    let took = started.elapsed();
    assert!(took < TIMEOUT / 2, "answered after {took:?}");
    for status in [
        plugin.delete("vol", "").await.unwrap_err(),
        plugin.get("vol", "").await.unwrap_err(),
        plugin.list(0, "").await.unwrap_err(),
    ] {
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    }

    // SNAP comes up: the same plugin becomes ready and serves.
    let snap = Spdk::start(|_| snap_emu::Config::for_test(dir.path())).await;
    assert_eq!(
        plugin.probe(Duration::from_secs(2)).await.unwrap(),
        Some(true)
    );
    let file = snap.file("vol.img");
    plugin.create("vol", aio_context(&file)).await.unwrap();
    plugin.delete("vol", "").await.unwrap();
}

/// A socket that accepts and never answers: every call ends by its deadline,
/// with our answer rather than the caller's own timeout.
#[tokio::test]
async fn spdk_hung_answers_within_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("spdk.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let held = tokio::spawn(async move {
        let mut connections = vec![];
        while let Ok((stream, _)) = listener.accept().await {
            connections.push(stream);
        }
    });
    let plugin = Plugin::start(&socket).await;

    let started = Instant::now();
    assert_eq!(
        plugin.probe(Duration::from_secs(1)).await.unwrap(),
        Some(false)
    );
    assert_kept_deadline("Probe", started, Duration::from_secs(1));

    let request = snap_csi::proto::nvidia::storage::plugins::v1::CreateDeviceRequest {
        volume_id: "vol".into(),
        volume_mode: "Block".into(),
        volume_context: aio_context(&dir.path().join("vol.img")),
        ..Default::default()
    };
    let started = Instant::now();
    let status = plugin
        .create_request(request, Duration::from_secs(2))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        status.message().contains("bdev_aio_create"),
        "our own answer, not the transport's: {status:?}"
    );
    assert_kept_deadline("CreateDevice", started, Duration::from_secs(2));
    held.abort();
}
