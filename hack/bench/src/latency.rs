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
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use snap_csi::jsonrpc::JsonFramer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::csi::{Clients, Kind, Volume};
use crate::prom::{Outbound, scrape};
use crate::stack::Stack;
use crate::stats::{Spread, Summary, mean, percentile};

/// One timed RPC and the outbound calls made while it ran.
#[derive(Debug, Clone, Copy)]
struct Step {
    latency: Duration,
    node: Outbound,
    plugin: Outbound,
    /// The DPU agent's (split mode; zero otherwise).
    agent: Outbound,
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
    /// A connection to SNAP for waiting for a poll tick, when counting.
    ticks: Option<Ticks>,
}

/// Finds the emulator's poll ticks: a reply leaves SNAP just after one.
struct Ticks {
    stream: UnixStream,
    framer: JsonFramer,
    id: u64,
}

impl Ticks {
    async fn connect(socket: &Path) -> anyhow::Result<Ticks> {
        Ok(Ticks {
            stream: UnixStream::connect(socket)
                .await
                .with_context(|| format!("connecting to {}", socket.display()))?,
            framer: JsonFramer::default(),
            id: 0,
        })
    }

    /// Returns just after the next poll tick.
    async fn next(&mut self) -> anyhow::Result<()> {
        self.id += 1;
        let request = format!(
            r#"{{"jsonrpc":"2.0","method":"spdk_get_version","id":{}}}"#,
            self.id
        );
        self.stream.write_all(request.as_bytes()).await?;
        let mut chunk = [0u8; 4096];
        loop {
            if self.framer.next_value()?.is_some() {
                return Ok(());
            }
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                bail!("SNAP closed the connection");
            }
            self.framer.extend(&chunk[..n]);
        }
    }
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
        if let Some(ticks) = &mut self.ticks {
            ticks.next().await?;
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
            },
        ));
        Ok(())
    }

    fn controller(&mut self, row: &str, latency: Duration) {
        self.steps.push((
            row.to_string(),
            Step {
                latency,
                node: Outbound::default(),
                plugin: Outbound::default(),
                agent: Outbound::default(),
            },
        ));
    }

    async fn block(&mut self, name: &str, size_mib: i64) -> anyhow::Result<()> {
        let kubelet = self.stack.kubelet.clone();
        let started = Instant::now();
        let volume = self
            .clients
            .create(&kubelet, name, &Kind::Block, size_mib)
            .await?;
        self.controller("CreateVolume", started.elapsed());
        self.node("NodeStage block (new)", Op::Stage, &volume)
            .await?;
        self.node("NodeStage block (retry, staged)", Op::Stage, &volume)
            .await?;
        self.node("NodePublish block", Op::Publish, &volume).await?;
        self.node("NodeUnpublish block", Op::Unpublish, &volume)
            .await?;
        self.node("NodeUnstage block", Op::Unstage, &volume).await?;
        let started = Instant::now();
        self.clients.delete(&volume).await?;
        self.controller("DeleteVolume", started.elapsed());
        Ok(())
    }

    async fn filesystem(&mut self, name: &str, fs: &str, size_mib: i64) -> anyhow::Result<()> {
        let kubelet = self.stack.kubelet.clone();
        let started = Instant::now();
        let volume = self
            .clients
            .create(&kubelet, name, &Kind::Filesystem(fs.to_string()), size_mib)
            .await?;
        self.controller("CreateVolume", started.elapsed());
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
        let started = Instant::now();
        self.clients.delete(&volume).await?;
        self.controller("DeleteVolume", started.elapsed());
        Ok(())
    }
}

/// Takes `volumes` block and `volumes` filesystem volumes through their
/// life, one at a time, and summarises each RPC kind. With `count_period`
/// (the emulator's poller period) every node RPC starts right after a tick
/// and its dependent SNAP round trips are counted.
pub async fn run(
    stack: &Stack,
    clients: &Clients,
    volumes: usize,
    fs: &str,
    size_mib: i64,
    prefix: &str,
    count_period: Option<Duration>,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = side_by_side(
        &[(stack, clients)],
        volumes,
        fs,
        size_mib,
        prefix,
        count_period,
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
) -> anyhow::Result<Vec<Vec<Row>>> {
    let mut recorders = Vec::new();
    for (stack, clients) in stacks {
        let ticks = match count_period {
            Some(_) => Some(Ticks::connect(&stack.snap_socket()).await?),
            None => None,
        };
        recorders.push(Recorder {
            stack,
            clients: (*clients).clone(),
            steps: Vec::new(),
            ticks,
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

impl Recorder<'_> {
    /// One row per RPC kind of what was recorded.
    fn rows(&self, fs: &str, count_period: Option<Duration>) -> Vec<Row> {
        row_names(fs)
            .into_iter()
            .map(|name| {
                let steps: Vec<Step> = self
                    .steps
                    .iter()
                    .filter(|(row, _)| *row == name)
                    .map(|(_, step)| *step)
                    .collect();
                summarise(name, &steps, count_period)
            })
            .collect()
    }
}

fn summarise(name: String, steps: &[Step], count_period: Option<Duration>) -> Row {
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
    Row {
        latency: Summary::of(&steps.iter().map(|s| s.latency).collect::<Vec<_>>()),
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
        rpc: name,
    }
}

fn percentile_of(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    percentile(&sorted, q)
}
