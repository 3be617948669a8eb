//! What each forwarded request is about, for its log line.
//!
//! Only fields that name an object (a volume, snapshot or group, by the CO's
//! name or the plugin's id) are ever taken from a request: never secrets,
//! parameters or contexts, which may carry credentials.

use crate::proto::csi::v1 as csi;
use crate::proto::volumegroup as vg;

/// The request field naming the object a call is about, and its value.
pub trait Subject {
    fn subject(&self) -> Option<(&'static str, &str)>;
}

macro_rules! subject {
    ($($request:ty => $field:ident),* $(,)?) => {$(
        impl Subject for $request {
            fn subject(&self) -> Option<(&'static str, &str)> {
                Some((stringify!($field), &self.$field))
            }
        }
    )*};
}

macro_rules! no_subject {
    ($($request:ty),* $(,)?) => {$(
        impl Subject for $request {
            fn subject(&self) -> Option<(&'static str, &str)> {
                None
            }
        }
    )*};
}

subject! {
    csi::CreateVolumeRequest => name,
    csi::DeleteVolumeRequest => volume_id,
    csi::ControllerPublishVolumeRequest => volume_id,
    csi::ControllerUnpublishVolumeRequest => volume_id,
    csi::ValidateVolumeCapabilitiesRequest => volume_id,
    csi::ControllerGetVolumeRequest => volume_id,
    csi::ControllerModifyVolumeRequest => volume_id,
    csi::ControllerExpandVolumeRequest => volume_id,
    csi::CreateSnapshotRequest => name,
    csi::DeleteSnapshotRequest => snapshot_id,
    csi::GetSnapshotRequest => snapshot_id,
    csi::CreateVolumeGroupSnapshotRequest => name,
    csi::DeleteVolumeGroupSnapshotRequest => group_snapshot_id,
    csi::GetVolumeGroupSnapshotRequest => group_snapshot_id,
    vg::CreateVolumeGroupRequest => name,
    vg::DeleteVolumeGroupRequest => volume_group_id,
    vg::ModifyVolumeGroupMembershipRequest => volume_group_id,
    vg::ControllerGetVolumeGroupRequest => volume_group_id,
}

no_subject! {
    csi::GetPluginInfoRequest,
    csi::GetPluginCapabilitiesRequest,
    csi::ProbeRequest,
    csi::ListVolumesRequest,
    csi::GetCapacityRequest,
    csi::ControllerGetCapabilitiesRequest,
    csi::ListSnapshotsRequest,
    csi::GroupControllerGetCapabilitiesRequest,
    vg::ListVolumeGroupsRequest,
}
