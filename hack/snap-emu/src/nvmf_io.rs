//! NVMe-oF I/O between emulators: a bdev_nvme bdev exposed through the data
//! path reads and writes through the target, so that the target counts,
//! rate-limits and, when its subsystem is paused, holds that I/O until the
//! resume, as SPDK's target does (`nvmf_subsystem_pause` waits for the I/O
//! in flight, then queues what comes).
//!
//! Like the handshake (`crate::nvmf_tcp`) this is not NVMe/TCP: each data
//! path volume opens a connection of its own to the listener, sends one
//! JSON line ([`IoHello`]), gets one back, and then sends fixed frames one
//! at a time: `op` (u8: 0 read, 1 write), `offset` (u64 LE), `len` (u32 LE),
//! and for a write the data; the answer is an errno (i32 LE, 0 for success)
//! and for a read the data.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::datapath::{IoKind, Volume};
use crate::state::Emulator;

pub(crate) const IO_PROTO: &str = "snap-emu-nvmf-io/1";
const READ: u8 = 0;
const WRITE: u8 = 1;
/// How long the initiator waits to connect and for the hello's answer (an
/// I/O itself may wait as long as the subsystem stays paused).
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
const EIO: i32 = 5;
const ENXIO: i32 = 6;
/// Larger than any request the data path makes (its FUSE requests are at
/// most 1 MiB): a frame claiming more ends the connection.
const MAX_LEN: u32 = 16 << 20;
/// How often an idle target connection looks whether its subsystem is gone.
const IDLE_POLL: Duration = Duration::from_millis(200);

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

/// A subsystem's pause: I/O enters while it runs; a pause waits for the
/// I/O inside, then holds what comes until the resume.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    paused: bool,
    /// The subsystem is gone: I/O fails instead of waiting for a resume
    /// that cannot come.
    closed: bool,
    inside: usize,
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Returns once no I/O is inside and none can enter.
    pub(crate) fn pause(&self) {
        let mut s = self.lock();
        s.paused = true;
        while s.inside > 0 {
            s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
    }

    pub(crate) fn resume(&self) {
        self.lock().paused = false;
        self.changed.notify_all();
    }

    /// The subsystem was deleted: held and later I/O fails.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }

    fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Runs `f` as an I/O inside the gate, after waiting out a pause.
    fn pass<T>(&self, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let mut s = self.lock();
        while s.paused && !s.closed {
            s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        if s.closed {
            return Err(io::Error::from_raw_os_error(ENXIO));
        }
        s.inside += 1;
        drop(s);
        let out = f();
        self.lock().inside -= 1;
        self.changed.notify_all();
        out
    }
}

/// Target side: serves the frames of one connection from `volume` (the
/// namespace's bdev) until the initiator closes it, or the subsystem (or
/// the whole target) goes away, which an idle connection notices within
/// [`IDLE_POLL`].
pub(crate) fn serve(stream: TcpStream, volume: &Volume, file: &std::fs::File, gate: &Gate) {
    let Ok(clone) = stream.try_clone() else {
        return;
    };
    if stream.set_read_timeout(Some(IDLE_POLL)).is_err() {
        return;
    }
    let mut reader = BufReader::new(clone);
    let mut writer = stream;
    loop {
        // Idle: wait for a frame, or for the gate to close.
        match reader.fill_buf() {
            Ok([]) => return,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if gate.is_closed() {
                    return;
                }
                continue;
            }
            Err(_) => return,
        }
        let mut head = [0u8; 13];
        if reader.read_exact(&mut head).is_err() {
            return;
        }
        let arrived = Instant::now();
        let op = head[0];
        let offset = u64::from_le_bytes(head[1..9].try_into().unwrap_or_default());
        let len = u32::from_le_bytes(head[9..13].try_into().unwrap_or_default());
        if len > MAX_LEN {
            return;
        }
        let (read, len) = (op == READ, u64::from(len));
        let mut data = vec![0; if op == WRITE { len as usize } else { 0 }];
        if reader.read_exact(&mut data).is_err() {
            return;
        }
        let inside = len <= volume.backing.size && offset <= volume.backing.size - len;
        let done = gate.pass(|| {
            if !inside || !matches!(op, READ | WRITE) {
                return Err(io::Error::from_raw_os_error(EIO));
            }
            volume.admit(read, len);
            if read {
                volume.account(IoKind::Read, len, arrived, || {
                    volume.read(file, offset, len as usize)
                })
            } else {
                volume
                    .account(IoKind::Write, len, arrived, || {
                        volume.write(file, offset, &data)
                    })
                    .map(|()| vec![])
            }
        });
        let (status, body) = match done {
            Ok(body) => (0i32, body),
            Err(e) => (e.raw_os_error().unwrap_or(EIO), vec![]),
        };
        let mut answer = status.to_le_bytes().to_vec();
        answer.extend_from_slice(&body);
        if writer.write_all(&answer).is_err() {
            return;
        }
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

impl Emulator {
    /// An I/O connection's hello (see [`crate::nvmf_io`]): the namespace's
    /// data path volume and the subsystem's pause gate.
    pub(crate) fn nvmf_io_open(
        &self,
        key: &(String, String),
        hello: &IoHello,
    ) -> Result<(Volume, Arc<Gate>), String> {
        let s = self.nvmf_admitted(key, &hello.subnqn, &hello.hostnqn)?;
        let ns = s
            .namespaces
            .iter()
            .find(|n| n.nsid == hello.nsid)
            .ok_or_else(|| format!("no namespace {} in {}", hello.nsid, hello.subnqn))?;
        let bdev = self
            .bdevs
            .get(&ns.bdev)
            .ok_or_else(|| format!("no bdev {}", ns.bdev))?;
        let volume = self.volume_of(bdev).map_err(|e| e.message)?;
        Ok((volume, Arc::clone(&s.gate)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_waits_for_the_io_inside_and_holds_the_next() {
        let gate = Arc::new(Gate::default());
        let (inside_tx, inside_rx) = std::sync::mpsc::channel();
        let (leave_tx, leave_rx) = std::sync::mpsc::channel::<()>();
        let g = Arc::clone(&gate);
        let io = std::thread::spawn(move || {
            g.pass(|| {
                inside_tx.send(()).unwrap();
                leave_rx.recv().unwrap();
                Ok(())
            })
        });
        inside_rx.recv().unwrap();
        let g = Arc::clone(&gate);
        let pausing = std::thread::spawn(move || g.pause());
        std::thread::sleep(Duration::from_millis(50));
        assert!(!pausing.is_finished(), "the pause waits for the I/O inside");
        leave_tx.send(()).unwrap();
        io.join().unwrap().unwrap();
        pausing.join().unwrap();
        let g = Arc::clone(&gate);
        let held = std::thread::spawn(move || g.pass(|| Ok(())));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!held.is_finished(), "a paused gate holds new I/O");
        gate.resume();
        held.join().unwrap().unwrap();
    }

    #[test]
    fn a_closed_gate_fails_what_it_held() {
        let gate = Arc::new(Gate::default());
        gate.pause();
        let g = Arc::clone(&gate);
        let held = std::thread::spawn(move || g.pass(|| Ok(())));
        gate.close();
        let e = held.join().unwrap().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(ENXIO));
    }
}
