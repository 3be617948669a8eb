//! NodeExpandVolume: the filesystem grown online to its device's new size,
//! or a block volume's size reported.
//!
//! kubelet asks only once the controller grew the volume, but the host may
//! see the new size later: the vendor's plugin grows its bdev (an SPDK AIO
//! bdev on `bdev_aio_rescan`), SNAP passes the new capacity to the host's
//! driver, and the kernel updates the disk. The node waits for that inside
//! the caller's deadline rather than fail a resize that is on its way.
//!
//! Except for an encrypted volume: SNAP exposes SPDK's crypto vbdev over
//! the plugin's bdev, and the crypto vbdev takes its base's size when it is
//! made and ignores the base's resize events (SPDK v24.09's
//! `vbdev_crypto_base_bdev_event_cb` handles only removal), so its device
//! cannot grow while staged. Smaller than asked, it is refused at once with
//! FAILED_PRECONDITION (CSI's "volume in use"), telling how to get the size:
//! its next stage makes the vbdev over the grown base, and the stage grows
//! the filesystem (`stage.rs`). With the size already there (after that
//! stage) it is expanded as any other.

use std::path::Path;

use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::format::FsType;
use super::request::require;
use super::service::NodeService;
use super::{grow, mountinfo};
use crate::csi_limits::required_id;
use crate::dpu::HostLocator;
use crate::host::BlockDevice;
use crate::proto::csi::v1 as csi;

impl NodeService {
    pub(super) async fn node_expand_volume_inner(
        &self,
        request: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        let volume_id = required_id(&req.volume_id, "volume_id")?;
        require(&req.volume_path, "volume_path")?;
        let _held = self.hold(volume_id)?;
        let (record, path) = self.staged_at(volume_id, &req.volume_path)?;
        let required = match &req.capacity_range {
            None => 0,
            Some(range) => u64::try_from(range.required_bytes).map_err(|_| {
                Status::invalid_argument(format!(
                    "capacity_range.required_bytes {} is negative",
                    range.required_bytes
                ))
            })?,
        };
        if record.locator.tag().is_some() {
            return Ok(Response::new(super::shared_fs::expanded(&path)?));
        }
        let device = self.wait_for_device(&record.locator, deadline).await?;
        let device = if device.size_bytes >= required {
            device
        } else if crate::dpu::crypto::asked(&record.volume_context).is_some() {
            return Err(grows_at_next_stage(volume_id, &device, required));
        } else {
            let on = (&record.locator, device);
            self.grown(volume_id, on, (&path, required), deadline)
                .await?
        };
        if path.is_dir() {
            let entry = mountinfo::at(&path)?
                .ok_or_else(|| Status::not_found(format!("{} is not mounted", path.display())))?;
            let fs = FsType::from_csi(&entry.fs_type).map_err(|e| {
                Status::failed_precondition(format!("cannot grow this filesystem: {e}"))
            })?;
            grow::expand_filesystem(&device.node, &path, fs, deadline).await?;
        }
        Ok(Response::new(csi::NodeExpandVolumeResponse {
            capacity_bytes: i64::try_from(device.size_bytes).unwrap_or(i64::MAX),
        }))
    }

    /// The volume's device once the host shows it at `required` bytes or
    /// more, waited for until `deadline` (`device` is what it shows now).
    async fn grown(
        &self,
        volume_id: &str,
        (locator, device): (&HostLocator, BlockDevice),
        (path, required): (&Path, u64),
        deadline: Instant,
    ) -> Result<BlockDevice, Status> {
        tracing::info!(%volume_id, size = device.size_bytes, required, "waiting for the host to see the device grow");
        crate::failpoint::step_on("expand:wait-size", path);
        let last = match self
            .poll_device(locator, deadline, |d| d.size_bytes >= required)
            .await?
        {
            Ok(grown) => return Ok(grown),
            Err(last) => last.unwrap_or(device),
        };
        Err(Status::failed_precondition(format!(
            "volume {volume_id}: the device {} is {} bytes, less than the {required} asked, and \
             the host did not see it grow in time. The controller grew the volume; its new size \
             has not reached the host: the vendor plugin must grow its bdev on the DPU (an SPDK \
             AIO bdev needs bdev_aio_rescan) for SNAP to pass the new capacity on. A backend \
             that cannot grow online grows the volume at its next stage: restart the pods using \
             it",
            last.name, last.size_bytes
        )))
    }
}

/// Why an encrypted volume's device smaller than `required` will not grow
/// while staged, and what grows it: waiting would only use up kubelet's
/// deadline.
fn grows_at_next_stage(volume_id: &str, device: &BlockDevice, required: u64) -> Status {
    Status::failed_precondition(format!(
        "volume {volume_id} is encrypted: its device {} is {} bytes, less than the {required} \
         asked, and cannot grow while the volume is in use: the DPU exposes it through SPDK's \
         crypto bdev, which keeps its size when the volume beneath it grows. It grows at its \
         next stage: stop every pod using it on this node (delete or reschedule them; a \
         container restart is not enough); when a pod uses it again, the device has the new \
         size and the filesystem is grown to it",
        device.name, device.size_bytes
    ))
}
