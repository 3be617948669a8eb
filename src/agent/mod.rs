//! `snap-csi dpu-agent`: the DPU attach layer on the BlueField, served to
//! the one host it belongs to (split mode).
//!
//! On a real BlueField host the vendor plugin and SNAP run on the DPU's own
//! Arm OS, out of the host's reach. The agent runs beside them and serves
//! [`crate::dpu::colocated::Colocated`] (the same code the node runs in
//! co-located mode) as `snapcsi.dpu.v1` (`proto/snapcsi/dpu/v1/`). It keeps
//! nothing of its own: SNAP's lists and the plugin hold the truth, so a
//! restarted agent carries on where the last one stopped.
//!
//! - `config`: settings (defaults, config file, env, flags).
//! - `service`: the gRPC service over a [`DpuAttach`].
//!
//! Across a network the link is mutual TLS ([`crate::tls`]): the agent
//! accepts only a client certificate naming its host.

pub mod config;
pub mod service;

pub use config::{AgentArgs, AgentConfig};

use std::future::Future;
use std::sync::Arc;

use tokio_stream::wrappers::TcpListenerStream;

use crate::dpu::DpuAttach;
use crate::grpc::LinkAddress;
use crate::proto::snapcsi::dpu::v1::dpu_agent_server::DpuAgentServer;
use crate::tls::{Reloading, listen, peer_name, server_config};

/// Serves `dpu` to the node as `config` says until `shutdown` completes;
/// calls in flight finish first.
pub async fn serve(
    config: AgentConfig,
    dpu: Arc<dyn DpuAttach>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let address = config.address().map_err(anyhow::Error::msg)?;
    let service = service::AgentService::new(dpu, config.call_timeout);
    let router = crate::server::builder().add_service(DpuAgentServer::new(service));
    let metrics = crate::metrics::bind(config.metrics_address).await?;
    match &address {
        LinkAddress::Tls(host_port) => {
            let tls = Reloading::new(
                config.tls.clone(),
                server_config(peer_name(&config.host_name)?),
            )?;
            let listener = tokio::net::TcpListener::bind(host_port.as_str()).await?;
            tracing::info!(listen = %address, host = %config.host_name, "DPU agent listening (mutual TLS)");
            let incoming = listen::incoming(listener, Arc::new(tls), config.host_name.clone());
            crate::server::serve_incoming(router, incoming, metrics, shutdown).await?;
        }
        LinkAddress::Unix(path) => {
            let listener = crate::server::bind(path)?;
            tracing::info!(listen = %address, "DPU agent listening");
            crate::server::serve(router, listener, path, metrics, shutdown).await?;
        }
        LinkAddress::Plaintext(socket) => {
            let listener = tokio::net::TcpListener::bind(socket).await?;
            tracing::warn!(listen = %address, "DPU agent listening in plaintext, without authentication");
            let incoming = TcpListenerStream::new(listener);
            crate::server::serve_incoming(router, incoming, metrics, shutdown).await?;
        }
    }
    Ok(())
}

/// [`serve`] with the DPU attach layer over the vendor plugin and SNAP here.
pub async fn run(config: AgentConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let dpu = crate::dpu::colocated::Colocated::new(
        config.plugin_socket.clone(),
        config.snap_socket_template.clone(),
    );
    serve(config, Arc::new(dpu), shutdown).await
}
