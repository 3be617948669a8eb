//! A whole node stack for a test: the SNAP emulator, the test vendor plugin
//! and the node service, each on its own socket, talking real gRPC and
//! JSON-RPC; plus a CSI client playing kubelet. In a split-mode run
//! (`common::dpu`) the node reaches the plugin and SNAP through a DPU agent.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use snap_csi::dpu::DpuAttach;
use snap_csi::dpu::names::pool_index;
use snap_csi::node::NodeConfig;
use snap_csi::node::config::{EmulationSetting, PlacementSetting};
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::node_client::NodeClient;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use snap_csi::proto::csi::v1::volume_capability::{
    AccessMode, AccessType, BlockVolume, MountVolume,
};
use snap_csi::spdk::bdev::{BdevAioRescan, BdevGetBdevs};
use snap_csi::spdk::snap::{NvmeSubsystemList, VirtioBlkControllerList};
use tokio::sync::oneshot;
use tonic::transport::Channel;

use super::dpu::{Agent, DPU_NAME, HOST_NAME};
use super::dpus::{Reach, SecondDpu};
use super::plugin::TestPlugin;
use super::shared::free_local_address;
use super::{Emulator, loop_devices_of};

pub struct NodeStack {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<anyhow::Result<()>>>,
    pub config: NodeConfig,
    pub kubelet: PathBuf,
    pub client: NodeClient<Channel>,
    /// The DPU agent the node reaches, in a split-mode run.
    pub agent: Option<Agent>,
    pub plugin: Option<TestPlugin>,
    /// The host's second DPU, with [`Tweaks::second_dpu`]; the node then
    /// lists both in its `dpus` (`common::dpus`).
    pub second: Option<SecondDpu>,
    pub emulator: Emulator,
}

/// What a test changes in its node stack.
#[derive(Default)]
pub struct Tweaks {
    /// The node's `device_wait` (10 s otherwise).
    pub device_wait: Option<Duration>,
    /// Wraps the node's DPU attach layer (the co-located one, or the link to
    /// the agent in split mode); the node is then served with it.
    pub wrap_dpu: Option<WrapDpu>,
    /// The node's default placement (dedicated otherwise).
    pub placement: Option<PlacementSetting>,
    /// Namespaces per pool controller (32 otherwise).
    pub namespaces_per_controller: Option<u32>,
    /// What the test plugin advertises (`plugin::CAPABILITIES` otherwise).
    pub plugin_capabilities: Option<Vec<super::plugin::Capability>>,
    /// A host with two DPUs (`common::dpus`): a second SNAP, plugin and in
    /// split mode agent, both DPUs in the node's `dpus`.
    pub second_dpu: bool,
}

pub type WrapDpu = Box<dyn FnMut(Arc<dyn DpuAttach>) -> Arc<dyn DpuAttach> + Send>;

impl NodeStack {
    pub async fn start(emulation: EmulationSetting) -> NodeStack {
        NodeStack::start_with(emulation, Tweaks::default()).await
    }

