//! `snap-csi-bench`: the whole stack on the SNAP emulator, measured against
//! floors that the bench measures itself in the same run.
//!
//! It starts `hack/local-up.sh` (already built binaries, release profile),
//! plays external-provisioner and kubelet over real gRPC, prints one table
//! per section and writes everything as JSON (`--json`). Sections:
//!
//! 1. latency p50/p99 of each RPC of a volume's life;
//! 2. floors (bind mount, JSON-RPC round trip, empty gRPC round trip) and
//!    each RPC as a multiple of its floor;
//! 3. SNAP round trips per node RPC, and stage/unstage with the emulator's
//!    poller on (real SPDK's ~8 ms per sequential call) versus off;
//! 4. scale: many block volumes staged and published at several concurrencies;
//! 5. memory (peak RSS of the node and the proxy) and node restart time;
//! 6. the JSON-RPC client's throughput against a raw-socket client.
//!
//! Stacks, one after the other: a (default emulator) for 1, 2, 3 and 6; b
//! (poller at 8 ms) for 3 and 6; b2 (poller at 50 ms) to count dependent
//! round trips; c (an NVMe function for every scale volume) for 4 and 5; d
//! (c with the poller at 8 ms) for 4 again. Each is stopped and checked for
//! leftovers (loop devices, mounts, its directory) before the next starts;
//! Ctrl-C or an error drops the running one, which stops it. Run as root:
//! `./hack/bench.sh`.

mod csi;
mod floors;
mod latency;
mod memory;
mod prom;
mod report;
mod rpc;
mod scale;
mod stack;
mod stats;
mod table;

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Parser;

use crate::report::Report;
use crate::stack::{Stack, StackOptions};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Benchmarks the snap-csi stack on the SNAP emulator against floors measured in the same run"
)]
pub struct Args {
    /// Volumes of each kind (block, filesystem) for the latency section.
    #[arg(long, default_value_t = 32)]
    pub volumes: usize,
    /// Size of each latency-section volume in MiB (xfs needs 300).
    #[arg(long, default_value_t = 256)]
    pub size_mib: i64,
    /// Filesystem of the filesystem volumes.
    #[arg(long, default_value = "ext4")]
    pub fs: String,
    /// The emulator's RPC poller period for the poller-on runs (µs).
    #[arg(long, default_value_t = 8000)]
    pub poll_period_us: u64,
    /// Volumes of each kind for the poller-on latency run.
    #[arg(long, default_value_t = 8)]
    pub poll_volumes: usize,
    /// The poller period for counting dependent SNAP round trips (µs): long,
    /// so that host work and the emulator's own work fit in one period.
    #[arg(long, default_value_t = 50_000)]
    pub count_period_us: u64,
    /// Volumes of each kind for the counting run.
    #[arg(long, default_value_t = 4)]
    pub count_volumes: usize,
    /// Samples of each floor, interleaved with as many NodePublish and
    /// NodeUnpublish calls of each kind.
    #[arg(long, default_value_t = 500)]
    pub floor_iterations: usize,
    /// Block volumes staged and published at once in the scale section.
    #[arg(long, default_value_t = 256)]
    pub scale_volumes: usize,
    /// Size of each scale-section volume in MiB.
    #[arg(long, default_value_t = 64)]
    pub scale_size_mib: i64,
    /// Concurrency levels of the scale section, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    pub concurrency: Vec<usize>,
    /// Seconds per JSON-RPC client throughput run.
    #[arg(long, default_value_t = 1.0)]
    pub rpc_seconds: f64,
    /// Repeats of each JSON-RPC throughput run (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub rpc_repeats: usize,
    /// Skip section 4's second run, with the emulator's poller on.
    #[arg(long)]
    pub no_scale_poll: bool,
    /// Sections to run (1-6), comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5,6")]
    pub sections: Vec<u8>,
    /// Also write every figure as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The stack launcher.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../local-up.sh"))]
    pub local_up: PathBuf,
    /// The cargo profile whose binaries local-up runs (built beforehand).
    #[arg(long, default_value = "release")]
    pub profile: String,
}

impl Args {
    fn wants(&self, section: u8) -> bool {
        self.sections.contains(&section)
    }
}

