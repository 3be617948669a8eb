//! The fault injector: at random intervals, one of
//! - a process killed with SIGKILL (local-up `--supervise` starts it again,
//!   as kubelet restarts a crashed container): the node, the vendor plugin,
//!   the controller proxy, SNAP (the emulator starts empty, as SNAP does
//!   after a restart), the NVMe-oF target (its pool and lvstore found
//!   again, its exports restored by the controller), the DPU agent in split
//!   mode (on a host with two DPUs, either DPU's plugin, SNAP or agent);
//! - SNAP stalled: the emulator (of one DPU) stopped (SIGSTOP) for up to
//!   5 s, so that calls in flight answer late or after their deadline, then
//!   continued;
//! - the function pool full: every free function of one emulation (of one
//!   DPU) taken by a controller of ours for up to 8 s (stages answer
//!   RESOURCE_EXHAUSTED), then given back;
//! - a path down: one of the NVMe-oF target's listener addresses (the
//!   controller exports every volume on each) removed from every subsystem
//!   that has it, which drops the connections through it as a failed link
//!   would, and kept away for 1–5 s (any listener the controller restores
//!   meanwhile is removed again), then left for the controller to restore;
//! - a path flapping: the same, 3 to 6 times in a row, each time down for
//!   100 ms–1 s and restored by us, up for 100 ms–1 s;
//! - on a host with two DPUs, a DPU down (`dpu_down`): one DPU's processes
//!   killed and held down for 2–8 s, then let back up.
//!
//! After a path fault the target must listen on both addresses again for
//! every subsystem and the plugin's page must show every path connected
//! (`census::paths_whole`) within [`PATHS_BUDGET`], or the fault did not
//! converge. Single-path volumes on the cut address have their I/O held
//! meanwhile (their controller's reconnect policy); multipath ones go on
//! through the other path, and an I/O error there is a data error
//! (`lifecycle`).
//!
//! EBUSY holders are the workers' (they must meet an unpublish). One fault at
//! a time, each finished before the next (a stalled SNAP is always continued).
//!
//! The kinds come from a deck ([`Deck`], shuffled by the seed, dealt across
//! the run's rounds): each kind once, then a process kill twice more and a
//! full pool once more, so that a run of five faults has every kind; a DPU down comes at
//! random beside it where the host has two DPUs, and first in such a round.
//! A fault that cannot be injected is a shortfall, and the run fails.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use snap_csi::jsonrpc::{RpcClient, RpcError};
use snap_csi::spdk::nvmf::{
    ListenAddress, NvmfGetSubsystems, NvmfSubsystemAddListener, NvmfSubsystemRemoveListener,
};
use snap_csi::spdk::snap::{
    EmulationFunctionList, EmulationType, NvmeControllerCreate, NvmeControllerDestroy,
    NvmeSubsystemCreate, NvmeSubsystemDestroy, VirtioBlkControllerCreate,
    VirtioBlkControllerDestroy,
};
use snap_csi_harness::csi::Clients;
use snap_csi_harness::dpus::Stopped;
use snap_csi_harness::stack::Stack;
use tokio::net::UnixStream;

use crate::census;
use crate::dpu_down::Outages;
use crate::rng::Rng;
use crate::tally::Tally;

/// How long a killed process's successor may take to answer.
pub const RESTART_BUDGET: Duration = Duration::from_secs(60);
/// How long after a path fault (or the round's faults) the target may take
/// to listen on every address again and SNAP to connect every path again:
/// well past the controller's re-export period (2 s) and the paths'
/// reconnect delay (1 s), on a loaded machine.
pub const PATHS_BUDGET: Duration = Duration::from_secs(30);
/// How often a path held down is looked at, to remove again what the
/// controller restored.
const RECUT_EVERY: Duration = Duration::from_millis(100);

/// The squatters' subsystem: no name of the node's (theirs derive from volume ids).
const SQUAT_NQN: &str = "nqn.2026-11.io.snap-csi.chaos:squatter";

