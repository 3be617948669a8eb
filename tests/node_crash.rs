//! Crash safety: the node process is killed with SIGKILL right after each step
//! of stage and of unstage (a crash point armed through the environment),
//! restarted, and the call retried. It must converge, and after unstage
//! nothing may be left: no bdev, namespace, controller, loop device, mount or
//! record. In a split-mode run (`common::dpu`) the DPU steps (attach and
//! detach) run in a `snap-csi dpu-agent` process reached over mutual TLS, and
//! it is the agent that is killed after each of them.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use common::dpu::{DPU_NAME, HOST_NAME};
use common::node::{connect, mount_capability, mounts_under, stage_request};
use common::pki::{Pki, Role};
use common::{Emulator, loop_devices_of, timed};
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::node_client::NodeClient;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use snap_csi::spdk::bdev::BdevGetBdevs;
use snap_csi::spdk::snap::{NvmeSubsystemList, VirtioBlkControllerList};

/// The stage steps with a crash point, in order.
const STAGE_POINTS: &[&str] = &[
    "attach:create-device",
    "attach:nvme-subsystem",
    "attach:nvme-namespace-controller",
    "attach:nvme-attach",
    "attach:nvme-resume",
    "stage:attach",
    "stage:record",
    "stage:format",
    "stage:mount",
];

/// The unstage steps with a crash point, in order.
const UNSTAGE_POINTS: &[&str] = &[
    "unstage:unmount",
    "detach:unexpose",
    "detach:delete-device",
    "unstage:detach",
];

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
    fn processes(&self, crash_after: Option<&str>) -> Vec<Child> {
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
            .arg("nvme");
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

    /// Runs `call` on a stack armed to crash after `point`: the call fails,
    /// the process that reached the point is gone, the others are stopped.
    async fn crash<F, Fut, T>(&self, point: &str, call: F)
    where
        F: FnOnce(NodeClient<tonic::transport::Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let mut processes = self.processes(Some(point));
        let result = call(self.client().await).await;
        assert!(
            result.is_err(),
            "the stack should have crashed after {point}"
        );
        // The agent, when it is the one, is first; the node is last.
        let crashed = if self.in_agent(point) {
            0
        } else {
            processes.len() - 1
        };
        reap(processes.remove(crashed));
        stop_all(processes);
    }

    async fn assert_nothing_left(&self, backing: &Path) {
        let snap = self.emulator.client();
        assert!(loop_devices_of(backing).is_empty(), "a loop device is left");
        assert!(mounts_under(&self.kubelet).is_empty(), "a mount is left");
        assert!(
            snap.call(&BdevGetBdevs::default())
                .await
                .unwrap()
                .is_empty(),
            "a bdev is left"
        );
        assert!(
            snap.call(&NvmeSubsystemList {}).await.unwrap().is_empty(),
            "a subsystem is left"
        );
        assert!(
            snap.call(&VirtioBlkControllerList {})
                .await
                .unwrap()
                .is_empty(),
            "a controller is left"
        );
        let records = std::fs::read_dir(self.state.join("volumes"))
            .map(|d| d.count())
            .unwrap_or(0);
        assert_eq!(records, 0, "a record is left");
    }
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

fn unstage(volume_id: &str, staging: &Path) -> csi::NodeUnstageVolumeRequest {
    csi::NodeUnstageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.display().to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_any_stage_or_unstage_step_converges_on_retry() {
    let stack = Stack::start().await;
    let backing = stack.emulator.root().join("vol.img");
    common::sparse_file(&backing, 64 << 20);
    let staging = stack.kubelet.join("staging/pvc-c");
    std::fs::create_dir_all(&staging).unwrap();
    let capability = mount_capability("ext4", Mode::SingleNodeWriter);

    let stage = || {
        timed(
            stage_request("pvc-c", &staging, capability.clone(), &backing),
            CRASHING_CALL,
        )
    };
    for point in STAGE_POINTS {
        stack
            .crash(point, |mut node| async move {
                node.node_stage_volume(stage()).await
            })
            .await;

        let processes = stack.processes(None);
        let mut client = stack.client().await;
        client
            .node_stage_volume(stage())
            .await
            .unwrap_or_else(|e| panic!("stage retried after a crash at {point}: {e}"));
        client
            .node_unstage_volume(unstage("pvc-c", &staging))
            .await
            .unwrap_or_else(|e| panic!("unstage after a crash at {point}: {e}"));
        stop_all(processes);
        stack.assert_nothing_left(&backing).await;
    }

    for point in UNSTAGE_POINTS {
        let processes = stack.processes(None);
        stack
            .client()
            .await
            .node_stage_volume(stage())
            .await
            .unwrap();
        stop_all(processes);

        let request = timed(unstage("pvc-c", &staging), CRASHING_CALL);
        stack
            .crash(point, |mut node| async move {
                node.node_unstage_volume(request).await
            })
            .await;

        let processes = stack.processes(None);
        stack
            .client()
            .await
            .node_unstage_volume(unstage("pvc-c", &staging))
            .await
            .unwrap_or_else(|e| panic!("unstage retried after a crash at {point}: {e}"));
        stop_all(processes);
        stack.assert_nothing_left(&backing).await;
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
                && line["span"]["volume_id"] == "pvc-c"),
        "no log line inside a NodeStageVolume span naming the volume"
    );
}