/// Where the stacks and logs go; kept (and named) when the bench fails.
struct Work {
    dir: tempfile::TempDir,
}

impl Work {
    fn stack_dir(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("stack-{name}"))
    }
}

async fn start(
    args: &Args,
    work: &Work,
    name: &str,
    options: &StackOptions,
) -> anyhow::Result<Stack> {
    eprintln!("bench: starting stack {name} ({options:?})");
    Stack::start(
        name,
        &args.local_up,
        &args.profile,
        work.stack_dir(name),
        work.dir.path(),
        options,
    )
    .await
}

/// Stops `stack` and records what it left behind (an error if anything).
fn stop(stack: Stack, report: &mut Report) -> anyhow::Result<()> {
    let name = stack.name.clone();
    let left = stack.stop();
    if left.0.is_empty() {
        report.cleanup.push(format!(
            "stack {name}: stopped; no loop device, mount or directory left"
        ));
        Ok(())
    } else {
        report.cleanup.extend(left.0.iter().cloned());
        bail!("stack {name} left behind:\n{}", left.0.join("\n"))
    }
}

async fn run(args: &Args, work: &Work, report: &mut Report) -> anyhow::Result<()> {
    if [1, 2, 3, 6].iter().any(|&s| args.wants(s)) {
        let stack = start(args, work, "a", &StackOptions::default()).await?;
        let clients = csi::Clients::connect(&stack.controller, &stack.node).await?;
        // Sections 2 and 3 state their figures against section 1's rows.
        if [1, 2, 3].iter().any(|&s| args.wants(s)) {
            eprintln!(
                "bench: section 1: {} volumes of each kind, one at a time",
                args.volumes
            );
            let rows = latency::run(
                &stack,
                &clients,
                args.volumes,
                &args.fs,
                args.size_mib,
                "lat",
                None,
            )
            .await?;
            report.latency = Some(rows);
            report.print_latency();
            report.save(args)?;
        }
        if args.wants(2) {
            eprintln!("bench: section 2: floors");
            let floors = floors::run(
                &stack,
                &clients,
                work.dir.path(),
                &args.fs,
                args.size_mib,
                args.floor_iterations,
            )
            .await?;
            report.floors = Some(floors);
            report.print_floors();
            report.save(args)?;
        }
        if args.wants(3) {
            report.print_round_trips();
        }
        if args.wants(6) {
            eprintln!("bench: section 6: the JSON-RPC client against a raw socket");
            let levels = rpc::run(
                &stack.snap_socket(),
                &[1, 64],
                std::time::Duration::from_secs_f64(args.rpc_seconds),
                args.rpc_repeats,
            )
            .await?;
            report.jsonrpc = Some(levels);
            report.print_jsonrpc();
            report.save(args)?;
        }
        drop(clients);
        stop(stack, report)?;
    }
    if args.wants(3) || args.wants(6) {
        // The latency a real SPDK's poller adds, calls at a random phase.
        let options = StackOptions {
            poll_period_us: args.poll_period_us,
            ..Default::default()
        };
        let stack = start(args, work, "b", &options).await?;
        let clients = csi::Clients::connect(&stack.controller, &stack.node).await?;
        if args.wants(3) {
            eprintln!(
                "bench: section 3: {} volumes of each kind with the poller at {} us",
                args.poll_volumes, args.poll_period_us
            );
            let rows = latency::run(
                &stack,
                &clients,
                args.poll_volumes,
                &args.fs,
                args.size_mib,
                "poll",
                None,
            )
            .await?;
            report.poll = Some(rows);
        }
        if args.wants(6) {
            // The comparison the SPDK reference makes: with the poller on,
            // calls wait for a tick and the client's own cost hides.
            eprintln!("bench: section 6: the JSON-RPC client with the poller on");
            let levels = rpc::run(
                &stack.snap_socket(),
                &[1, 64],
                std::time::Duration::from_secs_f64(args.rpc_seconds),
                1,
            )
            .await?;
            report.jsonrpc_poll = Some(levels);
            report.print_jsonrpc_poll();
            report.save(args)?;
        }
        drop(clients);
        stop(stack, report)?;
    }
    if args.wants(3) {
        // Dependent round trips, counted in ticks of a long period.
        let options = StackOptions {
            poll_period_us: args.count_period_us,
            ..Default::default()
        };
        let stack = start(args, work, "b2", &options).await?;
        let clients = csi::Clients::connect(&stack.controller, &stack.node).await?;
        eprintln!(
            "bench: section 3: counting round trips, {} volumes of each kind, poller at {} us",
            args.count_volumes, args.count_period_us
        );
        let rows = latency::run(
            &stack,
            &clients,
            args.count_volumes,
            &args.fs,
            args.size_mib,
            "count",
            Some(std::time::Duration::from_micros(args.count_period_us)),
        )
        .await?;
        report.counted = Some(rows);
        report.print_poll();
        report.save(args)?;
        drop(clients);
        stop(stack, report)?;
    }
    if args.wants(4) || args.wants(5) {
        scale_and_memory(args, work, report).await?;
    }
    if args.wants(4) && !args.no_scale_poll {
        scale_with_poller(args, work, report).await?;
    }
    Ok(())
}

