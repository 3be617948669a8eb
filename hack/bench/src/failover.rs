//! Section 11: how long a path's failure stalls a pod's writes. On section
//! 1's stack, one multipath NVMe-oF block volume (the sample plugin's
//! `nvmf-multipath`: exported on both of the target's listeners, attached on
//! the DPU through both with SPDK's multipath) is staged and published, and
//! the harness's [`Writer`] writes its device one synced 64 KiB block at a
//! time, timing each write:
//!
//! - first, without a fault: the writer is looked at after every write
//!   (the longest write since the last look: one write, now and then two
//!   when this thread was late), which gives the normal write's p50/p99,
//!   and those looks grouped into windows of [`WRITES`] writes give the
//!   longest write of a window without a fault, the stall's comparison;
//! - then `--failovers` times: once the plugin's page shows both paths
//!   connected, the path I/O goes through now is cut on the target
//!   ([`How::Listener`]: its listener removed, its connections dropped), and
//!   the longest write until [`WRITES`] more have ended is that failover's
//!   stall; then the time until the controller has put the listener back
//!   (its re-export, every 2 s) and the plugin's page shows both paths
//!   connected again (SPDK reconnects every 1 s) is the time to recovery;
//!   no call of ours brings the path back. [`WRITES`] more writes then let
//!   I/O go back to the path it prefers (SPDK's active-passive: the first
//!   attached), so that the switch back, and its new connection, fall in
//!   the return's window (reported too) and not in the next cut's;
//! - then `--silent-failovers` times the same with the path gone silent
//!   ([`How::Silent`]: its packets dropped, nothing closed, as a link lost
//!   on the way): the DPU's SPDK finds out only by its TCP_USER_TIMEOUT
//!   (SNAP's `transport_ack_timeout`, which local-up gives every SNAP), so
//!   the stall holds that detection. The bench lifts the cut once the
//!   [`WRITES`] writes have ended; recovery runs from the cut as above.
//!
//! Afterwards the writer stops: zero I/O errors, and every block must read
//! back as last written ([`paths::Written::verify`]), or the section fails.
//!
//! Co-located only: a split stack differs in the node's link to the DPU
//! agent, which neither a write (host, SNAP, SPDK's bdev_nvme, the target)
//! nor a failover (SPDK on the DPU and the target) crosses; its twin would
//! measure the same machinery again.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use serde::Serialize;
use snap_csi_harness::paths::{self, Cut, How, ListenAddress, Writer};

use crate::Args;
use crate::csi::{Clients, Kind, parameters};
use crate::prom::scrape;
use crate::report::Report;
use crate::stack::Stack;
use crate::stats::Summary;
use crate::table::{Table, ms};

/// The StorageClass parameter asking for every path.
const MULTIPATH: (&str, &str) = ("nvmf-multipath", "true");
/// Writes after a cut (and per window without one): enough that the write
/// the cut caught, and the path's switch, are inside the window, while the
/// cut path is still gone (its listener comes back within 2 s).
pub const WRITES: u64 = 32;
/// Writes the normal window looks at, one look per write.
const NORMAL_WRITES: u64 = 1000;
/// How long anything may take: well past the controller's re-export period
/// (2 s) and SPDK's reconnect delay (1 s), on a loaded machine.
const BUDGET: Duration = Duration::from_secs(60);
/// How much the writer writes over and over (less on a smaller volume).
const SPAN: u64 = 64 << 20;

/// One failover: the current path cut, the stall, the path's return.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// `traddr:trsvcid` of the path cut.
    pub path: String,
    /// Whether the path went silent (its packets dropped) rather than its
    /// listener removed.
    pub silent: bool,
    /// The longest write from just before the cut until [`WRITES`] more ended.
    pub stall_ms: f64,
    /// Whether those writes ended before the cut path was back (false: the
    /// controller's re-export came first, so the writes may have waited for
    /// the same path's return instead of failing over). A silent cut lasts
    /// until they have ended.
    pub before_return: bool,
    /// The path I/O went through right after the stall, by the plugin's page.
    pub current_after: Option<String>,
    /// From the cut until the path was back: the target listed its listener
    /// again, or the bench lifted the silent cut.
    pub back_ms: f64,
    /// From the cut until the plugin's page showed both paths connected.
    pub recovered_ms: f64,
    /// The longest write from the stall's end until [`WRITES`] writes after
    /// that recovery (I/O going back to the path it prefers).
    pub return_longest_ms: f64,
}

