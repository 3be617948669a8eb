//! The CSI Identity service of the node plugin.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::fleet::Fleet;
use crate::proto::csi::v1 as csi;

#[derive(Debug, Clone)]
pub struct IdentityService {
    driver_name: String,
    fleet: Arc<Fleet>,
    probe_timeout: std::time::Duration,
}

impl IdentityService {
    pub fn new(driver_name: String, fleet: Arc<Fleet>, probe_timeout: std::time::Duration) -> Self {
        IdentityService {
            driver_name,
            fleet,
            probe_timeout,
        }
    }
}

#[tonic::async_trait]
impl csi::identity_server::Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _request: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.driver_name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        use csi::plugin_capability::service::Type;
        // CSI asks every instance of a plugin for the capabilities of the
        // whole, whatever it serves itself: the controller proxy always runs
        // beside the nodes and serves the Controller and GroupController
        // (what each offers is the vendor's, in its own GetCapabilities),
        // and volumes are reachable only from nodes whose DPU serves them.
        let capabilities = [
            Type::ControllerService,
            Type::GroupControllerService,
            Type::VolumeAccessibilityConstraints,
        ]
        .into_iter()
        .map(|t| csi::PluginCapability {
            r#type: Some(csi::plugin_capability::Type::Service(
                csi::plugin_capability::Service { r#type: t as i32 },
            )),
        })
        .collect();
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(
        &self,
        request: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        let deadline = super::service::call_deadline(&request, self.probe_timeout);
        // Not ready (rather than an error) while no DPU serves: the node
        // itself is healthy and must not be restarted for it. One DPU
        // serving is ready: its volumes, and new ones, can be staged.
        let ready = self.fleet.probe(deadline).await;
        crate::metrics::set_dependency_ready("dpu", ready);
        Ok(Response::new(csi::ProbeResponse { ready: Some(ready) }))
    }
}
