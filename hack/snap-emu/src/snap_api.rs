//! Every SNAP-4 JSON name in one place: method names, parameter names and the
//! keys of results. A SNAP version that renames something is a change here only.
//!
//! Names marked "verified" in `reference/snap4-rpc.md` are what NVIDIA's own
//! DPF code sends; the virtio-blk JSON names are inferred from the public CLI
//! (`ctrl`, `bdev`, `vblk_id`, ...), and so are result objects the reference
//! leaves open (create results, virtio-blk listing extras).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub(crate) const EMULATION_FUNCTION_LIST: &str = "emulation_function_list";
pub(crate) const NVME_SUBSYSTEM_CREATE: &str = "nvme_subsystem_create";
pub(crate) const NVME_SUBSYSTEM_DESTROY: &str = "nvme_subsystem_destroy";
pub(crate) const NVME_SUBSYSTEM_LIST: &str = "nvme_subsystem_list";
pub(crate) const NVME_NAMESPACE_CREATE: &str = "nvme_namespace_create";
pub(crate) const NVME_NAMESPACE_DESTROY: &str = "nvme_namespace_destroy";
pub(crate) const NVME_CONTROLLER_CREATE: &str = "nvme_controller_create";
pub(crate) const NVME_CONTROLLER_DESTROY: &str = "nvme_controller_destroy";
pub(crate) const NVME_CONTROLLER_LIST: &str = "nvme_controller_list";
pub(crate) const NVME_CONTROLLER_ATTACH_NS: &str = "nvme_controller_attach_ns";
pub(crate) const NVME_CONTROLLER_DETACH_NS: &str = "nvme_controller_detach_ns";
pub(crate) const NVME_CONTROLLER_RESUME: &str = "nvme_controller_resume";
pub(crate) const NVME_CONTROLLER_SUSPEND: &str = "nvme_controller_suspend";
pub(crate) const NVME_CONTROLLER_HOTPLUG: &str = "nvme_controller_hotplug";
pub(crate) const NVME_CONTROLLER_HOTUNPLUG: &str = "nvme_controller_hotunplug";
pub(crate) const NVME_FUNCTION_CREATE: &str = "nvme_function_create";
pub(crate) const NVME_FUNCTION_DESTROY: &str = "nvme_function_destroy";
pub(crate) const VIRTIO_BLK_FUNCTION_CREATE: &str = "virtio_blk_function_create";
pub(crate) const VIRTIO_BLK_FUNCTION_DESTROY: &str = "virtio_blk_function_destroy";
pub(crate) const VIRTIO_BLK_CONTROLLER_CREATE: &str = "virtio_blk_controller_create";
pub(crate) const VIRTIO_BLK_CONTROLLER_DESTROY: &str = "virtio_blk_controller_destroy";
pub(crate) const VIRTIO_BLK_CONTROLLER_LIST: &str = "virtio_blk_controller_list";
pub(crate) const VIRTIO_BLK_CONTROLLER_BDEV_ATTACH: &str = "virtio_blk_controller_bdev_attach";
pub(crate) const VIRTIO_BLK_CONTROLLER_BDEV_DETACH: &str = "virtio_blk_controller_bdev_detach";
pub(crate) const VIRTIO_BLK_CONTROLLER_HOTPLUG: &str = "virtio_blk_controller_hotplug";
pub(crate) const VIRTIO_BLK_CONTROLLER_HOTUNPLUG: &str = "virtio_blk_controller_hotunplug";
pub(crate) const VIRTIO_BLK_CONTROLLER_SUSPEND: &str = "virtio_blk_controller_suspend";
pub(crate) const VIRTIO_BLK_CONTROLLER_RESUME: &str = "virtio_blk_controller_resume";

