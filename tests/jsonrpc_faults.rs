//! The JSON-RPC client against servers that misbehave: silence, death in the
//! middle of a call, malformed and truncated replies, replies dribbled byte by
//! byte. Each scripted server answers the way a broken SPDK could.

use std::sync::atomic::Ordering;
use std::time::Duration;

use snap_csi::jsonrpc::{RpcClient, RpcError};
use snap_csi::spdk::app::SpdkGetVersion;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::time::Instant;

#[path = "../src/jsonrpc/test_server.rs"]
mod test_server;

use test_server::serve;

/// Reads one request and returns its id (requests are small; one read suffices).
async fn read_request_id(stream: &mut UnixStream) -> Option<serde_json::Value> {
    let mut buf = vec![0u8; 4096];
    let n = stream.read(&mut buf).await.ok()?;
    let request: serde_json::Value = serde_json::from_slice(&buf[..n]).ok()?;
    request.get("id").cloned()
}

fn version_reply(id: &serde_json::Value) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"result":{{"version":"SPDK v24.09","fields":{{"major":24,"minor":9,"patch":0,"suffix":""}}}}}}"#
    ) + "\n"
}

/// Answers every request on the connection correctly.
async fn answer_forever(mut stream: UnixStream) {
    while let Some(id) = read_request_id(&mut stream).await {
        if stream
            .write_all(version_reply(&id).as_bytes())
            .await
            .is_err()
        {
            return;
        }
    }
}

#[tokio::test]
async fn a_silent_server_hits_the_deadline() {
    let server = serve(|_, mut stream| {
        Box::pin(async move {
            let _ = read_request_id(&mut stream).await;
            // Hold the connection open and never answer.
            tokio::time::sleep(Duration::from_secs(3600)).await;
        })
    });
    let client = RpcClient::new(&server.socket);
    let started = Instant::now();
    let deadline = started + Duration::from_millis(300);
    let error = client
        .call_until(&SpdkGetVersion {}, deadline)
        .await
        .unwrap_err();
    assert!(
        matches!(error, RpcError::Timeout { ref method, .. } if method == "spdk_get_version"),
        "{error:?}"
    );
    assert!(error.is_transient());
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the deadline was not honoured"
    );
}

