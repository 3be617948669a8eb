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
use snap_csi_harness::paths::{self, Writer};

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
        let current =
            paths::wait_connected(plugin_metrics, &volume.id, &all, Instant::now() + BUDGET)
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
            paths::show(&current)
        );
        let stall = writer.take_window();
        paths::wait_listed(target_socket, nqn, &current, cut + BUDGET).await?;
        paths::wait_connected(plugin_metrics, &volume.id, &all, Instant::now() + BUDGET).await?;
        events.push(format!(
            "{} (the path the I/O took) cut: longest write {:.0} ms ({:.0} ms just before); \
             both paths connected again {:.1} s after the cut, with no call of ours",
            paths::show(&current),
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
