//! [`Dedicated`]: exposing a bdev as an NVMe namespace of its own, in
//! NVIDIA's order (one subsystem per volume, namespace 1 with our UUID, a
//! controller created suspended on a free function, attach, resume), and
//! taking it away again. Also the NVMe pieces the packed placement shares
//! (`packed`): the subsystem listing, a namespace's creation, "running".
//!
//! Both directions continue from whatever state a previous, perhaps crashed,
//! attempt left: each step runs only if SNAP's listing says it is missing.
//! A detach, and an attach of a volume the node has attached before (a
//! retry), start from one `nvme_subsystem_list`; an attach of a volume the
//! node has no record of starts by creating its subsystem, and reads the
//! listing only if SNAP answers that it exists (a crashed attempt made it).
//! A created subsystem is empty, so the common case reads no listing that
//! grows with every volume on the DPU. Steps that do not depend on each
//! other go out together, so a new volume costs four dependent round trips
//! after the plugin's CreateDevice, and an attached one none.

use std::sync::Arc;

use futures::future::try_join_all;
use tokio::time::Instant;

use super::attach::{ExposedVolume, Placement};
use super::emulation::Emulation;
use super::endpoint::{SnapEndpoint, SubsystemListing};
use super::error::DpuError;
use super::exposure::{Census, ControllerUse, Exposure, Found, Read, Survey};
use super::functions::FunctionListing;
use super::names::{NSID, VolumeNames, is_our_nqn};
use crate::host::HostLocator;
use crate::jsonrpc::code;
use crate::spdk::snap::{
    NvmeController, NvmeControllerAttachNs, NvmeControllerCreate, NvmeControllerDestroy,
    NvmeControllerDetachNs, NvmeControllerResume, NvmeNamespaceCreate, NvmeNamespaceDestroy,
    NvmeSubsystem, NvmeSubsystemCreate, NvmeSubsystemDestroy,
};

/// The only `bdev_type` of a namespace backed by an SPDK bdev.
const BDEV_TYPE_SPDK: &str = "spdk";

/// Dedicated NVMe: a subsystem of its own per volume, with namespace
/// [`NSID`] on the volume's bdev and a controller on a function of its own.
#[derive(Debug)]
pub(crate) struct Dedicated;

#[async_trait::async_trait]
impl Exposure for Dedicated {
    fn emulation(&self) -> Emulation {
        Emulation::Nvme
    }

    /// A new volume's subsystem is created before anything is read: SNAP's
    /// -17 says when there is state to read, and a created one is empty.
    fn reads_first(&self) -> bool {
        false
    }

    async fn census(&self, survey: &Survey<'_>) -> Result<Census, DpuError> {
        let (functions, listing) = tokio::join!(
            survey.functions(),
            survey.snap.list_subsystems(survey.began, survey.deadline)
        );
        Ok(census(&*functions?, &listing?.subsystems))
    }

    async fn find<'a>(
        &'a self,
        snap: &'a SnapEndpoint,
        names: &'a VolumeNames,
        read: Read,
        deadline: Instant,
    ) -> Result<Box<dyn Found + 'a>, DpuError> {
        let known = match read.since() {
            Some(since) => Known::Listed(
                snap.list_subsystems(since, deadline)
                    .await?
                    .find(&names.nqn),
            ),
            None => Known::Unread,
        };
        Ok(Box::new(Held { snap, names, known }))
    }
}

/// The volume's subsystem as far as it was read.
struct Held<'a> {
    snap: &'a SnapEndpoint,
    names: &'a VolumeNames,
    known: Known,
}

impl Held<'_> {
    fn subsystem(&self) -> Option<&Subsystem> {
        match &self.known {
            Known::Listed(subsystem) => subsystem.as_ref(),
            Known::Unread => None,
        }
    }
}

#[async_trait::async_trait]
impl Found for Held<'_> {
    fn holds(&self) -> bool {
        self.subsystem().is_some()
    }

    fn bdevs(&self) -> Vec<&str> {
        self.subsystem()
            .into_iter()
            .flat_map(Subsystem::bdevs)
            .collect()
    }

    async fn expose(
        self: Box<Self>,
        _placement: Placement,
        bdev: &str,
        functions: Arc<FunctionListing>,
        deadline: Instant,
    ) -> Result<HostLocator, DpuError> {
        expose(self.snap, self.names, bdev, self.known, functions, deadline).await
    }

    async fn release(&self, deadline: Instant) -> Result<(), DpuError> {
        match self.subsystem() {
            Some(subsystem) => release(self.snap, subsystem, deadline).await,
            None => Ok(()),
        }
    }

    /// The subsystem, empty once released.
    async fn remove_rest(&self, deadline: Instant) -> Result<(), DpuError> {
        match self.subsystem() {
            Some(subsystem) => destroy_subsystem(self.snap, &subsystem.listed.nqn, deadline).await,
            None => Ok(()),
        }
    }
}

