//! SNAP-4 emulation, split along the seam the node has: SNAP's model of its
//! PCI functions (`model`), what the host can see of them (`visible`, over
//! the host side), one file per emulation (`nvme`: subsystems, namespaces
//! and NVMe controllers; `virtio_blk`: virtio-blk controllers; `virtio_fs`:
//! virtio-fs transports, managers and devices serving fsdevs), each behind
//! [`emulation::Emulation`], and hot-plug, which every emulation's
//! controllers share (`hotplug`). `crate::snap_api` knows SNAP's JSON names.
//!
//! Adding an emulation is a file here implementing `Emulation` (its
//! controllers, its methods routed to the shared steps) and its line in
//! [`Snap::new`]; its names go in `snap_api` beside the others.
//!
//! Error codes. The reference gives none for SNAP methods, so these are
//! inferred, SPDK-style negative errnos:
//! - parameters that do not decode: -32603 "spdk_json_decode_object failed";
//! - unknown subsystem, namespace, controller, function or bdev: -19 (ENODEV);
//! - creating something that exists (subsystem NQN, NSID, controller name,
//!   attaching a namespace twice to the same controller, plugging a plugged
//!   function, attaching a bdev to a virtio-blk controller that has one): -17 (EEXIST);
//! - a function that already carries a controller, a namespace attached to
//!   another controller, destroying a subsystem, controller or function that is
//!   still in use (without `force` where SNAP has it): -16 (EBUSY);
//! - a bdev claimed by another module (nvmf namespace, lvol store): -1 (EPERM),
//!   as `spdk_bdev_open_ext` for writing answers;
//! - invalid values (bad selector, NSID out of range, bad UUID, `bdev_type`
//!   other than "spdk", hot-plug calls on static functions, a serial longer
//!   than 20 bytes, namespaces on an admin-only controller): -22 (EINVAL);
//! - a subsystem already holding `mnan` namespaces: -28 (ENOSPC);
//! - the host side refusing a disk before queueing its attach: -5 (EIO), its
//!   reason after the strerror text. An attach that fails later is logged;
//!   SNAP's state keeps the namespace attached, as SNAP knows nothing of the
//!   host's driver.

pub(crate) mod emulation;
pub(crate) mod hotplug;
pub(crate) mod model;
pub(crate) mod nvme;
pub(crate) mod virtio_blk;
pub(crate) mod virtio_fs;
pub(crate) mod visible;

use std::sync::Arc;

use serde_json::Value;

use crate::bdev::registry::{Bdev, Bdevs};
use crate::datapath::DataPathMode;
use crate::framing::to_json;
use crate::fsdev::registry::Fsdev;
use crate::host::{BlockStat, DiskRef, Host};
use crate::registry::{Answer, BdevModule, BdevUser, Cx, Family, Reply};
use crate::rpc::{OnDecodeError, RpcError, decode_opt};
use crate::snap_api as api;
use emulation::{Emulation, SnapCx};
use model::Functions;
use nvme::Nvme;
use virtio_blk::VirtioBlk;
use virtio_fs::VirtioFs;
use visible::Visible;

/// SNAP: its functions, the host side, and its emulations.
#[derive(Debug)]
pub(crate) struct Snap {
    functions: Functions,
    visible: Visible,
    emulations: Vec<Box<dyn Emulation>>,
}

impl Snap {
    /// SNAP over `functions`, showing its disks on `host` (none: no host
    /// side) through the data path as `data_path` says.
    pub(crate) fn new(
        functions: Functions,
        host: Option<Arc<dyn Host>>,
        data_path: DataPathMode,
    ) -> Self {
        Self {
            functions,
            visible: Visible::new(host, data_path),
            emulations: vec![
                Box::new(Nvme::default()),
                Box::new(VirtioBlk::default()),
                Box::new(VirtioFs::default()),
            ],
        }
    }

