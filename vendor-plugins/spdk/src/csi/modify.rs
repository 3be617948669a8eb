//! ControllerModifyVolume (MODIFY_VOLUME): a volume's QoS limits, from a
//! Kubernetes VolumeAttributesClass's parameters ([`crate::qos`]).
//!
//! The request is checked whole before anything is looked up: a volume id,
//! at least one mutable parameter, every one a QoS key with a value SPDK
//! takes as it is (INVALID_ARGUMENT naming the key otherwise, nothing
//! changed). Then the volume must exist and be complete (NOT_FOUND: an
//! interrupted CreateVolume is not a volume yet), and its backend sets the
//! limits given, keeping the others (CSI: nothing changes for a key that is
//! absent). Setting the same limits again changes nothing, so a retry is
//! safe.
//!
//! When they take effect: NVMe-oF at once, on the target's lvol, attached
//! or not ([`super::nvmf`]); AIO within the plugin's follow period on an
//! attached volume, else at its next attach ([`super::aio`]).

use snap_csi::proto::csi::v1 as csi;
use tonic::{Request, Response, Status};

use super::CsiController;
use super::controller::volume_key;
use super::ids::parse_volume_id;
use crate::qos::QosLimits;

impl CsiController {
    pub(super) async fn modify_volume(
        &self,
        request: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.mutable_parameters.is_empty() {
            return Err(Status::invalid_argument(
                "mutable_parameters is required: the QoS limits to set",
            ));
        }
        let limits =
            QosLimits::from_mutable(&req.mutable_parameters).map_err(Status::invalid_argument)?;
        let not_found = || Status::not_found(format!("volume {} does not exist", req.volume_id));
        let (kind, slug) = parse_volume_id(&req.volume_id).ok_or_else(not_found)?;
        let backend = self.backend(kind).ok_or_else(not_found)?;
        let _held = self.hold(volume_key(slug))?;
        let found = backend.find(&req.volume_id, deadline).await?;
        if !found.is_some_and(|f| f.complete) {
            return Err(not_found());
        }
        backend
            .set_qos(&req.volume_id, &limits, deadline)
            .await
            .inspect_err(|s| {
                tracing::warn!(volume_id = %req.volume_id, "ControllerModifyVolume: {}", s.message())
            })?;
        tracing::info!(volume_id = %req.volume_id, ?limits, "volume modified");
        Ok(Response::new(csi::ControllerModifyVolumeResponse {}))
    }
}
