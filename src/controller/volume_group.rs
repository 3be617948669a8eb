//! The VolumeGroup API's Controller service (`volumegroup.Controller`),
//! forwarded. A vendor without it answers UNIMPLEMENTED, which goes back as
//! it came.

use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::forward::Forwarder;
use crate::proto::volumegroup as vg;
use vg::controller_client::ControllerClient;

#[derive(Debug, Clone)]
pub struct VolumeGroupProxy(pub Forwarder<ControllerClient<Channel>>);

#[tonic::async_trait]
impl vg::controller_server::Controller for VolumeGroupProxy {
    async fn create_volume_group(
        &self,
        request: Request<vg::CreateVolumeGroupRequest>,
    ) -> Result<Response<vg::CreateVolumeGroupResponse>, Status> {
        self.0
            .forward("CreateVolumeGroup", request, |mut c, r| async move {
                c.create_volume_group(r).await
            })
            .await
    }

    async fn modify_volume_group_membership(
        &self,
        request: Request<vg::ModifyVolumeGroupMembershipRequest>,
    ) -> Result<Response<vg::ModifyVolumeGroupMembershipResponse>, Status> {
        self.0
            .forward(
                "ModifyVolumeGroupMembership",
                request,
                |mut c, r| async move { c.modify_volume_group_membership(r).await },
            )
            .await
    }

    async fn delete_volume_group(
        &self,
        request: Request<vg::DeleteVolumeGroupRequest>,
    ) -> Result<Response<vg::DeleteVolumeGroupResponse>, Status> {
        self.0
            .forward("DeleteVolumeGroup", request, |mut c, r| async move {
                c.delete_volume_group(r).await
            })
            .await
    }

    async fn list_volume_groups(
        &self,
        request: Request<vg::ListVolumeGroupsRequest>,
    ) -> Result<Response<vg::ListVolumeGroupsResponse>, Status> {
        self.0
            .forward("ListVolumeGroups", request, |mut c, r| async move {
                c.list_volume_groups(r).await
            })
            .await
    }

    async fn controller_get_volume_group(
        &self,
        request: Request<vg::ControllerGetVolumeGroupRequest>,
    ) -> Result<Response<vg::ControllerGetVolumeGroupResponse>, Status> {
        self.0
            .forward("ControllerGetVolumeGroup", request, |mut c, r| async move {
                c.controller_get_volume_group(r).await
            })
            .await
    }
}
