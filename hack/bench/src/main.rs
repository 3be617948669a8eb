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
//! 4. scale: many block volumes staged and published at several concurrencies,
//!    and the node's metrics page with all of them staged;
//! 5. memory (peak RSS of the node and the proxy) and node restart time;
//! 6. the JSON-RPC client's throughput against a raw-socket client;
//! 7. density with the packed placement: many block volumes staged on one
//!    node at concurrency 1 and 64, the node's peak RSS, and the SNAP round
//!    trips of one stage counted by the emulator against a dedicated one;
//! 8. stage and unstage with and without encryption, and their dependent
//!    SNAP round trips counted by the emulator (`encryption.rs`);
//! 9. the emulator's FUSE data path against the direct one: O_DIRECT
//!    throughput and IOPS of a staged volume's host device (`datapath.rs`);
//! 10. filesystem devices (virtio-fs): stage and unstage against a block
//!     volume's, and metadata and data rates through the host's mount
//!     against the backing directory (`filesystem.rs`);
//! 11. a path failover's stall: a multipath NVMe-oF volume's current path
//!     cut on the target while the host writes it, the longest write, the
//!     path's return, every block read back (`failover.rs`);
//! 12. stage time on a host with two DPUs against a host with one: a batch
//!     of block volumes staged at once and one at a time on each, and how
//!     the two-DPU host spread them over its DPUs (`two_dpus.rs`);
//! 13. stage and unstage with a real Linux kernel (a QEMU guest) as the
//!     host against the emulated tree (`guest.rs`).
//!
//! Timing targets are ratios against floors sampled in turns with what they
//! measure (`stats::Paired`), judged by a statistic that holds still under
//! load (a median) or bound on every sample; a run with too few samples or
//! repeats for one says "not judged" and counts it as not met, and the bench
//! exits non-zero on a target missed.
//! Targets, their thresholds and verdicts are in `targets.rs`.
//!
//! Stacks, one after the other: a (default emulator) for 1, 2, 3, 6, 8, 10 and 11; b
//! (poller at 8 ms) for 3 and 6; b2 (poller at 50 ms) to count dependent
//! round trips; c (an NVMe function for every scale volume) for 4 and 5; d
//! (c with the poller at 8 ms) for 4 again. b, c and d each have a split
//! twin (`b-split`, ...: the node reaching a DPU agent over mutual TLS, see
//! `split.rs`) up beside them, the work alternating between the two
//! (`--no-split` leaves them out); p (functions for the packed volumes'
//! pool controllers) for 7, whose round trips are counted on an emulator in
//! this process (`trips.rs`, as are section 8's); io-direct and io-fuse
//! (`--data-path direct` and `fuse`, side by side) for 9; dpu1 and dpu2
//! (one DPU and two, the poller on, side by side) for 12, then their split
//! twins (`dpu1-split`, `dpu2-split`); vm (the host a QEMU guest) and
//! vm-tree (its split twin on the tree) for 13. Each is stopped and checked
//! for leftovers (loop devices, mounts, its directory, a split stack's
//! network namespace and veth, a guest's link) before the next starts; Ctrl-C or an error drops the
//! running ones, which stops them. Run as root: `./hack/bench.sh`.

mod datapath;
mod encryption;
mod failover;
mod filesystem;
mod floors;
mod guest;
mod latency;
mod memory;
mod packed;
mod probe;
mod prom;
mod report;
mod rounds;
mod rpc;
mod scale;
mod scrape;
mod split;
mod stats;
mod table;
mod targets;
mod trips;
mod two_dpus;

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Parser;
use snap_csi_harness::{csi, stack};

