//! The DPU-down fault, on a host with two DPUs: one DPU's processes killed
//! with SIGKILL and held down for 2–8 s (local-up `--supervise` starts each
//! again after the pause in `pids/NAME.restart-delay`), then let back up.
//! Co-located, the DPU is its SNAP and plugin; split, at random its agent
//! alone (the node's link to it lost, SNAP still serving the host's
//! devices), its SNAP and plugin (the agent answers, not ready), or all
//! three (the DPU's OS gone).
//!
//! Beside the workers' judgement (`lifecycle`: the downed DPU's volumes may
//! have their I/O refused while it is down, the other DPU's may not, and
//! every pattern must read back after), a DPU down must see:
//! - the node's page show `snap_csi_dpu_up{dpu}` 0 while the DPU is down
//!   (within [`SHOW_BUDGET`]: the DPU is held down past its drawn time
//!   until the page has shown it, see `keep_down`), and 1 again within
//!   [`UP_AGAIN_BUDGET`] of its return;
//! - once the page shows it down: Probe ready within the liveness probe's
//!   timeout ([`LIVENESS_TIMEOUT`]: the other DPU serves), and a new
//!   volume's stage succeed at its first attempt, recorded on the other DPU;
//! - within [`CLEARING_BUDGET`] of the return, no volume with objects on a
//!   DPU its record does not name (`census::misplaced`): each one left then
//!   is a leak.
//!
//! A check that fails but the last is a fault that did not converge.

use std::cell::Cell;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::{Signal, kill};
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::identity_client::IdentityClient;
use snap_csi_harness::csi::{Kind, Volume, channel, parameters};
use snap_csi_harness::dpus::recorded_on;
use snap_csi_harness::prom::scrape;
use snap_csi_harness::stack::DpuParts;

use crate::census::{self, CLEARING_BUDGET};
use crate::faults::{Injector, RESTART_BUDGET, Successor, restart_delay};
use crate::lifecycle::converge;

/// The fault's name in the tally.
pub const DPU_DOWN: &str = "DPU down";

/// The node's gauge of each DPU: 1 while its last probe found it serving.
const DPU_UP: &str = "snap_csi_dpu_up";
/// How long after the kill the node's page may take to show the DPU down
/// (the DPU is held down meanwhile): the node probes every 2 s, a probe of
/// a DPU whose plugin or agent is gone tries again until its 3 s timeout,
/// and while an agent is gone a read of the page waits up to 5 s for its
/// I/O counters; twice that, for a loaded machine.
const SHOW_BUDGET: Duration = Duration::from_secs(20);
/// The pause before the gate's successor when it is killed again.
const REKILL_PAUSE: Duration = Duration::from_millis(500);
/// How often the processes held down are looked at.
const LOOK_EVERY: Duration = Duration::from_millis(100);
/// How long after the DPU's processes answer again the node's page may
/// still show it down: two probe periods and timeouts, on a loaded machine.
const UP_AGAIN_BUDGET: Duration = Duration::from_secs(20);
/// The liveness probe's timeout on Probe (`--probe-timeout` of the
/// liveness-probe sidecar in deploy/kubernetes): a slower answer restarts
/// the node's container.
const LIVENESS_TIMEOUT: Duration = Duration::from_secs(3);
/// How often the node's page is read while the DPU is down.
const SCRAPE_EVERY: Duration = Duration::from_millis(250);
/// The volume staged while the DPU is down: a block volume (no mkfs, only
/// the placement is in question).
const NEW_VOLUME_MIB: i64 = 64;

/// What of a DPU goes down.
#[derive(Debug, Clone, Copy)]
enum Downed {
    SnapAndPlugin,
    Agent,
    Everything,
}

impl Downed {
    /// A split DPU's choices; co-located, SNAP and plugin are the DPU.
    const SPLIT: [Downed; 3] = [Downed::Agent, Downed::SnapAndPlugin, Downed::Everything];

    /// Its processes, as local-up names them on the first DPU.
    fn processes(self) -> &'static [&'static str] {
        match self {
            Downed::SnapAndPlugin => &["snap", "plugin"],
            Downed::Agent => &["agent"],
            Downed::Everything => &["agent", "snap", "plugin"],
        }
    }

    /// The process whose absence alone keeps the DPU down for the node,
    /// and whose successor can be killed again at any instant of its start
    /// (the emulator's cannot: see `keep_down`).
    fn gate(self) -> &'static str {
        match self {
            Downed::SnapAndPlugin => "plugin",
            Downed::Agent | Downed::Everything => "agent",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Downed::SnapAndPlugin => "SNAP and plugin",
            Downed::Agent => "agent",
            Downed::Everything => "agent, SNAP and plugin",
        }
    }
}