/// A stack whose DPU emulator has an NVMe function for every scale volume
/// (two PFs, with a few functions spare).
fn scale_options(args: &Args, poll_period_us: u64) -> anyhow::Result<StackOptions> {
    let pfs = 2u32;
    let functions = u32::try_from(args.scale_volumes + 8)?;
    let vfs = functions.div_ceil(pfs).saturating_sub(1).max(1);
    Ok(StackOptions {
        nvme_functions: Some((pfs, vfs)),
        poll_period_us,
    })
}

/// The first half of a scale round: every volume created, then staged and
/// published at `concurrency`, timed, with the node's metrics around it.
struct Staged {
    volumes: Vec<csi::Volume>,
    create_wall: std::time::Duration,
    times: Vec<(std::time::Duration, std::time::Duration)>,
    wall: std::time::Duration,
    node: prom::Outbound,
    methods: std::collections::BTreeMap<String, (f64, f64)>,
}

async fn stage_round(
    args: &Args,
    stack: &Stack,
    clients: &csi::Clients,
    concurrency: usize,
    prefix: &str,
) -> anyhow::Result<Staged> {
    let (volumes, create_wall) = scale::create(
        clients,
        &stack.kubelet,
        &format!("{prefix}-c{concurrency}"),
        args.scale_volumes,
        args.scale_size_mib,
    )
    .await?;
    let before = prom::scrape(&stack.node_metrics).await?;
    let (times, wall) = scale::stage_publish(clients, &volumes, concurrency).await?;
    let after = prom::scrape(&stack.node_metrics).await?;
    Ok(Staged {
        node: prom::Outbound::of(&after).since(&prom::Outbound::of(&before)),
        methods: scale::method_means(&before, &after, volumes.len()),
        volumes,
        create_wall,
        times,
        wall,
    })
}

/// The second half: unpublish and unstage at the same concurrency, delete.
async fn teardown_round(
    clients: &csi::Clients,
    staged: Staged,
    concurrency: usize,
) -> anyhow::Result<scale::Round> {
    let teardown_wall = scale::teardown(clients, &staged.volumes, concurrency).await?;
    scale::delete(clients, &staged.volumes).await?;
    Ok(scale::summarise(
        concurrency,
        staged.create_wall,
        &staged.times,
        staged.wall,
        &staged.node,
        teardown_wall,
        staged.methods,
    ))
}

/// Speed-ups over the round at concurrency 1, if there is one.
fn speedups(rounds: &mut [scale::Round]) {
    if let Some(base) = rounds
        .iter()
        .find(|r| r.concurrency == 1)
        .map(|r| r.volumes_per_s)
    {
        for round in rounds {
            round.speedup = Some(round.volumes_per_s / base);
        }
    }
}

