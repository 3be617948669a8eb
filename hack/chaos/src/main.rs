//! `snap-csi-chaos`, the chaos soak (`hack/chaos.sh`): the whole stack
//! (`hack/local-up.sh --supervise`, which restarts whatever dies) in round
//! after round, each round on a fresh stack of the next configuration
//! (co-located and split, SNAP answering at once and at real SPDK's 8 ms
//! poller period, a host with one DPU and one with two). In a round,
//! `--volumes` workers drive random lives on volumes of every backend (AIO,
//! NVMe-oF single-path or multipath), emulation (NVMe, virtio-blk),
//! placement (NVMe: dedicated or packed) and kind (block, ext4, xfs) at once
//! (`lifecycle`), each carrying a known pattern read back after every
//! restage (`data`), while faults strike at random (`faults`, and on a host
//! with two DPUs `dpu_down`; EBUSY holders are the workers'). At the end of
//! a round the faults stop, the target's paths must be whole again while
//! the last volumes live, the workers finish their volumes, and a census
//! (`census`) counts whatever is left; so does stopping the stack.
//!
//! Prints the faults by kind, then last `chaos: N operations, F faults, L
//! leaks, D data errors, R I/O refused (pod restarted)`, and exits non-zero when L or D is not zero, when
//! a call did not converge, when something it promised was not tested (a
//! fault not injected, a kind of fault that never fired, a kill-trial cell
//! without a landed kill), or when the stack itself failed (R, I/O a pod
//! had refused while its device was gone, is expected: see `lifecycle`). `--seed` repeats every random choice.

mod census;
mod data;
mod dpu_down;
mod faults;
mod lifecycle;
mod rng;
mod tally;
mod trials;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use snap_csi_harness::csi::Clients;
use snap_csi_harness::stack::{Stack, StackOptions};

use crate::dpu_down::Outages;
use crate::faults::{Deck, Injector, Kind};
use crate::lifecycle::Worker;
use crate::rng::Rng;
use crate::tally::Tally;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Random volume lives on the whole stack while its parts are killed, stalled and starved; then a census of leaks"
)]
struct Args {
    /// Seed of every random choice (default: from the clock; printed first).
    #[arg(long)]
    seed: Option<u64>,
    /// Time under chaos, summed over the rounds (starting and stopping each
    /// stack comes on top): seconds, or with a unit (90s, 10m, 8h).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    duration: Duration,
    /// How long one stack lives before the next configuration's (same units).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    round: Duration,
    /// Volumes in flight at once.
    #[arg(long, default_value_t = 6)]
    volumes: usize,
    /// Mean pause between two faults (same units).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    fault_interval: Duration,
    /// The node's namespaces per pool controller (packed placement): small,
    /// so that pool controllers fill up and new ones are opened under chaos.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    namespaces_per_controller: u32,
    /// Percent of unpublishes that meet a process holding the mount.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=100))]
    holder_percent: u64,
    /// Each call's deadline (kubelet's is 2 minutes; shorter finds hangs sooner).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    call_deadline: Duration,
    /// Modes to cycle through, comma separated (colocated, split).
    #[arg(long, value_delimiter = ',', default_value = "colocated,split")]
    modes: Vec<String>,
    /// SNAP's RPC poller periods to cycle through (µs; 0 answers at once,
    /// 8000 is real SPDK's pace).
    #[arg(long, value_delimiter = ',', default_value = "0,8000")]
    poll_periods_us: Vec<u64>,
    /// DPUs per host to cycle through, comma separated (1, 2: local-up
    /// `--dpus 2`, with DPU-down faults and no filesystem volumes). The
    /// kill trials' hosts have one.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    dpus: Vec<u8>,
    /// Kill trials per mode (after the rounds): each one volume's life with
    /// one process killed at a random instant inside one step, then a census.
    #[arg(long, default_value_t = 0)]
    kill_trials: usize,
    /// The processes kill trials kill, comma separated (node, plugin, snap,
    /// target: the NVMe-oF target, agent: split mode only).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "node,plugin,snap,target,agent"
    )]
    kill_processes: Vec<String>,
    /// The steps kill trials kill in, comma separated (stage, publish,
    /// unpublish, unstage).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "stage,publish,unpublish,unstage"
    )]
    kill_steps: Vec<String>,
    /// How long a kill trial's call may keep failing before the volume
    /// counts as stuck (same units).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    kill_patience: Duration,
    /// The stack launcher.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../local-up.sh"))]
    local_up: PathBuf,
    /// The cargo profile whose binaries local-up runs (built beforehand).
    #[arg(long, default_value = "release")]
    profile: String,
    /// Where each round's stack logs are copied (default: a new directory in /tmp).
    #[arg(long)]
    logs: Option<PathBuf>,
}

