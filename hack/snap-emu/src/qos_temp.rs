//! TEMP (branch `qos`, to be dropped when helper H1's real, enforcing
//! `bdev_set_qos_limit` is merged): the method's answers and the limits
//! `bdev_get_bdevs` reports, enforced nowhere, so that the QoS control
//! plane's tests and csi-sanity run on this branch. From SPDK v24.09's
//! `rpc_bdev_set_qos_limit` and `spdk_bdev_set_qos_rate_limits`.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::rpc::{OnDecodeError, RpcError, RpcResult, decode};
use crate::state::Emulator;

const ENODEV: i32 = 19;
const EINVAL: i32 = 22;
const MIB: u64 = 1024 * 1024;

/// Limits per bdev UUID (a new bdev of the same name starts with none), in
/// `assigned_rate_limits` order and units (IOPS, then MiB/s); 0 is none.
pub(crate) type QosTable = HashMap<Uuid, [u64; 4]>;

#[derive(Debug, Deserialize)]
struct SetQosLimit {
    name: String,
    rw_ios_per_sec: Option<u64>,
    rw_mbytes_per_sec: Option<u64>,
    r_mbytes_per_sec: Option<u64>,
    w_mbytes_per_sec: Option<u64>,
}

impl Emulator {
    pub(crate) fn bdev_set_qos_limit(&mut self, params: Option<Value>) -> RpcResult {
        let p: SetQosLimit = decode(params, OnDecodeError::DecodeFailed)?;
        let uuid = self.bdevs.get(&p.name).ok_or(RpcError::errno(ENODEV))?.uuid;
        let given = [
            p.rw_ios_per_sec,
            p.rw_mbytes_per_sec,
            p.r_mbytes_per_sec,
            p.w_mbytes_per_sec,
        ];
        if given.iter().all(Option::is_none) {
            return Err(RpcError::new(-EINVAL, "No rate limits specified"));
        }
        let limits = self.qos.entry(uuid).or_default();
        for (i, value) in given.into_iter().enumerate() {
            let Some(value) = value else { continue };
            // SPDK rounds IOPS up to a multiple of 1000 and caps MiB/s.
            limits[i] = if i == 0 {
                value.div_ceil(1000).saturating_mul(1000)
            } else {
                value.min(u64::MAX / MIB)
            };
        }
        Ok(json!(true))
    }

    /// `assigned_rate_limits` of the bdev with `uuid`.
    pub(crate) fn assigned_rate_limits(&self, uuid: &Uuid) -> Value {
        let [iops, rw, r, w] = self.qos.get(uuid).copied().unwrap_or_default();
        json!({"rw_ios_per_sec": iops, "rw_mbytes_per_sec": rw, "r_mbytes_per_sec": r, "w_mbytes_per_sec": w})
    }
}