    fn emulation_function_list(&self, params: Option<Value>) -> Answer {
        let p: api::FunctionListParams = decode_opt(params, OnDecodeError::DecodeFailed)?;
        let fns = &self.functions;
        let out = fns
            .iter()
            // virtio-fs functions are its manager's (`virtio_fs_doca_get_functions`).
            .filter(|f| f.is_pf() && f.emulation != api::Emulation::VirtioFs)
            .map(|pf| {
                let vfs = fns
                    .iter()
                    .filter(|f| {
                        !f.is_pf()
                            && f.emulation == pf.emulation
                            && f.pf_index == pf.pf_index
                            && (p.all || f.ctrl_id.is_some())
                    })
                    .map(|vf| api::function_json(vf.view(), None))
                    .collect();
                api::function_json(pf.view(), Some(vfs))
            })
            .collect::<Vec<_>>();
        Ok(Reply::Json(to_json(&out)))
    }

    /// The host disks that show `bdev`, in every emulation.
    fn disks_of(&self, bdev: &str) -> Vec<DiskRef> {
        self.emulations
            .iter()
            .flat_map(|e| e.disks_of(bdev))
            .collect()
    }
}

impl Family for Snap {
    fn methods(&self) -> Vec<&'static str> {
        let mut methods = vec![api::EMULATION_FUNCTION_LIST];
        for e in &self.emulations {
            methods.extend(e.methods());
        }
        methods
    }

    fn unlisted(&self) -> Vec<&'static str> {
        self.emulations
            .iter()
            .flat_map(|e| e.unlisted().iter().copied())
            .collect()
    }

    fn reads(&self) -> Vec<&'static str> {
        let mut reads = vec![api::EMULATION_FUNCTION_LIST];
        for e in &self.emulations {
            reads.extend(e.reads());
        }
        reads
    }

    fn call(&mut self, method: &str, params: Option<Value>, cx: &mut Cx<'_>) -> Answer {
        if method == api::EMULATION_FUNCTION_LIST {
            return self.emulation_function_list(params);
        }
        let e = self
            .emulations
            .iter_mut()
            .find(|e| e.methods().contains(&method) || e.unlisted().contains(&method))
            .ok_or_else(RpcError::method_not_found)?;
        let mut cx = SnapCx {
            functions: &mut self.functions,
            visible: &self.visible,
            spdk: cx,
        };
        e.call(method, params, &mut cx)
    }

    fn shutdown(&mut self) {
        self.visible.shutdown();
    }

    fn fsdev_removed(&mut self, fsdev: &Fsdev) {
        for e in &mut self.emulations {
            e.fsdev_removed(&fsdev.name, &self.visible);
        }
    }
}

impl BdevModule for Snap {}

impl BdevUser for Snap {
    /// A bdev is going away: SNAP's controllers let go of it first (hot
    /// remove), their disks leaving the host.
    fn release(&mut self, bdev: &Bdev, _bdevs: &mut Bdevs) {
        for e in &mut self.emulations {
            e.release(&bdev.name, &self.visible);
        }
    }

    /// Tells the host about a bdev whose size changed.
    fn resized(&mut self, bdev: &Bdev, bdevs: &Bdevs) {
        self.visible
            .resize(&self.disks_of(&bdev.name), &bdevs.backing_of(bdev));
    }

    /// SNAP holds the bdevs of its namespaces and controllers open for
    /// writing.
    fn writes(&self, bdev: &str) -> bool {
        self.emulations.iter().any(|e| e.writes(bdev))
    }

    /// And does their I/O on its threads, named here as an SPDK
    /// application's first (SNAP's own are not public).
    fn io_channel(&self, bdev: &str) -> Option<&'static str> {
        self.writes(bdev).then_some("app_thread")
    }

    fn host_io(&self, bdev: &str) -> BlockStat {
        self.visible.block_stat(&self.disks_of(bdev))
    }
}
