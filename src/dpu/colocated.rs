//! [`Colocated`]: the DPU attach layer running where SNAP's socket is
//! reachable: in the node process (co-located mode: tests, the demo, a DPU
//! acting as its own node) or in the DPU agent (split mode).
//!
//! It only chooses how a volume is exposed (`exposure`: the request's
//! emulation and placement, or where an earlier stage put the volume) and
//! does the vendor plugin's steps around that: CreateDevice and DeleteDevice,
//! and the crypto layer between the plugin's device and SNAP.
//!
//! Round trips, since each dependent SNAP call costs a poll period (~8 ms on
//! a real DPU): an attach first asks the plugin's CreateDevice and reads
//! SNAP's listings, all at once, then runs only the steps the listings show
//! missing. NVMe, dedicated: a new volume takes 5 dependent round trips
//! (CreateDevice with the function listing; subsystem; namespace with
//! controller; attach; resume), one the node attached before 1 (CreateDevice
//! with both listings). NVMe, packed: 3 (CreateDevice with both listings;
//! namespace; attach), 5 for the stage that builds a pool, 1 again. virtio-blk:
//! 2 and 1. A detach takes 4 for NVMe (listings; controller, or a packed
//! namespace's detach; namespace; subsystem with DeleteDevice) and 3 for
//! virtio-blk (listings; controller; DeleteDevice). An encrypted volume
//! (`crypto`) pays one more each way: its crypto vbdev is made after
//! CreateDevice and deleted before DeleteDevice.
//!
//! A failed attach leaves what it made for a retry or a detach to pick up:
//! only the caller knows whether the volume was in use before, so only the
//! caller may decide to tear it down.

use std::path::PathBuf;
use std::sync::OnceLock;

use futures::future::{join_all, try_join_all};
use tokio::time::Instant;

use super::attach::{AttachRequest, Attachment, DpuAttach, Inventory};
use super::endpoint::SnapEndpoint;
use super::error::DpuError;
use super::exposure::Read;
use super::exposures::{Choice, Exposures};
use super::names::VolumeNames;
use super::plugin::PluginClient;
use super::{crypto, inventory};
use crate::proto::nvidia::storage::plugins::v1::storage_plugin_service_capability::rpc::Type as Capability;
use crate::retry;
use crate::spdk::app::SpdkGetVersion;
use crate::spdk::bdev::BdevGetIostat;
use crate::spdk::bdev::Iostat as IoStats;

/// The co-located attach layer: one vendor plugin and the SNAP it names.
#[derive(Debug)]
pub struct Colocated {
    plugin: PluginClient,
    /// The SNAP the plugin names; fixed once the plugin has described itself.
    snap: OnceLock<SnapEndpoint>,
    /// Every way of exposing a volume, with what each holds in memory (the
    /// namespace slots and pools packed stages here are placing).
    exposures: Exposures,
}

impl Colocated {
    /// The attach layer for the plugin at `plugin_socket`, whose SNAP provider
    /// maps to a socket through `snap_socket_template` (see
    /// [`super::plugin::snap_socket_path`]). Connects on first use.
    pub fn new(plugin_socket: impl Into<PathBuf>, snap_socket_template: impl Into<String>) -> Self {
        Colocated {
            plugin: PluginClient::new(plugin_socket, snap_socket_template),
            snap: OnceLock::new(),
            exposures: Exposures::new(),
        }
    }

    pub fn plugin(&self) -> &PluginClient {
        &self.plugin
    }

    async fn snap(&self, deadline: Instant) -> Result<&SnapEndpoint, DpuError> {
        let socket = &self.plugin.describe(deadline).await?.snap_socket;
        Ok(self.snap.get_or_init(|| SnapEndpoint::new(socket.clone())))
    }

