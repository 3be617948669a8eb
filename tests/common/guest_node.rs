//! The node in a guest host (Debian's kernel under QEMU, `guest`), the DPU
//! side on this machine, as on a BlueField host in split mode: the emulator
//! hot-plugs SNAP's functions into the guest (`snap_emu::GuestHostConfig`),
//! the test plugin and the DPU agent serve them, and the node in the guest
//! reaches the agent over the guest's link with mutual TLS.
//!
//! A test plays kubelet from outside: its calls reach the node's CSI socket
//! in the guest through `hack/guest/uds-forward.py` on the link, and what a
//! pod would do to a volume it runs in the guest.

use std::path::{Path, PathBuf};
use std::time::Duration;

use snap_csi::proto::csi::v1::node_client::NodeClient;
use snap_csi::tls::TlsFiles;
use tonic::transport::Channel;

use super::Emulator;
use super::dpu::{Agent, DPU_NAME, HOST_NAME, test_config};
use super::guest::{DATA_DIR, Guest, GuestSpec, Link};
use super::node::{
    block_capability, mount_capability, publish_request, stage_request, unpublish, unstage,
};
use super::plugin::{self, TestPlugin};
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;

pub const SNAP_CSI: &str = env!("CARGO_BIN_EXE_snap-csi");
/// The node's start and its first call to the agent, under TCG on a loaded
/// machine.
pub const STARTED: Duration = Duration::from_secs(120);
/// The node of [`GuestNode`] among the guest's processes (not its
/// forwarder, which names the node's socket too).
const NODE_PATTERN: &str = "snap-csi node --endpoint /run/node/";
/// Where the guest's kubelet keeps its volumes.
pub const KUBELET_DIR: &str = "/var/lib/kubelet";
/// Root ports the emulator's NVMe and virtio-blk PFs take; the rest are
/// for hot-plugged PFs (virtio-fs).
const NVME_PFS: u32 = 2;
const VIRTIO_BLK_PFS: u32 = 3;

/// Starts `snap-csi node` in the guest under `/run/<name>`, reaching the
/// agent at `agent` with `tls`, its metrics on the guest's loopback at
/// `metrics_port`, with `extra` flags; it kills itself right after the step
/// `crash_after` if one is named (`snap_csi::failpoint`).
pub fn start_node(
    guest: &mut Guest,
    name: &str,
    (agent, tls): (&str, &TlsFiles),
    metrics_port: u16,
    (extra, crash_after): (&str, Option<&str>),
) {
    let dir = format!("/run/{name}");
    let state = format!("{DATA_DIR}/{name}");
    let env = crash_after
        .map(|step| format!("{}={step} ", snap_csi::failpoint::ENV))
        .unwrap_or_default();
    guest
        .sh(&format!(
            "mkdir -p {dir} {state} {KUBELET_DIR} && \
             {env}{SNAP_CSI} node --endpoint {dir}/csi.sock --node-id {HOST_NAME} \
             --state-dir {state} --kubelet-dir {KUBELET_DIR} \
             --dpu-endpoint {agent} --dpu-name {DPU_NAME} \
             --dpu-tls-cert {} --dpu-tls-key {} --dpu-tls-ca {} \
             --metrics-address 127.0.0.1:{metrics_port} {extra} >>{dir}/log 2>&1 &",
            tls.cert.display(),
            tls.key.display(),
            tls.ca.display()
        ))
        .unwrap();
}

/// A guest host with the node in it and its DPU side here.
pub struct GuestNode {
    pub client: NodeClient<Channel>,
    pub agent: Agent,
    pub plugin: TestPlugin,
    /// Dropped before the guest: it unplugs what it showed.
    pub emulator: Emulator,
    pub guest: Guest,
    _link: Link,
    /// How the node was started: the agent's address, its TLS, its flags.
    node: (String, TlsFiles, String),
    /// Where the node's CSI socket is forwarded to, and the guest's command
    /// that forwards it.
    csi_address: String,
    forwarder: String,
    /// Under the target directory, which the guest sees over its shared root.
    pub dir: tempfile::TempDir,
}

