//! Split mode beside co-located: the node reaching the DPU attach layer
//! through a DPU agent in its own network namespace, over mutual TLS on a
//! veth pair (`hack/local-up.sh --mode split`), measured on twins of the
//! co-located stacks that run side by side with them.
//!
//! - Section 3: stage and unstage with the emulator's poller at 8 ms, split
//!   p50 against co-located p50 (the volumes alternate between the stacks);
//!   the node's calls to the agent and the calls the agent served, read
//!   from both pages around every node RPC: one per stage and unstage, none
//!   per publish and unpublish; TLS handshakes over a stack's whole life.
//! - Section 4: the scale rounds on the split twin, volumes/s against the
//!   co-located stack's.
//! - Section 5: the agent's peak RSS idle and with every volume attached,
//!   and the split node's restart.

use serde::Serialize;

use crate::latency::Row;
use crate::memory::Memory;
use crate::prom::{Outbound, scrape};
use crate::report::{Report, each_ms, print_memory_table, print_rounds};
use crate::scale::{Round, levels, pooled_rate, repeat_rates};
use crate::stack::Stack;
use crate::stats::{Spread, Verdict, mean, medians_at_most};
use crate::table::{Table, ms, num};
use crate::targets::{RSS_MIB, Target, repeat_ratios, restart_target};

/// Split mode's figures; each one's co-located counterpart is the
/// [`Report`] field of the same name.
#[derive(Debug, Default, Serialize)]
pub struct Split {
    /// Section 3's rows with the poller on, on the split twin.
    pub poll: Option<Vec<Row>>,
    /// TLS handshakes on that twin's link over its whole life.
    pub poll_handshakes: Option<Handshakes>,
    pub scale: Option<Vec<Round>>,
    /// TLS handshakes on the scale twin's link, before its node's restart.
    pub scale_handshakes: Option<Handshakes>,
    pub scale_poll: Option<Vec<Round>>,
    pub scale_poll_handshakes: Option<Handshakes>,
    pub memory: Option<Memory>,
}

/// TLS handshakes on one split stack's link, counted by both ends, and the
/// calls the node sent over it meanwhile.
#[derive(Debug, Clone, Serialize)]
pub struct Handshakes {
    pub stack: String,
    pub when: String,
    pub agent: f64,
    pub node: f64,
    pub link_calls: f64,
}

/// The handshakes of `stack`'s link since it started.
pub async fn handshakes(stack: &Stack, when: &str) -> anyhow::Result<Handshakes> {
    let link = stack
        .split
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("stack {} is not split", stack.name))?;
    let (node, agent) = tokio::try_join!(scrape(&stack.node_metrics), scrape(&link.metrics))?;
    let node = Outbound::of(&node);
    Ok(Handshakes {
        stack: stack.name.clone(),
        when: when.to_string(),
        agent: Outbound::of(&agent).handshakes,
        node: node.handshakes,
        link_calls: node.link_calls,
    })
}

/// A split stage or unstage's median latency at most this many times the
/// co-located one's (the poller on: SNAP answers as real SPDK does).
const SPLIT_LATENCY_TIMES: f64 = 1.1;
/// Split throughput at least this share of co-located, at each concurrency
/// (a debug build's link, unoptimised at both ends, may cost twice the share).
const SPLIT_THROUGHPUT_AT_LEAST: f64 = 0.9;
/// The node RPCs whose p50 split mode must keep within
/// [`SPLIT_LATENCY_TIMES`] co-located.
const LATENCY_TARGETS: [&str; 2] = ["NodeStage block (new)", "NodeUnstage block"];

/// The link calls each kind of node RPC needs: one attach, one detach, none.
const LINK_BUDGETS: [(&str, f64); 4] = [
    ("NodeStage", 1.0),
    ("NodeUnstage", 1.0),
    ("NodePublish", 0.0),
    ("NodeUnpublish", 0.0),
];

/// `least-most`, or one number when they agree.
fn range(least: f64, most: f64) -> String {
    if least == most {
        num(least)
    } else {
        format!("{}-{}", num(least), num(most))
    }
}

