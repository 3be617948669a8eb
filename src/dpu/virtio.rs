//! [`VirtioBlk`]: exposing a bdev as a virtio-blk disk: one controller per
//! volume on a free function, recognised by its serial (`vblk_id`), which is
//! derived from the volume id and is what the host reads from
//! `/sys/block/vdX/serial`.

use std::sync::Arc;

use futures::future::try_join_all;
use tokio::time::Instant;

use super::attach::{ExposedVolume, Placement};
use super::emulation::Emulation;
use super::endpoint::SnapEndpoint;
use super::error::DpuError;
use super::exposure::{Census, ControllerUse, Exposure, Found, Read, Survey};
use super::functions::FunctionListing;
use super::names::{VolumeNames, is_our_serial};
use crate::host::HostLocator;
use crate::jsonrpc::code;
use crate::spdk::snap::{
    VirtioBlkController, VirtioBlkControllerBdevAttach, VirtioBlkControllerCreate,
    VirtioBlkControllerDestroy, VirtioBlkControllerList,
};

/// virtio-blk: a controller of its own per volume, serving its bdev.
#[derive(Debug)]
pub(crate) struct VirtioBlk;

#[async_trait::async_trait]
impl Exposure for VirtioBlk {
    fn emulation(&self) -> Emulation {
        Emulation::VirtioBlk
    }

    /// Nothing SNAP answers a controller's creation with says the volume has
    /// one already: its controllers are read first.
    fn reads_first(&self) -> bool {
        true
    }

    async fn census(&self, survey: &Survey<'_>) -> Result<Census, DpuError> {
        let (functions, controllers) =
            tokio::join!(survey.functions(), list(survey.snap, survey.deadline));
        Ok(census(&*functions?, &controllers?))
    }

    async fn find<'a>(
        &'a self,
        snap: &'a SnapEndpoint,
        names: &'a VolumeNames,
        read: Read,
        deadline: Instant,
    ) -> Result<Box<dyn Found + 'a>, DpuError> {
        let controllers = match read.since() {
            Some(_) => Some(find(snap, &names.serial, deadline).await?),
            None => None,
        };
        Ok(Box::new(Held {
            snap,
            names,
            controllers,
        }))
    }
}

/// The volume's controllers as read; `None`: not read.
struct Held<'a> {
    snap: &'a SnapEndpoint,
    names: &'a VolumeNames,
    controllers: Option<Vec<VirtioBlkController>>,
}

impl Held<'_> {
    fn controllers(&self) -> &[VirtioBlkController] {
        self.controllers.as_deref().unwrap_or_default()
    }
}

#[async_trait::async_trait]
impl Found for Held<'_> {
    fn holds(&self) -> bool {
        !self.controllers().is_empty()
    }

    fn bdevs(&self) -> Vec<&str> {
        self.controllers().iter().filter_map(bdev_of).collect()
    }

    async fn expose(
        self: Box<Self>,
        _placement: Placement,
        bdev: &str,
        functions: Arc<FunctionListing>,
        deadline: Instant,
    ) -> Result<HostLocator, DpuError> {
        let found = match self.controllers {
            Some(controllers) => controllers,
            None => find(self.snap, &self.names.serial, deadline).await?,
        };
        expose(self.snap, self.names, bdev, found, functions, deadline).await
    }

    async fn release(&self, deadline: Instant) -> Result<(), DpuError> {
        release(self.snap, self.controllers(), deadline).await
    }
}

/// The volume's controllers (normally at most one), found by serial.
async fn find(
    snap: &SnapEndpoint,
    serial: &str,
    deadline: Instant,
) -> Result<Vec<VirtioBlkController>, DpuError> {
    Ok(list(snap, deadline)
        .await?
        .into_iter()
        .filter(|c| c.vblk_id.as_deref() == Some(serial))
        .collect())
}

async fn list(
    snap: &SnapEndpoint,
    deadline: Instant,
) -> Result<Vec<VirtioBlkController>, DpuError> {
    snap.call(&VirtioBlkControllerList {}, deadline)
        .await
        .map_err(|e| snap.error("listing virtio-blk controllers", e))
}

/// The bdev a controller serves; SNAP lists a controller without one with an
/// empty name.
fn bdev_of(controller: &VirtioBlkController) -> Option<&str> {
    controller.bdev.as_deref().filter(|b| !b.is_empty())
}

