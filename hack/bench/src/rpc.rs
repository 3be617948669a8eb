//! Section 6: the JSON-RPC client (`snap_csi::jsonrpc::RpcClient`) alone,
//! calls per second at 1 and at 64 in flight on one connection, against a
//! raw-socket client on the same emulator: one that writes requests
//! back-to-back (at 64 in flight: the whole window in one write, then one
//! new request per reply) and splits replies with a streaming JSON decoder.
//! Both call `spdk_get_version`, which the emulator answers at once.
//!
//! The four runs alternate, repeated, and the median of each is reported,
//! so that background load hits both clients alike.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use snap_csi::jsonrpc::{JsonFramer, RpcClient};
use snap_csi::spdk::app::SpdkGetVersion;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::stats::percentile;

/// One in-flight level.
#[derive(Debug, Clone, Serialize)]
pub struct Level {
    pub in_flight: usize,
    /// Median calls per second over the repeats.
    pub client_per_s: f64,
    pub raw_per_s: f64,
    /// client / raw.
    pub ratio: f64,
    /// Every repeat, for the spread.
    pub client_runs: Vec<f64>,
    pub raw_runs: Vec<f64>,
}

/// `RpcClient` with `in_flight` tasks sharing one client for `duration`.
async fn client_rate(socket: &Path, in_flight: usize, duration: Duration) -> anyhow::Result<f64> {
    let client = RpcClient::new(socket);
    // Connect outside the timed window, as the raw client does.
    client.call(&SpdkGetVersion {}).await?;
    let started = Instant::now();
    let until = started + duration;
    let tasks: Vec<_> = (0..in_flight)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut calls = 0u64;
                while Instant::now() < until {
                    client.call(&SpdkGetVersion {}).await?;
                    calls += 1;
                }
                anyhow::Ok(calls)
            })
        })
        .collect();
    let mut calls = 0;
    for task in tasks {
        calls += task.await??;
    }
    Ok(calls as f64 / started.elapsed().as_secs_f64())
}

#[derive(Deserialize)]
struct Reply {
    id: Option<u64>,
    result: Option<serde::de::IgnoredAny>,
}

fn request(id: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(
        format!(r#"{{"jsonrpc":"2.0","method":"spdk_get_version","id":{id}}}"#).as_bytes(),
    );
}

/// The raw client: `in_flight` requests outstanding on one connection.
async fn raw_rate(socket: &Path, in_flight: usize, duration: Duration) -> anyhow::Result<f64> {
    let mut stream = UnixStream::connect(socket)
        .await
        .with_context(|| format!("connecting to {}", socket.display()))?;
    let mut framer = JsonFramer::default();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut out = Vec::new();
    let mut next_id = 0u64;
    let mut answered = 0u64;
    let started = Instant::now();
    let until = started + duration;
    for _ in 0..in_flight {
        request(next_id, &mut out);
        next_id += 1;
    }
    stream.write_all(&out).await?;
    while answered < next_id {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            bail!("the emulator closed the connection");
        }
        framer.extend(&chunk[..n]);
        let mut replies = 0;
        while let Some(value) = framer.next_value()? {
            let reply: Reply = serde_json::from_slice(&value)?;
            if reply.result.is_none() || reply.id.is_none() {
                bail!(
                    "spdk_get_version failed: {}",
                    String::from_utf8_lossy(&value)
                );
            }
            replies += 1;
        }
        answered += replies;
        // One new request per reply, written together, while time is left.
        if Instant::now() < until && replies > 0 {
            out.clear();
            for _ in 0..replies {
                request(next_id, &mut out);
                next_id += 1;
            }
            stream.write_all(&out).await?;
        }
    }
    Ok(answered as f64 / started.elapsed().as_secs_f64())
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    percentile(&sorted, 0.5)
}

/// Both clients at each level, `repeats` times, alternating.
pub async fn run(
    socket: &Path,
    levels: &[usize],
    duration: Duration,
    repeats: usize,
) -> anyhow::Result<Vec<Level>> {
    let mut results = Vec::new();
    for &in_flight in levels {
        let mut client_runs = Vec::new();
        let mut raw_runs = Vec::new();
        for _ in 0..repeats.max(1) {
            client_runs.push(client_rate(socket, in_flight, duration).await?);
            raw_runs.push(raw_rate(socket, in_flight, duration).await?);
        }
        let (client_per_s, raw_per_s) = (median(&client_runs), median(&raw_runs));
        results.push(Level {
            in_flight,
            client_per_s,
            raw_per_s,
            ratio: client_per_s / raw_per_s,
            client_runs,
            raw_runs,
        });
    }
    Ok(results)
}
