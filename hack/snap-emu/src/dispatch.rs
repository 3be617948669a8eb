//! From a request's bytes to its reply: which methods exist (SPDK's
//! framework methods, answered here, and every family's), in which state
//! they may be called, and which family answers them, under the faults a
//! test switched on.

use std::path::PathBuf;
use std::sync::Arc;

use json_framing::JsonFramer;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::bdev::crypto::Crypto;
use crate::bdev::info::Info;
use crate::bdev::iostat::Iostat;
use crate::bdev::lvol::Lvols;
use crate::bdev::modules::Modules;
use crate::bdev::nvme::NvmeInitiator;
use crate::bdev::qos::QosLimits;
use crate::faults::{Admit, Faults};
use crate::framing::{self, Frame, to_json};
use crate::fsdev::FsdevAio;
use crate::fsdev::nfs::FsdevNfs;
use crate::nvmf::target::NvmfTarget;
use crate::registry::{Family, Reply, Shared};
use crate::rpc::{OnDecodeError, Rendered, RpcError, RpcResult, decode_opt, no_params};
use crate::snap::Snap;

/// SPDK's framework methods (`lib/event`, `lib/rpc`), which need no family.
const FRAMEWORK: &[&str] = &[
    "framework_start_init",
    "framework_wait_init",
    "rpc_get_methods",
    "spdk_get_version",
];

/// Registered with SPDK_RPC_STARTUP only: refused once the framework runs,
/// which in an emulator is always.
const STARTUP_ONLY: &[&str] = &["framework_start_init"];

const NOT_IN_STARTUP: &str = "Method may only be called before framework is initialized. \
Use --wait-for-rpc command line parameter and then issue this RPC before the framework_start_init RPC.";

/// Every family the dispatcher routes to, in the order the bdev layer's
/// callbacks visit them (see `crate::registry`): the modules that make
/// bdevs before those that use them. `files_dir` is where the modules keep
/// their files, `stores_dir` where lvol stores keep theirs across restarts;
/// `snap` is SNAP, unless the emulator is a plain `spdk_tgt`.
pub(crate) fn families(
    files_dir: PathBuf,
    stores_dir: PathBuf,
    snap: Option<Snap>,
) -> Vec<Box<dyn Family>> {
    let mut families: Vec<Box<dyn Family>> = vec![
        Box::new(Modules::new(files_dir.clone())),
        Box::new(Crypto::default()),
        Box::new(Lvols::new(stores_dir)),
        Box::new(NvmeInitiator::new()),
        Box::new(NvmfTarget::default()),
        Box::new(QosLimits),
        Box::new(Iostat::new()),
        Box::new(Info),
        Box::new(FsdevAio),
    ];
    if let Some(snap) = snap {
        // DOCA SNAP's NFS fsdev comes with SNAP, not with SPDK.
        families.push(Box::new(FsdevNfs));
        families.push(Box::new(snap));
    }
    families
}

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
    if FRAMEWORK.contains(&method) {
        return framework(shared, method, params).map(|v| to_json(&v));
    }
    let Some(route) = shared.route(method) else {
        return Err(RpcError::method_not_found());
    };
    let reply = if route.read {
        shared.state.lock().await.call(route, method, params)
    } else {
        let mut state = shared.state.clone().lock_owned().await;
        let method = method.to_owned();
        // The host side blocks (losetup, fsync): keep it off the async workers.
        tokio::task::spawn_blocking(move || state.call(route, &method, params))
            .await
            .unwrap_or_else(|_| Err(RpcError::internal("handler failed")))
    };
    match reply? {
        Reply::Value(v) => Ok(to_json(&v)),
        Reply::Json(json) => Ok(json),
        Reply::Later(rest) => rest.await.map(|v| to_json(&v)),
    }
}

