//! Crash safety: the node process is killed with SIGKILL right after a step of
//! stage, publish, unpublish or unstage (a crash point armed through the
//! environment), restarted, and the call retried as kubelet would. It must
//! converge: after the retried publish exactly one of everything exists (bdev,
//! subsystem or controller, loop device, mounts), and after unstage nothing is
//! left: no bdev, namespace, controller, loop device, mount, target path or
//! record. The trials cover every step in both emulations, both placements of
//! NVMe (dedicated, and packed: a namespace on a pool controller, whose
//! pools stay, empty, after the unstage) and all three volume kinds (block,
//! ext4, xfs), in a seeded random order with random read-only publishes (`SNAP_CSI_CRASH_SEED` replays a run, `SNAP_CSI_CRASH_TRIALS`
//! sets how many; 200 by default). In a split-mode run (`common::dpu`) the DPU
//! steps (attach and detach) run in a `snap-csi dpu-agent` process reached
//! over mutual TLS, and it is the agent that is killed after each of them.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use common::dpu::{DPU_NAME, HOST_NAME};
use common::node::{
    block_capability, connect, mount_capability, mounts_under, publish_request, stage_request,
};
use common::pki::{Pki, Role};
use common::{Emulator, loop_devices_of, timed};
use snap_csi::dpu::names::pool_index;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::node_client::NodeClient;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use snap_csi::spdk::bdev::BdevGetBdevs;
use snap_csi::spdk::snap::{
    NvmeControllerDestroy, NvmeSubsystemDestroy, NvmeSubsystemList, VirtioBlkControllerList,
};

/// A crashing call gets this long; a dead DPU agent ends it with UNAVAILABLE.
const CRASHING_CALL: Duration = Duration::from_secs(5);

struct Stack {
    emulator: Emulator,
    _plugin: common::plugin::TestPlugin,
    plugin_socket: PathBuf,
    kubelet: PathBuf,
    state: PathBuf,
    endpoint: PathBuf,
    /// In a split-mode run: the agent's flags and the node's flags to reach it.
    link: Option<(Vec<String>, Vec<String>)>,
}

impl Stack {
    async fn start() -> Stack {
        let emulator = Emulator::start().await;
        let root = emulator.root().to_path_buf();
        let plugin = common::plugin::start(&emulator.socket, &root).await;
        let kubelet = root.join("kubelet");
        std::fs::create_dir_all(&kubelet).unwrap();
        let link = common::dpu::split().then(|| {
            let pki = Pki::new(&root.join("pki"), "ca");
            let (agent, node) = (
                pki.issue(Role::Agent, DPU_NAME),
                pki.issue(Role::Node, HOST_NAME),
            );
            let listen = format!("https://{}", common::shared::free_local_address());
            let agent_args = vec![
                format!("--listen={listen}"),
                format!("--host-name={HOST_NAME}"),
                format!("--tls-cert={}", agent.cert.display()),
                format!("--tls-key={}", agent.key.display()),
                format!("--tls-ca={}", agent.ca.display()),
                format!("--plugin-socket={}", plugin.socket.display()),
                format!("--snap-socket-template={}", emulator.socket.display()),
            ];
            let node_args = vec![
                format!("--dpu-endpoint={listen}"),
                format!("--dpu-name={DPU_NAME}"),
                format!("--dpu-tls-cert={}", node.cert.display()),
                format!("--dpu-tls-key={}", node.key.display()),
                format!("--dpu-tls-ca={}", node.ca.display()),
            ];
            (agent_args, node_args)
        });
        Stack {
            plugin_socket: plugin.socket.clone(),
            _plugin: plugin,
            kubelet,
            state: root.join("node-state"),
            endpoint: root.join("csi.sock"),
            emulator,
            link,
        }
    }

    /// Whether the step `point` runs in the DPU agent's process.
    fn in_agent(&self, point: &str) -> bool {
        self.link.is_some() && (point.starts_with("attach:") || point.starts_with("detach:"))
    }

    /// Starts the processes of the stack: `snap-csi node`, and in split mode
    /// `snap-csi dpu-agent` first; the one that runs `crash_after` kills
    /// itself after that step. The agent comes first in the list.
    fn processes(&self, crash_after: Option<&str>, trial: &Trial) -> Vec<Child> {
        let in_agent = crash_after.is_some_and(|p| self.in_agent(p));
        let mut started = Vec::new();
        if let Some((agent_args, _)) = &self.link {
            let mut agent = self.command("dpu-agent", if in_agent { crash_after } else { None });
            started.push(agent.args(agent_args).spawn().unwrap());
        }
        let mut node = self.command("node", if in_agent { None } else { crash_after });
        node.arg("--endpoint")
            .arg(&self.endpoint)
            .arg("--node-id")
            .arg(HOST_NAME)
            .arg("--kubelet-dir")
            .arg(&self.kubelet)
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--sysfs-root")
            .arg(&self.emulator.sysfs_root)
            .arg("--plugin-socket")
            .arg(&self.plugin_socket)
            .arg("--snap-socket-template")
            .arg(&self.emulator.socket)
            .arg("--emulation")
            .arg(trial.emulation)
            .arg("--placement")
            .arg(trial.placement);
        if let Some((_, node_args)) = &self.link {
            node.args(node_args);
        }
        started.push(node.spawn().unwrap());
        started
    }

