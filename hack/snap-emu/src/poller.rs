//! SPDK's RPC poller: one task serves every connection, tick by tick, and
//! counts the dependent round trips its clients make.
//!
//! At each tick it reads whatever every connection has sent, then sends the
//! replies it holds from the tick before, then answers what it read: at once,
//! or, with [`Config::reply_on_next_tick`](crate::config::Config), at the next tick,
//! as real SPDK does.
//!
//! # Rounds
//!
//! Every request gets a round: one more than the highest round of any reply
//! sent before the request was read, on any connection (a request through
//! another process, such as a vendor plugin's, may wait for a reply as well).
//! A request that waited for an earlier reply counts one more than that one;
//! requests sent together count the same; ticks with nothing to do count
//! nothing. [`Rounds`] reads the highest round so far, so a call made k
//! dependent round trips when it moved the count by k.
//!
//! With replies on the next tick the count is exact for any client that
//! sends the requests it issues together within one poll period of each
//! other: a request read a tick after its sibling was still read before the
//! sibling's reply went out. With replies at once, a tick falling between two
//! requests sent together would count them as two rounds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use json_framing::JsonFramer;
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use crate::dispatch::answer_framed;
use crate::faults::Faults;
use crate::framing::{self, READ_CHUNK};
use crate::registry::Shared;

/// The highest round of a request the poller has read (see the module doc);
/// stays 0 without a poll period.
#[derive(Debug, Clone, Default)]
pub struct Rounds(Arc<AtomicU64>);

impl Rounds {
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// One client's connection, as the poller keeps it between ticks.
struct Polled {
    stream: UnixStream,
    /// Bytes read and not yet a whole request.
    framer: JsonFramer,
    /// Replies to the requests read at the last tick, for the next one.
    held: Vec<u8>,
    /// Replies the socket has not taken yet.
    out: Vec<u8>,
    /// End of stream or a parse error: nothing more is read, and the
    /// connection closes once its replies are out, as SPDK closes it.
    closing: bool,
}

impl Polled {
    /// Reads whatever is available without waiting.
    fn read(&mut self, chunk: &mut [u8]) {
        // Past the limit the framer refuses the stream anyway; stop reading there.
        while self.framer.pending() <= framing::REQUEST_LIMITS.max_message_bytes {
            match self.stream.try_read(chunk) {
                Ok(n) if n > 0 => self.framer.extend(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                // End of stream, or a broken one.
                _ => {
                    self.closing = true;
                    return;
                }
            }
        }
    }

    /// Writes what the socket takes without waiting; `false` when the
    /// connection is broken.
    fn flush(&mut self) -> bool {
        while !self.out.is_empty() {
            match self.stream.try_write(&self.out) {
                Ok(n) => drop(self.out.drain(..n)),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                Err(_) => return false,
            }
        }
        true
    }

    fn done(&self) -> bool {
        self.closing && self.held.is_empty() && self.out.is_empty()
    }
}

/// Serves every connection `incoming` hands over, one tick each `period`,
/// until the task is dropped.
pub(crate) async fn poll(
    shared: Arc<Shared>,
    period: Duration,
    reply_on_next_tick: bool,
    rounds: Rounds,
    faults: Faults,
    mut incoming: mpsc::UnboundedReceiver<UnixStream>,
) {
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut connections: Vec<Polled> = Vec::new();
    let mut chunk = vec![0u8; READ_CHUNK];
    // The highest round of a reply sent, and the round of the replies held.
    let (mut sent, mut held_round) = (0u64, 0u64);
    loop {
        interval.tick().await;
        while let Ok(stream) = incoming.try_recv() {
            connections.push(Polled {
                stream,
                framer: JsonFramer::new(framing::REQUEST_LIMITS),
                held: Vec::new(),
                out: Vec::new(),
                closing: false,
            });
        }
        for c in connections.iter_mut().filter(|c| !c.closing) {
            c.read(&mut chunk);
        }
        // What was just read went out before any reply of this tick.
        let round = sent + 1;
        for c in &mut connections {
            if !c.held.is_empty() {
                sent = sent.max(held_round);
                c.out.append(&mut c.held);
            }
        }
        let mut answered = false;
        for c in &mut connections {
            let (replies, fatal) = answer_framed(&shared, &faults, &mut c.framer).await;
            answered |= !replies.is_empty();
            if reply_on_next_tick {
                c.held.extend(replies);
            } else {
                c.out.extend(replies);
            }
            c.closing |= fatal;
        }
        if answered {
            rounds.0.store(round, Ordering::SeqCst);
            if reply_on_next_tick {
                held_round = round;
            } else {
                sent = round;
            }
        }
        connections.retain_mut(|c| c.flush() && !c.done());
    }
}
