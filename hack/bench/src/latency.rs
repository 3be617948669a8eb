//! Section 1 (and the counts of section 3): each RPC of a volume's life,
//! one volume at a time, timed from the caller's side, with the node's and
//! the plugin's outbound-call metrics read before and after every node RPC.
//!
//! Block and filesystem volumes alternate so that a burst of background
//! load hits both kinds alike. A block volume is staged twice (the second
//! stage is kubelet's retry of an already staged volume); a filesystem
//! volume is staged with mkfs, unstaged, and staged again on the now
//! formatted device.
//!
//! Counting dependent SNAP round trips (section 3): with the emulator's RPC
//! poller on, SNAP reads requests only on a tick and answers all that are
//! there. The bench starts each node RPC right after a tick (it waits for
//! the reply to a `spdk_get_version` of its own, which leaves SNAP just
//! after one). The RPC's first SNAP calls then wait for the next tick, and
//! so does each call sent after an earlier reply; calls sent together are
//! answered in the same tick. So `floor(latency / period)` is the number of
//! dependent round trips, as long as everything else the RPC does (host
//! work, mkfs, the emulator's own work such as attaching a loop device)
//! adds up to less than one period: hence a long period (50 ms) for counting.
//!
//! Stacks compared with each other (co-located against split) run side by
//! side, each volume's life on one and then on the other, each going first
//! in turn, so that background load falls on both alike. On a split stack
//! the agent's page is read around every node RPC too: the calls that
//! crossed the link.
//!
//! Section 1 samples its floors (`probe.rs`: an empty gRPC and a JSON-RPC
//! round trip) right before every call, so that each call is stated against
//! the floor of the same moment: CreateVolume and DeleteVolume against 2
//! gRPC round trips (bench -> proxy -> vendor controller), a stage or an
//! unstage against 2 gRPC and its design's dependent JSON-RPC round trips,
//! and the node's own share of every node call against one gRPC round trip.
//! Publish and unpublish are stated in section 2, against the bind mount.
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::csi::{Clients, Kind, Volume};
use crate::probe::{self, Probe, RawRpc};
use crate::prom::{Outbound, scrape};
use crate::stack::Stack;
use crate::stats::{Paired, Spread, Summary, mean, percentile_of};

/// Dependent SNAP/SPDK round trips the design allows (issue 6): a new NVMe
/// stage 5, a retry of a staged volume 1, an unstage 4.
pub fn design_round_trips(rpc: &str) -> Option<u32> {
    if rpc.starts_with("NodeStage") {
        Some(if rpc.contains("retry") { 1 } else { 5 })
    } else if rpc.starts_with("NodeUnstage") {
        Some(4)
    } else {
        None
    }
}

/// The least a call of the row `rpc` costs, in the floors sampled beside
/// it: (gRPC round trips, JSON-RPC round trips, what that is).
fn design_floor(rpc: &str, fs: &str) -> Option<(u32, u32, String)> {
    if rpc == "CreateVolume" || rpc == "DeleteVolume" {
        return Some((2, 0, "2 gRPC (bench -> proxy -> vendor controller)".into()));
    }
    // The plugin's gRPC hop rides along the first (stage) or last
    // (unstage) round; each round is one JSON-RPC trip.
    let trips = design_round_trips(rpc)?;
    let mut what = format!("2 gRPC + {trips} JSON-RPC");
    if rpc.starts_with("NodeStage") && rpc.contains(fs) {
        what.push_str(" (mkfs, fsck, mount not included)");
    } else if rpc.starts_with("NodeUnstage") && rpc.contains(fs) {
        what.push_str(" (umount not included)");
    }
    Some((2, trips, what))
}

/// One timed RPC and the outbound calls made while it ran.
#[derive(Debug, Clone, Copy)]
struct Step {
    latency: Duration,
    node: Outbound,
    plugin: Outbound,
    /// The DPU agent's (split mode; zero otherwise).
    agent: Outbound,
    /// The floors sampled just before the call (section 1; `None` elsewhere).
    floor: Option<probe::Sample>,
}

