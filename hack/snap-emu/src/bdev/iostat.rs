//! `bdev_get_iostat`: SPDK's per-bdev I/O counters, from what the data path
//! served through a bdev (as the exposed bdev or one under it) and the
//! kernel's counters of the loop devices exposing it directly.

use std::time::Instant;

use serde::Deserialize;
use serde_json::{Value, json};

use super::registry::{Bdev, BdevKind};
use crate::datapath::stats::TICK_RATE;
use crate::registry::{Answer, BdevModule, BdevUser, Cx, Family};
use crate::rpc::{EINVAL, ENODEV, OnDecodeError, RpcError, RpcResult, decode_opt};

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct GetIostatParams {
    name: Option<String>,
    #[serde(default)]
    per_channel: bool,
    #[serde(default)]
    reset_mode: Option<String>,
}

#[derive(Debug)]
pub(crate) struct Iostat {
    /// What `ticks` counts from.
    started: Instant,
}

impl Iostat {
    pub(crate) fn new() -> Self {
        Self {
            started: Instant::now(),
        }
    }

    fn ticks(&self) -> u64 {
        let ns = self.started.elapsed().as_nanos();
        u64::try_from(ns.saturating_mul(u128::from(TICK_RATE)) / 1_000_000_000).unwrap_or(u64::MAX)
    }

    fn bdev_get_iostat(&self, params: Option<Value>, cx: &Cx<'_>) -> RpcResult {
        let p: GetIostatParams = decode_opt(params, OnDecodeError::DecodeFailed)?;
        if let Some(mode) = &p.reset_mode
            && !matches!(mode.as_str(), "all" | "maxmin" | "error" | "none")
        {
            return Err(RpcError::decode_failed());
        }
        let ticks = self.ticks();
        if p.per_channel {
            let name = p.name.ok_or(RpcError::errno(EINVAL))?;
            let bdev = cx.bdevs.get(&name).ok_or(RpcError::errno(ENODEV))?;
            // SPDK lists the threads holding an I/O channel to the bdev: none
            // while no module uses it; one (the emulator has one thread) once
            // something does.
            let mut channels = vec![];
            if bdev.claim.is_some() || cx.writes(&bdev.name) {
                let mut ch = serde_json::Map::new();
                ch.insert("thread_id".into(), json!(1));
                io_stat_into(bdev, cx, &mut ch);
                channels.push(Value::Object(ch));
            }
            return Ok(json!({
                "tick_rate": TICK_RATE,
                "ticks": ticks,
                "name": bdev.name,
                "channels": channels
            }));
        }
        let selected: Vec<&Bdev> = match &p.name {
            Some(name) => vec![cx.bdevs.get(name).ok_or(RpcError::errno(ENODEV))?],
            None => cx.bdevs.iter().collect(),
        };
        let bdevs: Vec<Value> = selected
            .into_iter()
            .map(|b| {
                let mut o = serde_json::Map::new();
                o.insert("name".into(), json!(b.name));
                io_stat_into(b, cx, &mut o);
                if matches!(b.kind, BdevKind::Nvme(_)) {
                    // bdev_nvme has dump_device_stat_json; it is empty without error stats.
                    o.insert("driver_specific".into(), json!({}));
                }
                Value::Object(o)
            })
            .collect();
        Ok(json!({"tick_rate": TICK_RATE, "ticks": ticks, "bdevs": bdevs}))
    }
}

impl Family for Iostat {
    fn methods(&self) -> Vec<&'static str> {
        vec!["bdev_get_iostat"]
    }

    fn call(&mut self, method: &str, params: Option<Value>, cx: &mut Cx<'_>) -> Answer {
        match method {
            "bdev_get_iostat" => self.bdev_get_iostat(params, cx).map(Into::into),
            _ => Err(RpcError::method_not_found()),
        }
    }
}

impl BdevModule for Iostat {}
impl BdevUser for Iostat {}

/// `spdk_bdev_dump_io_stat_json`: what the data path served through the
/// bdev (as the exposed bdev or one under it), plus the kernel's
/// counters of the loop devices exposing it directly (which know no
/// latency extremes). Zeros while nothing exposes it.
fn io_stat_into(bdev: &Bdev, cx: &Cx<'_>, o: &mut serde_json::Map<String, Value>) {
    let s = cx.host_io(&bdev.name);
    let d = bdev.io.stats.snapshot();
    let ms_to_ticks = |ms: u64| ms.saturating_mul(TICK_RATE / 1000);
    let fields: [(&str, u64); 20] = [
        (
            "bytes_read",
            s.read_sectors.saturating_mul(512) + d.read.bytes,
        ),
        ("num_read_ops", s.read_ios + d.read.ops),
        (
            "bytes_written",
            s.write_sectors.saturating_mul(512) + d.write.bytes,
        ),
        ("num_write_ops", s.write_ios + d.write.ops),
        (
            "bytes_unmapped",
            s.discard_sectors.saturating_mul(512) + d.unmap.bytes,
        ),
        ("num_unmap_ops", s.discard_ios + d.unmap.ops),
        ("bytes_copied", 0),
        ("num_copy_ops", 0),
        ("read_latency_ticks", ms_to_ticks(s.read_ms) + d.read.ticks),
        ("max_read_latency_ticks", d.read.max_ticks),
        ("min_read_latency_ticks", d.read.min_ticks),
        (
            "write_latency_ticks",
            ms_to_ticks(s.write_ms) + d.write.ticks,
        ),
        ("max_write_latency_ticks", d.write.max_ticks),
        ("min_write_latency_ticks", d.write.min_ticks),
        (
            "unmap_latency_ticks",
            ms_to_ticks(s.discard_ms) + d.unmap.ticks,
        ),
        ("max_unmap_latency_ticks", d.unmap.max_ticks),
        ("min_unmap_latency_ticks", d.unmap.min_ticks),
        ("copy_latency_ticks", 0),
        ("max_copy_latency_ticks", 0),
        ("min_copy_latency_ticks", 0),
    ];
    for (k, v) in fields {
        o.insert(k.into(), json!(v));
    }
    o.insert("io_error".into(), json!({}));
}