fn framework(shared: &Shared, method: &str, params: Option<Value>) -> RpcResult {
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
        "framework_start_init" => Err(RpcError::new(-1, NOT_IN_STARTUP)),
        "rpc_get_methods" => rpc_get_methods(shared, params),
        _ => Err(RpcError::method_not_found()),
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
    let mut names: Vec<&str> = FRAMEWORK
        .iter()
        .chain(shared.listed())
        .copied()
        .filter(|m| !(p.current && STARTUP_ONLY.contains(m)))
        .collect();
    names.sort_unstable();
    Ok(json!(names))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FunctionLayout;
    use crate::datapath::DataPathMode;
    use crate::snap::model::Functions;
    use crate::snap_api as api;

    fn shared(dir: &std::path::Path) -> Arc<Shared> {
        let snap = Snap::new(
            Functions::new(
                FunctionLayout::default(),
                crate::config::Config::new("s", "d").buses(),
            ),
            None,
            DataPathMode::default(),
        );
        Shared::new(
            families(dir.to_owned(), dir.join("lvstores"), Some(snap)),
            dir.to_owned(),
        )
    }

    /// What `rpc_get_methods` listed when one table held every method: no
    /// family may lose one.
    #[test]
    fn the_families_answer_every_method_there_was() {
        let dir = tempfile::tempdir().unwrap();
        let shared = shared(dir.path());
        let spdk = [
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
            "bdev_nvme_get_io_paths",
            "bdev_nvme_set_multipath_policy",
            "bdev_nvme_set_options",
            "bdev_set_qos_limit",
            "bdev_wait_for_examine",
            "framework_get_config",
            "framework_start_init",
            "framework_wait_init",
            "fsdev_aio_create",
            "fsdev_aio_delete",
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
        let snap = [
            api::EMULATION_FUNCTION_LIST,
            api::NVME_SUBSYSTEM_CREATE,
            api::NVME_SUBSYSTEM_DESTROY,
            api::NVME_SUBSYSTEM_LIST,
            api::NVME_NAMESPACE_CREATE,
            api::NVME_NAMESPACE_DESTROY,
            api::NVME_CONTROLLER_CREATE,
            api::NVME_CONTROLLER_DESTROY,
            api::NVME_CONTROLLER_LIST,
            api::NVME_CONTROLLER_ATTACH_NS,
            api::NVME_CONTROLLER_DETACH_NS,
            api::NVME_CONTROLLER_RESUME,
            api::NVME_CONTROLLER_SUSPEND,
            api::NVME_CONTROLLER_HOTPLUG,
            api::NVME_CONTROLLER_HOTUNPLUG,
            api::NVME_FUNCTION_CREATE,
            api::NVME_FUNCTION_DESTROY,
            api::VIRTIO_BLK_FUNCTION_CREATE,
            api::VIRTIO_BLK_FUNCTION_DESTROY,
            api::VIRTIO_BLK_CONTROLLER_CREATE,
            api::VIRTIO_BLK_CONTROLLER_DESTROY,
            api::VIRTIO_BLK_CONTROLLER_LIST,
            api::VIRTIO_BLK_CONTROLLER_BDEV_ATTACH,
            api::VIRTIO_BLK_CONTROLLER_BDEV_DETACH,
            api::VIRTIO_BLK_CONTROLLER_HOTPLUG,
            api::VIRTIO_BLK_CONTROLLER_HOTUNPLUG,
            api::VIRTIO_BLK_CONTROLLER_SUSPEND,
            api::VIRTIO_BLK_CONTROLLER_RESUME,
            api::VIRTIO_FS_GET_TRANSPORTS,
            api::VIRTIO_FS_TRANSPORT_CREATE,
            api::VIRTIO_FS_TRANSPORT_START,
            api::VIRTIO_FS_DOCA_GET_MANAGERS,
            api::VIRTIO_FS_DOCA_MANAGER_CREATE,
            api::VIRTIO_FS_DOCA_FUNCTION_CREATE,
            api::VIRTIO_FS_DOCA_GET_FUNCTIONS,
            api::VIRTIO_FS_DOCA_FUNCTION_DESTROY,
            api::VIRTIO_FS_DEVICE_CREATE,
            api::VIRTIO_FS_DOCA_DEVICE_MODIFY,
            api::VIRTIO_FS_DEVICE_START,
            api::VIRTIO_FS_DEVICE_STOP,
            api::VIRTIO_FS_DOCA_DEVICE_HOTPLUG,
            api::VIRTIO_FS_DOCA_DEVICE_HOTUNPLUG,
            api::VIRTIO_FS_DEVICE_DESTROY,
            api::VIRTIO_FS_GET_DEVICES,
            api::FSDEV_NFS_CREATE,
            api::FSDEV_NFS_DELETE,
        ];
        let mut expected: Vec<&str> = spdk.iter().chain(snap.iter()).copied().collect();
        expected.sort_unstable();
        let listed = rpc_get_methods(&shared, None).unwrap();
        assert_eq!(listed, json!(expected));
        // Unlisted, but answered: the emulator's own knobs.
        for knob in [
            api::NVME_CONTROLLER_EMU_RENAME,
            api::VIRTIO_BLK_CONTROLLER_EMU_RENAME,
        ] {
            assert!(!expected.contains(&knob));
            assert!(shared.route(knob).is_some(), "{knob} is routed");
        }
    }

    /// A method a family declares but does not route would answer "Method
    /// not found" from its family.
    #[test]
    fn every_routed_method_reaches_its_handler() {
        let dir = tempfile::tempdir().unwrap();
        let shared = shared(dir.path());
        let mut state = shared.state.try_lock().unwrap();
        let mut methods: Vec<&str> = shared.listed().to_vec();
        methods.extend([
            api::NVME_CONTROLLER_EMU_RENAME,
            api::VIRTIO_BLK_CONTROLLER_EMU_RENAME,
        ]);
        for method in methods {
            let route = shared.route(method).unwrap();
            // Without params most refuse to decode; none may be unknown.
            if let Err(e) = state.call(route, method, None) {
                assert_ne!(e.code, -32601, "{method} is not routed");
            }
        }
    }
}
