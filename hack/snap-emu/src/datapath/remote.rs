//! NVMe-oF I/O between emulators, the initiator's side: a bdev_nvme bdev
//! exposed through the data path reads and writes through its target (see
//! `crate::nvmf::io` for the target's side), so that the target counts,
//! rate-limits and, while its subsystem is paused, holds that I/O.
//!
//! Like the handshake (`crate::nvmf::wire`) this is not NVMe/TCP: each data
//! path volume opens a connection of its own to a path's listener (SPDK's
//! I/O qpair), sends one JSON line ([`IoHello`]), gets one back, and then
//! sends fixed frames one at a time: `op` (u8: [`READ`], [`WRITE`]),
//! `offset` (u64 LE), `len` (u32 LE), and for a write the data; the answer
//! is an errno (i32 LE, 0 for success) and for a read the data.
//!
//! A bdev with several paths (controllers attached under one name, see
//! [`super::paths`]) sends each I/O on a connected path its multipath
//! policy picks, as SPDK's `bdev_nvme_find_io_path` does: active_passive
//! the first connected path in attach order, kept until a path connects or
//! fails (so a path that comes back is preferred again), active_active the
//! connected paths in turn, `rr_min_io` I/Os each (queue_depth: the first,
//! as a volume has one I/O in flight). An I/O whose path is lost, in
//! flight or not, is sent again at once on the next connected path. Its
//! sockets carry the controller's `transport_ack_timeout`
//! ([`super::paths::AckTimeout`]), so a path that goes silent fails the
//! I/O on it once the kernel gives the socket up, and a connected path
//! that lost I/O so has its controller reset (`Path::qpair_lost`), as
//! SPDK's does; a connection made before the controller's last reconnect
//! (another controller id) is not used again, as a reset makes SPDK's I/O
//! qpairs anew. A controller's reset ends the I/O in flight on its path
//! ([`super::paths::InFlight`]), which is sent again on the next path, as
//! SPDK's reset aborts the I/O of the qpairs it disconnects: a request the
//! target acknowledged before its path went silent leaves nothing for the
//! ack timeout, and only the controller's keep-alive finds it.
//!
//! Only when every path is lost does each controller's [`Resilience`]
//! apply, unchanged from one path: the I/O is sent again (on any path,
//! connected or not) whenever a path reconnects and at least every
//! reconnect delay, failing once every path's `fast_io_fail_timeout_sec`
//! or `ctrlr_loss_timeout_sec` has passed since it was lost (SPDK then
//! deletes the controller; here it stays and the I/O fails), or at once
//! without a delay (SPDK's default), or when the controller is detached.
//! An error the target answers over a live connection is the I/O's own and
//! fails it at once.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::paths::{self, MpPolicy, Path, Paths, Policy, Selector, Snapshot, lock};

pub(crate) const IO_PROTO: &str = "snap-emu-nvmf-io/1";
pub(crate) const READ: u8 = 0;
pub(crate) const WRITE: u8 = 1;
/// The bytes of a frame's head: `op`, `offset`, `len`.
pub(crate) const HEAD_LEN: usize = 13;
/// How long the initiator waits to connect and for the hello's answer (an
/// I/O itself may wait as long as the subsystem stays paused).
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
pub(crate) const EIO: i32 = 5;
pub(crate) const ENXIO: i32 = 6;
/// Larger than any request the data path makes (its FUSE requests are at
/// most 1 MiB): a frame claiming more ends the connection.
pub(crate) const MAX_LEN: u32 = 16 << 20;

/// The first line of an I/O connection, and its answer (`error` empty when
/// the namespace is served).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct IoHello {
    pub proto: String,
    pub subnqn: String,
    pub hostnqn: String,
    pub nsid: u32,
    #[serde(default)]
    pub error: Option<String>,
}

/// Why a request failed: the connection, or the target's answer.
enum Failure {
    Lost(io::Error),
    Answered(i32),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::Lost(e)
    }
}

