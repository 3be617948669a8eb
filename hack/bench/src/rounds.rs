//! Sections 4 and 5 as they run: stacks with an NVMe function for every
//! scale volume, each concurrency round on each of them (create, stage and
//! publish timed, unpublish and unstage, delete), and in the last round,
//! with every volume staged, the memory and the node's restart.
//!
//! Split mode is compared on a twin of the co-located stack, up at the same
//! time: each round runs on one, then on the other, each going first in
//! turn (A B, B A at each level with the default two repeats), so that
//! background load falls on both alike; never both at once. Repeated
//! rounds pool: a level's throughput is all its volumes over all its time.

use crate::csi::Clients;
use crate::memory::{Memory, restart_node, rss};
use crate::packed::nvme_layout;
use crate::prom::{Outbound, scrape};
use crate::report::Report;
use crate::scale::{self, Round, Staged};
use crate::split::{Handshakes, handshakes};
use crate::stack::{Stack, StackOptions};
use crate::{Args, Work, start, stop};

/// A stack whose DPU emulator has an NVMe function for every scale volume
/// (two PFs, with a few functions spare).
fn scale_options(args: &Args, poll_period_us: u64, split: bool) -> anyhow::Result<StackOptions> {
    Ok(StackOptions {
        nvme_functions: Some(nvme_layout(u32::try_from(args.scale_volumes + 8)?)),
        poll_period_us,
        split,
        ..StackOptions::default()
    })
}

/// The first half of a round on `stack`; SNAP and plugin calls counted
/// where they are made (the node co-located, the agent in split mode).
async fn stage_round(
    args: &Args,
    stack: &Stack,
    clients: &Clients,
    concurrency: usize,
    prefix: &str,
) -> anyhow::Result<Staged> {
    let (volumes, create_wall) = scale::create(
        clients,
        &stack.kubelet,
        &format!("{prefix}-c{concurrency}"),
        args.scale_volumes,
        args.scale_size_mib,
        None,
    )
    .await?;
    let layer = stack
        .split
        .as_ref()
        .map_or(&stack.node_metrics, |link| &link.metrics);
    let pages = || async { tokio::try_join!(scrape(&stack.node_metrics), scrape(layer)) };
    let (node_before, layer_before) = pages().await?;
    let (times, wall) = scale::stage_publish(clients, &volumes, concurrency).await?;
    let (node_after, layer_after) = pages().await?;
    Ok(Staged {
        node: Outbound::of(&node_after).since(&Outbound::of(&node_before)),
        layer: Outbound::of(&layer_after).since(&Outbound::of(&layer_before)),
        methods: scale::method_means(&layer_before, &layer_after, volumes.len()),
        volumes,
        create_wall,
        times,
        wall,
    })
}

/// The second half: unpublish and unstage at the same concurrency, delete.
async fn teardown_round(
    clients: &Clients,
    staged: Staged,
    concurrency: usize,
) -> anyhow::Result<Round> {
    let teardown_wall = scale::teardown(clients, &staged.volumes, concurrency).await?;
    scale::delete(clients, &staged.volumes).await?;
    Ok(scale::summarise(concurrency, staged, teardown_wall))
}

/// Speed-ups over the rounds at concurrency 1, if there are any.
fn speedups(rounds: &mut [Round]) {
    if let Some(base) = scale::pooled_rate(rounds, 1) {
        for round in rounds {
            round.speedup = Some(round.volumes_per_s / base);
        }
    }
}

/// One stack of a scale run and what was measured on it.
struct Side {
    stack: Stack,
    clients: Clients,
    rounds: Vec<Round>,
    memory: Memory,
    /// Split mode: the link's handshakes before the node's restart.
    handshakes: Option<Handshakes>,
}

impl Side {
    async fn start(
        args: &Args,
        work: &Work,
        name: &str,
        options: StackOptions,
    ) -> anyhow::Result<Side> {
        let stack = start(args, work, name, &options).await?;
        let clients = Clients::connect(&stack.controller, &stack.node).await?;
        let memory = if args.wants(5) {
            Memory::idle(&stack)?
        } else {
            Memory::default()
        };
        Ok(Side {
            stack,
            clients,
            rounds: Vec::new(),
            memory,
            handshakes: None,
        })
    }

    /// One round at `concurrency`; while every volume is staged, with
    /// `scrape` the node's metrics page, and with `measure` the memory, the
    /// link's handshakes, and the node's restart.
    async fn round(
        &mut self,
        args: &Args,
        work: &Work,
        concurrency: usize,
        prefix: &str,
        (scrape, measure): (bool, bool),
    ) -> anyhow::Result<()> {
        eprintln!(
            "bench: section 4: {} block volumes at concurrency {concurrency} on stack {}",
            args.scale_volumes, self.stack.name
        );
        let staged = stage_round(args, &self.stack, &self.clients, concurrency, prefix).await?;
        let scraped = match scrape {
            true => Some(crate::scrape::measure(&self.stack, staged.volumes.len()).await?),
            false => None,
        };
        if !measure {
            let mut round = teardown_round(&self.clients, staged, concurrency).await?;
            round.scrape = scraped;
            self.rounds.push(round);
            return Ok(());
        }
        self.memory.staged(&self.stack, staged.volumes.len())?;
        if self.stack.split.is_some() {
            let when = format!(
                "{} scale rounds, before the node's restart",
                self.rounds.len() + 1
            );
            self.handshakes = Some(handshakes(&self.stack, &when).await?);
        }
        eprintln!(
            "bench: section 5: restarting the node of stack {} {} times with {} volumes staged",
            self.stack.name,
            args.restarts,
            staged.volumes.len()
        );
        let mut pid = 0;
        for _ in 0..args.restarts {
            let (ready, started) = restart_node(&mut self.stack, work.dir.path()).await?;
            self.memory
                .restarts_ready_ms
                .push(ready.as_secs_f64() * 1e3);
            pid = started;
        }
        self.memory.node_restarted = Some(rss(pid)?);
        // The old connection went with the old process.
        self.clients = Clients::connect(&self.stack.controller, &self.stack.node).await?;
        let mut round = teardown_round(&self.clients, staged, concurrency).await?;
        round.scrape = scraped;
        self.rounds.push(round);
        self.memory.node_restarted_after_teardown = Some(rss(pid)?);
        Ok(())
    }
}

