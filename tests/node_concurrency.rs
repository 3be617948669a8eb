//! Concurrency and shutdown of the node service, with a DPU attach layer the
//! test holds in the middle of an attach (the seam is the `DpuAttach` trait):
//! a second call for a busy volume gets ABORTED while other volumes proceed,
//! and a shutdown lets the call in flight finish.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::dpu::{Agent, DPU_NAME, GatedDpu};
use common::node::{block_capability, connect};
use snap_csi::dpu::{DpuAttach, HostLocator};
use snap_csi::node::config::EmulationSetting;
use snap_csi::node::{Fleet, NodeConfig};
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::node_client::NodeClient;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use tokio::sync::oneshot;

/// A real loop device, described in a sysfs-shaped tree as a virtio-blk disk.
struct FakeHost {
    dir: tempfile::TempDir,
    loop_device: String,
}

impl FakeHost {
    fn new() -> FakeHost {
        let dir = tempfile::tempdir().unwrap();
        let backing = dir.path().join("disk.img");
        common::sparse_file(&backing, 8 << 20);
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&backing)
            .output()
            .unwrap();
        let loop_device = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(loop_device.starts_with("/dev/loop"), "{out:?}");
        let name = loop_device.trim_start_matches("/dev/");
        let dev = std::fs::read_to_string(format!("/sys/block/{name}/dev")).unwrap();
        let disk = dir
            .path()
            .join("sysfs/bus/pci/devices/0000:27:00.1/virtio1/block/vda");
        std::fs::create_dir_all(&disk).unwrap();
        std::fs::write(disk.join("serial"), "gated-serial").unwrap();
        std::fs::write(disk.join("size"), format!("{}\n", (8 << 20) / 512)).unwrap();
        std::fs::write(disk.join("dev"), dev).unwrap();
        FakeHost { dir, loop_device }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for FakeHost {
    fn drop(&mut self) {
        let _ = Command::new("losetup")
            .args(["-d", &self.loop_device])
            .status();
    }
}

fn config(root: &Path) -> NodeConfig {
    let kubelet = root.join("kubelet");
    std::fs::create_dir_all(kubelet.join("staging")).unwrap();
    NodeConfig {
        endpoint: root.join("csi.sock"),
        kubelet_dir: kubelet,
        state_dir: root.join("state"),
        sysfs_root: root.join("sysfs"),
        node_id: "node-1".into(),
        emulation: EmulationSetting::VirtioBlk,
        device_wait: Duration::from_secs(5),
        ..NodeConfig::default()
    }
}

fn stage(config: &NodeConfig, volume_id: &str) -> csi::NodeStageVolumeRequest {
    let staging: PathBuf = config.kubelet_dir.join("staging").join(volume_id);
    csi::NodeStageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(block_capability(Mode::SingleNodeWriter)),
        ..Default::default()
    }
}

/// The node service serving on the test's runtime with a gated DPU (behind
/// a DPU agent in a split-mode run).
struct Running {
    config: NodeConfig,
    dpu: Arc<GatedDpu>,
    stop: oneshot::Sender<()>,
    /// Fires when the server has taken the stop signal in.
    stop_seen: oneshot::Receiver<()>,
    server: tokio::task::JoinHandle<anyhow::Result<()>>,
    node: NodeClient<tonic::transport::Channel>,
    _agent: Option<Agent>,
}

impl Running {
    async fn start(host: &FakeHost) -> Running {
        let config = config(host.root());
        let dpu = gated_dpu();
        let (attach, agent): (Arc<dyn DpuAttach>, _) = if common::dpu::split() {
            let agent = Agent::serving(dpu.clone(), host.root()).await;
            (Arc::new(agent.remote()), Some(agent))
        } else {
            (dpu.clone(), None)
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let (seen, stop_seen) = oneshot::channel::<()>();
        let fleet = Fleet::new(vec![(DPU_NAME.into(), 0, attach)]);
        let server = tokio::spawn(snap_csi::node::serve(config.clone(), fleet, async move {
            let _ = stopped.await;
            let _ = seen.send(());
        }));
        let node = NodeClient::new(connect(&config.endpoint).await);
        Running {
            config,
            dpu,
            stop,
            stop_seen,
            server,
            node,
            _agent: agent,
        }
    }
}

/// A stage that runs while the test goes on.
fn in_background(
    node: &NodeClient<tonic::transport::Channel>,
    request: csi::NodeStageVolumeRequest,
) -> tokio::task::JoinHandle<Result<tonic::Response<csi::NodeStageVolumeResponse>, tonic::Status>> {
    let mut node = node.clone();
    tokio::spawn(async move { node.node_stage_volume(request).await })
}

fn gated_dpu() -> Arc<GatedDpu> {
    GatedDpu::new(HostLocator::VirtioBlk {
        bdf: "27:00.1".into(),
        serial: "gated-serial".into(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_volume_answers_aborted_while_other_volumes_proceed() {
    let host = FakeHost::new();
    let Running {
        config,
        dpu,
        stop,
        server,
        node,
        _agent,
        ..
    } = Running::start(&host).await;

    let first = in_background(&node, stage(&config, "pvc-1"));
    dpu.started(1).await;
    let busy = node
        .clone()
        .node_stage_volume(stage(&config, "pvc-1"))
        .await
        .unwrap_err();
    assert_eq!(busy.code(), tonic::Code::Aborted, "{busy:?}");
    assert!(busy.message().contains("pvc-1"), "{busy:?}");

    // Another volume is not held up behind pvc-1.
    let second = in_background(&node, stage(&config, "pvc-2"));
    dpu.started(2).await;

    dpu.gate.add_permits(2);
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    // Now free again: a retry of pvc-1 is answered (idempotently).
    dpu.gate.add_permits(1);
    node.clone()
        .node_stage_volume(stage(&config, "pvc-1"))
        .await
        .unwrap();
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

/// On one thread, so that when the test runs again after the server took the
/// stop signal in, the server's turn with it is over: a server that did not
/// wait for the call in flight has finished by then, every time.
#[tokio::test(flavor = "current_thread")]
async fn shutdown_lets_the_call_in_flight_finish_and_removes_the_socket() {
    let host = FakeHost::new();
    let Running {
        config,
        dpu,
        stop,
        stop_seen,
        server,
        node,
        _agent,
    } = Running::start(&host).await;
    let in_flight = in_background(&node, stage(&config, "pvc-1"));
    dpu.started(1).await;
    let _ = stop.send(());
    stop_seen.await.unwrap();
    assert!(
        !server.is_finished(),
        "the server waits for the call in flight"
    );
    dpu.gate.add_permits(1);
    in_flight.await.unwrap().unwrap();
    server.await.unwrap().unwrap();
    assert!(
        !config.endpoint.exists(),
        "the socket is removed on shutdown"
    );
}