/// Initiator side: one namespace of a remote subsystem, reached over its
/// controllers' paths; one per data path volume, as SPDK has one I/O
/// channel per thread.
#[derive(Debug)]
pub(crate) struct Remote {
    hostnqn: String,
    nsid: u32,
    paths: Arc<Paths>,
    policy: Arc<Mutex<Policy>>,
    channel: Mutex<Channel>,
}

/// What one volume keeps of its paths (SPDK's `nvme_bdev_channel`).
#[derive(Debug, Default)]
struct Channel {
    /// Its connection on each path, made at the path's first I/O (and again
    /// after a failure or a reconnect of the path's controller), with the
    /// controller id it was made under.
    conns: HashMap<u64, (TcpStream, u16)>,
    /// The path the last I/O took (`current_io_path`), valid while the
    /// paths' generation is `seen`.
    current: Option<u64>,
    seen: u64,
    rr_count: u32,
    /// Per path: since when its I/O fails here, until one gets through.
    failing: HashMap<u64, Instant>,
}

impl Channel {
    /// The paths to try, in order: the one the policy picks among the
    /// connected, the other connected ones, then those not connected (tried
    /// directly, as the one path's I/O always was).
    fn order(&mut self, snap: &Snapshot, policy: Policy) -> Vec<Path> {
        if snap.generation != self.seen {
            self.current = None;
            self.seen = snap.generation;
        }
        let live: Vec<&Path> = snap.paths.iter().filter(|p| p.connected()).collect();
        let current = self
            .current
            .and_then(|c| live.iter().position(|p| p.id == c));
        let first = match (policy.policy, policy.selector, current) {
            (MpPolicy::ActivePassive, _, Some(c)) => Some(c),
            (MpPolicy::ActiveActive, Selector::RoundRobin, Some(c)) => {
                self.rr_count = self.rr_count.saturating_add(1);
                if self.rr_count < policy.rr_min_io {
                    Some(c)
                } else {
                    self.rr_count = 0;
                    Some((c + 1) % live.len())
                }
            }
            _ => (!live.is_empty()).then_some(0),
        };
        let mut order: Vec<Path> = first.map(|i| live[i].clone()).into_iter().collect();
        order.extend(
            live.iter()
                .enumerate()
                .filter(|(i, _)| Some(*i) != first)
                .map(|(_, p)| (*p).clone()),
        );
        order.extend(snap.paths.iter().filter(|p| !p.connected()).cloned());
        order
    }

    /// Forgets what it kept of paths that were removed.
    fn forget_gone(&mut self, snap: &Snapshot) {
        let there = |id: &u64| snap.paths.iter().any(|p| p.id == *id);
        self.conns.retain(|id, _| there(id));
        self.failing.retain(|id, _| there(id));
    }

    /// After every path failed this I/O: how long to wait before sending
    /// it again, or `None` once every path is out of patience.
    fn patience(&self, snap: &Snapshot) -> Option<Duration> {
        let now = Instant::now();
        snap.paths
            .iter()
            .filter(|p| {
                let since = [self.failing.get(&p.id).copied(), p.lost_since]
                    .into_iter()
                    .flatten()
                    .min()
                    .unwrap_or(now);
                let waited = now.saturating_duration_since(since);
                p.resilience.patience().is_none_or(|limit| waited < limit)
            })
            .map(|p| p.resilience.reconnect_delay)
            .min()
    }
}

impl Remote {
    pub(crate) fn new(
        hostnqn: String,
        nsid: u32,
        paths: Arc<Paths>,
        policy: Arc<Mutex<Policy>>,
    ) -> Self {
        Self {
            hostnqn,
            nsid,
            paths,
            policy,
            channel: Mutex::default(),
        }
    }