/// A stack's shape: the mode, SNAP's pace, and one DPU or two.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Configuration {
    split: bool,
    poll_period_us: u64,
    two_dpus: bool,
}

impl Configuration {
    /// Every combination, in the order the rounds take them: each pace and
    /// mode with each DPU count in turn, shifted by one count per pace, so
    /// that the first pass (the test command's four rounds) gives each mode
    /// and each pace both a one-DPU and a two-DPU host.
    fn all(args: &Args) -> anyhow::Result<Vec<Configuration>> {
        let mut shapes = Vec::new();
        for &poll_period_us in &args.poll_periods_us {
            for mode in &args.modes {
                let split = match mode.as_str() {
                    "colocated" => false,
                    "split" => true,
                    other => bail!("--modes: {other:?} is neither colocated nor split"),
                };
                shapes.push((split, poll_period_us));
            }
        }
        let mut counts = Vec::new();
        for &dpus in &args.dpus {
            match dpus {
                1 | 2 => counts.push(dpus == 2),
                other => bail!("--dpus: a host has 1 or 2 DPUs here, not {other}"),
            }
        }
        if shapes.is_empty() || counts.is_empty() {
            bail!("--modes, --poll-periods-us and --dpus leave no configuration");
        }
        let modes = args.modes.len();
        let mut all = Vec::new();
        for pass in 0..counts.len() {
            for (k, &(split, poll_period_us)) in shapes.iter().enumerate() {
                all.push(Configuration {
                    split,
                    poll_period_us,
                    two_dpus: counts[(k + k / modes + pass) % counts.len()],
                });
            }
        }
        Ok(all)
    }

    fn name(&self) -> String {
        let mode = if self.split { "split" } else { "colocated" };
        let dpus = if self.two_dpus { "two DPUs" } else { "one DPU" };
        format!("{mode}, SNAP poller {} us, {dpus}", self.poll_period_us)
    }
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a whole number and s, m or h"))?;
    let seconds = match unit {
        "s" => number,
        "m" => number.saturating_mul(60),
        "h" => number.saturating_mul(3600),
        _ => return Err(format!("{text:?}: the unit must be s, m or h")),
    };
    Ok(Duration::from_secs(seconds))
}

/// Rounds of `--round` until their time adds up to `--duration` (the last
/// one shorter); starting and stopping stacks comes on top, so that a seed
/// gives the same rounds however slow the machine.
async fn run(args: &Args, seed: u64, logs: &Path, tally: &Arc<Tally>) -> anyhow::Result<()> {
    let configurations = Configuration::all(args)?;
    if args.round.is_zero() {
        bail!("--round must be longer than 0 s");
    }
    let mut left = args.duration;
    let mut round = 0u64;
    let deck = Arc::new(Deck::default());
    let mut two_dpus = false;
    while !left.is_zero() {
        let length = left.min(args.round);
        left -= length;
        let index = usize::try_from(round).unwrap_or(0) % configurations.len();
        let configuration = &configurations[index];
        two_dpus |= configuration.two_dpus;
        one_round(
            args,
            (seed, logs, tally, &deck),
            round,
            configuration,
            length,
        )
        .await?;
        round += 1;
    }
    if round > 0 {
        promised_kinds(tally, two_dpus);
    }
    if args.kill_trials > 0 {
        // Configuration::all has checked the modes.
        for mode in &args.modes {
            let cells = trials::run(args, seed, logs, tally, mode == "split").await?;
            for cell in cells.unkilled() {
                tally.shortfall(format!("kill trials, {mode}: no kill landed inside {cell}"));
            }
            eprintln!(
                "{}",
                cells.table(&format!(
                    "chaos: kill trials, {mode} (kills: inside the step; missed: the step ended before its instant, no kill)"
                ))
            );
        }
    }
    Ok(())
}

