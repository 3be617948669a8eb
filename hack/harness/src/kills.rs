//! Kills at random instants inside a step of a volume's life, and their
//! count: what the chaos soak's kill trials and the node's kill test (which
//! includes this file by path, beside `kubelet.rs`) share. A [`Switch`] is
//! armed for one step; the instant is a random fraction of the step's
//! duration as last measured without a fault ([`Timings`]), so that kills
//! spread over the whole step rather than land before it starts or after it
//! ended. A step that ends before its instant is not killed, and the switch
//! stays armed for the next time that step comes.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::kubelet::Call;

/// The last duration of each step measured without a fault, by a key the
/// caller makes (the step and the volume's shape).
#[derive(Debug, Default)]
pub struct Timings(HashMap<String, Duration>);

impl Timings {
    pub fn record(&mut self, key: &str, took: Duration) {
        self.0.insert(key.to_string(), took);
    }

    /// The step's last duration, or `None` before it has been measured.
    pub fn last(&self, key: &str) -> Option<Duration> {
        self.0.get(key).copied()
    }

    /// `permille`/1000 of the step's last duration, or `None` before it has
    /// been measured.
    pub fn instant(&self, key: &str, permille: u64) -> Option<Duration> {
        let took = self.0.get(key)?;
        let nanos = took
            .as_nanos()
            .saturating_mul(u128::from(permille.min(999)))
            / 1000;
        Some(Duration::from_nanos(
            u64::try_from(nanos).unwrap_or(u64::MAX),
        ))
    }
}

/// Runs `step`; if it is still running `at` after it started, calls `kill`
/// (which kills a process) and waits for the step to end. Says whether the
/// kill happened, and how long the step took.
async fn strike<T, F, K>(step: F, at: Duration, kill: K) -> (T, bool, Duration)
where
    F: Future<Output = T>,
    K: AsyncFnOnce(),
{
    let started = Instant::now();
    let mut step = std::pin::pin!(step);
    tokio::select! {
        biased;
        done = &mut step => return (done, false, started.elapsed()),
        () = tokio::time::sleep_until(started + at) => {}
    }
    kill().await;
    let done = step.await;
    (done, true, started.elapsed())
}

/// A kill that landed inside its step: when, and the step's duration last
/// measured without a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Landed {
    pub at: Duration,
    pub of: Duration,
}

/// Kills inside one step of a volume's life, once per trial.
#[derive(Debug, Default)]
pub struct Switch {
    timings: Mutex<Timings>,
    /// The step armed, and where in it the kill lands (thousandths).
    armed: Mutex<Option<(Call, u64)>>,
    landed: Mutex<Option<Landed>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Switch {
    /// Arms a kill `permille`/1000 into the next `step` whose duration is known.
    pub fn arm(&self, step: Call, permille: u64) {
        *lock(&self.armed) = Some((step, permille));
        *lock(&self.landed) = None;
    }

    /// Whether the kill is armed and has not landed yet.
    pub fn pending(&self) -> bool {
        lock(&self.armed).is_some() && lock(&self.landed).is_none()
    }

    /// Disarms the switch; the kill, if it landed.
    pub fn disarm(&self) -> Option<Landed> {
        *lock(&self.armed) = None;
        lock(&self.landed).take()
    }

    /// Makes one attempt of `call`; `keys` name its step for the timings:
    /// its own, and one to use while that has not been measured. The armed
    /// step, once its duration is known, is struck at its instant with
    /// `kill` (which kills a process); any other attempt before the kill is
    /// timed.
    pub async fn around<T, E, K>(
        &self,
        call: Call,
        [key, fallback]: &[String; 2],
        attempt: impl Future<Output = Result<T, E>>,
        kill: K,
    ) -> Result<T, E>
    where
        K: AsyncFnOnce(),
    {
        let target = {
            // One lock at a time: `pending` takes two of them.
            let armed = *lock(&self.armed);
            let pending = self.pending();
            let timings = lock(&self.timings);
            let measured = if timings.last(key).is_some() {
                key
            } else {
                fallback
            };
            match (armed, pending) {
                (Some((step, permille)), true) if step == call => {
                    match (timings.instant(measured, permille), timings.last(measured)) {
                        (Some(at), Some(of)) => Some(Landed { at, of }),
                        _ => None,
                    }
                }
                _ => None,
            }
        };
        let Some(landed) = target else {
            let started = Instant::now();
            let result = attempt.await;
            if result.is_ok() && lock(&self.landed).is_none() {
                lock(&self.timings).record(key, started.elapsed());
            }
            return result;
        };
        let (result, killed, took) = strike(attempt, landed.at, kill).await;
        if killed {
            *lock(&self.landed) = Some(landed);
        } else if result.is_ok() {
            // Ended before its instant: a measurement; the kill waits for
            // the next time this step comes.
            lock(&self.timings).record(key, took);
        }
        result
    }
}

/// How one trial ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The retried calls converged and nothing was left.
    Converged,
    /// A call kubelet would have gone on making for ever.
    Stuck,
    /// The calls converged but something was left behind.
    Leaked,
}