    fn connect(&self, path: &Path) -> io::Result<TcpStream> {
        let trid = path.trid();
        let port: u16 = trid
            .trsvcid
            .parse()
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let addr = std::net::ToSocketAddrs::to_socket_addrs(&(trid.traddr.as_str(), port))?
            .next()
            .ok_or_else(|| io::Error::from(io::ErrorKind::AddrNotAvailable))?;
        let stream = paths::connect(addr, path.ack_timeout, HELLO_TIMEOUT)?;
        stream.set_nodelay(true)?;
        let hello = IoHello {
            proto: IO_PROTO.into(),
            subnqn: trid.subnqn.clone(),
            hostnqn: self.hostnqn.clone(),
            nsid: self.nsid,
            error: None,
        };
        let mut line = serde_json::to_vec(&hello).map_err(io::Error::other)?;
        line.push(b'\n');
        (&stream).write_all(&line)?;
        stream.set_read_timeout(Some(HELLO_TIMEOUT))?;
        let mut answer = String::new();
        BufReader::new(&stream)
            .take(1 << 16)
            .read_line(&mut answer)?;
        let answer: IoHello = serde_json::from_str(&answer).map_err(io::Error::other)?;
        if let Some(e) = answer.error {
            return Err(io::Error::other(e));
        }
        stream.set_read_timeout(None)?;
        Ok(stream)
    }

    /// One request and its answer, on the path the policy picks, on the
    /// next one if that path is lost, and again while every path is lost
    /// and some controller's [`Resilience`] lets it wait.
    fn call(&self, op: u8, offset: u64, len: usize, data: &[u8]) -> io::Result<Vec<u8>> {
        let mut ch = lock(&self.channel);
        loop {
            let snap = self.paths.snapshot();
            if snap.detached {
                return Err(io::Error::from_raw_os_error(EIO));
            }
            ch.forget_gone(&snap);
            let policy = *lock(&self.policy);
            for path in ch.order(&snap, policy) {
                match self.call_on(&mut ch, &path, op, offset, len, data) {
                    Ok(body) => {
                        ch.failing.remove(&path.id);
                        if path.connected() {
                            ch.current = Some(path.id);
                        } else {
                            // Its controller may have stopped trying.
                            path.retry.notify_one();
                        }
                        return Ok(body);
                    }
                    Err(Failure::Answered(errno)) => {
                        ch.failing.remove(&path.id);
                        return Err(io::Error::from_raw_os_error(errno));
                    }
                    Err(Failure::Lost(e)) => {
                        tracing::debug!(trid = ?path.trid(), "I/O path lost: {e}");
                        if path.connected() {
                            // The controller may not know yet (a silent
                            // path): it resets.
                            path.qpair_lost.notify_waiters();
                        }
                        ch.failing.entry(path.id).or_insert_with(Instant::now);
                        if ch.current == Some(path.id) {
                            ch.current = None;
                        }
                    }
                }
            }
            let Some(delay) = ch.patience(&snap) else {
                tracing::debug!(nsid = self.nsid, "I/O failed: every path lost");
                return Err(io::Error::from_raw_os_error(EIO));
            };
            self.paths.wait(snap.generation, delay);
        }
    }

