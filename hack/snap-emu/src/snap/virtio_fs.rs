//! SNAP's virtio-fs emulation, as NVIDIA DPF's storage drives it
//! (`docs/virtio-fs.md`): the DOCA transport, managers and their
//! hot-pluggable functions, and devices that serve an fsdev under a tag.
//! A device is bound to a function (`virtio_fs_doca_device_modify`), and the
//! host sees it while it runs on a plugged function; the host side mounts
//! the fsdev's tree (`crate::host`).
//!
//! Errors follow the other emulations (`super`): unknown objects -19,
//! existing ones -17, in use -16, invalid values -22 (a tag that is empty,
//! longer than 36 bytes, or that names no directory: `/`, `.`, `..`), a
//! transport started twice -114.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::emulation::{Emulation, SnapCx};
use super::hotplug::{plug_function, unplug_function};
use super::visible::Visible;
use crate::host::DiskRef;
use crate::registry::Answer;
use crate::rpc::{
    EALREADY, EBUSY, EEXIST, EINVAL, ENODEV, OnDecodeError, RpcError, RpcResult, decode,
};
use crate::snap_api::{self as api, Emulation as Kind};

const METHODS: &[&str] = &[
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
];

const READS: &[&str] = &[
    api::VIRTIO_FS_GET_TRANSPORTS,
    api::VIRTIO_FS_DOCA_GET_MANAGERS,
    api::VIRTIO_FS_DOCA_GET_FUNCTIONS,
    api::VIRTIO_FS_GET_DEVICES,
];

const DEFAULT_QUEUES: u32 = 1;
const DEFAULT_QUEUE_SIZE: u32 = 128;

#[derive(Debug)]
struct Device {
    name: String,
    transport: String,
    tag: String,
    fsdev: String,
    num_request_queues: u32,
    queue_size: u32,
    /// The function it is bound to.
    vuid: Option<String>,
    running: bool,
    /// Its `<n>` on the host while the host sees it.
    shown: Option<u32>,
}

#[derive(Debug, Default)]
pub(super) struct VirtioFs {
    /// Transports by name, and whether started.
    transports: BTreeMap<String, bool>,
    managers: Vec<String>,
    /// Each function's manager, by VUID.
    functions: BTreeMap<String, String>,
    devices: Vec<Device>,
}

fn decode_p<T: serde::de::DeserializeOwned>(params: Option<Value>) -> Result<T, RpcError> {
    decode(params, OnDecodeError::DecodeFailed)
}

impl VirtioFs {
    fn device(&self, name: &str) -> Result<usize, RpcError> {
        self.devices
            .iter()
            .position(|d| d.name == name)
            .ok_or(RpcError::errno(ENODEV))
    }

    fn manager(&self, name: &str) -> Result<(), RpcError> {
        if !self.managers.iter().any(|m| m == name) {
            return Err(RpcError::errno(ENODEV));
        }
        Ok(())
    }

    fn transport_create(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::VirtioFsTransportParams = decode_p(params)?;
        if p.transport_name != api::VIRTIO_FS_TRANSPORT_DOCA {
            return Err(RpcError::errno(EINVAL));
        }
        if self.transports.contains_key(&p.transport_name) {
            return Err(RpcError::errno(EEXIST));
        }
        self.transports.insert(p.transport_name, false);
        Ok(json!(true))
    }

    fn transport_start(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::VirtioFsTransportParams = decode_p(params)?;
        let started = self
            .transports
            .get_mut(&p.transport_name)
            .ok_or(RpcError::errno(ENODEV))?;
        if std::mem::replace(started, true) {
            return Err(RpcError::errno(EALREADY));
        }
        Ok(json!(true))
    }

    fn manager_create(&mut self, params: Option<Value>) -> RpcResult {
        let p: api::VirtioFsManagerParams = decode_p(params)?;
        if p.manager.is_empty() {
            return Err(RpcError::errno(EINVAL));
        }
        if self.manager(&p.manager).is_ok() {
            return Err(RpcError::errno(EEXIST));
        }
        self.managers.push(p.manager);
        Ok(json!(true))
    }

