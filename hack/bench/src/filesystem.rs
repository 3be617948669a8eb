//! Section 10: filesystem devices (virtio-fs). On section 1's stack:
//! - stage and unstage of `--volumes` filesystem volumes (backend fs, the
//!   host mounts the tag) against as many block volumes (AIO, NVMe, raw
//!   block: no mkfs either), one at a time and alternating so that
//!   background load hits both alike, timed from kubelet's side with the
//!   SNAP calls the node and the plugin made (`encryption::timed`);
//! - metadata (create, stat and remove a small file) and data (sequential
//!   1 MiB writes then fsync; reads) rates through a published volume, the
//!   emulated host's path (the emulator's FUSE server, standing in for
//!   virtio-fs), against the same operations on the volume's backing
//!   directory in the share (the floor: what the fsdev serves from).
//!
//! No rate is judged: the emulated path is the emulator's FUSE passthrough
//! on the same machine, not a BlueField's virtio-fs, so a ratio would rate
//! the emulator. The figures say what the seam costs here. One thing is
//! judged, the published volume's NodeGetVolumeStats before and after the
//! data run: its total is the volume's own size (less its filesystem's
//! metadata), not the share's, and its use grows by what the run left.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use crate::Args;
use crate::csi::{Clients, Kind, parameters};
use crate::encryption::{StageRow, stage_rows, timed};
use crate::report::Report;
use crate::stack::Stack;
use crate::table::{Table, ms, num};
use snap_csi::proto::csi::v1 as csi;

/// Files each metadata run creates, stats and removes.
const METADATA_FILES: usize = 500;
/// Bytes each data run writes, then reads.
const DATA_BYTES: usize = 64 << 20;
const CHUNK: usize = 1 << 20;

/// One operation's rate through the host's mount and on the backing tree.
#[derive(Debug, Clone, Serialize)]
pub struct Rate {
    pub operation: String,
    pub unit: String,
    pub through_mount: f64,
    pub on_backing: f64,
}

/// Everything section 10 reports.
#[derive(Debug, Clone, Serialize)]
pub struct Filesystem {
    pub volumes: usize,
    pub stages: Vec<StageRow>,
    pub rates: Vec<Rate>,
    /// The published volume's size, as created.
    pub capacity_bytes: u64,
    /// Its NodeGetVolumeStats in bytes, `(total, used)`, before the data
    /// run and after it (which leaves [`DATA_BYTES`] in a file).
    pub stats_before: (i64, i64),
    pub stats_after: (i64, i64),
}

impl Filesystem {
    /// Bytes the data run leaves in the volume.
    pub const LEFT_BYTES: i64 = DATA_BYTES as i64;
}

const ROWS: [&str; 4] = [
    "NodeStage filesystem (virtio-fs)",
    "NodeStage block (NVMe)",
    "NodeUnstage filesystem (virtio-fs)",
    "NodeUnstage block (NVMe)",
];

/// Section 10 on `stack` (section 1's).
pub async fn run(args: &Args, stack: &Stack, clients: &Clients) -> anyhow::Result<Filesystem> {
    let mut clients = clients.clone();
    let mut taken: Vec<(String, Duration, f64)> = Vec::new();
    for i in 0..args.volumes {
        for fs in [i % 2 == 0, i % 2 != 0] {
            let (kind, parameters, label) = if fs {
                let kind = Kind::Filesystem("virtiofs".into());
                (kind, parameters("fs", "virtio-fs", None), 0)
            } else {
                (Kind::Block, parameters("aio", "nvme", None), 1)
            };
            let name = format!("fsdev-{}-{i}", if fs { "fs" } else { "block" });
            let volume = clients
                .create_with(&stack.kubelet, &name, &kind, args.size_mib, parameters)
                .await?;
            let (latency, calls) = timed(stack, &mut clients, &volume, true).await?;
            taken.push((ROWS[label].to_string(), latency, calls));
            let (latency, calls) = timed(stack, &mut clients, &volume, false).await?;
            taken.push((ROWS[label + 2].to_string(), latency, calls));
            clients.delete(&volume).await?;
        }
    }
    let stages = stage_rows(&ROWS, &taken);

    // The rates: one volume published, its tree and its backing directory.
    let kind = Kind::Filesystem("virtiofs".into());
    // Room for the data run and the metadata run's files.
    let size_mib = ((2 * DATA_BYTES as i64) >> 20).max(args.size_mib);
    let volume = clients
        .create_with(
            &stack.kubelet,
            "fsdev-rates",
            &kind,
            size_mib,
            parameters("fs", "virtio-fs", None),
        )
        .await?;
    clients.stage(&volume).await?;
    clients.publish(&volume).await?;
    let stats_before = bytes(&clients.stats(&volume).await?)?;
    let backing = PathBuf::from(volume.context.get("path").context("the fs volume's path")?);
    let (target, back) = (volume.target.clone(), backing.clone());
    let rates = tokio::task::spawn_blocking(move || rates(&target, &back)).await??;
    let stats_after = bytes(&clients.stats(&volume).await?)?;
    clients.unpublish(&volume).await?;
    clients.unstage(&volume).await?;
    clients.delete(&volume).await?;
    Ok(Filesystem {
        volumes: args.volumes,
        stages,
        rates,
        capacity_bytes: u64::try_from(size_mib)? << 20,
        stats_before,
        stats_after,
    })
}