#[derive(Debug)]
pub struct Injector<'a> {
    pub stack: &'a Stack,
    /// The provisioner's and kubelet's, for the volume a DPU-down fault
    /// stages while the DPU is down.
    pub clients: Clients,
    pub tally: Arc<Tally>,
    pub stop: Arc<AtomicBool>,
    pub rng: Rng,
    /// Mean pause between two faults.
    pub interval: Duration,
    /// The target's listener addresses seen so far (every volume's paths).
    pub paths: Vec<ListenAddress>,
    /// The DPU-down faults so far, which the workers read.
    pub outages: Arc<Outages>,
    pub deck: Arc<Deck>,
}

/// The kinds of fault still to come in this pass through them, shared by a
/// run's rounds.
#[derive(Debug, Default)]
pub struct Deck(std::sync::Mutex<Vec<Kind>>);

/// A kind of fault (a DPU down apart: it needs two DPUs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Kill,
    StallSnap,
    FillPool,
    PathDown,
    PathFlapping,
}

impl Kind {
    /// What a pass deals after one of each kind: a process kill and a full
    /// pool come more often than the rest.
    const MORE: [Kind; 3] = [Kind::Kill, Kind::Kill, Kind::FillPool];

    /// Its name in the tally (a kill's and a full pool's followed by what).
    pub const fn name(self) -> &'static str {
        match self {
            Kind::Kill => "kill",
            Kind::StallSnap => "SNAP stalled",
            Kind::FillPool => "function pool full",
            Kind::PathDown => "path down",
            Kind::PathFlapping => "path flapping",
        }
    }

    /// Every kind a run of at least one pass promises.
    pub const ALL: [Kind; 5] = [
        Kind::Kill,
        Kind::StallSnap,
        Kind::FillPool,
        Kind::PathDown,
        Kind::PathFlapping,
    ];
}

impl Deck {
    /// The next kind; when a pass ends, a new one shuffled by `rng`: every
    /// kind once first, so that five faults have them all, then
    /// [`Kind::MORE`].
    fn deal(&self, rng: &mut Rng) -> Kind {
        let mut left = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if left.is_empty() {
            let (mut first, mut then) = (Kind::ALL, Kind::MORE);
            rng.shuffle(&mut first);
            rng.shuffle(&mut then);
            // Dealt from the end.
            left.extend(then);
            left.extend(first);
        }
        left.pop().unwrap_or(Kind::Kill)
    }
}

