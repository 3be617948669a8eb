//! SNAP-4 emulation: NVMe subsystems, namespaces and controllers, virtio-blk
//! controllers, hot-plug functions, and their appearance on the host.
//!
//! A namespace shows up on the host (through [`HostSide`]) once it is attached
//! to a controller that has been resumed and whose function the host can see;
//! it disappears when detached, destroyed, hot-unplugged, or when its bdev goes
//! away. Showing up is asynchronous, as on a real host, whose driver finds a
//! namespace by hot-plug after SNAP answered: the reply (and SNAP's state,
//! `ready` included) does not wait for the loop device, which appears in the
//! tree shortly after, so a consumer polls sysfs for it as the node does.
//! Going away is done before the reply.
//!
//! NVMe disks are named `nvme<X>n<Y>`: X is the lowest controller
//! instance free across the emulator, Y counts attachments per controller from
//! 1, so Y need not equal the NSID, exactly as on a real host. virtio-blk disks
//! take the lowest free `virtio<N>` index and the lowest free `vd<x>` name.
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
//! - the host side refusing a disk before queueing its attach: -5 (EIO). An
//!   attach that fails later is logged; SNAP's state keeps the namespace
//!   attached, as SNAP knows nothing of the host's driver.
//!
//! [`HostSide`]: crate::host::HostSide

use std::collections::HashMap;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::bdev::Bdev;
use crate::datapath::DataPathMode;
use crate::datapath::volume::Source;
use crate::framing::to_json;
use crate::functions::{Emulation, Function, Functions, Selector};
use crate::host::DiskRef;
use crate::rpc::{
    EBUSY, EEXIST, EINVAL, EIO, ENODEV, ENOSPC, EPERM, OnDecodeError, Rendered, RpcError,
    RpcResult, decode, decode_opt,
};
use crate::snap_api as api;
use crate::state::Emulator;
use std::sync::Arc;

const NVME_DEFAULT_QUEUES: u32 = 16;
const NVME_MAX_QUEUES: u32 = 32;
const NVME_DEFAULT_MDTS: u32 = 7;
const VBLK_DEFAULT_QUEUES: u32 = 4;
const VBLK_DEFAULT_QUEUE_SIZE: u32 = 256;
const VBLK_DEFAULT_SEG_MAX: u32 = 32;
const VBLK_DEFAULT_SIZE_MAX: u32 = 65536;
/// VIRTIO_BLK_ID_BYTES: the serial the host reads is at most 20 bytes.
const VBLK_ID_MAX: usize = 20;

#[derive(Debug, Clone)]
pub(crate) struct SnapNamespace {
    pub nsid: u32,
    /// The bdev's real name.
    pub bdev: String,
    pub uuid: String,
    pub ctrl: Option<String>,
}

#[derive(Debug, Clone)]
pub(crate) struct SnapSubsystem {
    pub nqn: String,
    pub sn: String,
    pub mn: String,
    pub nn: u32,
    pub mnan: u32,
    pub namespaces: Vec<SnapNamespace>,
}

#[derive(Debug)]
pub(crate) struct NvmeCtrl {
    pub ctrl_id: String,
    pub nqn: String,
    pub vuid: String,
    pub suspended: bool,
    pub admin_only: bool,
    pub num_queues: u32,
    pub mdts: u32,
    /// NSIDs in attach order.
    pub attached: Vec<u32>,
    /// Disks shown to the host (or on their way there), by NSID.
    pub disks: Vec<(u32, DiskRef)>,
    /// X of `nvme<X>` while the controller has been on the host.
    pub instance: Option<u32>,
    /// Last Y handed out in `nvme<X>n<Y>`.
    pub last_ns_instance: u32,
}

#[derive(Debug)]
pub(crate) struct VirtioDisk {
    pub disk: DiskRef,
    pub index: u32,
    pub letter: u32,
}

#[derive(Debug)]
pub(crate) struct VirtioCtrl {
    pub ctrl_id: String,
    pub vuid: String,
    pub bdev: Option<String>,
    pub vblk_id: String,
    pub suspended: bool,
    pub read_only: bool,
    pub num_queues: u32,
    pub queue_size: u32,
    pub seg_max: u32,
    pub size_max: u32,
    pub disk: Option<VirtioDisk>,
}

/// A controller of either emulation, by its index in its list: what the
/// suspend, resume and hot-plug methods of both share.
#[derive(Debug, Clone, Copy)]
enum CtrlRef {
    Nvme(usize),
    VirtioBlk(usize),
}

#[derive(Debug)]
pub(crate) struct Snap {
    pub functions: Functions,
    pub subsystems: Vec<SnapSubsystem>,
    pub nvme_ctrls: Vec<NvmeCtrl>,
    pub virtio_ctrls: Vec<VirtioCtrl>,
    next_nvme_ctrl: u32,
    next_virtio_ctrl: u32,
}

impl Snap {
    pub fn new(functions: Functions) -> Self {
        Self {
            functions,
            subsystems: vec![],
            nvme_ctrls: vec![],
            virtio_ctrls: vec![],
            next_nvme_ctrl: 1,
            next_virtio_ctrl: 1,
        }
    }

    fn ctrl_name_taken(&self, name: &str) -> bool {
        self.nvme_ctrls.iter().any(|c| c.ctrl_id == name)
            || self.virtio_ctrls.iter().any(|c| c.ctrl_id == name)
    }

    fn next_name(&mut self, e: Emulation) -> String {
        loop {
            let (prefix, n) = match e {
                Emulation::Nvme => {
                    self.next_nvme_ctrl += 1;
                    (api::NVME_CTRL_PREFIX, self.next_nvme_ctrl - 1)
                }
                Emulation::VirtioBlk => {
                    self.next_virtio_ctrl += 1;
                    (api::VIRTIO_BLK_CTRL_PREFIX, self.next_virtio_ctrl - 1)
                }
            };
            let name = format!("{prefix}{n}");
            if !self.ctrl_name_taken(&name) {
                return name;
            }
        }
    }

    /// Where a new controller goes and what it is called: the selected
    /// function, which must not carry a controller yet, and the requested
    /// name (unique across both emulations) or SNAP's next default one.
    /// Returns the function's VUID and the controller's name.
    fn place_new_ctrl(
        &mut self,
        e: Emulation,
        sel: &Selector,
        name: Option<String>,
    ) -> Result<(String, String), RpcError> {
        let f = self.functions.select(e, sel)?;
        if f.ctrl_id.is_some() {
            return Err(RpcError::errno(EBUSY));
        }
        let vuid = f.vuid.clone();
        let ctrl_id = match name {
            Some(name) if self.ctrl_name_taken(&name) => return Err(RpcError::errno(EEXIST)),
            Some(name) => name,
            None => self.next_name(e),
        };
        Ok((vuid, ctrl_id))
    }