/// The co-located stack `name` and, unless `--no-split`, its split twin
/// `name-split`; every round at each of `levels` on each, the last one
/// measured when `measure`. Returns the sides, co-located first.
async fn run_sides(
    args: &Args,
    work: &Work,
    name: &str,
    poll_period_us: u64,
    levels: &[usize],
    measure: bool,
) -> anyhow::Result<Vec<Side>> {
    let mut sides = vec![
        Side::start(
            args,
            work,
            name,
            scale_options(args, poll_period_us, false)?,
        )
        .await?,
    ];
    if !args.no_split {
        let twin = format!("{name}-split");
        sides.push(
            Side::start(
                args,
                work,
                &twin,
                scale_options(args, poll_period_us, true)?,
            )
            .await?,
        );
    }
    let prefix = if poll_period_us > 0 {
        "scalepoll"
    } else {
        "scale"
    };
    // Each turn every side runs one round, the first side of a turn being
    // the next one each time: with two sides and two repeats, A B then B A
    // at every level.
    let mut turn = 0;
    for (index, &concurrency) in levels.iter().enumerate() {
        for repeat in 0..args.scale_repeats {
            let last = index + 1 == levels.len() && repeat + 1 == args.scale_repeats;
            for k in 0..sides.len() {
                let side = (turn + k) % sides.len();
                let at_last = (args.wants(4) && last, measure && last);
                sides[side]
                    .round(args, work, concurrency, prefix, at_last)
                    .await?;
            }
            turn += 1;
        }
    }
    for side in &mut sides {
        speedups(&mut side.rounds);
        if side.stack.split.is_some() && side.handshakes.is_none() {
            let when = format!("all {} scale rounds", side.rounds.len());
            side.handshakes = Some(handshakes(&side.stack, &when).await?);
        }
    }
    Ok(sides)
}

/// Stops each side's stack, recording what it left behind.
fn stop_sides(sides: Vec<Side>, report: &mut Report) -> anyhow::Result<()> {
    for side in sides {
        drop(side.clients);
        stop(side.stack, report)?;
    }
    Ok(())
}

/// Sections 4 and 5: idle memory first, then each concurrency round; in
/// the last round, with every volume staged, the memory again and the
/// node's restart.
pub async fn scale_and_memory(args: &Args, work: &Work, report: &mut Report) -> anyhow::Result<()> {
    let levels: Vec<usize> = if args.wants(4) {
        args.concurrency.clone()
    } else {
        vec![8]
    };
    let mut sides = run_sides(args, work, "c", 0, &levels, args.wants(5)).await?;
    let split = (sides.len() > 1).then(|| {
        let side = &mut sides[1];
        (
            std::mem::take(&mut side.rounds),
            std::mem::take(&mut side.memory),
            side.handshakes.take(),
        )
    });
    let colocated = &mut sides[0];
    if args.wants(4) {
        report.scale = Some(std::mem::take(&mut colocated.rounds));
        report.print_scale();
    }
    if args.wants(5) {
        report.memory = Some(std::mem::take(&mut colocated.memory));
        report.print_memory();
    }
    if let Some((rounds, memory, handshakes)) = split {
        report.split.scale_handshakes = handshakes;
        if args.wants(4) {
            report.split.scale = Some(rounds);
            report.print_split_scale();
        }
        if args.wants(5) {
            report.split.memory = Some(memory);
            report.print_split_memory();
        }
    }
    report.save(args)?;
    stop_sides(sides, report)
}

/// Section 4 again with the DPU emulator's poller on: what the rounds look
/// like when SNAP answers as real SPDK does.
pub async fn scale_with_poller(
    args: &Args,
    work: &Work,
    report: &mut Report,
) -> anyhow::Result<()> {
    let mut sides = run_sides(
        args,
        work,
        "d",
        args.poll_period_us,
        &args.concurrency,
        false,
    )
    .await?;
    report.scale_poll = Some(std::mem::take(&mut sides[0].rounds));
    report.print_scale_poll();
    if let Some(side) = sides.get_mut(1) {
        report.split.scale_poll = Some(std::mem::take(&mut side.rounds));
        report.split.scale_poll_handshakes = side.handshakes.take();
        report.print_split_scale_poll();
    }
    report.save(args)?;
    stop_sides(sides, report)
}
