//! The fault injector: at random intervals, one of
//! - a process killed with SIGKILL (local-up `--supervise` starts it again,
//!   as kubelet restarts a crashed container): the node, the vendor plugin,
//!   the controller proxy, SNAP (the emulator starts empty, as SNAP does
//!   after a restart), the NVMe-oF target (its pool and lvstore found
//!   again, its exports restored by the controller), the DPU agent in split
//!   mode;
//! - SNAP stalled: the emulator stopped (SIGSTOP) for up to 5 s, so that
//!   calls in flight answer late or after their deadline, then continued;
//! - the function pool full: every free function of one emulation taken by
//!   a controller of ours for up to 8 s (stages answer RESOURCE_EXHAUSTED),
//!   then given back.
//!
//! EBUSY holders are the workers' (they must meet an unpublish). One fault at
//! a time, each finished before the next (a stalled SNAP is always continued).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use snap_csi::jsonrpc::RpcClient;
use snap_csi::spdk::snap::{
    EmulationFunctionList, EmulationType, NvmeControllerCreate, NvmeControllerDestroy,
    NvmeSubsystemCreate, NvmeSubsystemDestroy, VirtioBlkControllerCreate,
    VirtioBlkControllerDestroy,
};
use snap_csi_harness::stack::Stack;
use tokio::net::UnixStream;

use crate::rng::Rng;
use crate::tally::Tally;

/// How long a killed process's successor may take to answer.
const RESTART_BUDGET: Duration = Duration::from_secs(60);

/// The squatters' subsystem: no name of the node's (theirs derive from volume ids).
const SQUAT_NQN: &str = "nqn.2026-11.io.snap-csi.chaos:squatter";

#[derive(Debug)]
pub struct Injector<'a> {
    pub stack: &'a Stack,
    pub tally: Arc<Tally>,
    pub stop: Arc<AtomicBool>,
    pub rng: Rng,
    /// Mean pause between two faults.
    pub interval: Duration,
}

impl Injector<'_> {
    pub async fn run(mut self) {
        let mut victims = vec!["node", "plugin", "controller", "snap", "target"];
        if self.stack.split.is_some() {
            victims.push("agent");
        }
        let mean = u64::try_from(self.interval.as_millis()).unwrap_or(5000);
        loop {
            let pause = self.rng.millis(mean / 2, mean * 3 / 2);
            if self.pause(pause).await {
                return;
            }
            let result = match self.rng.range(0, 5) {
                0..=2 => {
                    let victim = *self.rng.pick(&victims);
                    self.kill(victim).await
                }
                3 => self.stall_snap().await,
                _ => {
                    let emulation = *self
                        .rng
                        .pick(&[EmulationType::Nvme, EmulationType::VirtioBlk]);
                    self.fill_pool(emulation).await
                }
            };
            if let Err(error) = result {
                eprintln!("chaos: a fault could not be injected: {error:#}");
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
        self.tally.fault(&format!("kill {victim}"));
        if let Err(why) = successor(self.stack, victim, pid).await {
            self.tally.stuck(why);
        }
        Ok(())
    }

    async fn stall_snap(&mut self) -> anyhow::Result<()> {
        let pid = self.stack.pid("snap")?;
        let stall = self.rng.millis(200, 5000);
        let stopped = Stopped::new(pid)?;
        self.tally.fault("SNAP stalled");
        tokio::time::sleep(stall).await;
        drop(stopped);
        Ok(())
    }

    /// Takes every free function of `emulation`, holds them, gives them back.
    async fn fill_pool(&mut self, emulation: EmulationType) -> anyhow::Result<()> {
        let snap = RpcClient::with_timeout(self.stack.snap_socket(), Duration::from_secs(10));
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
            .fault(&format!("function pool full ({emulation:?})"));
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

/// Waits until the process local-up `--supervise` started after `victim`'s
/// `pid` runs and answers on its socket; says why not when it has not
/// within [`RESTART_BUDGET`].
pub async fn successor(stack: &Stack, victim: &str, pid: Pid) -> Result<(), String> {
    let socket = match victim {
        "node" => Some(stack.node_socket()),
        "plugin" => Some(stack.plugin_socket()),
        "controller" => Some(stack.controller_socket()),
        "snap" => Some(stack.snap_socket()),
        "target" => Some(stack.target_socket()),
        _ => None,
    };
    let started = Instant::now();
    loop {
        let successor = stack.pid(victim).ok().filter(|&p| p != pid);
        let alive = successor.is_some_and(|p| kill(p, None).is_ok());
        let answers = match &socket {
            Some(path) => UnixStream::connect(path).await.is_ok(),
            None => true,
        };
        if alive && answers {
            return Ok(());
        }
        if started.elapsed() > RESTART_BUDGET {
            let log = stack.dir.join("logs").join(format!("{victim}.log"));
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(15).collect();
            return Err(format!(
                "{victim} did not come back within {RESTART_BUDGET:?} of its SIGKILL \
                 (successor {successor:?}, alive {alive}, answering {answers}); its log ends:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A process stopped with SIGSTOP until this is dropped (SIGCONT), so that no
/// path out of a stall leaves SNAP frozen.
#[derive(Debug)]
struct Stopped(Pid);

impl Stopped {
    fn new(pid: Pid) -> anyhow::Result<Stopped> {
        kill(pid, Signal::SIGSTOP).with_context(|| format!("SIGSTOP to SNAP ({pid})"))?;
        Ok(Stopped(pid))
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGCONT);
    }
}