    fn ctrl_vuid(&self, c: CtrlRef) -> &str {
        match c {
            CtrlRef::Nvme(ci) => &self.nvme_ctrls[ci].vuid,
            CtrlRef::VirtioBlk(ci) => &self.virtio_ctrls[ci].vuid,
        }
    }

    fn ctrl_suspended_mut(&mut self, c: CtrlRef) -> &mut bool {
        match c {
            CtrlRef::Nvme(ci) => &mut self.nvme_ctrls[ci].suspended,
            CtrlRef::VirtioBlk(ci) => &mut self.virtio_ctrls[ci].suspended,
        }
    }

    fn subsystem(&self, nqn: &str) -> Result<usize, RpcError> {
        self.subsystems
            .iter()
            .position(|s| s.nqn == nqn)
            .ok_or(RpcError::errno(ENODEV))
    }

    fn nvme_ctrl(&self, ctrl_id: &str) -> Result<usize, RpcError> {
        self.nvme_ctrls
            .iter()
            .position(|c| c.ctrl_id == ctrl_id)
            .ok_or(RpcError::errno(ENODEV))
    }

    fn virtio_ctrl(&self, ctrl: &str) -> Result<usize, RpcError> {
        self.virtio_ctrls
            .iter()
            .position(|c| c.ctrl_id == ctrl)
            .ok_or(RpcError::errno(ENODEV))
    }

    fn namespace(&self, nqn: &str, nsid: u32) -> Option<&SnapNamespace> {
        self.subsystems
            .iter()
            .find(|s| s.nqn == nqn)?
            .namespaces
            .iter()
            .find(|n| n.nsid == nsid)
    }

    fn namespace_mut(&mut self, nqn: &str, nsid: u32) -> Option<&mut SnapNamespace> {
        self.subsystems
            .iter_mut()
            .find(|s| s.nqn == nqn)?
            .namespaces
            .iter_mut()
            .find(|n| n.nsid == nsid)
    }

    fn function_of(&self, vuid: &str) -> Option<&Function> {
        self.functions.get(vuid)
    }
}

/// `vda`, ..., `vdz`, `vdaa`, ...: the kernel's disk naming.
pub(crate) fn virtio_disk_name(index: u32) -> String {
    let mut letters = Vec::new();
    let mut n = u64::from(index) + 1;
    while n > 0 {
        n -= 1;
        letters.push(b'a' + (n % 26) as u8);
        n /= 26;
    }
    letters.reverse();
    format!("vd{}", String::from_utf8_lossy(&letters))
}

fn lowest_free(used: impl Iterator<Item = u32>) -> u32 {
    let mut used: Vec<u32> = used.collect();
    used.sort_unstable();
    let mut n = 0;
    for u in used {
        if u == n {
            n += 1;
        } else if u > n {
            break;
        }
    }
    n
}

fn selector(
    pci_bdf: Option<String>,
    vuid: Option<String>,
    pf_id: Option<u32>,
    vf_id: Option<u32>,
    vhca_id: Option<u32>,
) -> Selector {
    Selector {
        pci_bdf,
        vuid,
        pf_id,
        vf_id,
        vhca_id,
    }
}

fn host_error(what: &str, e: &anyhow::Error) -> RpcError {
    tracing::error!("host side failed to {what}: {e:#}");
    RpcError::errno(EIO)
}

impl Emulator {
    fn snap(&self) -> Result<&Snap, RpcError> {
        self.snap.as_ref().ok_or_else(RpcError::method_not_found)
    }

    fn snap_mut(&mut self) -> Result<&mut Snap, RpcError> {
        self.snap.as_mut().ok_or_else(RpcError::method_not_found)
    }

    /// SNAP opens bdevs for writing, which an `exclusive_write` claim forbids.
    fn writable_bdev(&self, name: &str) -> Result<String, RpcError> {
        let b = self.bdevs.get(name).ok_or(RpcError::errno(ENODEV))?;
        if b.claim.is_some() {
            return Err(RpcError::errno(EPERM));
        }
        Ok(b.name.clone())
    }

    /// Whether SNAP holds the bdev open for writing (blocks claims).
    pub(crate) fn bdev_has_writers(&self, name: &str) -> bool {
        let Some(snap) = &self.snap else {
            return false;
        };
        snap.subsystems
            .iter()
            .flat_map(|s| &s.namespaces)
            .any(|n| n.bdev == name)
            || snap
                .virtio_ctrls
                .iter()
                .any(|c| c.bdev.as_deref() == Some(name))
    }

    /// The host disks currently backed by a bdev.
    pub(crate) fn host_disks_of(&self, bdev: &str) -> Vec<DiskRef> {
        let Some(snap) = &self.snap else {
            return vec![];
        };
        let mut out = vec![];
        for c in &snap.nvme_ctrls {
            for (nsid, disk) in &c.disks {
                if snap
                    .namespace(&c.nqn, *nsid)
                    .is_some_and(|n| n.bdev == bdev)
                {
                    out.push(disk.clone());
                }
            }
        }
        for c in &snap.virtio_ctrls {
            if let (Some(b), Some(d)) = (&c.bdev, &c.disk)
                && b == bdev
            {
                out.push(d.disk.clone());
            }
        }
        out
    }

    fn host_detach(&self, disk: &DiskRef) {
        if let Some(host) = &self.host
            && let Err(e) = host.detach_queued(disk)
        {
            tracing::error!("failed to detach {}: {e:#}", disk.sysfs_dir.display());
        }
    }

    // ---- either emulation's controllers -------------------------------------

    /// Brings the host's view of a controller in line with its state.
    fn reconcile(&mut self, c: CtrlRef) -> Result<(), RpcError> {
        match c {
            CtrlRef::Nvme(ci) => self.reconcile_nvme(ci),
            CtrlRef::VirtioBlk(ci) => self.reconcile_virtio(ci),
        }
    }

    /// Takes every disk of a controller off the host.
    fn hide_ctrl(&mut self, c: CtrlRef) {
        match c {
            CtrlRef::Nvme(ci) => self.hide_nvme_ctrl(ci),
            CtrlRef::VirtioBlk(ci) => self.hide_virtio(ci),
        }
    }

    /// `*_controller_resume`: what was held back while suspended reaches the
    /// host; if it cannot, the controller stays as it was.
    fn resume_ctrl(&mut self, c: CtrlRef) -> RpcResult {
        let was = std::mem::replace(self.snap_mut()?.ctrl_suspended_mut(c), false);
        if let Err(e) = self.reconcile(c) {
            if let Some(s) = &mut self.snap {
                *s.ctrl_suspended_mut(c) = was;
            }
            return Err(e);
        }
        Ok(json!(true))
    }

