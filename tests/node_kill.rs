//! Kills at random instants: the node process, and in a split-mode run
//! (`common::dpu`) the DPU agent process, is killed with SIGKILL at a random
//! instant inside a step of a volume's life (stage, publish, unpublish,
//! unstage) and started again after a random pause, while kubelet goes on
//! with its calls by its rules (`common::kubelet`): failures retried or not
//! as kubelet would, and NodeUnstageVolume made only when kubelet would
//! make it. The instant is a random fraction of the step's duration as last
//! measured without a fault (`common::kills`), so kills spread over the
//! whole step; a step that ends before its instant is killed the next time
//! it comes (each trial's volume lives through two pods, and up to six more
//! while its kill has not landed). A trial whose kill never landed is no
//! trial: it is counted apart, not as converged, and the test fails unless
//! every (process, step) cell got a landed kill.
//!
//! It must converge: with the pod running, exactly one of everything exists
//! (bdev, subsystem or namespace, controller, loop device, mounts) and the
//! first pod's data reads back; with it gone, nothing is left. A volume
//! kubelet would leave stuck (a call still failing after a minute) is
//! counted as stuck, then unpublished and unstaged by hand so that the next
//! trials start clean; the test fails if any was. Every (process, step,
//! emulation and placement, kind) cell comes once per round, in a seeded
//! order (`SNAP_CSI_CRASH_SEED` replays a run; `SNAP_CSI_KILL_TRIALS` sets
//! how many, one round by default, and a smaller number is rounded up to
//! one). The table of kills per process and step, and how each trial ended,
//! is printed at the end. With `SNAP_CSI_TEST_DPUS=2` the host has two DPUs
//! (`common::crash`): the agent killed is that of the DPU the trial's volume
//! is on, and the census counts both DPUs.

mod common;

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use common::crash::{
    Census, Process, Processes, Random, Shape, Stack, Volume, env_number, reap, rounds, seed,
    shapes,
};
use common::kills::{Cells, Landed, Switch, Verdict};
use common::kubelet::{self, Belief, Call, Failure, Stuck};
use common::node::{read_volume, write_volume};
use snap_csi::proto::csi::v1::node_client::NodeClient;
use tonic::transport::Channel;

/// The longest pause before a killed process is started again.
const MAX_RESTART_DELAY_MS: u64 = 300;
/// Pods a trial's volume has at least (the first writes, the second reads
/// back) and at most (while its kill has not landed: a fast step, such as
/// an unpublish, often ends before its instant).
const PODS: (u64, u64) = (2, 8);

#[derive(Clone, Copy, Debug)]
struct Trial {
    victim: Process,
    step: Call,
    shape: Shape,
    /// Where in the step the kill lands, in thousandths of its duration.
    permille: u64,
    restart: Duration,
}

/// `count` trials (one round if `None`): rounds of every (process, step,
/// shape).
fn trials(count: Option<usize>, random: &mut Random, split: bool) -> Vec<Trial> {
    let victims: &[Process] = if split {
        &[Process::Node, Process::Agent]
    } else {
        &[Process::Node]
    };
    let mut every = Vec::new();
    for &victim in victims {
        for step in Call::ALL {
            for shape in shapes() {
                every.push(Trial {
                    victim,
                    step,
                    shape,
                    permille: 0,
                    restart: Duration::ZERO,
                });
            }
        }
    }
    let count = count.unwrap_or(every.len());
    let mut trials = rounds(&every, count, random, "kill trials");
    for trial in &mut trials {
        trial.permille = random.below(1000) as u64;
        trial.restart = Duration::from_millis(random.below(MAX_RESTART_DELAY_MS as usize) as u64);
    }
    trials
}

/// Kills the trial's process and starts it again, as its pod's restart
/// would.
struct Killer<'a> {
    stack: &'a Stack,
    trial: &'a Trial,
    /// The DPU the volume is on, whose agent is the one killed.
    dpu: usize,
    processes: Mutex<Processes>,
}

impl Killer<'_> {
    async fn kill(&self) {
        let victim = self.trial.victim;
        let mut child = self
            .processes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take(victim);
        child.start_kill().unwrap();
        reap(child).await;
        tokio::time::sleep(self.trial.restart).await;
        let successor = self.stack.spawn(victim, None, &self.trial.shape, self.dpu);
        self.processes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .put(victim, successor);
    }
}

