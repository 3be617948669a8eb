//! The deadline of an incoming gRPC call, for servers that hand it on to
//! every outbound call they make while serving it, and what each hop of a
//! chain of calls keeps back of it.
//!
//! A chain (kubelet → node → DPU agent → plugin and SNAP; a sidecar →
//! controller proxy → vendor) is worth the answer that reaches its first
//! caller. tonic 0.14's client enforces the `grpc-timeout` it sends: when
//! its timer wins, the caller reads CANCELLED "Timeout expired" and the
//! answer that was on its way, with the reason in it (the plugin is down,
//! SNAP does not answer), is lost. Two rules keep the reason on its way:
//!
//! - A server works to its caller's deadline less a [`reserve`]
//!   ([`call_deadline`]): the time its answer needs to reach the caller.
//! - A server that hands the call on to a peer that relays in turn (the node
//!   to its DPU agent, the agent to the plugin and SNAP) gives that peer a
//!   deadline shorter than its own by a reserve again ([`relayed`]): when the
//!   peer's answer comes, or its silence is certain, there is time left to
//!   answer with what it says (or, for silence, what is known without it).
//!
//! For kubelet's 3 s on a split-mode stage: the node works to 2.7 s, the
//! agent is given 2.43 s, keeps 250 ms back for its answer and gives the
//! plugin and SNAP until 1.93 s; its answer (the plugin's reason) reaches the
//! node about 0.5 s before the link's timer, and a silent link still leaves
//! the node 0.27 s to answer, 0.3 s before kubelet's.
//!
//! The reserve is a tenth of the time left, at least [`MIN_RESERVE`] and at
//! most [`MAX_RESERVE`], and never more than half of it. Measured with two
//! CPU hogs on a 2-core host at a load average of 11 to 16 (other builds
//! running; every process of the chain a debug build in one test process):
//! across 20 runs each of the deadline-bound tests (the plugin, SNAP or the
//! link down, stuck or cut), no answer made at its deadline reached the next
//! hop more than 60 ms later. The floor of 250 ms is four times that, so that
//! short deadlines (tests, a sidecar's 1 s) keep their answers too; a tenth
//! of a long deadline (kubelet's 2 min) is capped at 1 s, which covers any
//! stall short of a host that no longer schedules us at all.

use std::time::Duration;

use tokio::time::Instant;
use tonic::Request;

/// The least a hop keeps back for its answer.
pub const MIN_RESERVE: Duration = Duration::from_millis(250);
/// The most a hop keeps back for its answer.
pub const MAX_RESERVE: Duration = Duration::from_secs(1);

/// What a hop keeps back of `time` for its answer to travel.
pub fn reserve(time: Duration) -> Duration {
    (time / 10).clamp(MIN_RESERVE, MAX_RESERVE).min(time / 2)
}

/// The deadline of a call: the caller's (from `grpc-timeout`) less its
/// [`reserve`], capped by `cap`, so that our answer (say UNAVAILABLE with
/// the reason) reaches the caller before it gives up on its own. A call
/// without a timeout gets `cap`.
pub fn call_deadline<T>(request: &Request<T>, cap: Duration) -> Instant {
    let budget = request
        .metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout)
        .map_or(cap, |d| (d - reserve(d)).min(cap));
    Instant::now() + budget
}

/// The deadline for a peer that relays the call in turn: `deadline` less the
/// [`reserve`] of the time left, so that the peer's answer (or the certainty
/// that none comes) leaves time to answer with it by `deadline`.
pub fn relayed(deadline: Instant) -> Instant {
    deadline - reserve(deadline.saturating_duration_since(Instant::now()))
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

    #[test]
    fn the_reserve_is_a_tenth_within_its_bounds_and_never_half_the_time() {
        let ms = Duration::from_millis;
        assert_eq!(reserve(ms(3000)), ms(300));
        assert_eq!(reserve(ms(1500)), MIN_RESERVE);
        assert_eq!(reserve(Duration::from_secs(120)), MAX_RESERVE);
        assert_eq!(reserve(ms(300)), ms(150));
        assert_eq!(reserve(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn a_relayed_call_gets_less_than_the_relay_keeps() {
        let deadline = Instant::now() + Duration::from_secs(3);
        let relayed = relayed(deadline);
        assert!(
            deadline - relayed >= Duration::from_millis(299),
            "{:?}",
            deadline - relayed
        );
        let passed = Instant::now();
        assert_eq!(super::relayed(passed), passed);
    }
}