/// virtio-fs, as NVIDIA DPF's storage client drives it (see
/// `docs/virtio-fs.md`): a transport, DOCA managers and their hot-pluggable
/// functions, and devices serving an fsdev under a tag.
pub(crate) const VIRTIO_FS_GET_TRANSPORTS: &str = "virtio_fs_get_transports";
pub(crate) const VIRTIO_FS_TRANSPORT_CREATE: &str = "virtio_fs_transport_create";
pub(crate) const VIRTIO_FS_TRANSPORT_START: &str = "virtio_fs_transport_start";
pub(crate) const VIRTIO_FS_DOCA_GET_MANAGERS: &str = "virtio_fs_doca_get_managers";
pub(crate) const VIRTIO_FS_DOCA_MANAGER_CREATE: &str = "virtio_fs_doca_manager_create";
pub(crate) const VIRTIO_FS_DOCA_FUNCTION_CREATE: &str = "virtio_fs_doca_function_create";
pub(crate) const VIRTIO_FS_DOCA_GET_FUNCTIONS: &str = "virtio_fs_doca_get_functions";
pub(crate) const VIRTIO_FS_DOCA_FUNCTION_DESTROY: &str = "virtio_fs_doca_function_destroy";
pub(crate) const VIRTIO_FS_DEVICE_CREATE: &str = "virtio_fs_device_create";
pub(crate) const VIRTIO_FS_DOCA_DEVICE_MODIFY: &str = "virtio_fs_doca_device_modify";
pub(crate) const VIRTIO_FS_DEVICE_START: &str = "virtio_fs_device_start";
pub(crate) const VIRTIO_FS_DEVICE_STOP: &str = "virtio_fs_device_stop";
pub(crate) const VIRTIO_FS_DOCA_DEVICE_HOTPLUG: &str = "virtio_fs_doca_device_hotplug";
pub(crate) const VIRTIO_FS_DOCA_DEVICE_HOTUNPLUG: &str = "virtio_fs_doca_device_hotunplug";
pub(crate) const VIRTIO_FS_DEVICE_DESTROY: &str = "virtio_fs_device_destroy";
pub(crate) const VIRTIO_FS_GET_DEVICES: &str = "virtio_fs_get_devices";
/// DOCA SNAP's NFS fsdev, as DPF's storage plugin calls it (`fsdev/nfs.rs`).
pub(crate) const FSDEV_NFS_CREATE: &str = "fsdev_nfs_create";
pub(crate) const FSDEV_NFS_DELETE: &str = "fsdev_nfs_delete";
/// The one transport SNAP's virtio-fs has.
pub(crate) const VIRTIO_FS_TRANSPORT_DOCA: &str = "DOCA";
/// `struct virtio_fs_config`'s tag field.
pub(crate) const VIRTIO_FS_TAG_MAX: usize = 36;

/// Emulator-only test knobs, in the controller families they act on; no
/// SNAP has them and `rpc_get_methods` does not list them. They do what a
/// real host does on its own: here, name a controller's disks anew after a
/// reconnect (same devices, same identity).
pub(crate) const NVME_CONTROLLER_EMU_RENAME: &str = "nvme_controller_emu_rename";
pub(crate) const VIRTIO_BLK_CONTROLLER_EMU_RENAME: &str = "virtio_blk_controller_emu_rename";

/// The emulations SNAP offers, each on PCI functions of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Emulation {
    Nvme,
    VirtioBlk,
    /// Listed by `virtio_fs_doca_get_functions` only.
    VirtioFs,
}

/// Value of `emulation_type`.
pub(crate) fn emulation_type(e: Emulation) -> &'static str {
    match e {
        Emulation::Nvme => "NVME",
        Emulation::VirtioBlk => "VBLK",
        Emulation::VirtioFs => "VIRTIOFS",
    }
}

/// Default names SNAP gives controllers created without `ctrl`.
pub(crate) const NVME_CTRL_PREFIX: &str = "NVMeCtrl";
pub(crate) const VIRTIO_BLK_CTRL_PREFIX: &str = "VblkCtrl";

/// Defaults of a subsystem created with only `nqn` (values seen on BF3).
pub(crate) const DEFAULT_MN: &str = "BlueField NVMe SNAP Controller";
pub(crate) const DEFAULT_NN: u32 = 1024;
pub(crate) const DEFAULT_MNAN: u32 = 1024;
/// The only `bdev_type` SNAP namespaces take in this setup.
pub(crate) const BDEV_TYPE_SPDK: &str = "spdk";

