//! CSI Identity of the controller.
//!
//! Probe is ready when every configured backend can serve: the AIO pool
//! directory is writable, the NVMe-oF target answers and has the lvstore.
//! A backend that cannot is "not ready" with the reason in our log, not an
//! error, so the CO waits rather than restarts us. Volume expansion is
//! ONLINE on both backends (see [`super::controller`]).

use std::collections::HashMap;
use std::time::Duration;

use futures::future::join_all;
use snap_csi::deadline::call_deadline;
use snap_csi::proto::csi::v1 as csi;
use tonic::{Request, Response, Status};

use super::CsiController;
use crate::service::PLUGIN_NAME;
use csi::plugin_capability::{Service, Type, VolumeExpansion, service, volume_expansion};

/// A Probe answers within this even when its caller sets no deadline.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

#[tonic::async_trait]
impl csi::identity_server::Identity for CsiController {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        let backends: Vec<&str> = self.backends().map(|b| b.kind().as_str()).collect();
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: PLUGIN_NAME.into(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: HashMap::from([
                ("backends".to_string(), backends.join(",")),
                (
                    "default-backend".to_string(),
                    self.inner.default_backend.as_str().to_string(),
                ),
            ]),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        let mut capabilities = vec![
            csi::PluginCapability {
                r#type: Some(Type::Service(Service {
                    r#type: service::Type::ControllerService as i32,
                })),
            },
            csi::PluginCapability {
                r#type: Some(Type::Service(Service {
                    r#type: service::Type::GroupControllerService as i32,
                })),
            },
            csi::PluginCapability {
                r#type: Some(Type::VolumeExpansion(VolumeExpansion {
                    r#type: volume_expansion::Type::Online as i32,
                })),
            },
        ];
        // A DPU-local backend's volumes carry topology, which the CO then
        // keeps to: its pods go only to the host with that DPU.
        if self.backends().any(|b| b.topology().is_some()) {
            capabilities.push(csi::PluginCapability {
                r#type: Some(Type::Service(Service {
                    r#type: service::Type::VolumeAccessibilityConstraints as i32,
                })),
            });
        }
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(
        &self,
        request: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        let deadline = call_deadline(&request, PROBE_TIMEOUT);
        let results = join_all(
            self.backends()
                .map(|b| async move { (b.kind(), b.probe(deadline).await) }),
        )
        .await;
        let mut ready = true;
        for (kind, result) in results {
            if let Err(why) = result {
                tracing::info!(backend = kind.as_str(), "probe: not ready: {why}");
                ready = false;
            }
        }
        Ok(Response::new(csi::ProbeResponse { ready: Some(ready) }))
    }
}
