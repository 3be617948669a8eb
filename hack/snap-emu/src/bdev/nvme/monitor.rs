//! A controller's connection to its target (its handshake, see
//! `crate::nvmf::wire`; SPDK's admin queue), kept for the life of the
//! controller. When the target drops it (the listener removed, the
//! subsystem deleted, the target gone), or the path's I/O loses its own
//! connection (a path gone silent, its socket closed by the controller's
//! `transport_ack_timeout`), the path is lost at once, and the
//! controller reconnects as SPDK's reset does: right away, then every
//! `reconnect_delay_sec` (`reconnect_is_delayed` meanwhile), trying
//! failover's alternate trids in turn, until it is back (a new controller
//! id from the target, as SPDK's reconnect gets) or it gives up: without a
//! delay after the first failure, or once `ctrlr_loss_timeout_sec` has
//! passed (SPDK then deletes the controller; here it stays `failed`). A
//! failed controller tries again when I/O got through to its target
//! directly (see `crate::datapath::remote`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, oneshot};

use crate::datapath::paths::{AckTimeout, PathState, Paths};
use crate::nvmf::wire::{self, ConnectRequest};

/// The handle of a controller's monitor: dropping it stops the monitor,
/// closing the connection.
#[derive(Debug)]
pub(super) struct Monitor {
    _stop: oneshot::Sender<()>,
    reset: Arc<Notify>,
}

impl Monitor {
    /// Drops the connection and reconnects (to the trid now first: a
    /// detached one gone, failover to the next).
    pub(super) fn reset(&self) {
        self.reset.notify_one();
    }
}

/// What a monitor needs to reconnect.
#[derive(Debug, Clone)]
pub(super) struct Reconnect {
    pub paths: Arc<Paths>,
    pub id: u64,
    pub hostnqn: String,
    pub timeout: Duration,
    pub ack_timeout: AckTimeout,
    /// How often the connection carries a keep-alive (SPDK's every half
    /// KATO): the bytes whose missing acknowledgement finds a path gone
    /// silent with no I/O on it.
    pub keep_alive: Option<Duration>,
}

/// Keeps `stream`, the connection of path `how.id`, in the background.
pub(super) fn spawn(how: Reconnect, stream: TcpStream) -> Monitor {
    let (stop_tx, stop) = oneshot::channel();
    let reset = Arc::new(Notify::new());
    tokio::spawn(keep(how, stream, stop, Arc::clone(&reset)));
    Monitor {
        _stop: stop_tx,
        reset,
    }
}

/// Why a connected controller stopped holding its connection.
enum Held {
    Stopped,
    /// The target dropped it, or the path's I/O lost its own connection.
    Lost,
    /// The control plane asked: the trid to use is first already.
    Reset,
}

async fn keep(
    how: Reconnect,
    stream: TcpStream,
    mut stop: oneshot::Receiver<()>,
    reset: Arc<Notify>,
) {
    let Reconnect { paths, id, .. } = &how;
    let mut stream = Some(stream);
    loop {
        if let Some(s) = stream.take() {
            let Some(path) = paths.get(*id) else {
                return;
            };
            let held = hold(s, &mut stop, &reset, &path.qpair_lost, how.keep_alive).await;
            // A reset, like a detach, ends the I/O qpairs and their I/O.
            path.in_flight.abort();
            if let Held::Stopped = held {
                return;
            }
            let lost = paths.update(*id, |p| {
                p.state = PathState::Resetting;
                p.lost_since.get_or_insert_with(Instant::now);
                if let Held::Lost = held {
                    // SPDK's failover starts with the next trid.
                    p.trids.rotate_left(1);
                }
            });
            if !lost {
                return;
            }
        }
        // One round: each trid once, from the one first now.
        let Some(path) = paths.get(*id) else {
            return;
        };
        for _ in 0..path.trids.len() {
            if let Some(s) = connect(&how).await {
                stream = Some(s);
                break;
            }
            paths.update(*id, |p| p.trids.rotate_left(1));
        }
        if stream.is_some() {
            continue;
        }
        let Some(path) = paths.get(*id) else {
            return;
        };
        let lost = path.lost_since.map_or(Duration::ZERO, |t| t.elapsed());
        let (state, delay) = if path.resilience.gives_up(lost) {
            (PathState::Failed, None)
        } else {
            (
                PathState::ReconnectIsDelayed,
                Some(path.resilience.reconnect_delay),
            )
        };
        paths.update(*id, |p| p.state = state);
        let again = tokio::select! {
            _ = &mut stop => false,
            _ = reset.notified() => true,
            _ = path.retry.notified() => true,
            _ = sleep(delay) => true,
        };
        if !again {
            return;
        }
        paths.update(*id, |p| p.state = PathState::Resetting);
    }
}

/// Sleeps until `at`, or for ever.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Sleeps `delay`, or for ever.
async fn sleep(delay: Option<Duration>) {
    match delay {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// Holds the connection, sending a keep-alive byte every `keep_alive` (the
/// target reads and drops it), until the target drops it or the kernel
/// gives it up, I/O on the path loses its own (`qpair_lost`: both are the
/// path lost, and SPDK fails over to the next trid), a reset is asked for,
/// or the controller goes.
async fn hold(
    mut stream: TcpStream,
    stop: &mut oneshot::Receiver<()>,
    reset: &Notify,
    qpair_lost: &Notify,
    keep_alive: Option<Duration>,
) -> Held {
    let mut scratch = [0u8; 512];
    let mut next_keep_alive = keep_alive.map(|every| tokio::time::Instant::now() + every);
    // Registered now: I/O that loses its connection while this holds wakes it.
    let qpair_lost = qpair_lost.notified();
    tokio::pin!(qpair_lost);
    loop {
        tokio::select! {
            _ = &mut *stop => return Held::Stopped,
            _ = reset.notified() => return Held::Reset,
            () = &mut qpair_lost => return Held::Lost,
            () = sleep_until(next_keep_alive) => {
                if stream.write_all(&[0]).await.is_err() {
                    return Held::Lost;
                }
                next_keep_alive = next_keep_alive.zip(keep_alive).map(|(at, every)| at + every);
            }
            r = stream.read(&mut scratch) => match r {
                Ok(0) | Err(_) => return Held::Lost,
                Ok(_) => {}
            },
        }
    }
}

/// The handshake again on the path's first trid: connected, with the new
/// controller id, or `None`.
async fn connect(how: &Reconnect) -> Option<TcpStream> {
    let trid = how.paths.get(how.id)?.trid().clone();
    let req = ConnectRequest {
        proto: wire::PROTO.into(),
        subnqn: trid.subnqn.clone(),
        hostnqn: how.hostnqn.clone(),
    };
    match wire::connect(
        &trid.traddr,
        &trid.trsvcid,
        req,
        how.timeout,
        how.ack_timeout,
    )
    .await
    {
        Ok((stream, accepted)) => {
            how.paths.update(how.id, |p| {
                p.cntlid = accepted.cntlid;
                p.state = PathState::Enabled;
                p.lost_since = None;
            });
            Some(stream)
        }
        Err(e) => {
            tracing::debug!(?trid, "reconnect failed: {e:?}");
            None
        }
    }
}