use crate::report::Report;
use crate::stack::{Stack, StackOptions};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Benchmarks the snap-csi stack on the SNAP emulator against floors measured in the same run"
)]
pub struct Args {
    /// Volumes of each kind (block, filesystem) for the latency section,
    /// and of each kind (plain, encrypted) for section 8.
    #[arg(long, default_value_t = 64)]
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
    /// Volumes of each kind for the poller-on latency run (and its split
    /// twin: a call starts at a random phase of the poller, so p50 needs
    /// samples).
    #[arg(long, default_value_t = 32)]
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
    /// Size of each scale-section volume in MiB (and section 12's).
    #[arg(long, default_value_t = 64)]
    pub scale_size_mib: i64,
    /// Rounds at each concurrency level on each scale stack (pooled; with
    /// split twins each pair runs in turn: co-located, split, split, co-located).
    /// Its targets are judged by the median round, over 6 or more.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..))]
    pub scale_repeats: u32,
    /// Concurrency levels of the scale section, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    pub concurrency: Vec<usize>,
    /// Node restarts in section 5, each timed from process start to Probe
    /// ready (the target bounds each, and is met over 6 or more).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..))]
    pub restarts: u32,
    /// Seconds per JSON-RPC client throughput run.
    #[arg(long, default_value_t = 1.0)]
    pub rpc_seconds: f64,
    /// Repeats of each JSON-RPC throughput run (the target is judged by
    /// the median repeat, over 6 or more).
    #[arg(long, default_value_t = 6)]
    pub rpc_repeats: usize,
    /// Skip section 4's second run, with the emulator's poller on.
    #[arg(long)]
    pub no_scale_poll: bool,
    /// Skip the split-mode twins of the stacks of sections 3, 4 and 5, and
    /// section 12's split pair.
    #[arg(long)]
    pub no_split: bool,
    /// Block volumes staged at once on one node in section 7.
    #[arg(long, default_value_t = 1024)]
    pub packed_volumes: usize,
    /// Concurrency levels of section 7, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    pub packed_concurrency: Vec<usize>,
    /// The placement of section 7's volumes (its StorageClass parameter).
    #[arg(long, default_value = "packed", value_parser = ["packed", "dedicated"])]
    pub packed_placement: String,
    /// The node's `--namespaces-per-controller` in section 7.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    pub packed_namespaces_per_controller: u32,
    /// Seconds of each workload on each data path in section 9.
    #[arg(long, default_value_t = 1.0)]
    pub io_seconds: f64,
    /// Path failovers in section 11, each the current path of a multipath
    /// volume cut while the host writes it (its stall target bounds each,
    /// and is met over 6 or more).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..))]
    pub failovers: u32,
    /// Silent path failovers in section 11 after those: the current path's
    /// packets dropped until the writes have gone on (its own stall
    /// target, met over 6 or more).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..))]
    pub silent_failovers: u32,
    /// Block volumes of section 12's batch, staged at once and then one at
    /// a time on a host with one DPU and on one with two.
    #[arg(long, default_value_t = 16)]
    pub dpu_volumes: usize,
    /// Repeats of section 12's batch on each host (its wall-time target is
    /// judged by the median repeat, over 6 or more).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..))]
    pub dpu_repeats: u32,
    /// Raw block volumes of each emulation staged in section 13 on a guest
    /// host and as many on the emulated tree.
    #[arg(long, default_value_t = 8)]
    pub guest_volumes: usize,
    /// Sections to run, comma separated: 1 latency, 2 floors, 3 SNAP round
    /// trips, 4 scale and the metrics scrape, 5 memory, 6 JSON-RPC client, 7
    /// density, 8 stage with and without encryption, 9 the FUSE data path
    /// against the direct one, 10 filesystem devices, 11 a path failover's
    /// stall, 12 stage time on a host with two DPUs against one, 13 stage
    /// time on a real kernel (a QEMU guest) against the emulated tree.
    /// Section 7 (about four minutes on the 2-core machine) runs only when
    /// named.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,3,4,5,6,8,9,10,11,12,13"
    )]
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
    let what = if stack.split.is_some() {
        "loop device, mount, directory, network namespace or veth"
    } else if stack.guest.is_some() {
        "loop device, mount, directory or guest's link"
    } else {
        "loop device, mount or directory"
    };
    let left = stack.stop();
    if left.0.is_empty() {
        report
            .cleanup
            .push(format!("stack {name}: stopped; no {what} left"));
        Ok(())
    } else {
        report.cleanup.extend(left.0.iter().cloned());
        bail!("stack {name} left behind:\n{}", left.0.join("\n"))
    }
}

