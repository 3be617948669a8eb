//! Section 13: stage and unstage with a real Linux kernel as the host
//! against the emulator's tree. Two split stacks side by side: `vm`, whose
//! host is a QEMU guest (`local-up --host vm`: the node in the guest, SNAP's
//! functions hot-plugged into it), and `vm-tree`, the same stack on the
//! emulated tree. The same raw block volumes (AIO; NVMe and virtio-blk: no
//! mkfs, so the host's side is finding the device) are staged and unstaged
//! one at a time, alternating between the two so that background load hits
//! both alike; the ratio is of the two medians, from this one run.
//!
//! No target is judged: under TCG (the table says which accelerator ran)
//! the guest's kernel runs emulated, so the ratio says what hot-plug into a
//! real kernel, and TCG, cost here, not a BlueField host's timing.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use crate::csi::{Clients, Kind, parameters};
use crate::report::Report;
use crate::stack::{Stack, StackOptions};
use crate::stats::Summary;
use crate::table::{Table, ms};
use crate::{Args, Work};

/// One host's stage and unstage of one emulation.
#[derive(Debug, Clone, Serialize)]
pub struct HostRow {
    pub emulation: String,
    pub stage_guest: Summary,
    pub stage_tree: Summary,
    pub unstage_guest: Summary,
    pub unstage_tree: Summary,
}

/// Everything section 13 reports.
#[derive(Debug, Clone, Serialize)]
pub struct GuestHost {
    pub volumes: usize,
    /// The guest's kernel, and how QEMU ran it.
    pub kernel: String,
    pub accelerator: String,
    pub rows: Vec<HostRow>,
}

const EMULATIONS: [&str; 2] = ["nvme", "virtio-blk"];

/// Section 13: its two stacks, started here and stopped before it returns.
pub async fn run(args: &Args, work: &Work, report: &mut Report) -> anyhow::Result<()> {
    // The guest sees this machine's / but has its own /tmp (where the
    // bench's work directory is): its stack goes under the target directory.
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
    let visible = tempfile::tempdir_in(&target)
        .with_context(|| format!("a directory in {}", target.display()))?;
    let guest_options = StackOptions {
        guest_host: true,
        ..Default::default()
    };
    let tree_options = StackOptions {
        split: true,
        ..Default::default()
    };
    let guest = Stack::start(
        "vm",
        &args.local_up,
        &args.profile,
        visible.path().join("stack-vm"),
        work.dir.path(),
        &guest_options,
    )
    .await?;
    let tree = crate::start(args, work, "vm-tree", &tree_options).await?;
    let host = guest.guest.as_ref().context("the vm stack's guest")?;
    let accelerator = accelerator(&guest)?;
    let kernel = host.kernel.clone();
    let exec = host.exec.clone();
    let mut on_guest = Clients::connect(&guest.controller, &guest.node).await?;
    let mut on_tree = Clients::connect(&tree.controller, &tree.node).await?;

    let mut rows = Vec::new();
    for emulation in EMULATIONS {
        let mut taken: [Vec<Duration>; 4] = Default::default();
        for i in 0..args.guest_volumes {
            for on_vm in [i % 2 == 0, i % 2 != 0] {
                let (clients, stack) = if on_vm {
                    (&mut on_guest, &guest)
                } else {
                    (&mut on_tree, &tree)
                };
                let name = format!(
                    "vm-{emulation}-{i}-{}",
                    if on_vm { "guest" } else { "tree" }
                );
                let volume = clients
                    .create_with(
                        &stack.kubelet,
                        &name,
                        &Kind::Block,
                        args.scale_size_mib,
                        parameters("aio", emulation, None),
                    )
                    .await?;
                if on_vm {
                    volume.make_dirs_in_guest(&exec)?;
                }
                let started = Instant::now();
                clients.stage(&volume).await?;
                taken[usize::from(!on_vm)].push(started.elapsed());
                let started = Instant::now();
                clients.unstage(&volume).await?;
                taken[2 + usize::from(!on_vm)].push(started.elapsed());
                clients.delete(&volume).await?;
            }
        }
        let [stage_guest, stage_tree, unstage_guest, unstage_tree] =
            taken.map(|times| Summary::of(&times));
        rows.push(HostRow {
            emulation: emulation.to_string(),
            stage_guest,
            stage_tree,
            unstage_guest,
            unstage_tree,
        });
    }
    drop((on_guest, on_tree));
    report.guest_host = Some(GuestHost {
        volumes: args.guest_volumes,
        kernel,
        accelerator,
        rows,
    });
    report.print_guest_host();
    report.save(args)?;
    crate::stop(guest, report)?;
    crate::stop(tree, report)
}

/// How QEMU ran the guest, as snap-csi-guest printed it (its GUEST_ACCEL,
/// whether KVM could not boot it or SNAP_CSI_GUEST_ACCEL chose).
fn accelerator(stack: &Stack) -> anyhow::Result<String> {
    let text =
        std::fs::read_to_string(stack.dir.join("logs/guest.log")).context("the guest's log")?;
    text.lines()
        .find_map(|line| line.strip_prefix("GUEST_ACCEL="))
        .map(str::to_uppercase)
        .context("the guest's log names no GUEST_ACCEL")
}

impl Report {
    /// Section 13.
    pub fn print_guest_host(&self) {
        let Some(g) = &self.guest_host else {
            return;
        };
        println!();
        println!(
            "13. Stage and unstage on a real Linux kernel against the emulated tree (ms; {} raw \
             block volumes of each emulation on each, alternating; kernel {}, {})",
            g.volumes, g.kernel, g.accelerator
        );
        let mut table = Table::new(&["rpc", "emulation", "n", "guest p50", "tree p50", "x"]);
        for r in &g.rows {
            for (rpc, guest, tree) in [
                ("NodeStage", &r.stage_guest, &r.stage_tree),
                ("NodeUnstage", &r.unstage_guest, &r.unstage_tree),
            ] {
                table.row(vec![
                    rpc.to_string(),
                    r.emulation.clone(),
                    guest.samples.to_string(),
                    ms(guest.p50_ms),
                    ms(tree.p50_ms),
                    format!("{:.1}", guest.p50_ms / tree.p50_ms.max(f64::MIN_POSITIVE)),
                ]);
            }
        }
        table.print();
        println!(
            "   (split mode both; the guest's functions hot-plugged through QMP into its root \
             ports; no target judged: the ratio is one run's, under the accelerator above)"
        );
    }
}
