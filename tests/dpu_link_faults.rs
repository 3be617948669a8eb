//! The DPU link cut in the middle of a call, for real: the DPU agent runs
//! in its own network namespace behind a veth pair, as on a BlueField, and
//! the test drops every packet there (nftables) while a stage, an unstage
//! or a detach is on the wire, then lets them through again. Each cut call
//! ends within its deadline with UNAVAILABLE or DEADLINE_EXCEEDED naming the
//! agent; the retry after the link heals converges, and SNAP, the host and
//! the node hold exactly one of everything, then nothing.

mod common;

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::dpu::{DPU_NAME, HOST_NAME};
use common::node::{block_capability, connect, mounts_under, stage_request};
use common::pki::{Pki, Role};
use common::shared::KillOnDrop;
use common::{Emulator, loop_devices_of, timed};
use snap_csi::dpu::DpuAttach;
use snap_csi::dpu::names::VolumeNames;
use snap_csi::dpu::remote::RemoteDpu;
use snap_csi::grpc::LinkAddress;
use snap_csi::node::config::EmulationSetting;
use snap_csi::node::{Fleet, NodeConfig};
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::node_client::NodeClient;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use snap_csi::spdk::bdev::BdevGetBdevs;
use snap_csi::spdk::snap::{NvmeControllerList, NvmeSubsystemList};
use tokio::time::Instant;
use tonic::Code;

/// SNAP answers on a poller as SPDK does, so what a cut call left running on
/// the DPU goes on for a while after the cut (the plugin's gate, in
/// `cut_during`, decides when the cut comes).
const POLL: Duration = Duration::from_millis(100);
/// Kubelet's deadline for a cut call.
const CUT_CALL: Duration = Duration::from_secs(3);
const AGENT_PORT: u16 = 9830;

/// A network namespace for the DPU, joined to ours by a veth pair.
struct DpuNetwork {
    name: String,
    host_side: String,
    agent_ip: Ipv4Addr,
}

impl DpuNetwork {
    fn new() -> DpuNetwork {
        // Unique per test process and test, short enough for an interface.
        let tag = format!("{:x}", std::process::id() % 0xfffff);
        let subnet = u8::try_from(std::process::id() % 250).unwrap();
        let network = DpuNetwork {
            name: format!("snapcsi-f{tag}"),
            host_side: format!("scf{tag}h"),
            agent_ip: Ipv4Addr::new(198, 19, subnet, 2),
        };
        let dpu_side = format!("scf{tag}d");
        let host_ip = Ipv4Addr::new(198, 19, subnet, 1);
        let ns = network.name.as_str();
        for args in [
            vec!["netns", "add", ns],
            vec![
                "link",
                "add",
                &network.host_side,
                "type",
                "veth",
                "peer",
                "name",
                &dpu_side,
            ],
            vec!["link", "set", &dpu_side, "netns", ns],
            vec![
                "addr",
                "add",
                &format!("{host_ip}/30"),
                "dev",
                &network.host_side,
            ],
            vec!["link", "set", &network.host_side, "up"],
            vec![
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/30", network.agent_ip),
                "dev",
                &dpu_side,
            ],
            vec!["-n", ns, "link", "set", &dpu_side, "up"],
            vec!["-n", ns, "link", "set", "lo", "up"],
        ] {
            run("ip", &args);
        }
        network
    }

