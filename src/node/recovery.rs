//! The host half of a stage, and what keeps a staged volume trustworthy
//! when the host changed under it.
//!
//! - A reboot takes every mount away while the records and SNAP's state
//!   remain, and kubelet then calls NodePublish without NodeStage: a publish
//!   that finds no staging mount stages the volume again from its record,
//!   when the record and the request agree on the staging path, the
//!   capability and the volume context; otherwise it says why not
//!   (FAILED_PRECONDITION) rather than guess. A block volume has no staging
//!   mount to tell a reboot by, so its publish always checks the record and
//!   redoes the host half (finding the device, its read-only flag); a
//!   record an older node wrote, without the capability, does not stop it.
//! - A device found again after a reconnect may have a new kernel name
//!   (`nvme0n1` back as `nvme1n1`), or its function may carry another volume
//!   now. The volume's device is only ever the one its identity names (NVMe:
//!   function, NSID and namespace UUID; virtio-blk: function and serial), and
//!   a staging mount must sit on that device: stage and publish refuse one
//!   that sits on another (FAILED_PRECONDITION with both devices named).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tokio::time::Instant;
use tonic::Status;

use super::format::{self, FsType};
use super::mountinfo::{self, MountEntry};
use super::records::{StagedAs, VolumeRecord};
use super::service::{NodeService, Usage, is_read_only_mode};
use super::{mount, stats};
use crate::dpu::HostLocator;
use crate::host::BlockDevice;
use crate::proto::csi::v1 as csi;
use crate::proto::csi::v1::volume_capability::access_mode::Mode;

/// How a capability uses the volume, as a record keeps it.
pub(super) fn staged_as(usage: &Usage, mode: Mode) -> StagedAs {
    let (fs_type, mount_flags) = match usage {
        Usage::Block => (None, Vec::new()),
        Usage::Filesystem { fs, flags } => (Some(fs.as_str().to_string()), flags.clone()),
    };
    StagedAs {
        fs_type,
        mount_flags,
        access_mode: mode.as_str_name().to_string(),
    }
}

