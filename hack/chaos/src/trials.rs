//! Kill trials (`--kill-trials N`): on a fresh stack of each mode, N volume
//! lives one at a time, each with one process killed with SIGKILL at a
//! random instant inside one step, then a census of everything a volume's
//! life makes. The processes are the node, the vendor plugin, SNAP, the
//! remote NVMe-oF target and, in split mode, the DPU agent (local-up
//! `--supervise` starts each again); the steps are stage, publish,
//! unpublish and unstage. Every (process, step) cell comes in turn, in an
//! order shuffled by the seed, on a volume of a random shape (as the
//! rounds': half the NVMe-oF ones multipath). kubelet's rules decide what
//! is retried and whether the volume is unstaged (`lifecycle`,
//! `snap_csi_harness::kubelet`).
//!
//! The instant is a random fraction of the step's duration for that shape
//! as last measured without a fault (each life restages once, so a trial
//! measures its own steps), and a step that ends before its instant is not
//! killed: the kill waits for the next time the volume takes that step. So
//! kills spread over the whole step, from its request to its answer. What
//! cannot be chosen is the step's inner point the instant lands on: a seed
//! replays the trials' script (cells, shapes, fractions), the machine's
//! timing the rest. A trial whose kill missed is no trial: its cell comes
//! again next (a few times), and a cell without a landed kill fails the
//! run.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use snap_csi_harness::kills::{Cells, Landed, Switch, Verdict};
use snap_csi_harness::kubelet::{Backoff, Call};
use snap_csi_harness::stack::read_pid;
use tokio::time::Instant;

use crate::Args;
use crate::faults::{restart_delay, successor};
use crate::lifecycle::{BACKOFF, Shape, Worker};
use crate::rng::Rng;
use crate::tally::Tally;

/// Kills one process inside one step of a worker's life, once per trial;
/// local-up `--supervise` starts it again.
#[derive(Debug)]
pub struct KillSwitch {
    /// The stack's directory, where local-up keeps each process's pid.
    dir: PathBuf,
    switch: Switch,
    victim: Mutex<Option<&'static str>>,
    /// The pid killed, once the kill has landed.
    killed: Mutex<Option<Pid>>,
}

