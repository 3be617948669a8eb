//! NodeStageVolume and NodeUnstageVolume.
//!
//! Stage attaches the volume on the DPU (or takes DPF's attachment from the
//! publish context), records it, then does the host half: waits for the
//! device in sysfs, sets its read-only flag, and for a filesystem formats it
//! if blank, or grows it to its device if the volume grew meanwhile (ext4
//! before mounting, xfs once mounted), and mounts it at the staging path.
//! Unstage undoes each step in reverse, each tolerating its object being gone.

use std::collections::HashMap;
use std::path::Path;

use tokio::time::Instant;
use tonic::{Code, Request, Response, Status};

use super::error::NodeError;
use super::format::{self, FsType};
use super::records::VolumeRecord;
use super::recovery::{NotYet, Refusal, other_mounts};
use super::request::{Usage, access_mode, is_read_only_mode, maps_within_limits, staged_as, usage};
use super::service::NodeService;
use super::{device, grow, health, mount, mountinfo};
use crate::csi_limits::required_id;
use crate::dpu::{AttachRequest, HostLocator, VolumeMode};
use crate::host::BlockDevice;
use crate::proto::csi::v1 as csi;

impl NodeService {
    pub(super) async fn node_stage_volume_inner(
        &self,
        request: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        let volume_id = required_id(&req.volume_id, "volume_id")?;
        maps_within_limits(&req.volume_context, &req.publish_context, &req.secrets)?;
        let emulation = self.emulation_of(volume_id, &req.volume_context)?;
        if emulation.serves_files() {
            super::shared_fs::refuse_block_only(volume_id, &req.volume_context)?;
        }
        // Checked here too, not only on the DPU: a refused key changes nothing.
        let encrypted = crate::dpu::crypto::requested(&req.volume_context, &req.secrets)?.is_some();
        let staging = self.confine("staging_target_path", &req.staging_target_path)?;
        let (capability, usage) = usage(req.volume_capability.as_ref(), emulation)?;
        let read_only = is_read_only_mode(access_mode(&capability)?);
        let _held = self.hold(volume_id)?;

        let previous = self.recorded(volume_id)?;
        let (device_name, locator, dpu) = match super::context::dpf_locator(&req.publish_context)
            .map_err(Status::invalid_argument)?
        {
            Some(_) if encrypted => {
                return Err(Status::invalid_argument(format!(
                    "volume {volume_id} asks for encryption, which snap-csi's DPU attach \
                         does, but DPF attached it already (its publish context names the \
                         function)"
                )));
            }
            Some(locator) => (None, locator, None),
            None => {
                let staged_before = previous.is_some();
                let contexts = (&req.publish_context, &req.volume_context, &req.secrets);
                let attach =
                    self.attach_request(volume_id, contexts, (&capability, &usage), staged_before)?;
                let (attachment, dpu) = self.attach(&attach, previous.as_ref(), deadline).await?;
                crate::failpoint::step("stage:attach");
                (Some(attachment.device_name), attachment.locator, Some(dpu))
            }
        };
        let record = VolumeRecord {
            volume_id: volume_id.to_string(),
            staging_target_path: staging.clone(),
            device_name,
            locator: locator.clone(),
            external_attach: dpu.is_none(),
            dpu,
            staged_as: Some(staged_as(&usage, access_mode(&capability)?)),
            volume_context: req.volume_context.clone(),
            formatting: previous.is_some_and(|r| r.formatting),
        };
        self.keep_record(&record)?;
        if let Some(dpu) = &record.dpu {
            self.placed(volume_id, dpu)?;
        }
        crate::failpoint::step("stage:record");
        self.count_staged();
        match (&usage, locator.tag()) {
            (Usage::Shared { flags }, Some(tag)) => {
                self.mount_shared(&staging, tag, (flags, read_only), deadline)
                    .await?;
            }
            (Usage::Shared { .. }, None) => {
                return Err(Status::internal(format!(
                    "volume {volume_id} is a filesystem device, but it was attached as a disk \
                     ({locator})"
                )));
            }
            _ => {
                let on = (&locator, None);
                self.stage_on_host(volume_id, &staging, on, &usage, read_only, deadline)
                    .await?;
            }
        }
        Ok(Response::new(csi::NodeStageVolumeResponse {}))
    }

