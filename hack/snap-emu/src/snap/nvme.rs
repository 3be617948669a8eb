//! SNAP's NVMe emulation: subsystems and their namespaces (several on one
//! controller make a packed pool), and the NVMe controllers on the NVMe
//! functions that expose them.
//!
//! A namespace shows up on the host once it is attached to a controller that
//! has been resumed and whose function the host can see; it disappears when
//! detached, destroyed, hot-unplugged, or when its bdev goes away. Disks are
//! named `nvme<X>n<Y>`: X is the lowest controller instance free, Y counts
//! attachments per controller from 1, so Y need not equal the NSID, exactly
//! as on a real host.

use std::collections::HashMap;

use serde_json::{Value, json};
use uuid::Uuid;

use super::emulation::{Controllers, Emulation, SnapCx, open_for_write, resume, suspend};
use super::hotplug::{function_create, function_destroy, hotplug, hotunplug};
use super::model::{Function, Functions, Selector};
use super::visible::{Visible, lowest_free};
use crate::framing::to_json;
use crate::host::DiskRef;
use crate::registry::{Answer, Reply};
use crate::rpc::{
    EBUSY, EEXIST, EINVAL, ENODEV, ENOSPC, OnDecodeError, Rendered, RpcError, RpcResult, decode,
    decode_opt,
};
use crate::snap_api::{self as api, Emulation as Kind};

const DEFAULT_QUEUES: u32 = 16;
const MAX_QUEUES: u32 = 32;
const DEFAULT_MDTS: u32 = 7;

const METHODS: &[&str] = &[
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
];

#[derive(Debug, Clone)]
struct Namespace {
    nsid: u32,
    /// The bdev's real name.
    bdev: String,
    uuid: String,
    ctrl: Option<String>,
}

#[derive(Debug, Clone)]
struct Subsystem {
    nqn: String,
    sn: String,
    mn: String,
    nn: u32,
    mnan: u32,
    namespaces: Vec<Namespace>,
}

#[derive(Debug)]
struct Ctrl {
    ctrl_id: String,
    nqn: String,
    vuid: String,
    suspended: bool,
    admin_only: bool,
    num_queues: u32,
    mdts: u32,
    /// NSIDs in attach order.
    attached: Vec<u32>,
    /// Disks shown to the host (or on their way there), by NSID.
    disks: Vec<(u32, DiskRef)>,
    /// X of `nvme<X>` while the controller has been on the host.
    instance: Option<u32>,
    /// Last Y handed out in `nvme<X>n<Y>`.
    last_ns_instance: u32,
}

#[derive(Debug)]
pub(super) struct Nvme {
    subsystems: Vec<Subsystem>,
    ctrls: Vec<Ctrl>,
    /// The number in SNAP's next default controller name.
    next_ctrl: u32,
}

impl Default for Nvme {
    fn default() -> Self {
        Self {
            subsystems: Vec::new(),
            ctrls: Vec::new(),
            next_ctrl: 1,
        }
    }
}

impl Nvme {
    fn subsystem(&self, nqn: &str) -> Result<usize, RpcError> {
        self.subsystems
            .iter()
            .position(|s| s.nqn == nqn)
            .ok_or(RpcError::errno(ENODEV))
    }

    fn ctrl(&self, ctrl_id: &str) -> Result<usize, RpcError> {
        self.ctrls
            .iter()
            .position(|c| c.ctrl_id == ctrl_id)
            .ok_or(RpcError::errno(ENODEV))
    }

    fn namespace(&self, nqn: &str, nsid: u32) -> Option<&Namespace> {
        self.subsystems
            .iter()
            .find(|s| s.nqn == nqn)?
            .namespaces
            .iter()
            .find(|n| n.nsid == nsid)
    }

    fn namespace_mut(&mut self, nqn: &str, nsid: u32) -> Option<&mut Namespace> {
        self.subsystems
            .iter_mut()
            .find(|s| s.nqn == nqn)?
            .namespaces
            .iter_mut()
            .find(|n| n.nsid == nsid)
    }

    // ---- exposure -----------------------------------------------------------

