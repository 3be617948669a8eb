//! What the crash tests share (`node_crash.rs`: the node killed at its own
//! crash points; `node_kill.rs`: the node or its DPU agent killed at a
//! random instant inside a step): a stack whose node, and in a split-mode
//! run (`common::dpu`) its DPU agent, run as processes a test kills and
//! starts again, beside the SNAP emulator and a test plugin in-process; a
//! volume whose calls kubelet makes by its rules (`common::kubelet`); and a
//! census of everything a volume's life makes.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use snap_csi::dpu::names::pool_index;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::node_client::NodeClient;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use snap_csi::spdk::bdev::BdevGetBdevs;
use snap_csi::spdk::fsdev::FrameworkGetConfig;
use snap_csi::spdk::snap::{
    NvmeControllerDestroy, NvmeSubsystemDestroy, NvmeSubsystemList, VirtioBlkControllerList,
    VirtioFsDocaFunctionDestroy, VirtioFsDocaGetFunctions, VirtioFsGetDevices,
};
use tokio::process::{Child, Command};
use tonic::transport::Channel;

use super::dpu::{DPU_NAME, HOST_NAME};
use super::kubelet::{self, Backoff, Call, Failure, Stuck};
use super::node::{
    block_capability, connect, mount_capability, mounts_under, publish_request, stage_request,
};
use super::pki::{Pki, Role};
use super::{Emulator, loop_devices_of, timed};

/// A call gets this long: far more than it needs, a bound against a hang.
pub const CALL: Duration = Duration::from_secs(60);
/// How long a killed process may take to be gone: a bound against a hang.
const HANG_GUARD: Duration = Duration::from_secs(60);
/// kubelet's rules at a test's pace: a short first pause, and a call that
/// still fails after a minute is stuck (kubelet would go on for ever).
pub const BACKOFF: Backoff = Backoff {
    first: Duration::from_millis(50),
    max: Duration::from_secs(1),
    patience: Duration::from_secs(60),
};
/// Sparse, so cheap; big enough for xfs (mkfs.xfs wants at least 300 MB).
const SIZE: u64 = 512 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Block,
    Ext4,
    Xfs,
    /// A filesystem device (virtio-fs) over a directory.
    Fs,
}

/// A volume's emulation, placement and kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    pub emulation: &'static str,
    pub placement: &'static str,
    pub kind: Kind,
}

/// Every shape: both block emulations, both placements of NVMe, each kind
/// of block volume; and a filesystem device.
pub fn shapes() -> Vec<Shape> {
    let mut all = Vec::new();
    for (emulation, placement) in [
        ("nvme", "dedicated"),
        ("nvme", "packed"),
        ("virtio-blk", "dedicated"),
    ] {
        for kind in [Kind::Block, Kind::Ext4, Kind::Xfs] {
            all.push(Shape {
                emulation,
                placement,
                kind,
            });
        }
    }
    all.push(Shape {
        emulation: "virtio-fs",
        placement: "dedicated",
        kind: Kind::Fs,
    });
    all
}

/// The stack's processes: `snap-csi node`, and in split mode `snap-csi
/// dpu-agent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Process {
    Node,
    Agent,
}

impl Process {
    pub fn name(self) -> &'static str {
        match self {
            Process::Node => "node",
            Process::Agent => "agent",
        }
    }
}

pub struct Stack {
    pub emulator: Emulator,
    _plugin: super::plugin::TestPlugin,
    plugin_socket: PathBuf,
    pub kubelet: PathBuf,
    state: PathBuf,
    endpoint: PathBuf,
    /// In a split-mode run: the agent's flags and the node's flags to reach it.
    link: Option<(Vec<String>, Vec<String>)>,
}

/// The running processes of a [`Stack`].
pub struct Processes {
    pub node: Option<Child>,
    pub agent: Option<Child>,
}

impl Processes {
    pub fn get(&mut self, which: Process) -> &mut Child {
        match which {
            Process::Node => self.node.as_mut(),
            Process::Agent => self.agent.as_mut(),
        }
        .unwrap_or_else(|| panic!("no {} is running", which.name()))
    }

