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
//! Every call carries a deadline shorter than the caller's
//! ([`crate::deadline::relayed`]): the agent answers before it, and when no
//! answer comes the node still has time to say so, with the last reason the
//! agent gave for the DPU being unavailable (a plugin that has been down for
//! a while makes a loaded agent late as well). A call the link lost (the
//! connection refused or reset: no answer from the agent) is retried with
//! backoff inside the deadline, since every agent call is idempotent. What
//! the agent answered is final, as the agent has already retried its own
//! dependencies; so is a handshake TLS refused. The link going down (with
//! the reason) and coming back is logged once each.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::attach::{AttachRequest, Attachment, DpuAttach, Inventory};
use super::error::DpuError;
use crate::grpc::{self, Failed, Link, LinkAddress};
use crate::proto::snapcsi::dpu::v1 as api;
use crate::spdk::bdev::Iostat as IoStats;
use crate::tls::{TlsError, TlsFiles};
use api::dpu_agent_client::DpuAgentClient;

/// A connection attempt that gets no TCP answer gives up after this, so that
/// a retry tries again once a cut link is back.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Pings on an idle connection find a dead link before a call does.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub struct RemoteDpu {
    link: Link,
    /// Why the link is down, as last logged; `None` while it answers.
    down: Mutex<Option<String>>,
    /// The agent's last UNAVAILABLE and when it came: what the node still
    /// knows of the DPU when a later call gets no answer. Forgotten when a
    /// call succeeds.
    last_word: Mutex<Option<(Instant, String)>>,
}

impl RemoteDpu {
    /// The client of the agent at `address`; over TLS it presents `tls`'s
    /// certificate and accepts only one naming `dpu_name`. The files are read
    /// now (bad ones are a configuration error); nothing is connected until
    /// the first call.
    pub fn new(address: LinkAddress, dpu_name: &str, tls: &TlsFiles) -> Result<Self, TlsError> {
        // The URI only fills the :authority header; the address decides.
        let endpoint = Endpoint::from_static("http://dpu-agent")
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        Ok(RemoteDpu {
            link: Link::new(address, dpu_name, tls, endpoint)?,
            down: Mutex::new(None),
            last_word: Mutex::new(None),
        })
    }

    fn address(&self) -> &LinkAddress {
        self.link.address()
    }

    /// One agent RPC under `deadline` (less a reserve for our answer),
    /// retried while the link loses it.
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
        let link_deadline = crate::deadline::relayed(deadline);
        let budget = link_deadline.saturating_duration_since(Instant::now());
        let result = grpc::call_retried(
            "dpu-agent",
            rpc,
            link_deadline,
            &message,
            grpc::lost,
            |request| send(DpuAgentClient::new(self.link.channel()), request),
        )
        .await;
        match result {
            Ok((response, _attempts)) => {
                self.link_answers();
                *lock(&self.last_word) = None;
                Ok(response)
            }
            Err(failed) => Err(self.error(rpc, failed, budget)),
        }
    }

    fn link_answers(&self) {
        let mut down = lock(&self.down);
        if down.take().is_some() {
            tracing::info!(agent = %self.address(), "the DPU agent answers again");
        }
    }

    /// Classifies a failed call that had `budget`; one the agent did not
    /// answer marks the link down, logged when the reason is new.
    fn error(&self, rpc: &str, Failed { status, .. }: Failed, budget: Duration) -> DpuError {
        let agent = self.address();
        if !grpc::unanswered(&status) {
            self.link_answers();
            let message = format!("DPU agent at {agent}: {rpc}: {}", status.message());
            if status.code() == Code::Unavailable {
                *lock(&self.last_word) = Some((Instant::now(), message.clone()));
            }
            return DpuError::from_code(status.code(), message);
        }
        let mut reason = if !grpc::timed_out(&status) {
            grpc::cause(&status)
        } else if budget.is_zero() {
            "no time was left to ask it".to_string()
        } else {
            format!("no answer within {budget:.1?}")
        };
        if reason.contains("received fatal alert") {
            reason.push_str(" (the agent refused this node's certificate: see the agent's log)");
        }
        let mut down = lock(&self.down);
        if down.as_deref() != Some(reason.as_str()) {
            tracing::warn!(agent = %agent, "the DPU agent does not answer: {reason}");
            *down = Some(reason.clone());
        }
        let known = match lock(&self.last_word).as_ref() {
            Some((when, word)) => format!("; its last answer, {:.1?} ago: {word}", when.elapsed()),
            None => String::new(),
        };
        DpuError::Unavailable(format!("DPU agent at {agent}: {rpc}: {reason}{known}"))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
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
