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
use super::guest::{Guest, GuestSpec, Link};
use super::plugin::{self, TestPlugin};

pub const SNAP_CSI: &str = env!("CARGO_BIN_EXE_snap-csi");
/// The node's start and its first call to the agent, under TCG on a loaded
/// machine.
pub const STARTED: Duration = Duration::from_secs(120);
/// Where the guest's kubelet keeps its volumes.
pub const KUBELET_DIR: &str = "/var/lib/kubelet";
/// Root ports the emulator's virtio-blk PFs take; the rest are for
/// hot-plugged PFs (virtio-fs).
const VIRTIO_BLK_PFS: u32 = 4;

/// Starts `snap-csi node` in the guest under `/run/<name>`, reaching the
/// agent at `agent` with `tls`, its metrics on the guest's loopback at
/// `metrics_port`, with `extra` flags.
pub fn start_node(
    guest: &mut Guest,
    name: &str,
    (agent, tls): (&str, &TlsFiles),
    metrics_port: u16,
    extra: &str,
) {
    let dir = format!("/run/{name}");
    guest
        .sh(&format!(
            "mkdir -p {dir}/state {KUBELET_DIR} && \
             {SNAP_CSI} node --endpoint {dir}/csi.sock --node-id {HOST_NAME} \
             --state-dir {dir}/state --kubelet-dir {KUBELET_DIR} \
             --dpu-endpoint {agent} --dpu-name {DPU_NAME} \
             --dpu-tls-cert {} --dpu-tls-key {} --dpu-tls-ca {} \
             --metrics-address 127.0.0.1:{metrics_port} {extra} >{dir}/log 2>&1 &",
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
        let mut guest = tokio::task::block_in_place(|| Guest::boot(&spec)).unwrap();

        let (qmp, ports) = guest.hotplug_monitor(1);
        let functions = snap_emu::FunctionLayout {
            nvme_pfs: 0,
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
        tokio::task::block_in_place(|| {
            start_node(
                &mut guest,
                "node",
                (&endpoint, &node_tls),
                9101,
                &format!("--emulation {emulation}"),
            );
            guest
                .sh(&format!(
                    "python3 {} {} {csi_port} /run/node/csi.sock >/run/forward.log 2>&1 &",
                    forward.display(),
                    link.guest
                ))
                .unwrap();
        });
        let client = NodeClient::new(connect(&format!("http://{}:{csi_port}", link.guest)).await);
        GuestNode {
            client,
            agent,
            plugin,
            emulator,
            guest,
            _link: link,
            dir,
        }
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