/// A volume's subsystem as SNAP lists it.
#[derive(Debug, Clone)]
struct Subsystem {
    listed: NvmeSubsystem,
}

impl Subsystem {
    /// The bdevs its namespaces serve (normally one: the plugin's device).
    fn bdevs(&self) -> impl Iterator<Item = &str> {
        self.listed.namespaces.iter().map(|n| n.bdev.as_str())
    }

    fn is_running(&self, ctrl_id: &str) -> bool {
        self.listed
            .controllers
            .iter()
            .find(|c| c.ctrl_id == ctrl_id)
            .is_some_and(is_running)
    }
}

/// Whether the host may use the controller. Only a state known to mean
/// "running" counts: resuming a running controller is harmless, leaving a
/// suspended one suspended is not.
pub(crate) fn is_running(controller: &NvmeController) -> bool {
    controller
        .state
        .as_deref()
        .is_some_and(|s| s.eq_ignore_ascii_case("STARTED") || s.eq_ignore_ascii_case("RUNNING"))
}

impl SubsystemListing {
    /// The subsystem named `nqn`, if listed.
    fn find(&self, nqn: &str) -> Option<Subsystem> {
        self.subsystems
            .iter()
            .find(|s| s.nqn == nqn)
            .map(|listed| Subsystem {
                listed: listed.clone(),
            })
    }
}

/// What an attach knows of the volume's subsystem when it starts.
#[derive(Debug)]
enum Known {
    /// SNAP's listing was read: the subsystem as listed, or none.
    Listed(Option<Subsystem>),
    /// Not read: the volume is most likely new to SNAP.
    Unread,
}

/// Our controller as far as a previous attempt got.
#[derive(Debug)]
struct Controller {
    ctrl_id: String,
    bdf: String,
    attached: bool,
    running: bool,
}

/// Exposes `device` under the volume's subsystem and returns where the host
/// finds it. `known` and `functions` were read together with the plugin's
/// CreateDevice.
async fn expose(
    snap: &SnapEndpoint,
    names: &VolumeNames,
    device: &str,
    known: Known,
    functions: Arc<FunctionListing>,
    deadline: Instant,
) -> Result<HostLocator, DpuError> {
    let nqn = &names.nqn;
    let found = match known {
        Known::Listed(Some(subsystem)) => Some(subsystem),
        Known::Listed(None) | Known::Unread => create_subsystem(snap, names, deadline).await?,
    };
    let namespace = found
        .as_ref()
        .and_then(|s| s.listed.namespaces.iter().find(|n| n.nsid == NSID));
    if let Some(ns) = namespace
        && ns.bdev != device
    {
        return Err(DpuError::FailedPrecondition(format!(
            "SNAP at {}: namespace {NSID} of {nqn} serves bdev {}, not the plugin's device {device}",
            snap.socket().display(),
            ns.bdev
        )));
    }
    let existing = found
        .as_ref()
        .map(|s| existing_controller(s, &functions, snap))
        .transpose()?
        .flatten();

    let create_namespace = async {
        if namespace.is_some() {
            return Ok(());
        }
        let create = namespace_create(nqn, NSID, names, device);
        let what = format!("creating namespace {NSID} of {nqn} on bdev {device}");
        snap.call_tolerating(&what, &create, &[code::EEXIST], deadline)
            .await?;
        tracing::info!(%nqn, bdev = %device, "created NVMe namespace");
        Ok(())
    };
    let controller = async {
        if let Some(controller) = existing {
            return Ok(controller);
        }
        let what = format!("creating a controller for {nqn}");
        let (ctrl_id, bdf) = snap
            .create_on_free_function(Emulation::Nvme, functions, &what, deadline, |pci_bdf| {
                let create = NvmeControllerCreate {
                    nqn: nqn.clone(),
                    pci_bdf: Some(pci_bdf),
                    // The host must not see an empty controller.
                    suspended: Some(true),
                    ..Default::default()
                };
                async move { snap.call(&create, deadline).await }
            })
            .await?;
        tracing::info!(%nqn, %ctrl_id, %bdf, "created NVMe controller, suspended");
        Ok(Controller {
            ctrl_id,
            bdf,
            attached: false,
            running: false,
        })
    };
    let (namespace_created, controller) = tokio::join!(create_namespace, controller);
    let controller = controller?;
    namespace_created?;
    crate::failpoint::step("attach:nvme-namespace-controller");

    if !controller.attached {
        let attach = NvmeControllerAttachNs {
            ctrl_id: controller.ctrl_id.clone(),
            nsid: NSID,
        };
        let what = format!(
            "attaching namespace {NSID} of {nqn} to {}",
            controller.ctrl_id
        );
        snap.call_tolerating(&what, &attach, &[code::EEXIST], deadline)
            .await?;
        crate::failpoint::step("attach:nvme-attach");
    }
    if !controller.running {
        let resume = NvmeControllerResume {
            ctrl_id: controller.ctrl_id.clone(),
        };
        let what = format!("resuming controller {} of {nqn}", controller.ctrl_id);
        snap.call_tolerating(&what, &resume, &[], deadline).await?;
        tracing::info!(%nqn, ctrl_id = %controller.ctrl_id, "resumed NVMe controller");
        crate::failpoint::step("attach:nvme-resume");
    }
    let serial = found
        .as_ref()
        .and_then(|s| s.listed.sn.clone())
        .unwrap_or_else(|| names.serial.clone());
    Ok(HostLocator::Nvme {
        bdf: controller.bdf,
        nsid: NSID,
        uuid: Some(
            namespace
                .and_then(|n| n.uuid.clone())
                .unwrap_or_else(|| names.namespace_uuid.clone()),
        ),
        serial: Some(serial),
    })
}