    /// `snap-csi <subcommand>` logging JSON at debug level into the stack's
    /// log, with `crash_after` armed.
    fn command(&self, subcommand: &str, crash_after: Option<&str>) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_snap-csi"));
        command
            .arg("--log-format")
            .arg("json")
            .arg(subcommand)
            // As chatty as it gets, to prove that even then no secret is logged.
            .env("RUST_LOG", "debug")
            .stderr(self.log())
            .env_remove(snap_csi::failpoint::ENV);
        if let Some(point) = crash_after {
            command.env(snap_csi::failpoint::ENV, point);
        }
        command
    }

    /// The stack processes' log, appended by each run.
    fn log(&self) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.emulator.root().join("stack.log"))
            .unwrap()
    }

    async fn client(&self) -> NodeClient<tonic::transport::Channel> {
        NodeClient::new(connect(&self.endpoint).await)
    }

    /// What the DPU side and the host hold: bdevs, NVMe subsystems of
    /// volumes, namespaces in pools, virtio-blk controllers, loop devices
    /// over `backing`, mounts under kubelet's directory, and the node's
    /// records. A pool itself is not counted (it stays, empty, warm for the
    /// next packed volume), but each must have exactly one controller.
    async fn census(&self, backing: &Path) -> Census {
        let snap = self.emulator.client();
        let subsystems = snap.call(&NvmeSubsystemList {}).await.unwrap();
        let (pools, volumes): (Vec<_>, Vec<_>) = subsystems
            .iter()
            .partition(|s| pool_index(&s.nqn).is_some());
        for pool in &pools {
            assert_eq!(
                pool.controllers.len(),
                1,
                "a pool with other than one controller: {pool:?}"
            );
        }
        Census {
            bdevs: snap.call(&BdevGetBdevs::default()).await.unwrap().len(),
            subsystems: volumes.len(),
            pooled_namespaces: pools.iter().map(|p| p.namespaces.len()).sum(),
            controllers: snap.call(&VirtioBlkControllerList {}).await.unwrap().len(),
            loop_devices: loop_devices_of(backing).len(),
            mounts: mounts_under(&self.kubelet).len(),
            records: std::fs::read_dir(self.state.join("volumes"))
                .map(|d| d.count())
                .unwrap_or(0),
        }
    }
}

#[derive(Debug, PartialEq)]
struct Census {
    bdevs: usize,
    subsystems: usize,
    pooled_namespaces: usize,
    controllers: usize,
    loop_devices: usize,
    mounts: usize,
    records: usize,
}

/// Waits for a process that was told to crash to be gone.
fn reap(mut child: Child) {
    for _ in 0..500 {
        if child.try_wait().unwrap().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("the process did not reach its crash point");
}

/// Stops processes gracefully, the last started first (the node before its
/// agent).
fn stop_all(processes: Vec<Child>) {
    for mut child in processes.into_iter().rev() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        child.wait().unwrap();
    }
}

/// Sparse, so cheap; big enough for xfs (mkfs.xfs wants at least 300 MB).
const SIZE: u64 = 512 << 20;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Block,
    Ext4,
    Xfs,
}

/// kubelet's calls, in the order of a volume's life on a node.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Call {
    Stage,
    Publish,
    Unpublish,
    Unstage,
}

const CALLS: [Call; 4] = [Call::Stage, Call::Publish, Call::Unpublish, Call::Unstage];

