//! SNAP's virtio-blk emulation: a controller on a virtio-blk function
//! exposes at most one bdev, as the disk `vd<x>` with the controller's
//! serial (`vblk_id`). A disk takes the lowest free `virtio<N>` index and
//! the lowest free `vd<x>` name, as the kernel names them.

use serde_json::{Value, json};

use super::emulation::{Controllers, Emulation, SnapCx, open_for_write, resume, suspend};
use super::hotplug::{function_create, function_destroy, hotplug, hotunplug};
use super::model::{Functions, Selector};
use super::visible::{Visible, lowest_free};
use crate::host::DiskRef;
use crate::registry::Answer;
use crate::rpc::{
    EBUSY, EEXIST, EINVAL, ENODEV, OnDecodeError, RpcError, RpcResult, decode, decode_opt,
};
use crate::snap_api::{self as api, Emulation as Kind};

const DEFAULT_QUEUES: u32 = 4;
const DEFAULT_QUEUE_SIZE: u32 = 256;
const DEFAULT_SEG_MAX: u32 = 32;
const DEFAULT_SIZE_MAX: u32 = 65536;
/// VIRTIO_BLK_ID_BYTES: the serial the host reads is at most 20 bytes.
const ID_MAX: usize = 20;

const METHODS: &[&str] = &[
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
];

/// A controller's disk on the host, and the kernel names it holds.
#[derive(Debug)]
struct Disk {
    disk: DiskRef,
    /// N of `virtio<N>`.
    index: u32,
    /// x of `vd<x>`, counted from `a`.
    letter: u32,
}

#[derive(Debug)]
struct Ctrl {
    ctrl_id: String,
    vuid: String,
    bdev: Option<String>,
    vblk_id: String,
    suspended: bool,
    read_only: bool,
    num_queues: u32,
    queue_size: u32,
    seg_max: u32,
    size_max: u32,
    disk: Option<Disk>,
}

#[derive(Debug)]
pub(super) struct VirtioBlk {
    ctrls: Vec<Ctrl>,
    /// The number in SNAP's next default controller name.
    next_ctrl: u32,
}

impl Default for VirtioBlk {
    fn default() -> Self {
        Self {
            ctrls: Vec::new(),
            next_ctrl: 1,
        }
    }
}

impl VirtioBlk {
    fn ctrl(&self, ctrl: &str) -> Result<usize, RpcError> {
        self.ctrls
            .iter()
            .position(|c| c.ctrl_id == ctrl)
            .ok_or(RpcError::errno(ENODEV))
    }

    /// The controller lets go of its bdev; its disk leaves the host first.
    fn release_bdev(&mut self, ci: usize, visible: &Visible) {
        self.hide(ci, visible);
        self.ctrls[ci].bdev = None;
    }

    fn destroy_ctrl(&mut self, ctrl: &str, cx: &mut SnapCx<'_, '_>) {
        let Ok(ci) = self.ctrl(ctrl) else {
            return;
        };
        self.hide(ci, cx.visible);
        let c = self.ctrls.remove(ci);
        cx.functions.clear_ctrl(&c.vuid);
    }