    /// `*_controller_suspend`: a suspended controller stops serving I/O; the
    /// host keeps its disks.
    fn suspend_ctrl(&mut self, c: CtrlRef) -> RpcResult {
        *self.snap_mut()?.ctrl_suspended_mut(c) = true;
        Ok(json!(true))
    }

    // ---- NVMe exposure ------------------------------------------------------

    /// Brings the host's view of an NVMe controller in line with its state.
    fn reconcile_nvme(&mut self, ci: usize) -> Result<(), RpcError> {
        let Some(snap) = &self.snap else {
            return Ok(());
        };
        let c = &snap.nvme_ctrls[ci];
        let bdf = snap.function_of(&c.vuid).and_then(|f| f.bdf.clone());
        let Some(bdf) = bdf else {
            self.hide_nvme_ctrl(ci);
            return Ok(());
        };
        if c.suspended {
            return Ok(());
        }
        let pending: Vec<u32> = c
            .attached
            .iter()
            .copied()
            .filter(|nsid| !c.disks.iter().any(|(n, _)| n == nsid))
            .collect();
        for nsid in pending {
            self.expose_nvme_ns(ci, &bdf, nsid)?;
        }
        Ok(())
    }

    fn expose_nvme_ns(&mut self, ci: usize, bdf: &str, nsid: u32) -> Result<(), RpcError> {
        let Some(snap) = &self.snap else {
            return Ok(());
        };
        let c = &snap.nvme_ctrls[ci];
        let ns = snap
            .namespace(&c.nqn, nsid)
            .ok_or(RpcError::errno(ENODEV))?;
        let bdev = self.bdevs.get(&ns.bdev).ok_or(RpcError::errno(ENODEV))?;
        let source = self.host_source(bdev, false)?;
        let uuid = ns.uuid.clone();
        let instance = c
            .instance
            .unwrap_or_else(|| lowest_free(snap.nvme_ctrls.iter().filter_map(|c| c.instance)));
        let ns_instance = c.last_ns_instance + 1;
        let Some(host) = &self.host else {
            return Ok(());
        };
        let disk = host
            .attach_nvme_namespace_in_background(bdf, instance, ns_instance, nsid, &uuid, source)
            .map_err(|e| host_error("attach an NVMe namespace", &e))?;
        if let Some(snap) = &mut self.snap {
            let c = &mut snap.nvme_ctrls[ci];
            c.instance = Some(instance);
            c.last_ns_instance = ns_instance;
            c.disks.push((nsid, disk));
        }
        Ok(())
    }

    fn hide_nvme_ns(&mut self, ci: usize, nsid: u32) {
        let disk = self.snap.as_mut().and_then(|s| {
            let c = &mut s.nvme_ctrls[ci];
            let i = c.disks.iter().position(|(n, _)| *n == nsid)?;
            Some(c.disks.remove(i).1)
        });
        if let Some(d) = disk {
            self.host_detach(&d);
        }
    }

    /// The controller leaves the host: every disk goes and `nvme<X>` is freed.
    fn hide_nvme_ctrl(&mut self, ci: usize) {
        let disks = match self.snap.as_mut() {
            Some(s) => {
                let c = &mut s.nvme_ctrls[ci];
                c.instance = None;
                c.last_ns_instance = 0;
                std::mem::take(&mut c.disks)
            }
            None => vec![],
        };
        for (_, d) in disks {
            self.host_detach(&d);
        }
    }

    // ---- virtio-blk exposure ------------------------------------------------

    fn reconcile_virtio(&mut self, ci: usize) -> Result<(), RpcError> {
        let Some(snap) = &self.snap else {
            return Ok(());
        };
        let c = &snap.virtio_ctrls[ci];
        let bdf = snap.function_of(&c.vuid).and_then(|f| f.bdf.clone());
        let (Some(bdf), Some(bdev)) = (bdf, c.bdev.clone()) else {
            self.hide_virtio(ci);
            return Ok(());
        };
        if c.suspended || c.disk.is_some() {
            return Ok(());
        }
        let b = self.bdevs.get(&bdev).ok_or(RpcError::errno(ENODEV))?;
        let source = self.host_source(b, c.read_only)?;
        let index = lowest_free(
            snap.virtio_ctrls
                .iter()
                .filter_map(|c| c.disk.as_ref().map(|d| d.index)),
        );
        let letter = lowest_free(
            snap.virtio_ctrls
                .iter()
                .filter_map(|c| c.disk.as_ref().map(|d| d.letter)),
        );
        let serial = c.vblk_id.clone();
        let Some(host) = &self.host else {
            return Ok(());
        };
        let disk = host
            .attach_virtio_blk_in_background(
                &bdf,
                index,
                &virtio_disk_name(letter),
                &serial,
                source,
            )
            .map_err(|e| host_error("attach a virtio-blk disk", &e))?;
        if let Some(snap) = &mut self.snap {
            snap.virtio_ctrls[ci].disk = Some(VirtioDisk {
                disk,
                index,
                letter,
            });
        }
        Ok(())
    }

    fn hide_virtio(&mut self, ci: usize) {
        let disk = self
            .snap
            .as_mut()
            .and_then(|s| s.virtio_ctrls[ci].disk.take());
        if let Some(d) = disk {
            self.host_detach(&d.disk);
        }
    }

    /// The controller lets go of its bdev; its disk leaves the host first.
    fn release_virtio_bdev(&mut self, ci: usize) {
        self.hide_virtio(ci);
        if let Some(s) = &mut self.snap {
            s.virtio_ctrls[ci].bdev = None;
        }
    }

    /// A bdev is going away: SNAP's consumers let go of it first (hot remove).
    pub(crate) fn snap_release_bdev(&mut self, bdev: &str) {
        let Some(snap) = &self.snap else {
            return;
        };
        let doomed: Vec<(String, u32)> = snap
            .subsystems
            .iter()
            .flat_map(|s| {
                s.namespaces
                    .iter()
                    .filter(|n| n.bdev == bdev)
                    .map(|n| (s.nqn.clone(), n.nsid))
            })
            .collect();
        let virtio: Vec<usize> = snap
            .virtio_ctrls
            .iter()
            .enumerate()
            .filter(|(_, c)| c.bdev.as_deref() == Some(bdev))
            .map(|(i, _)| i)
            .collect();
        for (nqn, nsid) in doomed {
            self.remove_snap_namespace(&nqn, nsid);
        }
        for ci in virtio {
            self.release_virtio_bdev(ci);
        }
    }