/// The longest pause before a killed process is started again: its
/// successor arrives anywhere in a step and its retries (local-up's own
/// pause is 0.2 s; a real SNAP or pod takes from milliseconds to seconds).
const MAX_RESTART_DELAY_MS: u64 = 500;
/// How often a cell whose kill missed its step comes again at once, per
/// run; after that its misses only count (a cell never killed fails the
/// run).
const MISSES_RETRIED: u32 = 4;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl KillSwitch {
    fn new(dir: PathBuf) -> KillSwitch {
        KillSwitch {
            dir,
            switch: Switch::default(),
            victim: Mutex::default(),
            killed: Mutex::default(),
        }
    }

    /// Arms a kill of `victim` `permille`/1000 into `step`; local-up starts
    /// it again `restart` after.
    fn arm(
        &self,
        (victim, step): (&'static str, Call),
        permille: u64,
        restart: Duration,
    ) -> anyhow::Result<()> {
        let delay = restart_delay(&self.dir, victim);
        std::fs::write(&delay, format!("{:.3}", restart.as_secs_f64()))
            .with_context(|| format!("writing {}", delay.display()))?;
        *lock(&self.victim) = Some(victim);
        *lock(&self.killed) = None;
        self.switch.arm(step, permille);
        Ok(())
    }

    /// Disarms the switch; the kill and the pid it killed, if it landed.
    fn disarm(&self) -> Option<(Landed, Pid)> {
        if let Some(victim) = lock(&self.victim).take() {
            let _ = std::fs::remove_file(restart_delay(&self.dir, victim));
        }
        let landed = self.switch.disarm()?;
        Some((landed, lock(&self.killed).take()?))
    }

    /// Whether the kill is armed and has not landed yet.
    pub fn pending(&self) -> bool {
        self.switch.pending()
    }

    /// One attempt of `call` ([`Switch::around`]), whose victim is killed
    /// with SIGKILL if it is the armed step.
    pub async fn around<T>(
        &self,
        call: Call,
        keys: &[String; 2],
        attempt: impl Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<T> {
        self.switch
            .around(call, keys, attempt, async || {
                let Some(victim) = *lock(&self.victim) else {
                    return;
                };
                match read_pid(&self.dir, victim) {
                    Ok(pid) => match kill(pid, Signal::SIGKILL) {
                        Ok(()) => *lock(&self.killed) = Some(pid),
                        Err(e) => eprintln!("chaos: SIGKILL to {victim} ({pid}): {e}"),
                    },
                    Err(e) => eprintln!("chaos: no pid for {victim}: {e:#}"),
                }
            })
            .await
    }
}

/// Every (process, step) a trial may kill in: `--kill-processes` (the agent
/// only in split mode) by `--kill-steps`.
fn cells(args: &Args, split: bool) -> anyhow::Result<Vec<(&'static str, Call)>> {
    let mut victims = Vec::new();
    for name in &args.kill_processes {
        match name.as_str() {
            "node" => victims.push("node"),
            "plugin" => victims.push("plugin"),
            "snap" => victims.push("snap"),
            "target" => victims.push("target"),
            "agent" if split => victims.push("agent"),
            "agent" => {}
            other => {
                anyhow::bail!(
                    "--kill-processes: {other:?} is none of node, plugin, snap, target, agent"
                )
            }
        }
    }
    let mut steps = Vec::new();
    for name in &args.kill_steps {
        match Call::ALL.into_iter().find(|call| call.step() == name) {
            Some(call) => steps.push(call),
            None => anyhow::bail!(
                "--kill-steps: {name:?} is none of stage, publish, unpublish, unstage"
            ),
        }
    }
    let left_out: Vec<&str> = ["node", "plugin", "snap", "target", "agent"]
        .into_iter()
        .filter(|name| !victims.contains(name) && (split || *name != "agent"))
        .collect();
    if !left_out.is_empty() {
        // Never a silent skip: the run says which processes it spares.
        eprintln!(
            "chaos: kill trials NOT KILLING {}: left out by --kill-processes",
            left_out.join(", ")
        );
    }
    let every: Vec<_> = victims
        .iter()
        .flat_map(|&victim| steps.iter().map(move |&step| (victim, step)))
        .collect();
    if every.is_empty() {
        anyhow::bail!("--kill-processes and --kill-steps leave nothing to kill");
    }
    Ok(every)
}

/// `args.kill_trials` trials on a fresh stack (`split`: split mode);
/// every outcome is also counted in `tally`.
pub async fn run(
    args: &Args,
    seed: u64,
    logs: &Path,
    tally: &Arc<Tally>,
    split: bool,
) -> anyhow::Result<Cells> {
    let name = format!("kills-{}", if split { "split" } else { "colocated" });
    eprintln!("chaos: {name}: {} kill trials", args.kill_trials);
    let configuration = crate::Configuration {
        split,
        poll_period_us: 0,
        two_dpus: false,
    };
    let (stack, clients) = crate::start_stack(args, (seed, logs, &name), &configuration).await?;
    let switch = Arc::new(KillSwitch::new(stack.dir.clone()));
    let stream = if split { 2_000_000 } else { 1_000_000 };
    let mut rng = Rng::fork(seed, stream);
    let mut worker = Worker {
        id: 0,
        clients: clients.clone(),
        kubelet: stack.kubelet.clone(),
        tally: tally.clone(),
        stop: Arc::new(AtomicBool::new(false)),
        rng: Rng::fork(seed, stream + 1),
        holder_percent: 0,
        backoff: Backoff {
            patience: args.kill_patience,
            ..BACKOFF
        },
        restages: Some(1),
        kill: Some(switch.clone()),
        stack_dir: stack.dir.clone(),
        node_state_dir: stack.node_state_dir(),
        dpus: stack.dpu_parts(),
        outages: Arc::default(),
        pod_started: (std::time::Instant::now(), Vec::new()),
    };
    let every = cells(args, split)?;
    let mut order = Vec::new();
    let mut cells = Cells::default();
    let mut reported = HashSet::new();
    let mut missed = HashMap::new();
    let all_started = Instant::now();
    for trial in 1..=args.kill_trials {
        let started = Instant::now();
        if order.is_empty() {
            order = every.clone();
            rng.shuffle(&mut order);
        }
        let Some((victim, step)) = order.pop() else {
            break;
        };
        let shape = Shape::random(&mut rng, true);
        let permille = rng.range(0, 999);
        let restart = Duration::from_millis(rng.range(0, MAX_RESTART_DELAY_MS));
        switch.arm((victim, step), permille, restart)?;
        let before = tally.totals();
        worker.life(trial as u64, &shape).await;
        let fired = switch.disarm();
        if let Some((_, pid)) = fired
            && let Err(why) = successor(&stack, victim, pid).await
        {
            tally.stuck(why);
        }
        // One volume at a time: at most one pool.
        let found = crate::census::when_quiet(&stack, &clients, (1, &[]), &name).await?;
        for leak in found.leaks {
            if reported.insert(leak.clone()) {
                tally.leak(format!("{name} trial {trial}: {leak}"));
            }
        }
        let after = tally.totals();
        let verdict = if after.stuck > before.stuck {
            Verdict::Stuck
        } else if after.leaks > before.leaks {
            Verdict::Leaked
        } else {
            Verdict::Converged
        };
        let data_errors = after.data_errors - before.data_errors;
        cells.count(victim, step.step(), fired.is_some(), verdict, data_errors);
        // A fast step often ends before its instant: its cell comes again
        // next, a few times, so that it gets a landed kill.
        let misses = missed.entry((victim, step.step())).or_insert(0);
        if fired.is_none() && *misses < MISSES_RETRIED {
            *misses += 1;
            order.push((victim, step));
        }
        let what = match fired {
            Some((f, _)) => format!(
                "SIGKILL {victim} {:.1} ms into {} (measured {:.1} ms), restarted {} ms after",
                f.at.as_secs_f64() * 1e3,
                step.name(),
                f.of.as_secs_f64() * 1e3,
                restart.as_millis()
            ),
            None => format!(
                "no kill: {} ended before its instant each time",
                step.name()
            ),
        };
        eprintln!(
            "chaos: {name} trial {trial} ({shape}): {what}: {verdict:?} ({:.1} s)",
            started.elapsed().as_secs_f64()
        );
    }
    eprintln!(
        "chaos: {name}: {} trials in {:.0} s",
        args.kill_trials,
        all_started.elapsed().as_secs_f64()
    );
    crate::keep_logs(&stack, &logs.join(&name));
    for leak in stack.stop().0 {
        tally.leak(format!("{name}: stopping the stack left {leak}"));
    }
    Ok(cells)
}
