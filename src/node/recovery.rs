//! What keeps a staged volume trustworthy when the host changed under it.
//!
//! The volume's device is only ever the one its identity names (NVMe:
//! function, NSID and namespace UUID; virtio-blk: function and serial); a
//! device found again after a reconnect may have a new kernel name
//! (`nvme0n1` back as `nvme1n1`). A staging mount must sit on that device.
//!
//! One that does not is stale: SNAP restarted (it comes back empty, and the
//! host loses every function it exposed), the function was unplugged, or the
//! volume was attached again elsewhere. Its filesystem is on a device that is
//! gone or is not the volume's, and kubelet cannot get it out: it sends no
//! NodeUnstage after a stage's final error, and no NodeStage for a volume it
//! believes staged. So stage and publish repair it when nothing else mounts
//! that filesystem: unmount it (a device the kernel removed is unmounted
//! lazily if it must be: `mount::unmount`), then stage as usual (attach
//! again, find the device, preen and mount). When something still mounts it
//! (a pod's bind mount keeps the old filesystem alive, and mounting the same
//! data again through the new device would corrupt it), or the unmount
//! fails, they answer ABORTED saying why ([`NotYet`]): kubelet keeps the
//! volume uncertain, retries, and unstages it when its pods go.
//!
//! A device that goes away in the middle of a stage, after it was found,
//! fails whatever the stage does next; the stage answers UNAVAILABLE then,
//! naming the loss, and the retry attaches the volume again.

use std::path::{Path, PathBuf};

use tokio::time::Instant;
use tonic::Status;

use super::error::NodeError;
use super::mount;
use super::mountinfo::{self, MountEntry};
use super::service::NodeService;
use crate::dpu::HostLocator;
use crate::host::BlockDevice;

impl NodeService {
    /// Whether the filesystem mounted at `staging` (`mounted`) sits on the
    /// volume's device (`expected`, if the host shows it). If not, the stale
    /// mount is taken away when nothing else mounts its filesystem, and the
    /// caller stages anew (`Ok(false)`); otherwise [`NotYet`].
    pub(super) async fn clear_stale_staging(
        &self,
        volume_id: &str,
        staging: &Path,
        mounted: &MountEntry,
        (locator, expected): (&HostLocator, Option<&BlockDevice>),
        deadline: Instant,
    ) -> Result<bool, Status> {
        if expected.is_some_and(|d| (d.major, d.minor) == (mounted.major, mounted.minor)) {
            return Ok(true);
        }
        let stale = self.describe_stale(staging, mounted, locator, expected);
        let elsewhere = other_mounts(mounted, staging)?;
        if !elsewhere.is_empty() {
            return Err(NotYet::StaleStillMounted {
                volume_id: volume_id.to_string(),
                stale,
                elsewhere: elsewhere.join(", "),
            }
            .into());
        }
        tracing::warn!(%volume_id, "unmounting a stale staging mount to stage the volume again: {stale}");
        loop {
            match mount::unmount(staging, deadline).await {
                Ok(true) => {}
                Ok(false) => break,
                Err(error) => {
                    return Err(NotYet::StaleUnmountFailed {
                        volume_id: volume_id.to_string(),
                        stale,
                        error,
                    }
                    .into());
                }
            }
        }
        crate::metrics::forget_volume_condition(volume_id);
        Ok(false)
    }

    /// "the staging mount at P is on device M:m, which ...; the volume's
    /// device (identity) is ...".
    fn describe_stale(
        &self,
        staging: &Path,
        mounted: &MountEntry,
        locator: &HostLocator,
        expected: Option<&BlockDevice>,
    ) -> String {
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
        format!(
            "the staging mount at {} is on device {major}:{minor}, {now}; the volume's device \
             ({locator}) {volume}",
            staging.display(),
        )
    }
}

/// Where else the filesystem mounted at `staging` (`entry`) is mounted: a
/// pod's bind mount, anything else that keeps it alive.
pub(super) fn other_mounts(entry: &MountEntry, staging: &Path) -> Result<Vec<String>, NodeError> {
    Ok(mountinfo::read()?
        .iter()
        .filter(|m| (m.major, m.minor) == (entry.major, entry.minor))
        .filter(|m| m.mount_point != staging)
        .map(|m| m.mount_point.display().to_string())
        .collect())
}

/// What a stage or a publish refuses to do with a staged volume, each
/// with the state that stops it; the CO's retry cannot change that state,
/// so each is FAILED_PRECONDITION.
#[derive(Debug, thiserror::Error)]
pub(super) enum Refusal {
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
    #[error(
        "volume {volume_id}'s device is gone from the host (SNAP restarted, or its function \
         was unplugged), and the volume is encrypted: its key comes only with \
         NodeStageVolume, so a publish cannot attach it again. Once no pod uses the volume \
         here, kubelet unstages it, and the next pod's stage attaches it"
    )]
    KeyOnlyAtStage { volume_id: String },
}

impl From<Refusal> for Status {
    fn from(refusal: Refusal) -> Status {
        Status::failed_precondition(refusal.to_string())
    }
}

/// Why a stage or a publish cannot go on yet, for a reason that clears
/// without a human. Never a code kubelet takes as final: after a final one
/// it would not unstage the volume when its pods go, and for a volume it
/// believes staged it sends no stage again.
#[derive(Debug, thiserror::Error)]
pub(super) enum NotYet {
    /// ABORTED (CSI's "operation pending for volume"): what still mounts
    /// the filesystem goes when kubelet unpublishes it.
    #[error(
        "volume {volume_id}: {stale}. Its filesystem is still mounted at {elsewhere}: the \
         staging mount is repaired once those are unmounted (the pods using the volume gone)"
    )]
    StaleStillMounted {
        volume_id: String,
        stale: String,
        elsewhere: String,
    },
    /// ABORTED: a holder of the mount, or the kernel, stopped the unmount;
    /// the retry tries again.
    #[error("volume {volume_id}: {stale}, and it cannot be unmounted: {error}")]
    StaleUnmountFailed {
        volume_id: String,
        stale: String,
        error: NodeError,
    },
    /// UNAVAILABLE, as for SNAP away: the retry attaches the volume again.
    #[error(
        "volume {volume_id}: its device {device} went away during the stage (SNAP restarted, \
         or its function was unplugged): {error}. The retry attaches it again"
    )]
    DeviceLost {
        volume_id: String,
        device: String,
        error: String,
    },
}

impl From<NotYet> for Status {
    fn from(not_yet: NotYet) -> Status {
        let message = not_yet.to_string();
        match not_yet {
            NotYet::StaleStillMounted { .. } | NotYet::StaleUnmountFailed { .. } => {
                Status::aborted(message)
            }
            NotYet::DeviceLost { .. } => Status::unavailable(message),
        }
    }
}
