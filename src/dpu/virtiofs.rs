//! [`VirtioFs`]: exposing the plugin's fsdev as a virtio-fs device, the way
//! NVIDIA's DPF storage does ("Virtio-FS over hot-plugged PF"): SNAP's
//! virtio-fs transport and DOCA manager once per SNAP, then per volume a
//! hot-pluggable function, a device serving the fsdev under the volume's tag
//! (derived from the volume id, so a retry finds it), bound to the function,
//! started and hot-plugged. Release is the reverse. `docs/virtio-fs.md` has
//! the wire.
//!
//! A function is SNAP's, not named after the volume, and SNAP's listings do
//! not say which device is bound to which function; binding does:
//! `virtio_fs_doca_device_modify` with the function a device is bound to
//! succeeds again, with any other function it is refused (-16), as it is for
//! a function another device holds. So the volume's function is found by
//! asking every function at once (one round trip): the one that accepts is
//! the device's, or a spare one (no device bound: a crash between a
//! function's creation and its binding, or between a device's destruction and
//! its function's), which the device then takes. Spares are used up that
//! way before a function is created, so they never pile up.

use std::sync::Arc;

use futures::future::join_all;
use tokio::time::Instant;

use super::attach::{ExposedVolume, FunctionUse, Placement};
use super::emulation::Emulation;
use super::endpoint::SnapEndpoint;
use super::error::DpuError;
use super::exposure::{Census, Exposure, Found, Read, Survey};
use super::functions::FunctionListing;
use super::names::{VolumeNames, is_our_tag};
use crate::host::HostLocator;
use crate::jsonrpc::code;
use crate::spdk::snap::{
    VIRTIO_FS_TRANSPORT, VirtioFsDevice, VirtioFsDeviceCreate, VirtioFsDeviceDestroy,
    VirtioFsDeviceStart, VirtioFsDeviceStop, VirtioFsDocaDeviceHotplug,
    VirtioFsDocaDeviceHotunplug, VirtioFsDocaDeviceModify, VirtioFsDocaFunctionCreate,
    VirtioFsDocaFunctionDestroy, VirtioFsDocaGetFunctions, VirtioFsDocaGetManagers,
    VirtioFsDocaManagerCreate, VirtioFsGetDevices, VirtioFsGetTransports, VirtioFsManagerFunctions,
    VirtioFsTransportCreate, VirtioFsTransportStart,
};

/// The DOCA device a SNAP without a virtio-fs manager gets one on: the
/// BlueField's first, as DPF's storage configures it.
const DEFAULT_MANAGER: &str = "mlx5_0";
/// DPF's queue settings for a virtio-fs device.
const REQUEST_QUEUES: u32 = 1;
const QUEUE_SIZE: u32 = 1024;
/// What the host runs on (DPF's `driver_platform`).
const DRIVER_PLATFORM: &str = "x86_64";
/// How SNAP lists a running device, a stopped one, and a started transport.
const RUNNING: &str = "running";
const STOPPED: &str = "stopped";
const STARTED: &str = "started";

/// virtio-fs: a hot-plugged function and a device per volume.
#[derive(Debug)]
pub(crate) struct VirtioFs;

#[async_trait::async_trait]
impl Exposure for VirtioFs {
    fn emulation(&self) -> Emulation {
        Emulation::VirtioFs
    }

    /// A create's answer cannot say how far an earlier attempt got: read first.
    fn reads_first(&self) -> bool {
        true
    }

    async fn find<'a>(
        &'a self,
        snap: &'a SnapEndpoint,
        names: &'a VolumeNames,
        read: Read,
        deadline: Instant,
    ) -> Result<Box<dyn Found + 'a>, DpuError> {
        let device = match read.since() {
            Some(_) => devices(snap, deadline)
                .await?
                .into_iter()
                .find(|d| d.name == names.fs_device),
            None => None,
        };
        Ok(Box::new(Held {
            snap,
            names,
            device,
        }))
    }

    async fn census(&self, survey: &Survey<'_>) -> Result<Census, DpuError> {
        let (snap, deadline) = (survey.snap, survey.deadline);
        let (devices, functions) = tokio::join!(devices(snap, deadline), functions(snap, deadline));
        Ok(census(&devices?, &functions?))
    }
}

/// The volume's device as read; `None`: none, or not read.
struct Held<'a> {
    snap: &'a SnapEndpoint,
    names: &'a VolumeNames,
    device: Option<VirtioFsDevice>,
}