    /// The process `which`, no longer held here.
    pub fn take(&mut self, which: Process) -> Child {
        match which {
            Process::Node => self.node.take(),
            Process::Agent => self.agent.take(),
        }
        .unwrap_or_else(|| panic!("no {} is running", which.name()))
    }

    pub fn put(&mut self, which: Process, child: Child) {
        match which {
            Process::Node => self.node = Some(child),
            Process::Agent => self.agent = Some(child),
        }
    }

    /// Stops them gracefully, the node before its agent.
    pub async fn stop(self) {
        for child in [self.node, self.agent].into_iter().flatten() {
            if let Some(pid) = child.id() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            reap(child).await;
        }
    }
}

impl Stack {
    pub async fn start() -> Stack {
        let emulator = Emulator::start().await;
        let root = emulator.root().to_path_buf();
        let plugin = super::plugin::start(&emulator.socket, &root).await;
        let kubelet = root.join("kubelet");
        std::fs::create_dir_all(&kubelet).unwrap();
        let link = super::dpu::split().then(|| {
            let pki = Pki::new(&root.join("pki"), "ca");
            let (agent, node) = (
                pki.issue(Role::Agent, DPU_NAME),
                pki.issue(Role::Node, HOST_NAME),
            );
            let listen = format!("https://{}", super::shared::free_local_address());
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

    /// Whether this is a split-mode run (the DPU steps in an agent process).
    pub fn split(&self) -> bool {
        self.link.is_some()
    }

    /// Starts the stack's processes for volumes of `shape` (the node's
    /// default emulation and placement); `crash_after` arms a crash point
    /// in `crasher`.
    pub fn processes(&self, crash_after: Option<(Process, &str)>, shape: &Shape) -> Processes {
        let armed = |which| {
            crash_after
                .filter(|(p, _)| *p == which)
                .map(|(_, point)| point)
        };
        // The agent first: the node reaches it.
        let agent = self
            .split()
            .then(|| self.spawn(Process::Agent, armed(Process::Agent), shape));
        let node = Some(self.spawn(Process::Node, armed(Process::Node), shape));
        Processes { node, agent }
    }

    /// Starts `which`, with `crash_after` armed.
    pub fn spawn(&self, which: Process, crash_after: Option<&str>, shape: &Shape) -> Child {
        match which {
            Process::Agent => {
                let (agent_args, _) = self.link.as_ref().expect("an agent in split mode only");
                let mut agent = self.command("dpu-agent", crash_after);
                agent.args(agent_args).spawn().unwrap()
            }
            Process::Node => {
                let mut node = self.command("node", crash_after);
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
                    .arg("--virtiofs-emulated-dir")
                    .arg(&self.emulator.virtiofs_dir)
                    .arg("--plugin-socket")
                    .arg(&self.plugin_socket)
                    .arg("--snap-socket-template")
                    .arg(&self.emulator.socket)
                    .arg("--emulation")
                    .arg(shape.emulation)
                    .arg("--placement")
                    .arg(shape.placement);
                if let Some((_, node_args)) = &self.link {
                    node.args(node_args);
                }
                node.spawn().unwrap()
            }
        }
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
            .stdin(Stdio::null())
            .stderr(self.log())
            // A failed test's processes go with it.
            .kill_on_drop(true)
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
            .open(self.log_path())
            .unwrap()
    }

    pub fn log_path(&self) -> PathBuf {
        self.emulator.root().join("stack.log")
    }

    pub async fn client(&self) -> NodeClient<Channel> {
        NodeClient::new(connect(&self.endpoint).await)
    }

    /// What the DPU side and the host hold: bdevs, fsdevs, NVMe subsystems
    /// of volumes, namespaces in pools, virtio-blk controllers, virtio-fs
    /// devices and functions, loop devices over `backing`, mounts under
    /// kubelet's directory, and the node's records. A pool itself is not counted (it stays, empty, warm for the
    /// next packed volume), but each must have exactly one controller.
    pub async fn census(&self, backing: &Path) -> Census {
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
        let fsdev_config = FrameworkGetConfig {
            name: "fsdev".into(),
        };
        let fs_devices = snap.call(&VirtioFsGetDevices {}).await.unwrap().len();
        let fs_functions: usize = snap
            .call(&VirtioFsDocaGetFunctions {})
            .await
            .unwrap()
            .iter()
            .map(|m| m.functions.len())
            .sum();
        // A crash between a device's destruction and its function's leaves
        // the function spare (SNAP does not say which device a function
        // carries, so the retried unstage cannot tell it from another
        // volume's): the next attach takes it (`src/dpu/virtiofs.rs`). So
        // at most one is spare at a time here, where volumes come one after
        // another.
        let spare = fs_functions.saturating_sub(fs_devices);
        assert!(
            spare <= 1,
            "{spare} spare virtio-fs functions: they pile up"
        );
        Census {
            bdevs: snap.call(&BdevGetBdevs::default()).await.unwrap().len(),
            fsdevs: snap
                .call(&fsdev_config)
                .await
                .unwrap()
                .iter()
                .filter(|c| c.fsdev().is_some())
                .count(),
            subsystems: volumes.len(),
            pooled_namespaces: pools.iter().map(|p| p.namespaces.len()).sum(),
            controllers: snap.call(&VirtioBlkControllerList {}).await.unwrap().len(),
            fs_devices,
            fs_functions: fs_functions - spare,
            loop_devices: loop_devices_of(backing).len(),
            mounts: mounts_under(&self.kubelet).len(),
            records: std::fs::read_dir(self.state.join("volumes"))
                .map(|d| d.count())
                .unwrap_or(0),
        }
    }

    /// Destroys the virtio-fs functions no device holds (a crash in an
    /// earlier unstage may leave one spare), so the next attach creates and
    /// binds its own.
    pub async fn remove_spare_functions(&self) {
        let snap = self.emulator.client();
        let devices = snap.call(&VirtioFsGetDevices {}).await.unwrap();
        assert!(devices.is_empty(), "virtio-fs devices left: {devices:?}");
        for manager in snap.call(&VirtioFsDocaGetFunctions {}).await.unwrap() {
            for function in manager.functions {
                snap.call(&VirtioFsDocaFunctionDestroy {
                    manager: manager.manager.clone(),
                    vuid: function.vuid,
                })
                .await
                .unwrap();
            }
        }
    }

    /// Takes the (empty) pools away, as SNAP would have them before any
    /// packed volume.
    pub async fn remove_pools(&self) {
        let snap = self.emulator.client();
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
}

#[derive(Debug, PartialEq)]
pub struct Census {
    pub bdevs: usize,
    pub fsdevs: usize,
    pub subsystems: usize,
    pub pooled_namespaces: usize,
    pub controllers: usize,
    pub fs_devices: usize,
    pub fs_functions: usize,
    pub loop_devices: usize,
    pub mounts: usize,
    pub records: usize,
}

impl Census {
    /// One volume of `shape` staged and published once.
    pub fn published(shape: &Shape) -> Census {
        let packed = shape.placement == "packed";
        let fs = shape.kind == Kind::Fs;
        Census {
            bdevs: usize::from(!fs),
            fsdevs: usize::from(fs),
            subsystems: usize::from(shape.emulation == "nvme" && !packed),
            pooled_namespaces: usize::from(packed),
            controllers: usize::from(shape.emulation == "virtio-blk"),
            fs_devices: usize::from(fs),
            fs_functions: usize::from(fs),
            loop_devices: usize::from(!fs),
            mounts: if shape.kind == Kind::Block { 1 } else { 2 },
            records: 1,
        }
    }

    /// Nothing at all.
    pub fn nothing() -> Census {
        Census {
            bdevs: 0,
            fsdevs: 0,
            subsystems: 0,
            pooled_namespaces: 0,
            controllers: 0,
            fs_devices: 0,
            fs_functions: 0,
            loop_devices: 0,
            mounts: 0,
            records: 0,
        }
    }
}

/// Waits for a process that was told to crash, stopped or killed to be
/// gone: on its exit, with a bound only against a hang. Says how it ended.
pub async fn reap(mut child: Child) -> ExitStatus {
    match tokio::time::timeout(HANG_GUARD, child.wait()).await {
        Ok(status) => status.unwrap(),
        Err(_) => {
            let _ = child.start_kill();
            panic!(
                "process {:?} was still running {HANG_GUARD:?} after it was told to end",
                child.id()
            );
        }
    }
}

/// The files and paths of one trial's volume, as kubelet lays them out.
#[derive(Clone)]
pub struct Volume {
    pub id: String,
    pub backing: PathBuf,
    pub staging: PathBuf,
    pub target: PathBuf,
    capability: csi::VolumeCapability,
    read_only: bool,
}

impl Volume {
    pub fn new(stack: &Stack, n: usize, kind: Kind, read_only: bool) -> Volume {
        let id = format!("pvc-{n}");
        // A filesystem device's backing is the directory its fsdev serves.
        let backing = if kind == Kind::Fs {
            let tree = stack.emulator.root().join(format!("{id}.tree"));
            std::fs::create_dir(&tree).unwrap();
            tree
        } else {
            let image = stack.emulator.root().join(format!("{id}.img"));
            super::sparse_file(&image, SIZE);
            image
        };
        let staging = stack.kubelet.join("plugins/staging").join(&id);
        let pod = stack.kubelet.join("pods").join(&id);
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::create_dir_all(&pod).unwrap();
        let capability = match kind {
            Kind::Block => block_capability(Mode::SingleNodeWriter),
            Kind::Ext4 => mount_capability("ext4", Mode::SingleNodeWriter),
            Kind::Xfs => mount_capability("xfs", Mode::SingleNodeWriter),
            Kind::Fs => mount_capability("virtiofs", Mode::SingleNodeWriter),
        };
        Volume {
            id,
            backing,
            staging,
            target: pod.join("volume"),
            capability,
            read_only,
        }
    }

    /// Makes `call` for this volume, cut off after `timeout`.
    pub async fn call(
        &self,
        node: &mut NodeClient<Channel>,
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

    /// kubelet's calls for this volume until the pod runs with it (`seen.wanted`)
    /// or kubelet is done with it.
    pub async fn settle(
        &self,
        node: &NodeClient<Channel>,
        seen: &mut kubelet::Volume,
    ) -> Result<(), Stuck> {
        kubelet::settle(seen, &BACKOFF, |call| {
            let mut node = node.clone();
            async move {
                self.call(&mut node, call, CALL)
                    .await
                    .map_err(Failure::from)
            }
        })
        .await
    }

    /// The backing file (or directory) goes with the volume.
    pub fn remove(self) {
        if self.backing.is_dir() {
            std::fs::remove_dir_all(&self.backing).unwrap();
        } else {
            std::fs::remove_file(&self.backing).unwrap();
        }
    }
}

/// Whether the mount at `path` is read-only, as the kernel says.
pub fn read_only_mount(path: &Path) -> bool {
    nix::sys::statvfs::statvfs(path)
        .unwrap()
        .flags()
        .contains(nix::sys::statvfs::FsFlags::ST_RDONLY)
}

/// splitmix64: a reproducible order from a printed seed, without a crate.
pub struct Random(pub u64);

impl Random {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// A number from the environment, if set.
pub fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value} is not a number")),
    )
}

/// `SNAP_CSI_CRASH_SEED`, or one from the clock.
pub fn seed() -> u64 {
    env_number("SNAP_CSI_CRASH_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    })
}

/// `requested` trials from rounds of `every` cell, each round shuffled so
/// that every cell comes once per round; fewer than one round is rounded up
/// to one (printed), so that no cell is silently left out.
pub fn rounds<T: Clone>(every: &[T], requested: usize, random: &mut Random, what: &str) -> Vec<T> {
    let count = requested.max(every.len());
    if count > requested {
        println!(
            "{what}: {requested} asked for, rounded up to {count}: one trial for each of the {} cells",
            every.len()
        );
    }
    let mut trials = Vec::with_capacity(count + every.len());
    while trials.len() < count {
        let mut round = every.to_vec();
        random.shuffle(&mut round);
        trials.extend(round);
    }
    trials.truncate(count);
    trials
}

/// What the stack logged: JSON lines, no secret, and the work of a stage
/// inside its RPC's span naming the volume.
pub fn check_log(stack: &Stack) {
    let log = std::fs::read_to_string(stack.log_path()).unwrap();
    assert!(log.contains("volume attached"), "the stack logged its work");
    // The stage requests carry a secret, which crosses the link in split mode.
    assert!(!log.contains("not-for-logs"), "a secret reached a log");
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