    fn function_create(&mut self, params: Option<Value>, cx: &mut SnapCx<'_, '_>) -> RpcResult {
        let p: api::VirtioFsManagerParams = decode_p(params)?;
        self.manager(&p.manager)?;
        let vuid = cx.functions.create_hotplug(Kind::VirtioFs)?.vuid.clone();
        self.functions.insert(vuid.clone(), p.manager);
        Ok(json!(vuid))
    }

    fn get_functions(&self, cx: &SnapCx<'_, '_>) -> RpcResult {
        let out = self
            .managers
            .iter()
            .map(|m| {
                let fns: Vec<(String, &str)> = self
                    .functions
                    .iter()
                    .filter(|(_, manager)| *manager == m)
                    .filter_map(|(vuid, _)| cx.functions.get(vuid))
                    .map(|f| (f.pci_address(), f.vuid.as_str()))
                    .collect();
                api::virtio_fs_functions_json(m, &fns)
            })
            .collect();
        Ok(Value::Array(out))
    }

    /// The function `vuid` of `manager`, or -19.
    fn function(&self, manager: &str, vuid: &str) -> Result<(), RpcError> {
        self.manager(manager)?;
        match self.functions.get(vuid) {
            Some(m) if m == manager => Ok(()),
            _ => Err(RpcError::errno(ENODEV)),
        }
    }

    fn function_destroy(&mut self, params: Option<Value>, cx: &mut SnapCx<'_, '_>) -> RpcResult {
        let p: api::VirtioFsFunctionParams = decode_p(params)?;
        self.function(&p.manager, &p.vuid)?;
        if self
            .devices
            .iter()
            .any(|d| d.vuid.as_ref() == Some(&p.vuid))
        {
            return Err(RpcError::errno(EBUSY));
        }
        cx.functions.remove(&p.vuid);
        self.functions.remove(&p.vuid);
        Ok(json!(true))
    }

    fn device_create(&mut self, params: Option<Value>, cx: &mut SnapCx<'_, '_>) -> RpcResult {
        let p: api::VirtioFsDeviceCreateParams = decode_p(params)?;
        if !self.transports.contains_key(&p.transport_name) {
            return Err(RpcError::errno(ENODEV));
        }
        check_tag(&p.tag)?;
        if cx.spdk.fsdevs.get(&p.fsdev).is_none() {
            return Err(RpcError::errno(ENODEV));
        }
        if self
            .devices
            .iter()
            .any(|d| d.name == p.dev_name || d.tag == p.tag)
        {
            return Err(RpcError::errno(EEXIST));
        }
        self.devices.push(Device {
            name: p.dev_name,
            transport: p.transport_name,
            tag: p.tag,
            fsdev: p.fsdev,
            num_request_queues: p.num_request_queues.unwrap_or(DEFAULT_QUEUES),
            queue_size: p.queue_size.unwrap_or(DEFAULT_QUEUE_SIZE),
            vuid: None,
            running: false,
            shown: None,
        });
        let _ = p.driver_platform;
        Ok(json!(true))
    }

    fn device_modify(&mut self, params: Option<Value>, cx: &mut SnapCx<'_, '_>) -> RpcResult {
        let p: api::VirtioFsDeviceModifyParams = decode_p(params)?;
        let di = self.device(&p.dev_name)?;
        self.function(&p.manager, &p.vuid)?;
        let d = &self.devices[di];
        if d.vuid.as_ref() == Some(&p.vuid) {
            return Ok(json!(true));
        }
        let taken = self
            .devices
            .iter()
            .any(|o| o.vuid.as_ref() == Some(&p.vuid));
        if d.vuid.is_some() || d.running || taken {
            return Err(RpcError::errno(EBUSY));
        }
        let f = cx
            .functions
            .get_mut(&p.vuid)
            .ok_or(RpcError::errno(ENODEV))?;
        f.ctrl_id = Some(p.dev_name);
        self.devices[di].vuid = Some(p.vuid);
        Ok(json!(true))
    }