impl Injector<'_> {
    /// Faults until the round is over; then the target's listener
    /// addresses it has seen, for the census.
    pub async fn run(mut self) -> Vec<ListenAddress> {
        let dpus = self.stack.dpu_parts();
        let mut victims: Vec<String> = ["node", "controller", "target"].map(String::from).into();
        for dpu in &dpus {
            victims.extend(["plugin", "snap"].map(|p| dpu.process(p)));
            if self.stack.split.is_some() {
                victims.push(dpu.process("agent"));
            }
        }
        // A host with two DPUs has the DPU-down fault too, as often as two
        // of the others (one in five), and first: a short round (the test
        // command's are 30 s, some five faults) then has one at least.
        let two_dpus = dpus.len() > 1;
        let mut dpu_down_first = two_dpus;
        let mean = u64::try_from(self.interval.as_millis()).unwrap_or(5000);
        loop {
            let pause = self.rng.millis(mean / 2, mean * 3 / 2);
            if self.pause(pause).await {
                self.round_end().await;
                return self.paths;
            }
            let dpu_down =
                std::mem::take(&mut dpu_down_first) || two_dpus && self.rng.range(0, 4) == 0;
            let result = if dpu_down {
                self.dpu_down().await
            } else {
                match self.deck.deal(&mut self.rng) {
                    Kind::Kill => {
                        let victim = self.rng.pick(&victims).clone();
                        self.kill(&victim).await
                    }
                    Kind::StallSnap => self.stall_snap().await,
                    Kind::FillPool => {
                        let emulation = *self
                            .rng
                            .pick(&[EmulationType::Nvme, EmulationType::VirtioBlk]);
                        self.fill_pool(emulation).await
                    }
                    Kind::PathDown => self.path_down().await,
                    Kind::PathFlapping => self.path_flapping().await,
                }
            };
            if let Err(error) = result {
                self.tally
                    .shortfall(format!("a fault could not be injected: {error:#}"));
            }
        }
    }

    /// Sleeps for `pause` in short steps; true when the round is over.
    async fn pause(&self, pause: Duration) -> bool {
        let step = Duration::from_millis(100);
        let mut left = pause;
        while !left.is_zero() {
            if self.stop.load(Ordering::Relaxed) {
                return true;
            }
            let now = left.min(step);
            tokio::time::sleep(now).await;
            left -= now;
        }
        self.stop.load(Ordering::Relaxed)
    }

    /// SIGKILL to `victim`, then waits until its successor answers on its
    /// socket: a process that does not come back is a failure of its own.
    async fn kill(&self, victim: &str) -> anyhow::Result<()> {
        let pid = self.stack.pid(victim)?;
        kill(pid, Signal::SIGKILL).with_context(|| format!("SIGKILL to {victim} ({pid})"))?;
        self.tally.fault(&format!("{} {victim}", Kind::Kill.name()));
        if let Err(why) = successor(self.stack, victim, pid).await {
            self.tally.stuck(why);
        }
        Ok(())
    }

    async fn stall_snap(&mut self) -> anyhow::Result<()> {
        let dpu = self.rng.pick(&self.stack.dpu_parts()).clone();
        let pid = self.stack.pid(&dpu.process("snap"))?;
        let stall = self.rng.millis(200, 5000);
        let stopped = Stopped::new(pid)?;
        self.tally.fault(Kind::StallSnap.name());
        tokio::time::sleep(stall).await;
        drop(stopped);
        Ok(())
    }

    /// Takes every free function of `emulation`, holds them, gives them back.
    async fn fill_pool(&mut self, emulation: EmulationType) -> anyhow::Result<()> {
        let dpu = self.rng.pick(&self.stack.dpu_parts()).clone();
        let snap = RpcClient::with_timeout(&dpu.snap_socket, Duration::from_secs(10));
        let listing = snap
            .call(&EmulationFunctionList { all: true })
            .await
            .context("emulation_function_list")?;
        let free: Vec<String> = listing
            .iter()
            .filter(|pf| pf.emulation_type == emulation)
            .flat_map(|pf| {
                std::iter::once((pf.vuid.clone(), pf.ctrl_id.clone())).chain(
                    pf.vfs
                        .iter()
                        .map(|vf| (vf.vuid.clone(), vf.ctrl_id.clone())),
                )
            })
            .filter(|(_, ctrl)| ctrl.is_none())
            .map(|(vuid, _)| vuid)
            .collect();
        if emulation == EmulationType::Nvme {
            snap.call(&NvmeSubsystemCreate {
                nqn: SQUAT_NQN.into(),
                mn: None,
                sn: None,
                nn: None,
                mnan: None,
            })
            .await
            .context("creating the squatters' subsystem")?;
        }
        // A function the node claims meanwhile refuses ours: fine, it is taken.
        let mut taken = Vec::new();
        for (index, vuid) in free.into_iter().enumerate() {
            let created = match emulation {
                EmulationType::Nvme => snap
                    .call(&NvmeControllerCreate {
                        nqn: SQUAT_NQN.into(),
                        vuid: Some(vuid),
                        ..Default::default()
                    })
                    .await
                    .map(|c| c.ctrl_id),
                EmulationType::VirtioBlk => snap
                    .call(&VirtioBlkControllerCreate {
                        vuid: Some(vuid),
                        ctrl: Some(format!("chaos_squatter_{index}")),
                        ..Default::default()
                    })
                    .await
                    .map(|c| c.ctrl_id),
            };
            if let Ok(ctrl) = created {
                taken.push(ctrl);
            }
        }
        self.tally
            .fault(&format!("{} ({emulation:?})", Kind::FillPool.name()));
        tokio::time::sleep(self.rng.millis(1000, 8000)).await;
        for ctrl in taken {
            let released = match emulation {
                EmulationType::Nvme => {
                    snap.call(&NvmeControllerDestroy {
                        ctrl_id: ctrl.clone(),
                        force: None,
                    })
                    .await
                }
                EmulationType::VirtioBlk => {
                    snap.call(&VirtioBlkControllerDestroy {
                        ctrl: ctrl.clone(),
                        force: None,
                    })
                    .await
                }
            };
            released.with_context(|| format!("giving back {ctrl}"))?;
        }
        if emulation == EmulationType::Nvme {
            snap.call(&NvmeSubsystemDestroy {
                nqn: SQUAT_NQN.into(),
            })
            .await
            .context("removing the squatters' subsystem")?;
        }
        Ok(())
    }
}