/// Every kind of fault fired in the rounds (a DPU down where one had two
/// DPUs): one that never did is a shortfall, the rounds too short for it.
fn promised_kinds(tally: &Tally, two_dpus: bool) {
    let fired = tally.kinds();
    let names = Kind::ALL
        .map(Kind::name)
        .into_iter()
        .chain(two_dpus.then_some(dpu_down::DPU_DOWN));
    for name in names {
        if !fired.keys().any(|kind| kind.starts_with(name)) {
            let all: u64 = fired.values().sum();
            tally.shortfall(format!(
                "no {name} fault fired ({all} faults in all): the rounds were too short for it"
            ));
        }
    }
}

async fn one_round(
    args: &Args,
    (seed, logs, tally, deck): (u64, &Path, &Arc<Tally>, &Arc<Deck>),
    round: u64,
    configuration: &Configuration,
    length: Duration,
) -> anyhow::Result<()> {
    let name = format!("round{round}");
    eprintln!(
        "chaos: {name}: {} for {} s",
        configuration.name(),
        length.as_secs()
    );
    let before = tally.totals();
    let (stack, clients) = start_stack(args, (seed, logs, &name), configuration).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let outages = Arc::new(Outages::default());
    let workers: Vec<_> = (0..args.volumes)
        .map(|id| {
            let worker = Worker {
                id,
                clients: clients.clone(),
                kubelet: stack.kubelet.clone(),
                tally: tally.clone(),
                stop: stop.clone(),
                rng: Rng::fork(seed, round * 1000 + 1 + id as u64),
                holder_percent: args.holder_percent,
                backoff: lifecycle::BACKOFF,
                restages: None,
                kill: None,
                stack_dir: stack.dir.clone(),
                node_state_dir: stack.node_state_dir(),
                dpus: stack.dpu_parts(),
                outages: outages.clone(),
                pod_started: (std::time::Instant::now(), Vec::new()),
            };
            tokio::spawn(worker.run())
        })
        .collect();
    let injector = Injector {
        stack: &stack,
        clients: clients.clone(),
        tally: tally.clone(),
        stop: stop.clone(),
        rng: Rng::fork(seed, round * 1000),
        interval: args.fault_interval,
        paths: Vec::new(),
        outages,
        deck: deck.clone(),
    };
    let clock = async {
        tokio::time::sleep(length).await;
        stop.store(true, Ordering::Relaxed);
    };
    let finished = async {
        for worker in workers {
            worker.await.context("a worker panicked")?;
        }
        anyhow::Ok(())
    };
    let (paths, (), finished) = tokio::join!(injector.run(), clock, finished);
    finished?;

    keep_logs(&stack, &logs.join(&name));
    // Quiet: no fault in flight, every volume deleted. Each worker has one
    // volume at a time, which may be on either DPU.
    let max_pools = args
        .volumes
        .div_ceil(usize::try_from(args.namespaces_per_controller)?);
    let found = census::when_quiet(&stack, &clients, (max_pools, &paths), &name).await?;
    for leak in found.leaks {
        tally.leak(format!("{name}: {leak}"));
    }
    for kept in found.kept {
        tally.kept(&kept);
    }
    for leak in stack.stop().0 {
        tally.leak(format!("{name}: stopping the stack left {leak}"));
    }
    let after = tally.totals();
    eprintln!(
        "chaos: {name}: {} operations, {} faults, {} leaks, {} data errors, {} I/O refused (pod restarted), {} calls that did not converge",
        after.operations - before.operations,
        after.faults - before.faults,
        after.leaks - before.leaks,
        after.data_errors - before.data_errors,
        after.refused - before.refused,
        after.stuck - before.stuck,
    );
    for (what, (count, first)) in tally.take_detail() {
        let first = if first.is_empty() {
            String::new()
        } else {
            format!(" (first: {})", first.chars().take(300).collect::<String>())
        };
        eprintln!("chaos: {name}:   {what}: {count}{first}");
    }
    Ok(())
}