impl NodeService {
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
        mount::set_block_device_read_only(&device.node, read_only, deadline).await?;

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
                stats::grow_ext4_offline(&device.node, deadline).await?;
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
        let Some(fault) = stats::filesystem_fault(staging, existing, deadline).await? else {
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

    /// What a publish binds onto its target: the staging mount (checked to
    /// sit on the volume's device) or the block device; a volume whose
    /// staging mount is gone (a reboot) is staged again from its record.
    pub(super) async fn staged_for_publish(
        &self,
        volume_id: &str,
        staging: &Path,
        (capability, usage): (&csi::VolumeCapability, &Usage),
        volume_context: &HashMap<String, String>,
        deadline: Instant,
    ) -> Result<PathBuf, Status> {
        let record = self.recorded(volume_id)?;
        if let Usage::Filesystem { .. } = usage
            && let Some(existing) = mountinfo::at(staging)?
        {
            let record = record.ok_or_else(|| Refusal::MountedWithoutRecord {
                volume_id: volume_id.to_string(),
                staging: staging.to_path_buf(),
            })?;
            let device = self.find_device(&record.locator)?;
            self.check_staging_mount(
                volume_id,
                staging,
                &existing,
                &record.locator,
                device.as_ref(),
            )?;
            return Ok(staging.to_path_buf());
        }
        let mode = super::service::access_mode(capability)?;
        let record = record.ok_or_else(|| Refusal::NotStaged {
            volume_id: volume_id.to_string(),
            staging: staging.to_path_buf(),
        })?;
        if let Some(why) = disagreement(&record, staging, &staged_as(usage, mode), volume_context) {
            return Err(Refusal::CannotRestage {
                volume_id: volume_id.to_string(),
                staging: staging.to_path_buf(),
                why,
            }
            .into());
        }
        if let Usage::Filesystem { .. } = usage {
            tracing::info!(%volume_id, staging = %staging.display(), "the staging mount is gone (a reboot?): staging the volume again from its record");
        }
        let device = self
            .stage_on_host(
                volume_id,
                staging,
                &record.locator,
                usage,
                is_read_only_mode(mode),
                deadline,
            )
            .await?;
        Ok(match usage {
            Usage::Block => device.node,
            Usage::Filesystem { .. } => staging.to_path_buf(),
        })
    }

    /// Refuses a staging mount whose filesystem is not on the device the
    /// volume's identity names now (`expected`, if the host shows it).
    fn check_staging_mount(
        &self,
        volume_id: &str,
        staging: &Path,
        mounted: &MountEntry,
        locator: &HostLocator,
        expected: Option<&BlockDevice>,
    ) -> Result<(), Refusal> {
        if expected.is_some_and(|d| (d.major, d.minor) == (mounted.major, mounted.minor)) {
            return Ok(());
        }
        let (major, minor) = (mounted.major, mounted.minor);
        let now = match self.sysfs().describe_device(major, minor) {
            Ok(Some(disk)) => format!("which is now {disk}"),
            Ok(None) => "which the host no longer shows on any emulated function".to_string(),
            Err(e) => format!("which cannot be identified ({e})"),
        };
        let volume = match expected {
            Some(d) => format!("is {} ({}:{})", d.name, d.major, d.minor),
            None => "is not on the host".to_string(),
        };
        Err(Refusal::NotOnTheVolumesDevice {
            volume_id: volume_id.to_string(),
            staging: staging.to_path_buf(),
            mounted: format!("{major}:{minor}, {now}"),
            volume: format!("({}) {volume}", describe_locator(locator)),
        })
    }
}

/// What a stage or a publish refuses to do with a staged volume, each
/// with the state that stops it; the CO's retry cannot change that state,
/// so each is FAILED_PRECONDITION.
#[derive(Debug, thiserror::Error)]
pub(super) enum Refusal {
    #[error(
        "volume {volume_id}: the staging mount at {} is on device {mounted}; \
         the volume's device {volume}. Unstage the volume and stage it again",
        staging.display()
    )]
    NotOnTheVolumesDevice {
        volume_id: String,
        staging: PathBuf,
        /// The mount's device number, and what the host shows it as now.
        mounted: String,
        /// The volume's identity, and where the host shows it.
        volume: String,
    },
    #[error("volume {volume_id} needs a repair: {fault}. It is still published at {published}")]
    RepairWhilePublished {
        volume_id: String,
        fault: String,
        published: String,
    },
    #[error("volume {volume_id} is blank and its access mode is read-only: nothing to mount")]
    BlankReadOnly { volume_id: String },
    #[error(
        "volume {volume_id}: {} is mounted, but this node has no record of staging the volume there",
        staging.display()
    )]
    MountedWithoutRecord { volume_id: String, staging: PathBuf },
    #[error(
        "volume {volume_id} is not staged at {} and this node has no record of it: NodeStageVolume first",
        staging.display()
    )]
    NotStaged { volume_id: String, staging: PathBuf },
    #[error(
        "volume {volume_id} is not staged at {} and cannot be staged again from its record: {why}",
        staging.display()
    )]
    CannotRestage {
        volume_id: String,
        staging: PathBuf,
        why: String,
    },
}

impl From<Refusal> for Status {
    fn from(refusal: Refusal) -> Status {
        Status::failed_precondition(refusal.to_string())
    }
}

fn describe_locator(locator: &HostLocator) -> String {
    match locator {
        HostLocator::Nvme { bdf, nsid, uuid } => format!(
            "function {bdf}, NSID {nsid}, UUID {}",
            uuid.as_deref().unwrap_or("not checked")
        ),
        HostLocator::VirtioBlk { bdf, serial } => format!("function {bdf}, serial {serial:?}"),
    }
}

/// Why a publish may not stage the volume again from its record, if it may
/// not. The volume context agrees when every key both carry has the same
/// value: kubelet adds keys at publish (pod information) that the stage
/// never saw, and CSI makes a publish's context optional.
fn disagreement(
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