/// Every crash point a volume's life passes, with the call that passes it.
fn points(emulation: &str, placement: &str, kind: Kind) -> Vec<(Call, &'static str)> {
    let expose: &[&str] = match (emulation, placement) {
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
        _ => &["attach:virtio-controller"],
    };
    let format: &[&str] = match kind {
        Kind::Block => &[],
        Kind::Ext4 | Kind::Xfs => &["stage:format", "stage:mount"],
    };
    let stage = ["attach:create-device"]
        .iter()
        .chain(expose)
        .chain(&["stage:attach", "stage:record"])
        .chain(format)
        .map(|point| (Call::Stage, *point));
    let packed_detach: &[(Call, &str)] = match placement {
        "packed" => &[(Call::Unstage, "detach:packed-detach-ns")],
        _ => &[],
    };
    let rest = [
        (Call::Publish, "publish:target"),
        (Call::Publish, "publish:bind"),
        (Call::Unpublish, "unpublish:unmount"),
        (Call::Unstage, "unstage:unmount"),
    ]
    .iter()
    .chain(packed_detach)
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
    emulation: &'static str,
    placement: &'static str,
    kind: Kind,
    call: Call,
    point: &'static str,
    read_only: bool,
}

/// splitmix64: a reproducible order from a printed seed, without a crate.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `count` trials: rounds of every (emulation, placement, kind, point),
/// each round shuffled, so every point is crashed in every configuration once
/// per round.
fn trials(count: usize, random: &mut Random) -> Vec<Trial> {
    let mut every = Vec::new();
    let configurations = [
        ("nvme", "dedicated"),
        ("nvme", "packed"),
        ("virtio-blk", "dedicated"),
    ];
    for (emulation, placement) in configurations {
        for kind in [Kind::Block, Kind::Ext4, Kind::Xfs] {
            for (call, point) in points(emulation, placement, kind) {
                every.push(Trial {
                    emulation,
                    placement,
                    kind,
                    call,
                    point,
                    read_only: false,
                });
            }
        }
    }
    let mut trials = Vec::with_capacity(count + every.len());
    while trials.len() < count {
        let mut round = every.clone();
        for i in (1..round.len()).rev() {
            round.swap(i, random.below(i + 1));
        }
        for trial in &mut round {
            trial.read_only = random.below(2) == 1;
        }
        trials.extend(round);
    }
    trials.truncate(count);
    trials
}

fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value} is not a number")),
    )
}

/// The files and paths of one trial's volume, as kubelet lays them out.
struct Volume {
    id: String,
    backing: PathBuf,
    staging: PathBuf,
    target: PathBuf,
    capability: csi::VolumeCapability,
    read_only: bool,
}

impl Volume {
    fn new(stack: &Stack, n: usize, trial: &Trial) -> Volume {
        let id = format!("pvc-{n}");
        let backing = stack.emulator.root().join(format!("{id}.img"));
        common::sparse_file(&backing, SIZE);
        let staging = stack.kubelet.join("plugins/staging").join(&id);
        let pod = stack.kubelet.join("pods").join(&id);
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::create_dir_all(&pod).unwrap();
        let capability = match trial.kind {
            Kind::Block => block_capability(Mode::SingleNodeWriter),
            Kind::Ext4 => mount_capability("ext4", Mode::SingleNodeWriter),
            Kind::Xfs => mount_capability("xfs", Mode::SingleNodeWriter),
        };
        Volume {
            id,
            backing,
            staging,
            target: pod.join("volume"),
            capability,
            read_only: trial.read_only,
        }
    }

    /// Makes `call` for this volume, cut off after `timeout`.
    async fn call(
        &self,
        node: &mut NodeClient<tonic::transport::Channel>,
        call: Call,
        timeout: Duration,
    ) -> Result<(), tonic::Status> {
        let (id, staging) = (self.id.as_str(), self.staging.as_path());
        match call {
            Call::Stage => node
                .node_stage_volume(timed(
                    stage_request(id, staging, self.capability.clone(), &self.backing),
                    timeout,
                ))
                .await
                .map(drop),
            Call::Publish => node
                .node_publish_volume(timed(
                    publish_request(
                        id,
                        staging,
                        &self.target,
                        self.capability.clone(),
                        self.read_only,
                    ),
                    timeout,
                ))
                .await
                .map(drop),
            Call::Unpublish => node
                .node_unpublish_volume(timed(
                    csi::NodeUnpublishVolumeRequest {
                        volume_id: id.into(),
                        target_path: self.target.display().to_string(),
                    },
                    timeout,
                ))
                .await
                .map(drop),
            Call::Unstage => node
                .node_unstage_volume(timed(
                    csi::NodeUnstageVolumeRequest {
                        volume_id: id.into(),
                        staging_target_path: staging.display().to_string(),
                    },
                    timeout,
                ))
                .await
                .map(drop),
        }
    }
}

/// A call made after the restart gets this long: far more than it needs.
const RETRIED_CALL: Duration = Duration::from_secs(60);