    pub async fn start_with(emulation: EmulationSetting, tweaks: Tweaks) -> NodeStack {
        let emulator = Emulator::start().await;
        let root = emulator.root().to_path_buf();
        let capabilities = tweaks
            .plugin_capabilities
            .unwrap_or(super::plugin::CAPABILITIES.to_vec());
        let plugin = super::plugin::start_with(&emulator.socket, &root, &capabilities).await;
        let kubelet = root.join("kubelet");
        std::fs::create_dir_all(&kubelet).unwrap();
        let snap_template = emulator.socket.display().to_string();
        let mut second = match tweaks.second_dpu {
            true => Some(SecondDpu::start(&emulator).await),
            false => None,
        };
        let agent = match (super::dpu::split(), &mut second) {
            (false, _) => None,
            (true, None) => Some(Agent::start(&plugin.socket, &snap_template, &root).await),
            (true, Some(second)) => {
                let first = (plugin.socket.as_path(), snap_template.as_str());
                let (agent, second_agent) = super::dpus::agents(first, second, &root).await;
                second.agent = Some(second_agent);
                Some(agent)
            }
        };
        let dpus = match &second {
            None => Vec::new(),
            Some(second) => super::dpus::settings(match (&agent, &second.agent) {
                (Some(first), Some(second)) => [
                    Reach::Agent(first.address.to_string()),
                    Reach::Agent(second.address.to_string()),
                ],
                _ => [
                    Reach::Sockets(plugin.socket.clone(), snap_template.clone()),
                    Reach::Sockets(second.plugin_socket.clone(), second.snap_template()),
                ],
            }),
        };
        let config = NodeConfig {
            endpoint: root.join("csi.sock"),
            driver_name: "csi.snap-csi.io".into(),
            node_id: HOST_NAME.into(),
            kubelet_dir: kubelet.clone(),
            state_dir: root.join("node-state"),
            sysfs_root: emulator.sysfs_root.clone(),
            plugin_socket: plugin.socket.clone(),
            snap_socket_template: snap_template,
            emulation,
            placement: tweaks.placement.unwrap_or(PlacementSetting::Dedicated),
            namespaces_per_controller: tweaks.namespaces_per_controller.unwrap_or(32),
            max_volumes_per_node: None,
            // With `dpus`, each entry names its DPU and reach.
            dpu_name: match dpus.is_empty() {
                true => DPU_NAME.into(),
                false => String::new(),
            },
            dpu_endpoint: agent
                .as_ref()
                .filter(|_| dpus.is_empty())
                .map(|a| a.address.to_string()),
            dpu_insecure_plaintext: false,
            dpus,
            dpu_tls: agent
                .as_ref()
                .map_or_else(Default::default, |a| a.node_tls.clone()),
            device_wait: tweaks.device_wait.unwrap_or(Duration::from_secs(10)),
            call_timeout: Duration::from_secs(60),
            metrics_address: Some(free_local_address()),
            unstage_orphans: false,
            virtiofs_emulated_dir: Some(emulator.virtiofs_dir.clone()),
        };
        let (stop, thread) = spawn_node(config.clone(), tweaks.wrap_dpu);
        let client = NodeClient::new(connect(&config.endpoint).await);
        NodeStack {
            stop: Some(stop),
            thread: Some(thread),
            config,
            kubelet,
            client,
            agent,
            plugin: Some(plugin),
            second,
            emulator,
        }
    }

    /// Stops the node service gracefully and starts it again with the same
    /// configuration changed by `change` (on a fresh metrics port, as a
    /// restarted pod may not get its old one), as kubelet's DaemonSet would.
    pub async fn restart_node(&mut self, change: impl FnOnce(&mut NodeConfig)) {
        self.stop_node();
        change(&mut self.config);
        self.config.metrics_address = Some(free_local_address());
        let (stop, thread) = spawn_node(self.config.clone(), None);
        (self.stop, self.thread) = (Some(stop), Some(thread));
        self.client = NodeClient::new(connect(&self.config.endpoint).await);
    }

    /// A host reboot as the node sees it: the node stops, every mount under
    /// the kubelet directory is gone, the records and SNAP's state remain,
    /// and the host finds the disks again under new names, with the
    /// read-only flag a new device starts with (off). The emulator's loop
    /// devices stay: what a reboot changes is how the host names its disks
    /// and their flags, while their identity and data are SNAP's. Then the
    /// node starts.
    pub async fn reboot_host(&mut self) {
        self.stop_node();
        unmount_all_under(&self.kubelet);
        let sysfs = snap_csi::host::Sysfs::new(&self.emulator.sysfs_root);
        for disk in host_disks(&self.emulator.sysfs_root) {
            let node = sysfs.device_node(disk.major, disk.minor).unwrap();
            let status = std::process::Command::new("blockdev")
                .arg("--setrw")
                .arg(&node)
                .status()
                .unwrap();
            assert!(status.success(), "blockdev --setrw {}", node.display());
        }
        self.emulator.rename_host_disks().await;
        self.restart_node(|_| {}).await;
    }

