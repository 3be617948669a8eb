//! [`RemoteDpu`]: the DPU attach layer as calls to the DPU agent (split
//! mode), for a node whose plugin and SNAP live on the BlueField's own OS.
//!
//! One HTTP/2 connection carries every call: opened on first use, opened
//! again after it breaks, kept alive and checked with pings meanwhile. It is
//! mutual TLS ([`crate::tls`]) that accepts only an agent certificate naming
//! the DPU this node expects; or plaintext on a UNIX socket (a DPU acting as
//! its own node) or, for tests, on loopback. When this node's certificate
//! files change, the next call opens a new connection with them; calls in
//! flight finish on the old one.
//!
//! Every call carries the caller's deadline (the agent answers before it).
//! A call the link lost (the connection refused or reset: no answer from
//! the agent) is retried with backoff inside the deadline, since every agent
//! call is idempotent. What the agent answered is final, as the agent has
//! already retried its own dependencies; so is a handshake TLS refused. The
//! link going down (with the reason) and coming back is logged once each.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Code, Status};

use super::plugin::call_retried;
use super::{AttachRequest, Attachment, DpuAttach, DpuError, Inventory, IoStats};
use crate::agent::address::LinkAddress;
use crate::proto::snapcsi::dpu::v1 as api;
use crate::tls::{Reloading, TlsError, TlsFiles, client_config, connect, peer_name};
use api::dpu_agent_client::DpuAgentClient;

/// A connection attempt that gets no TCP answer gives up after this, so that
/// a retry tries again once a cut link is back.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Pings on an idle connection find a dead link before a call does.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub struct RemoteDpu {
    address: LinkAddress,
    transport: Transport,
    /// The connection and the TLS generation it was opened with.
    channel: Mutex<Option<(u64, Channel)>>,
    /// Why the link is down, as last logged; `None` while it answers.
    down: Mutex<Option<String>>,
}

#[derive(Debug, Clone)]
enum Transport {
    Tls {
        host_port: String,
        dpu_name: ServerName<'static>,
        settings: Arc<Reloading<rustls::ClientConfig>>,
    },
    Unix(PathBuf),
    Plaintext(SocketAddr),
}

impl RemoteDpu {
    /// The client of the agent at `address`; over TLS it presents `tls`'s
    /// certificate and accepts only one naming `dpu_name`. The files are read
    /// now (bad ones are a configuration error); nothing is connected until
    /// the first call.
    pub fn new(address: LinkAddress, dpu_name: &str, tls: &TlsFiles) -> Result<Self, TlsError> {
        let transport = match &address {
            LinkAddress::Tls(host_port) => Transport::Tls {
                host_port: host_port.clone(),
                dpu_name: peer_name(dpu_name)?,
                settings: Arc::new(Reloading::new(tls.clone(), client_config)?),
            },
            LinkAddress::Unix(path) => Transport::Unix(path.clone()),
            LinkAddress::Plaintext(socket) => Transport::Plaintext(*socket),
        };
        Ok(RemoteDpu {
            address,
            transport,
            channel: Mutex::new(None),
            down: Mutex::new(None),
        })
    }

    /// A client on the current connection, or on a new one when this node's
    /// TLS files changed since it was opened.
    fn client(&self) -> DpuAgentClient<Channel> {
        let generation = match &self.transport {
            Transport::Tls { settings, .. } => settings.current().0,
            Transport::Unix(_) | Transport::Plaintext(_) => 0,
        };
        let mut slot = self.channel.lock().unwrap_or_else(|e| e.into_inner());
        let channel = match slot.as_ref() {
            Some((opened, channel)) if *opened == generation => channel.clone(),
            _ => {
                let channel = self.open();
                *slot = Some((generation, channel.clone()));
                channel
            }
        };
        DpuAgentClient::new(channel)
    }