/// Counts of one cell (a process killed inside a step).
#[derive(Debug, Default, Clone, Copy)]
pub struct Cell {
    /// Kills that landed inside the step.
    pub kills: u64,
    /// Trials whose step ended before its instant each time: no kill, so
    /// no trial; counted apart, and not as converged.
    pub missed: u64,
    /// Trials whose kill landed and whose volume converged.
    pub converged: u64,
    pub stuck: u64,
    pub leaked: u64,
    pub data_errors: u64,
}

/// Every trial's outcome by the process killed and the step it was killed in.
#[derive(Debug, Default)]
pub struct Cells(BTreeMap<(String, String), Cell>);

impl Cells {
    /// A trial whose kill landed inside `step` (`killed`) or not. One
    /// without a kill proves nothing by converging; stuck, a leak or a
    /// data error is a defect whether or not the kill landed.
    pub fn count(
        &mut self,
        process: &str,
        step: &str,
        killed: bool,
        verdict: Verdict,
        data_errors: u64,
    ) {
        let cell = self.0.entry((process.into(), step.into())).or_default();
        if !killed {
            cell.missed += 1;
        } else {
            cell.kills += 1;
        }
        match verdict {
            Verdict::Converged if killed => cell.converged += 1,
            Verdict::Converged => {}
            Verdict::Stuck => cell.stuck += 1,
            Verdict::Leaked => cell.leaked += 1,
        }
        cell.data_errors += data_errors;
    }

    /// The cells (`process step`) that had trials but no landed kill: a
    /// run that promised them did not test them.
    pub fn unkilled(&self) -> Vec<String> {
        self.0
            .iter()
            .filter(|(_, c)| c.kills == 0)
            .map(|((process, step), _)| format!("{process} {step}"))
            .collect()
    }

    /// All trials of every cell.
    pub fn total(&self) -> Cell {
        self.0.values().fold(Cell::default(), |sum, c| Cell {
            kills: sum.kills + c.kills,
            missed: sum.missed + c.missed,
            converged: sum.converged + c.converged,
            stuck: sum.stuck + c.stuck,
            leaked: sum.leaked + c.leaked,
            data_errors: sum.data_errors + c.data_errors,
        })
    }

    /// The table: one line per cell, then the kills per process and per step.
    pub fn table(&self, title: &str) -> String {
        let mut out = format!(
            "{title}\n  {:<10} {:<10} {:>5} {:>6} {:>9} {:>5} {:>6} {:>11}\n",
            "process", "step", "kills", "missed", "converged", "stuck", "leaked", "data errors"
        );
        for ((process, step), c) in &self.0 {
            out += &format!(
                "  {process:<10} {step:<10} {:>5} {:>6} {:>9} {:>5} {:>6} {:>11}\n",
                c.kills, c.missed, c.converged, c.stuck, c.leaked, c.data_errors
            );
        }
        let mut by_process: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        let mut by_step: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for ((process, step), c) in &self.0 {
            for (key, map) in [(process, &mut by_process), (step, &mut by_step)] {
                let entry = map.entry(key.as_str()).or_default();
                entry.0 += c.kills;
                entry.1 += c.stuck;
            }
        }
        let line = |map: BTreeMap<&str, (u64, u64)>| {
            map.iter()
                .map(|(k, (kills, stuck))| format!("{k} {kills} ({stuck} stuck)"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let total = self.total();
        out += &format!("  kills by process: {}\n", line(by_process));
        out += &format!("  kills by step: {}\n", line(by_step));
        out += &format!(
            "  total: {} kills ({} trials missed their step), {} converged, {} stuck, {} leaked, {} data errors",
            total.kills,
            total.missed,
            total.converged,
            total.stuck,
            total.leaked,
            total.data_errors
        );
        out
    }
}
