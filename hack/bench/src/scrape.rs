//! Section 4's scrape: with every scale volume staged, the node's
//! `/metrics` page, whose per-volume I/O series come from one read of SNAP's
//! counters (`bdev_get_iostat`; through the DPU agent in split mode) that
//! serves every scrape for a second. Timed: scrapes that read (each once the
//! last read is older than that) and scrapes that share a read.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::prom::scrape;
use crate::stack::Stack;
use crate::stats::Summary;

/// Scrapes that read; after each, [`SHARING`] scrapes that share its read.
const READING: usize = 5;
const SHARING: usize = 4;
/// Longer than one read serves (1 s).
const PAST_A_READ: Duration = Duration::from_millis(1100);

#[derive(Debug, Clone, Serialize)]
pub struct Scrape {
    pub volumes: usize,
    /// Volumes the page has series of (bytes written).
    pub volumes_on_page: usize,
    pub reading: Summary,
    pub sharing: Summary,
    /// `bdev_get_iostat` calls per reading scrape and its sharing ones.
    pub iostat_per_read: f64,
    /// Mean time of one, as the caller (node or agent) measured it.
    pub iostat_ms: f64,
}

pub async fn measure(stack: &Stack, volumes: usize) -> anyhow::Result<Scrape> {
    // Where the calls are counted: the node co-located, the agent in split mode.
    let layer = stack
        .split
        .as_ref()
        .map_or(&stack.node_metrics, |link| &link.metrics);
    let (mut reading, mut sharing, mut pages) = (Vec::new(), Vec::new(), Vec::new());
    let mut volumes_on_page = 0;
    for _ in 0..READING {
        tokio::time::sleep(PAST_A_READ).await;
        let started = Instant::now();
        let page = scrape(&stack.node_metrics).await?;
        reading.push(started.elapsed());
        volumes_on_page = page.series("snap_csi_volume_written_bytes_total");
        for _ in 0..SHARING {
            let started = Instant::now();
            scrape(&stack.node_metrics).await?;
            sharing.push(started.elapsed());
        }
        // Co-located this is one more sharing scrape.
        pages.push(scrape(layer).await?);
    }
    let grew = |name: &str| pages[READING - 1].iostat(name) - pages[0].iostat(name);
    let calls = grew("snap_csi_outbound_requests_total");
    Ok(Scrape {
        volumes,
        volumes_on_page,
        reading: Summary::of(&reading),
        sharing: Summary::of(&sharing),
        iostat_per_read: calls / (READING - 1) as f64,
        iostat_ms: grew("snap_csi_outbound_request_duration_seconds_sum") * 1e3 / calls.max(1.0),
    })
}
