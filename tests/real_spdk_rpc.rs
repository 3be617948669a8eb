//! The JSON-RPC client against a real SPDK v24.09 `spdk_tgt`: a deadline
//! honoured while SPDK sits on a call, 64 calls in flight on one connection
//! (and one `bdev_get_iostat` for all their bdevs), the target killed with
//! calls in flight, and the same client reconnecting to its successor. Runs when `SNAP_CSI_SPDK_TGT` names the binary.

mod common;

use std::time::Duration;

use common::real_spdk::Suite;
use snap_csi::jsonrpc::{RpcClient, RpcError, code};
use snap_csi::spdk::app::SpdkGetVersion;
use snap_csi::spdk::bdev::{BdevGetBdevs, BdevGetIostat, BdevNullCreate, BdevNullDelete};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long SPDK holds the call of the deadline test.
const HOLD_MS: u32 = 5000;

/// A `bdev_get_bdevs` that real SPDK holds for `ms` before answering -19:
/// it waits that long for the bdev to appear.
fn held_for(ms: u32) -> BdevGetBdevs {
    BdevGetBdevs {
        name: Some("never-made".into()),
        timeout: Some(ms),
    }
}

#[tokio::test]
async fn a_deadline_is_honoured_while_spdk_holds_the_call() {
    let Some(suite) = Suite::acquire() else {
        return;
    };
    let spdk = suite.spdk_tgt();
    let client = RpcClient::new(&spdk.socket);

    let started = Instant::now();
    // SPDK holds the call far longer than its deadline, so that an answer
    // before the hold ends is the deadline's doing, however loaded the host.
    let error = client
        .call_until(&held_for(HOLD_MS), started + Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(
        matches!(error, RpcError::Timeout { ref method, .. } if method == "bdev_get_bdevs"),
        "{error:?}"
    );
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    assert!(
        waited < Duration::from_millis(u64::from(HOLD_MS)),
        "{waited:?}"
    );

    // The connection serves on meanwhile, and SPDK's late answer to the
    // forgotten call is dropped rather than given to a later one.
    let version = client.call(&SpdkGetVersion {}).await.unwrap();
    assert_eq!(version.version, "SPDK v24.09");
    // SPDK answers the held call when its hold ends: after it, its late
    // answer is in (or behind) whatever comes next on the connection.
    tokio::time::sleep_until(started + Duration::from_millis(u64::from(HOLD_MS) + 500)).await;
    let error = client.call(&held_for(0)).await.unwrap_err();
    assert_eq!(error.code(), Some(code::ENODEV), "{error:?}");
    assert_eq!(
        client.call(&SpdkGetVersion {}).await.unwrap().version,
        "SPDK v24.09"
    );
}

/// Starts `each(client, n)` for n in 0..64 at once and waits for them all.
async fn in_flight(client: &RpcClient, each: fn(RpcClient, u64) -> JoinHandle<()>) {
    let tasks: Vec<_> = (0..64).map(|n| each(client.clone(), n)).collect();
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_calls_in_flight_are_each_answered_their_own() {
    let Some(suite) = Suite::acquire() else {
        return;
    };
    let spdk = suite.spdk_tgt();
    let client = RpcClient::new(&spdk.socket);
    in_flight(&client, |client, n| {
        tokio::spawn(async move {
            // Each bdev's size is its own: a reply given to the wrong caller shows.
            let name = client
                .call(&BdevNullCreate {
                    name: format!("null{n}"),
                    num_blocks: (n + 1) * 8,
                    block_size: 512,
                    uuid: None,
                })
                .await
                .unwrap();
            assert_eq!(name, format!("null{n}"));
        })
    })
    .await;
    in_flight(&client, |client, n| {
        tokio::spawn(async move {
            let bdevs = client
                .call(&BdevGetBdevs {
                    name: Some(format!("null{n}")),
                    timeout: None,
                })
                .await
                .unwrap();
            assert_eq!(bdevs.len(), 1);
            assert_eq!(bdevs[0].name, format!("null{n}"));
            assert_eq!(bdevs[0].num_blocks, (n + 1) * 8);
        })
    })
    .await;
    assert_eq!(
        client.call(&BdevGetBdevs::default()).await.unwrap().len(),
        64
    );
    // One bdev_get_iostat answers for every bdev, as the node's per-volume
    // metrics read it, in the shape the typed reply decodes.
    let iostat = client.call(&BdevGetIostat::default()).await.unwrap();
    assert!(iostat.tick_rate > 0, "{iostat:?}");
    let mut names: Vec<String> = iostat.bdevs.into_iter().map(|b| b.name).collect();
    names.sort();
    let mut made: Vec<String> = (0..64).map(|n| format!("null{n}")).collect();
    made.sort();
    assert_eq!(names, made);
    in_flight(&client, |client, n| {
        tokio::spawn(async move {
            let name = format!("null{n}");
            assert!(client.call(&BdevNullDelete { name }).await.unwrap());
        })
    })
    .await;
    assert!(
        client
            .call(&BdevGetBdevs::default())
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_target_fails_calls_in_flight_and_its_successor_is_reached() {
    let Some(suite) = Suite::acquire() else {
        return;
    };
    let mut spdk = suite.spdk_tgt();
    let client = RpcClient::new(&spdk.socket);
    client.call(&SpdkGetVersion {}).await.unwrap();

    let calls: Vec<_> = (0..8)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let result = client.call(&held_for(20_000)).await;
                (result, started.elapsed())
            })
        })
        .collect();
    // Let the calls reach SPDK, then kill it as a crash would.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed = Instant::now();
    spdk.kill();
    for call in calls {
        let (result, _) = call.await.unwrap();
        let error = result.unwrap_err();
        assert!(matches!(error, RpcError::Disconnected { .. }), "{error:?}");
        assert!(error.to_string().contains("bdev_get_bdevs"), "{error}");
        assert!(error.is_transient());
    }
    // Well before SPDK would have answered (20 s): the kill ended them.
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "calls in flight failed promptly: {:?}",
        killed.elapsed()
    );

    // Nothing listens: a connect error, at once.
    let error = client.call(&SpdkGetVersion {}).await.unwrap_err();
    assert!(matches!(error, RpcError::Connect { .. }), "{error:?}");

    // A new spdk_tgt on the same socket: the same client reaches it.
    spdk.start();
    let version = client.call(&SpdkGetVersion {}).await.unwrap();
    assert_eq!(version.version, "SPDK v24.09");
    let error = client.call(&held_for(0)).await.unwrap_err();
    assert_eq!(error.code(), Some(code::ENODEV), "{error:?}");
}