async fn run(args: &Args, work: &Work, report: &mut Report) -> anyhow::Result<()> {
    if [1, 2, 3, 6, 8, 10, 11].iter().any(|&s| args.wants(s)) {
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
                Some(work.dir.path()),
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
        if args.wants(8) {
            eprintln!(
                "bench: section 8: {} block volumes plain and as many encrypted, one at a time",
                args.volumes
            );
            report.encryption = Some(encryption::run(args, work, &stack, &clients).await?);
            report.print_encryption();
            report.save(args)?;
        }
        if args.wants(10) {
            eprintln!(
                "bench: section 10: {} filesystem and as many block volumes, one at a time",
                args.volumes
            );
            report.filesystem = Some(filesystem::run(args, &stack, &clients).await?);
            report.print_filesystem();
            report.save(args)?;
        }
        if args.wants(11) {
            // Last on this stack: it cuts the target's listeners.
            eprintln!(
                "bench: section 11: {} path failovers of a multipath NVMe-oF volume, then {} silent",
                args.failovers, args.silent_failovers
            );
            failover::run(args, &stack, &clients, report).await?;
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
            poll_latency(args, work, report, &stack, &clients, &options).await?;
        }
        if args.wants(6) {
            // The comparison the SPDK reference makes: with the poller on,
            // calls wait for a tick and the client's own cost hides.
            eprintln!("bench: section 6: the JSON-RPC client with the poller on");
            let levels = rpc::run(
                &stack.snap_socket(),
                &[1, 64],
                std::time::Duration::from_secs_f64(args.rpc_seconds),
                args.rpc_repeats,
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
            None,
        )
        .await?;
        report.counted = Some(rows);
        report.print_poll();
        report.print_split_poll();
        report.save(args)?;
        drop(clients);
        stop(stack, report)?;
    }
    if args.wants(4) || args.wants(5) {
        rounds::scale_and_memory(args, work, report).await?;
    }
    if args.wants(4) && !args.no_scale_poll {
        rounds::scale_with_poller(args, work, report).await?;
    }
    if args.wants(7) {
        packed::run(args, work, report).await?;
    }
    if args.wants(9) {
        datapath::run(args, work, report).await?;
    }
    if args.wants(12) {
        two_dpus::run(args, work, report).await?;
    }
    if args.wants(13) {
        eprintln!(
            "bench: section 13: {} raw block volumes of each emulation on a guest host and on the tree",
            args.guest_volumes
        );
        guest::run(args, work, report).await?;
    }
    Ok(())
}

/// Section 3 with the poller on: stack b's rows and, unless `--no-split`,
/// those of its split twin, the volumes alternating between the two; the
/// twin's TLS handshakes over its whole life.
async fn poll_latency(
    args: &Args,
    work: &Work,
    report: &mut Report,
    stack: &Stack,
    clients: &csi::Clients,
    options: &StackOptions,
) -> anyhow::Result<()> {
    eprintln!(
        "bench: section 3: {} volumes of each kind with the poller at {} us{}",
        args.poll_volumes,
        args.poll_period_us,
        if args.no_split {
            ""
        } else {
            ", co-located and split side by side"
        }
    );
    let twin = if args.no_split {
        None
    } else {
        let split = StackOptions {
            split: true,
            ..options.clone()
        };
        let twin = start(args, work, "b-split", &split).await?;
        let clients = csi::Clients::connect(&twin.controller, &twin.node).await?;
        Some((twin, clients))
    };
    let mut stacks = vec![(stack, clients)];
    stacks.extend(twin.as_ref().map(|(stack, clients)| (stack, clients)));
    let mut rows = latency::side_by_side(
        &stacks,
        args.poll_volumes,
        &args.fs,
        args.size_mib,
        "poll",
        None,
        None,
    )
    .await?
    .into_iter();
    report.poll = rows.next();
    report.split.poll = rows.next();
    if let Some((twin, clients)) = twin {
        report.split.poll_handshakes =
            Some(split::handshakes(&twin, "section 3, its whole life").await?);
        drop(clients);
        stop(twin, report)?;
    }
    Ok(())
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
    if args.sections.iter().any(|s| !(1..=13).contains(s)) {
        bail!("--sections takes numbers from 1 to 13");
    }
    if args.dpu_volumes == 0 {
        bail!("--dpu-volumes must be 1 or more");
    }
    if !args.io_seconds.is_finite() || args.io_seconds <= 0.0 {
        bail!("--io-seconds must be a number of seconds more than 0");
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
    let missed = report.print_targets();
    report.save(&args)?;
    if let Err(e) = outcome {
        let kept = work.dir.keep();
        bail!("{e:#}\n(logs kept in {})", kept.display());
    }
    // A target not judged is not met, and the summary says so; it is no
    // failure of the product, a miss is.
    if missed > 0 {
        bail!("{missed} target(s) missed (see the Targets table)");
    }
    Ok(())
}