#[async_trait::async_trait]
impl Found for Held<'_> {
    fn holds(&self) -> bool {
        self.device.is_some()
    }

    fn bdevs(&self) -> Vec<&str> {
        self.device
            .iter()
            .filter_map(|d| d.fsdev.as_deref())
            .filter(|f| !f.is_empty())
            .collect()
    }

    async fn expose(
        self: Box<Self>,
        _placement: Placement,
        fsdev: &str,
        _functions: Arc<FunctionListing>,
        deadline: Instant,
    ) -> Result<HostLocator, DpuError> {
        let (snap, names) = (self.snap, self.names);
        let (manager, devices, functions) = tokio::join!(
            service(snap, deadline),
            devices(snap, deadline),
            functions(snap, deadline)
        );
        let (manager, devices, functions) = (manager?, devices?, functions?);
        let device = devices.iter().find(|d| d.name == names.fs_device);
        if let Some(served) = device.and_then(|d| d.fsdev.as_deref())
            && served != fsdev
        {
            return Err(DpuError::FailedPrecondition(format!(
                "SNAP at {}: virtio-fs device {} with tag {} serves fsdev {served}, not the \
                 plugin's device {fsdev}",
                snap.socket().display(),
                names.fs_device,
                names.fs_tag
            )));
        }
        if device.is_none() {
            let create = VirtioFsDeviceCreate {
                transport_name: VIRTIO_FS_TRANSPORT.into(),
                dev_name: names.fs_device.clone(),
                tag: names.fs_tag.clone(),
                fsdev: fsdev.to_string(),
                num_request_queues: REQUEST_QUEUES,
                queue_size: QUEUE_SIZE,
                driver_platform: DRIVER_PLATFORM.into(),
            };
            let what = format!("creating virtio-fs device {}", names.fs_device);
            snap.call_tolerating(&what, &create, &[code::EEXIST], deadline)
                .await?;
            tracing::info!(device = %names.fs_device, tag = %names.fs_tag, %fsdev, "created virtio-fs device");
            crate::failpoint::step("attach:virtio-fs-device");
        }
        // Started only once bound (DPF's order): a running device is bound.
        if device.and_then(|d| d.state.as_deref()) != Some(RUNNING) {
            if bound_function(snap, names, &manager, &functions, deadline)
                .await?
                .is_none()
            {
                bind_new_function(snap, names, &manager, deadline).await?;
            }
            let start = VirtioFsDeviceStart {
                dev_name: names.fs_device.clone(),
            };
            let what = format!("starting virtio-fs device {}", names.fs_device);
            snap.call_tolerating(&what, &start, &[code::EALREADY], deadline)
                .await?;
            crate::failpoint::step("attach:virtio-fs-start");
        }
        // SNAP answers -17 for a device plugged already.
        let hotplug = VirtioFsDocaDeviceHotplug {
            dev_name: names.fs_device.clone(),
            wait_for_done: true,
        };
        let what = format!("hot-plugging virtio-fs device {}", names.fs_device);
        snap.call_tolerating(&what, &hotplug, &[code::EEXIST], deadline)
            .await?;
        tracing::info!(device = %names.fs_device, tag = %names.fs_tag, "hot-plugged virtio-fs device");
        Ok(HostLocator::VirtioFs {
            tag: names.fs_tag.clone(),
        })
    }

    async fn release(&self, deadline: Instant) -> Result<(), DpuError> {
        let Some(device) = &self.device else {
            return Ok(());
        };
        let (snap, names) = (self.snap, self.names);
        let dev_name = &device.name;
        // Each step tolerates being done already: -19 for a device
        // unplugged, -114 for one stopped.
        let unplug = VirtioFsDocaDeviceHotunplug {
            dev_name: dev_name.clone(),
            wait_for_done: true,
        };
        let what = format!("hot-unplugging virtio-fs device {dev_name}");
        snap.call_tolerating(&what, &unplug, &[code::ENODEV], deadline)
            .await?;
        crate::failpoint::step("detach:virtio-fs-hotunplug");
        if device.state.as_deref() != Some(STOPPED) {
            let stop = VirtioFsDeviceStop {
                dev_name: dev_name.clone(),
            };
            let what = format!("stopping virtio-fs device {dev_name}");
            snap.call_tolerating(&what, &stop, &[code::EALREADY], deadline)
                .await?;
        }
        // Stopped, the device tells its function (or takes a spare one,
        // which then goes too).
        let (managers, functions) =
            tokio::join!(managers(snap, deadline), functions(snap, deadline));
        let (managers, functions) = (managers?, functions?);
        let mut bound = None;
        for manager in managers {
            if let Some(vuid) = bound_function(snap, names, &manager, &functions, deadline).await? {
                bound = Some((manager, vuid));
                break;
            }
        }
        let destroy = VirtioFsDeviceDestroy {
            dev_name: dev_name.clone(),
        };
        let what = format!("destroying virtio-fs device {dev_name}");
        snap.call_tolerating(&what, &destroy, &[code::ENODEV], deadline)
            .await?;
        crate::failpoint::step("detach:virtio-fs-device");
        if let Some((manager, vuid)) = bound {
            let what = format!("destroying virtio-fs function {vuid}");
            let destroy = VirtioFsDocaFunctionDestroy { manager, vuid };
            snap.call_tolerating(&what, &destroy, &[code::ENODEV], deadline)
                .await?;
        }
        tracing::info!(device = %dev_name, "released virtio-fs device");
        Ok(())
    }
}