impl Step {
    /// The DPU attach layer's outbound calls: the node's co-located, the
    /// agent's in split mode (the other is zero).
    fn layer(&self) -> Outbound {
        if self.agent.served_calls > 0.0 {
            self.agent
        } else {
            self.node
        }
    }
}

/// One RPC kind over all volumes.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub rpc: String,
    pub latency: Summary,
    /// Every call's latency, ms, in the order made.
    #[serde(skip)]
    pub times_ms: Vec<f64>,
    /// Counting run only: the median and the largest `floor(latency /
    /// period)` over the calls, each started right after a poll tick.
    pub dependent_round_trips: Option<f64>,
    pub dependent_round_trips_max: Option<f64>,
    /// Means per call (node RPCs only; zero for the controller's). The
    /// node's SNAP and plugin calls are the DPU attach layer's: the node's
    /// co-located, the agent's in split mode.
    pub node_snap_calls: f64,
    pub plugin_snap_calls: f64,
    pub node_plugin_calls: f64,
    /// The most SNAP calls (node + plugin) any one call of this kind made.
    pub max_snap_calls: f64,
    /// Summed time of the node's SNAP and plugin calls (they may overlap).
    pub node_snap_wait_ms: f64,
    pub node_plugin_wait_ms: f64,
    /// Summed time of the node's host work (tools, mount syscalls).
    pub node_host_wait_ms: f64,
    /// The node's own measure of the call (its gRPC metrics layer), mean.
    pub node_served_ms: f64,
    /// Per call: the node's own work, by its own measure: served time minus
    /// the time any SNAP call, plugin call or host work was in progress.
    pub node_outside_calls: Summary,
    /// Split mode, per call: the node's calls to the DPU agent, and the
    /// calls the agent served (both zero co-located).
    pub link_calls: Spread,
    pub agent_calls: Spread,
    /// Section 1: each call against the floor sampled before it, and what
    /// that floor is (a row without a design floor has none).
    pub ratio: Option<Paired>,
    pub floor: Option<String>,
    /// Section 1, node calls: the node's own share against the gRPC floor.
    pub own_ratio: Option<Paired>,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Stage,
    Publish,
    Unpublish,
    Unstage,
}

/// The rows, in the order the report prints them.
pub fn row_names(fs: &str) -> Vec<String> {
    [
        "CreateVolume".to_string(),
        "NodeStage block (new)".to_string(),
        "NodeStage block (retry, staged)".to_string(),
        format!("NodeStage {fs} (mkfs)"),
        format!("NodeStage {fs} (formatted)"),
        "NodePublish block".to_string(),
        format!("NodePublish {fs}"),
        "NodeUnpublish block".to_string(),
        format!("NodeUnpublish {fs}"),
        "NodeUnstage block".to_string(),
        format!("NodeUnstage {fs}"),
        "DeleteVolume".to_string(),
    ]
    .into()
}

struct Recorder<'a> {
    stack: &'a Stack,
    clients: Clients,
    steps: Vec<(String, Step)>,
    /// A connection to SNAP for waiting for a poll tick, when counting: the
    /// reply to a `spdk_get_version` leaves SNAP just after one.
    ticks: Option<RawRpc>,
    /// The floors sampled before every call (section 1).
    probe: Option<Probe>,
}

