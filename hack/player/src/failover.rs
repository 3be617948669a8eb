//! A multipath volume (the sample plugin's `nvmf-multipath`: attached on the
//! DPU through every listener of its subsystem) while its paths fail, as
//! the pod sees it: the path its I/O takes is cut on the target while the
//! pod writes (twice), the writes must go on through the other path without
//! an error, the path must come back by itself (the controller restores
//! the listener, SPDK on the DPU reconnects: no call of ours), and
//! afterwards every block must hold what was last written to it.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use snap_csi_harness::csi::Volume;
use snap_csi_harness::paths::{self, ListenAddress, Writer};
use snap_csi_harness::prom::scrape;

/// The StorageClass parameter asking for every path.
pub const MULTIPATH: (&str, &str) = ("nvmf-multipath", "true");
/// How many times the path the I/O takes is cut.
const CUTS: usize = 2;
/// Writes the pod makes between two events, to show it is writing.
const WRITES: u64 = 32;
/// How long anything may take: well past the controller's re-export period
/// (2 s) and SPDK's reconnect delay (1 s), on a loaded machine.
const BUDGET: Duration = Duration::from_secs(60);
/// How much the pod writes over and over (from the player's offset).
const SPAN: u64 = 64 << 20;

/// The proof's line; an error if the pod saw an error, lost a byte, or a
/// path did not come back.
pub async fn failover(
    volume: &Volume,
    target_socket: &Path,
    plugin_metrics: &str,
) -> anyhow::Result<String> {
    let nqn = volume
        .context
        .get("subnqn")
        .context("a multipath volume is an NVMe-oF volume (its context names its subsystem)")?;
    let all = paths::listeners(target_socket, nqn).await?;
    ensure!(
        all.len() >= 2,
        "{nqn} has {} listener(s), not two",
        all.len()
    );
    let writer = Writer::start(&volume.target, super::OFFSET, SPAN)?;
    ensure!(
        writer.wait_writes(WRITES, BUDGET),
        "the pod's first writes did not end"
    );
    let mut events = Vec::new();
    for _ in 0..CUTS {
        // Both paths up first, so that the cut leaves one that is.
        let current = both_connected(volume, &all, plugin_metrics)
            .await?
            .context("the plugin's page names no path the volume's I/O goes through")?;
        writer.take_window();
        ensure!(
            writer.wait_writes(WRITES, BUDGET),
            "the pod's writes stopped"
        );
        let before = writer.take_window();
        let cut = Instant::now();
        paths::cut(target_socket, nqn, &current).await?;
        ensure!(
            writer.wait_writes(WRITES, BUDGET),
            "the pod's writes stopped when path {} was cut",
            show(&current)
        );
        let stall = writer.take_window();
        back(target_socket, nqn, &current, cut).await?;
        both_connected(volume, &all, plugin_metrics).await?;
        events.push(format!(
            "{} (the path the I/O took) cut: longest write {:.0} ms ({:.0} ms just before); \
             both paths connected again {:.1} s after the cut, with no call of ours",
            show(&current),
            stall.as_secs_f64() * 1e3,
            before.as_secs_f64() * 1e3,
            cut.elapsed().as_secs_f64(),
        ));
    }
    let written = writer.stop()?;
    let seen = &written.seen;
    if seen.errors > 0 {
        bail!(
            "the pod saw {} I/O error(s) while paths failed (first: {})",
            seen.errors,
            seen.first_error.as_deref().unwrap_or("?")
        );
    }
    written.verify()?;
    Ok(format!(
        "multipath: {} writes ({} MiB) through two paths, the one in use cut {CUTS} times, 0 I/O errors, \
         longest write {:.0} ms; every block read back as last written\n    {}",
        seen.writes,
        written.bytes() >> 20,
        seen.longest.as_secs_f64() * 1e3,
        events.join("\n    ")
    ))
}

fn show(path: &ListenAddress) -> String {
    format!("{}:{}", path.traddr, path.trsvcid)
}

/// Waits until the target lists `path` again: the controller's re-export.
async fn back(socket: &Path, nqn: &str, path: &ListenAddress, cut: Instant) -> anyhow::Result<()> {
    while !paths::listeners(socket, nqn).await?.contains(path) {
        ensure!(
            cut.elapsed() < BUDGET,
            "the controller did not restore listener {} of {nqn}",
            show(path)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Waits until the plugin's page shows every path of the volume connected;
/// the path I/O goes through then, if the page names one.
async fn both_connected(
    volume: &Volume,
    all: &[ListenAddress],
    plugin_metrics: &str,
) -> anyhow::Result<Option<ListenAddress>> {
    let started = Instant::now();
    loop {
        let page = scrape(plugin_metrics).await?;
        let states: Vec<_> = all
            .iter()
            .map(|p| paths::plugin_state(&page, &volume.id, p))
            .collect();
        if states
            .iter()
            .all(|s| s.is_some_and(|(connected, _)| connected))
        {
            let current = all
                .iter()
                .zip(&states)
                .find(|(_, s)| s.is_some_and(|(_, current)| current));
            return Ok(current.map(|(p, _)| p.clone()));
        }
        ensure!(
            started.elapsed() < BUDGET,
            "the plugin's page does not show every path of {} connected: {states:?}",
            volume.id
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