impl Report {
    /// Section 3, split: each node RPC with the poller on, both modes.
    pub fn print_split_poll(&self) {
        let (Some(colocated), Some(split)) = (&self.poll, &self.split.poll) else {
            return;
        };
        println!();
        println!(
            "3 (split). Node RPCs with the poller at {} us, co-located vs split (DPU agent in a network namespace, mutual TLS\n   over a veth pair), {} volumes of each kind alternating between the two stacks",
            self.settings.poll_period_us, self.settings.poll_volumes
        );
        let mut table = Table::new(&[
            "rpc",
            "p50 co-located",
            "p50 split",
            "split/co-located",
            "p99 co-located",
            "p99 split",
            "SNAP calls co-located",
            "split",
            "node->agent calls",
            "agent served",
        ]);
        for row in split.iter().filter(|r| r.rpc.starts_with("Node")) {
            let Some(base) = colocated.iter().find(|r| r.rpc == row.rpc) else {
                continue;
            };
            table.row(vec![
                row.rpc.clone(),
                ms(base.latency.p50_ms),
                ms(row.latency.p50_ms),
                format!("{:.2}x", row.latency.p50_ms / base.latency.p50_ms),
                ms(base.latency.p99_ms),
                ms(row.latency.p99_ms),
                num(base.node_snap_calls + base.plugin_snap_calls),
                num(row.node_snap_calls + row.plugin_snap_calls),
                range(row.link_calls.min, row.link_calls.max),
                range(row.agent_calls.min, row.agent_calls.max),
            ]);
        }
        table.print();
        println!(
            "   (SNAP calls: the attach layer's (node or agent) and the plugin's, mean per call; node->agent calls: the node's\n    snap_csi_outbound_requests_total{{target=\"dpu-agent\"}}, agent served: the agent's snap_csi_grpc_requests_total,\n    each read before and after every call; least-most per call)"
        );
        print_handshakes(self.split.poll_handshakes.as_ref());
    }

    /// Section 4, split: the rounds, then throughput against co-located.
    pub fn print_split_scale(&self) {
        if let (Some(base), Some(rounds)) = (&self.scale, &self.split.scale) {
            println!();
            println!("4 (split). Scale on the split twin of the stack above");
            print_rounds(rounds);
            print_throughput(base, rounds);
            print_handshakes(self.split.scale_handshakes.as_ref());
        }
    }

    /// Section 4 with the poller on, split.
    pub fn print_split_scale_poll(&self) {
        if let (Some(base), Some(rounds)) = (&self.scale_poll, &self.split.scale_poll) {
            println!();
            println!(
                "4 (split, continued). Scale on the split twin, poller at {} us",
                self.settings.poll_period_us
            );
            print_rounds(rounds);
            print_throughput(base, rounds);
            print_handshakes(self.split.scale_poll_handshakes.as_ref());
        }
    }

    /// Section 5, split: the agent and the split node.
    pub fn print_split_memory(&self) {
        let Some(m) = &self.split.memory else {
            return;
        };
        println!();
        println!("5 (split). Memory on the split twin (MiB; peak = VmHWM, now = VmRSS)");
        let staged = format!("{} volumes attached", m.staged_volumes);
        print_memory_table(&[
            ("DPU agent", "idle, after start", m.agent_idle),
            ("DPU agent", staged.as_str(), m.agent_staged),
            ("node (split)", "idle, after start", Some(m.node_idle)),
            ("node (split)", staged.as_str(), Some(m.node_staged)),
            (
                "node (split, restarted)",
                "ready, volumes staged",
                m.node_restarted,
            ),
        ]);
        if !m.restarts_ready_ms.is_empty() {
            println!(
                "   split node restarts with {} volumes staged: process start to Probe ready (a new TLS connection to the agent,\n   the agent's probe of the plugin and SNAP) in {} ms",
                m.staged_volumes,
                each_ms(&m.restarts_ready_ms)
            );
        }
        if self.split.scale.is_none() {
            print_handshakes(self.split.scale_handshakes.as_ref());
        }
    }