/// The function of `manager` the volume's device is bound to, or a spare
/// one it now is: every function asked at once (see the module's comment);
/// `None` when none takes it.
async fn bound_function(
    snap: &SnapEndpoint,
    names: &VolumeNames,
    manager: &str,
    functions: &[VirtioFsManagerFunctions],
    deadline: Instant,
) -> Result<Option<String>, DpuError> {
    let candidates: Vec<&str> = functions
        .iter()
        .filter(|m| m.manager == manager)
        .flat_map(|m| &m.functions)
        .map(|f| f.vuid.as_str())
        .collect();
    let answers = join_all(
        candidates
            .iter()
            .map(|vuid| async move { snap.call(&modify(names, manager, vuid), deadline).await }),
    )
    .await;
    let mut bound = None;
    for (vuid, answer) in candidates.into_iter().zip(answers) {
        match answer {
            Ok(_) => bound = Some(vuid.to_string()),
            // Bound elsewhere, held by another device, or gone meanwhile.
            Err(e) if matches!(e.code(), Some(code::EBUSY | code::ENODEV)) => {}
            Err(e) => return Err(snap.error("binding a virtio-fs device to a function", e)),
        }
    }
    Ok(bound)
}

/// Creates a function on `manager` and binds the volume's device to it.
async fn bind_new_function(
    snap: &SnapEndpoint,
    names: &VolumeNames,
    manager: &str,
    deadline: Instant,
) -> Result<(), DpuError> {
    let create = VirtioFsDocaFunctionCreate {
        manager: manager.to_string(),
    };
    let vuid = snap
        .call(&create, deadline)
        .await
        .map_err(|e| snap.error("creating a virtio-fs function", e))?;
    tracing::info!(%vuid, %manager, "created virtio-fs function");
    crate::failpoint::step("attach:virtio-fs-function");
    let what = format!(
        "binding virtio-fs device {} to function {vuid}",
        names.fs_device
    );
    snap.call(&modify(names, manager, &vuid), deadline)
        .await
        .map_err(|e| snap.error(&what, e))?;
    crate::failpoint::step("attach:virtio-fs-bind");
    Ok(())
}

fn modify(names: &VolumeNames, manager: &str, vuid: &str) -> VirtioFsDocaDeviceModify {
    VirtioFsDocaDeviceModify {
        dev_name: names.fs_device.clone(),
        manager: manager.to_string(),
        vuid: vuid.to_string(),
    }
}

