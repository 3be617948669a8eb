//! `bdev_nvme_set_options`: bdev_nvme's global options (SPDK's `g_opts`),
//! decoded and checked as `rpc_bdev_nvme_set_options` and
//! `bdev_nvme_set_opts` do, in their order and with their errors. Every
//! parameter SPDK v24.09 decodes is taken; what the emulator models of
//! them: `transport_ack_timeout` (each controller attached later gets it,
//! see [`AckTimeout`]), `keep_alive_timeout_ms` (its keep-alive, every half
//! of it) and the reconnect policy a `bdev_nvme_attach_controller` without
//! one takes (`spdk_bdev_nvme_get_default_ctrlr_opts`).

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::datapath::paths::{AckTimeout, Resilience};
use crate::rpc::{EINVAL, EPERM, OnDecodeError, RpcError, decode_opt};

/// What is kept of `g_opts`: what the checks read and what attaches take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct NvmeOpts {
    timeout_us: u64,
    timeout_admin_us: u64,
    bdev_retry_count: i32,
    pub transport_ack_timeout: u8,
    keep_alive_timeout_ms: u32,
    pub ctrlr_loss_timeout_sec: i32,
    pub reconnect_delay_sec: u32,
    pub fast_io_fail_timeout_sec: u32,
}

impl Default for NvmeOpts {
    /// `g_opts` as SPDK starts.
    fn default() -> Self {
        Self {
            timeout_us: 0,
            timeout_admin_us: 0,
            bdev_retry_count: 3,
            transport_ack_timeout: 0,
            keep_alive_timeout_ms: 10_000,
            ctrlr_loss_timeout_sec: 0,
            reconnect_delay_sec: 0,
            fast_io_fail_timeout_sec: 0,
        }
    }
}

impl NvmeOpts {
    /// The sockets' timeout of a controller attached now.
    pub(super) fn ack_timeout(&self) -> AckTimeout {
        AckTimeout::from_exponent(self.transport_ack_timeout)
    }

    /// How often a controller attached now sends a keep-alive: every half
    /// KATO (`nvme_ctrlr_set_keep_alive_timeout_done`), none for 0.
    pub(super) fn keep_alive(&self) -> Option<Duration> {
        let ms = u64::from(self.keep_alive_timeout_ms);
        (ms != 0).then(|| Duration::from_millis(ms / 2).max(Duration::from_millis(1)))
    }
}

/// `rpc_decode_action_on_timeout`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ActionOnTimeout {
    None,
    Abort,
    Reset,
}

/// `spdk_nvme_dhchap_get_digest_id`'s names.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Digest {
    Sha256,
    Sha384,
    Sha512,
}

/// `spdk_nvme_dhchap_get_dhgroup_id`'s names.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum DhGroup {
    Null,
    Ffdhe2048,
    Ffdhe3072,
    Ffdhe4096,
    Ffdhe6144,
    Ffdhe8192,
}

/// `rpc_bdev_nvme_options_decoders`, with SPDK's JSON types.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Decoded as SPDK decodes them; only some are modelled.
struct SetOptionsParams {
    action_on_timeout: Option<ActionOnTimeout>,
    timeout_us: Option<u64>,
    timeout_admin_us: Option<u64>,
    keep_alive_timeout_ms: Option<u32>,
    arbitration_burst: Option<u32>,
    low_priority_weight: Option<u32>,
    medium_priority_weight: Option<u32>,
    high_priority_weight: Option<u32>,
    nvme_adminq_poll_period_us: Option<u64>,
    nvme_ioq_poll_period_us: Option<u64>,
    io_queue_requests: Option<u32>,
    delay_cmd_submit: Option<bool>,
    transport_retry_count: Option<u32>,
    bdev_retry_count: Option<i32>,
    transport_ack_timeout: Option<u8>,
    ctrlr_loss_timeout_sec: Option<i32>,
    reconnect_delay_sec: Option<u32>,
    fast_io_fail_timeout_sec: Option<u32>,
    disable_auto_failback: Option<bool>,
    generate_uuids: Option<bool>,
    transport_tos: Option<u8>,
    nvme_error_stat: Option<bool>,
    rdma_srq_size: Option<u32>,
    io_path_stat: Option<bool>,
    allow_accel_sequence: Option<bool>,
    rdma_max_cq_size: Option<u32>,
    rdma_cm_event_timeout_ms: Option<u16>,
    dhchap_digests: Option<Vec<Digest>>,
    dhchap_dhgroups: Option<Vec<DhGroup>>,
}

