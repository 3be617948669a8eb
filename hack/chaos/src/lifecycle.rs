//! One worker: volume after volume through a random life, playing
//! external-provisioner (every failed CreateVolume and DeleteVolume tried
//! again, with backoff, until it succeeds or [`BUDGET`] has passed) and
//! kubelet by kubelet's rules (`snap_csi_harness::kubelet`): a pod starts
//! (stage, publish) and goes (unpublish, unstage), each failed call tried
//! again or not, and NodeUnstageVolume made only when kubelet would make it.
//! A call kubelet would go on making for ever (still failing after
//! [`BUDGET`]) makes the volume stuck: reported with its last answer and
//! kubelet's view of the volume, the pod then goes as kubelet lets it, and
//! only after that does an operator clean up by hand (NodeUnpublish and
//! NodeUnstage until they succeed), so that the rest of the round and its
//! census are about the next volumes. Unpublish and unstage are followed by
//! a look at the mount table (an OK that left the mount behind is a leak),
//! and every restage by reading the volume's pattern back. A kill trial's
//! worker also kills a process inside one step ([`KillSwitch`]).
//!
//! A pod's read or write that fails (EIO: SNAP restarted empty and the device
//! went away under the published volume, as on a DPU whose SNAP crashed) is
//! what Kubernetes answers with a pod restart (the container fails, the pod
//! is deleted and made again: kubelet unpublishes and unstages, then stages
//! and publishes for the new pod, and the node attaches the volume again).
//! The worker does that and the new pod does the I/O again: only what it
//! finds counts. Bytes that differ are data lost, and a second refusal a
//! device that never came back: data errors. The first refusal is counted
//! apart, expected when SNAP restarted since the pod started (its pid
//! changed). Half the NVMe-oF volumes are multipath (`nvmf-multipath`: one
//! device over both of the target's listeners): a path fault must not
//! reach their pod, so their I/O refused with SNAP up all along is a data
//! error. A single-path volume's I/O is held while its path is down; one
//! refused with SNAP up all along is counted as refused, and noted apart.
//!
//! On a host with two DPUs the SNAP that counts is the one of the DPU the
//! volume's record names, and a DPU-down fault (`dpu_down`) since the pod
//! started decides too: the downed DPU's volumes may have their I/O refused
//! (counted as refused, the pod restarted), the other DPU's may not: its
//! volume's I/O refused with its SNAP up all along is a data error (but for
//! a single-path NVMe-oF volume's, which a path fault or a killed target may
//! have held, as above). Such a host has no filesystem devices (local-up's
//! second DPU makes none), so its volumes are block devices.

use std::future::Future;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::unistd::Pid;
use snap_csi_harness::csi::{Clients, Kind, Volume, parameters};
use snap_csi_harness::dpus::recorded_on;
use snap_csi_harness::kubelet::{self, Backoff, Call, Failure};
use snap_csi_harness::stack::{DpuParts, read_pid};

use crate::data::{Pattern, Verdict};
use crate::dpu_down::Outages;
use crate::rng::Rng;
use crate::tally::Tally;
use crate::trials::KillSwitch;