    /// The split-mode targets this run speaks to.
    pub fn split_targets(&self) -> Vec<Target> {
        let mut targets = Vec::new();
        let (allowance, built) = self.allowance();
        if let (Some(colocated), Some(split)) = (&self.poll, &self.split.poll) {
            for rpc in LATENCY_TARGETS {
                let (Some(base), Some(row)) = (
                    colocated.iter().find(|r| r.rpc == rpc),
                    split.iter().find(|r| r.rpc == rpc),
                ) else {
                    continue;
                };
                let ratio = row.latency.p50_ms / base.latency.p50_ms;
                // The allowance is on the link's share, not the whole call.
                let most = 1.0 + (SPLIT_LATENCY_TIMES - 1.0) * allowance;
                let (verdict, low, high) = medians_at_most(&base.times_ms, &row.times_ms, most);
                targets.push(Target {
                    target: format!(
                        "split {rpc} p50 <= {most:.1}x co-located (poller at {} us){built}",
                        self.settings.poll_period_us
                    ),
                    measured: format!(
                        "{ratio:.2}x, 95% in {low:.2}-{high:.2} ({} vs {} ms p50, {} and {} calls)",
                        ms(row.latency.p50_ms),
                        ms(base.latency.p50_ms),
                        row.latency.samples,
                        base.latency.samples
                    ),
                    verdict,
                });
            }
            for (kind, budget) in LINK_BUDGETS {
                let rows: Vec<&Row> = split.iter().filter(|r| r.rpc.starts_with(kind)).collect();
                let calls: usize = rows.iter().map(|r| r.latency.samples).sum();
                // Over every call of this kind, by either end's count.
                let over = |spread: fn(&Row) -> Spread| {
                    rows.iter()
                        .map(|r| spread(r))
                        .fold((f64::INFINITY, f64::NEG_INFINITY), |(least, most), s| {
                            (least.min(s.min), most.max(s.max))
                        })
                };
                let (node, agent) = (over(|r| r.link_calls), over(|r| r.agent_calls));
                targets.push(Target {
                    target: format!("split: exactly {budget} link round trip(s) per {kind}"),
                    measured: format!(
                        "{} by the node's count, {} by the agent's, per call ({calls} calls)",
                        range(node.0, node.1),
                        range(agent.0, agent.1)
                    ),
                    verdict: Verdict::of(
                        calls > 0
                            && [node.0, node.1, agent.0, agent.1]
                                .iter()
                                .all(|&n| n == budget),
                    ),
                });
            }
        }
        let split = &self.split;
        for h in [
            &split.poll_handshakes,
            &split.scale_handshakes,
            &split.scale_poll_handshakes,
        ]
        .into_iter()
        .flatten()
        {
            targets.push(Target {
                target: format!(
                    "split: one TLS handshake per node process (stack {}, {})",
                    h.stack, h.when
                ),
                measured: format!(
                    "{} at the agent, {} at the node, {} link calls",
                    num(h.agent),
                    num(h.node),
                    num(h.link_calls)
                ),
                verdict: Verdict::of(h.agent == 1.0 && h.node == 1.0),
            });
        }
        for (base, rounds, how) in [
            (&self.scale, &self.split.scale, ""),
            (&self.scale_poll, &self.split.scale_poll, ", poller on"),
        ] {
            let (Some(base), Some(rounds)) = (base, rounds) else {
                continue;
            };
            for (concurrency, colocated, split, _) in pairs(base, rounds) {
                let at_least = 1.0 - (1.0 - SPLIT_THROUGHPUT_AT_LEAST) * allowance;
                // The two modes' rounds ran in turns, so each repeat is a pair.
                let ratios: Vec<f64> = repeat_rates(rounds, concurrency)
                    .zip(repeat_rates(base, concurrency))
                    .map(|(split, colocated)| split / colocated)
                    .collect();
                targets.push(Target {
                    target: format!(
                        "split >= {at_least:.1}x co-located throughput, {} volumes at concurrency {concurrency}{how}, median of the repeats{built}",
                        self.settings.scale_volumes
                    ),
                    measured: format!(
                        "{} ({split:.1} vs {colocated:.1} volumes/s pooled)",
                        repeat_ratios(&ratios)
                    ),
                    verdict: Verdict::by_median(&ratios, |r| r >= at_least),
                });
            }
        }
        if let Some(m) = &self.split.memory {
            if let Some(agent) = m.agent_staged {
                targets.push(Target {
                    target: format!(
                        "DPU agent peak RSS < {RSS_MIB} MiB with {} volumes attached",
                        m.staged_volumes
                    ),
                    measured: format!("{:.1} MiB", agent.peak_mib),
                    verdict: Verdict::in_release(self.release(), agent.peak_mib < RSS_MIB),
                });
            }
            targets.extend(restart_target("split node", m, allowance, &built));
        }
        targets
    }
}

fn print_handshakes(handshakes: Option<&Handshakes>) {
    if let Some(h) = handshakes {
        println!(
            "   TLS handshakes on stack {}'s link ({}): {} at the agent, {} at the node, for {} node calls over the link",
            h.stack,
            h.when,
            num(h.agent),
            num(h.node),
            num(h.link_calls)
        );
    }
}

/// Per concurrency level run in both modes: the pooled volumes/s
/// co-located and split, and the split node's link calls per volume.
fn pairs(base: &[Round], split: &[Round]) -> Vec<(usize, f64, f64, f64)> {
    levels(split)
        .into_iter()
        .filter_map(|c| {
            let link_calls: Vec<f64> = split
                .iter()
                .filter(|r| r.concurrency == c)
                .map(|r| r.link_calls_per_volume)
                .collect();
            Some((
                c,
                pooled_rate(base, c)?,
                pooled_rate(split, c)?,
                mean(&link_calls),
            ))
        })
        .collect()
}

/// Volumes/s of each round in both modes, and the node's link calls.
fn print_throughput(base: &[Round], split: &[Round]) {
    let mut table = Table::new(&[
        "concurrency",
        "co-located volumes/s",
        "split volumes/s",
        "split/co-located",
        "node->agent calls per volume",
    ]);
    for (concurrency, colocated, split, link_calls) in pairs(base, split) {
        table.row(vec![
            concurrency.to_string(),
            format!("{colocated:.1}"),
            format!("{split:.1}"),
            format!("{:.2}x", split / colocated),
            num(link_calls),
        ]);
    }
    table.print();
    println!(
        "   (volumes/s: every round at that concurrency pooled, all volumes over all wall time)"
    );
}
