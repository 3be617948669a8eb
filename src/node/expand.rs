//! NodeExpandVolume: the filesystem grown online to its device's new size,
//! or a block volume's size reported.

use tonic::{Request, Response, Status};

use super::format::FsType;
use super::request::require;
use super::service::NodeService;
use super::{grow, mountinfo};
use crate::csi_limits::required_id;
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
        let device = self.wait_for_device(&record.locator, deadline).await?;
        let required = match &req.capacity_range {
            None => 0,
            Some(range) => u64::try_from(range.required_bytes).map_err(|_| {
                Status::invalid_argument(format!(
                    "capacity_range.required_bytes {} is negative",
                    range.required_bytes
                ))
            })?,
        };
        if device.size_bytes < required {
            return Err(Status::failed_precondition(format!(
                "the device is {} bytes, less than the {required} asked: expand the volume on the controller first",
                device.size_bytes
            )));
        }
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
}