impl GuestNode {
    /// Boots the guest and starts everything; the node uses `emulation` for
    /// volumes whose context names none.
    pub async fn start(emulation: &str) -> GuestNode {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let link = Link::new().unwrap();
        let mut spec = GuestSpec::new("bf-host");
        spec.link = Some((link.tap.clone(), link.guest));
        let data = dir.path().join("host-data");
        std::fs::create_dir(&data).unwrap();
        spec.data = Some(data);
        let mut guest = tokio::task::block_in_place(|| Guest::boot(&spec)).unwrap();

        let (qmp, ports) = guest.hotplug_monitor(1);
        let functions = snap_emu::FunctionLayout {
            nvme_pfs: NVME_PFS,
            nvme_vfs_per_pf: 0,
            virtio_blk_pfs: VIRTIO_BLK_PFS,
            virtio_blk_vfs_per_pf: 0,
        };
        let config = snap_emu::Config::for_test(dir.path())
            .with_functions(functions)
            .with_guest_host(snap_emu::GuestHostConfig {
                qmp,
                ports,
                virtiofsd: virtiofsd(),
            });
        let emulator = Emulator::start_with(config, dir.path()).await;
        let plugin = plugin::start(&emulator.socket, dir.path()).await;

        let (mut config, node_tls, _) = test_config(dir.path());
        config.listen = format!("https://{}:{}", link.host, super::free_tcp_port());
        config.plugin_socket = plugin.socket.clone();
        config.snap_socket_template = emulator.socket.display().to_string();
        let endpoint = config.listen.clone();
        let agent = Agent::launch(config, node_tls.clone(), None).await;

        let csi_port = super::free_tcp_port();
        let forward = Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/guest/uds-forward.py");
        let forwarder = format!(
            "python3 {} {} {csi_port} /run/node/csi.sock >/run/forward.log 2>&1 &",
            forward.display(),
            link.guest
        );
        let flags = format!("--emulation {emulation}");
        tokio::task::block_in_place(|| {
            start_node(
                &mut guest,
                "node",
                (&endpoint, &node_tls),
                9101,
                (&flags, None),
            );
            guest.sh(&forwarder).unwrap();
        });
        let csi_address = format!("http://{}:{csi_port}", link.guest);
        let client = NodeClient::new(connect(&csi_address).await);
        GuestNode {
            client,
            agent,
            plugin,
            emulator,
            guest,
            _link: link,
            node: (endpoint, node_tls, flags),
            csi_address,
            forwarder,
            dir,
        }
    }

    /// Kills the node in the guest (SIGKILL, if it still runs) and starts
    /// it again with the same state, crashing after `crash_after` if named.
    pub async fn restart_node(&mut self, crash_after: Option<&str>) {
        self.sh(&format!(
            "pkill -KILL -f '{NODE_PATTERN}'; \
             while pgrep -f '{NODE_PATTERN}' >/dev/null; do sleep 0.1; done"
        ))
        .unwrap();
        self.start_node(crash_after).await;
    }

    async fn start_node(&mut self, crash_after: Option<&str>) {
        let (endpoint, tls, flags) = self.node.clone();
        tokio::task::block_in_place(|| {
            start_node(
                &mut self.guest,
                "node",
                (&endpoint, &tls),
                9101,
                (&flags, crash_after),
            );
        });
        self.client = NodeClient::new(connect(&self.csi_address).await);
    }

    /// Reboots the guest (`Guest::reboot`: its mounts and processes gone,
    /// SNAP's functions still plugged, the node's state directory kept) and
    /// starts the node as its DaemonSet would.
    pub async fn reboot(&mut self) {
        tokio::task::block_in_place(|| {
            self.guest.reboot()?;
            self.guest.sh(&self.forwarder).map(drop)
        })
        .unwrap();
        self.start_node(None).await;
    }

    /// Whether the node still runs in the guest.
    pub fn node_runs(&mut self) -> bool {
        self.sh(&format!("pgrep -f '{NODE_PATTERN}' >/dev/null"))
            .is_ok()
    }

    /// No disk, no virtio-fs tag in the guest, no mount under kubelet's
    /// directory, nothing held by SNAP.
    pub async fn assert_nothing_left(&mut self) {
        let left = self
            .sh(&format!(
                "ls /sys/block | grep -E '^(vd|nvme)' || true; ls -A /sys/fs/virtiofs; \
                 findmnt -rno TARGET | grep '^{KUBELET_DIR}/' || true"
            ))
            .unwrap();
        assert_eq!(left.trim(), "", "the guest still has {left}");
        super::node::assert_snap_holds_nothing(&self.emulator).await;
    }

    /// Runs `script` in the guest (blocking this test's worker).
    pub fn sh(&mut self, script: &str) -> anyhow::Result<String> {
        tokio::task::block_in_place(|| self.guest.sh(script))
    }

