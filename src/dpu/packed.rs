//! The packed placement: a volume is one namespace on a pool subsystem
//! (`nqn.2022-10.io.snap-csi:pool-<k>`) whose controller already runs on the
//! host, so a stage creates no controller, hot-plugs nothing and resumes
//! nothing: `nvme_namespace_create` on a pool with a free slot, then
//! `nvme_controller_attach_ns` on its live controller, after which the host
//! learns of the namespace through an Asynchronous Event and rescans. With
//! the plugin's CreateDevice and SNAP's listings read together first, that is
//! three dependent round trips.
//!
//! The namespace carries the volume's UUID ([`VolumeNames::namespace_uuid`]),
//! which is how every retry, detach and reconciliation finds it, in whichever
//! pool it is: a stage that finds its UUID listed continues from there (and
//! destroys any second namespace of it a lost answer left), so every retry
//! and every crash converges on exactly one namespace per volume.
//!
//! Placement under concurrency: the slot (pool, NSID) is picked from SNAP's
//! listing under [`Packing`]'s claims, the same hint the function pools use
//! (no I/O under the lock), and SNAP stays the truth: an NSID SNAP calls
//! taken (-17) or a pool it calls full (-28) makes the stage read the listing
//! again and pick anew. The lowest free NSID of the lowest pool with room is
//! taken, so volumes gather in few pools.
//!
//! Only when no live pool has room does a stage build one (the lowest `k`
//! not listed, or a listed pool a crash left without a running controller):
//! the subsystem with `nn` = `mnan` = namespaces per controller, then a
//! controller, running, on a free function. That stage pays what a dedicated
//! one does; other stages here that need room meanwhile wait for it and then
//! read the listing again.
//!
//! A detach takes away only the volume's namespace (detach, then destroy);
//! the pool and its controller stay, also when empty: an empty pool keeps its
//! function and its controller on the host, warm for the next packed volume.
//! That is bounded: a new pool is built only when every pool is full, so
//! there are never more pools than the peak number of packed volumes needs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use super::attach::{ExposedVolume, Placement, PoolUse};
use super::emulation::Emulation;
use super::endpoint::SnapEndpoint;
use super::endpoint::SubsystemListing;
use super::error::DpuError;
use super::exposure::{Census, ControllerUse, Exposure, Found, Read, Survey};
use super::functions::{Claims, FunctionListing};
use super::names::{VolumeNames, pool_index, pool_nqn};
use super::nvme;
use crate::host::HostLocator;
use crate::jsonrpc::code;
use crate::spdk::snap::{
    NvmeController, NvmeControllerAttachNs, NvmeControllerCreate, NvmeControllerDetachNs,
    NvmeControllerResume, NvmeNamespaceDestroy, NvmeSubsystem, NvmeSubsystemCreate,
    NvmeSubsystemNamespace,
};

/// Namespaces per pool controller when the caller does not say (the node's
/// `--namespaces-per-controller` default): also what a stage uses that only
/// continues a volume placed packed by an earlier one.
pub const DEFAULT_NAMESPACES_PER_CONTROLLER: u32 = 32;

/// A listing that keeps changing under a stage (other processes placing
/// namespaces) is read again at most this often before the stage gives up
/// with Unavailable, which its caller retries within the deadline.
const PLACEMENT_ATTEMPTS: usize = 8;

/// Packed NVMe: the volume is one namespace on a pool controller shared
/// with other volumes.
#[derive(Debug, Default)]
pub(crate) struct Packed {
    packing: Packing,
}

#[async_trait::async_trait]
impl Exposure for Packed {
    fn emulation(&self) -> Emulation {
        Emulation::Nvme
    }

    fn packed(&self) -> bool {
        true
    }

