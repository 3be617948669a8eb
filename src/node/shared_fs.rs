//! The host half of a filesystem device (virtio-fs): what a stage, a
//! publish and an expand do for a volume the DPU serves as a tree rather
//! than a disk. There is no block device to find, flag or format: the host
//! waits for the device's tag (`/sys/fs/virtiofs/*/tag` where the kernel
//! lists tags, else the mount is the probe) and mounts it by tag. Several
//! hosts mount the same volume at once, each through its own function.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tokio::time::Instant;
use tonic::Status;

use super::recovery::Refusal;
use super::request::{Usage, access_mode, is_read_only_mode, staged_as};
use super::service::{NodeService, poll_until};
use super::{health, mount, mountinfo};
use crate::dpu::Emulation;
use crate::guard::Held;
use crate::proto::csi::v1 as csi;

/// Volume context keys that only a block device can honour.
const BLOCK_ONLY: [&str; 2] = [
    crate::dpu::crypto::ENCRYPTION,
    super::context::PLACEMENT_KEY,
];

impl NodeService {
    /// The emulation of the volume a request names: a staged filesystem
    /// device's by its record (a publish's volume context is optional),
    /// else what the volume context or the node's default says.
    pub(super) fn emulation_of(
        &self,
        volume_id: &str,
        volume_context: &HashMap<String, String>,
    ) -> Result<Emulation, Status> {
        if let Some(record) = self.recorded(volume_id)?
            && record.locator.tag().is_some()
        {
            return Ok(Emulation::VirtioFs);
        }
        let (emulation, _) =
            super::context::emulation_and_placement(volume_context, self.config())?;
        Ok(emulation)
    }

    /// Mounts the filesystem device with `tag` at `staging`, once the host
    /// shows the tag (within `--device-wait`); a freshly hot-plugged device
    /// may still answer "tag not found" for a while, which the mount retries.
    /// A mount there that lost its device is taken away first: the tag now
    /// names the device the attach just made.
    pub(super) async fn mount_shared(
        &self,
        staging: &Path,
        tag: &str,
        (flags, read_only): (&[String], bool),
        deadline: Instant,
    ) -> Result<(), Status> {
        if mountinfo::at(staging)?.is_some() && mount::lost_its_device(staging, deadline).await? {
            tracing::warn!(staging = %staging.display(), %tag, "the staging mount lost its device (SNAP restarted, or the function went away): mounting the tag again");
            while mount::unmount(staging, deadline).await? {}
        }
        let until = Instant::now() + self.config().device_wait;
        let sysfs = self.sysfs();
        let shown = || {
            sysfs
                .virtio_fs_tag_shown(tag)
                .map(|shown| shown != Some(false))
                .map_err(|e| Status::internal(format!("looking for virtio-fs tag {tag}: {e}")))
        };
        if poll_until(until.min(deadline), || Ok(shown()?.then_some(())))
            .await?
            .is_none()
        {
            return Err(Status::deadline_exceeded(format!(
                "the host did not show virtio-fs tag {tag} in time"
            )));
        }
        let emulated = self.config().virtiofs_emulated_dir.as_deref();
        let host = (emulated, sysfs);
        mount::mount_virtio_fs(tag, staging, (flags, read_only), host, until, deadline).await?;
        crate::failpoint::step("stage:mount");
        Ok(())
    }

    /// What a publish of a filesystem device binds: its staging mount, or
    /// (a reboot took it) the tag mounted there again from the record.
    pub(super) async fn shared_for_publish(
        &self,
        request: &csi::NodePublishVolumeRequest,
        (staging, held): (&Path, &mut Held),
        (capability, usage): (&csi::VolumeCapability, &Usage),
        deadline: Instant,
    ) -> Result<PathBuf, Status> {
        let volume_id = request.volume_id.as_str();
        let Usage::Shared { flags } = usage else {
            return Err(Status::internal(
                "a filesystem device's publish without its usage",
            ));
        };
        let record = self.recorded(volume_id)?;
        let staged = mountinfo::at(staging)?;
        let record = match (record, &staged) {
            (Some(record), _) => record,
            (None, Some(_)) => {
                return Err(Refusal::MountedWithoutRecord {
                    volume_id: volume_id.to_string(),
                    staging: staging.to_path_buf(),
                }
                .into());
            }
            (None, None) => {
                return Err(Refusal::NotStaged {
                    volume_id: volume_id.to_string(),
                    staging: staging.to_path_buf(),
                }
                .into());
            }
        };
        let tag = record.locator.tag().unwrap_or_default();
        let lost = match &staged {
            Some(mount) if mount::is_tag_mount(mount, tag) => {
                if !mount::lost_its_device(staging, deadline).await? {
                    return Ok(staging.to_path_buf());
                }
                true
            }
            _ => false,
        };
        let mode = access_mode(capability)?;
        let asked = staged_as(usage, mode);
        if let Some(why) =
            super::publish::disagreement(&record, staging, &asked, &request.volume_context)
        {
            return Err(Refusal::CannotRestage {
                volume_id: volume_id.to_string(),
                staging: staging.to_path_buf(),
                why,
            }
            .into());
        }
        held.widen()?;
        let locator = if lost {
            // SNAP came back empty or the function went: kubelet sends no
            // stage for a volume it believes staged, so the publish attaches.
            let asked = (&request.publish_context, (capability, usage));
            self.locate_again(&record, asked, deadline).await?
        } else {
            tracing::info!(%volume_id, staging = %staging.display(), "the staging mount is gone (a reboot?): mounting the volume's tag again");
            record.locator.clone()
        };
        let tag = locator.tag().unwrap_or(tag);
        self.mount_shared(staging, tag, (flags, is_read_only_mode(mode)), deadline)
            .await?;
        Ok(staging.to_path_buf())
    }
}

/// Refuses, naming it, a volume context option a filesystem device cannot
/// honour (encryption, a placement); changes nothing.
pub(super) fn refuse_block_only(
    volume_id: &str,
    volume_context: &HashMap<String, String>,
) -> Result<(), Status> {
    match BLOCK_ONLY.iter().find(|k| volume_context.contains_key(**k)) {
        Some(key) => Err(Status::invalid_argument(format!(
            "volume {volume_id}: {key} is for block devices (nvme, virtio-blk); a {} volume is \
             the DPU's filesystem, served as it is",
            Emulation::VirtioFs.name()
        ))),
        None => Ok(()),
    }
}

/// NodeExpandVolume of a filesystem device: nothing grows on the host (the
/// capacity is the backend's, grown by ControllerExpandVolume before it
/// answered); the size the mount shows. Not held to the bytes asked: a
/// backend whose volume is a filesystem of its own (the sample plugin's
/// ext4 per volume) keeps part of it for its metadata, which the host
/// cannot know.
pub(super) fn expanded(path: &Path) -> Result<csi::NodeExpandVolumeResponse, Status> {
    let total = health::filesystem_usage(path)?.total_bytes;
    Ok(csi::NodeExpandVolumeResponse {
        capacity_bytes: total,
    })
}