/// Everything section 11 reports.
#[derive(Debug, Clone, Serialize)]
pub struct Failover {
    pub size_mib: i64,
    pub span_mib: u64,
    pub writes_per_window: u64,
    /// The volume's paths (the subsystem's listeners on the target).
    pub paths: Vec<String>,
    /// Without a fault, one look per write: the longest write since the
    /// last look (mostly one write, sometimes two).
    pub normal: Summary,
    pub normal_writes: u64,
    /// Without a fault, the longest write of each window of [`WRITES`].
    pub normal_windows: Summary,
    pub events: Vec<Event>,
    /// The stalls of the listener cuts.
    pub stall: Summary,
    /// The stalls of the silent cuts.
    pub silent_stall: Summary,
    pub recovery: Summary,
    pub writes: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub longest_ms: f64,
    pub bytes_written: u64,
    /// Bytes read back as last written (0 when the read-back failed).
    pub bytes_verified: u64,
    /// Why the read-back failed, if it did.
    pub verify_error: Option<String>,
}

/// Section 11 on `stack` (section 1's); the report's figures are stored
/// before an error about the data is returned, so that they are printed.
pub async fn run(
    args: &Args,
    stack: &Stack,
    clients: &Clients,
    report: &mut Report,
) -> anyhow::Result<()> {
    let mut clients = clients.clone();
    let mut parameters = parameters("nvmf", "nvme", None);
    parameters.insert(MULTIPATH.0.into(), MULTIPATH.1.into());
    let volume = clients
        .create_with(
            &stack.kubelet,
            "failover",
            &Kind::Block,
            args.size_mib,
            parameters,
        )
        .await?;
    let nqn = volume
        .context
        .get("subnqn")
        .context("the multipath volume's context names no subsystem (subnqn)")?
        .clone();
    let socket = stack.target_socket();
    let all = paths::listeners(&socket, &nqn).await?;
    ensure!(
        all.len() >= 2,
        "{nqn} has {} listener(s) on the target, not two",
        all.len()
    );
    clients.stage(&volume).await?;
    clients.publish(&volume).await?;

    let span = SPAN.min(u64::try_from(args.size_mib)? << 20);
    let writer = Writer::start(&volume.target, 0, span)?;
    let looks = tokio::task::block_in_place(|| look_per_write(&writer, NORMAL_WRITES))?;
    let per_look: Vec<f64> = looks.iter().map(|&(_, ms)| ms).collect();

    let mut events = Vec::new();
    let hows = std::iter::repeat_n(How::Listener, args.failovers as usize).chain(
        std::iter::repeat_n(How::Silent, args.silent_failovers as usize),
    );
    for (n, how) in hows.enumerate() {
        let current = paths::wait_connected(
            &stack.plugin_metrics,
            &volume.id,
            &all,
            Instant::now() + BUDGET,
        )
        .await?
        .with_context(|| {
            format!(
                "the plugin's page names no current path of {} (failover {})",
                volume.id,
                n + 1
            )
        })?;
        let event = fail_over(
            how, &writer, &socket, &nqn, &all, current, stack, &volume.id,
        )
        .await?;
        eprintln!(
            "bench: section 11: failover {}: {} cut{}, longest write {} ms, both connected again after {} ms",
            n + 1,
            event.path,
            if event.silent { " silently" } else { "" },
            ms(event.stall_ms),
            ms(event.recovered_ms)
        );
        events.push(event);
    }

    let written = tokio::task::block_in_place(|| writer.stop())?;
    let seen = written.seen.clone();
    let verify_error = if seen.errors == 0 {
        tokio::task::block_in_place(|| written.verify())
            .err()
            .map(|e| format!("{e:#}"))
    } else {
        None
    };
    let block = written.bytes().checked_div(seen.writes).unwrap_or(0);
    let verified = verify_error.is_none() && seen.errors == 0;
    clients.unpublish(&volume).await?;
    clients.unstage(&volume).await?;
    clients.delete(&volume).await?;

    let ms_of = |silent: bool, of: fn(&Event) -> f64| -> Vec<f64> {
        events
            .iter()
            .filter(|e| e.silent == silent)
            .map(of)
            .collect()
    };
    let result = Failover {
        size_mib: args.size_mib,
        span_mib: span >> 20,
        writes_per_window: WRITES,
        paths: all.iter().map(paths::show).collect(),
        normal: Summary::of_ms(&per_look),
        normal_writes: looks.iter().map(|&(w, _)| w).sum(),
        normal_windows: Summary::of_ms(&windows(&looks, WRITES)),
        stall: Summary::of_ms(&ms_of(false, |e| e.stall_ms)),
        silent_stall: Summary::of_ms(&ms_of(true, |e| e.stall_ms)),
        recovery: Summary::of_ms(&events.iter().map(|e| e.recovered_ms).collect::<Vec<_>>()),
        events,
        writes: seen.writes,
        errors: seen.errors,
        first_error: seen.first_error.clone(),
        longest_ms: seen.longest.as_secs_f64() * 1e3,
        bytes_written: written.bytes(),
        bytes_verified: if verified {
            read_back(seen.writes, span, block)
        } else {
            0
        },
        verify_error: verify_error.clone(),
    };
    report.failover = Some(result);
    report.print_failover();
    report.save(args)?;
    ensure!(
        seen.errors == 0,
        "the writer saw {} I/O error(s) while paths failed (first: {})",
        seen.errors,
        seen.first_error.as_deref().unwrap_or("?")
    );
    if let Some(error) = verify_error {
        anyhow::bail!("after the failovers: {error}");
    }
    Ok(())
}

