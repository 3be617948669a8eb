//! `bdev_set_qos_limit`: SPDK's per-bdev rate limits (`lib/bdev/bdev_rpc.c`
//! and `spdk_bdev_set_qos_rate_limits` in `lib/bdev/bdev.c`), which the data
//! path enforces (see [`crate::datapath`]) and `bdev_get_bdevs` shows as
//! `assigned_rate_limits`.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::datapath::qos::RateLimit;
use crate::registry::{Answer, BdevModule, BdevUser, Cx, Family};
use crate::rpc::{EINVAL, ENODEV, OnDecodeError, RpcError, RpcResult, decode};

/// SPDK_BDEV_QOS_MIN_IOS_PER_SEC: IOPS limits are rounded up to a multiple.
const MIN_IOS_PER_SEC: u64 = 1000;
/// SPDK_BDEV_QOS_MAX_MBYTES_PER_SEC: larger limits are cut to this.
const MAX_MBYTES_PER_SEC: u64 = u64::MAX / (1024 * 1024);
/// SPDK_BDEV_QOS_LIMIT_NOT_DEFINED, which SPDK also takes as "not given".
const NOT_DEFINED: u64 = u64::MAX;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SetQosLimitParams {
    name: String,
    rw_ios_per_sec: Option<u64>,
    rw_mbytes_per_sec: Option<u64>,
    r_mbytes_per_sec: Option<u64>,
    w_mbytes_per_sec: Option<u64>,
}

#[derive(Debug, Default)]
pub(crate) struct QosLimits;

impl QosLimits {
    /// Sets the given limits (0 removes one, SPDK's meaning); those not
    /// given stay. Live: I/O admitted after the answer sees them.
    fn bdev_set_qos_limit(&self, params: Option<Value>, cx: &Cx<'_>) -> RpcResult {
        let p: SetQosLimitParams = decode(params, OnDecodeError::DecodeFailed)?;
        let bdev = cx.bdevs.get(&p.name).ok_or(RpcError::errno(ENODEV))?;
        let given = [
            p.rw_ios_per_sec,
            p.rw_mbytes_per_sec,
            p.r_mbytes_per_sec,
            p.w_mbytes_per_sec,
        ]
        .map(|v| v.filter(|&v| v != NOT_DEFINED));
        if given.iter().all(Option::is_none) {
            return Err(RpcError::new(-EINVAL, "No rate limits specified"));
        }
        let mut limits = [None; 4];
        for ((kind, value), out) in RateLimit::ALL.iter().zip(given).zip(&mut limits) {
            *out = value.map(|v| per_second(*kind, v));
        }
        bdev.io.qos.set(limits);
        tracing::info!(bdev = %bdev.name, ?limits, "QoS limits set");
        Ok(json!(true))
    }
}

impl Family for QosLimits {
    fn methods(&self) -> Vec<&'static str> {
        vec!["bdev_set_qos_limit"]
    }

    fn call(&mut self, method: &str, params: Option<Value>, cx: &mut Cx<'_>) -> Answer {
        match method {
            "bdev_set_qos_limit" => self.bdev_set_qos_limit(params, cx).map(Into::into),
            _ => Err(RpcError::method_not_found()),
        }
    }
}

impl BdevModule for QosLimits {}
impl BdevUser for QosLimits {}

/// A limit as the RPC gives it (IOPS, or MiB/s) in per-second units (IOPS,
/// or bytes), rounded up to SPDK's granularity as SPDK rounds it.
fn per_second(kind: RateLimit, value: u64) -> u64 {
    if kind.is_iops() {
        value
            .div_ceil(MIN_IOS_PER_SEC)
            .saturating_mul(MIN_IOS_PER_SEC)
    } else {
        value.min(MAX_MBYTES_PER_SEC) << 20
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_round_up_like_spdk() {
        assert_eq!(per_second(RateLimit::RwIops, 0), 0);
        assert_eq!(per_second(RateLimit::RwIops, 1), 1000);
        assert_eq!(per_second(RateLimit::RwIops, 2000), 2000);
        assert_eq!(per_second(RateLimit::RwIops, 2001), 3000);
        assert_eq!(per_second(RateLimit::WBps, 3), 3 << 20);
        assert_eq!(
            per_second(RateLimit::RBps, u64::MAX - 1),
            MAX_MBYTES_PER_SEC << 20
        );
    }
}