    fn stop_node(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            match thread.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("node service: {e:#}"),
                Err(_) => eprintln!("node service thread panicked"),
            }
        }
    }

    /// Nothing of the volume on `backing` is left on the DPU side or the
    /// host, and no volume has a record: the census after an unstage.
    /// With two DPUs, nothing on either.
    pub async fn assert_nothing_left(&self, backing: &Path) {
        assert!(loop_devices_of(backing).is_empty(), "a loop device is left");
        let left = super::shared::loop_devices_under(self.emulator.root());
        assert!(left.is_empty(), "a loop device is left: {left:?}");
        assert!(mounts_under(&self.kubelet).is_empty(), "a mount is left");
        for emulator in self.emulators() {
            assert_snap_holds_nothing(emulator).await;
        }
        assert_eq!(self.records(), 0, "a volume record is left");
    }

    /// The SNAP emulators of the host's DPUs, the first's first.
    pub fn emulators(&self) -> Vec<&Emulator> {
        std::iter::once(&self.emulator)
            .chain(self.second.as_ref().map(|s| &s.snap))
            .collect()
    }

    /// SNAP's NVMe subsystems (pools included).
    pub async fn subsystems(&self) -> Vec<snap_csi::spdk::snap::NvmeSubsystem> {
        let snap = self.emulator.client();
        snap.call(&NvmeSubsystemList {}).await.unwrap()
    }

    /// How many volume records the node holds.
    pub fn records(&self) -> usize {
        std::fs::read_dir(self.config.state_dir.join("volumes"))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// Stops the vendor plugin (as if its pod died); the rest keeps running.
    pub async fn stop_plugin(&mut self) {
        if let Some(plugin) = self.plugin.take() {
            plugin.stop().await;
        }
    }

    /// Starts the vendor plugin again on its socket (after [`Self::stop_plugin`]).
    pub async fn restart_plugin(&mut self) {
        assert!(self.plugin.is_none(), "the plugin is still running");
        self.plugin = Some(super::plugin::start(&self.emulator.socket, self.emulator.root()).await);
    }

    /// A path under the kubelet directory whose parent exists, as kubelet
    /// guarantees for staging and target paths.
    pub fn path(&self, name: &str) -> PathBuf {
        let path = self.kubelet.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        path
    }

    /// A backing file for a volume, for the test plugin's `path` context key.
    pub fn backing_file(&self, name: &str, size: u64) -> PathBuf {
        let path = self.emulator.root().join(name);
        super::sparse_file(&path, size);
        path
    }
}

impl Drop for NodeStack {
    fn drop(&mut self) {
        // A failed test may leave mounts, which would keep loop devices busy
        // after the emulator stops: take them down first.
        unmount_all_under(&self.kubelet);
        self.stop_node();
    }
}

/// The node service on a thread and runtime of its own, until the sender is
/// used or dropped.
fn spawn_node(
    config: NodeConfig,
    wrap: Option<WrapDpu>,
) -> (oneshot::Sender<()>, JoinHandle<anyhow::Result<()>>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let stopped = async move {
            let _ = stopped.await;
        };
        runtime.block_on(async move {
            // Made on the node's runtime, which its connections need.
            let fleet = snap_csi::node::Fleet::from_config(&config)?;
            let fleet = match wrap {
                Some(wrap) => fleet.wrapped(wrap),
                None => fleet,
            };
            snap_csi::node::serve(config, fleet, stopped).await
        })
    });
    (stop, thread)
}

/// SNAP holds no bdev, no NVMe subsystem but empty pools, no virtio-blk
/// controller.
pub async fn assert_snap_holds_nothing(emulator: &Emulator) {
    let snap = emulator.client();
    let bdevs = snap.call(&BdevGetBdevs::default()).await.unwrap();
    assert!(bdevs.is_empty(), "a bdev is left: {bdevs:?}");
    // Pools of packed volumes stay, empty, with their controllers.
    let subsystems = snap.call(&NvmeSubsystemList {}).await.unwrap();
    assert!(
        subsystems
            .iter()
            .all(|s| pool_index(&s.nqn).is_some() && s.namespaces.is_empty()),
        "an NVMe subsystem or namespace is left: {subsystems:?}"
    );
    let controllers = snap.call(&VirtioBlkControllerList {}).await.unwrap();
    assert!(
        controllers.is_empty(),
        "a virtio-blk controller is left: {controllers:?}"
    );
}