    fn expose_ns(
        &mut self,
        ci: usize,
        bdf: &str,
        nsid: u32,
        cx: &SnapCx<'_, '_>,
    ) -> Result<(), RpcError> {
        let c = &self.ctrls[ci];
        let ns = self
            .namespace(&c.nqn, nsid)
            .ok_or(RpcError::errno(ENODEV))?;
        let bdev = cx.spdk.bdevs.get(&ns.bdev).ok_or(RpcError::errno(ENODEV))?;
        let source = cx.visible.source(bdev, false, cx.spdk)?;
        let instance = c
            .instance
            .unwrap_or_else(|| lowest_free(self.ctrls.iter().filter_map(|c| c.instance)));
        let ns_instance = c.last_ns_instance + 1;
        let uuid = ns.uuid.clone();
        let serial = self.subsystems[self.subsystem(&c.nqn)?].sn.clone();
        let Some(disk) =
            cx.visible
                .attach_nvme(bdf, instance, ns_instance, nsid, (&uuid, &serial), source)?
        else {
            return Ok(());
        };
        let c = &mut self.ctrls[ci];
        c.instance = Some(instance);
        c.last_ns_instance = ns_instance;
        c.disks.push((nsid, disk));
        Ok(())
    }

    fn hide_ns(&mut self, ci: usize, nsid: u32, visible: &Visible) {
        let c = &mut self.ctrls[ci];
        if let Some(i) = c.disks.iter().position(|(n, _)| *n == nsid) {
            visible.detach(&c.disks.remove(i).1);
        }
    }

    fn detach_ns_from_ctrl(&mut self, nqn: &str, nsid: u32, visible: &Visible) {
        let Some(ctrl) = self.namespace(nqn, nsid).and_then(|n| n.ctrl.clone()) else {
            return;
        };
        let Ok(ci) = self.ctrl(&ctrl) else {
            return;
        };
        self.hide_ns(ci, nsid, visible);
        self.ctrls[ci].attached.retain(|n| *n != nsid);
        if let Some(ns) = self.namespace_mut(nqn, nsid) {
            ns.ctrl = None;
        }
    }

    fn remove_namespace(&mut self, nqn: &str, nsid: u32, visible: &Visible) {
        self.detach_ns_from_ctrl(nqn, nsid, visible);
        if let Some(s) = self.subsystems.iter_mut().find(|s| s.nqn == nqn) {
            s.namespaces.retain(|n| n.nsid != nsid);
        }
    }

    fn destroy_ctrl(&mut self, ctrl_id: &str, cx: &mut SnapCx<'_, '_>) {
        let Ok(ci) = self.ctrl(ctrl_id) else {
            return;
        };
        self.hide(ci, cx.visible);
        let c = self.ctrls.remove(ci);
        for nsid in &c.attached {
            if let Some(ns) = self.namespace_mut(&c.nqn, *nsid) {
                ns.ctrl = None;
            }
        }
        cx.functions.clear_ctrl(&c.vuid);
    }

    // ---- subsystems and namespaces ------------------------------------------

    fn subsystem_create(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::SubsystemCreateParams = decode(params, OnDecodeError::DecodeFailed)?;
        if self.subsystems.iter().any(|s| s.nqn == p.nqn) {
            return Err(RpcError::errno(EEXIST));
        }
        if p.nqn.is_empty() || p.nqn.len() > 223 {
            return Err(RpcError::errno(EINVAL));
        }
        let sn =
            p.sn.unwrap_or_else(|| format!("SNAPEMU{:013}", self.subsystems.len() + 1));
        let s = Subsystem {
            nqn: p.nqn,
            sn,
            mn: p.mn.unwrap_or_else(|| api::DEFAULT_MN.to_owned()),
            nn: p.nn.unwrap_or(api::DEFAULT_NN).max(1),
            mnan: p.mnan.unwrap_or(api::DEFAULT_MNAN).max(1),
            namespaces: vec![],
        };
        let out = api::subsystem_created_json(&subsystem_view(&s));
        self.subsystems.push(s);
        Ok(out)
    }

    fn subsystem_destroy(&mut self, params: Option<Value>, cx: &mut SnapCx<'_, '_>) -> RpcResult {
        let p: api::SubsystemDestroyParams = decode(params, OnDecodeError::DecodeFailed)?;
        let si = self.subsystem(&p.nqn)?;
        let has_ctrls = self.ctrls.iter().any(|c| c.nqn == p.nqn);
        if !p.force && (has_ctrls || !self.subsystems[si].namespaces.is_empty()) {
            return Err(RpcError::errno(EBUSY));
        }
        let ctrls: Vec<String> = self
            .ctrls
            .iter()
            .filter(|c| c.nqn == p.nqn)
            .map(|c| c.ctrl_id.clone())
            .collect();
        for c in ctrls {
            self.destroy_ctrl(&c, cx);
        }
        let nsids: Vec<u32> = self
            .subsystems
            .get(si)
            .map(|s| s.namespaces.iter().map(|n| n.nsid).collect())
            .unwrap_or_default();
        for nsid in nsids {
            self.remove_namespace(&p.nqn, nsid, cx.visible);
        }
        self.subsystems.retain(|s| s.nqn != p.nqn);
        Ok(json!(true))
    }

