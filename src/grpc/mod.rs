//! The one gRPC client core: how every gRPC client of ours (the vendor
//! plugin client, the node's link to its DPU agent, the controller proxy's
//! forwarder, plugin-check) reaches its peer and makes a call.
//!
//! - [`address`]: where a peer listens ([`LinkAddress`]), written the same way
//!   by every setting that names one.
//! - [`link`]: a lazily connected channel over a UNIX socket, plaintext TCP
//!   on loopback, or mutual TLS that follows its certificate files.
//! - [`call_until`]: one attempt under the caller's deadline; [`call_retried`]:
//!   attempts retried with backoff inside it ([`crate::retry`]), counted as
//!   one outbound call; [`unanswered`]: whether the peer answered at all.

pub mod address;
pub mod link;

pub use address::LinkAddress;
pub use link::{Link, unix_channel, unix_channel_with};

use std::error::Error as _;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio::time::Instant;
use tonic::Status;

use crate::retry;

/// A call that ended without a response: the status that decided it, and
/// how many attempts were made.
#[derive(Debug, Clone)]
pub struct Failed {
    pub status: Status,
    pub attempts: u32,
}

/// Whether the peer did not answer: tonic made `status` from a transport
/// error (a connection refused, reset or timed out, a peer that does not
/// speak HTTP/2, its own `grpc-timeout` timer), or [`call_until`] from the
/// deadline. Either way the status carries the error as its source; a status
/// a peer sent, read from its trailers, never does.
pub fn unanswered(status: &Status) -> bool {
    status.source().is_some()
}

/// Whether the link lost the call: the peer did not answer, and not because
/// TLS refused the handshake, which is final (a certificate does not become
/// acceptable within a call, and knocking again would only repeat the
/// refusal).
pub fn lost(status: &Status) -> bool {
    unanswered(status) && !refused_by_tls(status)
}

/// tokio-rustls reports every TLS failure (a certificate refused here, an
/// alert from the peer) as an `InvalidData` I/O error; the connection has no
/// other data to find invalid.
pub fn refused_by_tls(status: &Status) -> bool {
    let mut source = status.source();
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

/// What went wrong with a call the peer did not answer, down to the root
/// cause (the TLS alert, the refused connection): the status's message, then
/// each error below it that adds something.
pub fn cause(status: &Status) -> String {
    let mut reason = status.message().to_string();
    let mut source = status.source();
    while let Some(error) = source {
        if error.is::<DeadlinePassed>() {
            // The message says it, with the time it had.
            break;
        }
        let text = error.to_string();
        if !reason.contains(&text) {
            reason = format!("{reason}: {text}");
        }
        source = error.source();
    }
    reason
}

/// The deadline passed before an answer: the source of [`call_until`]'s own
/// DEADLINE_EXCEEDED, which makes that status [`unanswered`].
#[derive(Debug, thiserror::Error)]
#[error("deadline passed")]
struct DeadlinePassed;

/// Whether `status` says the deadline ran out, ours or tonic's own
/// `grpc-timeout` enforcement, rather than anything about the peer.
pub fn timed_out(status: &Status) -> bool {
    let mut source = status.source();
    while let Some(error) = source {
        if error.is::<DeadlinePassed>() || error.is::<tonic::TimeoutExpired>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// One unary call, once, bounded by `deadline`: sent as `grpc-timeout` and
/// enforced here as well, so that the call ends by the deadline whatever
/// carries it.
pub async fn call_until<Req, Resp, Fut>(
    rpc: &str,
    deadline: Instant,
    message: Req,
    send: impl FnOnce(tonic::Request<Req>) -> Fut,
) -> Result<Resp, Status>
where
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    let passed = |message: String| {
        let mut status = Status::deadline_exceeded(message);
        status.set_source(std::sync::Arc::new(DeadlinePassed));
        status
    };
    let remaining = deadline.saturating_duration_since(Instant::now());
    if remaining.is_zero() {
        return Err(passed(format!("{rpc}: deadline already passed")));
    }
    let mut request = tonic::Request::new(message);
    request.set_timeout(remaining);
    match tokio::time::timeout_at(deadline, send(request)).await {
        Ok(result) => result.map(tonic::Response::into_inner),
        Err(_) => Err(passed(format!("{rpc}: no answer within {remaining:?}"))),
    }
}

/// One unary call to `peer`, retried with backoff inside `deadline` while
/// `retryable` says so, each attempt bounded by it ([`call_until`]), and
/// recorded as one outbound call: `ok`, the code the peer answered, or
/// `no_answer`. The response comes with the number of attempts it took.
pub(crate) async fn call_retried<Req, Resp, Fut>(
    peer: &'static str,
    rpc: &'static str,
    deadline: Instant,
    message: &Req,
    retryable: impl Fn(&Status) -> bool,
    send: impl Fn(tonic::Request<Req>) -> Fut,
) -> Result<(Resp, u32), Failed>
where
    Req: Clone,
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    let started = std::time::Instant::now();
    let attempts = AtomicU32::new(0);
    let attempt = || {
        let number = attempts.fetch_add(1, Ordering::Relaxed) + 1;
        let call = call_until(rpc, deadline, message.clone(), &send);
        let retryable = &retryable;
        async move {
            let result = call.await;
            if let Err(status) = &result
                && retryable(status)
            {
                tracing::debug!(
                    peer,
                    method = rpc,
                    attempt = number,
                    "{}; retrying while the deadline allows",
                    shown(status)
                );
            }
            result
        }
    };
    let result = retry::until_deadline(deadline, |s| retryable(s), attempt).await;
    let outcome = match &result {
        Ok(_) => "ok".to_string(),
        Err(status) if unanswered(status) => "no_answer".to_string(),
        Err(status) => format!("{:?}", status.code()),
    };
    crate::metrics::observe_outbound(peer, rpc, &outcome, started.elapsed());
    let attempts = attempts.into_inner();
    result
        .map(|response| (response, attempts))
        .map_err(|status| Failed { status, attempts })
}

/// A failed attempt, for the log.
fn shown(status: &Status) -> String {
    if unanswered(status) {
        format!("no answer: {}", cause(status))
    } else {
        format!("answered {:?}: {}", status.code(), status.message())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_call_past_its_deadline_is_unanswered_and_says_so() {
        let deadline = Instant::now() + Duration::from_millis(20);
        let status = call_until("Probe", deadline, (), |_| {
            std::future::pending::<Result<tonic::Response<()>, Status>>()
        })
        .await
        .unwrap_err();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
        assert!(status.message().starts_with("Probe: no answer within"));
        assert!(unanswered(&status) && timed_out(&status) && lost(&status));
        assert_eq!(cause(&status), status.message());

        let status = call_until("Probe", deadline, (), |_| async {
            Ok(tonic::Response::new(()))
        })
        .await
        .unwrap_err();
        assert_eq!(status.message(), "Probe: deadline already passed");
        assert!(unanswered(&status));
    }

    #[test]
    fn a_peers_status_is_an_answer() {
        let answered = Status::unavailable("the array is rebooting");
        assert!(!unanswered(&answered) && !timed_out(&answered) && !lost(&answered));
        assert_eq!(cause(&answered), "the array is rebooting");
    }
}