    /// The node's log in the guest, for a failure's message.
    pub fn node_log(&mut self) -> String {
        self.sh("cat /run/node/log").unwrap_or_default()
    }

    /// Kubelet's paths of a volume in the guest, their parents made.
    pub fn paths(&mut self, volume_id: &str) -> (PathBuf, PathBuf) {
        let staging = PathBuf::from(format!("{KUBELET_DIR}/staging/{volume_id}"));
        let target = PathBuf::from(format!("{KUBELET_DIR}/pods/{volume_id}/volume"));
        self.sh(&format!(
            "mkdir -p {} {}",
            staging.parent().unwrap().display(),
            target.parent().unwrap().display()
        ))
        .unwrap();
        (staging, target)
    }
}

/// The kind of disk the guest's kernel shows a volume as.
#[derive(Debug, Clone, Copy)]
pub enum Disk {
    VirtioBlk,
    Nvme,
}

impl Disk {
    /// How the kernel names such a disk.
    fn prefix(self) -> &'static str {
        match self {
            Disk::VirtioBlk => "vd",
            Disk::Nvme => "nvme",
        }
    }
}

const MIB: u64 = 1 << 20;
/// Large enough for mkfs.xfs (300 MiB at least).
pub const VOLUME: u64 = 512 * MIB;

/// How a test volume is asked for and what a pod checks of it.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Mount(&'static str),
    Block,
}

impl Kind {
    pub fn capability(self) -> snap_csi::proto::csi::v1::VolumeCapability {
        match self {
            Kind::Mount(fs) => mount_capability(fs, Mode::SingleNodeWriter),
            Kind::Block => block_capability(Mode::SingleNodeWriter),
        }
    }
}

/// A volume staged and published in the guest: its bytes on the DPU side
/// and kubelet's paths of it in the guest.
pub struct Published {
    pub backing: PathBuf,
    pub staging: PathBuf,
    pub target: PathBuf,
}

/// Stages and publishes `volume_id` as `kind` (read-only if `readonly`),
/// a new volume of [`VOLUME`] bytes.
pub async fn stage_and_publish(
    host: &mut GuestNode,
    volume_id: &str,
    kind: Kind,
    readonly: bool,
) -> Published {
    let backing = host.dir.path().join(format!("{volume_id}.img"));
    super::sparse_file(&backing, VOLUME);
    let (staging, target) = host.paths(volume_id);
    let volume = Published {
        backing,
        staging,
        target,
    };
    volume
        .stage_and_publish(host, volume_id, kind, readonly)
        .await;
    volume
}

impl Published {
    /// Kubelet's stage and publish of the volume: its first, or again after
    /// a node's restart or a host's reboot.
    pub async fn stage_and_publish(
        &self,
        host: &mut GuestNode,
        volume_id: &str,
        kind: Kind,
        readonly: bool,
    ) {
        let Published {
            backing,
            staging,
            target,
        } = self;
        let capability = kind.capability();
        let staged = host
            .client
            .node_stage_volume(stage_request(
                volume_id,
                staging,
                capability.clone(),
                backing,
            ))
            .await;
        if let Err(e) = staged {
            panic!("stage {volume_id}: {e}\n{}", host.node_log());
        }
        host.client
            .node_publish_volume(publish_request(
                volume_id, staging, target, capability, readonly,
            ))
            .await
            .unwrap_or_else(|e| panic!("publish {volume_id}: {e}"));
    }
}

/// The volume matrix of a kind of disk, each volume staged, published,
/// checked as a pod would on the kernel's `disk`, and taken down in turn:
/// ext4, xfs, raw block, and ext4 published read-only.
pub async fn volume_matrix(host: &mut GuestNode, disk: Disk) {
    let volumes = [
        ("ext4", Kind::Mount("ext4"), false),
        ("xfs", Kind::Mount("xfs"), false),
        ("block", Kind::Block, false),
        ("ro", Kind::Mount("ext4"), true),
    ];
    for (name, kind, readonly) in volumes {
        let volume_id = format!("pvc-{}-{name}", disk.prefix());
        round_trip(host, &volume_id, kind, readonly, disk).await;
    }
}