    fn controller_create(&mut self, params: Option<Value>, cx: &mut SnapCx<'_, '_>) -> RpcResult {
        let p: api::VirtioBlkControllerCreateParams = decode(params, OnDecodeError::DecodeFailed)?;
        if let Some(id) = &p.vblk_id {
            check_vblk_id(id)?;
        }
        let bdev = match &p.bdev {
            Some(b) => Some(open_for_write(cx.spdk.bdevs, b)?),
            None => None,
        };
        let sel = Selector {
            pci_bdf: p.pci_bdf,
            vuid: p.vuid,
            pf_id: p.pf_id,
            vf_id: p.vf_id,
            vhca_id: p.vhca_id,
        };
        let (vuid, ctrl_id) = cx.functions.place_ctrl(
            Kind::VirtioBlk,
            &sel,
            p.ctrl,
            api::VIRTIO_BLK_CTRL_PREFIX,
            &mut self.next_ctrl,
        )?;
        let vblk_id = p
            .vblk_id
            .or_else(|| bdev.as_deref().map(default_vblk_id))
            .unwrap_or_default();
        self.ctrls.push(Ctrl {
            ctrl_id: ctrl_id.clone(),
            vuid: vuid.clone(),
            bdev,
            vblk_id,
            suspended: p.suspended,
            read_only: p.read_only,
            num_queues: p.num_queues.unwrap_or(DEFAULT_QUEUES),
            queue_size: p.queue_size.unwrap_or(DEFAULT_QUEUE_SIZE),
            seg_max: p.seg_max.unwrap_or(DEFAULT_SEG_MAX),
            size_max: p.size_max.unwrap_or(DEFAULT_SIZE_MAX),
            disk: None,
        });
        let ci = self.ctrls.len() - 1;
        if let Err(e) = self.reconcile(ci, cx) {
            self.destroy_ctrl(&ctrl_id, cx);
            return Err(e);
        }
        let f = cx.functions.get(&vuid).ok_or(RpcError::errno(ENODEV))?;
        Ok(api::ctrl_created_json(&ctrl_id, f.view()))
    }

    fn controller_destroy(&mut self, params: Option<Value>, cx: &mut SnapCx<'_, '_>) -> RpcResult {
        let p: api::VirtioBlkDestroyParams = decode(params, OnDecodeError::DecodeFailed)?;
        let ci = self.ctrl(&p.ctrl)?;
        if !p.force && self.ctrls[ci].bdev.is_some() {
            return Err(RpcError::errno(EBUSY));
        }
        self.destroy_ctrl(&p.ctrl, cx);
        Ok(json!(true))
    }

    fn controller_list(&self, params: Option<Value>, functions: &Functions) -> RpcResult {
        let p: api::VirtioBlkListParams = decode_opt(params, OnDecodeError::DecodeFailed)?;
        if let Some(c) = &p.ctrl {
            self.ctrl(c)?;
        }
        let out = self
            .ctrls
            .iter()
            .filter(|c| p.ctrl.as_ref().is_none_or(|id| *id == c.ctrl_id))
            .map(|c| {
                let f = functions.get(&c.vuid);
                api::virtio_ctrl_json(api::VirtioCtrlView {
                    ctrl_id: &c.ctrl_id,
                    vhca_id: f.map_or(0, |f| f.vhca_id),
                    num_queues: c.num_queues,
                    queue_size: c.queue_size,
                    seg_max: c.seg_max,
                    size_max: c.size_max,
                    vblk_id: &c.vblk_id,
                    bdev: c.bdev.as_deref().unwrap_or(""),
                    read_only: c.read_only,
                    pci_bdf: f.map_or("00:00.0", |f| f.listed_bdf()),
                    vuid: &c.vuid,
                    plugged: f.is_some_and(|f| f.bdf.is_some()),
                    suspended: c.suspended,
                })
            })
            .collect();
        Ok(Value::Array(out))
    }

    fn bdev_attach(&mut self, params: Option<Value>, cx: &mut SnapCx<'_, '_>) -> RpcResult {
        let p: api::VirtioBlkBdevAttachParams = decode(params, OnDecodeError::DecodeFailed)?;
        if let Some(id) = &p.vblk_id {
            check_vblk_id(id)?;
        }
        let ci = self.ctrl(&p.ctrl)?;
        if self.ctrls[ci].bdev.is_some() {
            return Err(RpcError::errno(EEXIST));
        }
        let bdev = open_for_write(cx.spdk.bdevs, &p.bdev)?;
        let c = &mut self.ctrls[ci];
        if let Some(id) = p.vblk_id {
            c.vblk_id = id;
        } else if c.vblk_id.is_empty() {
            c.vblk_id = default_vblk_id(&bdev);
        }
        c.bdev = Some(bdev);
        if let Err(e) = self.reconcile(ci, cx) {
            self.ctrls[ci].bdev = None;
            return Err(e);
        }
        Ok(json!(true))
    }

