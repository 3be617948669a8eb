//! Section 4: many block volumes staged and published at once, the way a
//! node starting a hundred pods sees it. Per concurrency: create them all
//! first (not timed as part of the round), then stage and publish each in
//! its own task, at most `concurrency` at a time, then take them down again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::csi::{Clients, Kind, Volume, parameters};
use crate::prom::{Outbound, Page, snap_methods};
use crate::stats::Summary;

/// SNAP calls by method: calls per volume, mean ms per call.
pub type ByMethod = BTreeMap<String, (f64, f64)>;

/// One concurrency level.
#[derive(Debug, Clone, Serialize)]
pub struct Round {
    pub concurrency: usize,
    pub volumes: usize,
    /// Creating every volume first (at a fixed concurrency of 8).
    pub create_wall_s: f64,
    /// Stage + publish of every volume.
    pub wall_s: f64,
    pub volumes_per_s: f64,
    /// Stage + publish of one volume, and each alone.
    pub stage_publish: Summary,
    pub stage: Summary,
    pub publish: Summary,
    /// Per volume, means (stage + publish): the calls served by the node's
    /// clock, and the DPU attach layer's SNAP and plugin calls' summed time
    /// (the node's co-located, the agent's in split mode).
    pub node_ms: f64,
    pub node_snap_ms: f64,
    pub node_plugin_ms: f64,
    /// Split mode: the node's calls to the DPU agent per volume (stage +
    /// publish; zero co-located).
    pub link_calls_per_volume: f64,
    /// The attach layer's SNAP calls by method.
    pub snap_methods: ByMethod,
    /// Unpublish + unstage of every volume, at the same concurrency.
    pub teardown_wall_s: f64,
    /// Throughput over that of concurrency 1 (when measured).
    pub speedup: Option<f64>,
    /// The node's `/metrics` with every volume staged (the last round of a
    /// stack only).
    pub scrape: Option<crate::scrape::Scrape>,
}

/// How many volumes are created at once before a round; fixed so that the
/// rounds start alike.
const CREATE_CONCURRENCY: usize = 8;

/// Runs `work` for each item in its own task, at most `concurrency` at a
/// time; returns what each returned, in item order, and the wall time.
pub async fn each<I, T, F, Fut>(
    items: Vec<I>,
    concurrency: usize,
    clients: &Clients,
    work: F,
) -> anyhow::Result<(Vec<T>, Duration)>
where
    T: Send + 'static,
    F: Fn(Clients, I) -> Fut,
    Fut: Future<Output = anyhow::Result<T>> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut tasks = JoinSet::new();
    let started = Instant::now();
    for (index, item) in items.into_iter().enumerate() {
        let permits = Arc::clone(&permits);
        // The job is built here but only runs once it holds a permit.
        let job = work(clients.clone(), item);
        tasks.spawn(async move {
            let _permit = permits.acquire_owned().await?;
            anyhow::Ok((index, job.await?))
        });
    }
    let mut results = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        results.push(joined??);
    }
    let wall = started.elapsed();
    results.sort_by_key(|(index, _)| *index);
    Ok((results.into_iter().map(|(_, r)| r).collect(), wall))
}

/// Creates `count` block volumes (AIO, NVMe) with `placement` (none: the
/// node's default).
pub async fn create(
    clients: &Clients,
    kubelet: &std::path::Path,
    prefix: &str,
    count: usize,
    size_mib: i64,
    placement: Option<&str>,
) -> anyhow::Result<(Vec<Volume>, Duration)> {
    let names: Vec<String> = (0..count).map(|i| format!("{prefix}-{i}")).collect();
    let parameters = parameters("aio", "nvme", placement);
    each(names, CREATE_CONCURRENCY, clients, |mut clients, name| {
        let (kubelet, parameters) = (kubelet.to_path_buf(), parameters.clone());
        async move {
            clients
                .create_with(&kubelet, &name, &Kind::Block, size_mib, parameters)
                .await
        }
    })
    .await
}

/// Stages and publishes every volume; returns (stage, publish) per volume
/// and the wall time.
pub async fn stage_publish(
    clients: &Clients,
    volumes: &[Volume],
    concurrency: usize,
) -> anyhow::Result<(Vec<(Duration, Duration)>, Duration)> {
    each(
        volumes.to_vec(),
        concurrency,
        clients,
        |mut clients, volume| async move {
            let started = Instant::now();
            clients.stage(&volume).await?;
            let staged = Instant::now();
            clients.publish(&volume).await?;
            Ok((staged - started, staged.elapsed()))
        },
    )
    .await
}

/// Stages (or unstages) every volume, at most `concurrency` at a time;
/// each call's time and the wall time (sections 7 and 12: stage only).
pub async fn each_call(
    clients: &Clients,
    volumes: &[Volume],
    concurrency: usize,
    unstage: bool,
) -> anyhow::Result<(Vec<Duration>, Duration)> {
    each(
        volumes.to_vec(),
        concurrency,
        clients,
        move |mut clients, volume| async move {
            let started = Instant::now();
            if unstage {
                clients.unstage(&volume).await?;
            } else {
                clients.stage(&volume).await?;
            }
            Ok(started.elapsed())
        },
    )
    .await
}

/// Unpublishes and unstages every volume; the wall time.
pub async fn teardown(
    clients: &Clients,
    volumes: &[Volume],
    concurrency: usize,
) -> anyhow::Result<Duration> {
    let (_, wall) = each(
        volumes.to_vec(),
        concurrency,
        clients,
        |mut clients, volume| async move {
            clients.unpublish(&volume).await?;
            clients.unstage(&volume).await
        },
    )
    .await?;
    Ok(wall)
}