/// Exposes `device` on the volume's controller, creating the controller on a
/// free function if a previous attempt did not.
async fn expose(
    snap: &SnapEndpoint,
    names: &VolumeNames,
    device: &str,
    found: Vec<VirtioBlkController>,
    functions: Arc<FunctionListing>,
    deadline: Instant,
) -> Result<HostLocator, DpuError> {
    let serial = &names.serial;
    let bdf = match found.first() {
        Some(controller) => {
            match bdev_of(controller) {
                Some(bdev) if bdev == device => {}
                Some(bdev) => {
                    return Err(DpuError::FailedPrecondition(format!(
                        "SNAP at {}: virtio-blk controller {} with serial {serial} serves bdev {bdev}, not the plugin's device {device}",
                        snap.socket().display(),
                        controller.ctrl_id
                    )));
                }
                // Its bdev went away (hot-removed) and came back: serve it again.
                None => {
                    let attach = VirtioBlkControllerBdevAttach {
                        ctrl: controller.ctrl_id.clone(),
                        bdev: device.to_string(),
                        vblk_id: Some(serial.clone()),
                    };
                    let what = format!("attaching bdev {device} to {}", controller.ctrl_id);
                    snap.call_tolerating(&what, &attach, &[code::EEXIST], deadline)
                        .await?;
                }
            }
            functions
                .bdf_of(
                    Emulation::VirtioBlk,
                    &controller.ctrl_id,
                    controller.vhca_id,
                )
                .or_else(|| controller.pci_bdf.clone())
                .ok_or_else(|| {
                    DpuError::Internal(format!(
                        "SNAP at {}: virtio-blk controller {} sits on no listed function",
                        snap.socket().display(),
                        controller.ctrl_id
                    ))
                })?
        }
        None => {
            let what = format!("creating a virtio-blk controller for serial {serial}");
            let (ctrl_id, bdf) = snap
                .create_on_free_function(
                    Emulation::VirtioBlk,
                    functions,
                    &what,
                    deadline,
                    |pci_bdf| {
                        let create = VirtioBlkControllerCreate {
                            pci_bdf: Some(pci_bdf),
                            bdev: Some(device.to_string()),
                            vblk_id: Some(serial.clone()),
                            ..Default::default()
                        };
                        async move { snap.call(&create, deadline).await }
                    },
                )
                .await?;
            tracing::info!(%serial, %ctrl_id, %bdf, bdev = %device, "created virtio-blk controller");
            crate::failpoint::step("attach:virtio-controller");
            bdf
        }
    };
    Ok(HostLocator::VirtioBlk {
        bdf,
        serial: serial.clone(),
    })
}

/// Destroys the volume's controllers; `force` because they still serve the
/// bdev (the host has let go of the disk by now).
async fn release(
    snap: &SnapEndpoint,
    controllers: &[VirtioBlkController],
    deadline: Instant,
) -> Result<(), DpuError> {
    try_join_all(controllers.iter().map(|c| async move {
        let destroy = VirtioBlkControllerDestroy {
            ctrl: c.ctrl_id.clone(),
            force: Some(true),
        };
        let what = format!("destroying virtio-blk controller {}", c.ctrl_id);
        snap.call_tolerating(&what, &destroy, &[code::ENODEV], deadline)
            .await?;
        tracing::info!(ctrl_id = %c.ctrl_id, "destroyed virtio-blk controller");
        Ok::<_, DpuError>(())
    }))
    .await?;
    Ok(())
}

/// Every controller under one of our serials is a volume.
pub(super) fn census(functions: &FunctionListing, controllers: &[VirtioBlkController]) -> Census {
    let ours = || {
        controllers
            .iter()
            .filter_map(|c| Some((c, c.vblk_id.as_deref().filter(|s| is_our_serial(s))?)))
    };
    Census {
        controllers: ours()
            .map(|(c, serial)| ControllerUse {
                emulation: Emulation::VirtioBlk,
                controller: c.ctrl_id.clone(),
                volume_key: Some(serial.to_string()),
                pool: None,
            })
            .collect(),
        volumes: ours()
            .map(|(c, serial)| ExposedVolume {
                key: serial.to_string(),
                emulation: Emulation::VirtioBlk,
                device_names: bdev_of(c).map(str::to_string).into_iter().collect(),
                bdf: c
                    .pci_bdf
                    .clone()
                    .or_else(|| functions.bdf_of(Emulation::VirtioBlk, &c.ctrl_id, c.vhca_id)),
            })
            .collect(),
        ..Census::default()
    }
}
