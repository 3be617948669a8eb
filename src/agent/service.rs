//! The `snapcsi.dpu.v1.DpuAgent` service: each call read from the wire
//! ([`crate::dpu::wire`]), run by the DPU attach layer under the node's
//! deadline, and answered with the layer's status.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::deadline::{call_deadline, relayed};
use crate::dpu::{AttachRequest, DpuAttach};
use crate::guard::{Held, StillBusy, VolumeGuard};
use crate::proto::snapcsi::dpu::v1 as api;

#[derive(Debug, Clone)]
pub struct AgentService {
    dpu: Arc<dyn DpuAttach>,
    guard: VolumeGuard,
    call_timeout: Duration,
}

impl AgentService {
    pub fn new(dpu: Arc<dyn DpuAttach>, call_timeout: Duration) -> Self {
        AgentService {
            dpu,
            guard: VolumeGuard::default(),
            call_timeout,
        }
    }

    /// The deadline of the DPU's work on a call: the node's less a reserve
    /// for our answer, less another for the plugin's or SNAP's, so that what
    /// they said (or that they said nothing) still reaches the node in time
    /// ([`crate::deadline`]).
    fn deadline<T>(&self, request: &Request<T>) -> Instant {
        relayed(call_deadline(request, self.call_timeout))
    }

    /// One call per volume at a time. A second one is a retry of a call the
    /// link lost while it still runs here: it waits for that one to end.
    async fn hold(&self, volume_id: &str, deadline: Instant) -> Result<Held, StillBusy> {
        self.guard.hold_until(volume_id, deadline).await
    }

    async fn attach_inner(
        &self,
        request: Request<api::AttachRequest>,
    ) -> Result<Response<api::AttachResponse>, Status> {
        let deadline = self.deadline(&request);
        let attach = AttachRequest::try_from(request.into_inner())?;
        let _held = self.hold(&attach.volume_id, deadline).await?;
        let attachment = self.dpu.attach(&attach, deadline).await?;
        Ok(Response::new(attachment.into()))
    }

    async fn detach_inner(
        &self,
        request: Request<api::DetachRequest>,
    ) -> Result<Response<api::DetachResponse>, Status> {
        let deadline = self.deadline(&request);
        let detach = request.into_inner();
        let _held = self.hold(&detach.volume_id, deadline).await?;
        let device_name = Some(detach.device_name.as_str()).filter(|d| !d.is_empty());
        self.dpu
            .detach(&detach.volume_id, device_name, deadline)
            .await?;
        Ok(Response::new(api::DetachResponse {}))
    }
}

#[tonic::async_trait]
impl api::dpu_agent_server::DpuAgent for AgentService {
    async fn attach(
        &self,
        request: Request<api::AttachRequest>,
    ) -> Result<Response<api::AttachResponse>, Status> {
        let span = tracing::info_span!("Attach", volume_id = %request.get_ref().volume_id);
        self.attach_inner(request).instrument(span).await
    }

    async fn detach(
        &self,
        request: Request<api::DetachRequest>,
    ) -> Result<Response<api::DetachResponse>, Status> {
        let span = tracing::info_span!("Detach", volume_id = %request.get_ref().volume_id);
        self.detach_inner(request).instrument(span).await
    }

    async fn probe(
        &self,
        request: Request<api::ProbeRequest>,
    ) -> Result<Response<api::ProbeResponse>, Status> {
        let deadline = self.deadline(&request);
        let ready = self.dpu.probe(deadline).await?;
        crate::metrics::set_dependency_ready("dpu", ready);
        Ok(Response::new(api::ProbeResponse {
            ready,
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
        }))
    }

    async fn get_inventory(
        &self,
        request: Request<api::GetInventoryRequest>,
    ) -> Result<Response<api::GetInventoryResponse>, Status> {
        let deadline = self.deadline(&request);
        let inventory = self.dpu.inventory(deadline).await?;
        Ok(Response::new(inventory.into()))
    }

    async fn get_io_stats(
        &self,
        request: Request<api::GetIoStatsRequest>,
    ) -> Result<Response<api::GetIoStatsResponse>, Status> {
        let deadline = self.deadline(&request);
        let stats = self.dpu.io_stats(deadline).await?;
        Ok(Response::new(stats.into()))
    }
}
