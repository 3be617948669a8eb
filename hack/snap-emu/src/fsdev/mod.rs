//! SPDK's aio fsdev module (`module/fsdev/aio`): `fsdev_aio_create` exposes a
//! directory of this machine as an fsdev, `fsdev_aio_delete` unregisters it.
//! Checks, their order and their answers are SPDK v24.09's
//! (`fsdev_aio_rpc.c`, `spdk_fsdev_aio_create`, `spdk_fsdev_unregister_by_name`):
//! params that do not decode get -32602 "spdk_json_decode_object failed";
//! the root is opened first (`O_PATH`, so a missing one is -32603 "No such
//! file or directory", and a regular file is accepted, as SPDK accepts it),
//! then the name is registered (-32603 "File exists"); deleting a name that
//! is not an fsdev is -19 "No such device".
//!
//! SPDK v24.09 lists fsdevs nowhere but in `framework_get_config` of the
//! `fsdev` subsystem (`lib/fsdev/fsdev.c`: the layer's options, then one
//! `fsdev_aio_create` per fsdev in registration order), so this family
//! answers that method too, for that subsystem only: the emulator does not
//! keep the others' configuration, and says so rather than answering with an
//! empty one.

pub(crate) mod nfs;
pub(crate) mod registry;

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::fcntl::OFlag;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::bdev::registry::io_error;
use crate::registry::{Answer, BdevModule, BdevUser, Cx, Family};
use crate::rpc::{ENODEV, OnDecodeError, RpcError, RpcResult, decode};
use registry::Fsdev;

const CREATE: &str = "fsdev_aio_create";
const DELETE: &str = "fsdev_aio_delete";
const GET_CONFIG: &str = "framework_get_config";
/// The fsdev layer's options as `spdk_tgt` starts with them
/// (`SPDK_FSDEV_IO_POOL_SIZE`, `SPDK_FSDEV_IO_CACHE_SIZE`).
const IO_POOL_SIZE: u32 = 64 * 1024 - 1;
const IO_CACHE_SIZE: u32 = 256;
/// `fsdev_aio.c`'s `DEFAULT_WRITEBACK_CACHE` and `DEFAULT_MAX_WRITE`.
const DEFAULT_WRITEBACK_CACHE: bool = true;
const DEFAULT_MAX_WRITE: u32 = 0x0002_0000;
/// The subsystems `spdk_tgt` has besides `fsdev`, whose configuration the
/// emulator does not keep.
const OTHER_SUBSYSTEMS: &[&str] = &[
    "accel",
    "bdev",
    "iobuf",
    "iscsi",
    "keyring",
    "nbd",
    "nvmf",
    "scheduler",
    "scsi",
    "sock",
    "ublk",
    "vfio_user_target",
    "vhost_blk",
    "vhost_scsi",
    "vmd",
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateParams {
    name: String,
    root_path: String,
    #[serde(default)]
    enable_xattr: bool,
    /// Kept by SPDK for the FUSE session it negotiates; the emulator's host
    /// mount never caches writes (see `datapath::passthrough`), and only
    /// writes them back in the configuration.
    #[serde(default)]
    enable_writeback_cache: Option<bool>,
    #[serde(default)]
    max_write: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeleteParams {
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GetConfigParams {
    name: String,
}

/// The aio fsdev module.
#[derive(Debug, Default)]
pub(crate) struct FsdevAio;

impl FsdevAio {
    fn create(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        let p: CreateParams = decode(params, OnDecodeError::InvalidParams)
            .map_err(|_| RpcError::invalid_params_msg("spdk_json_decode_object failed"))?;
        let failed = |e: std::io::Error| RpcError::internal(io_error(&e).message);
        let root = Path::new(&p.root_path);
        File::options()
            .read(true)
            // As SPDK opens it: any file type, no access check.
            .custom_flags(OFlag::O_PATH.bits())
            .open(root)
            .map_err(failed)?;
        if p.enable_xattr {
            // SPDK v24.09 refuses xattrs with rc 0 and then answers with an
            // fsdev it never made (see the crate docs); the emulator refuses
            // plainly.
            return Err(RpcError::internal("Operation not supported"));
        }
        let root = std::fs::canonicalize(root).map_err(failed)?;
        cx.fsdevs
            .register(Fsdev {
                name: p.name.clone(),
                root,
                method: CREATE,
                params: json!({
                    "name": p.name,
                    "root_path": p.root_path,
                    "enable_xattr": false,
                    "enable_writeback_cache":
                        p.enable_writeback_cache.unwrap_or(DEFAULT_WRITEBACK_CACHE),
                    "max_write": p.max_write.unwrap_or(DEFAULT_MAX_WRITE),
                }),
            })
            .map_err(|e| RpcError::internal(e.message))?;
        Ok(json!(p.name))
    }

    fn delete(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        delete(self, CREATE, params, cx)
    }

    /// `framework_get_config`, as `subsystem_rpc.c` answers it.
    fn get_config(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        let p: GetConfigParams = decode(params, OnDecodeError::InvalidParams)
            .map_err(|_| RpcError::invalid_params_msg("Invalid arguments"))?;
        if OTHER_SUBSYSTEMS.contains(&p.name.as_str()) {
            return Err(RpcError::internal(format!(
                "the emulator does not keep subsystem '{}''s configuration",
                p.name
            )));
        }
        if p.name != "fsdev" {
            return Err(RpcError::invalid_params_msg(format!(
                "Subsystem '{}' not found",
                p.name
            )));
        }
        let options = json!({
            "method": "fsdev_set_opts",
            "params": {"fsdev_io_pool_size": IO_POOL_SIZE, "fsdev_io_cache_size": IO_CACHE_SIZE},
        });
        let fsdevs = cx
            .fsdevs
            .iter()
            .map(|f| json!({"method": f.method, "params": f.params}));
        Ok(Value::Array(
            std::iter::once(options).chain(fsdevs).collect(),
        ))
    }
}

/// A module's delete: `spdk_fsdev_unregister_by_name` with the module, so a
/// name that is not one of `created_by`'s fsdevs is -19 "No such device".
pub(crate) fn delete(
    module: &mut dyn Family,
    created_by: &str,
    params: Option<Value>,
    cx: &mut Cx<'_>,
) -> RpcResult {
    let p: DeleteParams = decode(params, OnDecodeError::InvalidParams)
        .map_err(|_| RpcError::invalid_params_msg("spdk_json_decode_object failed"))?;
    if cx
        .fsdevs
        .get(&p.name)
        .is_none_or(|f| f.method != created_by)
    {
        return Err(RpcError::errno(ENODEV));
    }
    cx.unregister_fsdev(module, &p.name);
    Ok(json!(true))
}

impl Family for FsdevAio {
    fn methods(&self) -> Vec<&'static str> {
        vec![CREATE, DELETE, GET_CONFIG]
    }

    fn call(&mut self, method: &str, params: Option<Value>, cx: &mut Cx<'_>) -> Answer {
        match method {
            CREATE => self.create(params, cx),
            DELETE => self.delete(params, cx),
            GET_CONFIG => self.get_config(params, cx),
            _ => Err(RpcError::method_not_found()),
        }
        .map(Into::into)
    }
}

impl BdevModule for FsdevAio {}

impl BdevUser for FsdevAio {}