    async fn attach_once(
        &self,
        request: &AttachRequest,
        choice: &Choice<'_>,
        deadline: Instant,
    ) -> Result<Attachment, DpuError> {
        // Listings shared with other volumes' calls must be asked for after
        // this: then they show whatever an earlier call for this volume did.
        let began = Instant::now();
        let snap = self.snap(deadline).await?;
        let names = VolumeNames::new(&request.volume_id);
        let key = crypto::requested(&request.volume_context, &request.secrets)?;
        // The key does not need the device: it goes into SPDK's keyring
        // beside CreateDevice.
        let create = async {
            let keyed = async {
                match &key {
                    Some(key) => crypto::create_key(snap, &names, key, deadline).await,
                    None => Ok(()),
                }
            };
            let (device, keyed) = tokio::join!(self.plugin.create_device(request, deadline), keyed);
            let device = device?;
            keyed.map(|()| device)
        };
        let read = choice.read(request, began);
        let found = async {
            let found = join_all(
                choice
                    .family
                    .iter()
                    .map(|e| e.find(snap, &names, read, deadline)),
            );
            found.await.into_iter().collect::<Result<Vec<_>, _>>()
        };
        let (device, found, functions) = tokio::join!(create, found, snap.list_functions(deadline));
        let device_name = created(device, &functions)?;
        crate::failpoint::step("attach:create-device");
        let exposed =
            crypto::exposed_bdev(snap, &names, &device_name, key.is_some(), deadline).await?;
        let (mut found, functions) = (found?, functions?);
        // A volume stays where its first stage placed it.
        let at = found
            .iter()
            .position(|f| f.holds())
            .unwrap_or(choice.requested);
        let chosen = found.swap_remove(at);
        drop(found);
        let locator = chosen
            .expose(request.placement, &exposed, functions, deadline)
            .await?;
        tracing::info!(volume_id = %request.volume_id, device = %device_name, ?locator, "volume attached");
        Ok(Attachment {
            device_name,
            locator,
        })
    }

    async fn detach_once(
        &self,
        volume_id: &str,
        device_name: Option<&str>,
        deadline: Instant,
    ) -> Result<(), DpuError> {
        let began = Instant::now();
        let snap = self.snap(deadline).await?;
        let names = VolumeNames::new(volume_id);
        // The caller does not say how the volume was exposed: ask every way.
        let found = join_all(
            self.exposures
                .all()
                .map(|e| e.find(snap, &names, Read::ToRelease(began), deadline)),
        );
        let (found, encryption) = tokio::join!(found, crypto::find(snap, &names, deadline));
        let found = found.into_iter().collect::<Result<Vec<_>, _>>()?;
        let encryption = encryption?;

        // Read before SNAP lets go of them: the bdevs SNAP served are the
        // plugin's devices even when the caller lost the name.
        let mut devices: Vec<String> = device_name.map(str::to_string).into_iter().collect();
        // An encrypted volume's SNAP objects serve its crypto vbdev, whose
        // base is the plugin's device.
        let seen = found
            .iter()
            .flat_map(|f| f.bdevs())
            .filter(|bdev| *bdev != names.crypto_bdev)
            .chain(encryption.base.as_deref());
        for bdev in seen {
            if !devices.iter().any(|d| d == bdev) {
                devices.push(bdev.to_string());
            }
        }

        every(join_all(found.iter().map(|f| f.release(deadline))).await)?;
        crate::failpoint::step("detach:unexpose");

        // SNAP no longer uses the device: what the release left (an empty
        // subsystem) and the device (after the crypto vbdev over it, if any)
        // can go at the same time.
        let (rest_removed, deleted) = tokio::join!(
            join_all(found.iter().map(|f| f.remove_rest(deadline))),
            async {
                if encryption.base.is_some() {
                    crypto::delete_vbdev(snap, &names, deadline).await?;
                    crate::failpoint::step("detach:crypto-bdev");
                }
                let unkeyed = async {
                    match encryption.key {
                        true => crypto::destroy_key(snap, &names, deadline).await,
                        false => Ok(()),
                    }
                };
                let (deleted, unkeyed) =
                    tokio::join!(self.delete_devices(volume_id, &devices, deadline), unkeyed);
                deleted.and(unkeyed)
            }
        );
        every(rest_removed)?;
        deleted?;
        crate::failpoint::step("detach:delete-device");
        tracing::info!(%volume_id, ?devices, "volume detached");
        Ok(())
    }