/// The namespace `nsid` of subsystem `nqn` on the plugin's `device`, under
/// the volume's UUID (which finds it again, in whichever subsystem it is).
pub(crate) fn namespace_create(
    nqn: &str,
    nsid: u32,
    names: &VolumeNames,
    device: &str,
) -> NvmeNamespaceCreate {
    NvmeNamespaceCreate {
        bdev_type: BDEV_TYPE_SPDK.to_string(),
        nqn: nqn.to_string(),
        nsid,
        uuid: names.namespace_uuid.clone(),
        bdev_name: device.to_string(),
    }
}

/// Creates the volume's subsystem. `None`: created, so it is empty; if SNAP
/// says it exists already, what it holds, from a listing.
async fn create_subsystem(
    snap: &SnapEndpoint,
    names: &VolumeNames,
    deadline: Instant,
) -> Result<Option<Subsystem>, DpuError> {
    let nqn = &names.nqn;
    let create = NvmeSubsystemCreate {
        nqn: nqn.clone(),
        mn: None,
        // The host shows it in /sys/class/nvme/*/serial: name the volume.
        sn: Some(names.serial.clone()),
        nn: None,
        mnan: None,
    };
    match snap.call(&create, deadline).await {
        Ok(_) => {
            tracing::info!(%nqn, "created NVMe subsystem");
            crate::failpoint::step("attach:nvme-subsystem");
            Ok(None)
        }
        Err(e) if e.code() == Some(code::EEXIST) => {
            tracing::debug!(%nqn, "NVMe subsystem exists already: reading what it holds");
            Ok(snap
                .list_subsystems(Instant::now(), deadline)
                .await?
                .find(nqn))
        }
        Err(e) => Err(snap.error(&format!("creating subsystem {nqn}"), e)),
    }
}

/// The controller a previous attempt made, preferring one that already
/// shows our namespace (there is only one unless attempts raced).
fn existing_controller(
    subsystem: &Subsystem,
    functions: &FunctionListing,
    snap: &SnapEndpoint,
) -> Result<Option<Controller>, DpuError> {
    let attached = |c: &NvmeController| {
        c.namespaces.iter().any(|n| n.nsid == NSID)
            || subsystem
                .listed
                .namespaces
                .iter()
                .any(|n| n.nsid == NSID && n.controllers.iter().any(|r| r.ctrl_id == c.ctrl_id))
    };
    let controllers = &subsystem.listed.controllers;
    let Some(c) = controllers
        .iter()
        .find(|c| attached(c))
        .or_else(|| controllers.first())
    else {
        return Ok(None);
    };
    let bdf = functions
        .bdf_of(Emulation::Nvme, &c.ctrl_id, c.vhca_id)
        .ok_or_else(|| {
            DpuError::Internal(format!(
                "SNAP at {}: controller {} of {} sits on no listed NVMe function",
                snap.socket().display(),
                c.ctrl_id,
                subsystem.listed.nqn
            ))
        })?;
    Ok(Some(Controller {
        ctrl_id: c.ctrl_id.clone(),
        bdf,
        attached: attached(c),
        running: subsystem.is_running(&c.ctrl_id),
    }))
}