impl Injector<'_> {
    /// The faults have stopped, the volumes still live: within
    /// [`PATHS_BUDGET`] every subsystem must listen on every address again
    /// and every path be connected; what is not is a leak.
    async fn round_end(&mut self) {
        if let Err(left) = census::paths_settle(self.stack, &mut self.paths, PATHS_BUDGET).await {
            for what in left {
                self.tally.leak(format!(
                    "{} s after the faults stopped: {what}",
                    PATHS_BUDGET.as_secs()
                ));
            }
        }
    }

    /// A random index (into the addresses or DPUs, however many there are).
    pub(crate) fn draw(&mut self) -> usize {
        usize::try_from(self.rng.next() >> 32).unwrap_or(0)
    }

    fn target(&self) -> RpcClient {
        RpcClient::with_timeout(self.stack.target_socket(), Duration::from_secs(10))
    }

    /// One of the target's listener addresses at random (those its
    /// subsystems listen on now, and those seen before); `None` when no
    /// volume is exported, noted as a path fault skipped.
    async fn pick_path(
        &mut self,
        target: &RpcClient,
        fault: &str,
        draw: usize,
    ) -> anyhow::Result<Option<ListenAddress>> {
        let subsystems = target
            .call(&NvmfGetSubsystems { nqn: None })
            .await
            .context("listing the target's subsystems")?;
        for subsystem in &subsystems {
            census::learn(&mut self.paths, &subsystem.listen_addresses);
        }
        if self.paths.is_empty() {
            self.tally
                .note(format!("{fault} skipped: no NVMe-oF volume exported"), "");
            return Ok(None);
        }
        Ok(Some(self.paths[draw % self.paths.len()].clone()))
    }

    /// A path down: `path` removed from every subsystem, held down for a
    /// random 1–5 s, then left for the controller to restore.
    async fn path_down(&mut self) -> anyhow::Result<()> {
        // Every choice drawn first, so that a seed draws the same whatever
        // the target holds.
        let (draw, hold) = (self.draw(), self.rng.millis(1000, 5000));
        let target = self.target();
        let Some(path) = self.pick_path(&target, "path down", draw).await? else {
            return Ok(());
        };
        let started = Instant::now();
        let cut = cut_everywhere(&target, &path).await?;
        if cut.is_empty() {
            self.tally
                .note("path down skipped: no subsystem listened there", "");
            return Ok(());
        }
        self.tally.fault(Kind::PathDown.name());
        let mut again = 0;
        while started.elapsed() < hold {
            tokio::time::sleep(RECUT_EVERY).await;
            again += cut_everywhere(&target, &path).await?.len();
        }
        if again > 0 {
            self.tally.note_times(
                "path down: listeners the controller restored while it held, removed again",
                u64::try_from(again).unwrap_or(u64::MAX),
                "",
            );
        }
        let down = started.elapsed();
        if let Some(whole) = self.whole_again("path down", &path, started).await {
            eprintln!(
                "chaos: path down {}:{}: {} subsystems cut, held {:.1} s ({again} listeners the \
                 controller restored meanwhile removed again), whole again {:.1} s later",
                path.traddr,
                path.trsvcid,
                cut.len(),
                down.as_secs_f64(),
                (whole - down).as_secs_f64()
            );
        }
        Ok(())
    }

    /// A path flapping: `path` removed from every subsystem and restored by
    /// us, 3 to 6 times, down and up 100 ms–1 s each time; it ends restored.
    async fn path_flapping(&mut self) -> anyhow::Result<()> {
        let (draw, flaps) = (self.draw(), self.rng.range(3, 6));
        let pauses: Vec<(Duration, Duration)> = (0..flaps)
            .map(|_| (self.rng.millis(100, 1000), self.rng.millis(100, 1000)))
            .collect();
        let target = self.target();
        let Some(path) = self.pick_path(&target, "path flapping", draw).await? else {
            return Ok(());
        };
        let started = Instant::now();
        let mut most = 0;
        for (flap, (down, up)) in (0..flaps).zip(pauses) {
            let cut = cut_everywhere(&target, &path).await?;
            most = most.max(cut.len());
            if flap == 0 {
                if cut.is_empty() {
                    self.tally
                        .note("path flapping skipped: no subsystem listened there", "");
                    return Ok(());
                }
                self.tally.fault(Kind::PathFlapping.name());
            }
            tokio::time::sleep(down).await;
            restore(&target, &cut, &path).await?;
            if flap + 1 < flaps {
                tokio::time::sleep(up).await;
            }
        }
        let flapped = started.elapsed();
        if let Some(whole) = self.whole_again("path flapping", &path, started).await {
            eprintln!(
                "chaos: path flapping {}:{}: {flaps} times over {:.1} s (up to {most} subsystems \
                 cut), whole again {:.1} s later",
                path.traddr,
                path.trsvcid,
                flapped.as_secs_f64(),
                (whole - flapped).as_secs_f64()
            );
        }
        Ok(())
    }

    /// Waits until every subsystem listens on every address again and every
    /// path is connected: when, since `started`; a fault whose paths do not
    /// come back within [`PATHS_BUDGET`] did not converge (`None`).
    async fn whole_again(
        &mut self,
        fault: &str,
        path: &ListenAddress,
        started: Instant,
    ) -> Option<Duration> {
        match census::paths_settle(self.stack, &mut self.paths, PATHS_BUDGET).await {
            Ok(()) => Some(started.elapsed()),
            Err(left) => {
                self.tally.stuck(format!(
                    "{fault} of {}:{}: the paths were not whole again {:.0} s after it began: {}",
                    path.traddr,
                    path.trsvcid,
                    started.elapsed().as_secs_f64(),
                    left.join("; ")
                ));
                None
            }
        }
    }
}