    fn detach_ns_from_ctrl(&mut self, nqn: &str, nsid: u32) {
        let ctrl = self
            .snap
            .as_ref()
            .and_then(|s| s.namespace(nqn, nsid))
            .and_then(|n| n.ctrl.clone());
        let Some(ctrl) = ctrl else {
            return;
        };
        let Some(ci) = self.snap.as_ref().and_then(|s| s.nvme_ctrl(&ctrl).ok()) else {
            return;
        };
        self.hide_nvme_ns(ci, nsid);
        if let Some(s) = &mut self.snap {
            s.nvme_ctrls[ci].attached.retain(|n| *n != nsid);
            if let Some(ns) = s.namespace_mut(nqn, nsid) {
                ns.ctrl = None;
            }
        }
    }

    fn remove_snap_namespace(&mut self, nqn: &str, nsid: u32) {
        self.detach_ns_from_ctrl(nqn, nsid);
        if let Some(s) = self
            .snap
            .as_mut()
            .and_then(|s| s.subsystems.iter_mut().find(|s| s.nqn == nqn))
        {
            s.namespaces.retain(|n| n.nsid != nsid);
        }
    }

    /// Tells the host about a bdev whose size changed.
    pub(crate) fn bdev_resized(&mut self, bdev: &str) {
        let disks = self.host_disks_of(bdev);
        let (Some(host), Some(b)) = (&self.host, self.bdevs.get(bdev)) else {
            return;
        };
        let backing = self.backing_of(b);
        for d in disks {
            if let Err(e) = host.resize_queued(&d, &backing) {
                tracing::error!("failed to resize {}: {e:#}", d.sysfs_dir.display());
            }
        }
    }

    // ---- emulation_function_list ------------------------------------------

    pub(crate) fn emulation_function_list(&self, params: Option<Value>) -> Rendered {
        let p: api::FunctionListParams = decode_opt(params, OnDecodeError::DecodeFailed)?;
        let snap = self.snap()?;
        let fns = &snap.functions;
        let out = fns
            .iter()
            .filter(|f| f.is_pf())
            .map(|pf| {
                let vfs = fns
                    .iter()
                    .filter(|f| {
                        !f.is_pf()
                            && f.emulation == pf.emulation
                            && f.pf_index == pf.pf_index
                            && (p.all || f.ctrl_id.is_some())
                    })
                    .map(|vf| api::function_json(vf, None))
                    .collect();
                api::function_json(pf, Some(vfs))
            })
            .collect::<Vec<_>>();
        Ok(to_json(&out))
    }

    // ---- NVMe subsystems and namespaces ------------------------------------

    pub(crate) fn nvme_subsystem_create(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::SubsystemCreateParams = decode(params, OnDecodeError::DecodeFailed)?;
        let snap = self.snap_mut()?;
        if snap.subsystems.iter().any(|s| s.nqn == p.nqn) {
            return Err(RpcError::errno(EEXIST));
        }
        if p.nqn.is_empty() || p.nqn.len() > 223 {
            return Err(RpcError::errno(EINVAL));
        }
        let sn =
            p.sn.unwrap_or_else(|| format!("SNAPEMU{:013}", snap.subsystems.len() + 1));
        let s = SnapSubsystem {
            nqn: p.nqn,
            sn,
            mn: p.mn.unwrap_or_else(|| api::DEFAULT_MN.to_owned()),
            nn: p.nn.unwrap_or(api::DEFAULT_NN).max(1),
            mnan: p.mnan.unwrap_or(api::DEFAULT_MNAN).max(1),
            namespaces: vec![],
        };
        let out = api::subsystem_created_json(&subsystem_view(&s));
        snap.subsystems.push(s);
        Ok(out)
    }

    pub(crate) fn nvme_subsystem_destroy(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::SubsystemDestroyParams = decode(params, OnDecodeError::DecodeFailed)?;
        let snap = self.snap()?;
        let si = snap.subsystem(&p.nqn)?;
        let has_ctrls = snap.nvme_ctrls.iter().any(|c| c.nqn == p.nqn);
        if !p.force && (has_ctrls || !snap.subsystems[si].namespaces.is_empty()) {
            return Err(RpcError::errno(EBUSY));
        }
        let ctrls: Vec<String> = snap
            .nvme_ctrls
            .iter()
            .filter(|c| c.nqn == p.nqn)
            .map(|c| c.ctrl_id.clone())
            .collect();
        for c in ctrls {
            self.destroy_nvme_ctrl(&c);
        }
        let nsids: Vec<u32> = self
            .snap()?
            .subsystems
            .get(si)
            .map(|s| s.namespaces.iter().map(|n| n.nsid).collect())
            .unwrap_or_default();
        for nsid in nsids {
            self.remove_snap_namespace(&p.nqn, nsid);
        }
        self.snap_mut()?.subsystems.retain(|s| s.nqn != p.nqn);
        Ok(json!(true))
    }

    pub(crate) fn nvme_subsystem_list(&self, params: Option<Value>) -> Rendered {
        let p: api::SubsystemListParams = decode_opt(params, OnDecodeError::DecodeFailed)?;
        let snap = self.snap()?;
        if let Some(nqn) = &p.nqn {
            snap.subsystem(nqn)?;
        }
        // Indexed once: the node lists every subsystem on each stage, and with
        // hundreds of volumes the nested scans cost more than the rendering.
        let mut ctrls_of: HashMap<&str, Vec<&NvmeCtrl>> = HashMap::new();
        for c in &snap.nvme_ctrls {
            ctrls_of.entry(c.nqn.as_str()).or_default().push(c);
        }
        let functions = snap.functions.by_vuid();
        let out = snap
            .subsystems
            .iter()
            .filter(|s| p.nqn.as_ref().is_none_or(|n| *n == s.nqn))
            .map(|s| {
                let ctrls = ctrls_of.get(s.nqn.as_str()).map_or(&[][..], Vec::as_slice);
                let ctrl_json = ctrls
                    .iter()
                    .map(|c| {
                        let f = functions.get(c.vuid.as_str()).copied();
                        api::subsystem_ctrl_json(ctrl_view(Some(s), f, c))
                    })
                    .collect();
                let nss = s
                    .namespaces
                    .iter()
                    .map(|n| {
                        let ready = n.ctrl.as_ref().is_some_and(|id| {
                            ctrls.iter().any(|x| {
                                x.ctrl_id == *id && x.disks.iter().any(|(nsid, _)| *nsid == n.nsid)
                            })
                        });
                        api::subsystem_namespace_json(
                            n.nsid,
                            &n.bdev,
                            &n.uuid,
                            &s.nqn,
                            ready,
                            n.ctrl.as_deref(),
                        )
                    })
                    .collect();
                api::subsystem_json(&subsystem_view(s), ctrl_json, nss)
            })
            .collect::<Vec<_>>();
        Ok(to_json(&out))
    }