#[tokio::test]
async fn a_server_that_dies_mid_call_gives_a_clear_error_and_the_next_call_reconnects() {
    let server = serve(|n, mut stream| {
        Box::pin(async move {
            if n == 0 {
                // Take the request, then die without answering.
                let _ = read_request_id(&mut stream).await;
                drop(stream);
            } else {
                answer_forever(stream).await;
            }
        })
    });
    let client = RpcClient::new(&server.socket);
    let error = client.call(&SpdkGetVersion {}).await.unwrap_err();
    assert!(matches!(error, RpcError::Disconnected { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("spdk_get_version"), "{message}");
    assert!(message.contains("closed the connection"), "{message}");

    let version = client.call(&SpdkGetVersion {}).await.unwrap();
    assert_eq!(version.version, "SPDK v24.09");
    assert_eq!(server.connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_truncated_reply_is_an_error_not_a_panic() {
    let server = serve(|n, mut stream| {
        Box::pin(async move {
            if n == 0 {
                let id = read_request_id(&mut stream).await.unwrap();
                let reply = version_reply(&id);
                let _ = stream.write_all(&reply.as_bytes()[..reply.len() / 2]).await;
            } else {
                answer_forever(stream).await;
            }
        })
    });
    let client = RpcClient::new(&server.socket);
    let error = client.call(&SpdkGetVersion {}).await.unwrap_err();
    assert!(matches!(error, RpcError::Disconnected { .. }), "{error:?}");
    assert!(error.to_string().contains("middle of a reply"), "{error}");
    assert!(client.call(&SpdkGetVersion {}).await.is_ok());
}

#[tokio::test]
async fn malformed_replies_are_errors_not_panics() {
    // Each connection gets a different kind of garbage; the last one is sane.
    const GARBAGE: &[&str] = &[
        "hello world\n",
        "{\"jsonrpc\":\"2.0\",\"id\":0,\"result\":}\n",
        "\u{0}\u{1}\u{2}",
        "[1,2,3]\n",
        "{\"jsonrpc\":\"2.0\",\"id\":999999,\"result\":true}\n",
        "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32600,\"message\":\"Invalid request\"}}\n",
        "{\"no\":\"jsonrpc\"}\n",
    ];
    let server = serve(|n, mut stream| {
        Box::pin(async move {
            match GARBAGE.get(n) {
                Some(garbage) => {
                    let _ = read_request_id(&mut stream).await;
                    let _ = stream.write_all(garbage.as_bytes()).await;
                    // Keep the connection open: the client must not wait forever.
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                None => answer_forever(stream).await,
            }
        })
    });
    let client = RpcClient::new(&server.socket);
    for garbage in GARBAGE {
        let deadline = Instant::now() + Duration::from_secs(2);
        let error = client
            .call_until(&SpdkGetVersion {}, deadline)
            .await
            .unwrap_err();
        assert!(
            matches!(
                error,
                RpcError::Disconnected { .. } | RpcError::InvalidReply { .. }
            ),
            "{garbage:?} gave {error:?}"
        );
    }
    let version = client.call(&SpdkGetVersion {}).await.unwrap();
    assert_eq!(version.fields.major, 24);
}

#[tokio::test]
async fn a_reply_with_the_wrong_shape_is_an_invalid_reply() {
    let server = serve(|_, mut stream| {
        Box::pin(async move {
            while let Some(id) = read_request_id(&mut stream).await {
                let reply =
                    format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":[\"not a version\"]}}\n");
                if stream.write_all(reply.as_bytes()).await.is_err() {
                    return;
                }
            }
        })
    });
    let client = RpcClient::new(&server.socket);
    let error = client.call(&SpdkGetVersion {}).await.unwrap_err();
    assert!(matches!(error, RpcError::InvalidReply { .. }), "{error:?}");
    assert!(!error.is_transient());
}

#[tokio::test]
async fn replies_dribbled_byte_by_byte_and_pipelined_are_matched_by_id() {
    let server = serve(|_, mut stream| {
        Box::pin(async move {
            // Collect two requests, then answer them in reverse order, one byte per write.
            let mut ids = Vec::new();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while ids.len() < 2 {
                let n = stream.read(&mut chunk).await.unwrap();
                buf.extend_from_slice(&chunk[..n]);
                ids = serde_json::Deserializer::from_slice(&buf)
                    .into_iter::<serde_json::Value>()
                    .filter_map(Result::ok)
                    .map(|v| v["id"].clone())
                    .collect();
            }
            let mut reply = String::new();
            for id in ids.iter().rev() {
                // No newline between them, as SPDK does after a null-id reply.
                reply.push_str(version_reply(id).trim_end());
            }
            for byte in reply.as_bytes() {
                stream.write_all(&[*byte]).await.unwrap();
            }
            tokio::time::sleep(Duration::from_secs(3600)).await;
        })
    });
    let client = RpcClient::new(&server.socket);
    let (a, b) = tokio::join!(
        client.call(&SpdkGetVersion {}),
        client.call(&SpdkGetVersion {})
    );
    assert_eq!(a.unwrap().version, "SPDK v24.09");
    assert_eq!(b.unwrap().version, "SPDK v24.09");
}

#[tokio::test]
async fn nothing_listening_is_a_connect_error() {
    let dir = tempfile::tempdir().unwrap();
    let client = RpcClient::new(dir.path().join("absent.sock"));
    let error = client.call(&SpdkGetVersion {}).await.unwrap_err();
    assert!(matches!(error, RpcError::Connect { .. }), "{error:?}");
    assert!(error.is_transient());
    assert!(error.to_string().contains("absent.sock"), "{error}");
}

/// Reads requests until `n` ids have arrived (they may share a read).
async fn read_request_ids(stream: &mut UnixStream, n: usize) -> Vec<serde_json::Value> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let ids: Vec<_> = serde_json::Deserializer::from_slice(&buf)
            .into_iter::<serde_json::Value>()
            .filter_map(Result::ok)
            .map(|v| v["id"].clone())
            .collect();
        if ids.len() >= n {
            return ids;
        }
        let read = stream.read(&mut chunk).await.unwrap();
        assert_ne!(read, 0, "the client hung up early");
        buf.extend_from_slice(&chunk[..read]);
    }
}

#[tokio::test]
async fn a_reply_past_the_size_or_depth_limit_breaks_the_connection_for_every_call_in_flight() {
    // A reply that never ends (64 MiB of one string, then more) and one
    // nested past the limit; each on its own connection, with two calls in
    // flight on it.
    enum Hostile {
        EndlessString,
        Deep,
    }
    for (hostile, reason) in [
        (Hostile::Deep, "nests deeper than the limit of 64 levels"),
        (
            Hostile::EndlessString,
            "larger than the limit of 67108864 bytes",
        ),
    ] {
        let server = serve(move |n, mut stream| {
            let deep = matches!(hostile, Hostile::Deep);
            Box::pin(async move {
                if n > 0 {
                    return answer_forever(stream).await;
                }
                let ids = read_request_ids(&mut stream, 2).await;
                let head = format!(r#"{{"jsonrpc":"2.0","id":{},"result":"#, ids[0]);
                if deep {
                    let reply = head + &"[".repeat(100) + &"]".repeat(100) + "}\n";
                    stream.write_all(reply.as_bytes()).await.unwrap();
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                } else {
                    stream.write_all((head + "\"").as_bytes()).await.unwrap();
                    // Until the client hangs up.
                    let chunk = vec![b'a'; 64 * 1024];
                    while stream.write_all(&chunk).await.is_ok() {}
                }
            })
        });
        let client = RpcClient::new(&server.socket);
        let deadline = Instant::now() + Duration::from_secs(60);
        let (a, b) = tokio::join!(
            client.call_until(&SpdkGetVersion {}, deadline),
            client.call_until(&SpdkGetVersion {}, deadline)
        );
        for error in [a.unwrap_err(), b.unwrap_err()] {
            assert!(matches!(error, RpcError::Disconnected { .. }), "{error:?}");
            assert!(error.to_string().contains(reason), "{error}");
            assert!(error.is_transient(), "{error}");
        }
        let version = client.call(&SpdkGetVersion {}).await.unwrap();
        assert_eq!(version.version, "SPDK v24.09");
        assert_eq!(server.connections.load(Ordering::SeqCst), 2);
    }
}

#[tokio::test]
async fn numbers_out_of_range_fail_only_their_own_call() {
    // What serde_json makes of numbers no Rust type holds, in a typed result
    // (`num_blocks: u64`) and an untyped one (`snap-csi rpc`).
    const NUM_BLOCKS: &[&str] = &["1e400", "18446744073709551616", "-1", "1.5", "8"];
    let server = serve(|_, mut stream| {
        Box::pin(async move {
            for num_blocks in NUM_BLOCKS.iter().cycle() {
                let Some(id) = read_request_id(&mut stream).await else {
                    return;
                };
                let reply = format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"result":[{{"name":"b","product_name":"p","block_size":512,"num_blocks":{num_blocks}}}]}}"#
                ) + "\n";
                if stream.write_all(reply.as_bytes()).await.is_err() {
                    return;
                }
            }
        })
    });
    let client = RpcClient::new(&server.socket);
    let get = snap_csi::spdk::bdev::BdevGetBdevs::default();
    for (num_blocks, reason) in [
        ("1e400", "number out of range"),
        ("2^64", "invalid type: floating point"),
        ("-1", "invalid value: integer `-1`, expected u64"),
        ("1.5", "invalid type: floating point `1.5`, expected u64"),
    ] {
        let error = client.call(&get).await.unwrap_err();
        assert!(
            matches!(error, RpcError::InvalidReply { ref method, .. } if method == "bdev_get_bdevs"),
            "{num_blocks}: {error:?}"
        );
        assert!(error.to_string().contains(reason), "{num_blocks}: {error}");
    }
    assert_eq!(client.call(&get).await.unwrap()[0].num_blocks, 8);

    let deadline = || Instant::now() + Duration::from_secs(5);
    let raw =
        |answer: Result<serde_json::Value, RpcError>| answer.map(|v| v[0]["num_blocks"].clone());
    let error = raw(client.call_raw("bdev_get_bdevs", None, deadline()).await).unwrap_err();
    assert!(error.to_string().contains("number out of range"), "{error}");
    // Untyped, an integer past u64 becomes the nearest float, as serde_json
    // reads any JSON number it cannot hold as an integer.
    let rounded = raw(client.call_raw("bdev_get_bdevs", None, deadline()).await).unwrap();
    assert_eq!(rounded.as_f64(), Some(18446744073709551616.0));
    assert_eq!(server.connections.load(Ordering::SeqCst), 1);
}
