//! The multipath methods: `bdev_nvme_get_io_paths` (each thread holding
//! I/O channels of bdev_nvme bdevs, with every path of each: SPDK's
//! `nvme_io_path_info_json`) and `bdev_nvme_set_multipath_policy`, with
//! SPDK's decoding and errors.

use serde::Deserialize;
use serde_json::{Value, json};

use super::ctrlr::{NvmeBdev, NvmeBdevCtrlr};
use crate::datapath::paths::{MpPolicy, Path, Policy, Selector};
use crate::registry::Cx;
use crate::rpc::{EINVAL, ENODEV, OnDecodeError, RpcError, RpcResult, decode, decode_opt};

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct IoPathsParams {
    name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyParams {
    name: String,
    policy: MpPolicy,
    selector: Option<Selector>,
    rr_min_io: Option<u32>,
}

/// Whether `path` is where `bdev`'s I/O goes (`nvme_io_path_is_current`):
/// active_passive the first connected path (a channel's cached path is
/// cleared whenever a path connects or fails, and is then the first one
/// again), active_active every connected one.
fn is_current(bdev: &NvmeBdev, path: &Path, paths: &[Path]) -> bool {
    if !path.connected() {
        return false;
    }
    match bdev.policy().policy {
        MpPolicy::ActiveActive => true,
        MpPolicy::ActivePassive => {
            paths.iter().find(|p| p.connected()).map(|p| p.id) == Some(path.id)
        }
    }
}

pub(super) fn get_io_paths(
    names: &[NvmeBdevCtrlr],
    params: Option<Value>,
    cx: &Cx<'_>,
) -> RpcResult {
    let p: IoPathsParams = decode_opt(params, OnDecodeError::InvalidParams).map_err(|_| {
        RpcError::invalid_params_msg("bdev_nvme_get_io_paths requires no parameters")
    })?;
    // Every bdev with its threads; a thread lists all of its bdevs' paths.
    let mut threads: Vec<&'static str> = vec![];
    let mut channels: Vec<(&NvmeBdevCtrlr, &NvmeBdev, Vec<&'static str>)> = vec![];
    for n in names {
        for b in &n.bdevs {
            let Some(bdev) = cx.bdevs.get(&b.name) else {
                continue;
            };
            let on = cx.io_channels(bdev);
            for t in &on {
                if !threads.contains(t) {
                    threads.push(t);
                }
            }
            channels.push((n, b, on));
        }
    }
    let groups: Vec<Value> = threads
        .iter()
        .map(|thread| {
            let mut io_paths = vec![];
            for (n, b, on) in &channels {
                if !on.contains(thread) || p.name.as_ref().is_some_and(|want| *want != b.name) {
                    continue;
                }
                let paths: Vec<Path> = n.with_paths().into_iter().map(|(_, p)| p).collect();
                for path in &paths {
                    io_paths.push(io_path_json(b, path, &paths));
                }
            }
            json!({"thread": thread, "io_paths": io_paths})
        })
        .collect();
    Ok(json!({"poll_groups": groups}))
}

fn io_path_json(bdev: &NvmeBdev, path: &Path, paths: &[Path]) -> Value {
    let trid = path.trid();
    let mut transport = serde_json::Map::new();
    transport.insert("trtype".into(), json!("TCP"));
    transport.insert("traddr".into(), json!(trid.traddr));
    if !trid.trsvcid.is_empty() {
        transport.insert("trsvcid".into(), json!(trid.trsvcid));
    }
    transport.insert("adrfam".into(), json!(trid.adrfam));
    json!({
        "bdev_name": bdev.name,
        "cntlid": path.cntlid,
        "current": is_current(bdev, path, paths),
        "connected": path.connected(),
        "accessible": true,
        "transport": transport
    })
}

/// `rpc_bdev_nvme_set_multipath_policy`, then
/// `spdk_bdev_nvme_set_multipath_policy`: the policy, checked, and the
/// bdev it is for (by any of its names, as `spdk_bdev_open_ext` finds it).
pub(super) fn set_multipath_policy<'a>(
    names: &'a [NvmeBdevCtrlr],
    params: Option<Value>,
    cx: &Cx<'_>,
) -> Result<(&'a NvmeBdevCtrlr, &'a NvmeBdev, Policy), RpcError> {
    let p: PolicyParams = decode(params, OnDecodeError::DecodeFailed)?;
    let selector = match (p.policy, p.selector) {
        (MpPolicy::ActiveActive, s) => s.unwrap_or(Selector::RoundRobin),
        // SPDK's "selector only works in active_active mode".
        (MpPolicy::ActivePassive, Some(_)) => return Err(RpcError::decode_failed()),
        (MpPolicy::ActivePassive, None) => Selector::RoundRobin,
    };
    let rr_min_io = match (p.policy, selector, p.rr_min_io) {
        (MpPolicy::ActiveActive, Selector::RoundRobin, Some(0)) => {
            return Err(RpcError::errno(EINVAL));
        }
        (MpPolicy::ActiveActive, Selector::RoundRobin, None) => 1,
        (_, _, n) => n.unwrap_or(u32::MAX),
    };
    let bdev = cx.bdevs.get(&p.name).ok_or(RpcError::errno(ENODEV))?;
    let (n, b) = names
        .iter()
        .find_map(|n| Some((n, n.bdev(&bdev.name)?)))
        .ok_or(RpcError::errno(ENODEV))?;
    let policy = Policy {
        policy: p.policy,
        selector,
        rr_min_io,
    };
    Ok((n, b, policy))
}