    /// Drops every packet in and out of the DPU's namespace.
    fn cut(&self) {
        let rules = "table inet snapcsi_cut {\n\
            chain in { type filter hook input priority 0; policy drop; }\n\
            chain out { type filter hook output priority 0; policy drop; }\n}\n";
        let mut nft = Command::new("ip")
            .args(["netns", "exec", &self.name, "nft", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        nft.stdin
            .take()
            .unwrap()
            .write_all(rules.as_bytes())
            .unwrap();
        assert!(nft.wait().unwrap().success(), "nft refused the rules");
    }

    fn heal(&self) {
        run(
            "ip",
            &[
                "netns",
                "exec",
                &self.name,
                "nft",
                "delete",
                "table",
                "inet",
                "snapcsi_cut",
            ],
        );
    }
}

impl Drop for DpuNetwork {
    fn drop(&mut self) {
        // The peer goes with the namespace; our side with its peer.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_side])
            .status();
    }
}

fn run(program: &str, args: &[&str]) {
    let status = Command::new(program).args(args).status().unwrap();
    assert!(status.success(), "{program} {args:?}: {status}");
}

/// The whole stack: SNAP and the plugin (reached by the agent through their
/// sockets), the agent in the DPU's namespace, the node on the host side.
struct Stack {
    node: NodeClient<tonic::transport::Channel>,
    /// The node's attach layer, for a bare detach.
    remote: Arc<RemoteDpu>,
    config: NodeConfig,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    _agent: KillOnDrop,
    network: DpuNetwork,
    plugin: common::plugin::TestPlugin,
    emulator: Emulator,
    _dir: tempfile::TempDir,
}

impl Stack {
    async fn start() -> Stack {
        let dir = tempfile::tempdir().unwrap();
        let emulator = Emulator::start_with(
            snap_emu::Config::for_test(dir.path()).with_poll_period(POLL),
            dir.path(),
        )
        .await;
        let plugin = common::plugin::start(&emulator.socket, dir.path()).await;
        let network = DpuNetwork::new();
        let pki = Pki::new(&dir.path().join("pki"), "ca");
        let (agent_tls, node_tls) = (
            pki.issue(Role::Agent, DPU_NAME),
            pki.issue(Role::Node, HOST_NAME),
        );
        let listen = format!("https://{}:{AGENT_PORT}", network.agent_ip);
        let agent = Command::new("ip")
            .args(["netns", "exec", &network.name])
            .arg(env!("CARGO_BIN_EXE_snap-csi"))
            .arg("dpu-agent")
            .arg(format!("--listen={listen}"))
            .arg(format!("--host-name={HOST_NAME}"))
            .arg(format!("--tls-cert={}", agent_tls.cert.display()))
            .arg(format!("--tls-key={}", agent_tls.key.display()))
            .arg(format!("--tls-ca={}", agent_tls.ca.display()))
            .arg(format!("--plugin-socket={}", plugin.socket.display()))
            .arg(format!(
                "--snap-socket-template={}",
                emulator.socket.display()
            ))
            .stderr(std::fs::File::create(dir.path().join("agent.log")).unwrap())
            .spawn()
            .unwrap();
        let agent = KillOnDrop(agent);
        let address = LinkAddress::Tls(format!("{}:{AGENT_PORT}", network.agent_ip));
        let remote = Arc::new(RemoteDpu::new(address.clone(), DPU_NAME, &node_tls).unwrap());
        for _ in 0..500 {
            if remote
                .probe(Instant::now() + Duration::from_secs(1))
                .await
                .is_ok()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        let kubelet = dir.path().join("kubelet");
        std::fs::create_dir_all(kubelet.join("staging")).unwrap();
        let config = NodeConfig {
            endpoint: dir.path().join("csi.sock"),
            node_id: HOST_NAME.into(),
            kubelet_dir: kubelet,
            state_dir: dir.path().join("node-state"),
            sysfs_root: emulator.sysfs_root.clone(),
            emulation: EmulationSetting::Nvme,
            dpu_name: DPU_NAME.into(),
            dpu_endpoint: Some(address.to_string()),
            dpu_tls: node_tls.clone(),
            ..NodeConfig::default()
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let node_dpu = Arc::new(RemoteDpu::new(address, DPU_NAME, &node_tls).unwrap());
        let fleet = Fleet::new(vec![(DPU_NAME.into(), 0, node_dpu as _)]);
        tokio::spawn(snap_csi::node::serve(config.clone(), fleet, async move {
            let _ = stopped.await;
        }));
        let node = NodeClient::new(connect(&config.endpoint).await);
        Stack {
            node,
            remote,
            config,
            stop: Some(stop),
            _agent: agent,
            network,
            plugin,
            emulator,
            _dir: dir,
        }
    }

    fn backing(&self) -> std::path::PathBuf {
        self.emulator.root().join("vol.img")
    }

    fn stage(&self, timeout: Duration) -> tonic::Request<csi::NodeStageVolumeRequest> {
        let staging = self.config.kubelet_dir.join("staging/pvc-cut");
        timed(
            stage_request(
                "pvc-cut",
                &staging,
                block_capability(Mode::SingleNodeWriter),
                &self.backing(),
            ),
            timeout,
        )
    }

    fn unstage(&self, timeout: Duration) -> tonic::Request<csi::NodeUnstageVolumeRequest> {
        let staging = self.config.kubelet_dir.join("staging/pvc-cut");
        timed(
            csi::NodeUnstageVolumeRequest {
                volume_id: "pvc-cut".into(),
                staging_target_path: staging.display().to_string(),
            },
            timeout,
        )
    }

    /// Runs `call` and cuts the link while it is on the wire; heals after.
    async fn cut_during<T, F>(&self, call: F) -> tonic::Status
    where
        F: std::future::Future<Output = Result<T, tonic::Status>> + Send + 'static,
        T: Send + 'static,
    {
        let closed = self.plugin.gate.close().await;
        let running = tokio::spawn(call);
        // The call is on the DPU, inside the plugin, its answer still to come.
        self.plugin.gate.entered().await;
        self.network.cut();
        drop(closed);
        let status = match running.await.unwrap() {
            Ok(_) => panic!("a call cut in the middle cannot succeed"),
            Err(status) => status,
        };
        self.network.heal();
        // The client enforces the deadline it sent (tonic answers CANCELLED
        // "Timeout expired" when its own timer wins), so an answer from the
        // node, with its code, is one that came within the deadline.
        assert!(
            matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded)
                && !snap_csi::grpc::unanswered(&status),
            "the node answers within the deadline: {status:?}"
        );
        status
    }

    /// SNAP, the host and the node hold `count` of everything of the volume.
    async fn census(&self, count: usize) {
        let snap = self.emulator.client();
        let names = VolumeNames::new("pvc-cut");
        let subsystems = snap.call(&NvmeSubsystemList {}).await.unwrap();
        let ours: Vec<_> = subsystems.iter().filter(|s| s.nqn == names.nqn).collect();
        assert_eq!(ours.len(), count, "subsystems: {subsystems:?}");
        let controllers = snap.call(&NvmeControllerList {}).await.unwrap();
        assert_eq!(controllers.len(), count, "controllers: {controllers:?}");
        let bdevs = snap.call(&BdevGetBdevs::default()).await.unwrap();
        assert_eq!(bdevs.len(), count, "bdevs: {bdevs:?}");
        assert_eq!(
            loop_devices_of(&self.backing()).len(),
            count,
            "loop devices"
        );
        let records = std::fs::read_dir(self.config.state_dir.join("volumes"))
            .map(|d| d.count())
            .unwrap_or(0);
        assert_eq!(records, count, "records");
        assert!(mounts_under(&self.config.kubelet_dir).is_empty(), "mounts");
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_cut_mid_call_ends_in_time_and_the_retry_converges() {
    let stack = Stack::start().await;
    common::sparse_file(&stack.backing(), 32 << 20);

    // A stage, cut in the middle of its attach.
    let mut node = stack.node.clone();
    let request = stack.stage(CUT_CALL);
    let status = stack
        .cut_during(async move { node.node_stage_volume(request).await })
        .await;
    assert!(status.message().contains("DPU agent at"), "{status:?}");
    stack
        .node
        .clone()
        .node_stage_volume(stack.stage(Duration::from_secs(30)))
        .await
        .expect("the stage retried after the link healed");
    stack.census(1).await;

    // An unstage, cut in the middle of its detach.
    let mut node = stack.node.clone();
    let request = stack.unstage(CUT_CALL);
    let status = stack
        .cut_during(async move { node.node_unstage_volume(request).await })
        .await;
    assert!(status.message().contains("DPU agent at"), "{status:?}");
    stack
        .node
        .clone()
        .node_unstage_volume(stack.unstage(Duration::from_secs(30)))
        .await
        .expect("the unstage retried after the link healed");
    stack.census(0).await;

    // A bare detach of an attached volume, cut in the middle.
    stack
        .node
        .clone()
        .node_stage_volume(stack.stage(Duration::from_secs(30)))
        .await
        .unwrap();
    let detaching = stack.remote.clone();
    let error = stack
        .cut_during(async move {
            detaching
                .detach("pvc-cut", None, Instant::now() + CUT_CALL)
                .await
                .map_err(tonic::Status::from)
        })
        .await;
    assert!(error.message().contains("DPU agent at"), "{error:?}");
    stack
        .remote
        .detach("pvc-cut", None, Instant::now() + Duration::from_secs(30))
        .await
        .expect("the detach retried after the link healed");
    // The node still has its record: its unstage finds nothing left to detach.
    stack
        .node
        .clone()
        .node_unstage_volume(stack.unstage(Duration::from_secs(30)))
        .await
        .unwrap();
    stack.census(0).await;
}
