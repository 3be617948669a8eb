//! Crash safety: the node process is killed with SIGKILL right after a step of
//! stage, publish, unpublish or unstage (a crash point armed through the
//! environment), restarted, and kubelet goes on with its calls by its rules
//! (`common::kubelet`: the failed call retried, then the rest of the
//! volume's life). It must converge: after the retried publish exactly one of
//! everything exists (bdev, subsystem or controller, loop device, mounts),
//! and after unstage nothing is left: no bdev, namespace, controller, loop
//! device, mount, target path or record. The trials cover every step in both
//! block emulations, both placements of NVMe (dedicated, and packed: a
//! namespace on a pool controller, whose pools stay, empty, after the
//! unstage) and all three block volume kinds (block, ext4, xfs), and a
//! filesystem device (virtio-fs: fsdev, device, function, mounted by tag,
//! none left after the unstage), in a seeded random order with
//! random read-only publishes (`SNAP_CSI_CRASH_SEED` replays a run,
//! `SNAP_CSI_CRASH_TRIALS` sets how many: 200 by default, and never fewer
//! than one for each point, to which a smaller number is rounded up). In a
//! split-mode run (`common::dpu`) the DPU steps (attach and detach) run in a
//! `snap-csi dpu-agent` process reached over mutual TLS, and it is the agent
//! that is killed after each of them. `node_kill.rs` kills the same
//! processes at random instants inside the steps instead. With
//! `SNAP_CSI_TEST_DPUS=2` the host has two DPUs (`common::crash`): each
//! trial's volume goes where the node places it, the agent killed is that
//! DPU's, and "exactly one of everything" is counted over both DPUs, all of
//! it on one.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use common::crash::{
    CALL, Census, Kind, Process, Processes, Random, Shape, Stack, Volume, check_log, env_number,
    read_only_mount, rounds, seed, shapes,
};
use common::kubelet::{self, Call, Failure};

/// Every crash point a volume's life passes, with the call that passes it.
fn points(shape: &Shape) -> Vec<(Call, &'static str)> {
    let expose: &[&str] = match (shape.emulation, shape.placement) {
        ("nvme", "packed") => &[
            "attach:packed-pool-subsystem",
            "attach:packed-pool-controller",
            "attach:packed-namespace",
            "attach:packed-attach",
        ],
        ("nvme", _) => &[
            "attach:nvme-subsystem",
            "attach:nvme-namespace-controller",
            "attach:nvme-attach",
            "attach:nvme-resume",
        ],
        ("virtio-fs", _) => &[
            "attach:virtio-fs-device",
            "attach:virtio-fs-function",
            "attach:virtio-fs-bind",
            "attach:virtio-fs-start",
        ],
        _ => &["attach:virtio-controller"],
    };
    let format: &[&str] = match shape.kind {
        Kind::Block => &[],
        Kind::Ext4 | Kind::Xfs => &["stage:formatting", "stage:format", "stage:mount"],
        // Mounted by tag: no filesystem to make.
        Kind::Fs => &["stage:mount"],
    };
    let stage = ["attach:create-device"]
        .iter()
        .chain(expose)
        .chain(&["stage:attach", "stage:record"])
        .chain(format)
        .map(|point| (Call::Stage, *point));
    let exposure_detach: &[(Call, &str)] = match (shape.placement, shape.kind) {
        ("packed", _) => &[(Call::Unstage, "detach:packed-detach-ns")],
        (_, Kind::Fs) => &[
            (Call::Unstage, "detach:virtio-fs-hotunplug"),
            (Call::Unstage, "detach:virtio-fs-device"),
        ],
        _ => &[],
    };
    let rest = [
        (Call::Publish, "publish:target"),
        (Call::Publish, "publish:bind"),
        (Call::Unpublish, "unpublish:unmount"),
        (Call::Unstage, "unstage:unmount"),
    ]
    .iter()
    .chain(exposure_detach)
    .chain(&[
        (Call::Unstage, "detach:unexpose"),
        (Call::Unstage, "detach:delete-device"),
        (Call::Unstage, "unstage:detach"),
    ])
    .copied();
    stage.chain(rest).collect()
}

#[derive(Clone, Copy, Debug)]
struct Trial {
    shape: Shape,
    call: Call,
    point: &'static str,
    read_only: bool,
}

impl Trial {
    /// The process that passes the trial's point: in split mode the DPU
    /// steps run in the agent.
    fn crasher(&self, stack: &Stack) -> Process {
        let dpu_step = self.point.starts_with("attach:") || self.point.starts_with("detach:");
        if stack.split() && dpu_step {
            Process::Agent
        } else {
            Process::Node
        }
    }
}

/// `count` trials: rounds of every (shape, point), each round shuffled, so
/// every point is crashed in every shape once per round.
fn trials(count: usize, random: &mut Random) -> Vec<Trial> {
    let every: Vec<Trial> = shapes()
        .into_iter()
        .flat_map(|shape| {
            points(&shape).into_iter().map(move |(call, point)| Trial {
                shape,
                call,
                point,
                read_only: false,
            })
        })
        .collect();
    let mut trials = rounds(&every, count, random, "crash trials");
    for trial in &mut trials {
        trial.read_only = random.below(2) == 1;
    }
    trials
}

/// What a crash point did: the call in flight when its process died, the
/// process's end, and what the call answered once the process (alone, as
/// its pod would be) was started again.
struct Crash {
    call: Call,
    ended: ExitStatus,
    answer: Result<(), tonic::Status>,
}