    /// A stage picks its slot from the pools SNAP lists.
    fn reads_first(&self) -> bool {
        true
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
        let listing = match read {
            Read::Skip => None,
            Read::ToPlace(since) => Some(snap.list_subsystems(since, deadline).await?),
            Read::ToRelease(since) => {
                let listing = snap.list_subsystems(since, deadline).await?;
                Some(Arc::new(pools_of(&listing, names)))
            }
        };
        Ok(Box::new(Held {
            snap,
            packing: &self.packing,
            names,
            listing,
        }))
    }
}

/// The pools as read for the volume (all of them to place it, only its own
/// to release it); `None`: not read.
struct Held<'a> {
    snap: &'a SnapEndpoint,
    packing: &'a Packing,
    names: &'a VolumeNames,
    listing: Option<Arc<SubsystemListing>>,
}

#[async_trait::async_trait]
impl Found for Held<'_> {
    fn holds(&self) -> bool {
        self.listing
            .as_deref()
            .is_some_and(|listing| !namespaces_of(listing, &self.names.namespace_uuid).is_empty())
    }

    fn bdevs(&self) -> Vec<&str> {
        self.listing
            .as_deref()
            .map(|listing| bdevs(listing, self.names))
            .unwrap_or_default()
    }

    /// A volume an earlier stage packed continues in its pool under any
    /// placement asked for now; a pool built meanwhile gets the requested
    /// size, or the default one.
    async fn expose(
        self: Box<Self>,
        placement: Placement,
        bdev: &str,
        functions: Arc<FunctionListing>,
        deadline: Instant,
    ) -> Result<HostLocator, DpuError> {
        let per_controller = match placement {
            Placement::Packed {
                namespaces_per_controller,
            } => namespaces_per_controller,
            Placement::Dedicated => DEFAULT_NAMESPACES_PER_CONTROLLER,
        };
        let listing = match self.listing {
            Some(listing) => listing,
            None => self.snap.list_subsystems(Instant::now(), deadline).await?,
        };
        expose(
            self.snap,
            self.packing,
            self.names,
            bdev,
            per_controller,
            listing,
            functions,
            deadline,
        )
        .await
    }

    async fn release(&self, deadline: Instant) -> Result<(), DpuError> {
        match &self.listing {
            Some(listing) => release(self.snap, listing, self.names, deadline).await,
            None => Ok(()),
        }
    }
}

/// What this process knows beyond SNAP's listing: the slots it has just
/// claimed, and the pools a stage here is building.
#[derive(Debug, Default)]
struct Packing {
    /// (pool k, NSID) of namespaces being created here.
    slots: Claims<(u32, u32)>,
    /// Pool k -> held by the stage building it; others wait on it.
    building: Mutex<HashMap<u32, Arc<tokio::sync::Mutex<()>>>>,
    /// Pool k -> when a stage here last finished building it: a listing
    /// asked for before then may show it half-built, and must not be built
    /// from again.
    built: Mutex<HashMap<u32, Instant>>,
}

impl Packing {
    /// Lets the caller build (or finish) pool `k` from a listing asked for at
    /// `asked_at`, until the returned guard is dropped. `None` when that
    /// listing is stale for it: another stage here is building it (waited
    /// for) or has built it since.
    async fn build_lock(&self, k: u32, asked_at: Instant) -> Option<Built<'_>> {
        let other = {
            let mut map = self.building.lock().unwrap_or_else(|e| e.into_inner());
            match map.get(&k) {
                Some(other) => other.clone(),
                None => {
                    let built = self.built.lock().unwrap_or_else(|e| e.into_inner());
                    if built.get(&k).is_some_and(|at| *at >= asked_at) {
                        return None;
                    }
                    let lock = Arc::new(tokio::sync::Mutex::new(()));
                    // A new lock is free: this cannot fail.
                    let guard = lock.clone().try_lock_owned().ok()?;
                    map.insert(k, lock);
                    return Some(Built {
                        packing: self,
                        k,
                        _guard: guard,
                    });
                }
            }
        };
        // Its guard is dropped when that stage has built the pool.
        drop(other.lock().await);
        None
    }
}

/// A pool's running controller and the host address of its function.
struct Live {
    ctrl_id: String,
    bdf: String,
}

