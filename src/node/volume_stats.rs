//! NodeGetVolumeStats: usage in bytes and inodes, and the volume's
//! condition, from what [`super::health`] reads of the mount and whether
//! the DPU that serves the volume is up.

use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::request::require;
use super::service::NodeService;
use super::{device, health, mountinfo};
use crate::csi_limits::required_id;
use crate::proto::csi::v1 as csi;

impl NodeService {
    pub(super) async fn node_get_volume_stats_inner(
        &self,
        request: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        let volume_id = required_id(&req.volume_id, "volume_id")?;
        require(&req.volume_path, "volume_path")?;
        let (record, path) = self.staged_at(volume_id, &req.volume_path)?;
        let mut response = volume_stats(&path, deadline).await?;
        if !record.external_attach
            && let Ok(member) = self.fleet().recorded(record.dpu.as_deref())
            && !member.serving(deadline).await
        {
            // The host may still read a page cache; the volume is not served.
            response.volume_condition = Some(csi::VolumeCondition {
                abnormal: true,
                message: format!(
                    "DPU {} that serves this volume is down (its vendor plugin or SNAP does \
                     not answer); the volume's I/O waits for it or fails",
                    member.name()
                ),
            });
        }
        let abnormal = response
            .volume_condition
            .as_ref()
            .is_some_and(|c| c.abnormal);
        crate::metrics::set_volume_condition(volume_id, abnormal);
        Ok(Response::new(response))
    }
}

/// Usage and condition of the volume at `path`, a publish target or the
/// staging path.
async fn volume_stats(
    path: &Path,
    deadline: Instant,
) -> Result<csi::NodeGetVolumeStatsResponse, Status> {
    let Some(entry) = mountinfo::at(path)? else {
        return Ok(abnormal(format!(
            "{} is not mounted: the volume is not published there",
            path.display()
        )));
    };
    // A block volume's device node stays there when its device is gone; a
    // broken filesystem's mount point may answer stat(2) with EIO.
    let block = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device());
    if block {
        return Ok(match device::block_device_size(path) {
            Ok(size) => csi::NodeGetVolumeStatsResponse {
                usage: vec![csi::VolumeUsage {
                    available: 0,
                    total: i64::try_from(size).unwrap_or(i64::MAX),
                    used: 0,
                    unit: csi::volume_usage::Unit::Bytes as i32,
                }],
                volume_condition: Some(healthy()),
            },
            Err(e) => abnormal(format!(
                "the block device {}:{} behind {} is gone: {e}",
                entry.major,
                entry.minor,
                path.display()
            )),
        });
    }
    let fault = health::filesystem_fault(path, &entry, deadline).await?;
    // statfs answers on a filesystem that shut down: usage stays reported.
    let usage = match health::filesystem_usage(path) {
        Ok(usage) => usage,
        Err(e) => {
            return match fault {
                Some(why) => Ok(abnormal(repair_hint(&why))),
                None => Err(e.into()),
            };
        }
    };
    Ok(csi::NodeGetVolumeStatsResponse {
        usage: vec![
            csi::VolumeUsage {
                available: usage.available_bytes,
                total: usage.total_bytes,
                used: usage.used_bytes,
                unit: csi::volume_usage::Unit::Bytes as i32,
            },
            csi::VolumeUsage {
                available: usage.free_inodes,
                total: usage.total_inodes,
                used: usage.used_inodes,
                unit: csi::volume_usage::Unit::Inodes as i32,
            },
        ],
        volume_condition: Some(match fault {
            Some(why) => csi::VolumeCondition {
                abnormal: true,
                message: repair_hint(&why),
            },
            None => healthy(),
        }),
    })
}

/// What a failed filesystem's condition says: why, and what repairs it.
fn repair_hint(why: &str) -> String {
    format!("{why}; to repair it, unpublish it everywhere and stage it again")
}

fn healthy() -> csi::VolumeCondition {
    csi::VolumeCondition {
        abnormal: false,
        message: "volume is mounted and its device is present".into(),
    }
}

fn abnormal(message: String) -> csi::NodeGetVolumeStatsResponse {
    csi::NodeGetVolumeStatsResponse {
        usage: Vec::new(),
        volume_condition: Some(csi::VolumeCondition {
            abnormal: true,
            message,
        }),
    }
}