/// NodeGetVolumeStats' `(total, used)` in bytes.
fn bytes(stats: &csi::NodeGetVolumeStatsResponse) -> anyhow::Result<(i64, i64)> {
    stats
        .usage
        .iter()
        .find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32)
        .map(|u| (u.total, u.used))
        .context("NodeGetVolumeStats answered no usage in bytes")
}

/// Each operation through `mount` then on `backing`, in turns (three each)
/// so that background load hits both alike; the best of each.
fn rates(mount: &Path, backing: &Path) -> anyhow::Result<Vec<Rate>> {
    type Run = fn(&Path, &str) -> anyhow::Result<f64>;
    let operations: [(&str, &str, Run); 3] = [
        ("create, stat, remove a file", "files/s", metadata),
        ("sequential write + fsync", "MiB/s", write),
        ("sequential read", "MiB/s", read),
    ];
    let mut out = Vec::new();
    for (operation, unit, run) in operations {
        let (mut through, mut on) = (0f64, 0f64);
        for turn in 0..3 {
            let tag = format!("bench-{turn}");
            through = through.max(run(mount, &tag)?);
            on = on.max(run(backing, &tag)?);
        }
        out.push(Rate {
            operation: operation.into(),
            unit: unit.into(),
            through_mount: through,
            on_backing: on,
        });
    }
    Ok(out)
}

fn metadata(dir: &Path, tag: &str) -> anyhow::Result<f64> {
    let started = Instant::now();
    for i in 0..METADATA_FILES {
        let path = dir.join(format!("{tag}-{i}"));
        std::fs::write(&path, b"x")?;
        std::fs::metadata(&path)?;
        std::fs::remove_file(&path)?;
    }
    Ok(METADATA_FILES as f64 / started.elapsed().as_secs_f64())
}

fn data_file(dir: &Path) -> PathBuf {
    dir.join("bench-data")
}

fn write(dir: &Path, _: &str) -> anyhow::Result<f64> {
    let chunk = vec![0xa5u8; CHUNK];
    let started = Instant::now();
    let mut file = std::fs::File::create(data_file(dir))?;
    for _ in 0..DATA_BYTES / CHUNK {
        file.write_all(&chunk)?;
    }
    file.sync_all()?;
    Ok((DATA_BYTES >> 20) as f64 / started.elapsed().as_secs_f64())
}

/// Reads what `write` left (page cache included, on both paths alike).
fn read(dir: &Path, _: &str) -> anyhow::Result<f64> {
    let mut chunk = vec![0u8; CHUNK];
    let started = Instant::now();
    let mut file = std::fs::File::open(data_file(dir))?;
    let mut total = 0;
    loop {
        let n = file.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        total += n;
    }
    anyhow::ensure!(total == DATA_BYTES, "read {total} of {DATA_BYTES} bytes");
    Ok((total >> 20) as f64 / started.elapsed().as_secs_f64())
}

impl Report {
    /// Section 10.
    pub fn print_filesystem(&self) {
        let Some(f) = &self.filesystem else {
            return;
        };
        println!();
        println!(
            "10. Filesystem devices (ms; {} volumes of each kind, one at a time)",
            f.volumes
        );
        let mut table = Table::new(&["rpc", "n", "p50", "p95", "max", "SNAP calls"]);
        for r in &f.stages {
            table.row(vec![
                r.rpc.clone(),
                r.latency.samples.to_string(),
                ms(r.latency.p50_ms),
                ms(r.p95_ms),
                ms(r.latency.max_ms),
                num(r.snap_calls),
            ]);
        }
        table.print();
        let mut table = Table::new(&["operation", "unit", "through the mount", "backing dir", "x"]);
        for r in &f.rates {
            table.row(vec![
                r.operation.clone(),
                r.unit.clone(),
                num(r.through_mount),
                num(r.on_backing),
                format!(
                    "{:.2}",
                    r.through_mount / r.on_backing.max(f64::MIN_POSITIVE)
                ),
            ]);
        }
        table.print();
        println!(
            "   (the mount: the emulated host's FUSE server over the fsdev's tree, standing in for virtio-fs; no target judged)"
        );
    }
}
