//! What the crash tests share (`node_crash.rs`: the node killed at its own
//! crash points; `node_kill.rs`: the node or its DPU agent killed at a
//! random instant inside a step): a stack whose node, and in a split-mode
//! run (`common::dpu`) its DPU agent, run as processes a test kills and
//! starts again, beside the SNAP emulator and a test plugin in-process; a
//! volume whose calls kubelet makes by its rules (`common::kubelet`); and a
//! census of everything a volume's life makes.
//!
//! With `SNAP_CSI_TEST_DPUS=2` the host has two DPUs (`common::dpus`): a
//! second SNAP and plugin, in split mode a second agent process, the node
//! given both in a config file's `dpus`. A volume goes where the node's
//! placement puts it (its [`Volume::dpu`]; a filesystem device pinned to the
//! first), the agent a test kills is that DPU's (the other runs untouched),
//! and the census counts what both DPUs hold, all of it on one DPU.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use snap_csi::dpu::names::pool_index;
use snap_csi::node::records::Records;
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
use super::dpus::{Reach, SecondDpu};
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
/// How long the census waits for the node to clear what a stage left on a
/// DPU it passed over (`settled_census`): its retries come 1, 2, 4, ... s apart.
const CLEARING: Duration = Duration::from_secs(60);
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
    /// The host's second DPU on a two-DPU stack; declared before the
    /// first's emulator, in whose directory its files live.
    pub second: Option<SecondDpu>,
    pub emulator: Emulator,
    _plugin: super::plugin::TestPlugin,
    plugin_socket: PathBuf,
    pub kubelet: PathBuf,
    state: PathBuf,
    endpoint: PathBuf,
    /// In a split-mode run: each DPU's agent flags (the first DPU's first)
    /// and the node's flags to reach them.
    link: Option<(Vec<Vec<String>>, Vec<String>)>,
    /// On a two-DPU stack: the node's config file listing both DPUs.
    node_config: Option<PathBuf>,
    /// How many published volumes each DPU held ([`Stack::note_placement`]).
    placed: std::sync::Mutex<[usize; 2]>,
}

/// The running processes of a [`Stack`].
pub struct Processes {
    pub node: Option<Child>,
    /// The agent of the DPU the volume is on.
    pub agent: Option<Child>,
    /// The other DPU's agent on a two-DPU stack in split mode: never killed.
    bystanders: Vec<Child>,
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