impl Recorder<'_> {
    /// The node's, the plugin's and (split mode) the agent's pages.
    async fn pages(&self) -> anyhow::Result<[Outbound; 3]> {
        let agent = async {
            match &self.stack.split {
                Some(link) => Ok(Outbound::of(&scrape(&link.metrics).await?)),
                None => Ok(Outbound::default()),
            }
        };
        let (node, plugin, agent) = tokio::try_join!(
            scrape(&self.stack.node_metrics),
            scrape(&self.stack.plugin_metrics),
            agent
        )?;
        Ok([Outbound::of(&node), Outbound::of(&plugin), agent])
    }

    async fn node(&mut self, row: &str, op: Op, volume: &Volume) -> anyhow::Result<()> {
        let before = self.pages().await?;
        let floor = self.floor().await?;
        if let Some(ticks) = &mut self.ticks {
            ticks.round_trip().await?;
        }
        let started = Instant::now();
        match op {
            Op::Stage => self.clients.stage(volume).await?,
            Op::Publish => self.clients.publish(volume).await?,
            Op::Unpublish => self.clients.unpublish(volume).await?,
            Op::Unstage => self.clients.unstage(volume).await?,
        }
        let latency = started.elapsed();
        let [node, plugin, agent] = self.pages().await?;
        self.steps.push((
            row.to_string(),
            Step {
                latency,
                node: node.since(&before[0]),
                plugin: plugin.since(&before[1]),
                agent: agent.since(&before[2]),
                floor,
            },
        ));
        Ok(())
    }

    /// A sample of the floors, if this recorder takes them.
    async fn floor(&mut self) -> anyhow::Result<Option<probe::Sample>> {
        match &mut self.probe {
            Some(probe) => Ok(Some(probe.sample().await?)),
            None => Ok(None),
        }
    }

    fn controller(&mut self, row: &str, latency: Duration, floor: Option<probe::Sample>) {
        self.steps.push((
            row.to_string(),
            Step {
                latency,
                node: Outbound::default(),
                plugin: Outbound::default(),
                agent: Outbound::default(),
                floor,
            },
        ));
    }

    async fn block(&mut self, name: &str, size_mib: i64) -> anyhow::Result<()> {
        let kubelet = self.stack.kubelet.clone();
        let floor = self.floor().await?;
        let started = Instant::now();
        let volume = self
            .clients
            .create(&kubelet, name, &Kind::Block, size_mib)
            .await?;
        self.controller("CreateVolume", started.elapsed(), floor);
        self.node("NodeStage block (new)", Op::Stage, &volume)
            .await?;
        self.node("NodeStage block (retry, staged)", Op::Stage, &volume)
            .await?;
        self.node("NodePublish block", Op::Publish, &volume).await?;
        self.node("NodeUnpublish block", Op::Unpublish, &volume)
            .await?;
        self.node("NodeUnstage block", Op::Unstage, &volume).await?;
        let floor = self.floor().await?;
        let started = Instant::now();
        self.clients.delete(&volume).await?;
        self.controller("DeleteVolume", started.elapsed(), floor);
        Ok(())
    }

    async fn filesystem(&mut self, name: &str, fs: &str, size_mib: i64) -> anyhow::Result<()> {
        let kubelet = self.stack.kubelet.clone();
        let floor = self.floor().await?;
        let started = Instant::now();
        let volume = self
            .clients
            .create(&kubelet, name, &Kind::Filesystem(fs.to_string()), size_mib)
            .await?;
        self.controller("CreateVolume", started.elapsed(), floor);
        self.node(&format!("NodeStage {fs} (mkfs)"), Op::Stage, &volume)
            .await?;
        self.node(&format!("NodePublish {fs}"), Op::Publish, &volume)
            .await?;
        self.node(&format!("NodeUnpublish {fs}"), Op::Unpublish, &volume)
            .await?;
        self.node(&format!("NodeUnstage {fs}"), Op::Unstage, &volume)
            .await?;
        self.node(&format!("NodeStage {fs} (formatted)"), Op::Stage, &volume)
            .await?;
        self.node(&format!("NodeUnstage {fs}"), Op::Unstage, &volume)
            .await?;
        let floor = self.floor().await?;
        let started = Instant::now();
        self.clients.delete(&volume).await?;
        self.controller("DeleteVolume", started.elapsed(), floor);
        Ok(())
    }
}

