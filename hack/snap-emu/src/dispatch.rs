//! From a request's bytes to its reply: the method table and routing (which
//! methods exist, in which state they may be called, and which handler
//! answers them), under the faults a test switched on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};

use json_framing::JsonFramer;
use serde_json::value::RawValue;

use crate::faults::{Admit, Faults};
use crate::framing::{self, Frame, to_json};
use crate::rpc::{
    ENODEV, ETIMEDOUT, OnDecodeError, Rendered, RpcError, RpcResult, decode_opt, no_params,
};
use crate::snap_api as api;
use crate::state::{Emulator, Shared};

/// The SPDK methods this emulator implements (a subset of spdk_tgt's).
const SPDK_METHODS: &[&str] = &[
    "accel_crypto_key_create",
    "accel_crypto_key_destroy",
    "accel_crypto_keys_get",
    "bdev_aio_create",
    "bdev_aio_delete",
    "bdev_aio_rescan",
    "bdev_crypto_create",
    "bdev_crypto_delete",
    "bdev_get_bdevs",
    "bdev_get_iostat",
    "bdev_lvol_clone",
    "bdev_lvol_create",
    "bdev_lvol_create_lvstore",
    "bdev_lvol_decouple_parent",
    "bdev_lvol_delete",
    "bdev_lvol_delete_lvstore",
    "bdev_lvol_get_lvols",
    "bdev_lvol_get_lvstores",
    "bdev_lvol_resize",
    "bdev_lvol_snapshot",
    "bdev_malloc_create",
    "bdev_malloc_delete",
    "bdev_null_create",
    "bdev_null_delete",
    "bdev_nvme_attach_controller",
    "bdev_nvme_detach_controller",
    "bdev_nvme_get_controllers",
    "bdev_set_qos_limit",
    "bdev_wait_for_examine",
    "framework_start_init",
    "framework_wait_init",
    "nvmf_create_subsystem",
    "nvmf_create_transport",
    "nvmf_delete_subsystem",
    "nvmf_get_subsystems",
    "nvmf_get_transports",
    "nvmf_subsystem_add_host",
    "nvmf_subsystem_add_listener",
    "nvmf_subsystem_add_ns",
    "nvmf_subsystem_allow_any_host",
    "nvmf_subsystem_pause",
    "nvmf_subsystem_remove_host",
    "nvmf_subsystem_remove_listener",
    "nvmf_subsystem_remove_ns",
    "nvmf_subsystem_resume",
    "rpc_get_methods",
    "spdk_get_version",
];

/// Registered with SPDK_RPC_STARTUP only: refused once the framework runs,
/// which in an emulator is always.
const STARTUP_ONLY: &[&str] = &["framework_start_init"];

const NOT_IN_STARTUP: &str = "Method may only be called before framework is initialized. \
Use --wait-for-rpc command line parameter and then issue this RPC before the framework_start_init RPC.";

/// How often `bdev_get_bdevs` with a timeout looks again for its bdev.
const BDEV_WAIT_STEP: Duration = Duration::from_millis(10);

fn is_known(shared: &Shared, method: &str) -> bool {
    SPDK_METHODS.contains(&method)
        || (shared.snap_enabled
            && (api::METHODS.contains(&method) || api::EMU_METHODS.contains(&method)))
}

/// SNAP's listings, serialised straight from the state (see `snap_api`).
const RENDERED: &[&str] = &[api::EMULATION_FUNCTION_LIST, api::NVME_SUBSYSTEM_LIST];

pub(crate) async fn answer(shared: &Arc<Shared>, raw: &str) -> Vec<u8> {
    match framing::parse_frame(raw) {
        Frame::Invalid { id } => framing::error_reply(id.as_deref(), &RpcError::invalid_request()),
        Frame::Call { id, method, params } => {
            tracing::debug!(%method, "rpc");
            match dispatch(shared, &method, params).await {
                Ok(body) => framing::result_reply(id.as_deref(), &body),
                Err(e) => {
                    tracing::debug!(%method, code = e.code, message = %e.message, "rpc failed");
                    framing::error_reply(id.as_deref(), &e)
                }
            }
        }
    }
}

