//! CSI GroupController, forwarded (capabilities less what a CSI v1.11 client
//! cannot decode, unless configured otherwise). A vendor without it answers
//! UNIMPLEMENTED, which goes back as it came.

use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::capabilities::CapabilityFilter;
use super::forward::Forwarder;
use crate::proto::csi::v1 as csi;
use csi::group_controller_client::GroupControllerClient;

#[derive(Debug, Clone)]
pub struct GroupControllerProxy(
    pub Forwarder<GroupControllerClient<Channel>>,
    pub CapabilityFilter,
);

#[tonic::async_trait]
impl csi::group_controller_server::GroupController for GroupControllerProxy {
    async fn group_controller_get_capabilities(
        &self,
        request: Request<csi::GroupControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::GroupControllerGetCapabilitiesResponse>, Status> {
        let method = "GroupControllerGetCapabilities";
        let response = self
            .0
            .forward(method, request, |mut c, r| async move {
                c.group_controller_get_capabilities(r).await
            })
            .await?;
        Ok(self.1.apply(method, response))
    }

    async fn create_volume_group_snapshot(
        &self,
        request: Request<csi::CreateVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::CreateVolumeGroupSnapshotResponse>, Status> {
        self.0
            .forward(
                "CreateVolumeGroupSnapshot",
                request,
                |mut c, r| async move { c.create_volume_group_snapshot(r).await },
            )
            .await
    }

    async fn delete_volume_group_snapshot(
        &self,
        request: Request<csi::DeleteVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::DeleteVolumeGroupSnapshotResponse>, Status> {
        self.0
            .forward(
                "DeleteVolumeGroupSnapshot",
                request,
                |mut c, r| async move { c.delete_volume_group_snapshot(r).await },
            )
            .await
    }

    async fn get_volume_group_snapshot(
        &self,
        request: Request<csi::GetVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::GetVolumeGroupSnapshotResponse>, Status> {
        self.0
            .forward("GetVolumeGroupSnapshot", request, |mut c, r| async move {
                c.get_volume_group_snapshot(r).await
            })
            .await
    }
}