/// Detaches every mount under `root`, deepest first.
pub fn unmount_all_under(root: &Path) {
    let mut mounts = mounts_under(root);
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for mount_point in mounts {
        let _ = nix::mount::umount2(mount_point.as_str(), nix::mount::MntFlags::MNT_DETACH);
    }
}

/// A channel to a gRPC server on a UNIX socket, waiting for it to listen.
pub async fn connect(socket: &Path) -> Channel {
    for _ in 0..500 {
        if socket.exists()
            && let Ok(channel) =
                tonic::transport::Endpoint::try_from(format!("unix://{}", socket.display()))
                    .unwrap()
                    .connect()
                    .await
        {
            return channel;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("nothing listens on {}", socket.display());
}

pub fn mount_capability(fs_type: &str, mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.into(),
            mount_flags: vec!["noatime".into()],
            volume_mount_group: String::new(),
        })),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

pub fn block_capability(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

pub fn stage_request(
    volume_id: &str,
    staging: &Path,
    capability: csi::VolumeCapability,
    backing: &Path,
) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: volume_id.into(),
        publish_context: HashMap::new(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(capability),
        secrets: [("token".to_string(), "not-for-logs".to_string())].into(),
        volume_context: [("path".to_string(), backing.display().to_string())].into(),
    }
}

pub fn publish_request(
    volume_id: &str,
    staging: &Path,
    target: &Path,
    capability: csi::VolumeCapability,
    readonly: bool,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: volume_id.into(),
        publish_context: HashMap::new(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(capability),
        readonly,
        secrets: HashMap::new(),
        volume_context: HashMap::new(),
    }
}

/// Mount points under `root` in this process's mount table.
pub fn mounts_under(root: &Path) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let root = root.display().to_string();
    table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|mount_point| mount_point.starts_with(&root))
        .map(str::to_string)
        .collect()
}

/// A repeated stage created nothing twice: one bdev, one SNAP exposure, one
/// loop device, and a mount at the staging path only for filesystems.
pub async fn assert_attached_once(stack: &NodeStack, backing: &Path, staging: &Path, block: bool) {
    assert_exposed_once(stack).await;
    assert_eq!(loop_devices_of(backing).len(), 1);
    assert_eq!(mounts_under(staging).len(), usize::from(!block));
}

/// SNAP holds one bdev and exposes it once (one NVMe or virtio-blk controller).
pub async fn assert_exposed_once(stack: &NodeStack) {
    let snap = stack.emulator.client();
    assert_eq!(snap.call(&BdevGetBdevs::default()).await.unwrap().len(), 1);
    let subsystems = snap.call(&NvmeSubsystemList {}).await.unwrap();
    let controllers = snap.call(&VirtioBlkControllerList {}).await.unwrap();
    let nvme_controllers: usize = subsystems.iter().map(|s| s.controllers.len()).sum();
    assert_eq!(
        nvme_controllers + controllers.len(),
        1,
        "{subsystems:?} {controllers:?}"
    );
}

/// NodeStageVolume, then NodePublishVolume at `target`; both must succeed.
pub async fn stage_and_publish(
    node: &mut NodeClient<Channel>,
    volume_id: &str,
    (staging, target): (&Path, &Path),
    capability: csi::VolumeCapability,
    backing: &Path,
    readonly: bool,
) {
    node.node_stage_volume(stage_request(
        volume_id,
        staging,
        capability.clone(),
        backing,
    ))
    .await
    .unwrap_or_else(|e| panic!("stage {volume_id} at {}: {e}", staging.display()));
    node.node_publish_volume(publish_request(
        volume_id, staging, target, capability, readonly,
    ))
    .await
    .unwrap_or_else(|e| panic!("publish {volume_id} at {}: {e}", target.display()));
}

/// NodeExpandVolume of a published volume to `required` bytes.
pub fn expand_request(
    volume_id: &str,
    target: &Path,
    staging: &Path,
    required: u64,
) -> csi::NodeExpandVolumeRequest {
    csi::NodeExpandVolumeRequest {
        volume_id: volume_id.into(),
        volume_path: target.display().to_string(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: required as i64,
            limit_bytes: 0,
        }),
        staging_target_path: staging.display().to_string(),
        volume_capability: None,
        secrets: Default::default(),
    }
}