/// The DPU-down faults of a round (which DPU, until when), for the
/// workers' judgement of a refused I/O.
#[derive(Debug, Default)]
pub struct Outages(Mutex<Vec<Outage>>);

#[derive(Debug)]
struct Outage {
    dpu: String,
    /// When it ended; `None` while it lasts.
    to: Option<Instant>,
}

impl Outages {
    fn lock(&self) -> MutexGuard<'_, Vec<Outage>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn begin(&self, dpu: &str) -> usize {
        let mut outages = self.lock();
        outages.push(Outage {
            dpu: dpu.to_string(),
            to: None,
        });
        outages.len() - 1
    }

    fn end(&self, index: usize) {
        if let Some(outage) = self.lock().get_mut(index) {
            outage.to = Some(Instant::now());
        }
    }

    /// The DPUs that were down at some moment since `since`.
    pub fn down_since(&self, since: Instant) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|o| o.to.is_none_or(|to| to >= since))
            .map(|o| o.dpu.clone())
            .collect()
    }
}

/// The restart-delay files of the processes held down, removed when
/// dropped (on every way out: a file left would hold the next restart too).
#[derive(Debug, Default)]
struct Held(Vec<PathBuf>);

impl Drop for Held {
    fn drop(&mut self) {
        for file in &self.0 {
            let _ = std::fs::remove_file(file);
        }
    }
}