/// kubelet's calls for `volume`, each made once, until the crash point
/// kills its process (`crasher`), which is then started again: a process's
/// exit is an event, waited for as such. `None` if every call succeeded.
async fn until_the_crash(
    (stack, processes, crasher): (&Stack, &mut Processes, Process),
    trial: &Trial,
    volume: &Volume,
    seen: &mut kubelet::Volume,
) -> Option<Crash> {
    let mut node = stack.client().await;
    for wanted in [true, false] {
        seen.wanted = wanted;
        while let Some(call) = seen.next() {
            let attempt = volume.call(&mut node, call, CALL);
            let mut attempt = std::pin::pin!(attempt);
            let exited = tokio::select! {
                answer = &mut attempt => match answer {
                    Ok(()) => {
                        seen.record(call, Ok(()));
                        continue;
                    }
                    // The crashed node's connection broke, or the node
                    // answered its agent's crash: the process is going.
                    Err(status) => Err(status),
                },
                ended = processes.get(crasher).wait() => Ok(ended.unwrap()),
            };
            let (ended, answer) = match exited {
                Err(status) => {
                    let mut child = processes.take(crasher);
                    let ended = tokio::time::timeout(CALL, child.wait())
                        .await
                        .unwrap_or_else(|_| {
                            panic!(
                                "{trial:?}: {call:?} answered {status} but the {} did not reach \
                                 its crash point",
                                crasher.name()
                            )
                        })
                        .unwrap();
                    (ended, Some(Err(status)))
                }
                Ok(ended) => {
                    processes.take(crasher);
                    (ended, None)
                }
            };
            processes.put(
                crasher,
                stack.spawn(crasher, None, &trial.shape, volume.dpu),
            );
            let answer = match answer {
                Some(answer) => answer,
                None => attempt.await,
            };
            seen.record(
                call,
                match &answer {
                    Ok(()) => Ok(()),
                    Err(status) => Err(Failure::of(status).code),
                },
            );
            return Some(Crash {
                call,
                ended,
                answer,
            });
        }
    }
    None
}

/// One trial: the volume's life on a stack armed to crash at the trial's
/// point; then kubelet's calls until the pod runs (census) and until it is
/// done with the volume (census).
async fn run(stack: &Stack, n: usize, trial: &Trial) {
    let volume = Volume::new(stack, n, trial.shape.kind, trial.read_only);
    if trial.point.starts_with("attach:packed-pool") {
        // Only a stage that finds no pool builds one.
        stack.remove_pools().await;
    }
    if matches!(
        trial.point,
        "attach:virtio-fs-function" | "attach:virtio-fs-bind"
    ) {
        // Only an attach that finds no spare function makes one.
        stack.remove_spare_functions().await;
    }
    let crasher = trial.crasher(stack);
    let mut processes = stack
        .processes(Some((crasher, trial.point)), &trial.shape, volume.dpu)
        .await;
    let mut seen = kubelet::Volume::default();
    let crash = until_the_crash((stack, &mut processes, crasher), trial, &volume, &mut seen)
        .await
        .unwrap_or_else(|| panic!("{trial:?}: the crash point was not reached"));
    assert_eq!(
        crash.call,
        trial.call,
        "{trial:?}: the {} ended in {:?} instead ({}, answered {:?})",
        crasher.name(),
        crash.call,
        crash.ended,
        crash.answer
    );
    assert_eq!(
        crash.ended.signal(),
        Some(nix::sys::signal::Signal::SIGKILL as i32),
        "{trial:?}: the {} ended otherwise than at its crash point ({}); the call answered {:?}",
        crasher.name(),
        crash.ended,
        crash.answer
    );

    let node = stack.client().await;
    if seen.wanted {
        volume
            .settle(&node, &mut seen)
            .await
            .unwrap_or_else(|stuck| panic!("{trial:?}: after the restart, stuck: {stuck}"));
        let published = Census::published(&trial.shape);
        assert_eq!(
            stack.settled_census(&volume.backing, &published).await,
            published,
            "{trial:?}: published once"
        );
        stack.note_placement(&volume);
        assert_eq!(
            read_only_mount(&volume.target),
            trial.read_only,
            "{trial:?}: the target's read-only setting"
        );
        seen.wanted = false;
    }
    volume
        .settle(&node, &mut seen)
        .await
        .unwrap_or_else(|stuck| panic!("{trial:?}: after the restart, stuck: {stuck}"));
    processes.stop().await;
    assert_eq!(
        stack
            .settled_census(&volume.backing, &Census::nothing())
            .await,
        Census::nothing(),
        "{trial:?}: after unstage"
    );
    assert!(
        !volume.target.exists(),
        "{trial:?}: the target path is left"
    );
    volume.remove();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_any_step_converges_on_retry_without_leaks_or_duplicates() {
    let seed = seed();
    let count = env_number("SNAP_CSI_CRASH_TRIALS").unwrap_or(200) as usize;
    // Printed first: the test's output shows it when a trial fails.
    println!("crash trials: {count}, seed {seed} (SNAP_CSI_CRASH_SEED={seed} replays them)");
    let stack = Stack::start().await;
    for (n, trial) in trials(count, &mut Random(seed)).iter().enumerate() {
        run(&stack, n, trial).await;
    }
    check_log(&stack);
    stack.check_placements();
}