    pub(super) async fn node_unstage_volume_inner(
        &self,
        request: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        let volume_id = required_id(&req.volume_id, "volume_id")?;
        let staging = self.confine("staging_target_path", &req.staging_target_path)?;
        let _held = self.hold(volume_id)?;
        self.unstage_held(volume_id, &staging, deadline).await?;
        Ok(Response::new(csi::NodeUnstageVolumeResponse {}))
    }

    /// NodeUnstageVolume's work, for a caller holding the volume.
    pub(super) async fn unstage_held(
        &self,
        volume_id: &str,
        staging: &Path,
        deadline: Instant,
    ) -> Result<(), Status> {
        // Stacked mounts (a stage retried after a crash) all go.
        while mount::unmount(staging, deadline).await? {}
        crate::failpoint::step("unstage:unmount");
        let record = self.recorded(volume_id)?;
        // Stage may have made the device read-only; give it back as found.
        if let Some(record) = &record
            && let Some(device) = self.find_device(&record.locator)?
        {
            device::set_block_device_read_only(&device.node, false, deadline).await?;
        }
        if !record.as_ref().is_some_and(|r| r.external_attach) {
            self.detach(volume_id, record.as_ref(), deadline).await?;
            if record.is_none() {
                self.unplaced(volume_id)?;
            }
            crate::failpoint::step("unstage:detach");
        }
        self.records()
            .remove(volume_id)
            .map_err(|e| NodeError::state("removing the volume record", e))?;
        self.count_staged();
        crate::metrics::forget_volume_condition(volume_id);
        Ok(())
    }

    /// Writes `record` unless the node holds the same already.
    pub(super) fn keep_record(&self, record: &VolumeRecord) -> Result<(), NodeError> {
        if self.recorded(&record.volume_id)?.as_ref() != Some(record) {
            self.records()
                .store(record)
                .map_err(|e| NodeError::state("writing the volume record", e))?;
        }
        Ok(())
    }

    /// What the DPU is asked to attach: the volume as `capability` and
    /// `usage` use it, with the (publish, volume) contexts and the stage's
    /// secrets.
    pub(super) fn attach_request(
        &self,
        volume_id: &str,
        (publish_context, volume_context, secrets): (&Contexts, &Contexts, &Contexts),
        (capability, usage): (&csi::VolumeCapability, &Usage),
        attached_before: bool,
    ) -> Result<AttachRequest, Status> {
        let config = &self.config();
        let (emulation, placement) =
            super::context::emulation_and_placement(volume_context, config)?;
        let mode = access_mode(capability)?;
        Ok(AttachRequest {
            volume_id: volume_id.to_string(),
            access_modes: vec![crate::dpu::plugin_access_mode(mode)],
            volume_mode: match usage {
                Usage::Block => VolumeMode::Block,
                Usage::Filesystem { .. } | Usage::Shared { .. } => VolumeMode::Filesystem,
            },
            publish_context: publish_context.clone(),
            volume_context: volume_context.clone(),
            storage_parameters: volume_context.clone(),
            emulation,
            placement: placement.with(self.config().namespaces_per_controller),
            attached_before,
            secrets: secrets.clone(),
        })
    }