    pub(crate) fn nvme_namespace_create(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::NamespaceCreateParams = decode(params, OnDecodeError::DecodeFailed)?;
        if p.bdev_type != api::BDEV_TYPE_SPDK {
            return Err(RpcError::errno(EINVAL));
        }
        let uuid = match &p.uuid {
            Some(u) => Uuid::parse_str(u).map_err(|_| RpcError::errno(EINVAL))?,
            None => Uuid::new_v4(),
        };
        let snap = self.snap()?;
        let si = snap.subsystem(&p.nqn)?;
        let bdev = self.writable_bdev(&p.bdev_name)?;
        let snap = self.snap_mut()?;
        let s = &mut snap.subsystems[si];
        if s.namespaces.len() as u64 >= u64::from(s.mnan) {
            return Err(RpcError::errno(ENOSPC));
        }
        let nsid = match p.nsid {
            Some(0) => return Err(RpcError::errno(EINVAL)),
            Some(n) if n > s.nn => return Err(RpcError::errno(EINVAL)),
            Some(n) if s.namespaces.iter().any(|x| x.nsid == n) => {
                return Err(RpcError::errno(EEXIST));
            }
            Some(n) => n,
            None => {
                let free = lowest_free(s.namespaces.iter().map(|n| n.nsid - 1)) + 1;
                if free > s.nn {
                    return Err(RpcError::errno(ENOSPC));
                }
                free
            }
        };
        s.namespaces.push(SnapNamespace {
            nsid,
            bdev: bdev.clone(),
            uuid: uuid.to_string(),
            ctrl: None,
        });
        s.namespaces.sort_by_key(|n| n.nsid);
        Ok(api::namespace_created_json(
            &p.nqn,
            nsid,
            &bdev,
            &uuid.to_string(),
        ))
    }

    pub(crate) fn nvme_namespace_destroy(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::NamespaceDestroyParams = decode(params, OnDecodeError::DecodeFailed)?;
        let snap = self.snap()?;
        snap.subsystem(&p.nqn)?;
        snap.namespace(&p.nqn, p.nsid)
            .ok_or(RpcError::errno(ENODEV))?;
        self.remove_snap_namespace(&p.nqn, p.nsid);
        Ok(json!(true))
    }

    // ---- NVMe controllers ---------------------------------------------------

    pub(crate) fn nvme_controller_create(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::NvmeControllerCreateParams = decode(params, OnDecodeError::DecodeFailed)?;
        let snap = self.snap_mut()?;
        snap.subsystem(&p.nqn)?;
        let sel = selector(p.pci_bdf, p.vuid, p.pf_id, p.vf_id, p.vhca_id);
        let (vuid, ctrl_id) = snap.place_new_ctrl(Emulation::Nvme, &sel, p.ctrl)?;
        snap.nvme_ctrls.push(NvmeCtrl {
            ctrl_id: ctrl_id.clone(),
            nqn: p.nqn,
            vuid: vuid.clone(),
            suspended: p.suspended,
            admin_only: p.admin_only,
            num_queues: p.num_queues.unwrap_or(NVME_DEFAULT_QUEUES),
            mdts: p.mdts.unwrap_or(NVME_DEFAULT_MDTS),
            attached: vec![],
            disks: vec![],
            instance: None,
            last_ns_instance: 0,
        });
        let f = snap
            .functions
            .get_mut(&vuid)
            .ok_or(RpcError::errno(ENODEV))?;
        f.ctrl_id = Some(ctrl_id.clone());
        Ok(api::ctrl_created_json(&ctrl_id, f))
    }

    pub(crate) fn nvme_controller_attach_ns(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::NvmeControllerNsParams = decode(params, OnDecodeError::DecodeFailed)?;
        let snap = self.snap_mut()?;
        let ci = snap.nvme_ctrl(&p.ctrl_id)?;
        let nqn = snap.nvme_ctrls[ci].nqn.clone();
        if snap.nvme_ctrls[ci].admin_only {
            return Err(RpcError::errno(EINVAL));
        }
        let ns = snap
            .namespace_mut(&nqn, p.nsid)
            .ok_or(RpcError::errno(ENODEV))?;
        match &ns.ctrl {
            Some(c) if *c == p.ctrl_id => return Err(RpcError::errno(EEXIST)),
            Some(_) => return Err(RpcError::errno(EBUSY)),
            None => ns.ctrl = Some(p.ctrl_id.clone()),
        }
        snap.nvme_ctrls[ci].attached.push(p.nsid);
        if let Err(e) = self.reconcile_nvme(ci) {
            self.detach_ns_from_ctrl(&nqn, p.nsid);
            return Err(e);
        }
        Ok(json!(true))
    }

    pub(crate) fn nvme_controller_detach_ns(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::NvmeControllerNsParams = decode(params, OnDecodeError::DecodeFailed)?;
        let snap = self.snap()?;
        let ci = snap.nvme_ctrl(&p.ctrl_id)?;
        let c = &snap.nvme_ctrls[ci];
        if !c.attached.contains(&p.nsid) {
            return Err(RpcError::errno(ENODEV));
        }
        let nqn = c.nqn.clone();
        self.detach_ns_from_ctrl(&nqn, p.nsid);
        Ok(json!(true))
    }

    pub(crate) fn nvme_controller_resume(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::NvmeControllerIdParams = decode(params, OnDecodeError::DecodeFailed)?;
        let ci = self.snap()?.nvme_ctrl(&p.ctrl_id)?;
        self.resume_ctrl(CtrlRef::Nvme(ci))
    }

    pub(crate) fn nvme_controller_suspend(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::NvmeControllerIdParams = decode(params, OnDecodeError::DecodeFailed)?;
        let ci = self.snap()?.nvme_ctrl(&p.ctrl_id)?;
        self.suspend_ctrl(CtrlRef::Nvme(ci))
    }

    fn destroy_nvme_ctrl(&mut self, ctrl_id: &str) {
        let Some(ci) = self.snap.as_ref().and_then(|s| s.nvme_ctrl(ctrl_id).ok()) else {
            return;
        };
        self.hide_nvme_ctrl(ci);
        if let Some(snap) = &mut self.snap {
            let c = snap.nvme_ctrls.remove(ci);
            for nsid in &c.attached {
                if let Some(ns) = snap.namespace_mut(&c.nqn, *nsid) {
                    ns.ctrl = None;
                }
            }
            if let Some(f) = snap.functions.get_mut(&c.vuid) {
                f.ctrl_id = None;
            }
        }
    }

