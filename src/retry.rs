//! Retrying with backoff inside a caller's deadline, shared by every gRPC
//! client ([`crate::grpc::call_retried`]) and the attach flows, so that all
//! of them back off the same way.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backon::{ExponentialBuilder, Retryable};
use tokio::time::Instant;

const FIRST_DELAY: Duration = Duration::from_millis(20);
const MAX_DELAY: Duration = Duration::from_secs(1);

/// Runs `op` until it succeeds, fails with an error `retryable` rejects, or
/// the next attempt could not start before `deadline`; then returns the last
/// error, so the caller reports what actually went wrong rather than a bare
/// "deadline exceeded". An attempt that ends only once the deadline has
/// passed was cut short by it (on a busy machine, one started just in time
/// may find its time gone), so the error of the attempt before it, when
/// there was one, is the one that says why.
pub(crate) async fn until_deadline<T, E, Fut>(
    deadline: Instant,
    retryable: impl FnMut(&E) -> bool,
    mut op: impl FnMut() -> Fut,
) -> Result<T, E>
where
    E: Clone,
    Fut: Future<Output = Result<T, E>>,
{
    let in_time = std::sync::Mutex::new(None::<E>);
    let attempt = || {
        let attempt = op();
        async {
            let result = attempt.await;
            if let Err(e) = &result
                && Instant::now() < deadline
            {
                *in_time.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
            }
            result
        }
    };
    let result = attempt
        .retry(backoff())
        .when(retryable)
        .adjust(move |_, delay| delay.filter(|d| Instant::now() + *d < deadline))
        .await;
    match result {
        Err(cut) if Instant::now() >= deadline => Err(in_time
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
            .unwrap_or(cut)),
        other => other,
    }
}

fn backoff() -> ExponentialBuilder {
    // backon without `std` jitters from a fixed seed; seed from the clock so
    // that many volumes failing at once do not retry in lockstep.
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    ExponentialBuilder::default()
        .with_min_delay(FIRST_DELAY)
        .with_max_delay(MAX_DELAY)
        .with_jitter()
        .with_jitter_seed(seed)
        .without_max_times()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test]
    async fn retries_until_success() {
        let attempts = AtomicU32::new(0);
        let result: Result<u32, &str> = until_deadline(
            Instant::now() + Duration::from_secs(5),
            |_| true,
            || async {
                match attempts.fetch_add(1, Ordering::SeqCst) {
                    0 | 1 => Err("not yet"),
                    n => Ok(n),
                }
            },
        )
        .await;
        assert_eq!(result, Ok(2));
    }

    #[tokio::test]
    async fn stops_on_a_permanent_error() {
        let attempts = AtomicU32::new(0);
        let result: Result<(), &str> = until_deadline(
            Instant::now() + Duration::from_secs(5),
            |e| *e == "transient",
            || async {
                attempts.fetch_add(1, Ordering::SeqCst);
                Err("permanent")
            },
        )
        .await;
        assert_eq!(result, Err("permanent"));
        assert_eq!(attempts.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_attempt_cut_short_by_the_deadline_does_not_hide_why_the_others_failed() {
        let attempts = AtomicU32::new(0);
        let deadline = Instant::now() + Duration::from_millis(200);
        let result: Result<(), &str> = until_deadline(
            deadline,
            |_| true,
            || async {
                if attempts.fetch_add(1, Ordering::SeqCst) == 0 {
                    Err("SNAP is down")
                } else {
                    // The next attempt finds its time gone.
                    tokio::time::sleep_until(deadline).await;
                    Err("deadline already passed")
                }
            },
        )
        .await;
        assert_eq!(result, Err("SNAP is down"));
        assert_eq!(attempts.load(Ordering::SeqCst), 2);

        // With nothing before it, the cut attempt's error is all there is.
        let result: Result<(), &str> = until_deadline(
            Instant::now() + Duration::from_millis(50),
            |_| true,
            || async {
                tokio::time::sleep(Duration::from_millis(60)).await;
                Err("no answer in time")
            },
        )
        .await;
        assert_eq!(result, Err("no answer in time"));
    }

    #[tokio::test]
    async fn gives_up_before_the_deadline_with_the_last_error() {
        let started = Instant::now();
        let deadline = started + Duration::from_millis(300);
        let result: Result<(), &str> =
            until_deadline(deadline, |_| true, || async { Err("transient") }).await;
        assert_eq!(result, Err("transient"));
        assert!(Instant::now() <= deadline + Duration::from_millis(50));
    }
}