    /// Everything a stage does on the host once the volume is attached: the
    /// device found by its identity, its read-only flag, and for a filesystem
    /// a format if blank and the staging mount (a stale one taken away
    /// first). Also a publish's restage.
    ///
    /// A device that goes away meanwhile fails whatever comes next; that is
    /// answered as its loss (UNAVAILABLE: the retry attaches it again).
    /// `found`: the device at `locator` as the caller just found it, under
    /// the same hold (a publish), so that sysfs is not read for it twice.
    pub(super) async fn stage_on_host(
        &self,
        volume_id: &str,
        staging: &Path,
        (locator, found): (&HostLocator, Option<BlockDevice>),
        usage: &Usage,
        read_only: bool,
        deadline: Instant,
    ) -> Result<BlockDevice, Status> {
        let device = match found {
            Some(device) => device,
            None => self.wait_for_device(locator, deadline).await?,
        };
        let on_device = (locator, &device);
        let staged = self
            .stage_on_device(volume_id, staging, on_device, usage, read_only, deadline)
            .await;
        match staged {
            // Host work answers UNAVAILABLE only for a loss it saw already.
            Err(error) if error.code() != Code::Unavailable && self.lost(on_device) => {
                Err(lost(volume_id, &device, error.message()))
            }
            other => other.map(|()| device),
        }
    }

    /// [`Self::stage_on_host`] once the device is found.
    async fn stage_on_device(
        &self,
        volume_id: &str,
        staging: &Path,
        (locator, device): (&HostLocator, &BlockDevice),
        usage: &Usage,
        read_only: bool,
        deadline: Instant,
    ) -> Result<(), Status> {
        // A read-only mount does not stop writes through the device node (a
        // block volume, or anything opening the device): the device flag
        // does. Set both ways: the flag outlives the device's last user.
        device::set_block_device_read_only(&device.node, read_only, deadline).await?;

        let (fs, flags) = match usage {
            Usage::Block => return Ok(()),
            Usage::Filesystem { fs, flags } => (fs, flags),
            Usage::Shared { .. } => {
                return Err(Status::internal(format!(
                    "volume {volume_id} is a filesystem device, but the host found a disk for it"
                )));
            }
        };
        if let Some(existing) = mountinfo::at(staging)? {
            let here = (locator, Some(device));
            if self
                .clear_stale_staging(volume_id, staging, &existing, here, deadline)
                .await?
                && self
                    .keep_staged(volume_id, staging, &existing, deadline)
                    .await?
            {
                return Ok(());
            }
        }
        // A kernel name the device had may be another's by now: nothing is
        // written through it unless sysfs still shows it as the volume's.
        self.still_there(volume_id, (locator, device), "formatting")?;
        // A filesystem found on the device is grown to it here: the volume
        // may have grown while unstaged, or while staged without the host
        // seeing it (an encrypted one's device grows only when staged again,
        // `expand.rs`). Not left to the NodeExpandVolume kubelet may send
        // after the stage: whether it does depends on its resize bookkeeping.
        let grow = if read_only {
            if let format::Probe::Blank = format::probe(&device.node, deadline).await? {
                return Err(Refusal::BlankReadOnly {
                    volume_id: volume_id.to_string(),
                }
                .into());
            }
            false
        } else {
            let formatted = self
                .format(volume_id, (locator, device), *fs, deadline)
                .await?;
            crate::failpoint::step("stage:format");
            !formatted
        };
        if grow && *fs == FsType::Ext4 {
            grow::grow_ext4_offline(&device.node, deadline).await?;
        }
        self.still_there(volume_id, (locator, device), "mounting")?;
        mount::mount_filesystem(&device.node, staging, *fs, flags, read_only, deadline).await?;
        crate::failpoint::step("stage:mount");
        // xfs grows only mounted; a no-op when it fills its device already.
        // A failure leaves the volume usable at its old size, and a retried
        // stage would keep the mount without growing it: say so, go on.
        if grow
            && *fs == FsType::Xfs
            && let Err(error) = grow::expand_filesystem(&device.node, staging, *fs, deadline).await
        {
            tracing::warn!(%volume_id, %error, "the staged xfs was not grown to its device; NodeExpandVolume grows it");
        }
        Ok(())
    }