/// Takes `volumes` block and `volumes` filesystem volumes through their
/// life, one at a time, and summarises each RPC kind. With `count_period`
/// (the emulator's poller period) every node RPC starts right after a tick
/// and its dependent SNAP round trips are counted; with `probe_dir` the
/// floors are sampled before every call (their server's socket there).
#[allow(clippy::too_many_arguments)]
pub async fn run(
    stack: &Stack,
    clients: &Clients,
    volumes: usize,
    fs: &str,
    size_mib: i64,
    prefix: &str,
    count_period: Option<Duration>,
    probe_dir: Option<&Path>,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = side_by_side(
        &[(stack, clients)],
        volumes,
        fs,
        size_mib,
        prefix,
        count_period,
        probe_dir,
    )
    .await?;
    Ok(rows.remove(0))
}

/// [`run`] on several stacks at once, the volumes alternating between them;
/// the rows of each stack, in the order given.
pub async fn side_by_side(
    stacks: &[(&Stack, &Clients)],
    volumes: usize,
    fs: &str,
    size_mib: i64,
    prefix: &str,
    count_period: Option<Duration>,
    probe_dir: Option<&Path>,
) -> anyhow::Result<Vec<Vec<Row>>> {
    let mut recorders = Vec::new();
    for (k, (stack, clients)) in stacks.iter().enumerate() {
        let ticks = match count_period {
            Some(_) => Some(RawRpc::connect(&stack.snap_socket()).await?),
            None => None,
        };
        let probe = match probe_dir {
            Some(dir) => {
                let socket = dir.join(format!("{prefix}-probe-{k}.sock"));
                Some(Probe::start(socket, &stack.snap_socket()).await?)
            }
            None => None,
        };
        recorders.push(Recorder {
            stack,
            clients: (*clients).clone(),
            steps: Vec::new(),
            ticks,
            probe,
        });
    }
    let n = recorders.len();
    for i in 0..volumes {
        for k in 0..n {
            recorders[(i + k) % n]
                .block(&format!("{prefix}-block-{i}"), size_mib)
                .await?;
        }
        for k in 0..n {
            recorders[(i + k) % n]
                .filesystem(&format!("{prefix}-{fs}-{i}"), fs, size_mib)
                .await?;
        }
    }
    Ok(recorders
        .iter()
        .map(|recorder| recorder.rows(fs, count_period))
        .collect())
}

/// Each call's floor is the median of the floor samples taken before the
/// calls this many either side of it (and its own): one sample of an empty
/// round trip swings several-fold with a neighbour's burst, a median of 17
/// taken over a second or two does not, and still follows the load.
const FLOOR_WINDOW: usize = 8;

/// `steps` with every floor replaced by the median of its window's.
fn smoothed(steps: &[(String, Step)]) -> Vec<(String, Step)> {
    let floors: Vec<probe::Sample> = steps.iter().filter_map(|(_, s)| s.floor).collect();
    let mut at: usize = 0;
    steps
        .iter()
        .map(|(row, step)| {
            let mut step = *step;
            if step.floor.is_some() {
                let window = &floors
                    [at.saturating_sub(FLOOR_WINDOW)..(at + FLOOR_WINDOW + 1).min(floors.len())];
                let median = |f: fn(&probe::Sample) -> Duration| {
                    Duration::from_secs_f64(percentile_of(
                        &window
                            .iter()
                            .map(|s| f(s).as_secs_f64())
                            .collect::<Vec<_>>(),
                        0.5,
                    ))
                };
                step.floor = Some(probe::Sample {
                    grpc: median(|s| s.grpc),
                    jsonrpc: median(|s| s.jsonrpc),
                });
                at += 1;
            }
            (row.clone(), step)
        })
        .collect()
}

impl Recorder<'_> {
    /// One row per RPC kind of what was recorded.
    fn rows(&self, fs: &str, count_period: Option<Duration>) -> Vec<Row> {
        let steps = smoothed(&self.steps);
        row_names(fs)
            .into_iter()
            .map(|name| {
                let steps: Vec<Step> = steps
                    .iter()
                    .filter(|(row, _)| *row == name)
                    .map(|(_, step)| *step)
                    .collect();
                summarise(name, &steps, count_period, fs)
            })
            .collect()
    }
}