    /// One request and its answer on `path`; its connection is dropped on
    /// failure, and not used under another controller id.
    fn call_on(
        &self,
        ch: &mut Channel,
        path: &Path,
        op: u8,
        offset: u64,
        len: usize,
        data: &[u8],
    ) -> Result<Vec<u8>, Failure> {
        let stream = match ch.conns.remove(&path.id) {
            Some((s, cntlid)) if cntlid == path.cntlid => s,
            _ => self.connect(path)?,
        };
        let mut frame = vec![op];
        frame.extend_from_slice(&offset.to_le_bytes());
        let len32 = u32::try_from(len).map_err(|_| Failure::Answered(EIO))?;
        frame.extend_from_slice(&len32.to_le_bytes());
        frame.extend_from_slice(data);
        let _in_flight = path.in_flight.enter(&stream)?;
        (&stream).write_all(&frame)?;
        let mut status = [0u8; 4];
        (&stream).read_exact(&mut status)?;
        let status = i32::from_le_bytes(status);
        let mut body = vec![0; if op == READ && status == 0 { len } else { 0 }];
        (&stream).read_exact(&mut body)?;
        // ENXIO: the subsystem went away under the connection (deleted, or
        // the target shutting down), where SPDK's target drops the
        // connection: a lost path, not this I/O's own error.
        if status == ENXIO {
            return Err(Failure::Lost(io::Error::from_raw_os_error(status)));
        }
        ch.conns.insert(path.id, (stream, path.cntlid));
        if status != 0 {
            return Err(Failure::Answered(status));
        }
        Ok(body)
    }