/// SNAP's virtio-fs service made ready once per SNAP (each step only if its
/// listing does not show it): the DOCA transport, created and started, and
/// a manager. Returns the manager's name.
async fn service(snap: &SnapEndpoint, deadline: Instant) -> Result<String, DpuError> {
    let (transports, managers) = tokio::join!(
        snap.call(&VirtioFsGetTransports {}, deadline),
        managers(snap, deadline),
    );
    let transports = transports.map_err(|e| snap.error("listing virtio-fs transports", e))?;
    let managers = managers?;
    let transport = transports.iter().find(|t| t.name == VIRTIO_FS_TRANSPORT);
    if transport.is_none() {
        let create = VirtioFsTransportCreate {
            transport_name: VIRTIO_FS_TRANSPORT.into(),
        };
        snap.call_tolerating(
            "creating the virtio-fs transport",
            &create,
            &[code::EEXIST],
            deadline,
        )
        .await?;
    }
    if transport.and_then(|t| t.state.as_deref()) != Some(STARTED) {
        let start = VirtioFsTransportStart {
            transport_name: VIRTIO_FS_TRANSPORT.into(),
        };
        snap.call_tolerating(
            "starting the virtio-fs transport",
            &start,
            &[code::EALREADY, code::EEXIST],
            deadline,
        )
        .await?;
    }
    if let Some(manager) = managers.into_iter().next() {
        return Ok(manager);
    }
    let create = VirtioFsDocaManagerCreate {
        manager: DEFAULT_MANAGER.into(),
    };
    snap.call_tolerating(
        "creating the virtio-fs manager",
        &create,
        &[code::EEXIST],
        deadline,
    )
    .await?;
    Ok(DEFAULT_MANAGER.into())
}

async fn devices(snap: &SnapEndpoint, deadline: Instant) -> Result<Vec<VirtioFsDevice>, DpuError> {
    snap.call(&VirtioFsGetDevices {}, deadline)
        .await
        .map_err(|e| snap.error("listing virtio-fs devices", e))
}

async fn functions(
    snap: &SnapEndpoint,
    deadline: Instant,
) -> Result<Vec<VirtioFsManagerFunctions>, DpuError> {
    snap.call(&VirtioFsDocaGetFunctions {}, deadline)
        .await
        .map_err(|e| snap.error("listing virtio-fs functions", e))
}

async fn managers(snap: &SnapEndpoint, deadline: Instant) -> Result<Vec<String>, DpuError> {
    let managers = snap
        .call(&VirtioFsDocaGetManagers {}, deadline)
        .await
        .map_err(|e| snap.error("listing virtio-fs managers", e))?;
    Ok(managers.into_iter().map(|m| m.name).collect())
}

/// Every virtio-fs function (SNAP does not list which device it carries)
/// and every device under one of our tags.
fn census(devices: &[VirtioFsDevice], functions: &[VirtioFsManagerFunctions]) -> Census {
    Census {
        functions: functions
            .iter()
            .flat_map(|m| &m.functions)
            .map(|f| FunctionUse {
                emulation: Emulation::VirtioFs,
                bdf: f.pci_address.clone().unwrap_or_default(),
                controller: None,
                volume_key: None,
                pool: None,
            })
            .collect(),
        volumes: devices
            .iter()
            .filter_map(|d| {
                let tag = d.tag.as_deref().filter(|t| is_our_tag(t))?;
                Some(ExposedVolume {
                    key: tag.to_string(),
                    emulation: Emulation::VirtioFs,
                    device_names: d.fsdev.clone().into_iter().collect(),
                    bdf: None,
                })
            })
            .collect(),
        ..Census::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_census_lists_every_function_and_only_our_tags_as_volumes() {
        let a = VolumeNames::new("pvc-a");
        let devices: Vec<VirtioFsDevice> = from_json(serde_json::json!([
            {"name": a.fs_device, "transport_name": "DOCA", "state": "running",
             "fsdev": "fs-a", "tag": a.fs_tag, "queue_size": 1024, "num_request_queues": 1},
            {"name": "someone", "state": "running", "fsdev": "fs-x", "tag": "shared"}
        ]));
        let functions: Vec<VirtioFsManagerFunctions> = from_json(serde_json::json!([
            {"manager": "mlx5_0", "Function List": [
                {"hot pluggable": true, "pci_address": "0000:29:00.0", "vuid": "VFS0",
                 "function_type": "PF"},
                {"hot pluggable": true, "pci_address": "0000:2a:00.0", "vuid": "VFS1",
                 "function_type": "PF"}]}
        ]));
        let census = census(&devices, &functions);
        let bdfs: Vec<&str> = census.functions.iter().map(|f| f.bdf.as_str()).collect();
        assert_eq!(bdfs, ["0000:29:00.0", "0000:2a:00.0"]);
        assert!(
            census
                .functions
                .iter()
                .all(|f| f.emulation == Emulation::VirtioFs)
        );
        assert_eq!(
            census.volumes,
            [ExposedVolume {
                key: a.fs_tag.clone(),
                emulation: Emulation::VirtioFs,
                device_names: vec!["fs-a".into()],
                bdf: None,
            }]
        );
    }
}