/// One failover of `current` while `writer` writes: cut `how`, stall, return.
#[allow(clippy::too_many_arguments)]
async fn fail_over(
    how: How,
    writer: &Writer,
    socket: &Path,
    nqn: &str,
    all: &[ListenAddress],
    current: ListenAddress,
    stack: &Stack,
    volume_id: &str,
) -> anyhow::Result<Event> {
    writer.take_window();
    let cut = Instant::now();
    let held = paths::cut_as(how, socket, nqn, &current).await?;
    ensure!(
        tokio::task::block_in_place(|| writer.wait_writes(WRITES, BUDGET)),
        "the writes stopped when path {} was cut",
        paths::show(&current)
    );
    let stall = writer.take_window();
    // What the failover left: the cut path still gone, I/O on the other.
    let (listed, page) =
        tokio::try_join!(paths::listeners(socket, nqn), scrape(&stack.plugin_metrics))?;
    let current_after = all
        .iter()
        .find(|p| paths::plugin_state(&page, volume_id, p).is_some_and(|(_, current)| current))
        .map(paths::show);
    let silent = matches!(held, Cut::Silent(_));
    let before_return = silent || !listed.contains(&current);
    match held {
        Cut::Listener => paths::wait_listed(socket, nqn, &current, cut + BUDGET).await?,
        Cut::Silent(hole) => drop(hole),
    }
    let back = cut.elapsed();
    paths::wait_connected(
        &stack.plugin_metrics,
        volume_id,
        all,
        Instant::now() + BUDGET,
    )
    .await?;
    let recovered = cut.elapsed();
    // I/O goes back to the path it prefers at its next write: that switch,
    // and its new connection, belong to the return, not to the next cut.
    ensure!(
        tokio::task::block_in_place(|| writer.wait_writes(WRITES, BUDGET)),
        "the writes stopped when path {} came back",
        paths::show(&current)
    );
    Ok(Event {
        path: paths::show(&current),
        silent,
        stall_ms: stall.as_secs_f64() * 1e3,
        before_return,
        current_after,
        back_ms: back.as_secs_f64() * 1e3,
        recovered_ms: recovered.as_secs_f64() * 1e3,
        return_longest_ms: writer.take_window().as_secs_f64() * 1e3,
    })
}

/// Looks at `writer` after every write until `writes` more have ended:
/// per look, the writes it covered and the longest of them (ms).
fn look_per_write(writer: &Writer, writes: u64) -> anyhow::Result<Vec<(u64, f64)>> {
    writer.take_window();
    let done = |w: &Writer| {
        let seen = w.seen();
        seen.writes + seen.errors
    };
    let (start, mut last) = (done(writer), done(writer));
    let mut looks = Vec::new();
    while last - start < writes {
        ensure!(
            writer.wait_writes(1, BUDGET),
            "the writer's writes did not end (no fault yet)"
        );
        let longest = writer.take_window();
        let now = done(writer);
        looks.push((now - last, longest.as_secs_f64() * 1e3));
        last = now;
    }
    Ok(looks)
}

/// The longest write of each run of consecutive looks that together
/// covered at least `per` writes; a last run short of that is left out.
fn windows(looks: &[(u64, f64)], per: u64) -> Vec<f64> {
    let mut out = Vec::new();
    let (mut covered, mut longest) = (0, 0f64);
    for &(writes, ms) in looks {
        covered += writes;
        longest = longest.max(ms);
        if covered >= per {
            out.push(longest);
            (covered, longest) = (0, 0.0);
        }
    }
    out
}

