//! ControllerModifyVolume (MODIFY_VOLUME): a volume's QoS limits, from a
//! Kubernetes VolumeAttributesClass's parameters ([`crate::qos`]).
//!
//! The volume must exist and be complete, whatever the parameters
//! (NOT_FOUND: an interrupted CreateVolume is not a volume yet). Then the
//! mutable parameters are checked whole, every one a QoS key with a value
//! SPDK takes as it is (INVALID_ARGUMENT naming the key otherwise, nothing
//! changed), and the backend sets the limits given, keeping the others.
//! Setting the same limits again changes nothing, so a retry is safe.
//!
//! No mutable parameters is a success that changes nothing. The spec's
//! words (`csi.proto`, ControllerModifyVolumeRequest.mutable_parameters):
//! "The CO SHOULD specify the intended values of all mutable parameters it
//! intends to modify. SPs MUST NOT modify volumes based on the absence of
//! keys, only keys that are specified should result in modifications to the
//! volume." With no key there is nothing to modify, and that is what
//! csi-sanity expects by default (it sends the empty map unless
//! `--csi.testvolumemutableparameters` is given) and what a
//! VolumeAttributesClass without parameters asks. The same field is marked
//! "REQUIRED", and the spec's general rule ("A `repeated` or `map` field
//! listed as `REQUIRED` MUST contain at least 1 element", a missing one
//! INVALID_ARGUMENT) would refuse the empty map; we take the RPC's own
//! words over the general rule, since a refusal would leave a CO that asks
//! for nothing with an error it cannot fix. An absent volume is NOT_FOUND
//! before the parameters are read: that answer holds whatever is asked
//! (csi-sanity asks with no parameters, or with its test's).
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
        let not_found = || Status::not_found(format!("volume {} does not exist", req.volume_id));
        let (kind, slug) = parse_volume_id(&req.volume_id).ok_or_else(not_found)?;
        let backend = self.backend(kind).ok_or_else(not_found)?;
        let _held = self.hold(volume_key(slug))?;
        let found = backend.find(&req.volume_id, deadline).await?;
        if !found.is_some_and(|f| f.complete) {
            return Err(not_found());
        }
        let limits =
            QosLimits::from_mutable(&req.mutable_parameters).map_err(Status::invalid_argument)?;
        if limits.is_empty() {
            tracing::debug!(volume_id = %req.volume_id, "ControllerModifyVolume: nothing to change");
            return Ok(Response::new(csi::ControllerModifyVolumeResponse {}));
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
