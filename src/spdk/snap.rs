//! SNAP-4 (BlueField-3) emulation methods: the emulated PCI functions and the
//! NVMe and virtio-blk controllers on them, and SNAP's virtio-fs service
//! (transport, DOCA manager, hot-plugged functions, devices serving an fsdev).
//!
//! This is the one place that knows SNAP's method and parameter names, so a
//! SNAP version difference is one place to change. The NVMe names are the ones
//! NVIDIA's own DPF code sends (verified); the virtio-blk JSON names are
//! inferred from the public CLI spelling (`reference/snap4-rpc.md`). The
//! virtio-fs names are the ones NVIDIA's DPF storage sends (`docs/virtio-fs.md`
//! says where they come from).

use serde::{Deserialize, Serialize};

use super::method;

/// `emulation_function_list`: every emulated PF with its VFs.
#[derive(Debug, Clone, Serialize)]
pub struct EmulationFunctionList {
    pub all: bool,
}
method!(EmulationFunctionList => "emulation_function_list", Vec<EmulationFunction>);

/// Which protocol a function emulates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EmulationType {
    #[serde(rename = "NVME")]
    Nvme,
    #[serde(rename = "VBLK")]
    VirtioBlk,
}

/// A physical function and its virtual functions.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct EmulationFunction {
    #[serde(default)]
    pub hotplugged: bool,
    pub emulation_type: EmulationType,
    #[serde(default)]
    pub pf_index: Option<u32>,
    /// Host address without PCI domain (`"26:00.1"`); `"00:00.0"` until the
    /// host enumerated a hot-plugged function.
    pub pci_bdf: String,
    pub vhca_id: u32,
    pub vuid: String,
    /// Present when a controller sits on the function.
    #[serde(default)]
    pub ctrl_id: Option<String>,
    #[serde(default)]
    pub vfs: Vec<EmulationVf>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct EmulationVf {
    #[serde(default)]
    pub vf_index: Option<u32>,
    pub pci_bdf: String,
    pub vhca_id: u32,
    pub vuid: String,
    #[serde(default)]
    pub ctrl_id: Option<String>,
}

/// `nvme_subsystem_create`.
#[derive(Debug, Clone, Serialize)]
pub struct NvmeSubsystemCreate {
    pub nqn: String,
    /// Model number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mn: Option<String>,
    /// Serial number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sn: Option<String>,
    /// Maximum namespace id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nn: Option<u32>,
    /// Maximum number of attached namespaces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mnan: Option<u32>,
}
method!(NvmeSubsystemCreate => "nvme_subsystem_create", serde_json::Value);

/// `nvme_subsystem_destroy`.
#[derive(Debug, Clone, Serialize)]
pub struct NvmeSubsystemDestroy {
    pub nqn: String,
}
method!(NvmeSubsystemDestroy => "nvme_subsystem_destroy", serde_json::Value);

/// `nvme_subsystem_list`: subsystems with their controllers and namespaces.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NvmeSubsystemList {}
method!(NvmeSubsystemList => "nvme_subsystem_list", Vec<NvmeSubsystem>);

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NvmeSubsystem {
    pub nqn: String,
    #[serde(default)]
    pub sn: Option<String>,
    #[serde(default)]
    pub mn: Option<String>,
    #[serde(default)]
    pub nn: Option<u32>,
    #[serde(default)]
    pub mnan: Option<u32>,
    #[serde(default)]
    pub controllers: Vec<NvmeController>,
    #[serde(default)]
    pub namespaces: Vec<NvmeSubsystemNamespace>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NvmeSubsystemNamespace {
    pub nsid: u32,
    pub bdev: String,
    #[serde(default)]
    pub uuid: Option<String>,
    /// Controllers the namespace is attached to (at most one).
    #[serde(default)]
    pub controllers: Vec<NvmeControllerRef>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NvmeControllerRef {
    pub ctrl_id: String,
}

/// `nvme_namespace_create`: the namespace exists in the subsystem but no
/// controller shows it until attached.
#[derive(Debug, Clone, Serialize)]
pub struct NvmeNamespaceCreate {
    /// Always `"spdk"`: the namespace is backed by an SPDK bdev.
    pub bdev_type: String,
    pub nqn: String,
    pub nsid: u32,
    pub uuid: String,
    pub bdev_name: String,
}
method!(NvmeNamespaceCreate => "nvme_namespace_create", serde_json::Value);

/// `nvme_namespace_destroy`.
#[derive(Debug, Clone, Serialize)]
pub struct NvmeNamespaceDestroy {
    pub nqn: String,
    pub nsid: u32,
}
method!(NvmeNamespaceDestroy => "nvme_namespace_destroy", serde_json::Value);

/// `nvme_controller_create` on a function chosen by `pci_bdf` or `vuid`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NvmeControllerCreate {
    pub nqn: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci_bdf: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vuid: Option<String>,
    /// Create without letting the host see it until `nvme_controller_resume`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suspended: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_queues: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mdts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_only: Option<bool>,
}
method!(NvmeControllerCreate => "nvme_controller_create", ControllerCreated);

/// What `nvme_controller_create` and `virtio_blk_controller_create` return
/// (for virtio-blk the shape is inferred).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ControllerCreated {
    pub ctrl_id: String,
}