/// The options `params` make of `current`, checked (`bdev_nvme_validate_opts`,
/// then: refused with -EPERM while any controller exists, `controllers`).
pub(super) fn set_options(
    current: &NvmeOpts,
    params: Option<Value>,
    controllers: bool,
) -> Result<NvmeOpts, RpcError> {
    let p: SetOptionsParams = decode_opt(params, OnDecodeError::DecodeFailed)?;
    // SPDK decodes arrays of at most 32 entries.
    if [
        p.dhchap_digests.as_ref().map(Vec::len),
        p.dhchap_dhgroups.as_ref().map(Vec::len),
    ]
    .into_iter()
    .flatten()
    .any(|n| n > 32)
    {
        return Err(RpcError::decode_failed());
    }
    let mut opts = *current;
    opts.timeout_us = p.timeout_us.unwrap_or(opts.timeout_us);
    opts.timeout_admin_us = p.timeout_admin_us.unwrap_or(opts.timeout_admin_us);
    opts.bdev_retry_count = p.bdev_retry_count.unwrap_or(opts.bdev_retry_count);
    opts.keep_alive_timeout_ms = p
        .keep_alive_timeout_ms
        .unwrap_or(opts.keep_alive_timeout_ms);
    opts.transport_ack_timeout = p
        .transport_ack_timeout
        .unwrap_or(opts.transport_ack_timeout);
    opts.ctrlr_loss_timeout_sec = p
        .ctrlr_loss_timeout_sec
        .unwrap_or(opts.ctrlr_loss_timeout_sec);
    opts.reconnect_delay_sec = p.reconnect_delay_sec.unwrap_or(opts.reconnect_delay_sec);
    opts.fast_io_fail_timeout_sec = p
        .fast_io_fail_timeout_sec
        .unwrap_or(opts.fast_io_fail_timeout_sec);
    let valid = !(opts.timeout_us == 0 && opts.timeout_admin_us != 0)
        && opts.bdev_retry_count >= -1
        && resilience_of(
            opts.ctrlr_loss_timeout_sec,
            opts.reconnect_delay_sec,
            opts.fast_io_fail_timeout_sec,
        )
        .is_ok();
    if !valid {
        return Err(RpcError::errno(EINVAL));
    }
    if controllers {
        return Err(RpcError::new(
            -EPERM,
            "RPC not permitted with nvme controllers already attached",
        ));
    }
    Ok(opts)
}

/// `bdev_nvme_check_io_error_resiliency_params`, for an attach and for
/// these options: the reconnect policy of `ctrlr_loss_timeout_sec`,
/// `reconnect_delay_sec` and `fast_io_fail_timeout_sec`, if it is one
/// (else -EINVAL).
pub(super) fn resilience_of(loss: i32, delay: u32, fast: u32) -> Result<Resilience, RpcError> {
    let valid = match loss {
        ..-1 => false,
        -1 => delay != 0 && (fast == 0 || fast >= delay),
        0 => delay == 0 && fast == 0,
        _ => {
            let loss = loss.unsigned_abs();
            delay != 0 && delay <= loss && (fast == 0 || (fast >= delay && fast <= loss))
        }
    };
    if !valid {
        return Err(RpcError::errno(EINVAL));
    }
    let secs = |s: u32| Duration::from_secs(u64::from(s));
    Ok(Resilience {
        reconnect_delay: secs(delay),
        ctrlr_loss: u32::try_from(loss).ok().map(secs),
        fast_io_fail: (fast != 0).then(|| secs(fast)),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn set(current: &NvmeOpts, params: Value, controllers: bool) -> Result<NvmeOpts, RpcError> {
        set_options(current, Some(params), controllers)
    }

    #[test]
    fn the_ack_timeout_is_taken_before_any_controller_and_refused_after() {
        let opts = set(
            &NvmeOpts::default(),
            json!({"transport_ack_timeout": 8}),
            false,
        )
        .unwrap();
        assert_eq!(opts.transport_ack_timeout, 8);
        assert_eq!(opts.ack_timeout().get(), Some(Duration::from_millis(256)));
        assert_eq!(opts.keep_alive(), Some(Duration::from_secs(5)));
        let refused = set(&opts, json!({"transport_ack_timeout": 9}), true).unwrap_err();
        assert_eq!(
            refused,
            RpcError::new(
                -1,
                "RPC not permitted with nvme controllers already attached"
            )
        );
        // A uint8: 255 taken (a TCP controller caps it at 31), 256 not decoded.
        let most = set(&opts, json!({"transport_ack_timeout": 255}), false).unwrap();
        assert_eq!(
            most.ack_timeout().get(),
            Some(Duration::from_millis(1 << 31))
        );
        for bad in [json!(256), json!(-1), json!("8")] {
            let e = set(&opts, json!({"transport_ack_timeout": bad}), false).unwrap_err();
            assert_eq!(e, RpcError::decode_failed(), "{bad}");
        }
        assert_eq!(
            set(&opts, json!({"transport_ack_timeout": 0}), false)
                .unwrap()
                .ack_timeout()
                .get(),
            None
        );
    }

    #[test]
    fn checks_come_before_the_refusal_and_keep_spdk_order() {
        let opts = NvmeOpts::default();
        for bad in [
            json!({"timeout_admin_us": 5}),
            json!({"bdev_retry_count": -2}),
            json!({"reconnect_delay_sec": 1}),
            json!({"ctrlr_loss_timeout_sec": -1}),
        ] {
            for controllers in [false, true] {
                let e = set(&opts, bad.clone(), controllers).unwrap_err();
                assert_eq!(e, RpcError::errno(EINVAL), "{bad}");
            }
        }
        for bad in [
            json!({"x": 1}),
            json!({"action_on_timeout": "later"}),
            json!({"dhchap_digests": ["md5"]}),
        ] {
            assert_eq!(
                set(&opts, bad.clone(), false).unwrap_err(),
                RpcError::decode_failed(),
                "{bad}"
            );
        }
        assert_eq!(set_options(&opts, None, false).unwrap(), opts);
        let policy = json!({"ctrlr_loss_timeout_sec": -1, "reconnect_delay_sec": 1,
            "action_on_timeout": "reset", "timeout_us": 10, "dhchap_dhgroups": ["null"]});
        let set = set(&opts, policy, false).unwrap();
        assert_eq!(
            (set.ctrlr_loss_timeout_sec, set.reconnect_delay_sec),
            (-1, 1)
        );
    }
}