    /// A channel that connects on first use and after each break.
    fn open(&self) -> Channel {
        // The URI only fills the :authority header; the connector decides.
        let endpoint = Endpoint::from_static("http://dpu-agent")
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        match self.transport.clone() {
            Transport::Tls {
                host_port,
                dpu_name,
                settings,
            } => endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let (_, config) = settings.current();
                let (host_port, dpu_name) = (host_port.clone(), dpu_name.clone());
                async move {
                    connect::connect(&host_port, dpu_name, config)
                        .await
                        .map(TokioIo::new)
                }
            })),
            Transport::Unix(path) => super::plugin::unix_channel_with(endpoint, path),
            Transport::Plaintext(socket) => {
                endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| async move {
                    let tcp = tokio::net::TcpStream::connect(socket).await?;
                    let _ = tcp.set_nodelay(true);
                    Ok::<_, std::io::Error>(TokioIo::new(tcp))
                }))
            }
        }
    }

    /// One agent RPC under `deadline`, retried while the link loses it.
    async fn call<Req, Resp, F, Fut>(
        &self,
        rpc: &'static str,
        deadline: Instant,
        message: Req,
        send: F,
    ) -> Result<Resp, DpuError>
    where
        Req: Clone,
        F: Fn(DpuAgentClient<Channel>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        let result = call_retried("dpu-agent", rpc, deadline, &message, lost, |request| {
            send(self.client(), request)
        })
        .await;
        match result {
            Ok(response) => {
                self.link_answers();
                Ok(response)
            }
            Err(status) => Err(self.error(rpc, status)),
        }
    }

    fn link_answers(&self) {
        let mut down = self.down.lock().unwrap_or_else(|e| e.into_inner());
        if down.take().is_some() {
            tracing::info!(agent = %self.address, "the DPU agent answers again");
        }
    }

    /// Classifies a failed call; one the agent did not answer marks the link
    /// down, logged when the reason is new.
    fn error(&self, rpc: &str, status: Status) -> DpuError {
        let answered = !super::unanswered(&status) && status.code() != Code::DeadlineExceeded;
        if answered {
            self.link_answers();
            return DpuError::from_code(
                status.code(),
                format!("DPU agent at {}: {rpc}: {}", self.address, status.message()),
            );
        }
        let reason = cause(&status);
        let mut down = self.down.lock().unwrap_or_else(|e| e.into_inner());
        if down.as_deref() != Some(reason.as_str()) {
            tracing::warn!(agent = %self.address, "the DPU agent does not answer: {reason}");
            *down = Some(reason.clone());
        }
        // Our own timeout already names the call.
        if reason.starts_with(rpc) {
            DpuError::Unavailable(format!("DPU agent at {}: {reason}", self.address))
        } else {
            DpuError::Unavailable(format!("DPU agent at {}: {rpc}: {reason}", self.address))
        }
    }
}

/// Whether the link lost the call: tonic made the status from a transport
/// error (the agent's own statuses carry no source). A handshake that TLS
/// refused is not lost but final: a certificate does not become acceptable
/// within a call, and knocking again would only repeat the refusal.
fn lost(status: &Status) -> bool {
    super::unanswered(status) && !refused_by_tls(status)
}

/// tokio-rustls reports every TLS failure (a certificate refused here, an
/// alert from the agent) as an `InvalidData` I/O error; the connection has
/// no other data to find invalid.
fn refused_by_tls(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        let invalid = error
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::InvalidData);
        if invalid || error.is::<rustls::Error>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// What went wrong, down to the root cause (the TLS alert, the refused
/// connection), with a hint where the agent refused this node.
fn cause(status: &Status) -> String {
    let mut reason = status.message().to_string();
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        let text = error.to_string();
        if !reason.contains(&text) {
            reason = format!("{reason}: {text}");
        }
        source = error.source();
    }
    if reason.contains("received fatal alert") {
        reason.push_str(" (the agent refused this node's certificate: see the agent's log)");
    }
    reason
}

#[async_trait::async_trait]
impl DpuAttach for RemoteDpu {
    async fn attach(
        &self,
        request: &AttachRequest,
        deadline: Instant,
    ) -> Result<Attachment, DpuError> {
        let message = api::AttachRequest::from(request);
        let response = self
            .call("Attach", deadline, message, |mut c, r| async move {
                c.attach(r).await
            })
            .await?;
        Attachment::try_from(response)
    }

    async fn detach(
        &self,
        volume_id: &str,
        device_name: Option<&str>,
        deadline: Instant,
    ) -> Result<(), DpuError> {
        let message = api::DetachRequest {
            volume_id: volume_id.to_string(),
            device_name: device_name.unwrap_or_default().to_string(),
        };
        self.call("Detach", deadline, message, |mut c, r| async move {
            c.detach(r).await
        })
        .await?;
        Ok(())
    }

    async fn probe(&self, deadline: Instant) -> Result<bool, DpuError> {
        let response = self
            .call(
                "Probe",
                deadline,
                api::ProbeRequest {},
                |mut c, r| async move { c.probe(r).await },
            )
            .await?;
        Ok(response.ready)
    }

    async fn inventory(&self, deadline: Instant) -> Result<Inventory, DpuError> {
        let response = self
            .call(
                "GetInventory",
                deadline,
                api::GetInventoryRequest {},
                |mut c, r| async move { c.get_inventory(r).await },
            )
            .await?;
        Inventory::try_from(response)
    }

    async fn io_stats(&self, deadline: Instant) -> Result<IoStats, DpuError> {
        let response = self
            .call(
                "GetIoStats",
                deadline,
                api::GetIoStatsRequest {},
                |mut c, r| async move { c.get_io_stats(r).await },
            )
            .await?;
        Ok(response.into())
    }
}