    fn subsystem_list(&self, params: Option<Value>, functions: &Functions) -> Rendered {
        let p: api::SubsystemListParams = decode_opt(params, OnDecodeError::DecodeFailed)?;
        if let Some(nqn) = &p.nqn {
            self.subsystem(nqn)?;
        }
        // Indexed once: the node lists every subsystem on each stage, and with
        // hundreds of volumes the nested scans cost more than the rendering.
        let mut ctrls_of: HashMap<&str, Vec<&Ctrl>> = HashMap::new();
        for c in &self.ctrls {
            ctrls_of.entry(c.nqn.as_str()).or_default().push(c);
        }
        let functions = functions.by_vuid();
        let out = self
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

    fn namespace_create(&mut self, params: Option<Value>, cx: &SnapCx<'_, '_>) -> RpcResult {
        let p: api::NamespaceCreateParams = decode(params, OnDecodeError::DecodeFailed)?;
        if p.bdev_type != api::BDEV_TYPE_SPDK {
            return Err(RpcError::errno(EINVAL));
        }
        let uuid = match &p.uuid {
            Some(u) => Uuid::parse_str(u).map_err(|_| RpcError::errno(EINVAL))?,
            None => Uuid::new_v4(),
        };
        let si = self.subsystem(&p.nqn)?;
        let bdev = open_for_write(cx.spdk.bdevs, &p.bdev_name)?;
        let s = &mut self.subsystems[si];
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
        s.namespaces.push(Namespace {
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

    fn namespace_destroy(&mut self, params: Option<Value>, visible: &Visible) -> RpcResult {
        let p: api::NamespaceDestroyParams = decode(params, OnDecodeError::DecodeFailed)?;
        self.subsystem(&p.nqn)?;
        self.namespace(&p.nqn, p.nsid)
            .ok_or(RpcError::errno(ENODEV))?;
        self.remove_namespace(&p.nqn, p.nsid, visible);
        Ok(json!(true))
    }

    // ---- controllers --------------------------------------------------------

    fn controller_create(&mut self, params: Option<Value>, functions: &mut Functions) -> RpcResult {
        let p: api::NvmeControllerCreateParams = decode(params, OnDecodeError::DecodeFailed)?;
        self.subsystem(&p.nqn)?;
        let sel = Selector {
            pci_bdf: p.pci_bdf,
            vuid: p.vuid,
            pf_id: p.pf_id,
            vf_id: p.vf_id,
            vhca_id: p.vhca_id,
        };
        let (vuid, ctrl_id) = functions.place_ctrl(
            Kind::Nvme,
            &sel,
            p.ctrl,
            api::NVME_CTRL_PREFIX,
            &mut self.next_ctrl,
        )?;
        self.ctrls.push(Ctrl {
            ctrl_id: ctrl_id.clone(),
            nqn: p.nqn,
            vuid: vuid.clone(),
            suspended: p.suspended,
            admin_only: p.admin_only,
            num_queues: p.num_queues.unwrap_or(DEFAULT_QUEUES),
            mdts: p.mdts.unwrap_or(DEFAULT_MDTS),
            attached: vec![],
            disks: vec![],
            instance: None,
            last_ns_instance: 0,
        });
        let f = functions.get(&vuid).ok_or(RpcError::errno(ENODEV))?;
        Ok(api::ctrl_created_json(&ctrl_id, f.view()))
    }

    fn controller_attach_ns(
        &mut self,
        params: Option<Value>,
        cx: &mut SnapCx<'_, '_>,
    ) -> RpcResult {
        let p: api::NvmeControllerNsParams = decode(params, OnDecodeError::DecodeFailed)?;
        let ci = self.ctrl(&p.ctrl_id)?;
        let nqn = self.ctrls[ci].nqn.clone();
        if self.ctrls[ci].admin_only {
            return Err(RpcError::errno(EINVAL));
        }
        let ns = self
            .namespace_mut(&nqn, p.nsid)
            .ok_or(RpcError::errno(ENODEV))?;
        match &ns.ctrl {
            Some(c) if *c == p.ctrl_id => return Err(RpcError::errno(EEXIST)),
            Some(_) => return Err(RpcError::errno(EBUSY)),
            None => ns.ctrl = Some(p.ctrl_id.clone()),
        }
        self.ctrls[ci].attached.push(p.nsid);
        if let Err(e) = self.reconcile(ci, cx) {
            self.detach_ns_from_ctrl(&nqn, p.nsid, cx.visible);
            return Err(e);
        }
        Ok(json!(true))
    }

    fn controller_detach_ns(&mut self, params: Option<Value>, visible: &Visible) -> RpcResult {
        let p: api::NvmeControllerNsParams = decode(params, OnDecodeError::DecodeFailed)?;
        let ci = self.ctrl(&p.ctrl_id)?;
        let c = &self.ctrls[ci];
        if !c.attached.contains(&p.nsid) {
            return Err(RpcError::errno(ENODEV));
        }
        let nqn = c.nqn.clone();
        self.detach_ns_from_ctrl(&nqn, p.nsid, visible);
        Ok(json!(true))
    }

    fn controller_destroy(&mut self, params: Option<Value>, cx: &mut SnapCx<'_, '_>) -> RpcResult {
        let p: api::NvmeControllerDestroyParams = decode(params, OnDecodeError::DecodeFailed)?;
        let ci = self.ctrl(&p.ctrl_id)?;
        if !p.force && !self.ctrls[ci].attached.is_empty() {
            return Err(RpcError::errno(EBUSY));
        }
        self.destroy_ctrl(&p.ctrl_id, cx);
        Ok(json!(true))
    }

    fn controller_list(&self, params: Option<Value>, functions: &Functions) -> RpcResult {
        let p: api::NvmeControllerListParams = decode_opt(params, OnDecodeError::DecodeFailed)?;
        if let Some(c) = &p.ctrl_id {
            self.ctrl(c)?;
        }
        let out = self
            .ctrls
            .iter()
            .filter(|c| p.ctrl_id.as_ref().is_none_or(|id| *id == c.ctrl_id))
            .map(|c| {
                let s = self.subsystems.iter().find(|s| s.nqn == c.nqn);
                api::nvme_ctrl_json(ctrl_view(s, functions.get(&c.vuid), c))
            })
            .collect();
        Ok(Value::Array(out))
    }

    /// Emulator-only (`nvme_controller_emu_rename`): the host names the
    /// controller's disks anew, as after a reconnect while their old names
    /// are still held, taking the lowest controller instance not in use
    /// (`nvme0n1` back as `nvme1n1`). The devices and their identity stay,
    /// and SNAP's own state does not change. -19 when nothing is on the host.
    fn emu_rename(&mut self, ci: usize, visible: &Visible) -> RpcResult {
        let instance = lowest_free(self.ctrls.iter().filter_map(|c| c.instance));
        let ctrl = &mut self.ctrls[ci];
        if ctrl.disks.is_empty() {
            return Err(RpcError::errno(ENODEV));
        }
        for (_, disk) in &mut ctrl.disks {
            *disk = visible.rename_nvme(disk, instance)?;
        }
        ctrl.instance = Some(instance);
        Ok(json!(true))
    }
}

impl Controllers for Nvme {
    fn vuid(&self, ci: usize) -> &str {
        &self.ctrls[ci].vuid
    }

    fn suspended(&mut self, ci: usize) -> &mut bool {
        &mut self.ctrls[ci].suspended
    }

    /// Every namespace attached to a resumed controller on a function the
    /// host sees is on the host.
    fn reconcile(&mut self, ci: usize, cx: &mut SnapCx<'_, '_>) -> Result<(), RpcError> {
        let c = &self.ctrls[ci];
        let bdf = cx.functions.get(&c.vuid).and_then(|f| f.bdf.clone());
        let Some(bdf) = bdf else {
            self.hide(ci, cx.visible);
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
            self.expose_ns(ci, &bdf, nsid, cx)?;
        }
        Ok(())
    }

    /// The controller leaves the host: every disk goes and `nvme<X>` is freed.
    fn hide(&mut self, ci: usize, visible: &Visible) {
        let c = &mut self.ctrls[ci];
        c.instance = None;
        c.last_ns_instance = 0;
        for (_, d) in std::mem::take(&mut c.disks) {
            visible.detach(&d);
        }
    }
}

impl Emulation for Nvme {
    fn methods(&self) -> &'static [&'static str] {
        METHODS
    }

    fn unlisted(&self) -> &'static [&'static str] {
        &[api::NVME_CONTROLLER_EMU_RENAME]
    }

    fn reads(&self) -> &'static [&'static str] {
        &[api::NVME_SUBSYSTEM_LIST]
    }

    fn call(&mut self, method: &str, params: Option<Value>, cx: &mut SnapCx<'_, '_>) -> Answer {
        let by_id = |p: &api::NvmeControllerIdParams| p.ctrl_id.clone();
        let plug = |p: &api::NvmeControllerHotplugParams| p.ctrl_id.clone();
        match method {
            api::NVME_SUBSYSTEM_LIST => {
                return self.subsystem_list(params, cx.functions).map(Reply::Json);
            }
            api::NVME_SUBSYSTEM_CREATE => self.subsystem_create(params),
            api::NVME_SUBSYSTEM_DESTROY => self.subsystem_destroy(params, cx),
            api::NVME_NAMESPACE_CREATE => self.namespace_create(params, cx),
            api::NVME_NAMESPACE_DESTROY => self.namespace_destroy(params, cx.visible),
            api::NVME_CONTROLLER_CREATE => self.controller_create(params, cx.functions),
            api::NVME_CONTROLLER_DESTROY => self.controller_destroy(params, cx),
            api::NVME_CONTROLLER_LIST => self.controller_list(params, cx.functions),
            api::NVME_CONTROLLER_ATTACH_NS => self.controller_attach_ns(params, cx),
            api::NVME_CONTROLLER_DETACH_NS => self.controller_detach_ns(params, cx.visible),
            api::NVME_CONTROLLER_RESUME => {
                let ci = self.ctrl(&id_of(params, by_id)?)?;
                resume(self, ci, cx)
            }
            api::NVME_CONTROLLER_SUSPEND => {
                let ci = self.ctrl(&id_of(params, by_id)?)?;
                suspend(self, ci)
            }
            api::NVME_CONTROLLER_HOTPLUG => {
                let ci = self.ctrl(&id_of(params, plug)?)?;
                hotplug(self, ci, cx)
            }
            api::NVME_CONTROLLER_HOTUNPLUG => {
                let ci = self.ctrl(&id_of(params, plug)?)?;
                hotunplug(self, ci, cx)
            }
            api::NVME_CONTROLLER_EMU_RENAME => {
                let ci = self.ctrl(&id_of(params, plug)?)?;
                self.emu_rename(ci, cx.visible)
            }
            api::NVME_FUNCTION_CREATE => function_create(params, Kind::Nvme, cx.functions),
            api::NVME_FUNCTION_DESTROY => function_destroy(params, Kind::Nvme, cx),
            _ => Err(RpcError::method_not_found()),
        }
        .map(Into::into)
    }

    fn writes(&self, bdev: &str) -> bool {
        self.subsystems
            .iter()
            .flat_map(|s| &s.namespaces)
            .any(|n| n.bdev == bdev)
    }

    /// Namespaces of a bdev that is going are removed, their disks first.
    fn release(&mut self, bdev: &str, visible: &Visible) {
        let doomed: Vec<(String, u32)> = self
            .subsystems
            .iter()
            .flat_map(|s| {
                s.namespaces
                    .iter()
                    .filter(|n| n.bdev == bdev)
                    .map(|n| (s.nqn.clone(), n.nsid))
            })
            .collect();
        for (nqn, nsid) in doomed {
            self.remove_namespace(&nqn, nsid, visible);
        }
    }

    fn disks_of(&self, bdev: &str) -> Vec<DiskRef> {
        let mut out = vec![];
        for c in &self.ctrls {
            for (nsid, disk) in &c.disks {
                if self
                    .namespace(&c.nqn, *nsid)
                    .is_some_and(|n| n.bdev == bdev)
                {
                    out.push(disk.clone());
                }
            }
        }
        out
    }
}

/// Decodes a controller method's params and returns the controller they name.
fn id_of<P: serde::de::DeserializeOwned>(
    params: Option<Value>,
    id: impl FnOnce(&P) -> String,
) -> Result<String, RpcError> {
    let p: P = decode(params, OnDecodeError::DecodeFailed)?;
    Ok(id(&p))
}

/// A controller as both listings show it; `s` is its subsystem, `f` its function.
fn ctrl_view<'a>(
    s: Option<&'a Subsystem>,
    f: Option<&Function>,
    c: &'a Ctrl,
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
        max_queues: MAX_QUEUES,
        mdts: c.mdts,
        namespaces,
    }
}

fn subsystem_view(s: &Subsystem) -> api::SubsystemView<'_> {
    api::SubsystemView {
        nqn: &s.nqn,
        sn: &s.sn,
        mn: &s.mn,
        nn: s.nn,
        mnan: s.mnan,
    }
}