/// kubelet's calls for the volume's `pod`th pod until it runs or kubelet is
/// done with the volume, through the switch (the first pod's stage timed
/// apart: only it formats).
async fn settle(
    (volume, node, seen): (&Volume, &NodeClient<Channel>, &mut kubelet::Volume),
    (switch, killer): (&Switch, &Killer<'_>),
    pod: u64,
) -> Result<(), Stuck> {
    let shape = killer.trial.shape;
    let key = |call: Call, first: bool| match (call, first) {
        (Call::Stage, true) => format!("stage {shape:?} first"),
        (Call::Stage, false) => format!("stage {shape:?} again"),
        _ => format!("{} {shape:?}", call.step()),
    };
    let checked = volume.device_mount_path();
    kubelet::settle(seen, checked, &common::crash::BACKOFF, |call| {
        let mut node = node.clone();
        let keys = [key(call, pod == 1), key(call, pod != 1)];
        async move {
            let attempt = volume.call(&mut node, call, common::crash::CALL);
            switch
                .around(call, &keys, attempt, async || killer.kill().await)
                .await
                .map_err(Failure::from)
        }
    })
    .await
}

/// One trial: a volume's pods, the trial's process killed inside its step
/// once; how it ended, whether the kill landed, and what was wrong.
async fn run(stack: &Stack, n: usize, trial: &Trial, switch: &Switch) -> (Verdict, Option<Landed>) {
    let volume = Volume::new(stack, n, trial.shape.kind, false);
    let killer = Killer {
        stack,
        trial,
        dpu: volume.dpu,
        processes: Mutex::new(stack.processes(None, &trial.shape, volume.dpu).await),
    };
    let node = stack.client().await;
    let data: Vec<u8> = format!("trial {n} of a kill at a random instant\n")
        .into_bytes()
        .repeat(64);
    switch.arm(trial.step, trial.permille);
    let mut seen = kubelet::Volume::default();
    let mut stuck = None;
    let mut pod = 0;
    while pod < PODS.0 || pod < PODS.1 && switch.pending() {
        pod += 1;
        seen.wanted = true;
        if let Err(e) = settle((&volume, &node, &mut seen), (switch, &killer), pod).await {
            stuck = Some(format!("pod {pod} never starts: {e}"));
            break;
        }
        let published = Census::published(&trial.shape);
        assert_eq!(
            stack.settled_census(&volume.backing, &published).await,
            published,
            "{trial:?}: pod {pod} runs"
        );
        stack.note_placement(&volume);
        if pod == 1 {
            write_volume(&volume.target, &data);
        } else {
            assert_eq!(
                read_volume(&volume.target, data.len()),
                data,
                "{trial:?}: pod {pod} reads back what the first wrote"
            );
        }
        seen.wanted = false;
        if let Err(e) = settle((&volume, &node, &mut seen), (switch, &killer), pod).await {
            stuck = Some(format!("pod {pod}'s teardown never ends: {e}"));
            break;
        }
        assert_eq!(
            stack
                .settled_census(&volume.backing, &Census::nothing())
                .await,
            Census::nothing(),
            "{trial:?}: pod {pod} has gone"
        );
    }
    let landed = switch.disarm();
    let verdict = match stuck {
        None => Verdict::Converged,
        Some(why) => {
            println!("STUCK: {trial:?}, seed trial {n}: {why}");
            by_hand(&volume, &node, &mut seen).await;
            assert_eq!(
                stack
                    .settled_census(&volume.backing, &Census::nothing())
                    .await,
                Census::nothing(),
                "{trial:?}: cleaned up by hand"
            );
            Verdict::Stuck
        }
    };
    killer
        .processes
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner)
        .stop()
        .await;
    volume.remove();
    (verdict, landed)
}

/// What kubelet has left, taken down as an operator would: the pod goes as
/// kubelet lets it, then NodeUnpublishVolume and NodeUnstageVolume until
/// they succeed (calls kubelet would not make).
async fn by_hand(volume: &Volume, node: &NodeClient<Channel>, seen: &mut kubelet::Volume) {
    seen.wanted = false;
    if let Err(e) = volume.settle(node, seen).await {
        println!("  kubelet's teardown: {e}");
    }
    let mut operator = kubelet::Volume {
        device: Belief::Mounted,
        pod: Belief::Mounted,
        wanted: false,
    };
    volume
        .settle(node, &mut operator)
        .await
        .unwrap_or_else(|e| panic!("not even by hand: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_at_a_random_instant_inside_any_step_converges_as_kubelet_drives_it() {
    let seed = seed();
    let stack = Stack::start().await;
    let count = env_number("SNAP_CSI_KILL_TRIALS").map(|n| n as usize);
    let trials = trials(count, &mut Random(seed), stack.split());
    // Printed first: the test's output shows it when a trial fails.
    println!(
        "kill trials: {}, seed {seed} (SNAP_CSI_CRASH_SEED={seed} replays them)",
        trials.len()
    );
    let switch = Switch::default();
    let mut table = Cells::default();
    for (n, trial) in trials.iter().enumerate() {
        let (verdict, landed) = run(&stack, n, trial, &switch).await;
        table.count(
            trial.victim.name(),
            trial.step.step(),
            landed.is_some(),
            verdict,
            0,
        );
    }
    println!(
        "{}",
        table.table(
            "kill trials (kills: inside the step; missed: the step ended before its instant)"
        )
    );
    let total = table.total();
    let unkilled = table.unkilled();
    assert!(
        unkilled.is_empty(),
        "no kill landed inside these steps, which the run promised: {unkilled:?}"
    );
    assert_eq!(
        total.stuck, 0,
        "volumes kubelet would leave stuck (STUCK lines above)"
    );
    common::crash::check_log(&stack);
    stack.check_placements();
}
