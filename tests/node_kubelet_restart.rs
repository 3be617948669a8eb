//! kubelet restarting under the node (catalogue scenario 1). To the node, a
//! kubelet restart is its gRPC connection dropped with a call in flight (the
//! server sees the call cancelled) and the same calls sent again by a new
//! client. The retried calls must converge: the same result, one attachment
//! on the DPU, one mount, and nothing left after the unstage, wherever the
//! cancelled call stopped: at each SNAP step of the attach, after the DPU
//! attached but before the node heard back, while it waited for the disk.
//!
//! Real stack: the SNAP emulator, the test vendor plugin, the node over real
//! gRPC (in a split-mode run, through a DPU agent over mutual TLS).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::dpu::GatedDpu;
use common::node::{
    NodeStack, Tweaks, assert_attached_once, connect, mount_capability, mounts_under,
    publish_request, stage_request, unpublish, unstage,
};
use snap_csi::dpu::DpuAttach;
use snap_csi::dpu::names::VolumeNames;
use snap_csi::node::config::EmulationSetting;
use snap_csi::node::records::Records;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::node_client::NodeClient;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::transport::Channel;

const SIZE: u64 = 64 << 20;
/// How long a retry may keep finding the cancelled call still holding the
/// volume (ABORTED, which kubelet answers by backing off) before the test
/// calls it stuck: the cancelled call ends when its work does, which on a
/// loaded machine takes what it takes; only a call that never lets go fails.
const STUCK_AFTER: Duration = Duration::from_secs(60);

/// A kubelet: its own connection to the node.
async fn kubelet(stack: &NodeStack) -> NodeClient<Channel> {
    NodeClient::new(connect(&stack.config.endpoint).await)
}

/// A stage sent by a kubelet that is about to die: the call runs on its own
/// connection, which [`Dying::restart`] drops with the call in flight.
struct Dying {
    call: tokio::task::JoinHandle<
        Result<tonic::Response<csi::NodeStageVolumeResponse>, tonic::Status>,
    >,
}

impl Dying {
    async fn stage(stack: &NodeStack, request: csi::NodeStageVolumeRequest) -> Dying {
        let mut node = kubelet(stack).await;
        Dying {
            call: tokio::spawn(async move { node.node_stage_volume(request).await }),
        }
    }

    /// kubelet dies: the call and its connection go, unanswered.
    async fn restart(self) {
        self.call.abort();
        assert!(
            self.call.await.unwrap_err().is_cancelled(),
            "the call was still in flight"
        );
    }
}

/// The new kubelet's stage, sent again until the cancelled one no longer
/// holds the volume; it must then succeed.
async fn retried_stage(stack: &NodeStack, request: &csi::NodeStageVolumeRequest) {
    let mut node = kubelet(stack).await;
    let started = std::time::Instant::now();
    while started.elapsed() < STUCK_AFTER {
        match node.node_stage_volume(request.clone()).await {
            Ok(_) => return,
            Err(e) if e.code() == tonic::Code::Aborted => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("the retried stage of {}: {e:?}", request.volume_id),
        }
    }
    panic!(
        "the cancelled stage of {} did not let go in {STUCK_AFTER:?}",
        request.volume_id
    );
}

/// A volume's paths and backing file.
struct Volume {
    id: String,
    backing: std::path::PathBuf,
    staging: std::path::PathBuf,
    target: std::path::PathBuf,
}

impl Volume {
    fn new(stack: &NodeStack, id: &str) -> Volume {
        let staging = stack.path(&format!("staging/{id}"));
        std::fs::create_dir_all(&staging).unwrap();
        Volume {
            id: id.to_string(),
            backing: stack.backing_file(&format!("{id}.img"), SIZE),
            staging,
            target: stack.path(&format!("pods/p/volumes/{id}")),
        }
    }

    fn stage(&self) -> csi::NodeStageVolumeRequest {
        stage_request(&self.id, &self.staging, capability(), &self.backing)
    }

    /// Published, written and read back, torn down, and nothing left.
    async fn finish(&self, stack: &NodeStack) {
        assert_attached_once(stack, &self.backing, &self.staging, false).await;
        let mut node = kubelet(stack).await;
        node.node_publish_volume(publish_request(
            &self.id,
            &self.staging,
            &self.target,
            capability(),
            false,
        ))
        .await
        .unwrap_or_else(|e| panic!("publish {}: {e:?}", self.id));
        std::fs::write(self.target.join("proof"), self.id.as_bytes()).unwrap();
        assert_eq!(
            std::fs::read(self.target.join("proof")).unwrap(),
            self.id.as_bytes()
        );
        assert_eq!(mounts_under(&self.target).len(), 1, "one bind mount");
        unpublish(&mut node, &self.id, &self.target).await;
        unstage(&mut node, &self.id, &self.staging).await;
        stack.assert_nothing_left(&self.backing).await;
    }
}

