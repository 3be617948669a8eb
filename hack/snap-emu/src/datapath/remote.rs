//! NVMe-oF I/O between emulators, the initiator's side: a bdev_nvme bdev
//! exposed through the data path reads and writes through its target (see
//! `crate::nvmf::io` for the target's side), so that the target counts,
//! rate-limits and, while its subsystem is paused, holds that I/O.
//!
//! Like the handshake (`crate::nvmf::wire`) this is not NVMe/TCP: each data
//! path volume opens a connection of its own to the listener, sends one
//! JSON line ([`IoHello`]), gets one back, and then sends fixed frames one
//! at a time: `op` (u8: [`READ`], [`WRITE`]), `offset` (u64 LE), `len` (u32
//! LE), and for a write the data; the answer is an errno (i32 LE, 0 for
//! success) and for a read the data.
//!
//! A lost connection (the target killed, restarting, or not exporting the
//! subsystem yet) is ridden out as SPDK's bdev_nvme does with its
//! controller's [`Resilience`]: with a reconnect delay, the I/O waits and is
//! sent again every delay until the target answers, failing only once
//! `fast_io_fail_timeout_sec` or `ctrlr_loss_timeout_sec` has passed since
//! the connection was lost (SPDK then deletes the controller; here the
//! controller stays and the I/O fails) or the controller is detached;
//! without one (SPDK's default), the I/O fails at once. An error the target
//! answers over a live connection is the I/O's own and fails it at once.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

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
    /// How long an I/O waits for a lost connection to come back.
    fn patience(&self) -> Option<Duration> {
        if self.reconnect_delay.is_zero() {
            return Some(Duration::ZERO);
        }
        match (self.fast_io_fail, self.ctrlr_loss) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// What a controller shares with its namespaces' I/O.
#[derive(Debug)]
pub(crate) struct Link {
    pub resilience: Resilience,
    /// Set when the controller is detached: waiting I/O gives up.
    detached: AtomicBool,
}

impl Link {
    pub(crate) fn new(resilience: Resilience) -> Arc<Link> {
        Arc::new(Link {
            resilience,
            detached: AtomicBool::new(false),
        })
    }

    pub(crate) fn detach(&self) {
        self.detached.store(true, Ordering::Release);
    }

    fn detached(&self) -> bool {
        self.detached.load(Ordering::Acquire)
    }
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

/// Initiator side: one namespace of a remote subsystem, reached over a
/// connection made at the first I/O (and again after a failure).
#[derive(Debug)]
pub(crate) struct Remote {
    pub addr: (String, u16),
    pub subnqn: String,
    pub hostnqn: String,
    pub nsid: u32,
    link: Arc<Link>,
    conn: Mutex<Option<TcpStream>>,
    /// When the connection was lost, until a request gets through again.
    lost_since: Mutex<Option<Instant>>,
}

impl Remote {
    pub(crate) fn new(
        addr: (String, u16),
        subnqn: String,
        hostnqn: String,
        nsid: u32,
        link: Arc<Link>,
    ) -> Self {
        Self {
            addr,
            subnqn,
            hostnqn,
            nsid,
            link,
            conn: Mutex::default(),
            lost_since: Mutex::default(),
        }
    }

    fn connect(&self) -> io::Result<TcpStream> {
        let addr = std::net::ToSocketAddrs::to_socket_addrs(&(self.addr.0.as_str(), self.addr.1))?
            .next()
            .ok_or_else(|| io::Error::from(io::ErrorKind::AddrNotAvailable))?;
        let stream = TcpStream::connect_timeout(&addr, HELLO_TIMEOUT)?;
        stream.set_nodelay(true)?;
        let hello = IoHello {
            proto: IO_PROTO.into(),
            subnqn: self.subnqn.clone(),
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

    /// One request and its answer, sent again while the connection is lost
    /// and the controller's [`Resilience`] lets it wait.
    fn call(&self, op: u8, offset: u64, len: usize, data: &[u8]) -> io::Result<Vec<u8>> {
        loop {
            let e = match self.call_once(op, offset, len, data) {
                Ok(body) => {
                    *lock(&self.lost_since) = None;
                    return Ok(body);
                }
                Err(Failure::Answered(errno)) => {
                    *lock(&self.lost_since) = None;
                    return Err(io::Error::from_raw_os_error(errno));
                }
                Err(Failure::Lost(e)) => e,
            };
            let since = *lock(&self.lost_since).get_or_insert_with(Instant::now);
            let resilience = self.link.resilience;
            let waited = since.elapsed();
            let out_of_patience = resilience.patience().is_some_and(|p| waited >= p);
            if out_of_patience || self.link.detached() {
                tracing::debug!(subnqn = %self.subnqn, "I/O failed, connection lost {waited:?}: {e}");
                return Err(io::Error::from_raw_os_error(EIO));
            }
            self.wait(resilience.reconnect_delay);
        }
    }

    /// Sleeps `delay`, or less if the controller is detached meanwhile.
    fn wait(&self, delay: Duration) {
        const SLICE: Duration = Duration::from_millis(50);
        let until = Instant::now() + delay;
        while !self.link.detached() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(SLICE));
        }
    }

    /// One request and its answer; the connection is dropped on failure.
    fn call_once(&self, op: u8, offset: u64, len: usize, data: &[u8]) -> Result<Vec<u8>, Failure> {
        let mut conn = lock(&self.conn);
        let stream = match conn.take() {
            Some(s) => s,
            None => self.connect()?,
        };
        let mut frame = vec![op];
        frame.extend_from_slice(&offset.to_le_bytes());
        let len32 = u32::try_from(len).map_err(|_| Failure::Answered(EIO))?;
        frame.extend_from_slice(&len32.to_le_bytes());
        frame.extend_from_slice(data);
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
        *conn = Some(stream);
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

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