/// How long a call may keep failing before it counts as not converging.
pub const BUDGET: Duration = Duration::from_secs(60);
/// kubelet's retries at a quicker pace than its own (500 ms doubling to
/// 2 min 2 s): a short cap finds a convergence sooner.
pub const BACKOFF: Backoff = Backoff {
    first: Duration::from_millis(100),
    max: Duration::from_secs(2),
    patience: BUDGET,
};
/// The most restages a kill trial's life makes waiting for its kill.
const KILL_RESTAGES: u64 = 3;
/// Every volume is big enough for xfs (Debian 12's mkfs.xfs wants 300 MiB).
const SIZE_MIB: i64 = 320;
/// The sample plugin's StorageClass parameter asking for every path.
const MULTIPATH: (&str, &str) = ("nvmf-multipath", "true");
/// How long a refused I/O waits for local-up to show SNAP's successor.
const SNAP_RESTART_SEEN: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub struct Worker {
    pub id: usize,
    pub clients: Clients,
    pub kubelet: std::path::PathBuf,
    pub tally: Arc<Tally>,
    /// Set at the end of the round: finish this volume, start no other.
    pub stop: Arc<AtomicBool>,
    pub rng: Rng,
    /// Percent of unpublishes that meet a process holding the mount.
    pub holder_percent: u64,
    /// The pace of kubelet's retries, and how long a call may fail.
    pub backoff: Backoff,
    /// Restages in each life (`None`: one to three at random); a kill
    /// trial's life restages up to [`KILL_RESTAGES`] times until its kill
    /// has landed.
    pub restages: Option<u64>,
    /// A kill trial's: a process killed inside one step.
    pub kill: Option<Arc<KillSwitch>>,
    /// The stack's directory, where local-up keeps SNAP's pid.
    pub stack_dir: std::path::PathBuf,
    /// The node's state directory, where it keeps its volume records.
    pub node_state_dir: std::path::PathBuf,
    /// The host's DPUs.
    pub dpus: Vec<DpuParts>,
    /// The DPU-down faults of the round.
    pub outages: Arc<Outages>,
    /// When the pod last started, and each DPU's SNAP's pid then (`None`:
    /// unknown).
    pub pod_started: (Instant, Vec<Option<Pid>>),
}

/// A volume's StorageClass and kind.
#[derive(Debug, Clone)]
pub struct Shape {
    /// The sample controller's backend: `aio`, `nvmf` or `fs`.
    pub backend: &'static str,
    pub emulation: &'static str,
    /// NVMe: `dedicated` or `packed`; a virtio-blk function has one disk;
    /// a filesystem volume (`fs`, virtio-fs) has none (empty).
    pub placement: &'static str,
    pub kind: Kind,
    /// An NVMe-oF volume attached through every listener of the target.
    pub multipath: bool,
}

impl Shape {
    /// A random shape; `filesystems`: a filesystem device is one.
    pub fn random(rng: &mut Rng, filesystems: bool) -> Shape {
        // One volume in five a filesystem device (virtio-fs), mounted by tag.
        if filesystems && rng.chance(20) {
            return Shape {
                backend: "fs",
                emulation: "virtio-fs",
                placement: "",
                kind: Kind::Filesystem("virtiofs".into()),
                multipath: false,
            };
        }
        let backend = *rng.pick(&["aio", "nvmf"]);
        // Half the NVMe-oF volumes on both paths.
        let multipath = backend == "nvmf" && rng.chance(50);
        let emulation = *rng.pick(&["nvme", "virtio-blk"]);
        let placement = match emulation {
            "nvme" => *rng.pick(&["dedicated", "packed"]),
            _ => "dedicated",
        };
        let kind = rng
            .pick(&[
                Kind::Block,
                Kind::Filesystem("ext4".into()),
                Kind::Filesystem("xfs".into()),
            ])
            .clone();
        Shape {
            backend,
            emulation,
            placement,
            kind,
            multipath,
        }
    }

    /// Its StorageClass parameters.
    fn parameters(&self) -> std::collections::HashMap<String, String> {
        let placement = Some(self.placement).filter(|p| !p.is_empty());
        let mut parameters = parameters(self.backend, self.emulation, placement);
        if self.multipath {
            parameters.insert(MULTIPATH.0.to_string(), MULTIPATH.1.to_string());
        }
        parameters
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Block => "block",
            Kind::Filesystem(fs) => fs,
            Kind::Shared => "shared",
        };
        let placement = match self.placement {
            "" => String::new(),
            placement => format!(" {placement}"),
        };
        let multipath = if self.multipath { " multipath" } else { "" };
        write!(
            f,
            "{}{multipath}, {}{placement}, {kind}",
            self.backend, self.emulation
        )
    }
}