/// A fresh supervised stack named `name` of `configuration`, and its clients.
pub(crate) async fn start_stack(
    args: &Args,
    (seed, logs, name): (u64, &Path, &str),
    configuration: &Configuration,
) -> anyhow::Result<(Stack, Clients)> {
    let options = StackOptions {
        poll_period_us: configuration.poll_period_us,
        nvme_functions: None,
        split: configuration.split,
        supervise: true,
        namespaces_per_controller: Some(args.namespaces_per_controller),
        data_path: None,
        two_dpus: configuration.two_dpus,
        guest_host: false,
    };
    let stack_dir = std::env::temp_dir().join(format!("snap-csi-chaos-{seed}-{name}"));
    let stack = Stack::start(
        name,
        &args.local_up,
        &args.profile,
        stack_dir,
        logs,
        &options,
    )
    .await?;
    let mut clients = Clients::connect(&stack.controller, &stack.node).await?;
    clients.deadline = args.call_deadline;
    Ok((stack, clients))
}

/// The stack's own logs (local-up removes them with its directory), before
/// the census, whose failure ends the run.
pub(crate) fn keep_logs(stack: &Stack, to: &Path) {
    let from = stack.dir.join("logs");
    let Ok(read) = std::fs::read_dir(&from) else {
        return;
    };
    if std::fs::create_dir_all(to).is_err() {
        return;
    }
    for entry in read.flatten() {
        let _ = std::fs::copy(entry.path(), to.join(entry.file_name()));
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    let logs = args
        .logs
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("snap-csi-chaos-{seed}-logs")));
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    eprintln!(
        "chaos: seed {seed}, {} s, {} volumes at once, logs in {}",
        args.duration.as_secs(),
        args.volumes,
        logs.display()
    );
    let tally = Arc::new(Tally::default());
    // Ctrl-C or SIGTERM drops the run, and with it the stack (its Drop stops
    // local-up, which removes what it made).
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let outcome = tokio::select! {
        outcome = run(&args, seed, &logs, &tally) => outcome,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        _ = term.recv() => Err(anyhow::anyhow!("terminated")),
    };
    let totals = tally.totals();
    if let Err(error) = &outcome {
        eprintln!("chaos: the run stopped: {error:#}");
    }
    if totals.stuck > 0 {
        eprintln!("chaos: {} calls did not converge", totals.stuck);
    }
    if totals.shortfalls > 0 {
        eprintln!(
            "chaos: {} things the run promised were not tested (NOT TESTED lines above)",
            totals.shortfalls
        );
    }
    let kinds: Vec<String> = tally
        .kinds()
        .into_iter()
        .map(|(kind, count)| format!("{kind} {count}"))
        .collect();
    eprintln!("chaos: faults by kind: {}", kinds.join(", "));
    println!(
        "chaos: {} operations, {} faults, {} leaks, {} data errors, {} I/O refused (pod restarted)",
        totals.operations, totals.faults, totals.leaks, totals.data_errors, totals.refused
    );
    let failed = outcome.is_err()
        || totals.stuck > 0
        || totals.leaks > 0
        || totals.data_errors > 0
        || totals.shortfalls > 0;
    std::process::exit(i32::from(failed));
}

#[cfg(test)]
mod tests {
    use super::{Args, Configuration, parse_duration};
    use clap::Parser;
    use std::time::Duration;

    #[test]
    fn the_first_four_rounds_give_each_mode_and_pace_both_hosts() {
        let all = Configuration::all(&Args::parse_from(["snap-csi-chaos"])).unwrap();
        let names: Vec<String> = all.iter().map(Configuration::name).collect();
        assert_eq!(
            names[..4],
            [
                "colocated, SNAP poller 0 us, one DPU",
                "split, SNAP poller 0 us, two DPUs",
                "colocated, SNAP poller 8000 us, two DPUs",
                "split, SNAP poller 8000 us, one DPU",
            ]
        );
        assert_eq!(all.len(), 8);
        assert!(
            all.iter()
                .all(|c| all.iter().filter(|o| *o == c).count() == 1)
        );
        let two = Args::parse_from(["snap-csi-chaos", "--dpus", "2", "--modes", "split"]);
        assert!(
            Configuration::all(&two)
                .unwrap()
                .iter()
                .all(|c| c.two_dpus && c.split)
        );
        let three = Args::parse_from(["snap-csi-chaos", "--dpus", "3"]);
        assert!(Configuration::all(&three).is_err());
    }

    #[test]
    fn durations_take_seconds_minutes_and_hours() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("8h"), Ok(Duration::from_secs(28_800)));
        assert!(parse_duration("1.5h").is_err());
        assert!(parse_duration("h").is_err());
    }
}
