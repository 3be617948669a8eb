//! Section 7: density with the packed placement policy. One stack whose DPU
//! emulator has NVMe functions enough for `--packed-volumes` block volumes
//! at the node's `--namespaces-per-controller`; at each concurrency
//! level every volume is created with the StorageClass parameter
//! `snap-csi.io/placement`, then staged (stage only: density is what is
//! measured, and a publish is a bind mount), each in its own task behind a
//! semaphore; with all of them staged the node's peak RSS (VmHWM) and how
//! SNAP holds them (controllers, subsystems, namespaces: a packed run that
//! gave each volume a controller of its own would show here); then every
//! one is unstaged at the same concurrency and deleted. The SNAP round trips
//! of a single stage are counted apart, by the emulator's own counter
//! (`trips.rs`).

use std::time::Duration;

use anyhow::bail;
use serde::Serialize;
use snap_csi::jsonrpc::RpcClient;
use snap_csi::spdk::snap::{NvmeControllerList, NvmeSubsystemList};

use crate::csi::Clients;
use crate::memory::{self, Rss};
use crate::prom::{Outbound, scrape};
use crate::report::{Report, print_methods};
use crate::scale::{self, ByMethod, method_means};
use crate::stack::{Stack, StackOptions};
use crate::stats::{Summary, Verdict};
use crate::table::{Table, ms};
use crate::targets::Target;
use crate::{Args, Work, start, stop};

/// One concurrency level: every volume staged, then unstaged.
#[derive(Debug, Clone, Serialize)]
pub struct DensityRound {
    pub concurrency: usize,
    pub volumes: usize,
    /// Creating every volume first (not part of the figures).
    pub create_wall_s: f64,
    pub stage_wall_s: f64,
    pub stage_per_s: f64,
    pub stage: Summary,
    pub unstage_wall_s: f64,
    pub unstage_per_s: f64,
    pub unstage: Summary,
    /// The node with every volume staged (VmHWM: its peak so far), and
    /// after every one was unstaged (the unstages' peak included).
    pub node_staged: Rss,
    pub node_unstaged: Rss,
    /// SNAP with every volume staged.
    pub held: Held,
    /// The DPU attach layer's SNAP calls during the stages, by method.
    pub stage_methods: ByMethod,
    /// Per stage, means: the node's clock, its SNAP and plugin calls'
    /// summed time, its host work (the wait for the disk above all) and its
    /// own work (its clock minus the time any of those was in progress).
    pub stage_node_ms: f64,
    pub stage_snap_ms: f64,
    pub stage_plugin_ms: f64,
    pub stage_host_ms: f64,
    pub stage_own_ms: f64,
}

/// How SNAP holds the staged volumes.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Held {
    pub controllers: usize,
    pub subsystems: usize,
    pub namespaces: usize,
}

/// Everything section 7 reports.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Density {
    pub placement: String,
    pub volumes: usize,
    pub namespaces_per_controller: u32,
    /// NVMe functions the emulator offered.
    pub functions: u32,
    pub node_idle: Rss,
    pub rounds: Vec<DensityRound>,
    /// The round trips of one stage, counted by the emulator.
    pub trips: Option<crate::trips::Trips>,
}

/// PFs and VFs per PF for at least `functions` NVMe functions (two PFs, as
/// a BlueField exposes them).
pub fn nvme_layout(functions: u32) -> (u32, u32) {
    let pfs = 2u32;
    (pfs, functions.div_ceil(pfs).saturating_sub(1).max(1))
}

/// The functions the density run needs: one pool controller per
/// `namespaces_per_controller` volumes packed, one per volume dedicated;
/// and a few spare, as a node would have.
fn functions_needed(args: &Args) -> anyhow::Result<u32> {
    let volumes = u32::try_from(args.packed_volumes)?;
    let controllers = match args.packed_placement.as_str() {
        "packed" => volumes.div_ceil(args.packed_namespaces_per_controller.max(1)),
        _ => volumes,
    };
    Ok(controllers + 2)
}

/// SNAP's controllers, subsystems and attached namespaces now.
async fn held(stack: &Stack) -> anyhow::Result<Held> {
    let snap = RpcClient::with_timeout(stack.snap_socket(), Duration::from_secs(30));
    let controllers = snap.call(&NvmeControllerList {}).await?.len();
    let subsystems = snap.call(&NvmeSubsystemList {}).await?;
    Ok(Held {
        controllers,
        subsystems: subsystems.len(),
        namespaces: subsystems.iter().map(|s| s.namespaces.len()).sum(),
    })
}

