//! NVMe-oF I/O between emulators, the target's side: the frames of an
//! initiator's data path volume (see [`crate::datapath::remote`] for the
//! protocol) are served from the namespace's bdev behind the subsystem's
//! pause [`Gate`], so that the target counts and rate-limits that I/O and,
//! when its subsystem is paused, holds it until the resume, as SPDK's
//! target does (`nvmf_subsystem_pause` waits for the I/O in flight, then
//! queues what comes). A connection whose listener was removed ([`Cut`])
//! serves nothing more: I/O it held fails as a lost path, and it closes.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::conns::Cut;
use crate::datapath::remote::{EIO, ENXIO, HEAD_LEN, MAX_LEN, READ, WRITE};
use crate::datapath::stats::IoKind;
use crate::datapath::volume::Volume;

/// How often an idle target connection looks whether its subsystem is gone.
const IDLE_POLL: Duration = Duration::from_millis(200);

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

    /// Runs `f` as an I/O inside the gate, after waiting out a pause,
    /// unless the subsystem or the connection (`cut`) is gone by then.
    fn pass<T>(&self, cut: &Cut, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let mut s = self.lock();
        while s.paused && !s.closed {
            s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        if s.closed || cut.is_cut() {
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
/// the whole target, or the listener) goes away, which an idle connection
/// notices within [`IDLE_POLL`].
pub(crate) fn serve(
    stream: TcpStream,
    volume: &Volume,
    file: &std::fs::File,
    gate: &Gate,
    cut: &Cut,
) {
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
                if gate.is_closed() || cut.is_cut() {
                    return;
                }
                continue;
            }
            Err(_) => return,
        }
        let mut head = [0u8; HEAD_LEN];
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
        let done = gate.pass(cut, || {
            if !inside || !matches!(op, READ | WRITE) {
                return Err(io::Error::from_raw_os_error(EIO));
            }
            volume.admit(read, len, arrived);
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_pause_waits_for_the_io_inside_and_holds_the_next() {
        let gate = Arc::new(Gate::default());
        let (inside_tx, inside_rx) = std::sync::mpsc::channel();
        let (leave_tx, leave_rx) = std::sync::mpsc::channel::<()>();
        let g = Arc::clone(&gate);
        let io = std::thread::spawn(move || {
            g.pass(&Cut::default(), || {
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
        let held = std::thread::spawn(move || g.pass(&Cut::default(), || Ok(())));
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
        let held = std::thread::spawn(move || g.pass(&Cut::default(), || Ok(())));
        gate.close();
        let e = held.join().unwrap().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(ENXIO));
    }
}