    /// Stops them gracefully, the node before its agents.
    pub async fn stop(self) {
        let agents = self.agent.into_iter().chain(self.bystanders);
        for child in self.node.into_iter().chain(agents) {
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
        let second = match super::dpus::two() {
            true => Some(SecondDpu::start(&emulator).await),
            false => None,
        };
        let kubelet = root.join("kubelet");
        std::fs::create_dir_all(&kubelet).unwrap();
        // Each DPU's plugin and SNAP, the first's first.
        let mut dpus = vec![(plugin.socket.clone(), emulator.socket.display().to_string())];
        if let Some(second) = &second {
            dpus.push((second.plugin_socket.clone(), second.snap_template()));
        }
        let link = super::dpu::split().then(|| {
            let pki = Pki::new(&root.join("pki"), "ca");
            let node = pki.issue(Role::Node, HOST_NAME);
            let agents: Vec<(String, Vec<String>)> = dpus
                .iter()
                .zip(super::dpus::NAMES)
                .map(|((plugin_socket, snap_template), name)| {
                    let tls = match name == DPU_NAME {
                        true => pki.issue(Role::Agent, DPU_NAME),
                        false => SecondDpu::agent_tls(&pki),
                    };
                    let listen = format!("https://{}", super::shared::free_local_address());
                    let args = vec![
                        format!("--listen={listen}"),
                        format!("--host-name={HOST_NAME}"),
                        format!("--tls-cert={}", tls.cert.display()),
                        format!("--tls-key={}", tls.key.display()),
                        format!("--tls-ca={}", tls.ca.display()),
                        format!("--plugin-socket={}", plugin_socket.display()),
                        format!("--snap-socket-template={snap_template}"),
                    ];
                    (listen, args)
                })
                .collect();
            let mut node_args = vec![
                format!("--dpu-tls-cert={}", node.cert.display()),
                format!("--dpu-tls-key={}", node.key.display()),
                format!("--dpu-tls-ca={}", node.ca.display()),
            ];
            if second.is_none() {
                node_args.push(format!("--dpu-endpoint={}", agents[0].0));
                node_args.push(format!("--dpu-name={DPU_NAME}"));
            }
            let (listens, agent_args): (Vec<String>, Vec<Vec<String>>) = agents.into_iter().unzip();
            (listens, agent_args, node_args)
        });
        let node_config = second.as_ref().map(|_| {
            let reach = |i: usize| match &link {
                Some((listens, _, _)) => Reach::Agent(listens[i].clone()),
                None => Reach::Sockets(dpus[i].0.clone(), dpus[i].1.clone()),
            };
            let file = root.join("node.toml");
            super::dpus::write_config(&super::dpus::settings([reach(0), reach(1)]), &file);
            file
        });
        Stack {
            plugin_socket: plugin.socket.clone(),
            _plugin: plugin,
            kubelet,
            state: root.join("node-state"),
            endpoint: root.join("csi.sock"),
            second,
            emulator,
            link: link.map(|(_, agents, node)| (agents, node)),
            node_config,
            placed: Default::default(),
        }
    }

    /// Whether this is a split-mode run (the DPU steps in an agent process).
    pub fn split(&self) -> bool {
        self.link.is_some()
    }

    /// The SNAP emulators of the host's DPUs, the first's first.
    pub fn emulators(&self) -> Vec<&Emulator> {
        std::iter::once(&self.emulator)
            .chain(self.second.as_ref().map(|s| &s.snap))
            .collect()
    }

    /// Starts the stack's processes for volumes of `shape` (the node's
    /// default emulation and placement) on DPU `dpu` (its index: the
    /// agent a test kills is that DPU's); `crash_after` arms a crash point
    /// in `crasher`.
    pub async fn processes(
        &self,
        crash_after: Option<(Process, &str)>,
        shape: &Shape,
        dpu: usize,
    ) -> Processes {
        let armed = |which| {
            crash_after
                .filter(|(p, _)| *p == which)
                .map(|(_, point)| point)
        };
        // The agents first, listening before the node starts: a node that
        // found one not yet there would place the volume on another DPU.
        let agent = self
            .split()
            .then(|| self.spawn(Process::Agent, armed(Process::Agent), shape, dpu));
        let bystanders: Vec<Child> = match &self.link {
            Some((agents, _)) => (0..agents.len())
                .filter(|i| *i != dpu)
                .map(|i| self.spawn(Process::Agent, None, shape, i))
                .collect(),
            None => Vec::new(),
        };
        if let Some((agents, _)) = &self.link {
            for args in agents {
                wait_listening(args).await;
            }
        }
        let node = Some(self.spawn(Process::Node, armed(Process::Node), shape, dpu));
        Processes {
            node,
            agent,
            bystanders,
        }
    }

    /// Starts `which` (the agent: DPU `dpu`'s), with `crash_after` armed.
    pub fn spawn(
        &self,
        which: Process,
        crash_after: Option<&str>,
        shape: &Shape,
        dpu: usize,
    ) -> Child {
        match which {
            Process::Agent => {
                let (agents, _) = self.link.as_ref().expect("an agent in split mode only");
                let mut agent = self.command("dpu-agent", crash_after);
                agent.args(&agents[dpu]).spawn().unwrap()
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
                if let Some(file) = &self.node_config {
                    node.arg("--config").arg(file);
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
    /// devices and functions (each summed over the DPUs), how many DPUs hold
    /// any of these, loop devices over `backing`, mounts under kubelet's
    /// directory, and the node's records. A pool itself is not counted (it
    /// stays, empty, warm for the next packed volume), but each must have
    /// exactly one controller.
    pub async fn census(&self, backing: &Path) -> Census {
        let mut census = Census {
            loop_devices: loop_devices_of(backing).len(),
            mounts: mounts_under(&self.kubelet).len(),
            records: std::fs::read_dir(self.state.join("volumes"))
                .map(|d| d.count())
                .unwrap_or(0),
            ..Census::nothing()
        };
        for emulator in self.emulators() {
            let held = snap_census(emulator).await;
            census.dpus += usize::from(held != Census::nothing());
            census.bdevs += held.bdevs;
            census.fsdevs += held.fsdevs;
            census.subsystems += held.subsystems;
            census.pooled_namespaces += held.pooled_namespaces;
            census.controllers += held.controllers;
            census.fs_devices += held.fs_devices;
            census.fs_functions += held.fs_functions;
        }
        census
    }

    /// The census once it is `expected`, or as it is when it does not come
    /// to that. On one DPU it is taken at once. On two, the node takes what a
    /// stage left on a DPU it passed over (one found down, or late) in the
    /// background after the stage answered, so the census waits for that,
    /// up to a bound far above the node's first retries.
    pub async fn settled_census(&self, backing: &Path, expected: &Census) -> Census {
        let started = tokio::time::Instant::now();
        loop {
            let census = self.census(backing).await;
            if census == *expected || self.second.is_none() || started.elapsed() > CLEARING {
                if started.elapsed() > Duration::from_millis(500) {
                    println!("the census took {:?} to settle", started.elapsed());
                }
                return census;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Counts the DPU the record of the (published) `volume` names.
    pub fn note_placement(&self, volume: &Volume) {
        let record = Records::open(self.state.join("volumes"))
            .unwrap()
            .load(&volume.id)
            .unwrap()
            .unwrap_or_else(|| panic!("{}: published without a record", volume.id));
        // One DPU: whatever its name (co-located, the node id by default).
        let dpu = match (&self.second, record.dpu) {
            (Some(_), Some(name)) => super::dpus::index(&name),
            _ => 0,
        };
        self.placed.lock().unwrap()[dpu] += 1;
    }

    /// On a two-DPU stack: says how many published volumes each DPU held,
    /// and fails unless both held some (a run that never used the second
    /// tested one DPU).
    pub fn check_placements(&self) {
        if self.second.is_none() {
            return;
        }
        let placed = *self.placed.lock().unwrap();
        println!(
            "published volumes per DPU ({:?}): {placed:?}",
            super::dpus::NAMES
        );
        assert!(placed.iter().all(|n| *n > 0), "a DPU held none: {placed:?}");
    }

    /// Destroys the virtio-fs functions no device holds (a crash in an
    /// earlier unstage may leave one spare), so the next attach creates and
    /// binds its own.
    pub async fn remove_spare_functions(&self) {
        for emulator in self.emulators() {
            let snap = emulator.client();
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
    }

    /// Takes the (empty) pools away, as SNAP would have them before any
    /// packed volume.
    pub async fn remove_pools(&self) {
        for emulator in self.emulators() {
            let snap = emulator.client();
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
}

/// What one DPU's SNAP holds (the census's SNAP part; the rest zero).
async fn snap_census(emulator: &Emulator) -> Census {
    let snap = emulator.client();
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
        ..Census::nothing()
    }
}

/// Waits until the agent started with `args` accepts connections on its
/// `--listen` address.
async fn wait_listening(args: &[String]) {
    let address = args
        .iter()
        .find_map(|a| a.strip_prefix("--listen=https://"))
        .expect("an agent listens on https://");
    let patience = tokio::time::Instant::now() + HANG_GUARD;
    while tokio::net::TcpStream::connect(address).await.is_err() {
        assert!(
            tokio::time::Instant::now() < patience,
            "the agent does not listen on {address}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[derive(Debug, PartialEq)]
pub struct Census {
    /// DPUs that hold any of the SNAP objects below.
    pub dpus: usize,
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
            dpus: 1,
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
            dpus: 0,
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
    /// The DPU the node puts it on (its index; 0 on a one-DPU stack).
    pub dpu: usize,
    /// What its volume context has beside the backing file.
    context: HashMap<String, String>,
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
        // Only the first emulator's host mounts virtio-fs (`common::dpus`).
        let (dpu, context) = match (&stack.second, kind) {
            (None, _) => (0, HashMap::new()),
            (Some(_), Kind::Fs) => (0, super::dpus::pinned_first()),
            (Some(_), _) => (
                super::dpus::index(super::dpus::first_choice(&id)),
                HashMap::new(),
            ),
        };
        Volume {
            id,
            backing,
            staging,
            target: pod.join("volume"),
            dpu,
            context,
            capability,
            read_only,
        }
    }

    /// The staging path kubelet checks for other mounts before it unstages
    /// (a filesystem volume's; a block volume has none).
    pub fn device_mount_path(&self) -> Option<&Path> {
        let mounted = matches!(
            self.capability.access_type,
            Some(csi::volume_capability::AccessType::Mount(_))
        );
        mounted.then_some(self.staging.as_path())
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
            Call::Stage => {
                let mut request =
                    stage_request(id, staging, self.capability.clone(), &self.backing);
                request.volume_context.extend(self.context.clone());
                node.node_stage_volume(timed(request, timeout))
                    .await
                    .map(drop)
            }
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
        kubelet::settle(seen, self.device_mount_path(), &BACKOFF, |call| {
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

/// A line that SIGKILL tore: the kernel ends a write to a file early at a page
/// boundary when the writer gets a fatal signal, so a killed process can leave
/// the start of a JSON line, which the next process's line then follows. The
/// fragment is dropped and the whole line after it kept; anything else is not
/// a tear.
fn untorn(line: &str) -> Option<serde_json::Value> {
    const START: &str = "{\"timestamp\"";
    let at = line
        .rfind(START)
        .filter(|&at| at > 0 && line.starts_with(START))?;
    serde_json::from_str(&line[at..]).ok()
}

/// What the stack logged: JSON lines, no secret, and the work of a stage
/// inside its RPC's span naming the volume.
pub fn check_log(stack: &Stack) {
    // Lossy: a tear may split a character.
    let log = String::from_utf8_lossy(&std::fs::read(stack.log_path()).unwrap()).into_owned();
    assert!(log.contains("volume attached"), "the stack logged its work");
    // The stage requests carry a secret, which crosses the link in split mode.
    assert!(!log.contains("not-for-logs"), "a secret reached a log");
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l)
                .or_else(|e| untorn(l).ok_or(e))
                .unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))
        })
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
