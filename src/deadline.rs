//! The deadline of an incoming gRPC call, for servers that hand it on to
//! every outbound call they make while serving it.

use std::time::Duration;

use tokio::time::Instant;
use tonic::Request;

/// The deadline of a call: the caller's (from `grpc-timeout`) capped by
/// `cap`, and a little short of the caller's so that our answer (say
/// UNAVAILABLE with the reason) reaches it before it gives up on its own.
/// A call without a timeout gets `cap`.
pub fn call_deadline<T>(request: &Request<T>, cap: Duration) -> Instant {
    let budget = request
        .metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout)
        .map_or(cap, |d| {
            (d - (d / 10).min(Duration::from_millis(500))).min(cap)
        });
    Instant::now() + budget
}

/// Parses gRPC's `grpc-timeout` header (`<digits><unit>`).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_header_parses() {
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("x"), None);
        assert_eq!(parse_grpc_timeout(""), None);
    }

    #[test]
    fn the_deadline_leaves_room_for_the_answer_and_respects_the_cap() {
        let cap = Duration::from_secs(30);
        let mut request = Request::new(());
        request.set_timeout(Duration::from_secs(2));
        let budget = call_deadline(&request, cap) - Instant::now();
        assert!(budget < Duration::from_secs(2) && budget > Duration::from_millis(1700));

        request.set_timeout(Duration::from_secs(3600));
        assert!(call_deadline(&request, cap) - Instant::now() <= cap);
        let without = Request::new(());
        assert!(call_deadline(&without, cap) - Instant::now() > cap - Duration::from_secs(1));
    }
}