fn summarise(name: String, steps: &[Step], count_period: Option<Duration>, fs: &str) -> Row {
    let values = |f: fn(&Step) -> f64| steps.iter().map(f).collect::<Vec<_>>();
    let of = |f: fn(&Step) -> f64| mean(&values(f));
    let node_rpc = steps
        .iter()
        .any(|s| s.node.snap_calls + s.node.plugin_calls > 0.0)
        || name.starts_with("Node");
    let rounds: Option<Vec<f64>> = count_period.filter(|_| node_rpc).map(|p| {
        steps
            .iter()
            .map(|s| (s.latency.as_secs_f64() / p.as_secs_f64()).floor())
            .collect()
    });
    let (ratio, floor) = design_ratio(&name, fs, steps).unzip();
    Row {
        latency: Summary::of(&steps.iter().map(|s| s.latency).collect::<Vec<_>>()),
        times_ms: values(|s| s.latency.as_secs_f64() * 1e3),
        dependent_round_trips: rounds.as_ref().map(|r| percentile_of(r, 0.5)),
        dependent_round_trips_max: rounds
            .as_ref()
            .map(|r| r.iter().copied().fold(0.0, f64::max)),
        node_snap_calls: of(|s| s.layer().snap_calls),
        plugin_snap_calls: of(|s| s.plugin.snap_calls),
        node_plugin_calls: of(|s| s.layer().plugin_calls),
        max_snap_calls: steps
            .iter()
            .map(|s| s.layer().snap_calls + s.plugin.snap_calls)
            .fold(0.0, f64::max),
        node_snap_wait_ms: of(|s| s.layer().snap_seconds * 1e3),
        node_plugin_wait_ms: of(|s| s.layer().plugin_seconds * 1e3),
        node_host_wait_ms: of(|s| s.node.host_seconds * 1e3),
        node_served_ms: of(|s| s.node.served_seconds * 1e3),
        node_outside_calls: Summary::of_ms(
            &steps
                .iter()
                .filter(|s| s.node.served_seconds > 0.0)
                .map(|s| s.node.own_seconds * 1e3)
                .collect::<Vec<_>>(),
        ),
        link_calls: Spread::of(&values(|s| s.node.link_calls)),
        agent_calls: Spread::of(&values(|s| s.agent.served_calls)),
        ratio,
        floor,
        own_ratio: node_rpc.then(|| own_ratio(steps)).flatten(),
        rpc: name,
    }
}

/// Each call's latency against its design floor in the floors sampled
/// before it, if it has both.
fn design_ratio(rpc: &str, fs: &str, steps: &[Step]) -> Option<(Paired, String)> {
    let (grpc, json, what) = design_floor(rpc, fs)?;
    let (floor, measured): (Vec<f64>, Vec<f64>) = steps
        .iter()
        .filter_map(|s| {
            let f = s.floor?;
            let floor =
                f64::from(grpc) * f.grpc.as_secs_f64() + f64::from(json) * f.jsonrpc.as_secs_f64();
            Some((floor * 1e3, s.latency.as_secs_f64() * 1e3))
        })
        .unzip();
    (!floor.is_empty()).then(|| (Paired::of(&floor, &measured), what))
}

/// The node's own share of each call against the gRPC floor sampled
/// before it.
fn own_ratio(steps: &[Step]) -> Option<Paired> {
    let (floor, own): (Vec<f64>, Vec<f64>) = steps
        .iter()
        .filter(|s| s.node.served_seconds > 0.0)
        .filter_map(|s| Some((s.floor?.grpc.as_secs_f64() * 1e3, s.node.own_seconds * 1e3)))
        .unzip();
    (!floor.is_empty()).then(|| Paired::of(&floor, &own))
}
