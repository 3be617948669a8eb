//! Crash safety: the node process is killed with SIGKILL right after each step
//! of stage and of unstage (a crash point armed through the environment),
//! restarted, and the call retried. It must converge, and after unstage
//! nothing may be left: no bdev, namespace, controller, loop device, mount or
//! record.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use common::node::{connect, mount_capability, mounts_under, stage_request};
use common::{Emulator, loop_devices_of};
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

struct Stack {
    emulator: Emulator,
    _plugin: common::plugin::TestPlugin,
    plugin_socket: PathBuf,
    kubelet: PathBuf,
    state: PathBuf,
    endpoint: PathBuf,
}

impl Stack {
    async fn start() -> Stack {
        let emulator = Emulator::start().await;
        let root = emulator.root().to_path_buf();
        let plugin = common::plugin::start(&emulator.socket, &root).await;
        let kubelet = root.join("kubelet");
        std::fs::create_dir_all(&kubelet).unwrap();
        Stack {
            plugin_socket: plugin.socket.clone(),
            _plugin: plugin,
            kubelet,
            state: root.join("node-state"),
            endpoint: root.join("csi.sock"),
            emulator,
        }
    }

    /// Starts `snap-csi node`; with `crash_after`, it kills itself after that step.
    fn node(&self, crash_after: Option<&str>) -> Child {
        let mut command = Command::new(env!("CARGO_BIN_EXE_snap-csi"));
        command
            .arg("--log-format")
            .arg("json")
            .arg("node")
            .arg("--endpoint")
            .arg(&self.endpoint)
            .arg("--node-id")
            .arg("node-1")
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
            .arg("nvme")
            // As chatty as it gets, to prove that even then no secret is logged.
            .env("RUST_LOG", "debug")
            .stderr(self.log())
            .env_remove(snap_csi::failpoint::ENV);
        if let Some(point) = crash_after {
            command.env(snap_csi::failpoint::ENV, point);
        }
        command.spawn().unwrap()
    }

    /// The node processes' log, appended by each run.
    fn log(&self) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.emulator.root().join("node.log"))
            .unwrap()
    }

    async fn client(&self) -> NodeClient<tonic::transport::Channel> {
        NodeClient::new(connect(&self.endpoint).await)
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

/// Waits for a node that was told to crash to be gone.
fn reap(mut child: Child) {
    for _ in 0..500 {
        if child.try_wait().unwrap().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("the node did not reach its crash point");
}

fn stop(mut child: Child) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    child.wait().unwrap();
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

    for point in STAGE_POINTS {
        let crashing = stack.node(Some(point));
        let result = stack
            .client()
            .await
            .node_stage_volume(stage_request(
                "pvc-c",
                &staging,
                capability.clone(),
                &backing,
            ))
            .await;
        assert!(result.is_err(), "the node should have died after {point}");
        reap(crashing);

        let node = stack.node(None);
        let mut client = stack.client().await;
        client
            .node_stage_volume(stage_request(
                "pvc-c",
                &staging,
                capability.clone(),
                &backing,
            ))
            .await
            .unwrap_or_else(|e| panic!("stage retried after a crash at {point}: {e}"));
        client
            .node_unstage_volume(unstage("pvc-c", &staging))
            .await
            .unwrap_or_else(|e| panic!("unstage after a crash at {point}: {e}"));
        stop(node);
        stack.assert_nothing_left(&backing).await;
    }

    for point in UNSTAGE_POINTS {
        let node = stack.node(None);
        stack
            .client()
            .await
            .node_stage_volume(stage_request(
                "pvc-c",
                &staging,
                capability.clone(),
                &backing,
            ))
            .await
            .unwrap();
        stop(node);

        let crashing = stack.node(Some(point));
        let result = stack
            .client()
            .await
            .node_unstage_volume(unstage("pvc-c", &staging))
            .await;
        assert!(result.is_err(), "the node should have died after {point}");
        reap(crashing);

        let node = stack.node(None);
        stack
            .client()
            .await
            .node_unstage_volume(unstage("pvc-c", &staging))
            .await
            .unwrap_or_else(|e| panic!("unstage retried after a crash at {point}: {e}"));
        stop(node);
        stack.assert_nothing_left(&backing).await;
    }

    let log = std::fs::read_to_string(stack.emulator.root().join("node.log")).unwrap();
    assert!(log.contains("volume attached"), "the node logged its work");
    assert!(!log.contains("not-for-logs"), "a secret reached the log");
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