/// Runs `call` until it succeeds or [`BUDGET`] has passed since the first
/// attempt; counts the success as an operation, each failure under its code.
pub async fn converge<T, F, Fut>(
    tally: &Tally,
    call: &str,
    subject: &str,
    mut attempt: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let started = Instant::now();
    let mut pause = BACKOFF.first;
    loop {
        match attempt().await {
            Ok(value) => {
                tally.operation();
                return Ok(value);
            }
            Err(error) => {
                let failure = failure(&error);
                tally.attempt_failed(call, &code_name(&failure), &failure.message);
                if started.elapsed() + pause >= BUDGET {
                    return Err(error.context(format!(
                        "{call} {subject}: still failing after {:.0} s",
                        started.elapsed().as_secs_f64()
                    )));
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(BACKOFF.max);
            }
        }
    }
}

/// A failed call as kubelet sees it.
fn failure(error: &anyhow::Error) -> Failure {
    match error.downcast_ref::<tonic::Status>() {
        Some(status) => Failure::of(status),
        None => Failure {
            code: None,
            message: format!("{error:#}"),
        },
    }
}

fn code_name(failure: &Failure) -> String {
    failure.code.map_or_else(
        || "not a gRPC status".to_string(),
        |code| format!("{code:?}"),
    )
}

impl Worker {
    pub async fn run(mut self) {
        let mut serial = 0;
        while !self.stop.load(Ordering::Relaxed) {
            serial += 1;
            let shape = Shape::random(&mut self.rng, self.dpus.len() == 1);
            self.life(serial, &shape).await;
        }
    }

    /// One volume: created, used by pods as kubelet would, deleted.
    pub async fn life(&mut self, serial: u64, shape: &Shape) {
        let name = format!("chaos-w{}-{serial}", self.id);
        self.tally.volume(&shape.to_string());
        let label = format!("{name} ({shape})");
        let created = converge(&self.tally, "CreateVolume", &label, || {
            let mut clients = self.clients.clone();
            let (kubelet, name, kind) = (self.kubelet.clone(), name.clone(), shape.kind.clone());
            let parameters = shape.parameters();
            async move {
                clients
                    .create_with(&kubelet, &name, &kind, SIZE_MIB, parameters)
                    .await
            }
        })
        .await;
        let volume = match created {
            Ok(volume) => volume,
            Err(error) => return self.tally.stuck(format!("{error:#}")),
        };
        let mut seen = kubelet::Volume::default();
        let mut stuck = false;
        if let Err(error) = self.exercise(&volume, shape, &label, &mut seen).await {
            stuck = true;
            self.tally.stuck(format!("{label}: {error:#}"));
        }
        // The pod goes, whatever happened, and kubelet does what it does then.
        if let Err(error) = self
            .pod_goes(&volume, shape, &label, &mut seen, (0, false))
            .await
        {
            stuck = true;
            self.tally.stuck(format!("{label}: {error:#}"));
        }
        if stuck {
            self.clean_by_hand(&volume, &label).await;
        }
        let deleted = converge(&self.tally, "DeleteVolume", &label, || {
            let (mut clients, volume) = (self.clients.clone(), volume.clone());
            async move { clients.delete(&volume).await }
        })
        .await;
        if let Err(error) = deleted {
            self.tally.stuck(format!("{error:#}"));
        }
    }

    /// A pod starts (stage, publish) and writes; then one to three times
    /// (or [`Worker::restages`]): maybe read back while published, the pod
    /// goes (unpublish, maybe against a holder; unstage), a new one starts
    /// and reads back, maybe writing a new pattern.
    async fn exercise(
        &mut self,
        volume: &Volume,
        shape: &Shape,
        label: &str,
        seen: &mut kubelet::Volume,
    ) -> anyhow::Result<()> {
        let block = volume.kind == Kind::Block;
        self.pod_starts(volume, shape, label, seen, 1).await?;
        let pod = (volume, shape, label);
        let mut pattern = Pattern::new(&mut self.rng, block);
        self.io(pod, seen, Io::Write(&pattern)).await?;
        let restages = match self.restages {
            Some(restages) => restages,
            None => self.rng.range(1, 3),
        };
        let mut restage = 0;
        while restage < restages
            || restage < KILL_RESTAGES && self.kill.as_ref().is_some_and(|k| k.pending())
        {
            restage += 1;
            if self.rng.chance(30) {
                self.io(pod, seen, Io::Verify(&pattern, "while published"))
                    .await?;
            }
            let held = self.rng.chance(self.holder_percent);
            self.pod_goes(volume, shape, label, seen, (restage, held))
                .await?;
            self.pod_starts(volume, shape, label, seen, restage + 1)
                .await?;
            let when = format!("after restage {restage}");
            self.io(pod, seen, Io::Verify(&pattern, &when)).await?;
            if self.rng.chance(50) {
                pattern = Pattern::new(&mut self.rng, block);
                self.io(pod, seen, Io::Write(&pattern)).await?;
            }
        }
        Ok(())
    }

    /// The volume's `pod`th pod is scheduled here: kubelet's calls until it
    /// runs.
    async fn pod_starts(
        &mut self,
        volume: &Volume,
        shape: &Shape,
        label: &str,
        seen: &mut kubelet::Volume,
        pod: u64,
    ) -> anyhow::Result<()> {
        // Before the stage: a SNAP restarted meanwhile counts as one since.
        self.pod_started = (
            Instant::now(),
            self.dpus
                .iter()
                .map(|dpu| read_pid(&self.stack_dir, &dpu.process("snap")).ok())
                .collect(),
        );
        seen.wanted = true;
        kubelet::settle(seen, volume.device_mount_path(), &self.backoff, |call| {
            self.node_call(call, volume, shape, label, pod)
        })
        .await
        .map_err(|stuck| anyhow::anyhow!("the pod never starts: {stuck}"))
    }

    /// The volume's `pod`th pod goes: kubelet's calls until it is done with
    /// the volume. With `held`, a process keeps the published mount busy
    /// (its working directory there, or the block device open) for a random
    /// while, as a pod's straggler would.
    async fn pod_goes(
        &mut self,
        volume: &Volume,
        shape: &Shape,
        label: &str,
        seen: &mut kubelet::Volume,
        (pod, held): (u64, bool),
    ) -> anyhow::Result<()> {
        let holder = if held {
            let hold = self.rng.millis(300, 5000);
            match hold_mount(&volume.target, volume.kind == Kind::Block, hold) {
                Ok(child) => {
                    self.tally.fault("EBUSY holder");
                    Some(child)
                }
                // Not published (an earlier step failed): nothing to hold.
                Err(_) => None,
            }
        } else {
            None
        };
        seen.wanted = false;
        let settled = kubelet::settle(seen, volume.device_mount_path(), &self.backoff, |call| {
            self.node_call(call, volume, shape, label, pod)
        });
        let settled = match holder {
            Some(mut child) => {
                let (settled, _) = tokio::join!(settled, child.wait());
                settled
            }
            None => settled.await,
        };
        settled.map_err(|stuck| anyhow::anyhow!("the pod's teardown never ends: {stuck}"))
    }

    /// One call kubelet makes for the volume's `pod`th pod, counted: a
    /// success as an operation (and an unpublish or unstage followed by a
    /// look at the mount table), a failure under its code. In a kill trial,
    /// the call may be the one a process is killed in; the first pod's stage
    /// is timed apart from the later ones (only the first formats).
    fn node_call(
        &self,
        call: Call,
        volume: &Volume,
        shape: &Shape,
        label: &str,
        pod: u64,
    ) -> impl Future<Output = Result<(), Failure>> + 'static {
        let (mut clients, volume, tally) =
            (self.clients.clone(), volume.clone(), self.tally.clone());
        let step = |first: bool| match (call, first) {
            (Call::Stage, true) => format!("stage {shape}, first"),
            (Call::Stage, false) => format!("stage {shape}, again"),
            _ => format!("{} {shape}", call.step()),
        };
        let (kill, label, steps) = (
            self.kill.clone(),
            label.to_string(),
            [step(pod == 1), step(pod != 1)],
        );
        async move {
            let attempt = async {
                match call {
                    Call::Stage => clients.stage(&volume).await,
                    Call::Publish => clients.publish(&volume).await,
                    Call::Unpublish => clients.unpublish(&volume).await,
                    Call::Unstage => clients.unstage(&volume).await,
                }
            };
            let result = match &kill {
                Some(kill) => kill.around(call, &steps, attempt).await,
                None => attempt.await,
            };
            match result {
                Ok(()) => {
                    tally.operation();
                    match call {
                        Call::Unpublish => expect_unmounted(&tally, &volume.target, &label, call),
                        Call::Unstage => expect_unmounted(&tally, &volume.staging, &label, call),
                        Call::Stage | Call::Publish => {}
                    }
                    Ok(())
                }
                Err(error) => {
                    let failure = failure(&error);
                    tally.attempt_failed(call.name(), &code_name(&failure), &failure.message);
                    Err(failure)
                }
            }
        }
    }

    /// After a stuck volume: what kubelet left on the node, then an
    /// operator's NodeUnpublish and NodeUnstage (calls kubelet would not
    /// make), each tried until it succeeds, so that the round goes on with a
    /// clean node.
    async fn clean_by_hand(&self, volume: &Volume, label: &str) {
        let left: Vec<String> = [&volume.target, &volume.staging]
            .into_iter()
            .filter(|path| mounted_at(path).unwrap_or(true))
            .map(|path| path.display().to_string())
            .collect();
        eprintln!(
            "chaos: {label}: kubelet is done with it; still mounted: {}; an operator unpublishes and unstages it",
            if left.is_empty() {
                "nothing".to_string()
            } else {
                left.join(", ")
            }
        );
        self.tally.cleaned_by_hand(label);
        for call in [Call::Unpublish, Call::Unstage] {
            let cleaned = converge(&self.tally, call.name(), label, || {
                let (mut clients, volume) = (self.clients.clone(), volume.clone());
                async move {
                    match call {
                        Call::Unpublish => clients.unpublish(&volume).await,
                        _ => clients.unstage(&volume).await,
                    }
                }
            })
            .await;
            match cleaned {
                Ok(()) => {
                    let path = if call == Call::Unpublish {
                        &volume.target
                    } else {
                        &volume.staging
                    };
                    expect_unmounted(&self.tally, path, label, call);
                }
                Err(error) => self.tally.stuck(format!("{label}: by hand: {error:#}")),
            }
        }
    }

    /// The pod's read or write of its pattern; refused (the device went away
    /// under it), the pod restarts and does it again (see the module's
    /// comment).
    async fn io(
        &mut self,
        (volume, shape, label): (&Volume, &Shape, &str),
        seen: &mut kubelet::Volume,
        io: Io<'_>,
    ) -> anyhow::Result<()> {
        let Err(refused) = self.try_io(volume, label, io).await? else {
            return Ok(());
        };
        let dpu = self.dpu_of(volume);
        let home = dpu.map(|i| self.dpus[i].name.as_str());
        let down = self.outages.down_since(self.pod_started.0);
        let other_down = down.iter().find(|d| Some(d.as_str()) != home);
        if self.snap_restarted(dpu).await {
            self.tally.refused(format!("{label}: {refused}"));
        } else if let Some(home) = home
            && down.iter().any(|d| d == home)
        {
            self.tally.note(
                format!("I/O refused while its DPU was down ({shape})"),
                &format!("{label}: {refused}"),
            );
            self.tally.refused(format!("{label}: {refused}"));
        } else if shape.multipath {
            self.tally.data_error(format!(
                "{label}: I/O error on a multipath volume with SNAP up all along: {refused}"
            ));
        } else if let Some(other) = other_down
            && shape.backend != "nvmf"
        {
            self.tally.data_error(format!(
                "{label}: I/O error on a volume of {} with its SNAP up all along, while {other} was down: {refused}",
                home.unwrap_or("its DPU")
            ));
        } else {
            self.tally.note(
                format!("I/O refused with SNAP up all along ({shape})"),
                &format!("{label}: {refused}"),
            );
            self.tally.refused(format!("{label}: {refused}"));
        }
        // The pod goes and a new one starts (never the first: it formats no
        // more).
        self.pod_goes(volume, shape, label, seen, (2, false))
            .await?;
        self.pod_starts(volume, shape, label, seen, 2).await?;
        if let Err(again) = self.try_io(volume, label, io).await? {
            self.tally.data_error(format!(
                "{label}: refused again after the pod restarted: {again}"
            ));
        }
        Ok(())
    }

    /// The index in [`Worker::dpus`] of the DPU the volume's record names
    /// (an older node's record names none: the first); `None` without a
    /// record. A host with one DPU has one place for it, record or not.
    fn dpu_of(&self, volume: &Volume) -> Option<usize> {
        if self.dpus.len() == 1 {
            return Some(0);
        }
        let names: Vec<String> = self.dpus.iter().map(|d| d.name.clone()).collect();
        let (dpu, _) = recorded_on(&self.node_state_dir, &volume.id, &names).ok()?;
        names.iter().position(|name| *name == dpu)
    }

    /// Whether the SNAP of DPU `dpu` has restarted since the pod started
    /// (its devices then went away): its pid changed, or the one the pod
    /// started with is gone, within [`SNAP_RESTART_SEEN`] (local-up writes
    /// the successor's pid once it starts it). Unknown counts as restarted.
    async fn snap_restarted(&self, dpu: Option<usize>) -> bool {
        let Some((then, process)) = dpu.and_then(|i| {
            let then = (*self.pod_started.1.get(i)?)?;
            Some((then, self.dpus[i].process("snap")))
        }) else {
            return true;
        };
        let started = Instant::now();
        loop {
            match read_pid(&self.stack_dir, &process) {
                Ok(now) if now == then => {}
                _ => return true,
            }
            if !alive(then) {
                return true;
            }
            if started.elapsed() >= SNAP_RESTART_SEEN {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One read or write through the published volume: `Err` when the host
    /// refused it (an I/O error); bytes that differ are a data error here.
    async fn try_io(
        &self,
        volume: &Volume,
        label: &str,
        io: Io<'_>,
    ) -> anyhow::Result<Result<(), String>> {
        let (target, block) = (volume.target.clone(), volume.kind == Kind::Block);
        let outcome = match io {
            Io::Write(pattern) => {
                let copy = pattern.clone();
                tokio::task::spawn_blocking(move || copy.write(&target, block))
                    .await?
                    .map_err(|error| format!("writing {}: {error:#}", pattern.describe()))
            }
            Io::Verify(pattern, when) => {
                let copy = pattern.clone();
                match tokio::task::spawn_blocking(move || copy.verify(&target, block)).await? {
                    Ok(Verdict::Intact) => Ok(()),
                    Ok(Verdict::Differs { bytes, first }) => {
                        self.tally.data_error(format!(
                            "{label} {when}: {bytes} bytes differ, the first at +{first}, of {}",
                            pattern.describe()
                        ));
                        return Ok(Ok(()));
                    }
                    Err(error) => Err(format!(
                        "{when}: reading {} failed: {error:#}",
                        pattern.describe()
                    )),
                }
            }
        };
        if outcome.is_ok() {
            self.tally.operation();
        }
        Ok(outcome)
    }
}

/// What a pod does with its pattern: write it, or read it back (when).
#[derive(Debug, Clone, Copy)]
enum Io<'a> {
    Write(&'a Pattern),
    Verify(&'a Pattern, &'a str),
}

/// An OK from `call` with `path` still mounted is a leak.
fn expect_unmounted(tally: &Tally, path: &Path, label: &str, call: Call) {
    match mounted_at(path) {
        Ok(false) => {}
        Ok(true) => tally.leak(format!(
            "{label}: {} answered OK but {} is still mounted",
            call.name(),
            path.display()
        )),
        Err(error) => tally.leak(format!("{label}: {error:#}")),
    }
}

/// A `sleep` whose working directory is the published filesystem, or whose
/// stdin is the published block device: either keeps the mount busy.
fn hold_mount(target: &Path, block: bool, hold: Duration) -> anyhow::Result<tokio::process::Child> {
    if !mounted_at(target)? {
        anyhow::bail!("{} is not mounted", target.display());
    }
    let mut command = tokio::process::Command::new("sleep");
    command
        .arg(format!("{:.3}", hold.as_secs_f64()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    if block {
        command.stdin(std::fs::File::open(target)?);
    } else {
        command.stdin(Stdio::null()).current_dir(target);
    }
    command.spawn().context("starting a holder")
}

/// Whether process `pid` runs (not gone, not a zombie waiting for its parent).
fn alive(pid: Pid) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command's closing parenthesis.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Whether `path` is a mount point in this mount namespace.
pub fn mounted_at(path: &Path) -> anyhow::Result<bool> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").context("reading mountinfo")?;
    let wanted = path.to_string_lossy();
    Ok(table
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(wanted.as_ref())))
}