/// Removes `path` from every subsystem on `target` that listens there; the
/// subsystems it was removed from. A subsystem deleted meanwhile, or whose
/// listener went meanwhile, answers an error and is skipped; a target that
/// does not answer is an error.
async fn cut_everywhere(target: &RpcClient, path: &ListenAddress) -> anyhow::Result<Vec<String>> {
    let subsystems = target
        .call(&NvmfGetSubsystems { nqn: None })
        .await
        .context("listing the target's subsystems")?;
    let mut cut = Vec::new();
    for subsystem in subsystems {
        if !subsystem.listen_addresses.contains(path) {
            continue;
        }
        let remove = NvmfSubsystemRemoveListener {
            nqn: subsystem.nqn.clone(),
            listen_address: path.clone(),
        };
        match target.call(&remove).await {
            Ok(_) => cut.push(subsystem.nqn),
            Err(RpcError::Server { .. }) => {}
            Err(error) => {
                return Err(error).with_context(|| {
                    format!(
                        "removing listener {}:{} of {}",
                        path.traddr, path.trsvcid, subsystem.nqn
                    )
                });
            }
        }
    }
    Ok(cut)
}

/// Adds `path` back to each of `nqns`: a listener already there (the
/// controller restored it first, -32602) or a subsystem deleted meanwhile
/// is done; a target that does not answer is an error.
async fn restore(target: &RpcClient, nqns: &[String], path: &ListenAddress) -> anyhow::Result<()> {
    for nqn in nqns {
        let add = NvmfSubsystemAddListener {
            nqn: nqn.clone(),
            listen_address: path.clone(),
        };
        match target.call(&add).await {
            Ok(_) | Err(RpcError::Server { .. }) => {}
            Err(error) => {
                return Err(error).with_context(|| {
                    format!(
                        "restoring listener {}:{} of {nqn}",
                        path.traddr, path.trsvcid
                    )
                });
            }
        }
    }
    Ok(())
}

