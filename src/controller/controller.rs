//! CSI Controller, forwarded method for method. Capabilities are the
//! vendor's (less what a CSI v1.11 client cannot decode, unless configured
//! otherwise), so the CO calls only what the vendor implements.

use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::capabilities::CapabilityFilter;
use super::forward::Forwarder;
use crate::proto::csi::v1 as csi;
use csi::controller_client::ControllerClient;

#[derive(Debug, Clone)]
pub struct ControllerProxy(
    pub Forwarder<ControllerClient<Channel>>,
    pub CapabilityFilter,
);

#[tonic::async_trait]
impl csi::controller_server::Controller for ControllerProxy {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        self.0
            .forward("CreateVolume", request, |mut c, r| async move {
                c.create_volume(r).await
            })
            .await
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        self.0
            .forward("DeleteVolume", request, |mut c, r| async move {
                c.delete_volume(r).await
            })
            .await
    }

    async fn controller_publish_volume(
        &self,
        request: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        self.0
            .forward("ControllerPublishVolume", request, |mut c, r| async move {
                c.controller_publish_volume(r).await
            })
            .await
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        self.0
            .forward(
                "ControllerUnpublishVolume",
                request,
                |mut c, r| async move { c.controller_unpublish_volume(r).await },
            )
            .await
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        self.0
            .forward(
                "ValidateVolumeCapabilities",
                request,
                |mut c, r| async move { c.validate_volume_capabilities(r).await },
            )
            .await
    }

    async fn list_volumes(
        &self,
        request: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        self.0
            .forward("ListVolumes", request, |mut c, r| async move {
                c.list_volumes(r).await
            })
            .await
    }

    async fn get_capacity(
        &self,
        request: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        self.0
            .forward("GetCapacity", request, |mut c, r| async move {
                c.get_capacity(r).await
            })
            .await
    }

    async fn controller_get_capabilities(
        &self,
        request: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        let method = "ControllerGetCapabilities";
        let response = self
            .0
            .forward(method, request, |mut c, r| async move {
                c.controller_get_capabilities(r).await
            })
            .await?;
        Ok(self.1.apply(method, response))
    }

    async fn create_snapshot(
        &self,
        request: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        self.0
            .forward("CreateSnapshot", request, |mut c, r| async move {
                c.create_snapshot(r).await
            })
            .await
    }

    async fn delete_snapshot(
        &self,
        request: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        self.0
            .forward("DeleteSnapshot", request, |mut c, r| async move {
                c.delete_snapshot(r).await
            })
            .await
    }

    async fn list_snapshots(
        &self,
        request: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        self.0
            .forward("ListSnapshots", request, |mut c, r| async move {
                c.list_snapshots(r).await
            })
            .await
    }

    async fn get_snapshot(
        &self,
        request: Request<csi::GetSnapshotRequest>,
    ) -> Result<Response<csi::GetSnapshotResponse>, Status> {
        self.0
            .forward("GetSnapshot", request, |mut c, r| async move {
                c.get_snapshot(r).await
            })
            .await
    }

    async fn controller_expand_volume(
        &self,
        request: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        self.0
            .forward("ControllerExpandVolume", request, |mut c, r| async move {
                c.controller_expand_volume(r).await
            })
            .await
    }

    async fn controller_get_volume(
        &self,
        request: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        self.0
            .forward("ControllerGetVolume", request, |mut c, r| async move {
                c.controller_get_volume(r).await
            })
            .await
    }

    async fn controller_modify_volume(
        &self,
        request: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        self.0
            .forward("ControllerModifyVolume", request, |mut c, r| async move {
                c.controller_modify_volume(r).await
            })
            .await
    }
}