/// Deletes every volume, at the creation concurrency.
pub async fn delete(clients: &Clients, volumes: &[Volume]) -> anyhow::Result<()> {
    each(
        volumes.to_vec(),
        CREATE_CONCURRENCY,
        clients,
        |mut clients, volume| async move { clients.delete(&volume).await },
    )
    .await?;
    Ok(())
}

/// The first half of a round: every volume created, then staged and
/// published, timed, with the node's metrics and the DPU attach layer's
/// (the node's co-located, the agent's in split mode) around it.
#[derive(Debug)]
pub struct Staged {
    pub volumes: Vec<Volume>,
    pub create_wall: Duration,
    /// (stage, publish) per volume.
    pub times: Vec<(Duration, Duration)>,
    pub wall: Duration,
    pub node: Outbound,
    pub layer: Outbound,
    pub methods: ByMethod,
}

/// The figures of one round: its first half and the teardown's wall time.
pub fn summarise(concurrency: usize, staged: Staged, teardown_wall: Duration) -> Round {
    let Staged {
        create_wall,
        times,
        wall,
        node,
        layer,
        methods: snap_methods,
        ..
    } = staged;
    let per_volume = |seconds: f64| seconds * 1e3 / times.len().max(1) as f64;
    let both: Vec<Duration> = times.iter().map(|(s, p)| *s + *p).collect();
    let stages: Vec<Duration> = times.iter().map(|(s, _)| *s).collect();
    let publishes: Vec<Duration> = times.iter().map(|(_, p)| *p).collect();
    Round {
        concurrency,
        volumes: times.len(),
        create_wall_s: create_wall.as_secs_f64(),
        wall_s: wall.as_secs_f64(),
        volumes_per_s: times.len() as f64 / wall.as_secs_f64(),
        stage_publish: Summary::of(&both),
        stage: Summary::of(&stages),
        publish: Summary::of(&publishes),
        node_ms: per_volume(node.served_seconds),
        node_snap_ms: per_volume(layer.snap_seconds),
        node_plugin_ms: per_volume(layer.plugin_seconds),
        link_calls_per_volume: node.link_calls / times.len().max(1) as f64,
        snap_methods,
        teardown_wall_s: teardown_wall.as_secs_f64(),
        speedup: None,
        scrape: None,
    }
}

/// The node's SNAP calls between two pages, by method: calls per volume and
/// mean milliseconds per call.
pub fn method_means(before: &Page, after: &Page, volumes: usize) -> ByMethod {
    let before = snap_methods(before);
    snap_methods(after)
        .into_iter()
        .filter_map(|(method, (calls, seconds))| {
            let (calls0, seconds0) = before.get(&method).copied().unwrap_or((0.0, 0.0));
            let calls = calls - calls0;
            (calls > 0.0).then(|| {
                (
                    method,
                    (
                        calls / volumes.max(1) as f64,
                        (seconds - seconds0) * 1e3 / calls,
                    ),
                )
            })
        })
        .collect()
}

/// Volumes per second over every round at `concurrency`: all their volumes
/// over all their wall time, so that repeated rounds pool.
pub fn pooled_rate(rounds: &[Round], concurrency: usize) -> Option<f64> {
    let (volumes, wall) = rounds
        .iter()
        .filter(|r| r.concurrency == concurrency)
        .fold((0, 0.0), |(volumes, wall), r| {
            (volumes + r.volumes, wall + r.wall_s)
        });
    (volumes > 0 && wall > 0.0).then(|| volumes as f64 / wall)
}

/// Volumes per second of each round at `concurrency`, in the order run
/// (one per repeat).
pub fn repeat_rates(rounds: &[Round], concurrency: usize) -> impl Iterator<Item = f64> + '_ {
    rounds
        .iter()
        .filter(move |r| r.concurrency == concurrency && r.wall_s > 0.0)
        .map(|r| r.volumes as f64 / r.wall_s)
}

/// The concurrency levels of `rounds`, each once, in the order first run.
pub fn levels(rounds: &[Round]) -> Vec<usize> {
    let mut levels: Vec<usize> = Vec::new();
    for round in rounds {
        if !levels.contains(&round.concurrency) {
            levels.push(round.concurrency);
        }
    }
    levels
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(concurrency: usize, volumes: usize, wall_s: f64) -> Round {
        Round {
            concurrency,
            volumes,
            create_wall_s: 0.0,
            wall_s,
            volumes_per_s: volumes as f64 / wall_s,
            stage_publish: Summary::default(),
            stage: Summary::default(),
            publish: Summary::default(),
            node_ms: 0.0,
            node_snap_ms: 0.0,
            node_plugin_ms: 0.0,
            link_calls_per_volume: 0.0,
            snap_methods: BTreeMap::new(),
            teardown_wall_s: 0.0,
            speedup: None,
            scrape: None,
        }
    }

    #[test]
    fn repeated_rounds_pool_by_level() {
        let rounds = [round(8, 256, 2.0), round(1, 256, 8.0), round(8, 256, 4.0)];
        assert_eq!(levels(&rounds), [8, 1]);
        // 512 volumes in 6 s, not the mean of 128 and 64 volumes/s.
        assert_eq!(pooled_rate(&rounds, 8), Some(512.0 / 6.0));
        assert_eq!(pooled_rate(&rounds, 64), None);
    }
}