/// Bytes the read-back checked: every block written at least once (the
/// writer goes round the span from its start, one block per write).
fn read_back(writes: u64, span: u64, block: u64) -> u64 {
    if block == 0 {
        return 0;
    }
    writes.min(span / block) * block
}

impl Report {
    /// Section 11.
    pub fn print_failover(&self) {
        let Some(f) = &self.failover else {
            return;
        };
        println!();
        println!(
            "11. A path failover's stall: a multipath NVMe-oF block volume (two paths), its current path cut on the target\n    (its listener removed, or silenced) while the host writes it (64 KiB, O_DIRECT|O_DSYNC, one at a time over {} MiB)",
            f.span_mib
        );
        let mut table = Table::new(&[
            "failovers",
            "stall p50 ms",
            "stall max ms",
            "silent stall p50 ms",
            "silent max ms",
            "normal write p50 ms",
            "p99 ms",
            "no-fault window max ms",
            "recovery p50 s",
            "recovery max s",
            "errors",
            "verified MiB",
        ]);
        let s = |ms: f64| format!("{:.2}", ms / 1e3);
        table.row(vec![
            f.events.len().to_string(),
            ms(f.stall.p50_ms),
            ms(f.stall.max_ms),
            ms(f.silent_stall.p50_ms),
            ms(f.silent_stall.max_ms),
            ms(f.normal.p50_ms),
            ms(f.normal.p99_ms),
            ms(f.normal_windows.max_ms),
            s(f.recovery.p50_ms),
            s(f.recovery.max_ms),
            f.errors.to_string(),
            (f.bytes_verified >> 20).to_string(),
        ]);
        table.print();
        let mut table = Table::new(&[
            "#",
            "path cut",
            "how",
            "stall ms",
            "before its return",
            "current after",
            "path back s",
            "both connected s",
            "longest write meanwhile ms",
        ]);
        for (i, e) in f.events.iter().enumerate() {
            table.row(vec![
                (i + 1).to_string(),
                e.path.clone(),
                if e.silent { "silent" } else { "listener" }.into(),
                ms(e.stall_ms),
                if e.before_return { "yes" } else { "no" }.into(),
                e.current_after.clone().unwrap_or_else(|| "-".into()),
                s(e.back_ms),
                s(e.recovered_ms),
                ms(e.return_longest_ms),
            ]);
        }
        table.print();
        println!(
            "   (stall: the longest write from just before the cut until {} more ended; normal: one look at the writer\n    per write without a fault ({} writes in {} looks), and the longest write of each window of {} writes without one;\n    recovery: the cut until the plugin's page shows both paths connected again (the controller re-exports a lost\n    listener within 2 s, the bench lifts a silent cut once the writes ended, SPDK reconnects every 1 s); {} writes ({} MiB), longest {} ms, {})",
            f.writes_per_window,
            f.normal_writes,
            f.normal.samples,
            f.writes_per_window,
            f.writes,
            f.bytes_written >> 20,
            ms(f.longest_ms),
            match (&f.verify_error, f.errors) {
                (Some(error), _) => format!("READ-BACK FAILED: {error}"),
                (None, 0) => "every block read back as last written".into(),
                (None, _) => "not read back: the writes failed".into(),
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looks_group_into_windows_of_writes() {
        // Looks of one write mostly, one of two; windows of 3 writes.
        let looks = [(1, 1.0), (1, 4.0), (1, 2.0), (2, 1.5), (1, 9.0), (1, 0.5)];
        assert_eq!(windows(&looks, 3), vec![4.0, 9.0]);
        // A last run short of a window is left out.
        assert_eq!(windows(&looks[..4], 3), vec![4.0]);
        assert_eq!(windows(&looks, 1), vec![1.0, 4.0, 2.0, 1.5, 9.0, 0.5]);
        assert!(windows(&[], 32).is_empty());
    }

    #[test]
    fn read_back_counts_each_block_written_once() {
        let block = 64 << 10;
        // Less than one round: the blocks written.
        assert_eq!(read_back(10, 64 << 20, block), 10 * block);
        // Round and round: the whole span.
        assert_eq!(read_back(5000, 64 << 20, block), 64 << 20);
        assert_eq!(read_back(0, 64 << 20, block), 0);
        assert_eq!(read_back(7, 64 << 20, 0), 0);
    }
}
