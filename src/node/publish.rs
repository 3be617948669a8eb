//! NodePublishVolume and NodeUnpublishVolume, and a publish's restage of a
//! volume whose staging mount a reboot took away.
//!
//! A reboot takes every mount away while the records and SNAP's state
//! remain, and kubelet then calls NodePublish without NodeStage: a publish
//! that finds no staging mount stages the volume again from its record,
//! when the record and the request agree on the staging path, the
//! capability and the volume context; otherwise it says why not
//! (FAILED_PRECONDITION) rather than guess. A block volume has no staging
//! mount to tell a reboot by, so its publish always checks the record and
//! redoes the host half (finding the device, its read-only flag); a
//! record an older node wrote, without the capability, does not stop it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::error::NodeError;
use super::mount;
use super::mountinfo;
use super::records::{StagedAs, VolumeRecord};
use super::recovery::Refusal;
use super::request::{
    Usage, access_mode, is_read_only_mode, maps_within_limits, require, staged_as, usage,
};
use super::service::NodeService;
use crate::csi_limits::required_id;
use crate::dpu::HostLocator;
use crate::guard::Held;
use crate::host::BlockDevice;
use crate::proto::csi::v1 as csi;

impl NodeService {
    pub(super) async fn node_publish_volume_inner(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        // The REQUIRED fields first (INVALID_ARGUMENT), then the staging
        // path that STAGE_UNSTAGE_VOLUME makes necessary (FAILED_PRECONDITION).
        let volume_id = required_id(&req.volume_id, "volume_id")?;
        maps_within_limits(&req.volume_context, &req.publish_context, &req.secrets)?;
        require(&req.target_path, "target_path")?;
        let emulation = self.emulation_of(volume_id, &req.volume_context)?;
        let (capability, usage) = usage(req.volume_capability.as_ref(), emulation)?;
        if req.staging_target_path.is_empty() {
            return Err(Status::failed_precondition(
                "staging_target_path is required: this plugin stages volumes (STAGE_UNSTAGE_VOLUME)",
            ));
        }
        let target = self.confine("target_path", &req.target_path)?;
        let staging = self.confine("staging_target_path", &req.staging_target_path)?;
        let read_only = req.readonly || is_read_only_mode(access_mode(&capability)?);
        let mut held = self.hold_target(volume_id, &target)?;

        let staged = (staging.as_path(), &mut held);
        let source = match usage {
            Usage::Shared { .. } => {
                self.shared_for_publish(&req, staged, (&capability, &usage), deadline)
                    .await?
            }
            _ => {
                self.staged_for_publish(&req, staged, (&capability, &usage), deadline)
                    .await?
            }
        };
        // Already published here with the same source and setting: done;
        // anything else there is ALREADY_EXISTS (bind_mount looks once).
        mount::bind_mount(&source, &target, read_only)?;
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    pub(super) async fn node_unpublish_volume_inner(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        let volume_id = required_id(&req.volume_id, "volume_id")?;
        let target = self.confine("target_path", &req.target_path)?;
        let _held = self.hold_target(volume_id, &target)?;
        while mount::unmount(&target, deadline).await? {}
        crate::failpoint::step("unpublish:unmount");
        remove_mount_point(&target).map_err(|e| NodeError::state("removing the target path", e))?;
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    /// What a publish binds onto its target: the staging mount (checked to
    /// sit on the volume's device) or the block device. A volume whose
    /// staging mount is gone (a reboot) or stale (see `recovery`), or whose
    /// device the host lost, is staged again from its record, holding the
    /// whole volume (`held` widened): attached again if the host lost the
    /// device, since kubelet sends no stage for a volume it believes staged.
    pub(super) async fn staged_for_publish(
        &self,
        request: &csi::NodePublishVolumeRequest,
        (staging, held): (&Path, &mut Held),
        (capability, usage): (&csi::VolumeCapability, &Usage),
        deadline: Instant,
    ) -> Result<PathBuf, Status> {
        let volume_id = request.volume_id.as_str();
        let record = self.recorded(volume_id)?;
        let staged = match usage {
            Usage::Filesystem { .. } | Usage::Shared { .. } => mountinfo::at(staging)?,
            Usage::Block => None,
        };
        let device = match (&staged, &record) {
            (Some(_), None) => {
                return Err(Refusal::MountedWithoutRecord {
                    volume_id: volume_id.to_string(),
                    staging: staging.to_path_buf(),
                }
                .into());
            }
            (_, Some(record)) => match self.find_device(&record.locator)? {
                Some(device) => Some(device),
                None => self.shown_soon(&record.locator, deadline).await?,
            },
            (None, None) => None,
        };
        if let (Some(existing), Some(device)) = (&staged, &device)
            && (existing.major, existing.minor) == (device.major, device.minor)
        {
            return Ok(staging.to_path_buf());
        }
        let mode = access_mode(capability)?;
        let record = record.ok_or_else(|| Refusal::NotStaged {
            volume_id: volume_id.to_string(),
            staging: staging.to_path_buf(),
        })?;
        let context = &request.volume_context;
        if let Some(why) = disagreement(&record, staging, &staged_as(usage, mode), context) {
            return Err(Refusal::CannotRestage {
                volume_id: volume_id.to_string(),
                staging: staging.to_path_buf(),
                why,
            }
            .into());
        }
        // A block volume whose device is there needs its flag checked only:
        // that leaves its other publishes running beside this one.
        if staged.is_some() || device.is_none() || matches!(usage, Usage::Filesystem { .. }) {
            held.widen()?;
        }
        if let Some(existing) = &staged {
            let here = (&record.locator, device.as_ref());
            self.clear_stale_staging(volume_id, staging, existing, here, deadline)
                .await?;
        } else if let Usage::Filesystem { .. } = usage {
            tracing::info!(%volume_id, staging = %staging.display(), "the staging mount is gone (a reboot?): staging the volume again from its record");
        }
        let (locator, found) = match device {
            Some(device) => (record.locator.clone(), Some(device)),
            None => {
                let asked = (&request.publish_context, (capability, usage));
                (self.locate_again(&record, asked, deadline).await?, None)
            }
        };
        let device = self
            .stage_on_host(
                volume_id,
                staging,
                (&locator, found),
                usage,
                is_read_only_mode(mode),
                deadline,
            )
            .await?;
        Ok(match usage {
            Usage::Block => device.node,
            Usage::Filesystem { .. } | Usage::Shared { .. } => staging.to_path_buf(),
        })
    }

    /// The device at `locator` if the host shows it within `--device-wait`
    /// and half the time left: a device not shown may be one still settling
    /// (a hot-plug, a rescan), which the volume's other publishes wait for
    /// beside this one; only one not shown by then was lost, and is attached
    /// again under the whole volume's hold, with the other half left for it.
    async fn shown_soon(
        &self,
        locator: &HostLocator,
        deadline: Instant,
    ) -> Result<Option<BlockDevice>, Status> {
        let now = Instant::now();
        let grace = (deadline.saturating_duration_since(now) / 2).min(self.config().device_wait);
        Ok(self.poll_device(locator, now + grace, |_| true).await?.ok())
    }

    /// Where the volume is now that the host does not show its device at
    /// the recorded identity: where a new attach puts it (recorded), SNAP
    /// having come back empty or the function gone. DPF's attachments are
    /// DPF's: for those the node can only wait for the device.
    pub(super) async fn locate_again(
        &self,
        record: &VolumeRecord,
        (publish_context, capability): (&HashMap<String, String>, (&csi::VolumeCapability, &Usage)),
        deadline: Instant,
    ) -> Result<HostLocator, Status> {
        let volume_id = &record.volume_id;
        if record.external_attach {
            return Ok(record.locator.clone());
        }
        // A publish carries no stage secrets, so no encryption key.
        let no_secrets = HashMap::new();
        if crate::dpu::crypto::requested(&record.volume_context, &no_secrets).is_err() {
            return Err(Refusal::KeyOnlyAtStage {
                volume_id: volume_id.clone(),
            }
            .into());
        }
        tracing::warn!(%volume_id, "the host does not show the volume's device: attaching it again");
        let contexts = (publish_context, &record.volume_context, &no_secrets);
        let attach = self.attach_request(volume_id, contexts, capability, true)?;
        let (attachment, dpu) = self.attach(&attach, Some(record), deadline).await?;
        let record = VolumeRecord {
            device_name: Some(attachment.device_name),
            locator: attachment.locator,
            dpu: Some(dpu),
            ..record.clone()
        };
        self.keep_record(&record)?;
        Ok(record.locator)
    }
}

/// Why a publish may not stage the volume again from its record, if it may
/// not. The volume context agrees when every key both carry has the same
/// value: kubelet adds keys at publish (pod information) that the stage
/// never saw, and CSI makes a publish's context optional.
pub(super) fn disagreement(
    record: &VolumeRecord,
    staging: &Path,
    requested: &StagedAs,
    volume_context: &HashMap<String, String>,
) -> Option<String> {
    if record.staging_target_path != staging {
        return Some(format!(
            "it was staged at {}",
            record.staging_target_path.display()
        ));
    }
    let Some(staged) = &record.staged_as else {
        // A block volume staged by an older node published this way before
        // it kept the capability: an upgrade must not refuse its next pod.
        return requested.fs_type.as_ref().map(|_| {
            "its record, written by an older node, does not say how it was staged".into()
        });
    };
    let kind = |s: &StagedAs| match &s.fs_type {
        Some(fs) => format!("a {fs} filesystem, {}", s.access_mode),
        None => format!("a block volume, {}", s.access_mode),
    };
    if (&staged.fs_type, &staged.access_mode) != (&requested.fs_type, &requested.access_mode) {
        return Some(format!(
            "it was staged as {} and this publish asks for {}",
            kind(staged),
            kind(requested)
        ));
    }
    if staged.mount_flags != requested.mount_flags {
        return Some("it was staged with other mount flags".into());
    }
    let mut keys: Vec<&String> = volume_context.keys().collect();
    keys.sort();
    keys.into_iter().find_map(|key| {
        let (was, asked) = (record.volume_context.get(key)?, &volume_context[key]);
        (was != asked).then(|| {
            format!("its volume context has {key}={was:?}, this publish's {key}={asked:?}")
        })
    })
}

/// Removes an empty mount point (a directory for filesystems, a file for
/// block volumes) once nothing is mounted on it; an absent one is fine.
fn remove_mount_point(target: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(target) {
        Ok(meta) if meta.is_dir() => match std::fs::remove_dir(target) {
            Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => Ok(()),
            other => other,
        },
        Ok(meta) if meta.is_file() && meta.len() == 0 => std::fs::remove_file(target),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> VolumeRecord {
        VolumeRecord {
            staging_target_path: "/k/staging/pvc-1".into(),
            ..super::super::records::sample("pvc-1")
        }
    }

    #[test]
    fn a_publish_agrees_with_its_record_or_says_where_not() {
        let record = record();
        let staging = Path::new("/k/staging/pvc-1");
        let same = record.staged_as.clone().unwrap();
        let pod_info: HashMap<String, String> = [
            ("path".to_string(), "/img".to_string()),
            (
                "csi.storage.k8s.io/pod.name".to_string(),
                "web-0".to_string(),
            ),
        ]
        .into();
        assert_eq!(disagreement(&record, staging, &same, &pod_info), None);
        assert_eq!(disagreement(&record, staging, &same, &HashMap::new()), None);

        let why = disagreement(&record, Path::new("/k/other"), &same, &pod_info).unwrap();
        assert!(why.contains("/k/staging/pvc-1"), "{why}");
        let block = StagedAs {
            fs_type: None,
            mount_flags: Vec::new(),
            access_mode: same.access_mode.clone(),
        };
        let why = disagreement(&record, staging, &block, &pod_info).unwrap();
        assert!(why.contains("ext4") && why.contains("block"), "{why}");
        let flags = StagedAs {
            mount_flags: vec!["secret-flag".into()],
            ..same.clone()
        };
        let why = disagreement(&record, staging, &flags, &pod_info).unwrap();
        assert!(
            !why.contains("secret-flag"),
            "mount flags are not shown: {why}"
        );
        let moved = [("path".to_string(), "/other".to_string())].into();
        let why = disagreement(&record, staging, &same, &moved).unwrap();
        assert!(why.contains("/other"), "{why}");
        let old = VolumeRecord {
            staged_as: None,
            ..record.clone()
        };
        assert!(disagreement(&old, staging, &same, &pod_info).is_some());
        assert_eq!(disagreement(&old, staging, &block, &pod_info), None);
    }
}