/// A pool as listed.
struct Pool<'a> {
    k: u32,
    listed: &'a NvmeSubsystem,
}

impl Pool<'_> {
    /// How many namespaces (and which NSIDs, 1..=capacity) it may carry.
    fn capacity(&self, requested: u32) -> u32 {
        capacity(self.listed, requested)
    }

    /// Its controller, if one is running.
    fn live(&self) -> Option<&NvmeController> {
        self.listed.controllers.iter().find(|c| nvme::is_running(c))
    }

    /// Free NSIDs in the listing, lowest first.
    fn free_nsids(&self, requested: u32) -> impl Iterator<Item = u32> + '_ {
        let cap = self.capacity(requested);
        (1..=cap).filter(|nsid| !self.listed.namespaces.iter().any(|n| n.nsid == *nsid))
    }
}

/// The lower of the pool's `nn` and `mnan`, as SNAP lists them; what we
/// asked for when SNAP does not say.
fn capacity(listed: &NvmeSubsystem, requested: u32) -> u32 {
    let nn = listed.nn.unwrap_or(requested);
    let mnan = listed.mnan.unwrap_or(requested);
    nn.min(mnan)
}

/// The pools in `listing`, lowest `k` first.
fn pools(listing: &SubsystemListing) -> Vec<Pool<'_>> {
    let mut pools: Vec<Pool<'_>> = listing
        .subsystems
        .iter()
        .filter_map(|s| {
            Some(Pool {
                k: pool_index(&s.nqn)?,
                listed: s,
            })
        })
        .collect();
    pools.sort_by_key(|p| p.k);
    pools
}

/// The pool's capacity if `subsystem` is a pool.
fn pool_capacity(subsystem: &NvmeSubsystem) -> Option<u32> {
    pool_index(&subsystem.nqn)?;
    Some(capacity(subsystem, u32::MAX))
}

/// The namespaces carrying `uuid` in any pool, with their pool.
fn namespaces_of<'a>(
    listing: &'a SubsystemListing,
    uuid: &str,
) -> Vec<(&'a NvmeSubsystem, &'a NvmeSubsystemNamespace)> {
    listing
        .subsystems
        .iter()
        .filter(|s| pool_index(&s.nqn).is_some())
        .flat_map(|s| s.namespaces.iter().map(move |n| (s, n)))
        .filter(|(_, n)| {
            n.uuid
                .as_deref()
                .is_some_and(|u| u.eq_ignore_ascii_case(uuid))
        })
        .collect()
}

/// The controllers of `pool` the namespace is attached to, by either of the
/// listing's two views.
fn attached_to<'a>(
    pool: &'a NvmeSubsystem,
    namespace: &'a NvmeSubsystemNamespace,
) -> impl Iterator<Item = &'a NvmeController> + 'a {
    pool.controllers.iter().filter(move |c| {
        c.namespaces.iter().any(|n| n.nsid == namespace.nsid)
            || namespace.controllers.iter().any(|r| r.ctrl_id == c.ctrl_id)
    })
}

/// What one pass over a listing achieved.
enum Pass {
    Placed(HostLocator),
    /// SNAP changed under us (or another stage here built a pool): read the
    /// listing again.
    Relist,
}

/// Exposes `device` as one namespace on a pool and returns where the host
/// finds it. `listing` and `functions` were read with the plugin's CreateDevice.
#[allow(clippy::too_many_arguments)]
async fn expose(
    snap: &SnapEndpoint,
    packing: &Packing,
    names: &VolumeNames,
    device: &str,
    per_controller: u32,
    mut listing: Arc<SubsystemListing>,
    mut functions: Arc<FunctionListing>,
    deadline: Instant,
) -> Result<HostLocator, DpuError> {
    let stage = Stage {
        snap,
        packing,
        names,
        device,
        per_controller: per_controller.max(1),
        deadline,
    };
    for _ in 0..PLACEMENT_ATTEMPTS {
        match stage.pass(&listing, &mut functions).await? {
            Pass::Placed(locator) => return Ok(locator),
            Pass::Relist => listing = snap.list_subsystems(Instant::now(), deadline).await?,
        }
    }
    Err(DpuError::Unavailable(format!(
        "SNAP at {}: no free namespace slot held still for {} placements in a row; \
         the pools keep changing",
        snap.socket().display(),
        PLACEMENT_ATTEMPTS
    )))
}