/// Answers every whole request `framer` holds, in order, as `faults` admit
/// them; `true` with them when the stream holds what SPDK cannot parse, or
/// a fault garbled it, and must be closed.
pub(crate) async fn answer_framed(
    shared: &Arc<Shared>,
    faults: &Faults,
    framer: &mut JsonFramer,
) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    loop {
        match framer.next_decoded::<Box<RawValue>>() {
            Ok(Some((raw, _))) => match faults.admit().await {
                Admit::Answer => out.extend(answer(shared, raw.get()).await),
                Admit::Garbage => {
                    out.extend_from_slice(crate::faults::GARBAGE);
                    return (out, true);
                }
            },
            Ok(None) => return (out, false),
            Err(error) => {
                tracing::debug!(%error, "closing a connection that sent what SPDK cannot parse");
                return (out, true);
            }
        }
    }
}

/// Answers a call with its result serialised as SPDK would.
async fn dispatch(shared: &Arc<Shared>, method: &str, params: Option<Value>) -> Rendered {
    if !is_known(shared, method) {
        return Err(RpcError::method_not_found());
    }
    if STARTUP_ONLY.contains(&method) {
        return Err(RpcError::new(-1, NOT_IN_STARTUP));
    }
    if RENDERED.contains(&method) {
        // Pure reads of the state, a fraction of a millisecond: not worth a
        // trip to the blocking pool.
        return shared.state.lock().await.render(method, params);
    }
    dispatch_value(shared, method, params)
        .await
        .map(|v| to_json(&v))
}