    /// Makes the volume's filesystem if its device is blank, or again if
    /// the record says our last mkfs on it never ended; the record says so
    /// from before mkfs starts until it has ended on a device that stayed
    /// the volume's: an mkfs that exits 0 while its device goes away (SNAP
    /// restarted under it) may have lost writes, and a filesystem half made
    /// is found, not made again, unless the record says so. `Ok(true)`:
    /// made now.
    async fn format(
        &self,
        volume_id: &str,
        on_device: (&HostLocator, &BlockDevice),
        fs: FsType,
        deadline: Instant,
    ) -> Result<bool, Status> {
        let device = &on_device.1.node;
        let Some(mut record) = self.recorded(volume_id)? else {
            return Err(Status::internal(format!(
                "volume {volume_id} has no record to format it under"
            )));
        };
        let cut_short = record.formatting;
        if cut_short {
            tracing::warn!(%volume_id, device = %device.display(), %fs, "the last mkfs on this volume never ended: making the filesystem again");
        } else if !format::needs_mkfs(device, fs, deadline).await? {
            return Ok(false);
        }
        record.formatting = true;
        self.keep_record(&record)?;
        crate::failpoint::step("stage:formatting");
        format::mkfs(device, fs, cut_short, deadline).await?;
        self.still_there(volume_id, on_device, "its mkfs was known to have ended")?;
        record.formatting = false;
        self.keep_record(&record)?;
        Ok(true)
    }

    /// Whether the host no longer shows `device` at the volume's identity
    /// (gone, or another device there now); a look that fails counts as gone.
    fn lost(&self, (locator, device): (&HostLocator, &BlockDevice)) -> bool {
        !matches!(
            self.find_device(locator),
            Ok(Some(now)) if (now.major, now.minor) == (device.major, device.minor)
        )
    }

    /// Refuses to go on to `next` with a device the host lost.
    fn still_there(
        &self,
        volume_id: &str,
        on_device: (&HostLocator, &BlockDevice),
        next: &str,
    ) -> Result<(), Status> {
        match self.lost(on_device) {
            true => Err(lost(
                volume_id,
                on_device.1,
                &format!("it was gone before {next}"),
            )),
            false => Ok(()),
        }
    }

    /// Whether the filesystem staged at `staging` (the mount `existing`)
    /// still works, so that a repeated stage leaves it as it is. One that
    /// failed (shut down, or read-only after errors) is unmounted, and the
    /// stage then repairs it as it mounts it again: e2fsck -p for ext4, log
    /// recovery for xfs (xfs_repair is not run unattended: it may throw
    /// away what it cannot place, a decision for a human). Not while it is
    /// published: the pods' bind mounts keep the broken filesystem alive, and
    /// a repair needs it unmounted everywhere.
    pub(super) async fn keep_staged(
        &self,
        volume_id: &str,
        staging: &Path,
        existing: &mountinfo::MountEntry,
        deadline: Instant,
    ) -> Result<bool, Status> {
        let Some(fault) = health::filesystem_fault(staging, existing, deadline).await? else {
            return Ok(true);
        };
        let published = other_mounts(existing, staging)?;
        if !published.is_empty() {
            return Err(Refusal::RepairWhilePublished {
                volume_id: volume_id.to_string(),
                fault,
                published: published.join(", "),
            }
            .into());
        }
        tracing::warn!(%volume_id, "unmounting the staged filesystem to repair it: {fault}");
        while mount::unmount(staging, deadline).await? {}
        crate::metrics::forget_volume_condition(volume_id);
        Ok(false)
    }
}

/// The contexts a request carries, as maps.
type Contexts = HashMap<String, String>;

fn lost(volume_id: &str, device: &BlockDevice, error: &str) -> Status {
    NotYet::DeviceLost {
        volume_id: volume_id.to_string(),
        device: format!("{} ({}:{})", device.name, device.major, device.minor),
        error: error.to_string(),
    }
    .into()
}