    /// DeleteDevice for each known device of the volume. Without a name (the
    /// caller lost it and SNAP no longer shows one), in order:
    /// 1. a plugin with LIST_DEVICES says which devices the volume has; none
    ///    listed means nothing to delete;
    /// 2. a plugin with GET_DEVICE_STATS answering NOT_FOUND for the volume
    ///    means nothing to delete;
    /// 3. otherwise DeleteDevice goes out with the volume id alone: the API
    ///    keys devices by volume id too and answers OK for an absent one. A
    ///    plugin that refuses it gets FailedPrecondition, not silence: the
    ///    device would leak, and someone must remove it by hand.
    async fn delete_devices(
        &self,
        volume_id: &str,
        devices: &[String],
        deadline: Instant,
    ) -> Result<(), DpuError> {
        if !devices.is_empty() {
            return self.delete_each(volume_id, devices, deadline).await;
        }
        let description = self.plugin.describe(deadline).await?;
        if description.has(Capability::ListDevices) {
            let listed: Vec<String> = self
                .plugin
                .list_devices(deadline)
                .await?
                .into_iter()
                .filter(|e| e.volume_id == volume_id)
                .map(|e| e.device_name)
                .collect();
            if listed.is_empty() {
                tracing::debug!(%volume_id, "the vendor plugin lists no device of the volume");
            }
            return self.delete_each(volume_id, &listed, deadline).await;
        }
        if description.has(Capability::GetDeviceStats)
            && self
                .plugin
                .get_device(volume_id, "", deadline)
                .await?
                .is_none()
        {
            return Ok(());
        }
        match self.plugin.delete_device(volume_id, "", deadline).await {
            Err(DpuError::InvalidArgument(message)) => Err(DpuError::FailedPrecondition(format!(
                "the device name of volume {volume_id} is unknown (SNAP no longer shows it and the \
                 plugin cannot list devices), and the plugin refuses DeleteDevice without it: {message}"
            ))),
            other => other,
        }
    }

    async fn delete_each(
        &self,
        volume_id: &str,
        devices: &[String],
        deadline: Instant,
    ) -> Result<(), DpuError> {
        try_join_all(
            devices
                .iter()
                .map(|name| self.plugin.delete_device(volume_id, name, deadline)),
        )
        .await?;
        Ok(())
    }
}

/// The plugin's CreateDevice, which ran beside SNAP's listing: when both
/// found their peer unreachable, the error names both, since a plugin waits
/// for SNAP too (a SNAP that is down or stuck first shows as a plugin that
/// does not answer), and the operator reading kubelet's event must learn
/// which one to fix.
fn created<T>(
    device: Result<String, DpuError>,
    snap: &Result<T, DpuError>,
) -> Result<String, DpuError> {
    match (device, snap) {
        (Err(DpuError::Unavailable(plugin)), Err(DpuError::Unavailable(snap))) => {
            Err(DpuError::Unavailable(format!("{plugin}; {snap}")))
        }
        (device, _) => device,
    }
}

/// The first failure of steps that all ran to their end, in the order they
/// were started.
fn every(results: Vec<Result<(), DpuError>>) -> Result<(), DpuError> {
    results.into_iter().collect()
}

fn retryable(error: &DpuError) -> bool {
    matches!(error, DpuError::Unavailable(_))
}

#[async_trait::async_trait]
impl DpuAttach for Colocated {
    /// Retried whole while SNAP or the plugin is unreachable: every step reads
    /// SNAP's state first, so a retry continues where the last attempt ended.
    async fn attach(
        &self,
        request: &AttachRequest,
        deadline: Instant,
    ) -> Result<Attachment, DpuError> {
        if request.volume_id.is_empty() {
            return Err(DpuError::InvalidArgument("the volume id is empty".into()));
        }
        let choice = self.exposures.for_attach(request)?;
        retry::until_deadline(deadline, retryable, || {
            self.attach_once(request, &choice, deadline)
        })
        .await
    }

    async fn detach(
        &self,
        volume_id: &str,
        device_name: Option<&str>,
        deadline: Instant,
    ) -> Result<(), DpuError> {
        if volume_id.is_empty() {
            return Err(DpuError::InvalidArgument("the volume id is empty".into()));
        }
        let device_name = device_name.filter(|d| !d.is_empty());
        retry::until_deadline(deadline, retryable, || {
            self.detach_once(volume_id, device_name, deadline)
        })
        .await
    }

    async fn probe(&self, deadline: Instant) -> Result<bool, DpuError> {
        let snap_answers = async {
            let snap = self.snap(deadline).await?;
            snap.call(&SpdkGetVersion {}, deadline)
                .await
                .map(drop)
                .map_err(|e| snap.error("asking the SPDK version", e))
        };
        let (ready, snap_answers) = tokio::join!(self.plugin.probe(deadline), snap_answers);
        let ready = ready?;
        snap_answers?;
        Ok(ready)
    }

    async fn inventory(&self, deadline: Instant) -> Result<Inventory, DpuError> {
        inventory::read(self.snap(deadline).await?, &self.exposures, deadline).await
    }

    async fn io_stats(&self, deadline: Instant) -> Result<IoStats, DpuError> {
        let snap = self.snap(deadline).await?;
        // No name: every bdev in one answer, whatever their number.
        snap.call(&BdevGetIostat::default(), deadline)
            .await
            .map_err(|e| snap.error("reading the bdevs' I/O counters", e))
    }
}