    fn start(&mut self, di: usize, cx: &mut SnapCx<'_, '_>) -> RpcResult {
        let d = &self.devices[di];
        if d.running {
            return Err(RpcError::errno(EALREADY));
        }
        if self.transports.get(&d.transport) != Some(&true) {
            return Err(RpcError::errno(EINVAL));
        }
        if cx.spdk.fsdevs.get(&d.fsdev).is_none() {
            return Err(RpcError::errno(ENODEV));
        }
        self.devices[di].running = true;
        if let Err(e) = self.reconcile(di, cx) {
            self.devices[di].running = false;
            return Err(e);
        }
        Ok(json!(true))
    }

    fn stop(&mut self, di: usize, visible: &Visible) -> RpcResult {
        if !self.devices[di].running {
            return Err(RpcError::errno(EALREADY));
        }
        self.hide(di, visible);
        self.devices[di].running = false;
        Ok(json!(true))
    }

    fn hotplug(&mut self, di: usize, cx: &mut SnapCx<'_, '_>) -> RpcResult {
        let vuid = self.devices[di]
            .vuid
            .clone()
            .ok_or(RpcError::errno(EINVAL))?;
        plug_function(cx.functions, cx.visible, &vuid)?;
        if let Err(e) = self.reconcile(di, cx) {
            unplug_function(cx.functions, cx.visible, &vuid)?;
            return Err(e);
        }
        Ok(json!(true))
    }

    fn hotunplug(&mut self, di: usize, cx: &mut SnapCx<'_, '_>) -> RpcResult {
        let vuid = self.devices[di]
            .vuid
            .clone()
            .ok_or(RpcError::errno(EINVAL))?;
        let plugged = cx.functions.get(&vuid).is_some_and(|f| f.bdf.is_some());
        if !plugged {
            return Err(RpcError::errno(ENODEV));
        }
        self.hide(di, cx.visible);
        unplug_function(cx.functions, cx.visible, &vuid)?;
        Ok(json!(true))
    }

    fn destroy(&mut self, di: usize, cx: &mut SnapCx<'_, '_>) -> RpcResult {
        let d = &self.devices[di];
        let plugged = d
            .vuid
            .as_ref()
            .and_then(|v| cx.functions.get(v))
            .is_some_and(|f| f.bdf.is_some());
        if d.running || plugged {
            return Err(RpcError::errno(EBUSY));
        }
        let d = self.devices.remove(di);
        if let Some(f) = d.vuid.and_then(|v| cx.functions.get_mut(&v)) {
            f.ctrl_id = None;
        }
        Ok(json!(true))
    }

    fn get_devices(&self) -> RpcResult {
        let out = self
            .devices
            .iter()
            .map(|d| {
                api::virtio_fs_device_json(api::VirtioFsDeviceView {
                    name: &d.name,
                    transport_name: &d.transport,
                    running: d.running,
                    fsdev: &d.fsdev,
                    tag: &d.tag,
                    queue_size: d.queue_size,
                    num_request_queues: d.num_request_queues,
                })
            })
            .collect();
        Ok(Value::Array(out))
    }

    /// The host sees a running device on a plugged function whose fsdev is there.
    fn reconcile(&mut self, di: usize, cx: &mut SnapCx<'_, '_>) -> Result<(), RpcError> {
        let d = &self.devices[di];
        let bdf = d
            .vuid
            .as_ref()
            .and_then(|v| cx.functions.get(v)?.bdf.clone());
        let root = cx.spdk.fsdevs.get(&d.fsdev).map(|f| f.root.clone());
        let (Some(bdf), Some(root), true) = (bdf, root, d.running) else {
            self.hide(di, cx.visible);
            return Ok(());
        };
        if d.shown.is_none() {
            self.devices[di].shown = cx.visible.show_virtiofs(&bdf, &d.tag, &root)?;
        }
        Ok(())
    }