    pub(crate) fn nvme_controller_destroy(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::NvmeControllerDestroyParams = decode(params, OnDecodeError::DecodeFailed)?;
        let snap = self.snap()?;
        let ci = snap.nvme_ctrl(&p.ctrl_id)?;
        if !p.force && !snap.nvme_ctrls[ci].attached.is_empty() {
            return Err(RpcError::errno(EBUSY));
        }
        self.destroy_nvme_ctrl(&p.ctrl_id);
        Ok(json!(true))
    }

    pub(crate) fn nvme_controller_list(&self, params: Option<Value>) -> RpcResult {
        let p: api::NvmeControllerListParams = decode_opt(params, OnDecodeError::DecodeFailed)?;
        let snap = self.snap()?;
        if let Some(c) = &p.ctrl_id {
            snap.nvme_ctrl(c)?;
        }
        let out = snap
            .nvme_ctrls
            .iter()
            .filter(|c| p.ctrl_id.as_ref().is_none_or(|id| *id == c.ctrl_id))
            .map(|c| {
                let s = snap.subsystems.iter().find(|s| s.nqn == c.nqn);
                api::nvme_ctrl_json(ctrl_view(s, snap.function_of(&c.vuid), c))
            })
            .collect();
        Ok(Value::Array(out))
    }

    // ---- hot-plug -----------------------------------------------------------

    /// Makes a hot-plugged PF visible to the host (it gets its address).
    fn plug_function(&mut self, vuid: &str) -> Result<(), RpcError> {
        let snap = self.snap_mut()?;
        let f = snap.functions.get(vuid).ok_or(RpcError::errno(ENODEV))?;
        if !f.hotplugged {
            return Err(RpcError::errno(EINVAL));
        }
        if f.bdf.is_some() {
            return Err(RpcError::errno(EEXIST));
        }
        let kind = f.emulation.host_kind();
        let bdf = snap
            .functions
            .enumerate(vuid)
            .ok_or(RpcError::errno(ENODEV))?;
        if let Some(host) = &self.host
            && let Err(e) = host.add_pci_function(&bdf, kind)
        {
            if let Some(f) = self.snap.as_mut().and_then(|s| s.functions.get_mut(vuid)) {
                f.bdf = None;
            }
            return Err(host_error("add a PCI function", &e));
        }
        Ok(())
    }

    /// Takes a hot-plugged PF away from the host (its disks must be gone).
    fn unplug_function(&mut self, vuid: &str) -> Result<(), RpcError> {
        let snap = self.snap_mut()?;
        let f = snap
            .functions
            .get_mut(vuid)
            .ok_or(RpcError::errno(ENODEV))?;
        if !f.hotplugged {
            return Err(RpcError::errno(EINVAL));
        }
        let Some(bdf) = f.bdf.take() else {
            return Err(RpcError::errno(ENODEV));
        };
        if let Some(host) = &self.host
            && let Err(e) = host.remove_pci_function(&bdf)
        {
            tracing::error!("failed to remove PCI function {bdf}: {e:#}");
        }
        Ok(())
    }

    /// `*_controller_hotplug`: the controller's function appears on the host,
    /// and with it the disks of a controller that is not suspended.
    fn hotplug_ctrl(&mut self, c: CtrlRef) -> RpcResult {
        let vuid = self.snap()?.ctrl_vuid(c).to_owned();
        self.plug_function(&vuid)?;
        self.reconcile(c)?;
        Ok(json!(true))
    }

    /// `*_controller_hotunplug`: the disks leave the host, then the function.
    /// Checked before anything goes, so a refused unplug keeps the disks.
    fn hotunplug_ctrl(&mut self, c: CtrlRef) -> RpcResult {
        let snap = self.snap()?;
        let vuid = snap.ctrl_vuid(c).to_owned();
        let f = snap.functions.get(&vuid).ok_or(RpcError::errno(ENODEV))?;
        if !f.hotplugged {
            return Err(RpcError::errno(EINVAL));
        }
        if f.bdf.is_none() {
            return Err(RpcError::errno(ENODEV));
        }
        self.hide_ctrl(c);
        self.unplug_function(&vuid)?;
        Ok(json!(true))
    }

    pub(crate) fn nvme_controller_hotplug(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::NvmeControllerHotplugParams = decode(params, OnDecodeError::DecodeFailed)?;
        let ci = self.snap()?.nvme_ctrl(&p.ctrl_id)?;
        self.hotplug_ctrl(CtrlRef::Nvme(ci))
    }

    pub(crate) fn nvme_controller_hotunplug(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::NvmeControllerHotplugParams = decode(params, OnDecodeError::DecodeFailed)?;
        let ci = self.snap()?.nvme_ctrl(&p.ctrl_id)?;
        self.hotunplug_ctrl(CtrlRef::Nvme(ci))
    }

    /// Emulator-only (`*_controller_emu_rename`): the host names the
    /// controller's disks anew, as after a reconnect while their old names
    /// are still held: NVMe takes the lowest controller instance not in use
    /// (`nvme0n1` back as `nvme1n1`), virtio-blk the lowest free index and
    /// letter (`vda` as `vdb`). The devices and their identity stay, and
    /// SNAP's own state does not change. -19 when nothing is on the host.
    fn emu_rename_ctrl(&mut self, c: CtrlRef) -> RpcResult {
        let (Some(host), Some(snap)) = (self.host.as_ref(), self.snap.as_mut()) else {
            return Err(RpcError::errno(ENODEV));
        };
        let failed = |e: anyhow::Error| host_error("rename a disk", &e);
        match c {
            CtrlRef::Nvme(ci) => {
                let instance = lowest_free(snap.nvme_ctrls.iter().filter_map(|c| c.instance));
                let ctrl = &mut snap.nvme_ctrls[ci];
                if ctrl.disks.is_empty() {
                    return Err(RpcError::errno(ENODEV));
                }
                for (_, disk) in &mut ctrl.disks {
                    *disk = host.rename_nvme_queued(disk, instance).map_err(failed)?;
                }
                ctrl.instance = Some(instance);
            }
            CtrlRef::VirtioBlk(ci) => {
                let shown = || snap.virtio_ctrls.iter().filter_map(|c| c.disk.as_ref());
                let index = lowest_free(shown().map(|d| d.index));
                let letter = lowest_free(shown().map(|d| d.letter));
                let d = snap.virtio_ctrls[ci]
                    .disk
                    .as_mut()
                    .ok_or(RpcError::errno(ENODEV))?;
                d.disk = host
                    .rename_virtio_blk_queued(&d.disk, index, &virtio_disk_name(letter))
                    .map_err(failed)?;
                (d.index, d.letter) = (index, letter);
            }
        }
        Ok(json!(true))
    }