/// `nvme_controller_attach_ns`.
#[derive(Debug, Clone, Serialize)]
pub struct NvmeControllerAttachNs {
    pub ctrl_id: String,
    pub nsid: u32,
}
method!(NvmeControllerAttachNs => "nvme_controller_attach_ns", serde_json::Value);

/// `nvme_controller_detach_ns`.
#[derive(Debug, Clone, Serialize)]
pub struct NvmeControllerDetachNs {
    pub ctrl_id: String,
    pub nsid: u32,
}
method!(NvmeControllerDetachNs => "nvme_controller_detach_ns", serde_json::Value);

/// `nvme_controller_resume`: the host may now use the controller.
#[derive(Debug, Clone, Serialize)]
pub struct NvmeControllerResume {
    pub ctrl_id: String,
}
method!(NvmeControllerResume => "nvme_controller_resume", serde_json::Value);

/// `nvme_controller_destroy`.
#[derive(Debug, Clone, Serialize)]
pub struct NvmeControllerDestroy {
    pub ctrl_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub force: Option<bool>,
}
method!(NvmeControllerDestroy => "nvme_controller_destroy", serde_json::Value);

/// `nvme_controller_list`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NvmeControllerList {}
method!(NvmeControllerList => "nvme_controller_list", Vec<NvmeController>);

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NvmeController {
    pub ctrl_id: String,
    pub vhca_id: u32,
    #[serde(default)]
    pub nqn: Option<String>,
    /// `"SUSPENDED"` until resumed, then running (`"STARTED"` in the
    /// emulator; SNAP's exact words are not public).
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub namespaces: Vec<NvmeControllerNamespace>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NvmeControllerNamespace {
    pub nsid: u32,
    pub bdev: String,
    #[serde(default)]
    pub uuid: Option<String>,
}

/// `virtio_blk_controller_create`: a virtio-blk controller on a function
/// (chosen by `pci_bdf`, `vuid` or `pf_id`/`vf_id`) serving `bdev`; the host
/// reads `vblk_id` as the disk's serial.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VirtioBlkControllerCreate {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci_bdf: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vuid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pf_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vf_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bdev: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vblk_id: Option<String>,
    /// Controller name to use instead of a generated one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ctrl: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_queues: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suspended: Option<bool>,
}
method!(VirtioBlkControllerCreate => "virtio_blk_controller_create", ControllerCreated);

/// `virtio_blk_controller_destroy`.
#[derive(Debug, Clone, Serialize)]
pub struct VirtioBlkControllerDestroy {
    pub ctrl: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub force: Option<bool>,
}
method!(VirtioBlkControllerDestroy => "virtio_blk_controller_destroy", serde_json::Value);

/// `virtio_blk_controller_list`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VirtioBlkControllerList {}
method!(VirtioBlkControllerList => "virtio_blk_controller_list", Vec<VirtioBlkController>);

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct VirtioBlkController {
    pub ctrl_id: String,
    pub vhca_id: u32,
    #[serde(default)]
    pub bdev: Option<String>,
    #[serde(default)]
    pub vblk_id: Option<String>,
    #[serde(default)]
    pub pci_bdf: Option<String>,
}

/// `virtio_blk_controller_bdev_attach`: serve `bdev` on an existing controller.
#[derive(Debug, Clone, Serialize)]
pub struct VirtioBlkControllerBdevAttach {
    pub ctrl: String,
    pub bdev: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vblk_id: Option<String>,
}
method!(VirtioBlkControllerBdevAttach => "virtio_blk_controller_bdev_attach", serde_json::Value);