/// One trial: the volume's life on a stack armed to crash at the trial's
/// point, then, after a restart, the failed call again and the rest of the
/// life, checking the census after the publish and at the end.
async fn run(stack: &Stack, n: usize, trial: &Trial) {
    let volume = Volume::new(stack, n, trial);
    if trial.point.starts_with("attach:packed-pool") {
        // Only a stage that finds no pool builds one.
        remove_pools(stack).await;
    }
    let mut processes = stack.processes(Some(trial.point), trial);
    let mut node = stack.client().await;
    let mut failed = None;
    for call in CALLS {
        if let Err(status) = volume.call(&mut node, call, CRASHING_CALL).await {
            failed = Some((call, status));
            break;
        }
    }
    let (call, status) =
        failed.unwrap_or_else(|| panic!("{trial:?}: the crash point was not reached"));
    assert_eq!(
        call, trial.call,
        "{trial:?}: {call:?} failed instead: {status}"
    );
    // The agent, when it is the one, is first; the node is last.
    let crashed = if stack.in_agent(trial.point) {
        0
    } else {
        processes.len() - 1
    };
    reap(processes.remove(crashed));
    stop_all(processes);

    let packed = trial.placement == "packed";
    let attached = Census {
        bdevs: 1,
        subsystems: usize::from(trial.emulation == "nvme" && !packed),
        pooled_namespaces: usize::from(packed),
        controllers: usize::from(trial.emulation == "virtio-blk"),
        loop_devices: 1,
        mounts: if trial.kind == Kind::Block { 1 } else { 2 },
        records: 1,
    };
    let processes = stack.processes(None, trial);
    let mut node = stack.client().await;
    for call in CALLS.into_iter().skip_while(|call| *call != trial.call) {
        volume
            .call(&mut node, call, RETRIED_CALL)
            .await
            .unwrap_or_else(|e| panic!("{trial:?}: {call:?} after the restart: {e}"));
        if call == Call::Publish {
            assert_eq!(
                stack.census(&volume.backing).await,
                attached,
                "{trial:?}: published once"
            );
            assert_eq!(
                read_only_mount(&volume.target),
                trial.read_only,
                "{trial:?}: the target's read-only setting"
            );
        }
    }
    stop_all(processes);
    let nothing = Census {
        bdevs: 0,
        subsystems: 0,
        pooled_namespaces: 0,
        controllers: 0,
        loop_devices: 0,
        mounts: 0,
        records: 0,
    };
    assert_eq!(
        stack.census(&volume.backing).await,
        nothing,
        "{trial:?}: after unstage"
    );
    assert!(
        !volume.target.exists(),
        "{trial:?}: the target path is left"
    );
    std::fs::remove_file(&volume.backing).unwrap();
}

/// Takes the (empty) pools away, as SNAP would have them before any packed
/// volume.
async fn remove_pools(stack: &Stack) {
    let snap = stack.emulator.client();
    for pool in snap.call(&NvmeSubsystemList {}).await.unwrap() {
        if pool_index(&pool.nqn).is_none() {
            continue;
        }
        for controller in &pool.controllers {
            snap.call(&NvmeControllerDestroy {
                ctrl_id: controller.ctrl_id.clone(),
                force: Some(true),
            })
            .await
            .unwrap();
        }
        snap.call(&NvmeSubsystemDestroy { nqn: pool.nqn })
            .await
            .unwrap();
    }
}

/// Whether the mount at `path` is read-only, as the kernel says.
fn read_only_mount(path: &Path) -> bool {
    nix::sys::statvfs::statvfs(path)
        .unwrap()
        .flags()
        .contains(nix::sys::statvfs::FsFlags::ST_RDONLY)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_any_step_converges_on_retry_without_leaks_or_duplicates() {
    let seed = env_number("SNAP_CSI_CRASH_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    });
    let count = env_number("SNAP_CSI_CRASH_TRIALS").unwrap_or(200) as usize;
    // Printed first: the test's output shows it when a trial fails.
    println!("crash trials: {count}, seed {seed} (SNAP_CSI_CRASH_SEED={seed} replays them)");
    let stack = Stack::start().await;
    for (n, trial) in trials(count, &mut Random(seed)).iter().enumerate() {
        run(&stack, n, trial).await;
    }

    let log = std::fs::read_to_string(stack.emulator.root().join("stack.log")).unwrap();
    assert!(log.contains("volume attached"), "the stack logged its work");
    // The stage requests carry a secret, which crosses the link in split mode.
    assert!(!log.contains("not-for-logs"), "a secret reached a log");
    // JSON lines, and the work of a stage is logged inside its RPC's span,
    // which names the volume.
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|line| line["span"]["name"] == "NodeStageVolume"
                && line["span"]["volume_id"]
                    .as_str()
                    .is_some_and(|id| id.starts_with("pvc-"))),
        "no log line inside a NodeStageVolume span naming the volume"
    );
}