/// Stages and publishes `volume_id` as `kind` (read-only if `readonly`),
/// checks it as a pod would, on the kernel's `disk`, and takes it down.
async fn round_trip(host: &mut GuestNode, volume_id: &str, kind: Kind, readonly: bool, disk: Disk) {
    let Published {
        backing,
        staging,
        target,
    } = stage_and_publish(host, volume_id, kind, readonly).await;

    let target_s = target.display();
    match kind {
        Kind::Mount(fs) => {
            let mounted = host
                .sh(&format!("findmnt -no SOURCE,FSTYPE {target_s}"))
                .unwrap();
            let (source, fstype) = mounted.trim().split_once(' ').unwrap();
            let name = source.trim_start_matches("/dev/");
            assert!(
                name.starts_with(disk.prefix()),
                "{volume_id} is mounted from {source}, not the guest's {disk:?} disk"
            );
            assert_eq!(fstype.trim(), fs);
            if let Disk::Nvme = disk {
                // The kernel's own disk, with no UUID to go by: what the
                // node read.
                let uuid = host
                    .sh(&format!("cat /sys/block/{name}/uuid 2>&1 || true"))
                    .unwrap();
                assert!(uuid.contains("No such file"), "{name} lists a uuid: {uuid}");
            }
            if readonly {
                let refused = host.sh(&format!("touch {target_s}/x 2>&1")).unwrap_err();
                assert!(
                    format!("{refused:#}").contains("Read-only file system"),
                    "{refused:#}"
                );
            } else {
                host.sh(&format!(
                    "echo {volume_id} >{target_s}/written && sync && \
                     [ \"$(cat {target_s}/written)\" = {volume_id} ]"
                ))
                .unwrap();
            }
        }
        Kind::Block => {
            let size = host
                .sh(&format!("blockdev --getsize64 {target_s}"))
                .unwrap();
            assert_eq!(size.trim().parse::<u64>().unwrap(), VOLUME);
            host.sh(&format!(
                "(printf snap-csi; head -c 504 /dev/zero) | \
                 dd of={target_s} iflag=fullblock oflag=direct bs=512 count=1 status=none"
            ))
            .unwrap();
        }
    }

    unpublish(&mut host.client, volume_id, &target).await;
    unstage(&mut host.client, volume_id, &staging).await;
    if let Kind::Block = kind {
        // What the pod wrote reached the volume's bytes on the DPU side.
        let head = std::fs::read(&backing).unwrap();
        assert_eq!(&head[..8], b"snap-csi");
    }
}

/// Stages and publishes `volume_id`, a ReadWriteMany filesystem device
/// over `share` (the fsdev's tree on the DPU side); kubelet's paths of it.
pub async fn stage_and_publish_share(
    host: &mut GuestNode,
    volume_id: &str,
    share: &Path,
) -> (PathBuf, PathBuf) {
    let (staging, target) = host.paths(volume_id);
    let capability = mount_capability("", Mode::MultiNodeMultiWriter);
    let staged = host
        .client
        .node_stage_volume(super::virtio_fs::stage_request(
            volume_id,
            &staging,
            capability.clone(),
            share,
        ))
        .await;
    if let Err(e) = staged {
        panic!("stage {volume_id}: {e}\n{}", host.node_log());
    }
    host.client
        .node_publish_volume(super::virtio_fs::publish_request(
            volume_id,
            (&staging, &target),
            capability,
            share,
            false,
        ))
        .await
        .unwrap_or_else(|e| panic!("publish {volume_id}: {e}"));
    (staging, target)
}

/// virtiofsd, built once (hack/guest/virtiofsd.sh).
pub fn virtiofsd() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/guest/virtiofsd.sh");
    let out = std::process::Command::new(&script).output().unwrap();
    assert!(out.status.success(), "{}: {out:?}", script.display());
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// A channel to the node in the guest, once it listens.
async fn connect(address: &str) -> Channel {
    let deadline = tokio::time::Instant::now() + STARTED;
    loop {
        let endpoint = tonic::transport::Endpoint::try_from(address.to_owned()).unwrap();
        match endpoint.connect().await {
            // The forwarder accepts before the node listens: a call tells.
            Ok(channel) => {
                let mut identity =
                    snap_csi::proto::csi::v1::identity_client::IdentityClient::new(channel.clone());
                if identity
                    .probe(snap_csi::proto::csi::v1::ProbeRequest {})
                    .await
                    .is_ok()
                {
                    return channel;
                }
            }
            Err(_) if tokio::time::Instant::now() < deadline => {}
            Err(e) => panic!("nothing answers at {address}: {e}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the node in the guest did not answer at {address}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
