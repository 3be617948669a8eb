//! What keeps a staged volume trustworthy when the host changed under it.
//!
//! A device found again after a reconnect may have a new kernel name
//! (`nvme0n1` back as `nvme1n1`), or its function may carry another volume
//! now. The volume's device is only ever the one its identity names (NVMe:
//! function, NSID and namespace UUID; virtio-blk: function and serial), and
//! a staging mount must sit on that device: stage and publish refuse one
//! that sits on another (FAILED_PRECONDITION with both devices named).

use std::path::{Path, PathBuf};

use tonic::Status;

use super::mountinfo::MountEntry;
use super::service::NodeService;
use crate::dpu::HostLocator;
use crate::host::BlockDevice;

impl NodeService {
    /// Refuses a staging mount whose filesystem is not on the device the
    /// volume's identity names now (`expected`, if the host shows it).
    pub(super) fn check_staging_mount(
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