/// Sections 4 and 5 on a stack with enough NVMe functions for every
/// volume at once: idle memory first, then each concurrency round; in the
/// last round, with every volume staged, the memory again and the node's
/// restart.
async fn scale_and_memory(args: &Args, work: &Work, report: &mut Report) -> anyhow::Result<()> {
    let mut stack = start(args, work, "c", &scale_options(args, 0)?).await?;
    let mut memory = memory::Memory::default();
    if args.wants(5) {
        memory.node_idle = memory::rss(memory::find("node", &stack.node_socket())?)?;
        memory.proxy_idle = memory::rss(memory::find("controller", &stack.controller_socket())?)?;
    }
    let rounds: Vec<usize> = if args.wants(4) {
        args.concurrency.clone()
    } else {
        vec![8]
    };
    let mut clients = csi::Clients::connect(&stack.controller, &stack.node).await?;
    let mut results = Vec::new();
    for (index, &concurrency) in rounds.iter().enumerate() {
        eprintln!(
            "bench: section 4: {} block volumes at concurrency {concurrency}",
            args.scale_volumes
        );
        let staged = stage_round(args, &stack, &clients, concurrency, "scale").await?;
        if args.wants(5) && index + 1 == rounds.len() {
            memory.staged_volumes = staged.volumes.len();
            memory.node_staged = memory::rss(memory::find("node", &stack.node_socket())?)?;
            memory.proxy_staged =
                memory::rss(memory::find("controller", &stack.controller_socket())?)?;
            eprintln!(
                "bench: section 5: restarting the node with {} volumes staged",
                staged.volumes.len()
            );
            let (ready, pid) = memory::restart_node(&mut stack, work.dir.path()).await?;
            memory.restart_ready_ms = Some(ready.as_secs_f64() * 1e3);
            memory.node_restarted = Some(memory::rss(pid)?);
            // The old connection went with the old process.
            clients = csi::Clients::connect(&stack.controller, &stack.node).await?;
            results.push(teardown_round(&clients, staged, concurrency).await?);
            memory.node_restarted_after_teardown = Some(memory::rss(pid)?);
        } else {
            results.push(teardown_round(&clients, staged, concurrency).await?);
        }
    }
    speedups(&mut results);
    if args.wants(4) {
        report.scale = Some(results);
        report.print_scale();
    }
    if args.wants(5) {
        report.memory = Some(memory);
        report.print_memory();
    }
    report.save(args)?;
    drop(clients);
    stop(stack, report)
}

/// Section 4 again with the DPU emulator's poller on: what the rounds look
/// like when SNAP answers as real SPDK does.
async fn scale_with_poller(args: &Args, work: &Work, report: &mut Report) -> anyhow::Result<()> {
    let stack = start(args, work, "d", &scale_options(args, args.poll_period_us)?).await?;
    let clients = csi::Clients::connect(&stack.controller, &stack.node).await?;
    let mut results = Vec::new();
    for &concurrency in &args.concurrency {
        eprintln!(
            "bench: section 4: {} block volumes at concurrency {concurrency}, poller at {} us",
            args.scale_volumes, args.poll_period_us
        );
        let staged = stage_round(args, &stack, &clients, concurrency, "scalepoll").await?;
        results.push(teardown_round(&clients, staged, concurrency).await?);
    }
    speedups(&mut results);
    report.scale_poll = Some(results);
    report.print_scale_poll();
    report.save(args)?;
    drop(clients);
    stop(stack, report)
}

/// Effective uid 0, from /proc (nix's `geteuid` needs a feature the rest of
/// the workspace does not build with).
fn is_root() -> anyhow::Result<bool> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let uids = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .context("no Uid line in /proc/self/status")?;
    Ok(uids.split_whitespace().nth(1) == Some("0"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !is_root()? {
        bail!("run as root: the stack makes loop devices and mounts");
    }
    if args.sections.iter().any(|s| !(1..=6).contains(s)) {
        bail!("--sections takes numbers from 1 to 6");
    }
    let work = Work {
        dir: tempfile::Builder::new()
            .prefix("snap-csi-bench.")
            .tempdir()
            .context("creating the work directory")?,
    };
    let mut report = Report::new(&args);
    // Ctrl-C or SIGTERM drops the run, and with it every stack (their Drop
    // stops local-up, which removes what it made).
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let outcome = tokio::select! {
        outcome = run(&args, &work, &mut report) => outcome,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        _ = term.recv() => Err(anyhow::anyhow!("terminated")),
    };
    report.print_targets();
    report.save(&args)?;
    if let Err(e) = outcome {
        let kept = work.dir.keep();
        bail!("{e:#}\n(logs kept in {})", kept.display());
    }
    Ok(())
}
