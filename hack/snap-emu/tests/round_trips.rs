//! The poller's count of dependent round trips (`snap_emu::Rounds`), which
//! the other crates' tests use to hold the node and the plugin to their
//! budgets: a request that waited for a reply counts one more, requests sent
//! together count once, on one connection or across several.

mod common;

use std::time::Duration;

use common::Emu;
use serde_json::{Value, json};
use snap_emu::Config;

const PERIOD: Duration = Duration::from_millis(20);

#[tokio::test]
async fn dependent_requests_count_one_round_each_and_pipelined_ones_one_in_all() {
    let dir = tempfile::tempdir().unwrap();
    let emu = Emu::start(
        Config::for_test(dir.path())
            .without_snap()
            .counting_round_trips(PERIOD),
    )
    .await;
    let mut a = emu.client().await;
    let mut b = emu.client().await;
    assert_eq!(emu.rounds.get(), 0);

    // Each call waits for the reply before: one round each.
    for _ in 0..3 {
        a.ok("spdk_get_version", Value::Null).await;
    }
    assert_eq!(emu.rounds.get(), 3);

    // Sixty-four sent in one write, then their replies read: one round.
    let batch: Vec<u8> = (1000..1064)
        .flat_map(|id| {
            serde_json::to_vec(&json!({"jsonrpc": "2.0", "method": "spdk_get_version", "id": id}))
                .unwrap()
        })
        .collect();
    a.send_raw(&batch).await;
    for id in 1000..1064 {
        assert_eq!(a.read_value().await["id"], json!(id));
    }
    assert_eq!(emu.rounds.get(), 4);

    // A request on another connection, sent after a reply on the first,
    // waited for it: the count crosses connections (and processes).
    a.ok("spdk_get_version", Value::Null).await;
    b.ok("spdk_get_version", Value::Null).await;
    assert_eq!(emu.rounds.get(), 6);

    emu.stop().await;
}