/// Takes the volume's namespaces away from SNAP: its controllers first, then
/// its namespaces, each skipped when already gone. Afterwards SNAP no longer
/// uses the plugin's device; the empty subsystem is left for
/// [`destroy_subsystem`], which can run alongside DeleteDevice.
async fn release(
    snap: &SnapEndpoint,
    subsystem: &Subsystem,
    deadline: Instant,
) -> Result<(), DpuError> {
    let nqn = &subsystem.listed.nqn;
    try_join_all(
        subsystem
            .listed
            .controllers
            .iter()
            .map(|c| destroy_controller(snap, nqn, c, deadline)),
    )
    .await?;
    try_join_all(subsystem.listed.namespaces.iter().map(|n| async move {
        let destroy = NvmeNamespaceDestroy {
            nqn: nqn.clone(),
            nsid: n.nsid,
        };
        let what = format!("destroying namespace {} of {nqn}", n.nsid);
        snap.call_tolerating(&what, &destroy, &[code::ENODEV], deadline)
            .await?;
        tracing::info!(%nqn, nsid = n.nsid, "destroyed NVMe namespace");
        Ok::<_, DpuError>(())
    }))
    .await?;
    Ok(())
}

/// `force` takes attached namespaces along, which saves NVIDIA's separate
/// detach round trip; a SNAP that still refuses (-16) gets the detach first.
async fn destroy_controller(
    snap: &SnapEndpoint,
    nqn: &str,
    controller: &NvmeController,
    deadline: Instant,
) -> Result<(), DpuError> {
    let ctrl_id = &controller.ctrl_id;
    let destroy = NvmeControllerDestroy {
        ctrl_id: ctrl_id.clone(),
        force: Some(true),
    };
    let what = format!("destroying controller {ctrl_id} of {nqn}");
    match snap.call(&destroy, deadline).await {
        Ok(_) => {}
        Err(e) if e.is_no_such_device() => return Ok(()),
        Err(e) if e.code() == Some(code::EBUSY) => {
            try_join_all(controller.namespaces.iter().map(|n| {
                let detach = NvmeControllerDetachNs {
                    ctrl_id: ctrl_id.clone(),
                    nsid: n.nsid,
                };
                let what = format!("detaching namespace {} from {ctrl_id}", n.nsid);
                async move {
                    snap.call_tolerating(&what, &detach, &[code::ENODEV], deadline)
                        .await
                }
            }))
            .await?;
            snap.call_tolerating(&what, &destroy, &[code::ENODEV], deadline)
                .await?;
        }
        Err(e) => return Err(snap.error(&what, e)),
    }
    tracing::info!(%nqn, %ctrl_id, "destroyed NVMe controller");
    Ok(())
}

async fn destroy_subsystem(
    snap: &SnapEndpoint,
    nqn: &str,
    deadline: Instant,
) -> Result<(), DpuError> {
    let destroy = NvmeSubsystemDestroy {
        nqn: nqn.to_string(),
    };
    let what = format!("destroying subsystem {nqn}");
    snap.call_tolerating(&what, &destroy, &[code::ENODEV], deadline)
        .await?;
    tracing::info!(%nqn, "destroyed NVMe subsystem");
    Ok(())
}

/// Every subsystem under one of our NQNs is a volume, and its controllers
/// carry it.
pub(super) fn census(functions: &FunctionListing, subsystems: &[NvmeSubsystem]) -> Census {
    let ours = || subsystems.iter().filter(|s| is_our_nqn(&s.nqn));
    Census {
        controllers: ours()
            .flat_map(|s| {
                s.controllers.iter().map(|c| ControllerUse {
                    emulation: Emulation::Nvme,
                    controller: c.ctrl_id.clone(),
                    volume_key: Some(s.nqn.clone()),
                    pool: None,
                })
            })
            .collect(),
        volumes: ours()
            .map(|s| ExposedVolume {
                key: s.nqn.clone(),
                emulation: Emulation::Nvme,
                device_names: s.namespaces.iter().map(|n| n.bdev.clone()).collect(),
                bdf: first_bdf(functions, s),
            })
            .collect(),
        ..Census::default()
    }
}

/// The host address of a subsystem's (first) controller's function.
pub(super) fn first_bdf(functions: &FunctionListing, subsystem: &NvmeSubsystem) -> Option<String> {
    let c = subsystem.controllers.first()?;
    functions.bdf_of(Emulation::Nvme, &c.ctrl_id, c.vhca_id)
}