/// `virtio_blk_controller_bdev_detach`.
#[derive(Debug, Clone, Serialize)]
pub struct VirtioBlkControllerBdevDetach {
    pub ctrl: String,
}
method!(VirtioBlkControllerBdevDetach => "virtio_blk_controller_bdev_detach", serde_json::Value);

/// A hot-plugged function: exists on the DPU, not yet seen by the host.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct CreatedFunction {
    pub vuid: String,
    pub vhca_id: u32,
}

/// `nvme_function_create`: hot-plug a new NVMe PF.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NvmeFunctionCreate {}
method!(NvmeFunctionCreate => "nvme_function_create", CreatedFunction);

/// `nvme_function_destroy`.
#[derive(Debug, Clone, Serialize)]
pub struct NvmeFunctionDestroy {
    pub vuid: String,
}
method!(NvmeFunctionDestroy => "nvme_function_destroy", serde_json::Value);

/// `nvme_controller_hotplug`: show a hot-plugged function's controller to the host.
#[derive(Debug, Clone, Serialize)]
pub struct NvmeControllerHotplug {
    pub ctrl_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_for_done: Option<bool>,
}
method!(NvmeControllerHotplug => "nvme_controller_hotplug", serde_json::Value);

/// `nvme_controller_hotunplug`.
#[derive(Debug, Clone, Serialize)]
pub struct NvmeControllerHotunplug {
    pub ctrl_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_for_done: Option<bool>,
}
method!(NvmeControllerHotunplug => "nvme_controller_hotunplug", serde_json::Value);

/// `virtio_blk_function_create`: hot-plug a new virtio-blk PF.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VirtioBlkFunctionCreate {}
method!(VirtioBlkFunctionCreate => "virtio_blk_function_create", CreatedFunction);

/// `virtio_blk_function_destroy`.
#[derive(Debug, Clone, Serialize)]
pub struct VirtioBlkFunctionDestroy {
    pub vuid: String,
}
method!(VirtioBlkFunctionDestroy => "virtio_blk_function_destroy", serde_json::Value);

/// `virtio_blk_controller_hotplug`.
#[derive(Debug, Clone, Serialize)]
pub struct VirtioBlkControllerHotplug {
    pub ctrl: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_for_done: Option<bool>,
}
method!(VirtioBlkControllerHotplug => "virtio_blk_controller_hotplug", serde_json::Value);

/// `virtio_blk_controller_hotunplug`.
#[derive(Debug, Clone, Serialize)]
pub struct VirtioBlkControllerHotunplug {
    pub ctrl: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_for_done: Option<bool>,
}
method!(VirtioBlkControllerHotunplug => "virtio_blk_controller_hotunplug", serde_json::Value);

/// `virtio_fs_get_transports`: SNAP's virtio-fs transports, with their managers.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VirtioFsGetTransports {}
method!(VirtioFsGetTransports => "virtio_fs_get_transports", Vec<VirtioFsTransport>);

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct VirtioFsTransport {
    pub name: String,
    /// `"started"` once `virtio_fs_transport_start` ran.
    #[serde(default)]
    pub state: Option<String>,
}

/// The one transport DPF's storage uses on a BlueField.
pub const VIRTIO_FS_TRANSPORT: &str = "DOCA";

/// `virtio_fs_transport_create`.
#[derive(Debug, Clone, Serialize)]
pub struct VirtioFsTransportCreate {
    pub transport_name: String,
}
method!(VirtioFsTransportCreate => "virtio_fs_transport_create", serde_json::Value);

/// `virtio_fs_transport_start`.
#[derive(Debug, Clone, Serialize)]
pub struct VirtioFsTransportStart {
    pub transport_name: String,
}
method!(VirtioFsTransportStart => "virtio_fs_transport_start", serde_json::Value);

/// `virtio_fs_doca_get_managers`: the DOCA devices that emulate functions.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VirtioFsDocaGetManagers {}
method!(VirtioFsDocaGetManagers => "virtio_fs_doca_get_managers", Vec<VirtioFsManager>);

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct VirtioFsManager {
    pub name: String,
}