async fn round(
    args: &Args,
    stack: &Stack,
    clients: &Clients,
    concurrency: usize,
) -> anyhow::Result<DensityRound> {
    eprintln!(
        "bench: section 7: {} block volumes, placement {}, at concurrency {concurrency}",
        args.packed_volumes, args.packed_placement
    );
    let (volumes, create_wall) = scale::create(
        clients,
        &stack.kubelet,
        &format!("dense-c{concurrency}"),
        args.packed_volumes,
        args.scale_size_mib,
        Some(&args.packed_placement),
    )
    .await?;
    let before = scrape(&stack.node_metrics).await?;
    let (stages, stage_wall) = scale::each_call(clients, &volumes, concurrency, false).await?;
    let after = scrape(&stack.node_metrics).await?;
    let node_staged = memory::node(stack)?;
    let held = held(stack).await?;
    // Every staged volume is one namespace, whatever the placement: the
    // figures are of what was asked for, or of nothing.
    if held.namespaces != volumes.len() {
        bail!(
            "SNAP holds {} namespaces with {} volumes staged",
            held.namespaces,
            volumes.len()
        );
    }
    let (unstages, unstage_wall) = scale::each_call(clients, &volumes, concurrency, true).await?;
    let node_unstaged = memory::node(stack)?;
    scale::delete(clients, &volumes).await?;
    let rate = |wall: Duration| volumes.len() as f64 / wall.as_secs_f64();
    let node = Outbound::of(&after).since(&Outbound::of(&before));
    let per_stage = |seconds: f64| seconds * 1e3 / volumes.len().max(1) as f64;
    Ok(DensityRound {
        concurrency,
        volumes: volumes.len(),
        create_wall_s: create_wall.as_secs_f64(),
        stage_wall_s: stage_wall.as_secs_f64(),
        stage_per_s: rate(stage_wall),
        stage: Summary::of(&stages),
        unstage_wall_s: unstage_wall.as_secs_f64(),
        unstage_per_s: rate(unstage_wall),
        unstage: Summary::of(&unstages),
        node_staged,
        node_unstaged,
        held,
        stage_methods: method_means(&before, &after, volumes.len()),
        stage_node_ms: per_stage(node.served_seconds),
        stage_snap_ms: per_stage(node.snap_seconds),
        stage_plugin_ms: per_stage(node.plugin_seconds),
        stage_host_ms: per_stage(node.host_seconds),
        stage_own_ms: per_stage(node.own_seconds),
    })
}

/// Section 7: the density rounds on their own stack, then the round trips.
pub async fn run(args: &Args, work: &Work, report: &mut Report) -> anyhow::Result<()> {
    let functions = functions_needed(args)?;
    let options = StackOptions {
        nvme_functions: Some(nvme_layout(functions)),
        namespaces_per_controller: Some(args.packed_namespaces_per_controller),
        ..StackOptions::default()
    };
    let stack = start(args, work, "p", &options).await?;
    let clients = Clients::connect(&stack.controller, &stack.node).await?;
    let mut density = Density {
        placement: args.packed_placement.clone(),
        volumes: args.packed_volumes,
        namespaces_per_controller: args.packed_namespaces_per_controller,
        functions,
        node_idle: memory::node(&stack)?,
        ..Density::default()
    };
    for &concurrency in &args.packed_concurrency {
        density
            .rounds
            .push(round(args, &stack, &clients, concurrency).await?);
        report.density = Some(density.clone());
        report.save(args)?;
    }
    drop(clients);
    stop(stack, report)?;
    eprintln!("bench: section 7: counting the SNAP round trips of one stage");
    density.trips = Some(crate::trips::count(args, work.dir.path()).await?);
    report.density = Some(density);
    report.print_density();
    report.save(args)
}

/// The node's peak RSS allowed with the section's volumes staged (issue 13:
/// 1024 packed volumes).
const RSS_TARGET_MIB: f64 = 32.0;

/// The dependent round trips a packed stage onto a live pool may take: no
/// controller is created or resumed (issue 13).
const PACKED_STAGE_TRIPS: u64 = 3;