fn capability() -> csi::VolumeCapability {
    mount_capability("ext4", Mode::SingleNodeWriter)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_restarted_between_stage_and_publish_stages_again_and_publishes() {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let volume = Volume::new(&stack, "pvc-between");
    let mut old = kubelet(&stack).await;
    old.node_stage_volume(volume.stage()).await.unwrap();
    drop(old);
    // The new kubelet does not know what the old one did: it stages again.
    let mut new = kubelet(&stack).await;
    new.node_stage_volume(volume.stage()).await.unwrap();
    volume.finish(&stack).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_cancelled_at_each_snap_step_converges_when_retried() {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let faults = stack.emulator.faults.clone();
    let mut cuts = 0;
    loop {
        let volume = Volume::new(&stack, &format!("pvc-cut-{cuts}"));
        // SNAP answers `cuts` requests of the stage (the node's and the
        // plugin's), then holds the next: the stage is stuck right there.
        faults.hold_after(cuts);
        let dying = Dying::stage(&stack, volume.stage()).await;
        let finished = tokio::select! {
            _ = faults.until_held(1) => false,
            _ = wait_finished(&dying) => true,
        };
        if finished {
            faults.release();
            dying.call.await.unwrap().expect("the uncut stage succeeds");
            volume.finish(&stack).await;
            break;
        }
        dying.restart().await;
        // What was held is answered now, for a caller that is gone.
        faults.release();
        retried_stage(&stack, &volume.stage()).await;
        volume.finish(&stack).await;
        cuts += 1;
    }
    println!("a new NVMe stage cut after each of its {cuts} SNAP requests");
    assert!(cuts >= 5, "only {cuts} SNAP requests in a new NVMe stage");
}

/// Waits until the dying kubelet's call has been answered.
async fn wait_finished(dying: &Dying) {
    while !dying.call.is_finished() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A node stack whose DPU layer holds each attach after it is done on the
/// DPU, until the test lets it go.
async fn gated_stack(emulation: EmulationSetting) -> (NodeStack, Arc<GatedDpu>) {
    let (made, gated) = std::sync::mpsc::channel();
    let tweaks = Tweaks {
        wrap_dpu: Some(Box::new(move |dpu: Arc<dyn DpuAttach>| {
            let gated = GatedDpu::around(dpu);
            made.send(Arc::clone(&gated)).unwrap();
            gated as Arc<dyn DpuAttach>
        })),
        ..Tweaks::default()
    };
    let stack = NodeStack::start_with(emulation, tweaks).await;
    // Wrapped before the node listened, which `start_with` waited for.
    let gated = gated.recv_timeout(Duration::from_secs(5)).unwrap();
    (stack, gated)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_cancelled_after_the_dpu_attached_converges_when_retried() {
    for emulation in [EmulationSetting::Nvme, EmulationSetting::VirtioBlk] {
        let (stack, gated) = gated_stack(emulation).await;
        let volume = Volume::new(&stack, "pvc-attached");
        let dying = Dying::stage(&stack, volume.stage()).await;
        // Everything is attached on the DPU; the node has not heard back
        // (and so has written no record).
        gated.started(1).await;
        dying.restart().await;
        // The node's handler was dropped with the call.
        gated.cancelled(1).await;
        gated.gate.add_permits(1);
        retried_stage(&stack, &volume.stage()).await;
        volume.finish(&stack).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_cancelled_while_waiting_for_the_disk_converges_when_retried() {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let volume = Volume::new(&stack, "pvc-waiting");
    let uuid = VolumeNames::new(&volume.id).namespace_uuid;
    stack.emulator.faults.miss_discovery(&uuid);
    let dying = Dying::stage(&stack, volume.stage()).await;
    // The record is written just before the node waits for the disk.
    let records = Records::open(stack.config.state_dir.join("volumes")).unwrap();
    common::discovered("the stage waiting for the disk", || {
        records.load(&volume.id).unwrap()
    })
    .await;
    dying.restart().await;
    stack.emulator.faults.rescan(&uuid);
    retried_stage(&stack, &volume.stage()).await;
    volume.finish(&stack).await;
}
