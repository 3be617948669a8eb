//! CSI Identity, answered by the vendor's CSI controller: its plugin
//! capabilities (those a CSI v1.11 client can decode, unless configured
//! otherwise), its readiness; the name is ours (the node's by default).

use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::capabilities::CapabilityFilter;
use super::forward::Forwarder;
use crate::proto::csi::v1 as csi;
use csi::identity_client::IdentityClient;

#[derive(Debug, Clone)]
pub struct IdentityProxy {
    vendor: Forwarder<IdentityClient<Channel>>,
    driver_name: String,
    capabilities: CapabilityFilter,
}

impl IdentityProxy {
    pub fn new(
        vendor: Forwarder<IdentityClient<Channel>>,
        driver_name: String,
        capabilities: CapabilityFilter,
    ) -> Self {
        IdentityProxy {
            vendor,
            driver_name,
            capabilities,
        }
    }
}

#[tonic::async_trait]
impl csi::identity_server::Identity for IdentityProxy {
    async fn get_plugin_info(
        &self,
        request: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        let mut response = self
            .vendor
            .forward("GetPluginInfo", request, |mut c, r| async move {
                c.get_plugin_info(r).await
            })
            .await?;
        // The name must match the CSIDriver object and the node's, which the
        // vendor's own build does not know.
        response.get_mut().name.clone_from(&self.driver_name);
        Ok(response)
    }

    async fn get_plugin_capabilities(
        &self,
        request: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        let method = "GetPluginCapabilities";
        let response = self
            .vendor
            .forward(method, request, |mut c, r| async move {
                c.get_plugin_capabilities(r).await
            })
            .await?;
        Ok(self.capabilities.apply(method, response))
    }

    /// Ready exactly when the vendor says so: the proxy has no state of its
    /// own that could be unready, and a vendor it cannot reach is an error
    /// (UNAVAILABLE), as the spec asks of a plugin that cannot tell.
    async fn probe(
        &self,
        request: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        self.vendor
            .forward("Probe", request, |mut c, r| async move { c.probe(r).await })
            .await
    }
}
