//! NodeStageVolume and NodeUnstageVolume.
//!
//! Stage attaches the volume on the DPU (or takes DPF's attachment from the
//! publish context), records it, then does the host half: waits for the
//! device in sysfs, sets its read-only flag, and for a filesystem formats it
//! if blank and mounts it at the staging path. Unstage undoes each step in
//! reverse, each tolerating its object being gone.

use std::path::Path;

use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::error::NodeError;
use super::format::{self, FsType};
use super::records::VolumeRecord;
use super::recovery::Refusal;
use super::request::{Usage, access_mode, is_read_only_mode, maps_within_limits, staged_as, usage};
use super::service::NodeService;
use super::{device, grow, health, mount, mountinfo};
use crate::csi_limits::required_id;
use crate::dpu::{AttachRequest, DpuError, HostLocator, VolumeMode};
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
        // Checked here too, not only on the DPU: a refused key changes nothing.
        let encrypted = crate::dpu::crypto::requested(&req.volume_context, &req.secrets)?.is_some();
        let staging = self.confine("staging_target_path", &req.staging_target_path)?;
        let (capability, usage) = usage(req.volume_capability.as_ref())?;
        let read_only = is_read_only_mode(access_mode(&capability)?);
        let _held = self.hold(volume_id)?;

        let (device_name, locator, external) =
            match super::context::dpf_locator(&req.publish_context)
                .map_err(Status::invalid_argument)?
            {
                Some(_) if encrypted => {
                    return Err(Status::invalid_argument(format!(
                        "volume {volume_id} asks for encryption, which snap-csi's DPU attach \
                         does, but DPF attached it already (its publish context names the \
                         function)"
                    )));
                }
                Some(locator) => (None, locator, true),
                None => {
                    let staged_before = self.recorded(volume_id)?.is_some();
                    let attach = self.attach_request(&req, &capability, &usage, staged_before)?;
                    let attachment = match self.dpu().attach(&attach, deadline).await {
                        Ok(attachment) => attachment,
                        Err(e) => {
                            // A definite refusal (no free function, bad
                            // arguments): undo what this attempt made rather
                            // than leave it for an unstage that may never come.
                            // A transient failure is left for the retry.
                            if !staged_before
                                && !matches!(e, DpuError::Unavailable(_))
                                && let Err(undo) =
                                    self.dpu().detach(volume_id, None, deadline).await
                            {
                                tracing::warn!(%volume_id, "undoing a failed attach: {undo}");
                            }
                            return Err(Status::from(e));
                        }
                    };
                    crate::failpoint::step("stage:attach");
                    (Some(attachment.device_name), attachment.locator, false)
                }
            };
        let record = VolumeRecord {
            volume_id: volume_id.to_string(),
            staging_target_path: staging.clone(),
            device_name,
            locator: locator.clone(),
            external_attach: external,
            staged_as: Some(staged_as(&usage, access_mode(&capability)?)),
            volume_context: req.volume_context.clone(),
        };
        if self.recorded(volume_id)?.as_ref() != Some(&record) {
            self.records()
                .store(&record)
                .map_err(|e| NodeError::state("writing the volume record", e))?;
        }
        crate::failpoint::step("stage:record");
        self.count_staged();
        self.stage_on_host(volume_id, &staging, &locator, &usage, read_only, deadline)
            .await?;
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
            let device_name = record.as_ref().and_then(|r| r.device_name.as_deref());
            self.dpu()
                .detach(volume_id, device_name, deadline)
                .await
                .map_err(Status::from)?;
            crate::failpoint::step("unstage:detach");
        }
        self.records()
            .remove(volume_id)
            .map_err(|e| NodeError::state("removing the volume record", e))?;
        self.count_staged();
        crate::metrics::forget_volume_condition(volume_id);
        Ok(())
    }

    fn attach_request(
        &self,
        stage: &csi::NodeStageVolumeRequest,
        capability: &csi::VolumeCapability,
        usage: &Usage,
        attached_before: bool,
    ) -> Result<AttachRequest, Status> {
        let config = &self.config();
        let (emulation, placement) =
            super::context::emulation_and_placement(&stage.volume_context, config)?;
        let mode = access_mode(capability)?;
        Ok(AttachRequest {
            volume_id: stage.volume_id.clone(),
            access_modes: vec![crate::dpu::plugin_access_mode(mode)],
            volume_mode: match usage {
                Usage::Block => VolumeMode::Block,
                Usage::Filesystem { .. } => VolumeMode::Filesystem,
            },
            publish_context: stage.publish_context.clone(),
            volume_context: stage.volume_context.clone(),
            storage_parameters: stage.volume_context.clone(),
            emulation: emulation.into(),
            placement: placement.with(self.config().namespaces_per_controller),
            attached_before,
            secrets: stage.secrets.clone(),
        })
    }

    /// Everything a stage does on the host once the volume is attached: the
    /// device found by its identity, its read-only flag, and for a filesystem
    /// a format if blank and the staging mount. Also a publish's restage.
    pub(super) async fn stage_on_host(
        &self,
        volume_id: &str,
        staging: &Path,
        locator: &HostLocator,
        usage: &Usage,
        read_only: bool,
        deadline: Instant,
    ) -> Result<BlockDevice, Status> {
        let device = self.wait_for_device(locator, deadline).await?;
        // A read-only mount does not stop writes through the device node (a
        // block volume, or anything opening the device): the device flag
        // does. Set both ways: the flag outlives the device's last user.
        device::set_block_device_read_only(&device.node, read_only, deadline).await?;

        let Usage::Filesystem { fs, flags } = usage else {
            return Ok(device);
        };
        if let Some(existing) = mountinfo::at(staging)? {
            self.check_staging_mount(volume_id, staging, &existing, locator, Some(&device))?;
            if self
                .keep_staged(volume_id, staging, &existing, deadline)
                .await?
            {
                return Ok(device);
            }
        }
        if read_only {
            if let format::Probe::Blank = format::probe(&device.node, deadline).await? {
                return Err(Refusal::BlankReadOnly {
                    volume_id: volume_id.to_string(),
                }
                .into());
            }
        } else {
            let formatted = format::format_if_blank(&device.node, *fs, deadline).await?;
            crate::failpoint::step("stage:format");
            if !formatted && *fs == FsType::Ext4 {
                grow::grow_ext4_offline(&device.node, deadline).await?;
            }
        }
        mount::mount_filesystem(&device.node, staging, *fs, flags, read_only, deadline).await?;
        crate::failpoint::step("stage:mount");
        Ok(device)
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
        let published: Vec<String> = mountinfo::read()?
            .iter()
            .filter(|m| (m.major, m.minor) == (existing.major, existing.minor))
            .filter(|m| m.mount_point != staging)
            .map(|m| m.mount_point.display().to_string())
            .collect();
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