    pub(crate) fn nvme_controller_emu_rename(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::NvmeControllerHotplugParams = decode(params, OnDecodeError::DecodeFailed)?;
        let ci = self.snap()?.nvme_ctrl(&p.ctrl_id)?;
        self.emu_rename_ctrl(CtrlRef::Nvme(ci))
    }

    pub(crate) fn virtio_blk_controller_emu_rename(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::VirtioBlkHotplugParams = decode(params, OnDecodeError::DecodeFailed)?;
        let ci = self.snap()?.virtio_ctrl(&p.ctrl)?;
        self.emu_rename_ctrl(CtrlRef::VirtioBlk(ci))
    }

    fn function_create(&mut self, params: Option<Value>, e: Emulation) -> RpcResult {
        let _: api::FunctionCreateParams = decode_opt(params, OnDecodeError::DecodeFailed)?;
        let snap = self.snap_mut()?;
        let f = snap.functions.create_hotplug(e)?;
        Ok(api::function_created_json(f))
    }

    fn function_destroy(&mut self, params: Option<Value>, e: Emulation) -> RpcResult {
        let p: api::FunctionDestroyParams = decode(params, OnDecodeError::DecodeFailed)?;
        let snap = self.snap()?;
        let f = snap
            .functions
            .get(&p.vuid)
            .filter(|f| f.emulation == e)
            .ok_or(RpcError::errno(ENODEV))?;
        if !f.hotplugged {
            return Err(RpcError::errno(EINVAL));
        }
        if f.ctrl_id.is_some() {
            return Err(RpcError::errno(EBUSY));
        }
        if f.bdf.is_some() {
            self.unplug_function(&p.vuid)?;
        }
        self.snap_mut()?.functions.remove(&p.vuid);
        Ok(json!(true))
    }

    pub(crate) fn nvme_function_create(&mut self, params: Option<Value>) -> RpcResult {
        self.function_create(params, Emulation::Nvme)
    }

    pub(crate) fn nvme_function_destroy(&mut self, params: Option<Value>) -> RpcResult {
        self.function_destroy(params, Emulation::Nvme)
    }

    pub(crate) fn virtio_blk_function_create(&mut self, params: Option<Value>) -> RpcResult {
        self.function_create(params, Emulation::VirtioBlk)
    }

    pub(crate) fn virtio_blk_function_destroy(&mut self, params: Option<Value>) -> RpcResult {
        self.function_destroy(params, Emulation::VirtioBlk)
    }

    // ---- virtio-blk controllers ---------------------------------------------

    fn check_vblk_id(id: &str) -> Result<(), RpcError> {
        if id.len() > VBLK_ID_MAX {
            return Err(RpcError::errno(EINVAL));
        }
        Ok(())
    }

    fn default_vblk_id(bdev: &str) -> String {
        let mut end = bdev.len().min(VBLK_ID_MAX);
        while !bdev.is_char_boundary(end) {
            end -= 1;
        }
        bdev[..end].to_owned()
    }

    pub(crate) fn virtio_blk_controller_create(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::VirtioBlkControllerCreateParams = decode(params, OnDecodeError::DecodeFailed)?;
        if let Some(id) = &p.vblk_id {
            Self::check_vblk_id(id)?;
        }
        let bdev = match &p.bdev {
            Some(b) => Some(self.writable_bdev(b)?),
            None => None,
        };
        let snap = self.snap_mut()?;
        let sel = selector(p.pci_bdf, p.vuid, p.pf_id, p.vf_id, p.vhca_id);
        let (vuid, ctrl_id) = snap.place_new_ctrl(Emulation::VirtioBlk, &sel, p.ctrl)?;
        let vblk_id = p
            .vblk_id
            .or_else(|| bdev.as_deref().map(Self::default_vblk_id))
            .unwrap_or_default();
        snap.virtio_ctrls.push(VirtioCtrl {
            ctrl_id: ctrl_id.clone(),
            vuid: vuid.clone(),
            bdev,
            vblk_id,
            suspended: p.suspended,
            read_only: p.read_only,
            num_queues: p.num_queues.unwrap_or(VBLK_DEFAULT_QUEUES),
            queue_size: p.queue_size.unwrap_or(VBLK_DEFAULT_QUEUE_SIZE),
            seg_max: p.seg_max.unwrap_or(VBLK_DEFAULT_SEG_MAX),
            size_max: p.size_max.unwrap_or(VBLK_DEFAULT_SIZE_MAX),
            disk: None,
        });
        let ci = snap.virtio_ctrls.len() - 1;
        if let Some(f) = snap.functions.get_mut(&vuid) {
            f.ctrl_id = Some(ctrl_id.clone());
        }
        if let Err(e) = self.reconcile_virtio(ci) {
            self.destroy_virtio_ctrl(&ctrl_id);
            return Err(e);
        }
        let f = self
            .snap()?
            .functions
            .get(&vuid)
            .ok_or(RpcError::errno(ENODEV))?;
        Ok(api::ctrl_created_json(&ctrl_id, f))
    }

    fn destroy_virtio_ctrl(&mut self, ctrl: &str) {
        let Some(ci) = self.snap.as_ref().and_then(|s| s.virtio_ctrl(ctrl).ok()) else {
            return;
        };
        self.hide_virtio(ci);
        if let Some(snap) = &mut self.snap {
            let c = snap.virtio_ctrls.remove(ci);
            if let Some(f) = snap.functions.get_mut(&c.vuid) {
                f.ctrl_id = None;
            }
        }
    }

    pub(crate) fn virtio_blk_controller_destroy(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::VirtioBlkDestroyParams = decode(params, OnDecodeError::DecodeFailed)?;
        let snap = self.snap()?;
        let ci = snap.virtio_ctrl(&p.ctrl)?;
        if !p.force && snap.virtio_ctrls[ci].bdev.is_some() {
            return Err(RpcError::errno(EBUSY));
        }
        self.destroy_virtio_ctrl(&p.ctrl);
        Ok(json!(true))
    }