async fn dispatch_value(shared: &Arc<Shared>, method: &str, params: Option<Value>) -> RpcResult {
    match method {
        "spdk_get_version" => {
            no_params(&params, method)?;
            Ok(json!({
                "version": "SPDK v24.09",
                "fields": {"major": 24, "minor": 9, "patch": 0, "suffix": ""}
            }))
        }
        // Always initialised here, so it answers at once, whatever the params.
        "framework_wait_init" => Ok(json!(true)),
        "bdev_wait_for_examine" => {
            if params.is_some() {
                return Err(RpcError::invalid_params_msg(format!(
                    "{method} requires no parameters"
                )));
            }
            Ok(json!(true))
        }
        "rpc_get_methods" => rpc_get_methods(shared, params),
        "bdev_nvme_attach_controller" => crate::bdev_nvme::attach_controller(shared, params).await,
        "bdev_get_bdevs" => get_bdevs_waiting(shared, params).await,
        _ => {
            let mut state = shared.state.clone().lock_owned().await;
            let method = method.to_owned();
            // The host side blocks (losetup, fsync): keep it off the async workers.
            tokio::task::spawn_blocking(move || state.call(&method, params))
                .await
                .unwrap_or_else(|_| Err(RpcError::internal("handler failed")))
        }
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct GetMethodsParams {
    #[serde(default)]
    current: bool,
    #[serde(default)]
    include_aliases: bool,
}

fn rpc_get_methods(shared: &Shared, params: Option<Value>) -> RpcResult {
    let p: GetMethodsParams = decode_opt(params, OnDecodeError::InvalidParams)?;
    // No deprecated aliases are registered, so include_aliases changes nothing.
    let _ = p.include_aliases;
    let mut names: Vec<&str> = SPDK_METHODS
        .iter()
        .copied()
        .filter(|m| !(p.current && STARTUP_ONLY.contains(m)))
        .collect();
    if shared.snap_enabled {
        names.extend(api::METHODS.iter().copied());
    }
    names.sort_unstable();
    Ok(json!(names))
}

/// `bdev_get_bdevs` with `name` and `timeout` waits for the bdev to appear;
/// one that does not appear in time is `-ETIMEDOUT`, not `-ENODEV`.
async fn get_bdevs_waiting(shared: &Arc<Shared>, params: Option<Value>) -> RpcResult {
    let timeout = params
        .as_ref()
        .and_then(|p| p.get("timeout"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let now = Instant::now();
    let deadline = now
        .checked_add(Duration::from_millis(timeout))
        .unwrap_or(now);
    loop {
        let r = shared.state.lock().await.bdev_get_bdevs(params.clone());
        match r {
            Err(e) if e.code == -ENODEV && Instant::now() < deadline => {
                tokio::time::sleep(BDEV_WAIT_STEP).await;
            }
            Err(e) if e.code == -ENODEV && timeout > 0 => return Err(RpcError::errno(ETIMEDOUT)),
            r => return r,
        }
    }
}

impl Emulator {
    /// Methods answered entirely under the state lock. A bdev a call made
    /// may be the base a pending crypto vbdev waits for: SPDK's examine.
    pub(crate) fn call(&mut self, method: &str, params: Option<Value>) -> RpcResult {
        let result = self.route(method, params);
        self.examine_crypto();
        result
    }

    fn route(&mut self, method: &str, params: Option<Value>) -> RpcResult {
        match method {
            "bdev_get_iostat" => self.bdev_get_iostat(params),
            "bdev_aio_create" => self.bdev_aio_create(params),
            "accel_crypto_key_create" => self.accel_crypto_key_create(params),
            "accel_crypto_key_destroy" => self.accel_crypto_key_destroy(params),
            "accel_crypto_keys_get" => self.accel_crypto_keys_get(params),
            "bdev_crypto_create" => self.bdev_crypto_create(params),
            "bdev_crypto_delete" => self.bdev_crypto_delete(params),
            "bdev_aio_delete" => self.bdev_aio_delete(params),
            "bdev_aio_rescan" => self.bdev_aio_rescan(params),
            "bdev_set_qos_limit" => self.bdev_set_qos_limit(params),
            "bdev_malloc_create" => self.bdev_malloc_create(params),
            "bdev_malloc_delete" => self.bdev_malloc_delete(params),
            "bdev_null_create" => self.bdev_null_create(params),
            "bdev_null_delete" => self.bdev_null_delete(params),
            "bdev_lvol_create_lvstore" => self.bdev_lvol_create_lvstore(params),
            "bdev_lvol_get_lvstores" => self.bdev_lvol_get_lvstores(params),
            "bdev_lvol_delete_lvstore" => self.bdev_lvol_delete_lvstore(params),
            "bdev_lvol_get_lvols" => self.bdev_lvol_get_lvols(params),
            "bdev_lvol_create" => self.bdev_lvol_create(params),
            "bdev_lvol_delete" => self.bdev_lvol_delete(params),
            "bdev_lvol_resize" => self.bdev_lvol_resize(params),
            "bdev_lvol_snapshot" => self.bdev_lvol_snapshot(params),
            "bdev_lvol_clone" => self.bdev_lvol_clone(params),
            "bdev_lvol_decouple_parent" => self.bdev_lvol_decouple_parent(params),
            "bdev_nvme_detach_controller" => self.bdev_nvme_detach_controller(params),
            "bdev_nvme_get_controllers" => self.bdev_nvme_get_controllers(params),
            "nvmf_create_transport" => self.nvmf_create_transport(params),
            "nvmf_get_transports" => self.nvmf_get_transports(params),
            "nvmf_create_subsystem" => self.nvmf_create_subsystem(params),
            "nvmf_delete_subsystem" => self.nvmf_delete_subsystem(params),
            "nvmf_get_subsystems" => self.nvmf_get_subsystems(params),
            "nvmf_subsystem_add_ns" => self.nvmf_subsystem_add_ns(params),
            "nvmf_subsystem_remove_ns" => self.nvmf_subsystem_remove_ns(params),
            "nvmf_subsystem_add_listener" => self.nvmf_subsystem_add_listener(params),
            "nvmf_subsystem_remove_listener" => self.nvmf_subsystem_remove_listener(params),
            "nvmf_subsystem_add_host" => self.nvmf_subsystem_add_host(params),
            "nvmf_subsystem_remove_host" => self.nvmf_subsystem_remove_host(params),
            "nvmf_subsystem_allow_any_host" => self.nvmf_subsystem_allow_any_host(params),
            "nvmf_subsystem_pause" => self.nvmf_subsystem_pause(params),
            "nvmf_subsystem_resume" => self.nvmf_subsystem_resume(params),
            api::NVME_SUBSYSTEM_CREATE => self.nvme_subsystem_create(params),
            api::NVME_SUBSYSTEM_DESTROY => self.nvme_subsystem_destroy(params),
            api::NVME_NAMESPACE_CREATE => self.nvme_namespace_create(params),
            api::NVME_NAMESPACE_DESTROY => self.nvme_namespace_destroy(params),
            api::NVME_CONTROLLER_CREATE => self.nvme_controller_create(params),
            api::NVME_CONTROLLER_DESTROY => self.nvme_controller_destroy(params),
            api::NVME_CONTROLLER_LIST => self.nvme_controller_list(params),
            api::NVME_CONTROLLER_ATTACH_NS => self.nvme_controller_attach_ns(params),
            api::NVME_CONTROLLER_DETACH_NS => self.nvme_controller_detach_ns(params),
            api::NVME_CONTROLLER_RESUME => self.nvme_controller_resume(params),
            api::NVME_CONTROLLER_SUSPEND => self.nvme_controller_suspend(params),
            api::NVME_CONTROLLER_HOTPLUG => self.nvme_controller_hotplug(params),
            api::NVME_CONTROLLER_HOTUNPLUG => self.nvme_controller_hotunplug(params),
            api::NVME_FUNCTION_CREATE => self.nvme_function_create(params),
            api::NVME_FUNCTION_DESTROY => self.nvme_function_destroy(params),
            api::VIRTIO_BLK_FUNCTION_CREATE => self.virtio_blk_function_create(params),
            api::VIRTIO_BLK_FUNCTION_DESTROY => self.virtio_blk_function_destroy(params),
            api::VIRTIO_BLK_CONTROLLER_CREATE => self.virtio_blk_controller_create(params),
            api::VIRTIO_BLK_CONTROLLER_DESTROY => self.virtio_blk_controller_destroy(params),
            api::VIRTIO_BLK_CONTROLLER_LIST => self.virtio_blk_controller_list(params),
            api::VIRTIO_BLK_CONTROLLER_BDEV_ATTACH => {
                self.virtio_blk_controller_bdev_attach(params)
            }
            api::VIRTIO_BLK_CONTROLLER_BDEV_DETACH => {
                self.virtio_blk_controller_bdev_detach(params)
            }
            api::VIRTIO_BLK_CONTROLLER_HOTPLUG => self.virtio_blk_controller_hotplug(params),
            api::VIRTIO_BLK_CONTROLLER_HOTUNPLUG => self.virtio_blk_controller_hotunplug(params),
            api::VIRTIO_BLK_CONTROLLER_SUSPEND => self.virtio_blk_controller_suspend(params),
            api::VIRTIO_BLK_CONTROLLER_RESUME => self.virtio_blk_controller_resume(params),
            api::NVME_CONTROLLER_EMU_RENAME => self.nvme_controller_emu_rename(params),
            api::VIRTIO_BLK_CONTROLLER_EMU_RENAME => self.virtio_blk_controller_emu_rename(params),
            _ => Err(RpcError::method_not_found()),
        }
    }
}

impl Emulator {
    /// The methods in `RENDERED`.
    fn render(&self, method: &str, params: Option<Value>) -> Rendered {
        match method {
            api::EMULATION_FUNCTION_LIST => self.emulation_function_list(params),
            api::NVME_SUBSYSTEM_LIST => self.nvme_subsystem_list(params),
            _ => Err(RpcError::method_not_found()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_snap_method_is_routed() {
        // A name in the table without a handler would answer "Method not found".
        let src = include_str!("dispatch.rs");
        for m in api::METHODS.iter().chain(api::EMU_METHODS) {
            let constant = api_const_name(m);
            assert!(
                src.contains(&format!("api::{constant} =>")),
                "{m} is not routed"
            );
        }
    }

    fn api_const_name(method: &str) -> String {
        method.to_ascii_uppercase()
    }

    #[test]
    fn method_table_is_sorted_and_unique() {
        let mut sorted = SPDK_METHODS.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted, SPDK_METHODS);
    }
}
