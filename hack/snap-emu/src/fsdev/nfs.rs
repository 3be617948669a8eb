//! DOCA SNAP's NFS fsdev, which SPDK v24.09 does not have: an fsdev serving
//! an NFS export through SNAP's own user-space NFS client (no kernel mount
//! on the DPU). `fsdev_nfs_create {name, server, exportname}` and
//! `fsdev_nfs_delete {name}`, as NVIDIA's DPF storage plugin calls them
//! (`docs/virtio-fs.md`); in the `fsdev` subsystem's configuration it is
//! written back as the same call.
//!
//! A directory of this machine stands in for the export: `exportname` is
//! served from that path here, whoever `server` names (on one machine the
//! NFS server's export and its directory are the same tree). What this does
//! not prove: SNAP's NFS client (mounting, its errors, its caching). The
//! answers for what DOCA does not document are the aio module's: an export
//! that is not a directory here is -32603 "No such file or directory" (or
//! "Not a directory"), a taken name -32603 "File exists", deleting a name
//! that is not an NFS fsdev -19. Only SNAP has this family (a plain
//! `spdk_tgt` emulator answers "Method not found", as SPDK v24.09 does).

use serde::Deserialize;
use serde_json::{Value, json};

use super::registry::Fsdev;
use crate::bdev::registry::io_error;
use crate::registry::{Answer, BdevModule, BdevUser, Cx, Family};
use crate::rpc::{OnDecodeError, RpcError, RpcResult, decode};

use crate::snap_api::{FSDEV_NFS_CREATE as CREATE, FSDEV_NFS_DELETE as DELETE};

#[derive(Debug, Deserialize)]
struct CreateParams {
    name: String,
    server: String,
    exportname: String,
}

/// The NFS fsdev module.
#[derive(Debug, Default)]
pub(crate) struct FsdevNfs;

impl FsdevNfs {
    fn create(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        let p: CreateParams = decode(params, OnDecodeError::InvalidParams)
            .map_err(|_| RpcError::invalid_params_msg("spdk_json_decode_object failed"))?;
        let failed = |e: std::io::Error| RpcError::internal(io_error(&e).message);
        let root = std::fs::canonicalize(&p.exportname).map_err(failed)?;
        if !root.is_dir() {
            return Err(RpcError::internal("Not a directory"));
        }
        cx.fsdevs
            .register(Fsdev {
                name: p.name.clone(),
                root,
                method: CREATE,
                params: json!({"name": p.name, "server": p.server, "exportname": p.exportname}),
            })
            .map_err(|e| RpcError::internal(e.message))?;
        Ok(json!(p.name))
    }
}

impl Family for FsdevNfs {
    fn methods(&self) -> Vec<&'static str> {
        vec![CREATE, DELETE]
    }

    fn call(&mut self, method: &str, params: Option<Value>, cx: &mut Cx<'_>) -> Answer {
        match method {
            CREATE => self.create(params, cx),
            DELETE => super::delete(self, CREATE, params, cx),
            _ => Err(RpcError::method_not_found()),
        }
        .map(Into::into)
    }
}

impl BdevModule for FsdevNfs {}

impl BdevUser for FsdevNfs {}
