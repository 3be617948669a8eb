//! The paths of one bdev_nvme controller name (SPDK's `nvme_bdev_ctrlr`):
//! every controller attached under the name is a path to the subsystem.
//! The initiator's control plane (`crate::bdev::nvme`) adds and removes them
//! and keeps each controller's connection, setting its state as SPDK's
//! reset and reconnect do; its namespaces' I/O (`super::remote`) reads them
//! to pick a path and waits on them when none is connected. Both open
//! their sockets to a path here ([`connect`], [`connect_async`]), with the
//! controller's `transport_ack_timeout` ([`AckTimeout`]).

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, SockaddrStorage, sockopt};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::Notify;

/// A controller's transport ID (TCP only: the one transport between emulators).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Trid {
    pub adrfam: &'static str,
    pub traddr: String,
    pub trsvcid: String,
    pub subnqn: String,
}

impl Trid {
    /// `nvme_bdev_dump_trid_json`.
    pub(crate) fn json(&self) -> Value {
        json!({
            "trtype": "TCP",
            "adrfam": self.adrfam,
            "traddr": self.traddr,
            "trsvcid": self.trsvcid,
            "subnqn": self.subnqn
        })
    }
}

/// How a controller rides out a lost connection: SPDK's
/// `reconnect_delay_sec`, `ctrlr_loss_timeout_sec` (`None`: -1, for ever)
/// and `fast_io_fail_timeout_sec` (`None`: 0, never).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resilience {
    pub reconnect_delay: Duration,
    pub ctrlr_loss: Option<Duration>,
    pub fast_io_fail: Option<Duration>,
}

impl Resilience {
    /// How long I/O waits for a lost path to come back.
    pub(crate) fn patience(&self) -> Option<Duration> {
        if self.reconnect_delay.is_zero() {
            return Some(Duration::ZERO);
        }
        match (self.fast_io_fail, self.ctrlr_loss) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether reconnecting stops after `lost` (SPDK deletes the
    /// controller once `ctrlr_loss_timeout_sec` has passed; without a delay
    /// it does not reconnect at all).
    pub(crate) fn gives_up(&self, lost: Duration) -> bool {
        self.reconnect_delay.is_zero() || self.ctrlr_loss.is_some_and(|l| lost >= l)
    }
}

/// SPDK's `transport_ack_timeout` of a controller (`bdev_nvme_set_options`,
/// taken at attach): its NVMe/TCP sockets get `TCP_USER_TIMEOUT` = 2^N ms
/// (`nvme_tcp.c`, `posix.c`), N capped at 31 as `nvme_tcp_ctrlr_construct`
/// caps it, 0 none. The kernel then closes a socket whose sent bytes stay
/// unacknowledged that long (and gives up a connect whose SYN is not
/// answered at its first retransmission past it), which is how a silently
/// lost path is found: its I/O fails, and the controller resets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct AckTimeout(Option<Duration>);

impl AckTimeout {
    /// The largest exponent an NVMe/TCP controller takes
    /// (`NVME_TCP_CTRLR_MAX_TRANSPORT_ACK_TIMEOUT`).
    pub(crate) const MAX_EXPONENT: u8 = 31;

    pub(crate) fn from_exponent(n: u8) -> Self {
        let n = n.min(Self::MAX_EXPONENT);
        Self((n != 0).then(|| Duration::from_millis(1 << n)))
    }

    pub(crate) fn get(self) -> Option<Duration> {
        self.0
    }

    /// Sets `TCP_USER_TIMEOUT` on `fd`, if any.
    fn apply(self, fd: &impl AsFd) -> io::Result<()> {
        let Some(timeout) = self.0 else {
            return Ok(());
        };
        let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        socket::setsockopt(fd, sockopt::TcpUserTimeout, &ms).map_err(io::Error::from)
    }
}

/// A blocking connection to `addr` within `timeout`, with `ack`'s
/// `TCP_USER_TIMEOUT` set before the SYN, as SPDK's posix sock sets it.
pub(crate) fn connect(
    addr: SocketAddr,
    ack: AckTimeout,
    timeout: Duration,
) -> io::Result<TcpStream> {
    if ack.get().is_none() {
        return TcpStream::connect_timeout(&addr, timeout);
    }
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let fd = socket::socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
    ack.apply(&fd)?;
    let stream = TcpStream::from(fd);
    // A blocking connect gives up after SO_SNDTIMEO, with EINPROGRESS.
    stream.set_write_timeout(Some(timeout))?;
    match socket::connect(stream.as_raw_fd(), &SockaddrStorage::from(addr)) {
        Ok(()) => {}
        Err(Errno::EINPROGRESS) => return Err(io::ErrorKind::TimedOut.into()),
        Err(e) => return Err(e.into()),
    }
    stream.set_write_timeout(None)?;
    Ok(stream)
}

/// [`connect`] for the control plane's tasks.
pub(crate) async fn connect_async(
    addr: SocketAddr,
    ack: AckTimeout,
) -> io::Result<tokio::net::TcpStream> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    ack.apply(&socket)?;
    socket.connect(addr).await
}

/// `nvme_ctrlr_get_state_str` of a controller that is not being deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PathState {
    Enabled,
    Resetting,
    ReconnectIsDelayed,
    Failed,
}