    fn hide(&mut self, di: usize, visible: &Visible) {
        if let Some(n) = self.devices[di].shown.take() {
            visible.hide_virtiofs(n);
        }
    }
}

/// A tag the host can read (`struct virtio_fs_config`: at most 36 bytes)
/// and that names a directory (the emulator's host mounts it by that name).
fn check_tag(tag: &str) -> Result<(), RpcError> {
    let nameable = !matches!(tag, "" | "." | "..") && !tag.contains(['/', '\0']);
    if tag.len() > api::VIRTIO_FS_TAG_MAX || !nameable {
        return Err(RpcError::errno(EINVAL));
    }
    Ok(())
}

impl Emulation for VirtioFs {
    fn methods(&self) -> &'static [&'static str] {
        METHODS
    }

    fn reads(&self) -> &'static [&'static str] {
        READS
    }

    fn call(&mut self, method: &str, params: Option<Value>, cx: &mut SnapCx<'_, '_>) -> Answer {
        let device = |params| -> Result<usize, RpcError> {
            let p: api::VirtioFsDeviceParams = decode_p(params)?;
            self.device(&p.dev_name)
        };
        let plugged = |params| -> Result<usize, RpcError> {
            let p: api::VirtioFsHotplugParams = decode_p(params)?;
            self.device(&p.dev_name)
        };
        match method {
            api::VIRTIO_FS_GET_TRANSPORTS => Ok(Value::Array(
                self.transports
                    .iter()
                    .map(|(name, started)| {
                        api::virtio_fs_transport_json(name, *started, &self.managers)
                    })
                    .collect(),
            )),
            api::VIRTIO_FS_TRANSPORT_CREATE => self.transport_create(params),
            api::VIRTIO_FS_TRANSPORT_START => self.transport_start(params),
            api::VIRTIO_FS_DOCA_GET_MANAGERS => Ok(Value::Array(
                self.managers.iter().map(|m| json!({"name": m})).collect(),
            )),
            api::VIRTIO_FS_DOCA_MANAGER_CREATE => self.manager_create(params),
            api::VIRTIO_FS_DOCA_FUNCTION_CREATE => self.function_create(params, cx),
            api::VIRTIO_FS_DOCA_GET_FUNCTIONS => self.get_functions(cx),
            api::VIRTIO_FS_DOCA_FUNCTION_DESTROY => self.function_destroy(params, cx),
            api::VIRTIO_FS_DEVICE_CREATE => self.device_create(params, cx),
            api::VIRTIO_FS_DOCA_DEVICE_MODIFY => self.device_modify(params, cx),
            api::VIRTIO_FS_DEVICE_START => {
                let di = device(params)?;
                self.start(di, cx)
            }
            api::VIRTIO_FS_DEVICE_STOP => {
                let di = device(params)?;
                self.stop(di, cx.visible)
            }
            api::VIRTIO_FS_DOCA_DEVICE_HOTPLUG => {
                let di = plugged(params)?;
                self.hotplug(di, cx)
            }
            api::VIRTIO_FS_DOCA_DEVICE_HOTUNPLUG => {
                let di = plugged(params)?;
                self.hotunplug(di, cx)
            }
            api::VIRTIO_FS_DEVICE_DESTROY => {
                let di = device(params)?;
                self.destroy(di, cx)
            }
            api::VIRTIO_FS_GET_DEVICES => self.get_devices(),
            _ => Err(RpcError::method_not_found()),
        }
        .map(Into::into)
    }

    fn writes(&self, _bdev: &str) -> bool {
        false
    }

    fn release(&mut self, _bdev: &str, _visible: &Visible) {}

    fn disks_of(&self, _bdev: &str) -> Vec<DiskRef> {
        Vec::new()
    }

    /// Devices serving a deleted fsdev leave the host; SNAP keeps them.
    fn fsdev_removed(&mut self, fsdev: &str, visible: &Visible) {
        for di in 0..self.devices.len() {
            if self.devices[di].fsdev == fsdev {
                self.hide(di, visible);
            }
        }
    }
}