/// What a look at a killed process's successor saw.
#[derive(Debug)]
pub struct Successor {
    /// The process local-up `--supervise` started after it, once it has.
    pub pid: Option<Pid>,
    alive: bool,
    /// Something answers on its socket (if it has one here: an agent's is
    /// in its namespace).
    answers: bool,
}

impl Successor {
    /// A look now at the successor of `victim`'s `pid`.
    pub async fn look(stack: &Stack, victim: &str, pid: Pid) -> Successor {
        let socket = match victim {
            "node" => Some(stack.node_socket()),
            "controller" => Some(stack.controller_socket()),
            "target" => Some(stack.target_socket()),
            _ => stack.dpu_parts().into_iter().find_map(|dpu| {
                if victim == dpu.process("snap") {
                    Some(dpu.snap_socket)
                } else if victim == dpu.process("plugin") {
                    Some(dpu.plugin_socket)
                } else {
                    None
                }
            }),
        };
        let successor = stack.pid(victim).ok().filter(|&p| p != pid);
        let answers = match &socket {
            Some(path) => UnixStream::connect(path).await.is_ok(),
            None => true,
        };
        Successor {
            pid: successor,
            alive: successor.is_some_and(|p| kill(p, None).is_ok()),
            answers,
        }
    }

    /// It runs and answers.
    pub fn back(&self) -> bool {
        self.alive && self.answers
    }

    /// Why it is not back yet, with the end of `victim`'s log.
    pub fn why_not(&self, stack: &Stack, victim: &str, waited: Duration) -> String {
        let log = stack.dir.join("logs").join(format!("{victim}.log"));
        let tail = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = tail.lines().rev().take(15).collect();
        format!(
            "{victim} did not come back within {waited:?} of its SIGKILL \
             (successor {:?}, alive {}, answering {}); its log ends:\n{}",
            self.pid,
            self.alive,
            self.answers,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    }
}

/// Where local-up `--supervise` reads the pause before `process`'s restart.
pub fn restart_delay(stack_dir: &Path, process: &str) -> PathBuf {
    stack_dir
        .join("pids")
        .join(format!("{process}.restart-delay"))
}

/// Waits until the process local-up `--supervise` started after `victim`'s
/// `pid` runs and answers on its socket; says why not when it has not
/// within [`RESTART_BUDGET`].
pub async fn successor(stack: &Stack, victim: &str, pid: Pid) -> Result<(), String> {
    let started = Instant::now();
    loop {
        let successor = Successor::look(stack, victim, pid).await;
        if successor.back() {
            return Ok(());
        }
        if started.elapsed() > RESTART_BUDGET {
            return Err(successor.why_not(stack, victim, RESTART_BUDGET));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