/// One packed stage's fixed inputs.
struct Stage<'a> {
    snap: &'a SnapEndpoint,
    packing: &'a Packing,
    names: &'a VolumeNames,
    device: &'a str,
    per_controller: u32,
    deadline: Instant,
}

impl Stage<'_> {
    async fn pass(
        &self,
        listing: &SubsystemListing,
        functions: &mut Arc<FunctionListing>,
    ) -> Result<Pass, DpuError> {
        let mine = namespaces_of(listing, &self.names.namespace_uuid);
        if !mine.is_empty() {
            return self.continue_from(&mine, listing.asked_at, functions).await;
        }
        let pools = pools(listing);
        let claim = self.packing.slots.claim_first(
            listing.asked_at,
            pools
                .iter()
                .filter_map(|p| Some((p, p.live()?)))
                .flat_map(|(p, live)| {
                    p.free_nsids(self.per_controller)
                        .map(move |nsid| ((p.k, nsid), live))
                }),
        );
        if let Some(claim) = claim {
            let (k, nsid) = claim.key;
            let controller = claim.detail;
            let live = Live {
                ctrl_id: controller.ctrl_id.clone(),
                bdf: self.bdf_of(controller, &pool_nqn(k), functions).await?,
            };
            let created = self.create_namespace(k, nsid).await;
            claim.taken();
            if !created? {
                return Ok(Pass::Relist);
            }
            return self.attach(live, k, nsid).await;
        }
        self.build_and_place(listing, &pools, functions).await
    }

    /// The volume has a namespace already (a retry, or a crash after it was
    /// created): keep one, attach it if it is not, and destroy any other.
    async fn continue_from(
        &self,
        mine: &[(&NvmeSubsystem, &NvmeSubsystemNamespace)],
        listing_asked_at: Instant,
        functions: &mut Arc<FunctionListing>,
    ) -> Result<Pass, DpuError> {
        let (pool, namespace) = mine
            .iter()
            .find(|(p, n)| attached_to(p, n).next().is_some())
            .unwrap_or(&mine[0]);
        if namespace.bdev != self.device {
            return Err(DpuError::FailedPrecondition(format!(
                "SNAP at {}: namespace {} of {} carries volume UUID {} on bdev {}, not the \
                 plugin's device {}",
                self.snap.socket().display(),
                namespace.nsid,
                pool.nqn,
                self.names.namespace_uuid,
                namespace.bdev,
                self.device
            )));
        }
        let extras = mine
            .iter()
            .filter(|(p, n)| !(p.nqn == pool.nqn && n.nsid == namespace.nsid));
        for (extra_pool, extra) in extras {
            tracing::warn!(nqn = %extra_pool.nqn, nsid = extra.nsid, uuid = %self.names.namespace_uuid, "a second namespace of the volume (an earlier attempt's answer was lost): destroying it");
            destroy(self.snap, extra_pool, extra, self.deadline).await?;
        }
        let k = pool_index(&pool.nqn).unwrap_or_default();
        let attached = attached_to(pool, namespace).next();
        let live = match pool.controllers.iter().find(|c| nvme::is_running(c)) {
            Some(c) => Live {
                ctrl_id: c.ctrl_id.clone(),
                bdf: self.bdf_of(c, &pool.nqn, functions).await?,
            },
            None => {
                // A crash left the pool without a running controller.
                let Some(_held) = self.packing.build_lock(k, listing_asked_at).await else {
                    return Ok(Pass::Relist);
                };
                match self.build(k, Some(pool), functions).await? {
                    Some(live) => live,
                    None => return Ok(Pass::Relist),
                }
            }
        };
        if attached.is_some_and(|c| c.ctrl_id == live.ctrl_id) {
            return Ok(Pass::Placed(self.locator(live.bdf, namespace.nsid)));
        }
        self.attach(live, k, namespace.nsid).await
    }

    /// No live pool has room: build one (or finish one a crash left), unless
    /// another stage here is building it, in which case wait for it and read
    /// the listing again.
    async fn build_and_place(
        &self,
        listing: &SubsystemListing,
        pools: &[Pool<'_>],
        functions: &mut Arc<FunctionListing>,
    ) -> Result<Pass, DpuError> {
        let unfinished = pools
            .iter()
            .find(|p| p.live().is_none() && p.free_nsids(self.per_controller).next().is_some());
        let k = match unfinished {
            Some(p) => p.k,
            None => (0..)
                .find(|k| !pools.iter().any(|p| p.k == *k))
                .unwrap_or(u32::MAX),
        };
        let Some(held) = self.packing.build_lock(k, listing.asked_at).await else {
            return Ok(Pass::Relist);
        };
        let listed = unfinished.map(|p| p.listed);
        let Some(live) = self.build(k, listed, functions).await? else {
            return Ok(Pass::Relist);
        };
        let free: Vec<u32> = match listed {
            Some(listed) => Pool { k, listed }.free_nsids(self.per_controller).collect(),
            None => (1..=self.per_controller).collect(),
        };
        let Some(claim) = self.packing.slots.claim_first(
            listing.asked_at,
            free.into_iter().map(|nsid| ((k, nsid), ())),
        ) else {
            return Ok(Pass::Relist);
        };
        // Claimed: the stages waiting for this pool may read the listing now.
        drop(held);
        let nsid = claim.key.1;
        let created = self.create_namespace(k, nsid).await;
        claim.taken();
        if !created? {
            return Ok(Pass::Relist);
        }
        self.attach(live, k, nsid).await
    }

    /// Makes pool `k` live: its subsystem (unless `listed`), a controller
    /// on a free function (unless it has one), running. `None`: the pool
    /// appeared meanwhile (another process): read the listing again.
    async fn build(
        &self,
        k: u32,
        listed: Option<&NvmeSubsystem>,
        functions: &mut Arc<FunctionListing>,
    ) -> Result<Option<Live>, DpuError> {
        let nqn = pool_nqn(k);
        let snap = self.snap;
        let deadline = self.deadline;
        if listed.is_none() {
            let create = NvmeSubsystemCreate {
                nqn: nqn.clone(),
                mn: None,
                // The host shows it in /sys/class/nvme/*/serial (20 bytes at most).
                sn: Some(format!("snap-csi-pool-{k}")),
                nn: Some(self.per_controller),
                mnan: Some(self.per_controller),
            };
            match snap.call(&create, deadline).await {
                Ok(_) => {
                    tracing::info!(%nqn, namespaces = self.per_controller, "created pool subsystem")
                }
                Err(e) if e.code() == Some(code::EEXIST) => return Ok(None),
                Err(e) => return Err(snap.error(&format!("creating pool subsystem {nqn}"), e)),
            }
            crate::failpoint::step("attach:packed-pool-subsystem");
        }
        let existing = listed.and_then(|s| s.controllers.first()).cloned();
        let controller = match existing {
            Some(c) => c,
            None => {
                let what = format!("creating the controller of pool {nqn}");
                let (ctrl_id, bdf) = snap
                    .create_on_free_function(
                        Emulation::Nvme,
                        functions.clone(),
                        &what,
                        deadline,
                        |pci_bdf| {
                            // Running at once: an empty controller is what
                            // the host sees of a pool with nothing in it yet.
                            let create = NvmeControllerCreate {
                                nqn: nqn.clone(),
                                pci_bdf: Some(pci_bdf),
                                ..Default::default()
                            };
                            async move { snap.call(&create, deadline).await }
                        },
                    )
                    .await?;
                tracing::info!(%nqn, %ctrl_id, %bdf, "created pool controller");
                crate::failpoint::step("attach:packed-pool-controller");
                return Ok(Some(Live { ctrl_id, bdf }));
            }
        };
        let bdf = self.bdf_of(&controller, &nqn, functions).await?;
        if !nvme::is_running(&controller) {
            let resume = NvmeControllerResume {
                ctrl_id: controller.ctrl_id.clone(),
            };
            let what = format!("resuming controller {} of pool {nqn}", controller.ctrl_id);
            snap.call_tolerating(&what, &resume, &[], deadline).await?;
            tracing::info!(%nqn, ctrl_id = %controller.ctrl_id, "resumed pool controller");
        }
        Ok(Some(Live {
            ctrl_id: controller.ctrl_id,
            bdf,
        }))
    }

    /// `nvme_namespace_create` of slot (`k`, `nsid`); `false`: SNAP says the
    /// slot is taken or the pool full, so the listing was stale.
    async fn create_namespace(&self, k: u32, nsid: u32) -> Result<bool, DpuError> {
        let nqn = pool_nqn(k);
        let create = nvme::namespace_create(&nqn, nsid, self.names, self.device);
        match self.snap.call(&create, self.deadline).await {
            Ok(_) => {
                tracing::info!(%nqn, nsid, bdev = %self.device, "created packed namespace");
                crate::failpoint::step("attach:packed-namespace");
                Ok(true)
            }
            Err(e) if matches!(e.code(), Some(code::EEXIST | code::ENOSPC)) => {
                tracing::debug!(%nqn, nsid, "namespace slot taken meanwhile ({e}): placing again");
                Ok(false)
            }
            Err(e) => Err(self.snap.error(
                &format!("creating namespace {nsid} of {nqn} on bdev {}", self.device),
                e,
            )),
        }
    }

    /// `nvme_controller_attach_ns` on the pool's live controller.
    async fn attach(&self, live: Live, k: u32, nsid: u32) -> Result<Pass, DpuError> {
        let what = format!(
            "attaching namespace {nsid} of {} to {}",
            pool_nqn(k),
            live.ctrl_id
        );
        let attach = NvmeControllerAttachNs {
            ctrl_id: live.ctrl_id,
            nsid,
        };
        self.snap
            .call_tolerating(&what, &attach, &[code::EEXIST], self.deadline)
            .await?;
        crate::failpoint::step("attach:packed-attach");
        Ok(Pass::Placed(self.locator(live.bdf, nsid)))
    }

    async fn bdf_of(
        &self,
        controller: &NvmeController,
        nqn: &str,
        functions: &mut Arc<FunctionListing>,
    ) -> Result<String, DpuError> {
        let find = |f: &FunctionListing| {
            f.bdf_of(Emulation::Nvme, &controller.ctrl_id, controller.vhca_id)
        };
        if let Some(bdf) = find(functions) {
            return Ok(bdf);
        }
        // A listing shared with other stages may predate the controller.
        *functions = self.snap.list_functions_fresh(self.deadline).await?;
        find(functions).ok_or_else(|| {
            DpuError::Internal(format!(
                "SNAP at {}: controller {} of {nqn} sits on no listed NVMe function",
                self.snap.socket().display(),
                controller.ctrl_id,
            ))
        })
    }

    fn locator(&self, bdf: String, nsid: u32) -> HostLocator {
        HostLocator::Nvme {
            bdf,
            nsid,
            uuid: Some(self.names.namespace_uuid.clone()),
            // The pool's subsystem is shared: its serial names no volume.
            serial: None,
        }
    }
}