impl PathState {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Enabled => "enabled",
            Self::Resetting => "resetting",
            Self::ReconnectIsDelayed => "reconnect_is_delayed",
            Self::Failed => "failed",
        }
    }
}

/// One controller under the name, as its namespaces' I/O sees it.
#[derive(Debug, Clone)]
pub(crate) struct Path {
    pub id: u64,
    /// The transport IDs: the one in use first, then failover's alternates.
    pub trids: Vec<Trid>,
    pub resilience: Resilience,
    /// Its sockets' `transport_ack_timeout`, as the controller was attached.
    pub ack_timeout: AckTimeout,
    pub cntlid: u16,
    pub state: PathState,
    /// Since when it is not connected, until it is again.
    pub lost_since: Option<Instant>,
    /// Woken when I/O got through on it while it was not connected: its
    /// controller, given up on, tries again.
    pub retry: Arc<Notify>,
    /// Woken (`notify_waiters`) when I/O lost its connection on it while it
    /// was connected (a socket the ack timeout closed, say): its controller
    /// resets, as SPDK's `bdev_nvme_disconnected_qpair_cb` fails the
    /// controller over when an I/O qpair disconnects unexpectedly.
    pub qpair_lost: Arc<Notify>,
    /// The I/O connections with a request in flight on it: its controller's
    /// reset shuts them down, as SPDK's reset disconnects the I/O qpairs and
    /// aborts their I/O, which the multipath bdev retries on another path.
    pub in_flight: Arc<InFlight>,
}

/// The I/O connections of a path with a request in flight, each a clone of
/// the connection's socket. A request whose bytes the target acknowledged
/// before the path went silent waits for an answer that never comes, and
/// no ack timeout fires with nothing unacknowledged: only the controller's
/// reset (its keep-alive unacknowledged) ends it.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    next: std::sync::atomic::AtomicU64,
    conns: Mutex<std::collections::HashMap<u64, TcpStream>>,
}

/// A request in flight on a connection; it leaves [`InFlight`] when dropped.
pub(crate) struct Entered<'a> {
    in_flight: &'a InFlight,
    token: u64,
}

impl InFlight {
    /// Counts `conn` in flight until the guard drops.
    pub(crate) fn enter(&self, conn: &TcpStream) -> io::Result<Entered<'_>> {
        let token = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        lock(&self.conns).insert(token, conn.try_clone()?);
        Ok(Entered {
            in_flight: self,
            token,
        })
    }

    /// Shuts down every connection in flight: their requests fail as lost.
    pub(crate) fn abort(&self) {
        for (_, conn) in lock(&self.conns).drain() {
            let _ = conn.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        lock(&self.in_flight.conns).remove(&self.token);
    }
}