    fn bdev_detach(&mut self, params: Option<Value>, visible: &Visible) -> RpcResult {
        let p: api::VirtioBlkCtrlParams = decode(params, OnDecodeError::DecodeFailed)?;
        let ci = self.ctrl(&p.ctrl)?;
        if self.ctrls[ci].bdev.is_none() {
            return Err(RpcError::errno(ENODEV));
        }
        self.release_bdev(ci, visible);
        Ok(json!(true))
    }

    /// Emulator-only (`virtio_blk_controller_emu_rename`): the host names the
    /// controller's disk anew, as after a reconnect while its old name is
    /// still held, with the lowest free index and letter (`vda` as `vdb`).
    /// The device and its serial stay, and SNAP's own state does not
    /// change. -19 when nothing is on the host.
    fn emu_rename(&mut self, ci: usize, visible: &Visible) -> RpcResult {
        if !visible.has_host() {
            return Err(RpcError::errno(ENODEV));
        }
        let shown = || self.ctrls.iter().filter_map(|c| c.disk.as_ref());
        let index = lowest_free(shown().map(|d| d.index));
        let letter = lowest_free(shown().map(|d| d.letter));
        let d = self.ctrls[ci]
            .disk
            .as_mut()
            .ok_or(RpcError::errno(ENODEV))?;
        d.disk = visible.rename_virtio_blk(&d.disk, index, letter)?;
        (d.index, d.letter) = (index, letter);
        Ok(json!(true))
    }
}

impl Controllers for VirtioBlk {
    fn vuid(&self, ci: usize) -> &str {
        &self.ctrls[ci].vuid
    }

    fn suspended(&mut self, ci: usize) -> &mut bool {
        &mut self.ctrls[ci].suspended
    }

    /// The bdev of a resumed controller on a function the host sees is on
    /// the host.
    fn reconcile(&mut self, ci: usize, cx: &mut SnapCx<'_, '_>) -> Result<(), RpcError> {
        let c = &self.ctrls[ci];
        let bdf = cx.functions.get(&c.vuid).and_then(|f| f.bdf.clone());
        let (Some(bdf), Some(bdev)) = (bdf, c.bdev.clone()) else {
            self.hide(ci, cx.visible);
            return Ok(());
        };
        if c.suspended || c.disk.is_some() {
            return Ok(());
        }
        let b = cx.spdk.bdevs.get(&bdev).ok_or(RpcError::errno(ENODEV))?;
        let source = cx.visible.source(b, c.read_only, cx.spdk)?;
        let shown = || self.ctrls.iter().filter_map(|c| c.disk.as_ref());
        let index = lowest_free(shown().map(|d| d.index));
        let letter = lowest_free(shown().map(|d| d.letter));
        let Some(disk) = cx
            .visible
            .attach_virtio_blk(&bdf, index, letter, &c.vblk_id, source)?
        else {
            return Ok(());
        };
        self.ctrls[ci].disk = Some(Disk {
            disk,
            index,
            letter,
        });
        Ok(())
    }

    fn hide(&mut self, ci: usize, visible: &Visible) {
        if let Some(d) = self.ctrls[ci].disk.take() {
            visible.detach(&d.disk);
        }
    }
}