    pub(crate) fn virtio_blk_controller_list(&self, params: Option<Value>) -> RpcResult {
        let p: api::VirtioBlkListParams = decode_opt(params, OnDecodeError::DecodeFailed)?;
        let snap = self.snap()?;
        if let Some(c) = &p.ctrl {
            snap.virtio_ctrl(c)?;
        }
        let out = snap
            .virtio_ctrls
            .iter()
            .filter(|c| p.ctrl.as_ref().is_none_or(|id| *id == c.ctrl_id))
            .map(|c| {
                let f = snap.function_of(&c.vuid);
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

    pub(crate) fn virtio_blk_controller_bdev_attach(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::VirtioBlkBdevAttachParams = decode(params, OnDecodeError::DecodeFailed)?;
        if let Some(id) = &p.vblk_id {
            Self::check_vblk_id(id)?;
        }
        let ci = self.snap()?.virtio_ctrl(&p.ctrl)?;
        if self.snap()?.virtio_ctrls[ci].bdev.is_some() {
            return Err(RpcError::errno(EEXIST));
        }
        let bdev = self.writable_bdev(&p.bdev)?;
        let snap = self.snap_mut()?;
        let c = &mut snap.virtio_ctrls[ci];
        if let Some(id) = p.vblk_id {
            c.vblk_id = id;
        } else if c.vblk_id.is_empty() {
            c.vblk_id = Self::default_vblk_id(&bdev);
        }
        c.bdev = Some(bdev);
        if let Err(e) = self.reconcile_virtio(ci) {
            if let Some(s) = &mut self.snap {
                s.virtio_ctrls[ci].bdev = None;
            }
            return Err(e);
        }
        Ok(json!(true))
    }

    pub(crate) fn virtio_blk_controller_bdev_detach(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::VirtioBlkCtrlParams = decode(params, OnDecodeError::DecodeFailed)?;
        let ci = self.snap()?.virtio_ctrl(&p.ctrl)?;
        if self.snap()?.virtio_ctrls[ci].bdev.is_none() {
            return Err(RpcError::errno(ENODEV));
        }
        self.release_virtio_bdev(ci);
        Ok(json!(true))
    }

    pub(crate) fn virtio_blk_controller_suspend(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::VirtioBlkCtrlParams = decode(params, OnDecodeError::DecodeFailed)?;
        let ci = self.snap()?.virtio_ctrl(&p.ctrl)?;
        self.suspend_ctrl(CtrlRef::VirtioBlk(ci))
    }

    pub(crate) fn virtio_blk_controller_resume(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::VirtioBlkCtrlParams = decode(params, OnDecodeError::DecodeFailed)?;
        let ci = self.snap()?.virtio_ctrl(&p.ctrl)?;
        self.resume_ctrl(CtrlRef::VirtioBlk(ci))
    }

    pub(crate) fn virtio_blk_controller_hotplug(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::VirtioBlkHotplugParams = decode(params, OnDecodeError::DecodeFailed)?;
        let ci = self.snap()?.virtio_ctrl(&p.ctrl)?;
        self.hotplug_ctrl(CtrlRef::VirtioBlk(ci))
    }

    pub(crate) fn virtio_blk_controller_hotunplug(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::VirtioBlkHotplugParams = decode(params, OnDecodeError::DecodeFailed)?;
        let ci = self.snap()?.virtio_ctrl(&p.ctrl)?;
        self.hotunplug_ctrl(CtrlRef::VirtioBlk(ci))
    }
}

impl Emulator {
    /// Whether an exposure of `bdev` must pass through the emulator in
    /// `auto` mode: some layer has rate limits to enforce.
    fn needs_data_path(&self, bdev: &Bdev) -> bool {
        self.io_layers(bdev).iter().any(|l| l.qos.is_limited())
    }

    /// How an exposure of `bdev` reaches the host; `read_only` adds to the
    /// bdev's own read-only-ness (a read-only virtio-blk controller). A
    /// crypto bdev goes through the data path whatever the mode (directly,
    /// the host would see ciphertext); one whose key is gone is -ENODEV.
    pub(crate) fn host_source(&self, bdev: &Bdev, read_only: bool) -> Result<Source, RpcError> {
        let mut volume = self.volume_of(bdev)?;
        volume.backing.read_only |= read_only;
        let through = volume.cipher.is_some()
            || match self.data_path {
                DataPathMode::Direct => false,
                DataPathMode::Fuse => true,
                DataPathMode::Auto => self.needs_data_path(bdev),
            };
        if !through {
            return Ok(Source::Direct(volume.backing));
        }
        Ok(Source::DataPath(Arc::new(volume)))
    }
}

/// A controller as both listings show it; `s` is its subsystem, `f` its function.
fn ctrl_view<'a>(
    s: Option<&'a SnapSubsystem>,
    f: Option<&Function>,
    c: &'a NvmeCtrl,
) -> api::NvmeCtrlView<'a> {
    let namespaces = c
        .attached
        .iter()
        .filter_map(|nsid| s?.namespaces.iter().find(|n| n.nsid == *nsid))
        .map(|n| api::ctrl_namespace_json(n.nsid, &n.bdev, &n.uuid))
        .collect();
    api::NvmeCtrlView {
        ctrl_id: &c.ctrl_id,
        vhca_id: f.map_or(0, |f| f.vhca_id),
        nqn: &c.nqn,
        plugged: f.is_some_and(|f| f.bdf.is_some()),
        suspended: c.suspended,
        num_queues: c.num_queues,
        max_queues: NVME_MAX_QUEUES,
        mdts: c.mdts,
        namespaces,
    }
}

fn subsystem_view(s: &SnapSubsystem) -> api::SubsystemView<'_> {
    api::SubsystemView {
        nqn: &s.nqn,
        sn: &s.sn,
        mn: &s.mn,
        nn: s.nn,
        mnan: s.mnan,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_names_follow_the_kernel() {
        assert_eq!(virtio_disk_name(0), "vda");
        assert_eq!(virtio_disk_name(25), "vdz");
        assert_eq!(virtio_disk_name(26), "vdaa");
        assert_eq!(virtio_disk_name(27), "vdab");
        assert_eq!(virtio_disk_name(26 + 26 * 26), "vdaaa");
    }

    #[test]
    fn lowest_free_fills_holes() {
        assert_eq!(lowest_free([].into_iter()), 0);
        assert_eq!(lowest_free([0, 1, 3].into_iter()), 2);
        assert_eq!(lowest_free([3, 1, 0, 2].into_iter()), 4);
        assert_eq!(lowest_free([1, 2].into_iter()), 0);
    }

    #[test]
    fn default_serials_fit_virtio() {
        assert_eq!(Emulator::default_vblk_id("short"), "short");
        assert_eq!(
            Emulator::default_vblk_id("a-very-long-bdev-name-indeed"),
            "a-very-long-bdev-nam"
        );
        assert!(Emulator::check_vblk_id("123456789012345678901").is_err());
    }
}