/// A lock whose holder panicked still guards consistent data here: every
/// change under it is one assignment or one collection operation.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Path {
    pub(crate) fn connected(&self) -> bool {
        self.state == PathState::Enabled
    }

    pub(crate) fn trid(&self) -> &Trid {
        &self.trids[0]
    }
}

/// SPDK's `spdk_bdev_nvme_multipath_policy` with its selector, named as
/// `bdev_nvme_set_multipath_policy` takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum MpPolicy {
    ActivePassive,
    ActiveActive,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Selector {
    RoundRobin,
    QueueDepth,
}

/// A bdev's multipath policy (`bdev_nvme_set_multipath_policy`), shared
/// with the I/O of its data path volumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    pub policy: MpPolicy,
    pub selector: Selector,
    pub rr_min_io: u32,
}

impl Default for Policy {
    /// `nvme_bdev_alloc`'s.
    fn default() -> Self {
        Self {
            policy: MpPolicy::ActivePassive,
            selector: Selector::RoundRobin,
            rr_min_io: u32::MAX,
        }
    }
}

/// The paths under one name, in the order they were attached (SPDK's
/// `io_path_list`, which active_passive prefers from the first).
#[derive(Debug, Default)]
pub(crate) struct Paths {
    inner: Mutex<Inner>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct Inner {
    paths: Vec<Path>,
    /// Bumped at every change: I/O that caches a path drops it then, as
    /// SPDK clears its channels' current path when one connects or fails.
    generation: u64,
    next_id: u64,
    /// The name is gone: waiting I/O gives up.
    detached: bool,
}

/// What the I/O reads of the paths at one instant.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub paths: Vec<Path>,
    pub generation: u64,
    pub detached: bool,
}

impl Paths {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    fn changed(&self, mut inner: MutexGuard<'_, Inner>) {
        inner.generation += 1;
        drop(inner);
        self.changed.notify_all();
    }

    /// A connected controller joins; its id.
    pub(crate) fn add(
        &self,
        trids: Vec<Trid>,
        resilience: Resilience,
        ack_timeout: AckTimeout,
        cntlid: u16,
    ) -> u64 {
        let mut inner = self.lock();
        let id = inner.next_id;
        inner.next_id += 1;
        inner.paths.push(Path {
            id,
            trids,
            resilience,
            ack_timeout,
            cntlid,
            state: PathState::Enabled,
            lost_since: None,
            retry: Arc::default(),
            qpair_lost: Arc::default(),
            in_flight: Arc::default(),
        });
        self.changed(inner);
        id
    }

    pub(crate) fn remove(&self, id: u64) {
        let mut inner = self.lock();
        inner.paths.retain(|p| p.id != id);
        self.changed(inner);
    }

    /// The name is detached: I/O waiting for a path fails.
    pub(crate) fn detach(&self) {
        let mut inner = self.lock();
        inner.detached = true;
        inner.paths.clear();
        self.changed(inner);
    }

    /// A change that leaves the paths as they are but must clear what I/O
    /// cached (a new multipath policy).
    pub(crate) fn touch(&self) {
        self.changed(self.lock());
    }

    pub(crate) fn get(&self, id: u64) -> Option<Path> {
        self.lock().paths.iter().find(|p| p.id == id).cloned()
    }

    /// Changes a path, if it is still there.
    pub(crate) fn update(&self, id: u64, f: impl FnOnce(&mut Path)) -> bool {
        let mut inner = self.lock();
        let Some(path) = inner.paths.iter_mut().find(|p| p.id == id) else {
            return false;
        };
        f(path);
        self.changed(inner);
        true
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let inner = self.lock();
        Snapshot {
            paths: inner.paths.clone(),
            generation: inner.generation,
            detached: inner.detached,
        }
    }

    /// Waits up to `timeout` for a change after `generation`.
    pub(crate) fn wait(&self, generation: u64, timeout: Duration) {
        let inner = self.lock();
        let _ = self
            .changed
            .wait_timeout_while(inner, timeout, |i| i.generation == generation);
    }
}