// ---- parameters -------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VirtioFsTransportParams {
    pub transport_name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VirtioFsManagerParams {
    pub manager: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VirtioFsFunctionParams {
    pub manager: String,
    pub vuid: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VirtioFsDeviceCreateParams {
    pub transport_name: String,
    pub dev_name: String,
    pub tag: String,
    pub fsdev: String,
    pub num_request_queues: Option<u32>,
    pub queue_size: Option<u32>,
    /// The host's platform, for SNAP's DMA setup: nothing to emulate.
    #[serde(default, rename = "driver_platform")]
    pub _driver_platform: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VirtioFsDeviceModifyParams {
    pub dev_name: String,
    pub manager: String,
    pub vuid: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VirtioFsDeviceParams {
    pub dev_name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VirtioFsHotplugParams {
    pub dev_name: String,
    /// SNAP answers once the host saw the change either way here.
    #[serde(default, rename = "wait_for_done")]
    pub _wait_for_done: bool,
}

/// A transport as `virtio_fs_get_transports` lists it.
pub(crate) fn virtio_fs_transport_json(name: &str, started: bool, managers: &[String]) -> Value {
    let managers: Vec<Value> = managers.iter().map(|m| json!({"name": m})).collect();
    json!({
        "name": name,
        "state": if started { "started" } else { "created" },
        "managers": managers,
    })
}

/// A manager's functions as `virtio_fs_doca_get_functions` lists them;
/// `functions` are `(pci_address, vuid)`.
pub(crate) fn virtio_fs_functions_json(manager: &str, functions: &[(String, &str)]) -> Value {
    let list: Vec<Value> = functions
        .iter()
        .map(|(pci_address, vuid)| {
            json!({
                "hot pluggable": true,
                "pci_address": pci_address,
                "vuid": vuid,
                "function_type": "PF",
            })
        })
        .collect();
    json!({"manager": manager, "Function List": list})
}

/// A device as `virtio_fs_get_devices` lists it.
pub(crate) struct VirtioFsDeviceView<'a> {
    pub name: &'a str,
    pub transport_name: &'a str,
    pub running: bool,
    pub fsdev: &'a str,
    pub tag: &'a str,
    pub queue_size: u32,
    pub num_request_queues: u32,
}

pub(crate) fn virtio_fs_device_json(d: VirtioFsDeviceView) -> Value {
    json!({
        "name": d.name,
        "transport_name": d.transport_name,
        "state": if d.running { "running" } else { "stopped" },
        "fsdev": d.fsdev,
        "tag": d.tag,
        "queue_size": d.queue_size,
        "num_request_queues": d.num_request_queues,
    })
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct FunctionListParams {
    #[serde(default)]
    pub all: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Some options are accepted for compatibility only.
pub(crate) struct SubsystemCreateParams {
    pub nqn: String,
    pub mn: Option<String>,
    pub sn: Option<String>,
    pub nn: Option<u32>,
    pub mnan: Option<u32>,
    pub single_ctrl: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SubsystemDestroyParams {
    pub nqn: String,
    #[serde(default)]
    pub force: bool,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct SubsystemListParams {
    pub nqn: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Some options are accepted for compatibility only.
pub(crate) struct NamespaceCreateParams {
    pub bdev_type: String,
    pub nqn: String,
    pub nsid: Option<u32>,
    pub uuid: Option<String>,
    pub bdev_name: String,
    pub nguid: Option<String>,
    pub eui64: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NamespaceDestroyParams {
    pub nqn: String,
    pub nsid: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Some options are accepted for compatibility only.
pub(crate) struct NvmeControllerCreateParams {
    pub nqn: String,
    pub pci_bdf: Option<String>,
    pub vuid: Option<String>,
    pub pf_id: Option<u32>,
    pub vf_id: Option<u32>,
    pub vhca_id: Option<u32>,
    pub ctrl: Option<String>,
    #[serde(default)]
    pub suspended: bool,
    pub num_queues: Option<u32>,
    pub mdts: Option<u32>,
    #[serde(default)]
    pub admin_only: bool,
    #[serde(default)]
    pub live_update_listener: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NvmeControllerNsParams {
    pub ctrl_id: String,
    pub nsid: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Some options are accepted for compatibility only.
pub(crate) struct NvmeControllerIdParams {
    pub ctrl_id: String,
    /// Accepted by suspend/resume on SNAP; nothing to wait for here.
    pub timeout_ms: Option<u32>,
    #[serde(default)]
    pub admin_only: bool,
    #[serde(default)]
    pub live_update_notifier: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NvmeControllerDestroyParams {
    pub ctrl_id: String,
    #[serde(default)]
    pub force: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Some options are accepted for compatibility only.
pub(crate) struct NvmeControllerHotplugParams {
    pub ctrl_id: String,
    #[serde(default)]
    pub wait_for_done: bool,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct NvmeControllerListParams {
    pub ctrl_id: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct FunctionCreateParams {}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FunctionDestroyParams {
    pub vuid: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VirtioBlkControllerCreateParams {
    pub ctrl: Option<String>,
    pub pf_id: Option<u32>,
    pub vf_id: Option<u32>,
    pub vuid: Option<String>,
    pub pci_bdf: Option<String>,
    pub vhca_id: Option<u32>,
    pub bdev: Option<String>,
    pub num_queues: Option<u32>,
    pub queue_size: Option<u32>,
    pub seg_max: Option<u32>,
    pub size_max: Option<u32>,
    pub vblk_id: Option<String>,
    #[serde(default)]
    pub suspended: bool,
    #[serde(default)]
    pub read_only: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VirtioBlkCtrlParams {
    pub ctrl: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VirtioBlkDestroyParams {
    pub ctrl: String,
    #[serde(default)]
    pub force: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Some options are accepted for compatibility only.
pub(crate) struct VirtioBlkHotplugParams {
    pub ctrl: String,
    #[serde(default)]
    pub wait_for_done: bool,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct VirtioBlkListParams {
    pub ctrl: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VirtioBlkBdevAttachParams {
    pub ctrl: String,
    pub bdev: String,
    pub vblk_id: Option<String>,
}

// ---- results ----------------------------------------------------------------

/// One entry of `emulation_function_list` (a PF, or a VF without `vfs`).
/// A function as `emulation_function_list` shows it. The listings are
/// serialised straight from these (no `Value` in between): with hundreds of
/// functions and subsystems, building the `Value` cost more than the rest of
/// the call. Field order is key order.
#[derive(Serialize)]
pub(crate) struct FunctionJson<'a> {
    hotplugged: bool,
    emulation_type: &'static str,
    pf_index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    vf_index: Option<u32>,
    pci_bdf: &'a str,
    vhca_id: u32,
    vuid: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    ctrl_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vfs: Option<Vec<FunctionJson<'a>>>,
}

/// A function as SNAP shows it.
pub(crate) struct FunctionView<'a> {
    pub hotplugged: bool,
    pub emulation: Emulation,
    pub pf_index: u32,
    pub vf_index: Option<u32>,
    pub pci_bdf: &'a str,
    pub vhca_id: u32,
    pub vuid: &'a str,
    pub ctrl_id: Option<&'a str>,
}

pub(crate) fn function_json<'a>(
    f: FunctionView<'a>,
    vfs: Option<Vec<FunctionJson<'a>>>,
) -> FunctionJson<'a> {
    FunctionJson {
        hotplugged: f.hotplugged,
        emulation_type: emulation_type(f.emulation),
        pf_index: f.pf_index,
        vf_index: f.vf_index,
        pci_bdf: f.pci_bdf,
        vhca_id: f.vhca_id,
        vuid: f.vuid,
        ctrl_id: f.ctrl_id,
        vfs,
    }
}

pub(crate) fn function_created_json(f: FunctionView) -> Value {
    json!({"vuid": f.vuid, "vhca_id": f.vhca_id})
}

pub(crate) struct SubsystemView<'a> {
    pub nqn: &'a str,
    pub sn: &'a str,
    pub mn: &'a str,
    pub nn: u32,
    pub mnan: u32,
}

pub(crate) fn subsystem_created_json(s: &SubsystemView) -> Value {
    json!({"nqn": s.nqn, "sn": s.sn, "mn": s.mn, "nn": s.nn, "mnan": s.mnan})
}

/// A subsystem as `nvme_subsystem_list` shows it.
#[derive(Serialize)]
pub(crate) struct SubsystemJson<'a> {
    nqn: &'a str,
    sn: &'a str,
    mn: &'a str,
    nn: u32,
    mnan: u32,
    controllers: Vec<SubsystemCtrlJson<'a>>,
    namespaces: Vec<SubsystemNamespaceJson<'a>>,
}

pub(crate) fn subsystem_json<'a>(
    s: &SubsystemView<'a>,
    controllers: Vec<SubsystemCtrlJson<'a>>,
    namespaces: Vec<SubsystemNamespaceJson<'a>>,
) -> SubsystemJson<'a> {
    SubsystemJson {
        nqn: s.nqn,
        sn: s.sn,
        mn: s.mn,
        nn: s.nn,
        mnan: s.mnan,
        controllers,
        namespaces,
    }
}

pub(crate) fn namespace_created_json(nqn: &str, nsid: u32, bdev: &str, uuid: &str) -> Value {
    json!({"nqn": nqn, "nsid": nsid, "bdev": bdev, "uuid": uuid})
}

/// `{nsid, bdev, uuid}` as listed under a controller.
#[derive(Serialize)]
pub(crate) struct CtrlNamespaceJson<'a> {
    nsid: u32,
    bdev: &'a str,
    uuid: &'a str,
}

pub(crate) fn ctrl_namespace_json<'a>(
    nsid: u32,
    bdev: &'a str,
    uuid: &'a str,
) -> CtrlNamespaceJson<'a> {
    CtrlNamespaceJson { nsid, bdev, uuid }
}

/// A namespace as `nvme_subsystem_list` shows it.
#[derive(Serialize)]
pub(crate) struct SubsystemNamespaceJson<'a> {
    nsid: u32,
    bdev: &'a str,
    uuid: &'a str,
    nqn: &'a str,
    ready: &'static str,
    #[serde(rename = "max inflights per weight")]
    max_inflights_per_weight: u32,
    controllers: Vec<CtrlIdJson<'a>>,
}

#[derive(Serialize)]
pub(crate) struct CtrlIdJson<'a> {
    ctrl_id: &'a str,
}

pub(crate) fn subsystem_namespace_json<'a>(
    nsid: u32,
    bdev: &'a str,
    uuid: &'a str,
    nqn: &'a str,
    ready: bool,
    ctrl_id: Option<&'a str>,
) -> SubsystemNamespaceJson<'a> {
    SubsystemNamespaceJson {
        nsid,
        bdev,
        uuid,
        nqn,
        ready: if ready { "Yes" } else { "No" },
        max_inflights_per_weight: 65535,
        controllers: ctrl_id
            .map(|ctrl_id| CtrlIdJson { ctrl_id })
            .into_iter()
            .collect(),
    }
}

pub(crate) struct NvmeCtrlView<'a> {
    pub ctrl_id: &'a str,
    pub vhca_id: u32,
    pub nqn: &'a str,
    pub plugged: bool,
    pub suspended: bool,
    pub num_queues: u32,
    pub max_queues: u32,
    pub mdts: u32,
    pub namespaces: Vec<CtrlNamespaceJson<'a>>,
}

fn state_name(suspended: bool) -> &'static str {
    if suspended { "SUSPENDED" } else { "STARTED" }
}

/// A controller as `nvme_subsystem_list` shows it.
#[derive(Serialize)]
pub(crate) struct SubsystemCtrlJson<'a> {
    ctrl_id: &'a str,
    vhca_id: u32,
    nqn: &'a str,
    plugged: bool,
    state: &'static str,
    num_queues: u32,
    max_queues: u32,
    mdts: u32,
    namespaces: Vec<CtrlNamespaceJson<'a>>,
}

pub(crate) fn subsystem_ctrl_json(c: NvmeCtrlView) -> SubsystemCtrlJson {
    SubsystemCtrlJson {
        ctrl_id: c.ctrl_id,
        vhca_id: c.vhca_id,
        nqn: c.nqn,
        plugged: c.plugged,
        state: state_name(c.suspended),
        num_queues: c.num_queues,
        max_queues: c.max_queues,
        mdts: c.mdts,
        namespaces: c.namespaces,
    }
}

/// A controller as `nvme_controller_list` shows it.
pub(crate) fn nvme_ctrl_json(c: NvmeCtrlView) -> Value {
    json!({
        "ctrl_id": c.ctrl_id,
        "vhca_id": c.vhca_id,
        "nqn": c.nqn,
        "num_queues": c.num_queues,
        "mdts": c.mdts,
        "namespaces": c.namespaces
    })
}

pub(crate) fn ctrl_created_json(ctrl_id: &str, f: FunctionView) -> Value {
    json!({
        "ctrl_id": ctrl_id,
        "vhca_id": f.vhca_id,
        "vuid": f.vuid,
        "pci_bdf": f.pci_bdf
    })
}

pub(crate) struct VirtioCtrlView<'a> {
    pub ctrl_id: &'a str,
    pub vhca_id: u32,
    pub num_queues: u32,
    pub queue_size: u32,
    pub seg_max: u32,
    pub size_max: u32,
    pub vblk_id: &'a str,
    pub bdev: &'a str,
    pub read_only: bool,
    pub pci_bdf: &'a str,
    pub vuid: &'a str,
    pub plugged: bool,
    pub suspended: bool,
}

pub(crate) fn virtio_ctrl_json(c: VirtioCtrlView) -> Value {
    json!({
        "ctrl_id": c.ctrl_id,
        "vhca_id": c.vhca_id,
        "num_queues": c.num_queues,
        "queue_size": c.queue_size,
        "seg_max": c.seg_max,
        "size_max": c.size_max,
        "vblk_id": c.vblk_id,
        "bdev": c.bdev,
        "read_only": c.read_only,
        "pci_bdf": c.pci_bdf,
        "vuid": c.vuid,
        "plugged": c.plugged,
        "state": state_name(c.suspended)
    })
}