    pub(crate) fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        self.call(READ, offset, len, &[])
    }

    pub(crate) fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.call(WRITE, offset, data.len(), data).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::paths::{AckTimeout, PathState, Resilience, Trid};

    fn trid(port: &str) -> Trid {
        Trid {
            adrfam: "IPv4",
            traddr: "127.0.0.1".into(),
            trsvcid: port.into(),
            subnqn: "nqn.2016-06.io.spdk:t".into(),
        }
    }

    fn resilience(delay: u64, fast_io_fail: Option<u64>) -> Resilience {
        Resilience {
            reconnect_delay: Duration::from_secs(delay),
            ctrlr_loss: None,
            fast_io_fail: fast_io_fail.map(Duration::from_secs),
        }
    }

    /// Two paths, the policy's pick, and what a channel picks in turn.
    fn picks(paths: &Paths, ch: &mut Channel, policy: Policy, n: usize) -> Vec<u64> {
        (0..n)
            .map(|_| {
                let first = ch.order(&paths.snapshot(), policy)[0].id;
                ch.current = Some(first);
                first
            })
            .collect()
    }

    /// Two paths of one device, each with the same reconnect policy.
    fn two_paths() -> (Paths, u64, u64) {
        let paths = Paths::default();
        let path = |n: &str, id| {
            paths.add(
                vec![trid(n)],
                resilience(1, None),
                AckTimeout::default(),
                id,
            )
        };
        let (a, b) = (path("1", 1), path("2", 2));
        (paths, a, b)
    }

    #[test]
    fn active_passive_keeps_the_first_connected_path_and_goes_back_to_it() {
        let (paths, a, b) = two_paths();
        let mut ch = Channel::default();
        let policy = Policy::default();
        assert_eq!(picks(&paths, &mut ch, policy, 3), [a, a, a]);
        paths.update(a, |p| p.state = PathState::ReconnectIsDelayed);
        let order: Vec<u64> = ch
            .order(&paths.snapshot(), policy)
            .iter()
            .map(|p| p.id)
            .collect();
        assert_eq!(order, [b, a], "the lost path is tried last");
        ch.current = Some(b);
        assert_eq!(picks(&paths, &mut ch, policy, 2), [b, b]);
        paths.update(a, |p| p.state = PathState::Enabled);
        assert_eq!(picks(&paths, &mut ch, policy, 2), [a, a], "failback");
    }

    #[test]
    fn active_active_takes_turns_of_rr_min_io() {
        let (paths, a, b) = two_paths();
        let mut ch = Channel::default();
        let policy = Policy {
            policy: MpPolicy::ActiveActive,
            selector: Selector::RoundRobin,
            rr_min_io: 2,
        };
        assert_eq!(picks(&paths, &mut ch, policy, 6), [a, a, b, b, a, a]);
        let one = Policy {
            rr_min_io: 1,
            ..policy
        };
        assert_eq!(picks(&paths, &mut ch, one, 3), [b, a, b]);
    }

    #[test]
    fn io_waits_while_any_lost_path_has_patience_left() {
        let paths = Paths::default();
        let a = paths.add(
            vec![trid("1")],
            resilience(2, Some(5)),
            AckTimeout::default(),
            1,
        );
        let b = paths.add(
            vec![trid("2")],
            resilience(1, None),
            AckTimeout::default(),
            2,
        );
        let mut ch = Channel::default();
        let long_ago = Instant::now() - Duration::from_secs(10);
        ch.failing.insert(a, long_ago);
        ch.failing.insert(b, Instant::now());
        assert_eq!(
            ch.patience(&paths.snapshot()),
            Some(Duration::from_secs(1)),
            "the first is out of patience (fast_io_fail 5 s), the second waits for ever"
        );
        paths.update(b, |p| p.resilience = resilience(0, None));
        assert_eq!(
            ch.patience(&paths.snapshot()),
            None,
            "no delay: no patience"
        );
        paths.update(a, |p| p.lost_since = Some(Instant::now()));
        ch.failing.insert(a, Instant::now());
        assert_eq!(ch.patience(&paths.snapshot()), Some(Duration::from_secs(2)));
    }

    /// A target on loopback that answers every hello; with `answer`, every
    /// request (status 0), without, none (it reads the request and holds
    /// the connection: a path gone silent after the request got through).
    /// Each request read is sent on the channel.
    fn target(answer: bool) -> (String, std::sync::mpsc::Receiver<()>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port().to_string();
        let (got, requests) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let got = got.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(&conn);
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    let mut hello: IoHello = serde_json::from_str(&line).unwrap();
                    hello.error = None;
                    let mut answer_line = serde_json::to_vec(&hello).unwrap();
                    answer_line.push(b'\n');
                    (&conn).write_all(&answer_line).unwrap();
                    let mut head = [0u8; HEAD_LEN];
                    while reader.read_exact(&mut head).is_ok() {
                        let len = u32::from_le_bytes(head[9..13].try_into().unwrap());
                        let mut data = vec![0; len as usize];
                        reader.read_exact(&mut data).unwrap();
                        let _ = got.send(());
                        if !answer {
                            // Held open, never answered, until the peer goes.
                            let _ = reader.read_exact(&mut head);
                            return;
                        }
                        (&conn).write_all(&0i32.to_le_bytes()).unwrap();
                    }
                });
            }
        });
        (port, requests)
    }

    #[test]
    fn a_reset_ends_the_io_in_flight_on_its_path_and_it_goes_to_the_next() {
        let ((silent, on_silent), (live, on_live)) = (target(false), target(true));
        let paths = Arc::new(Paths::default());
        let add = |port: &str, id| {
            paths.add(
                vec![trid(port)],
                resilience(1, None),
                AckTimeout::default(),
                id,
            )
        };
        let (a, _b) = (add(&silent, 1), add(&live, 2));
        let remote = Arc::new(Remote::new(
            "nqn.host".into(),
            1,
            Arc::clone(&paths),
            Arc::default(),
        ));
        let (done_tx, done) = std::sync::mpsc::channel();
        let writer = Arc::clone(&remote);
        std::thread::spawn(move || done_tx.send(writer.write(0, &[7; 4096])));
        on_silent
            .recv_timeout(Duration::from_secs(10))
            .expect("the write reached the first path");
        assert!(
            done.recv_timeout(Duration::from_millis(300)).is_err(),
            "no answer came, nothing ended the write"
        );
        // What the controller's monitor does once its keep-alive goes
        // unacknowledged: the path resets, its I/O in flight is ended.
        paths.update(a, |p| p.state = PathState::Resetting);
        paths.get(a).unwrap().in_flight.abort();
        let written = done
            .recv_timeout(Duration::from_secs(10))
            .expect("the write ended once its path was reset");
        written.expect("the write succeeded on the other path");
        on_live
            .recv_timeout(Duration::from_secs(1))
            .expect("the other path got the write");
    }
}