/// Marks pool `k` built (or given up) when dropped: the stages waiting for
/// it go on.
struct Built<'a> {
    packing: &'a Packing,
    k: u32,
    _guard: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for Built<'_> {
    fn drop(&mut self) {
        let mut building = self
            .packing
            .building
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Recorded before the waiters may read a listing again.
        self.packing
            .built
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(self.k, Instant::now());
        building.remove(&self.k);
    }
}

/// The bdevs of the volume's packed namespaces, read before they go.
fn bdevs<'a>(listing: &'a SubsystemListing, names: &VolumeNames) -> Vec<&'a str> {
    namespaces_of(listing, &names.namespace_uuid)
        .into_iter()
        .map(|(_, n)| n.bdev.as_str())
        .collect()
}

/// The pools holding the volume's namespaces, alone.
fn pools_of(listing: &SubsystemListing, names: &VolumeNames) -> SubsystemListing {
    let mine = namespaces_of(listing, &names.namespace_uuid);
    SubsystemListing {
        subsystems: listing
            .subsystems
            .iter()
            .filter(|s| mine.iter().any(|(pool, _)| pool.nqn == s.nqn))
            .cloned()
            .collect(),
        asked_at: listing.asked_at,
    }
}

/// Takes the volume's namespaces out of their pools (normally one), each
/// step skipped when already done; the pools and their controllers stay.
async fn release(
    snap: &SnapEndpoint,
    listing: &SubsystemListing,
    names: &VolumeNames,
    deadline: Instant,
) -> Result<(), DpuError> {
    let mine = namespaces_of(listing, &names.namespace_uuid);
    futures::future::try_join_all(
        mine.into_iter()
            .map(|(pool, namespace)| destroy(snap, pool, namespace, deadline)),
    )
    .await?;
    Ok(())
}

