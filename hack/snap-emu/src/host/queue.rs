//! The host side's queue: calls for different PCI functions run in
//! parallel; calls for the same function run one at a time, in the order
//! they were made, background attaches included ([`Queue::spawn`]), and a
//! shutdown waits for every background job ([`Queue::wait_idle`]).

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;

/// The functions' lines and the background jobs.
#[derive(Debug, Default)]
pub(super) struct Queue {
    lines: Arc<FunctionLocks>,
    jobs: Arc<Jobs>,
}

impl Queue {
    /// Waits for `bdf`'s turn and holds the function until the guard drops.
    pub(super) fn lock(&self, bdf: &str) -> FunctionGuard {
        self.lines.lock(bdf)
    }

    /// Runs `job` on a thread of its own (`name`), holding `bdf`, behind
    /// every call made for it so far: whatever is asked of the function
    /// later waits for it. The job counts as running, for
    /// [`wait_idle`](Self::wait_idle), from now until it has dropped what it
    /// captured.
    pub(super) fn spawn(
        &self,
        bdf: &str,
        name: String,
        job: impl FnOnce() + Send + 'static,
    ) -> io::Result<()> {
        let ticket = self.lines.reserve(bdf);
        let running = self.jobs.start();
        thread::Builder::new()
            .name(name)
            .spawn(move || {
                let guard = ticket.wait();
                job();
                drop(guard);
                drop(running);
            })
            .map(drop)
    }

    /// Waits until no background job is left.
    pub(super) fn wait_idle(&self) {
        self.jobs.wait_idle();
    }
}

/// Serialises the calls for one PCI function, first come first served;
/// calls for different functions never wait for each other, and nothing is
/// held across them but this.
///
/// The order matters because a background attach takes its place in line
/// when SNAP's state changes, not when its thread gets to run: a detach of
/// the same function that comes later must find the disk attached, never
/// overtake the attach and leave it to appear afterwards.
#[derive(Debug, Default)]
pub(super) struct FunctionLocks {
    lines: Mutex<HashMap<String, Line>>,
    turn: Condvar,
}

/// One function's line: ticket `served` holds the function, and every ticket
/// below `issued` waits for its turn.
#[derive(Debug, Default)]
struct Line {
    issued: u64,
    served: u64,
}

impl FunctionLocks {
    pub(super) fn lock(self: &Arc<Self>, bdf: &str) -> FunctionGuard {
        self.reserve(bdf).wait()
    }

    pub(super) fn reserve(self: &Arc<Self>, bdf: &str) -> Ticket {
        // The lines are only ever left consistent, so a panic elsewhere is no
        // reason to stop using them.
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        let line = lines.entry(bdf.to_owned()).or_default();
        let number = line.issued;
        line.issued += 1;
        Ticket {
            locks: Some(Arc::clone(self)),
            bdf: bdf.to_owned(),
            number,
        }
    }
}

/// A place in a function's line.
#[derive(Debug)]
#[must_use]
pub(super) struct Ticket {
    /// Taken when the ticket is redeemed.
    locks: Option<Arc<FunctionLocks>>,
    bdf: String,
    number: u64,
}

impl Ticket {
    pub(super) fn wait(mut self) -> FunctionGuard {
        let locks = self.locks.take().expect("a ticket is redeemed once");
        let mut lines = locks.lines.lock().unwrap_or_else(PoisonError::into_inner);
        while lines
            .get(&self.bdf)
            .is_some_and(|l| l.served != self.number)
        {
            lines = locks
                .turn
                .wait(lines)
                .unwrap_or_else(PoisonError::into_inner);
        }
        drop(lines);
        FunctionGuard {
            locks,
            bdf: std::mem::take(&mut self.bdf),
        }
    }
}

impl Drop for Ticket {
    /// A ticket that was never redeemed (its job could not start) still has
    /// to pass its turn on, or the function's line stops for good.
    fn drop(&mut self) {
        if self.locks.is_some() {
            let bdf = std::mem::take(&mut self.bdf);
            drop(
                Ticket {
                    locks: self.locks.take(),
                    bdf,
                    number: self.number,
                }
                .wait(),
            );
        }
    }
}

#[derive(Debug)]
pub(super) struct FunctionGuard {
    locks: Arc<FunctionLocks>,
    bdf: String,
}

impl Drop for FunctionGuard {
    fn drop(&mut self) {
        let mut lines = self
            .locks
            .lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(line) = lines.get_mut(&self.bdf) {
            line.served += 1;
            if line.served == line.issued {
                lines.remove(&self.bdf);
            }
        }
        drop(lines);
        self.locks.turn.notify_all();
    }
}

/// Background host jobs not finished yet; shutdown waits for none.
#[derive(Debug, Default)]
struct Jobs {
    running: Mutex<usize>,
    finished: Condvar,
}

impl Jobs {
    fn start(self: &Arc<Self>) -> JobGuard {
        *self.running.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        JobGuard(Arc::clone(self))
    }

    fn wait_idle(&self) {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        while *running > 0 {
            running = self
                .finished
                .wait(running)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Counts a job as running until dropped, also when its thread never starts.
#[derive(Debug)]
struct JobGuard(Arc<Jobs>);

impl Drop for JobGuard {
    fn drop(&mut self) {
        *self
            .0
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner) -= 1;
        self.0.finished.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const BDF: &str = "26:00.1";

    #[test]
    fn a_function_line_is_first_come_first_served() {
        let locks = Arc::new(FunctionLocks::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        let first = locks.lock(BDF);
        let waiting: Vec<_> = (0..5)
            .map(|i| {
                let ticket = locks.reserve(BDF);
                let order = Arc::clone(&order);
                thread::spawn(move || {
                    // Later tickets try to overtake by asking first.
                    thread::sleep(Duration::from_millis(10 * (5 - i)));
                    let _guard = ticket.wait();
                    order.lock().unwrap().push(i);
                })
            })
            .collect();
        // An unredeemed ticket passes its turn on when dropped (once it is its turn).
        let unused = locks.reserve(BDF);
        let skipper = thread::spawn(move || drop(unused));
        // Another function is not held up.
        drop(locks.lock("26:00.2"));
        drop(first);
        for t in waiting {
            t.join().unwrap();
        }
        skipper.join().unwrap();
        drop(locks.lock(BDF));
        assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4]);
        assert!(locks.lines.lock().unwrap().is_empty());
    }
}