impl Report {
    /// Section 7.
    pub fn print_density(&self) {
        let Some(d) = &self.density else {
            return;
        };
        println!();
        println!(
            "7. Density: {} block volumes ({} MiB, NVMe, placement {}, {} namespaces per controller, {} NVMe functions)\n   staged on one node, each in its own task, at most N at a time; then unstaged",
            d.volumes,
            self.settings.scale_size_mib,
            d.placement,
            d.namespaces_per_controller,
            d.functions
        );
        let mut table = Table::new(&[
            "concurrency",
            "stage volumes/s",
            "stage p50 ms",
            "p99 ms",
            "unstage volumes/s",
            "unstage p50 ms",
            "p99 ms",
            "node peak MiB staged",
            "after unstage",
            "controllers",
            "subsystems",
            "namespaces",
            "create wall s",
        ]);
        for r in &d.rounds {
            table.row(vec![
                r.concurrency.to_string(),
                format!("{:.1}", r.stage_per_s),
                ms(r.stage.p50_ms),
                ms(r.stage.p99_ms),
                format!("{:.1}", r.unstage_per_s),
                ms(r.unstage.p50_ms),
                ms(r.unstage.p99_ms),
                format!("{:.1}", r.node_staged.peak_mib),
                format!("{:.1}", r.node_unstaged.peak_mib),
                r.held.controllers.to_string(),
                r.held.subsystems.to_string(),
                r.held.namespaces.to_string(),
                format!("{:.2}", r.create_wall_s),
            ]);
        }
        table.print();
        for r in &d.rounds {
            println!(
                "   c={}: a stage by the node's clock {} ms: SNAP calls {}, plugin calls {}, host work (the wait for the disk) {}, its own {} (means)",
                r.concurrency,
                ms(r.stage_node_ms),
                ms(r.stage_snap_ms),
                ms(r.stage_plugin_ms),
                ms(r.stage_host_ms),
                ms(r.stage_own_ms)
            );
        }
        println!(
            "   node: {:.1} MiB peak idle; peaks are VmHWM, so each column holds every peak before it",
            d.node_idle.peak_mib
        );
        print_methods(
            "SNAP calls during the stages",
            &d.rounds
                .iter()
                .map(|r| (r.concurrency, &r.stage_methods))
                .collect::<Vec<_>>(),
        );
        println!("   (calls per volume x mean ms per call)");
        if let Some(t) = &d.trips {
            println!(
                "   SNAP round trips of one volume, counted by the emulator's poller ({} us, replies on the next tick):",
                t.period_us
            );
            let mut table = Table::new(&["placement", "stage (attach)", "unstage (detach)"]);
            for (placement, attach, detach) in t.rows() {
                table.row(vec![placement.to_string(), list(attach), list(detach)]);
            }
            table.print();
        }
    }

    /// Section 7's targets.
    pub fn density_targets(&self) -> Vec<Target> {
        let mut targets = Vec::new();
        let Some(d) = &self.density else {
            return targets;
        };
        let peak = |of: fn(&DensityRound) -> f64| d.rounds.iter().map(of).reduce(f64::max);
        if let (Some(staged), Some(all)) = (
            peak(|r| r.node_staged.peak_mib),
            peak(|r| r.node_unstaged.peak_mib),
        ) {
            targets.push(Target {
                target: format!(
                    "node peak RSS < {RSS_TARGET_MIB} MiB with {} {} volumes staged",
                    d.volumes, d.placement
                ),
                measured: format!("{staged:.1} MiB"),
                verdict: Verdict::in_release(self.release(), staged < RSS_TARGET_MIB),
            });
            // The same bound over their unstage too: a peak is a peak.
            targets.push(Target {
                target: format!(
                    "node peak RSS < {RSS_TARGET_MIB} MiB through staging and unstaging them"
                ),
                measured: format!("{all:.1} MiB"),
                verdict: Verdict::in_release(self.release(), all < RSS_TARGET_MIB),
            });
        }
        if let Some((trips, live)) = d.trips.as_ref().and_then(|t| Some((t, t.packed_live()?))) {
            targets.push(Target {
                target: format!(
                    "packed NodeStage onto a live pool <= {PACKED_STAGE_TRIPS} dependent SNAP round trips"
                ),
                measured: format!(
                    "{live} (dedicated: {}; building a pool: {})",
                    list(&trips.dedicated_attach),
                    list(&trips.packed_attach[..1])
                ),
                verdict: Verdict::of(live <= PACKED_STAGE_TRIPS),
            });
        }
        targets
    }
}

/// Counts as `5, 5, 5`.
pub fn list(counts: &[u64]) -> String {
    counts
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