impl Injector<'_> {
    /// One DPU down for 2–8 s, then back; see the module's comment.
    pub(crate) async fn dpu_down(&mut self) -> anyhow::Result<()> {
        let dpus = self.stack.dpu_parts();
        // Every choice drawn first, so that a seed draws the same whatever
        // the stack does.
        let dead = self.draw() % dpus.len();
        let downed = match self.stack.split {
            Some(_) => *self.rng.pick(&Downed::SPLIT),
            None => Downed::SnapAndPlugin,
        };
        let hold = self.rng.millis(2000, 8000);
        let backend = *self.rng.pick(&["aio", "nvmf"]);
        let emulation = *self.rng.pick(&["nvme", "virtio-blk"]);
        let name = format!("chaos-dpu-down-{:016x}", self.rng.next());
        let (dead, live) = (&dpus[dead], &dpus[(dead + 1) % dpus.len()]);

        // Made before the fault: the controller needs no DPU.
        let volume = converge(&self.tally, "CreateVolume", &name, || {
            let (mut clients, kubelet) = (self.clients.clone(), self.stack.kubelet.clone());
            let name = name.clone();
            async move {
                let parameters = parameters(backend, emulation, None);
                clients
                    .create_with(&kubelet, &name, &Kind::Block, NEW_VOLUME_MIB, parameters)
                    .await
            }
        })
        .await?;

        let mut held = Held::default();
        let mut victims = Vec::new();
        for process in downed.processes() {
            let process = dead.process(process);
            let pid = self.stack.pid(&process)?;
            let delay = restart_delay(&self.stack.dir, &process);
            std::fs::write(&delay, format!("{:.3}", hold.as_secs_f64()))
                .with_context(|| format!("writing {}", delay.display()))?;
            held.0.push(delay);
            victims.push((process, pid));
        }
        let started = Instant::now();
        for (process, pid) in &victims {
            kill(*pid, Signal::SIGKILL).with_context(|| format!("SIGKILL to {process} ({pid})"))?;
        }
        self.tally.fault(DPU_DOWN);
        self.tally
            .note(format!("DPU down: {}", downed.describe()), "");
        let outage = self.outages.begin(&dead.name);

        // Down: the processes held down and watched back (the keeper),
        // while the node's page is read until it shows the DPU down, then
        // Probe and a new stage (the watcher).
        let (seen_down, released, done) = (Cell::new(None), Cell::new(false), Cell::new(false));
        let gate = dead.process(downed.gate());
        let keeper = async {
            let kept = self.keep_down(&victims, &gate, started, &released).await;
            done.set(true);
            kept
        };
        let watcher = async {
            let mut staged = None;
            while !done.get() {
                if !released.get() && self.node_shows_up(&dead.name).await == Some(false) {
                    seen_down.set(Some(started.elapsed()));
                    staged = Some(self.stage_elsewhere(&volume, dead, live).await);
                }
                if staged.is_some() || started.elapsed() >= SHOW_BUDGET {
                    released.set(true);
                }
                tokio::time::sleep(SCRAPE_EVERY).await;
            }
            staged
        };
        let ((down, longer), staged) = tokio::join!(keeper, watcher);
        self.outages.end(outage);
        // Every successor has read its pause: the next restarts are quick.
        drop(held);

        let fault = format!(
            "DPU {} down ({}, {:.1} s)",
            dead.name,
            downed.describe(),
            down.as_secs_f64()
        );
        if longer > 0 {
            self.tally.note_times(
                "DPU down: its processes killed again while the node's page did not show it down",
                longer,
                "",
            );
        }
        if seen_down.get().is_none() {
            self.tally.stuck(format!(
                "{fault}: the node's page did not show {DPU_UP} 0 for it within {} s",
                SHOW_BUDGET.as_secs()
            ));
        }
        if let Some(Err(why)) = &staged {
            self.tally.stuck(format!("{fault}: {why}"));
        }
        let up_again = self.until_shown_up(&dead.name).await;
        if up_again.is_none() {
            self.tally.stuck(format!(
                "{fault}: the node's page did not show {DPU_UP} 1 for it within {} s of its return",
                UP_AGAIN_BUDGET.as_secs()
            ));
        }
        self.forget(&volume).await;
        let cleared = census::misplaced_settle(self.stack, CLEARING_BUDGET).await;
        if let Err(left) = &cleared {
            for what in left {
                self.tally.leak(format!(
                    "{fault}, {} s after its return: {what}",
                    CLEARING_BUDGET.as_secs()
                ));
            }
        }
        let seconds = |d: Option<Duration>| {
            d.map_or("-".to_string(), |d| format!("{:.1} s", d.as_secs_f64()))
        };
        let stage = match &staged {
            Some(Ok((probe, stage))) => format!(
                "Probe ready in {} ms, a new volume staged on {} in {} ms",
                probe.as_millis(),
                live.name,
                stage.as_millis()
            ),
            Some(Err(_)) => "the checks while down failed".to_string(),
            None => "no stage while down".to_string(),
        };
        eprintln!(
            "chaos: {fault}: the node's page showed it down {} after it went, {stage}; up again {} \
             after its return; nothing misplaced {} after",
            seconds(seen_down.get()),
            seconds(up_again),
            seconds(cleared.ok()),
        );
        Ok(())
    }

    /// Holds the DPU's processes down: each is started again after the
    /// drawn hold, but the gate's successor is killed again until the
    /// watcher has seen the node's page show the DPU down and made its
    /// checks (or given up, [`SHOW_BUDGET`] after the kill): `released`.
    /// So the checks do not depend on when the node's probe and a read of
    /// its page fall, and run while the DPU is down (a Probe probes it
    /// again). Never the emulator is killed again: killed while it reads
    /// its own FUSE mount it hangs. Returns how long the DPU was down
    /// (until every process answers again) and how many successors were
    /// killed again.
    async fn keep_down(
        &self,
        victims: &[(String, nix::unistd::Pid)],
        gate: &str,
        started: Instant,
        released: &Cell<bool>,
    ) -> (Duration, u64) {
        let mut watched = victims.to_vec();
        let mut again = 0;
        loop {
            let mut waiting = None;
            for (process, pid) in &mut watched {
                let successor = Successor::look(self.stack, process, *pid).await;
                let hold = process == gate && !released.get();
                match successor.pid {
                    Some(next) if hold => {
                        let delay = restart_delay(&self.stack.dir, process);
                        let _ =
                            std::fs::write(&delay, format!("{:.3}", REKILL_PAUSE.as_secs_f64()));
                        if kill(next, Signal::SIGKILL).is_ok() {
                            again += 1;
                        }
                        *pid = next;
                        waiting = Some((process.clone(), successor));
                    }
                    _ if successor.back() => {}
                    _ => waiting = Some((process.clone(), successor)),
                }
            }
            let Some((process, successor)) = waiting else {
                return (started.elapsed(), again);
            };
            let waited = started.elapsed();
            if released.get() && waited > SHOW_BUDGET + RESTART_BUDGET {
                self.tally
                    .stuck(successor.why_not(self.stack, &process, waited));
                return (waited, again);
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }

    /// What the node's page says of DPU `dpu` (`None`: no page, or no such
    /// series).
    async fn node_shows_up(&self, dpu: &str) -> Option<bool> {
        let page = scrape(&self.stack.node_metrics).await.ok()?;
        page.value(DPU_UP, &[("dpu", dpu)]).map(|up| up >= 1.0)
    }

    /// Waits until the node's page shows `dpu` up: how long that took, or
    /// `None` past [`UP_AGAIN_BUDGET`].
    async fn until_shown_up(&self, dpu: &str) -> Option<Duration> {
        let started = Instant::now();
        while started.elapsed() < UP_AGAIN_BUDGET {
            if self.node_shows_up(dpu).await == Some(true) {
                return Some(started.elapsed());
            }
            tokio::time::sleep(SCRAPE_EVERY).await;
        }
        None
    }

    /// While `dead` is down and the node knows it: Probe answers ready
    /// within [`LIVENESS_TIMEOUT`], and `volume`'s stage succeeds at once
    /// and is recorded on `live`. How long each took, or what went wrong.
    async fn stage_elsewhere(
        &self,
        volume: &Volume,
        dead: &DpuParts,
        live: &DpuParts,
    ) -> Result<(Duration, Duration), String> {
        let started = Instant::now();
        let mut identity = IdentityClient::new(
            channel(&self.stack.node)
                .await
                .map_err(|e| format!("{e:#}"))?,
        );
        let mut request = tonic::Request::new(csi::ProbeRequest {});
        request.set_timeout(LIVENESS_TIMEOUT);
        let ready = identity.probe(request).await.map(|r| r.into_inner().ready);
        let probe = started.elapsed();
        match ready {
            Ok(Some(true) | None) => {}
            Ok(Some(false)) => {
                return Err(format!("Probe answered not ready with {} up", live.name));
            }
            Err(status) => {
                return Err(format!(
                    "Probe did not answer ready within the liveness probe's {} s: {status}",
                    LIVENESS_TIMEOUT.as_secs()
                ));
            }
        }
        let started = Instant::now();
        let mut clients = self.clients.clone();
        clients.stage(volume).await.map_err(|e| {
            format!(
                "a new volume's stage while {} was down failed: {e:#}",
                dead.name
            )
        })?;
        let stage = started.elapsed();
        self.tally.operation();
        match recorded_on(&self.stack.node_state_dir(), &volume.id, &self.stack.dpus) {
            Ok((dpu, _)) if dpu == live.name => Ok((probe, stage)),
            Ok((dpu, _)) => Err(format!(
                "a new volume staged while {} was down is recorded on {dpu}, not {}",
                dead.name, live.name
            )),
            Err(error) => Err(format!("{error:#}")),
        }
    }

    /// The volume staged while the DPU was down (or not): unstaged and
    /// deleted, each until it succeeds.
    async fn forget(&self, volume: &Volume) {
        let label = format!("the DPU-down fault's {}", volume.id);
        let unstaged = converge(&self.tally, "NodeUnstageVolume", &label, || {
            let (mut clients, volume) = (self.clients.clone(), volume.clone());
            async move { clients.unstage(&volume).await }
        })
        .await;
        let deleted = match unstaged {
            Ok(()) => {
                converge(&self.tally, "DeleteVolume", &label, || {
                    let (mut clients, volume) = (self.clients.clone(), volume.clone());
                    async move { clients.delete(&volume).await }
                })
                .await
            }
            Err(error) => Err(error),
        };
        if let Err(error) = deleted {
            self.tally.stuck(format!("{error:#}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_counts_for_pods_that_started_before_it_ended() {
        let outages = Outages::default();
        let before = Instant::now();
        let first = outages.begin("local-dpu-b");
        assert_eq!(outages.down_since(before), ["local-dpu-b"]);
        outages.end(first);
        assert_eq!(outages.down_since(before), ["local-dpu-b"]);
        std::thread::sleep(Duration::from_millis(2));
        let after = Instant::now();
        assert!(outages.down_since(after).is_empty());
        outages.begin("local-dpu");
        assert_eq!(outages.down_since(after), ["local-dpu"]);
        assert_eq!(outages.down_since(before), ["local-dpu-b", "local-dpu"]);
    }
}
