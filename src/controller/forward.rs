//! Forwarding one unary call to the vendor: the one place that knows about
//! deadlines, retries, statuses and logging, so that every RPC of every
//! service is the same one call to [`Forwarder::forward`].

use std::error::Error as _;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tonic::{Code, Request, Response, Status};

use super::subject::Subject;
use crate::deadline::call_deadline;
use crate::dpu::plugin::call_until;
use crate::retry;

/// One service's client of the vendor's CSI controller, and how to call it.
#[derive(Debug, Clone)]
pub struct Forwarder<C> {
    client: C,
    /// As configured (`unix:///...` or `http://...`), for messages.
    endpoint: Arc<str>,
    call_timeout: Duration,
}

/// Why a call ended without a response.
#[derive(Clone)]
enum Failure {
    /// The vendor answered with this status.
    Answered(Status),
    /// The vendor was not reached (no connection, or it broke), or did not
    /// answer before the deadline; says what happened.
    NoAnswer(String),
}

impl Failure {
    /// UNAVAILABLE is the one answer that means "try again"; any other code
    /// is the vendor's verdict on the request. A call without an answer is
    /// tried again too: CSI makes every controller RPC idempotent, so a
    /// request that did reach the vendor may safely arrive twice.
    fn is_retryable(&self) -> bool {
        match self {
            Failure::Answered(status) => status.code() == Code::Unavailable,
            Failure::NoAnswer(_) => true,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Answered(status) => {
                write!(
                    f,
                    "the vendor answered {:?}: {}",
                    status.code(),
                    status.message()
                )
            }
            Failure::NoAnswer(reason) => write!(f, "no answer from the vendor: {reason}"),
        }
    }
}

impl<C: Clone> Forwarder<C> {
    pub fn new(client: C, endpoint: impl Into<Arc<str>>, call_timeout: Duration) -> Self {
        Forwarder {
            client,
            endpoint: endpoint.into(),
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
        let mut attempts = 0u32;
        let attempt = || {
            attempts += 1;
            let number = attempts;
            let client = self.client.clone();
            let message = message.clone();
            let send = &send;
            async move {
                let outcome = call_until(rpc, deadline, message, |request| async move {
                    // The vendor's own statuses leave as values, so that the
                    // only errors left in `outcome` are the call's own.
                    match send(client, request).await {
                        Err(status) if is_answer(&status) => Ok(tonic::Response::new(Err(status))),
                        other => other.map(|response| response.map(Ok)),
                    }
                })
                .await;
                let result = match outcome {
                    Ok(Ok(response)) => Ok(response),
                    Ok(Err(status)) => Err(Failure::Answered(status)),
                    Err(status) => Err(Failure::NoAnswer(no_answer(&status, deadline))),
                };
                if let Err(failure) = &result
                    && failure.is_retryable()
                {
                    tracing::debug!(
                        method = rpc,
                        attempt = number,
                        "{failure}; retrying while the deadline allows"
                    );
                }
                result
            }
        };
        let result = retry::until_deadline(deadline, Failure::is_retryable, attempt).await;
        let latency = started.elapsed();
        let outcome = match &result {
            Ok(_) => "ok".to_string(),
            Err(Failure::Answered(status)) => format!("{:?}", status.code()),
            Err(Failure::NoAnswer(_)) => "no_answer".to_string(),
        };
        crate::metrics::observe_outbound("vendor", rpc, &outcome, latency);
        match result {
            Ok(response) => {
                if subject.is_some() {
                    tracing::info!(method = rpc, subject = %Shown(subject), attempts, ?latency, "forwarded: OK");
                } else {
                    // Polled calls (Probe, capabilities, lists) would drown the log at info.
                    tracing::debug!(method = rpc, attempts, ?latency, "forwarded: OK");
                }
                Ok(Response::new(response))
            }
            Err(Failure::Answered(status)) => {
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
                Err(Status::with_details(
                    status.code(),
                    status.message(),
                    status.details().to_vec().into(),
                ))
            }
            Err(Failure::NoAnswer(reason)) => {
                tracing::warn!(
                    method = rpc,
                    subject = %Shown(subject),
                    vendor = %self.endpoint,
                    attempts,
                    ?latency,
                    "vendor CSI controller did not answer: {reason}"
                );
                let plural = if attempts == 1 { "" } else { "s" };
                Err(Status::unavailable(format!(
                    "{rpc}: vendor CSI controller at {} did not answer \
                     ({attempts} attempt{plural} in {latency:.1?}): {reason}",
                    self.endpoint
                )))
            }
        }
    }
}

/// Whether a status is the vendor's answer rather than the client's report
/// that there was none: tonic attaches the underlying error (connect,
/// connection reset, HTTP/2) as the source of every status it makes up
/// itself, and never to one it read from the vendor's trailers.
fn is_answer(status: &Status) -> bool {
    status.source().is_none()
}

/// What went wrong with a call that got no answer: the deadline, or what
/// the transport says, down to its root cause (the connect or I/O error).
fn no_answer(status: &Status, deadline: Instant) -> String {
    // Timers never fire early, so a call cut short by the deadline (ours or
    // the channel's own `grpc-timeout` enforcement) ends at or after it.
    if Instant::now() >= deadline {
        return "no answer before the deadline".into();
    }
    let mut root = status.source();
    while let Some(deeper) = root.and_then(|e| e.source()) {
        root = Some(deeper);
    }
    match root.map(ToString::to_string) {
        Some(cause) if !status.message().contains(&cause) => {
            format!("{}: {cause}", status.message())
        }
        _ => status.message().to_string(),
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