/// What the vendor side does when the controller grows an AIO volume: the
/// backing file grows and SPDK rescans the bdev over it, which SNAP passes
/// on to the host (unless a crypto vbdev stands in between).
pub async fn grow_on_the_dpu(emulator: &Emulator, backing: &Path, size: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(backing)
        .unwrap()
        .set_len(size)
        .unwrap();
    let snap = emulator.client();
    let bdev = snap
        .call(&BdevGetBdevs::default())
        .await
        .unwrap()
        .into_iter()
        .find(|b| {
            b.driver_specific
                .aio
                .as_ref()
                .is_some_and(|aio| Path::new(&aio.filename) == backing)
        })
        .unwrap_or_else(|| panic!("no AIO bdev over {}", backing.display()))
        .name;
    snap.call(&BdevAioRescan { name: bdev }).await.unwrap();
}

/// NodeUnpublishVolume, which must succeed.
pub async fn unpublish(node: &mut NodeClient<Channel>, volume_id: &str, target: &Path) {
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: target.display().to_string(),
    })
    .await
    .unwrap_or_else(|e| panic!("unpublish {volume_id} from {}: {e}", target.display()));
}

/// NodeUnstageVolume, which must succeed.
pub async fn unstage(node: &mut NodeClient<Channel>, volume_id: &str, staging: &Path) {
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.display().to_string(),
    })
    .await
    .unwrap_or_else(|e| panic!("unstage {volume_id} from {}: {e}", staging.display()));
}

/// The node's `/metrics` page.
pub async fn scrape(address: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: node\r\n\r\n")
        .await
        .unwrap();
    let mut page = String::new();
    stream.read_to_string(&mut page).await.unwrap();
    page
}

/// Writes `data` into a published volume: a file for filesystems, the device
/// for block volumes (at an offset past anything mkfs would touch).
pub fn write_volume(target: &Path, data: &[u8]) {
    use std::io::{Seek, SeekFrom, Write};
    if target.is_dir() {
        std::fs::write(target.join("data.bin"), data).unwrap();
        let dir = std::fs::File::open(target).unwrap();
        dir.sync_all().unwrap();
    } else {
        let mut device = std::fs::OpenOptions::new()
            .write(true)
            .open(target)
            .unwrap();
        device.seek(SeekFrom::Start(1 << 20)).unwrap();
        device.write_all(data).unwrap();
        device.sync_all().unwrap();
    }
}

/// Reads back what [`write_volume`] wrote.
pub fn read_volume(target: &Path, len: usize) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    if target.is_dir() {
        std::fs::read(target.join("data.bin")).unwrap()
    } else {
        let mut device = std::fs::File::open(target).unwrap();
        device.seek(SeekFrom::Start(1 << 20)).unwrap();
        let mut data = vec![0; len];
        device.read_exact(&mut data).unwrap();
        data
    }
}

/// A disk in the emulator's tree: its kernel name and device number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostDisk {
    pub name: String,
    pub major: u32,
    pub minor: u32,
}

/// Every disk in the emulator's tree at `sysfs_root`: a directory with a
/// `dev` file, below a PCI function or a multipath head under `block`.
pub fn host_disks(sysfs_root: &Path) -> Vec<HostDisk> {
    fn walk(dir: &Path, found: &mut Vec<HostDisk>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            // Not what the emulator is still building (`.snap-emu-tmp-*`).
            let building = entry.file_name().to_string_lossy().starts_with('.');
            if building || !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if let Ok(dev) = std::fs::read_to_string(path.join("dev")) {
                let (major, minor) = dev.trim().split_once(':').unwrap();
                found.push(HostDisk {
                    name: entry.file_name().to_string_lossy().into_owned(),
                    major: major.parse().unwrap(),
                    minor: minor.parse().unwrap(),
                });
            }
            walk(&path, found);
        }
    }
    let mut found = Vec::new();
    walk(sysfs_root, &mut found);
    found
}
