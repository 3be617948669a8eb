//! Forwarding one unary call to the vendor: the one place that knows about
//! deadlines, retries, statuses and logging, so that every RPC of every
//! service is the same one call to [`Forwarder::forward`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

use super::subject::Subject;
use crate::deadline::call_deadline;
use crate::grpc::{self, Failed, Link};

/// One service's client of the vendor's CSI controller, and how to call it.
#[derive(Debug)]
pub struct Forwarder<C> {
    /// Shared by every service: one connection, moved to new TLS files when
    /// they change ([`Link::channel`]).
    link: Arc<Link>,
    /// The service's generated client over the link's channel.
    client: fn(Channel) -> C,
    call_timeout: Duration,
}

impl<C> Clone for Forwarder<C> {
    fn clone(&self) -> Self {
        Forwarder {
            link: Arc::clone(&self.link),
            client: self.client,
            call_timeout: self.call_timeout,
        }
    }
}

/// UNAVAILABLE is the one answer that means "try again"; any other code is
/// the vendor's verdict on the request. A call the link lost is tried again
/// too: CSI makes every controller RPC idempotent, so a request that did
/// reach the vendor may safely arrive twice.
fn retryable(status: &Status) -> bool {
    grpc::lost(status) || (!grpc::unanswered(status) && status.code() == Code::Unavailable)
}

impl<C> Forwarder<C> {
    pub fn new(link: Arc<Link>, client: fn(Channel) -> C, call_timeout: Duration) -> Self {
        Forwarder {
            link,
            client,
            call_timeout,
        }
    }

    /// Sends `request` to the vendor with `send` (one generated client
    /// method) and returns the vendor's response or status unchanged.
    ///
    /// The call gets the caller's deadline, a little short and capped by the
    /// configured timeout, and UNAVAILABLE (or no answer at all) is retried
    /// with backoff inside it. When the deadline leaves no time for another
    /// attempt, the last attempt decides: the vendor's answer is returned as
    /// is; no answer becomes UNAVAILABLE naming the endpoint and the reason.
    ///
    /// A subject longer than CSI's string limit is INVALID_ARGUMENT without
    /// a call. Only the method, the request's subject (a volume or snapshot name or
    /// id, see [`Subject`]), the outcome and the latency are logged: requests
    /// carry secrets, and parameters that may be sensitive.
    pub async fn forward<Req, Resp, F, Fut>(
        &self,
        rpc: &'static str,
        request: Request<Req>,
        send: F,
    ) -> Result<Response<Resp>, Status>
    where
        Req: Subject + Clone,
        F: Fn(C, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        let started = Instant::now();
        let deadline = call_deadline(&request, self.call_timeout);
        let message = request.into_inner();
        let subject = message.subject();
        // An id or name past CSI's limit was made by no conforming CO or SP:
        // refused here, it neither reaches the vendor nor fills our log.
        if let Some((field, value)) = subject {
            crate::csi_limits::within_string_limit(value, field)?;
        }
        let result = grpc::call_retried("vendor", rpc, deadline, &message, retryable, |request| {
            send((self.client)(self.link.channel()), request)
        })
        .await;
        let latency = started.elapsed();
        let Failed { status, attempts } = match result {
            Ok((response, attempts)) => {
                if subject.is_some() {
                    tracing::info!(method = rpc, subject = %Shown(subject), attempts, ?latency, "forwarded: OK");
                } else {
                    // Polled calls (Probe, capabilities, lists) would drown the log at info.
                    tracing::debug!(method = rpc, attempts, ?latency, "forwarded: OK");
                }
                return Ok(Response::new(response));
            }
            Err(failed) => failed,
        };
        if !grpc::unanswered(&status) {
            tracing::info!(
                method = rpc,
                subject = %Shown(subject),
                code = ?status.code(),
                vendor_message = status.message(),
                attempts,
                ?latency,
                "forwarded: the vendor's error"
            );
            // Code, message and details exactly as the vendor sent them;
            // the transport headers that came with them are not ours to repeat.
            return Err(Status::with_details(
                status.code(),
                status.message(),
                status.details().to_vec().into(),
            ));
        }
        let reason = if grpc::timed_out(&status) {
            "no answer before the deadline".to_string()
        } else {
            grpc::cause(&status)
        };
        tracing::warn!(
            method = rpc,
            subject = %Shown(subject),
            vendor = %self.link.address(),
            attempts,
            ?latency,
            "vendor CSI controller did not answer: {reason}"
        );
        let plural = if attempts == 1 { "" } else { "s" };
        Err(Status::unavailable(format!(
            "{rpc}: vendor CSI controller at {} did not answer \
             ({attempts} attempt{plural} in {latency:.1?}): {reason}",
            self.link.address()
        )))
    }
}

/// A request's subject as a log value: `name=pvc-1`, or `-` for none.
struct Shown<'a>(Option<(&'static str, &'a str)>);

impl std::fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some((field, value)) => write!(f, "{field}={value}"),
            None => f.write_str("-"),
        }
    }
}