/// `virtio_fs_doca_manager_create` (`manager`: a DOCA device, `mlx5_0`).
#[derive(Debug, Clone, Serialize)]
pub struct VirtioFsDocaManagerCreate {
    pub manager: String,
}
method!(VirtioFsDocaManagerCreate => "virtio_fs_doca_manager_create", serde_json::Value);

/// `virtio_fs_doca_function_create`: a new hot-pluggable virtio-fs PF; SNAP
/// answers its VUID.
#[derive(Debug, Clone, Serialize)]
pub struct VirtioFsDocaFunctionCreate {
    pub manager: String,
}
method!(VirtioFsDocaFunctionCreate => "virtio_fs_doca_function_create", String);

/// `virtio_fs_doca_function_destroy`.
#[derive(Debug, Clone, Serialize)]
pub struct VirtioFsDocaFunctionDestroy {
    pub manager: String,
    pub vuid: String,
}
method!(VirtioFsDocaFunctionDestroy => "virtio_fs_doca_function_destroy", serde_json::Value);

/// `virtio_fs_doca_get_functions`: every manager's virtio-fs functions.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VirtioFsDocaGetFunctions {}
method!(VirtioFsDocaGetFunctions => "virtio_fs_doca_get_functions", Vec<VirtioFsManagerFunctions>);

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct VirtioFsManagerFunctions {
    pub manager: String,
    #[serde(rename = "Function List", default)]
    pub functions: Vec<VirtioFsFunction>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct VirtioFsFunction {
    /// Host address; SNAP's own spelling, with or without the PCI domain.
    #[serde(default)]
    pub pci_address: Option<String>,
    pub vuid: String,
}

/// `virtio_fs_device_create`: a device serving `fsdev` to the host under `tag`.
#[derive(Debug, Clone, Serialize)]
pub struct VirtioFsDeviceCreate {
    pub transport_name: String,
    pub dev_name: String,
    pub tag: String,
    pub fsdev: String,
    pub num_request_queues: u32,
    pub queue_size: u32,
    /// DPF sends `"x86_64"`: the host's architecture.
    pub driver_platform: String,
}
method!(VirtioFsDeviceCreate => "virtio_fs_device_create", serde_json::Value);

/// `virtio_fs_doca_device_modify`: binds the device to the function `vuid`.
#[derive(Debug, Clone, Serialize)]
pub struct VirtioFsDocaDeviceModify {
    pub dev_name: String,
    pub manager: String,
    pub vuid: String,
}
method!(VirtioFsDocaDeviceModify => "virtio_fs_doca_device_modify", serde_json::Value);

/// `virtio_fs_device_start`.
#[derive(Debug, Clone, Serialize)]
pub struct VirtioFsDeviceStart {
    pub dev_name: String,
}
method!(VirtioFsDeviceStart => "virtio_fs_device_start", serde_json::Value);

/// `virtio_fs_device_stop`.
#[derive(Debug, Clone, Serialize)]
pub struct VirtioFsDeviceStop {
    pub dev_name: String,
}
method!(VirtioFsDeviceStop => "virtio_fs_device_stop", serde_json::Value);

/// `virtio_fs_doca_device_hotplug`: the host sees the function.
#[derive(Debug, Clone, Serialize)]
pub struct VirtioFsDocaDeviceHotplug {
    pub dev_name: String,
    pub wait_for_done: bool,
}
method!(VirtioFsDocaDeviceHotplug => "virtio_fs_doca_device_hotplug", serde_json::Value);

/// `virtio_fs_doca_device_hotunplug`.
#[derive(Debug, Clone, Serialize)]
pub struct VirtioFsDocaDeviceHotunplug {
    pub dev_name: String,
    pub wait_for_done: bool,
}
method!(VirtioFsDocaDeviceHotunplug => "virtio_fs_doca_device_hotunplug", serde_json::Value);

/// `virtio_fs_device_destroy`.
#[derive(Debug, Clone, Serialize)]
pub struct VirtioFsDeviceDestroy {
    pub dev_name: String,
}
method!(VirtioFsDeviceDestroy => "virtio_fs_device_destroy", serde_json::Value);

/// `virtio_fs_get_devices`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VirtioFsGetDevices {}
method!(VirtioFsGetDevices => "virtio_fs_get_devices", Vec<VirtioFsDevice>);

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct VirtioFsDevice {
    pub name: String,
    /// `"running"` once started, else `"stopped"`.
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub fsdev: Option<String>,
    #[serde(default)]
    pub tag: Option<String>,
}