/// Detaches one namespace from its controllers, then destroys it.
async fn destroy(
    snap: &SnapEndpoint,
    pool: &NvmeSubsystem,
    namespace: &NvmeSubsystemNamespace,
    deadline: Instant,
) -> Result<(), DpuError> {
    let nqn = &pool.nqn;
    let nsid = namespace.nsid;
    futures::future::try_join_all(attached_to(pool, namespace).map(|c| {
        let detach = NvmeControllerDetachNs {
            ctrl_id: c.ctrl_id.clone(),
            nsid,
        };
        let what = format!("detaching namespace {nsid} of {nqn} from {}", c.ctrl_id);
        async move {
            snap.call_tolerating(&what, &detach, &[code::ENODEV], deadline)
                .await
        }
    }))
    .await?;
    crate::failpoint::step("detach:packed-detach-ns");
    let destroy = NvmeNamespaceDestroy {
        nqn: nqn.clone(),
        nsid,
    };
    let what = format!("destroying namespace {nsid} of {nqn}");
    snap.call_tolerating(&what, &destroy, &[code::ENODEV], deadline)
        .await?;
    tracing::info!(%nqn, nsid, "destroyed packed namespace");
    Ok(())
}

/// Every pool with its controllers; a packed volume is the namespace
/// carrying its UUID (namespaces without one are not ours).
pub(super) fn census(functions: &FunctionListing, subsystems: &[NvmeSubsystem]) -> Census {
    let mut census = Census::default();
    for pool in subsystems {
        let Some(capacity) = pool_capacity(pool) else {
            continue;
        };
        let bdf = nvme::first_bdf(functions, pool);
        census
            .controllers
            .extend(pool.controllers.iter().map(|c| ControllerUse {
                emulation: Emulation::Nvme,
                controller: c.ctrl_id.clone(),
                volume_key: None,
                pool: Some(pool.nqn.clone()),
            }));
        census
            .volumes
            .extend(pool.namespaces.iter().filter_map(|n| {
                Some(ExposedVolume {
                    key: n.uuid.clone()?.to_ascii_lowercase(),
                    emulation: Emulation::Nvme,
                    device_names: vec![n.bdev.clone()],
                    bdf: bdf.clone(),
                })
            }));
        census.pools.push(PoolUse {
            nqn: pool.nqn.clone(),
            namespaces: u32::try_from(pool.namespaces.len()).unwrap_or(u32::MAX),
            capacity,
            bdf,
        });
    }
    census
}
