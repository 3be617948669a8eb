//! SPDK's aio fsdev module (`module/fsdev/aio`): `fsdev_aio_create` exposes a
//! directory of this machine as an fsdev, `fsdev_aio_delete` unregisters it.
//! Checks, their order and their answers are SPDK v24.09's
//! (`fsdev_aio_rpc.c`, `spdk_fsdev_aio_create`, `spdk_fsdev_unregister_by_name`):
//! params that do not decode get -32602 "spdk_json_decode_object failed";
//! the root is opened first (`O_PATH`, so a missing one is -32603 "No such
//! file or directory", and a regular file is accepted, as SPDK accepts it),
//! then the name is registered (-32603 "File exists"); deleting a name that
//! is not an fsdev is -19 "No such device".

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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateParams {
    name: String,
    root_path: String,
    #[serde(default)]
    enable_xattr: bool,
    /// Kept by SPDK for the FUSE session it negotiates; the emulator's host
    /// mount never caches writes (see `datapath::passthrough`).
    #[serde(default, rename = "enable_writeback_cache")]
    _writeback_cache: Option<bool>,
    #[serde(default, rename = "max_write")]
    _max_write: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteParams {
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
                root_path: p.root_path,
                root,
            })
            .map_err(|e| RpcError::internal(e.message))?;
        Ok(json!(p.name))
    }

    fn delete(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        let p: DeleteParams = decode(params, OnDecodeError::InvalidParams)
            .map_err(|_| RpcError::invalid_params_msg("spdk_json_decode_object failed"))?;
        if cx.fsdevs.get(&p.name).is_none() {
            return Err(RpcError::errno(ENODEV));
        }
        cx.unregister_fsdev(self, &p.name);
        Ok(json!(true))
    }
}

impl Family for FsdevAio {
    fn methods(&self) -> Vec<&'static str> {
        vec![CREATE, DELETE]
    }

    fn call(&mut self, method: &str, params: Option<Value>, cx: &mut Cx<'_>) -> Answer {
        match method {
            CREATE => self.create(params, cx),
            DELETE => self.delete(params, cx),
            _ => Err(RpcError::method_not_found()),
        }
        .map(Into::into)
    }
}

impl BdevModule for FsdevAio {}

impl BdevUser for FsdevAio {}
