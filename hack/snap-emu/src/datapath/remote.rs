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

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

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

/// Initiator side: one namespace of a remote subsystem, reached over a
/// connection made at the first I/O (and again after a failure).
#[derive(Debug)]
pub(crate) struct Remote {
    pub addr: (String, u16),
    pub subnqn: String,
    pub hostnqn: String,
    pub nsid: u32,
    conn: Mutex<Option<TcpStream>>,
}

impl Remote {
    pub(crate) fn new(addr: (String, u16), subnqn: String, hostnqn: String, nsid: u32) -> Self {
        Self {
            addr,
            subnqn,
            hostnqn,
            nsid,
            conn: Mutex::default(),
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

    /// One request and its answer; the connection is dropped on failure.
    fn call(&self, op: u8, offset: u64, len: usize, data: &[u8]) -> io::Result<Vec<u8>> {
        let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        let stream = match conn.take() {
            Some(s) => s,
            None => self.connect()?,
        };
        let mut frame = vec![op];
        frame.extend_from_slice(&offset.to_le_bytes());
        let len32 = u32::try_from(len).map_err(|_| io::Error::from_raw_os_error(EIO))?;
        frame.extend_from_slice(&len32.to_le_bytes());
        frame.extend_from_slice(data);
        (&stream).write_all(&frame)?;
        let mut status = [0u8; 4];
        (&stream).read_exact(&mut status)?;
        let status = i32::from_le_bytes(status);
        let mut body = vec![0; if op == READ && status == 0 { len } else { 0 }];
        (&stream).read_exact(&mut body)?;
        *conn = Some(stream);
        if status != 0 {
            return Err(io::Error::from_raw_os_error(status));
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