impl Emulation for VirtioBlk {
    fn methods(&self) -> &'static [&'static str] {
        METHODS
    }

    fn unlisted(&self) -> &'static [&'static str] {
        &[api::VIRTIO_BLK_CONTROLLER_EMU_RENAME]
    }

    fn call(&mut self, method: &str, params: Option<Value>, cx: &mut SnapCx<'_, '_>) -> Answer {
        let ctrl = |params| -> Result<usize, RpcError> {
            let p: api::VirtioBlkCtrlParams = decode(params, OnDecodeError::DecodeFailed)?;
            self.ctrl(&p.ctrl)
        };
        let plugged = |params| -> Result<usize, RpcError> {
            let p: api::VirtioBlkHotplugParams = decode(params, OnDecodeError::DecodeFailed)?;
            self.ctrl(&p.ctrl)
        };
        match method {
            api::VIRTIO_BLK_CONTROLLER_CREATE => self.controller_create(params, cx),
            api::VIRTIO_BLK_CONTROLLER_DESTROY => self.controller_destroy(params, cx),
            api::VIRTIO_BLK_CONTROLLER_LIST => self.controller_list(params, cx.functions),
            api::VIRTIO_BLK_CONTROLLER_BDEV_ATTACH => self.bdev_attach(params, cx),
            api::VIRTIO_BLK_CONTROLLER_BDEV_DETACH => self.bdev_detach(params, cx.visible),
            api::VIRTIO_BLK_CONTROLLER_SUSPEND => {
                let ci = ctrl(params)?;
                suspend(self, ci)
            }
            api::VIRTIO_BLK_CONTROLLER_RESUME => {
                let ci = ctrl(params)?;
                resume(self, ci, cx)
            }
            api::VIRTIO_BLK_CONTROLLER_HOTPLUG => {
                let ci = plugged(params)?;
                hotplug(self, ci, cx)
            }
            api::VIRTIO_BLK_CONTROLLER_HOTUNPLUG => {
                let ci = plugged(params)?;
                hotunplug(self, ci, cx)
            }
            api::VIRTIO_BLK_CONTROLLER_EMU_RENAME => {
                let ci = plugged(params)?;
                self.emu_rename(ci, cx.visible)
            }
            api::VIRTIO_BLK_FUNCTION_CREATE => {
                function_create(params, Kind::VirtioBlk, cx.functions)
            }
            api::VIRTIO_BLK_FUNCTION_DESTROY => function_destroy(params, Kind::VirtioBlk, cx),
            _ => Err(RpcError::method_not_found()),
        }
        .map(Into::into)
    }

    fn writes(&self, bdev: &str) -> bool {
        self.ctrls.iter().any(|c| c.bdev.as_deref() == Some(bdev))
    }

    /// Controllers of a bdev that is going let go of it, their disks first.
    fn release(&mut self, bdev: &str, visible: &Visible) {
        let users: Vec<usize> = self
            .ctrls
            .iter()
            .enumerate()
            .filter(|(_, c)| c.bdev.as_deref() == Some(bdev))
            .map(|(i, _)| i)
            .collect();
        for ci in users {
            self.release_bdev(ci, visible);
        }
    }

    fn disks_of(&self, bdev: &str) -> Vec<DiskRef> {
        self.ctrls
            .iter()
            .filter(|c| c.bdev.as_deref() == Some(bdev))
            .filter_map(|c| c.disk.as_ref().map(|d| d.disk.clone()))
            .collect()
    }
}

fn check_vblk_id(id: &str) -> Result<(), RpcError> {
    if id.len() > ID_MAX {
        return Err(RpcError::errno(EINVAL));
    }
    Ok(())
}

/// The serial of a controller created with a bdev and no `vblk_id`: the
/// bdev's name, cut to what the host can read.
fn default_vblk_id(bdev: &str) -> String {
    let mut end = bdev.len().min(ID_MAX);
    while !bdev.is_char_boundary(end) {
        end -= 1;
    }
    bdev[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_serials_fit_virtio() {
        assert_eq!(default_vblk_id("short"), "short");
        assert_eq!(
            default_vblk_id("a-very-long-bdev-name-indeed"),
            "a-very-long-bdev-nam"
        );
        assert!(check_vblk_id("123456789012345678901").is_err());
    }
}
