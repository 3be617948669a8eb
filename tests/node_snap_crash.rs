//! SNAP crashing in the middle of a stage or an unstage heals without a
//! human (issue 20).
//!
//! SNAP is killed and started again after each step of a stage: the DPU's
//! (the plugin's device, the NVMe subsystem, namespace and controller, the
//! attach, the resume; the virtio-blk controller) and the node's (attached,
//! recorded, formatting begun, formatted, mounted), for ext4, xfs and block
//! volumes over NVMe and virtio-blk. SNAP killed once formatting began
//! leaves half a filesystem, which the retry makes again. Like SPDK, it
//! comes back empty, and the host loses every disk it exposed
//! (`common::Emulator::restart_empty`). The test then plays
//! kubelet: it retries NodeStage only after a code kubelet does not take as
//! final (CANCELLED, DEADLINE_EXCEEDED, UNAVAILABLE, RESOURCE_EXHAUSTED,
//! ABORTED), fails on a final one (after which kubelet would never call
//! NodeUnstage), stages once more when a stage succeeded (as kubelet does
//! when its own deadline passed before the answer), publishes, writes and
//! reads the volume, unpublishes and unstages, and counts what is left:
//! nothing. After the last step of a filesystem's stage it also publishes
//! without that second stage: a publish meets the stale staging mount too.
//! The same for SNAP killed after each step of an unstage, which kubelet
//! retries whatever the code.
//!
//! A publish after SNAP came back (kubelet sends no stage for a volume it
//! believes staged) attaches the volume again; while a pod still has the old
//! filesystem mounted it waits (ABORTED) rather than mount the same data a
//! second time.
//!
//! The kill is placed by the node's failpoints (`snap_csi::failpoint::once`):
//! the call stops at its step until SNAP is back. The DPU steps run in the
//! node, or in the DPU agent in a split-mode run, both in this process.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::node::{
    NodeStack, Tweaks, block_capability, mount_capability, publish_request, read_volume,
    stage_request, unpublish, unstage, write_volume,
};
use common::timed;
use snap_csi::node::config::EmulationSetting;
use snap_csi::node::service::EMULATION_KEY;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::node_client::NodeClient;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use tokio::sync::Mutex;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// Sparse, so cheap; big enough for xfs.
const SIZE: u64 = 512 << 20;
/// What a call gets, as kubelet gives its calls two minutes.
const CALL: Duration = Duration::from_secs(60);
/// How long the node waits for a disk: one SNAP lost with it never comes.
const DEVICE_WAIT: Duration = Duration::from_secs(3);
/// Retries of a call before the test calls it stuck.
const TRIES: usize = 8;

/// The codes after which kubelet keeps a volume "uncertain": it retries,
/// and unstages the volume when its pods go.
const NOT_FINAL: [Code; 5] = [
    Code::Cancelled,
    Code::DeadlineExceeded,
    Code::Unavailable,
    Code::ResourceExhausted,
    Code::Aborted,
];

/// Failpoint hooks are per process: the tests here take turns.
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Ext4,
    Xfs,
    Block,
}

const KINDS: [Kind; 3] = [Kind::Ext4, Kind::Xfs, Kind::Block];

impl Kind {
    fn capability(self) -> csi::VolumeCapability {
        match self {
            Kind::Ext4 => mount_capability("ext4", Mode::SingleNodeWriter),
            Kind::Xfs => mount_capability("xfs", Mode::SingleNodeWriter),
            Kind::Block => block_capability(Mode::SingleNodeWriter),
        }
    }
}

/// The steps of a stage in one emulation, DPU steps first.
fn stage_steps(emulation: &str) -> (&'static [&'static str], &'static [&'static str]) {
    let dpu: &[&str] = match emulation {
        "nvme" => &[
            "attach:create-device",
            "attach:nvme-subsystem",
            "attach:nvme-namespace-controller",
            "attach:nvme-attach",
            "attach:nvme-resume",
        ],
        _ => &["attach:create-device", "attach:virtio-controller"],
    };
    (
        dpu,
        &[
            "stage:attach",
            "stage:record",
            "stage:formatting",
            "stage:format",
            "stage:mount",
        ],
    )
}

const UNSTAGE_STEPS: [&str; 4] = [
    "unstage:unmount",
    "detach:unexpose",
    "detach:delete-device",
    "unstage:detach",
];

/// One volume of a case.
struct Volume {
    id: String,
    kind: Kind,
    emulation: &'static str,
    backing: PathBuf,
    staging: PathBuf,
    target: PathBuf,
}

impl Volume {
    fn new(stack: &NodeStack, id: String, kind: Kind, emulation: &'static str) -> Volume {
        let staging = stack.path(&format!("plugins/staging/{id}"));
        if kind != Kind::Block {
            std::fs::create_dir_all(&staging).unwrap();
        }
        Volume {
            backing: stack.backing_file(&format!("{id}.img"), SIZE),
            target: stack.path(&format!("pods/{id}/volume")),
            id,
            kind,
            emulation,
            staging,
        }
    }

    fn stage(&self) -> csi::NodeStageVolumeRequest {
        let mut request = stage_request(
            &self.id,
            &self.staging,
            self.kind.capability(),
            &self.backing,
        );
        request
            .volume_context
            .insert(EMULATION_KEY.into(), self.emulation.into());
        request
    }

    fn publish(&self, target: &std::path::Path) -> csi::NodePublishVolumeRequest {
        publish_request(
            &self.id,
            &self.staging,
            target,
            self.kind.capability(),
            false,
        )
    }

    fn unstage(&self) -> csi::NodeUnstageVolumeRequest {
        csi::NodeUnstageVolumeRequest {
            volume_id: self.id.clone(),
            staging_target_path: self.staging.display().to_string(),
        }
    }
}

/// Runs `call` until the step `step` is reached, restarts SNAP there (the
/// call waits at the step meanwhile), runs `meanwhile`, and returns the
/// call's answer.
async fn snap_killed_at<T: Send + 'static>(
    stack: &mut NodeStack,
    step: &'static str,
    call: impl Future<Output = Result<T, Status>> + Send + 'static,
    meanwhile: impl FnOnce(),
) -> Result<T, Status> {
    let (reached, at_step) = tokio::sync::oneshot::channel::<()>();
    let (go_on, released) = std::sync::mpsc::channel::<()>();
    snap_csi::failpoint::once(step, None, move || {
        let _ = reached.send(());
        // Until SNAP is back (or the test gave up: the sender dropped).
        let _ = released.recv();
    });
    let mut call = tokio::spawn(call);
    tokio::select! {
        reached = at_step => reached.expect("the hook ran"),
        answer = &mut call => panic!("{step} was never reached; the call answered {:?}", answer.unwrap().err()),
    }
    stack.emulator.restart_empty().await;
    meanwhile();
    go_on.send(()).unwrap();
    call.await.unwrap()
}

/// What a mkfs of `kind` cut short leaves on `backing`: its superblock, and
/// zeros where the headers after it go.
fn cut_short_mkfs(kind: Kind, backing: &std::path::Path) {
    use std::io::{Seek, SeekFrom, Write};
    let (mkfs, headers): (&[&str], u64) = match kind {
        Kind::Xfs => (&["mkfs.xfs", "-q"], 512),
        Kind::Ext4 => (&["mkfs.ext4", "-q", "-F"], 4096),
        Kind::Block => return,
    };
    let made = std::process::Command::new(mkfs[0])
        .args(&mkfs[1..])
        .arg(backing)
        .status()
        .unwrap();
    assert!(made.success(), "{mkfs:?}: {made}");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(backing)
        .unwrap();
    file.seek(SeekFrom::Start(headers)).unwrap();
    file.write_all(&[0; 64 << 10]).unwrap();
    file.sync_all().unwrap();
}

/// NodeStage retried as kubelet retries it after `first`, the answer of
/// the call SNAP crashed under: only after a code kubelet does not take as
/// final.
async fn stage_as_kubelet(
    node: &mut NodeClient<Channel>,
    volume: &Volume,
    what: &str,
    first: Result<(), Status>,
) {
    let mut answer = first;
    for _ in 0..TRIES {
        match answer {
            Ok(()) => return,
            Err(status) if NOT_FINAL.contains(&status.code()) => {
                println!(
                    "{what}: retrying after {:?}: {}",
                    status.code(),
                    status.message()
                );
            }
            Err(status) => panic!(
                "{what}: {:?} is final to kubelet, which then never unstages: {}",
                status.code(),
                status.message()
            ),
        }
        answer = node
            .node_stage_volume(timed(volume.stage(), CALL))
            .await
            .map(drop);
    }
    panic!("{what}: the stage did not converge in {TRIES} tries: {answer:?}");
}

/// Publishes at the volume's target, writes, reads back, unpublishes and
/// unstages; then nothing of the volume is left.
async fn use_and_clean_up(stack: &NodeStack, volume: &Volume, what: &str) {
    let mut node = stack.client.clone();
    node.node_publish_volume(timed(volume.publish(&volume.target), CALL))
        .await
        .unwrap_or_else(|e| panic!("{what}: publish: {e:?}"));
    let data = format!("written after {what}").into_bytes();
    write_volume(&volume.target, &data);
    assert_eq!(read_volume(&volume.target, data.len()), data, "{what}");
    unpublish(&mut node, &volume.id, &volume.target).await;
    unstage(&mut node, &volume.id, &volume.staging).await;
    stack.assert_nothing_left(&volume.backing).await;
}

async fn start(emulation: EmulationSetting) -> NodeStack {
    let tweaks = Tweaks {
        device_wait: Some(DEVICE_WAIT),
        ..Tweaks::default()
    };
    NodeStack::start_with(emulation, tweaks).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snap_killed_after_each_step_of_a_stage_heals_on_kubelets_retries() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut stack = start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let mut n = 0;
    for emulation in ["nvme", "virtio-blk"] {
        let (dpu, host) = stage_steps(emulation);
        // The DPU's steps do not depend on the volume's kind: each takes one
        // in turn. The node's do: each takes every kind it has.
        let cases = dpu
            .iter()
            .enumerate()
            .map(|(i, step)| (*step, KINDS[i % KINDS.len()], true))
            .chain(host.iter().flat_map(|step| {
                KINDS
                    .into_iter()
                    .filter(|kind| *kind != Kind::Block || !step.contains(":format"))
                    .filter(|kind| *kind != Kind::Block || !step.ends_with(":mount"))
                    .map(|kind| (*step, kind, true))
            }))
            // A stage SNAP crashed under after its mount answered OK: a
            // publish, with no stage again, meets the stale mount too.
            .chain([Kind::Ext4, Kind::Xfs].map(|kind| ("stage:mount", kind, false)));
        for (step, kind, stage_again) in cases.collect::<Vec<_>>() {
            n += 1;
            let what = format!("SNAP killed after {step}, {kind:?} on {emulation}");
            let volume = Volume::new(&stack, format!("pvc-{n}"), kind, emulation);
            let call = {
                let (mut node, request) = (node.clone(), timed(volume.stage(), CALL));
                async move { node.node_stage_volume(request).await.map(drop) }
            };
            // SNAP killed while mkfs writes leaves half a filesystem: one
            // that blkid names but that neither mounts nor checks clean.
            let cut_short = || {
                if step == "stage:formatting" {
                    cut_short_mkfs(kind, &volume.backing);
                }
            };
            let first = snap_killed_at(&mut stack, step, call, cut_short).await;
            println!("{what}: the stage answered {:?}", first.as_ref().err());
            stage_as_kubelet(&mut node, &volume, &what, first).await;
            if stage_again {
                node.node_stage_volume(timed(volume.stage(), CALL))
                    .await
                    .unwrap_or_else(|e| panic!("{what}: the stage again: {e:?}"));
            }
            use_and_clean_up(&stack, &volume, &what).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snap_killed_after_each_step_of_an_unstage_heals_on_kubelets_retries() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut stack = start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let mut n = 0;
    for emulation in ["nvme", "virtio-blk"] {
        for step in UNSTAGE_STEPS {
            n += 1;
            let what = format!("SNAP killed after {step} on {emulation}");
            let volume = Volume::new(&stack, format!("pvc-u{n}"), Kind::Ext4, emulation);
            node.node_stage_volume(timed(volume.stage(), CALL))
                .await
                .unwrap_or_else(|e| panic!("{what}: stage: {e:?}"));
            let call = {
                let (mut node, request) = (node.clone(), timed(volume.unstage(), CALL));
                async move { node.node_unstage_volume(request).await.map(drop) }
            };
            let mut answer = snap_killed_at(&mut stack, step, call, || ()).await;
            // kubelet retries an unstage whatever the code.
            for _ in 0..TRIES {
                let Err(status) = &answer else { break };
                println!(
                    "{what}: retrying after {:?}: {}",
                    status.code(),
                    status.message()
                );
                answer = node
                    .node_unstage_volume(timed(volume.unstage(), CALL))
                    .await
                    .map(drop);
            }
            answer.unwrap_or_else(|e| panic!("{what}: the unstage did not converge: {e:?}"));
            stack.assert_nothing_left(&volume.backing).await;
        }
    }
}

/// SNAP comes back empty after a volume was staged and published: kubelet
/// sends no stage (it believes the volume staged), only a publish for the
/// next pod. A filesystem's publish waits (ABORTED, naming the first pod's
/// mount) while the old filesystem is still mounted, then attaches the
/// volume again; a block volume's attaches it again at once. The data
/// written before the crash is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_after_snap_came_back_empty_attaches_the_volume_again() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut stack = start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let mut n = 0;
    for emulation in ["nvme", "virtio-blk"] {
        for kind in KINDS {
            n += 1;
            let what = format!("{kind:?} on {emulation}");
            let volume = Volume::new(&stack, format!("pvc-p{n}"), kind, emulation);
            node.node_stage_volume(timed(volume.stage(), CALL))
                .await
                .unwrap_or_else(|e| panic!("{what}: stage: {e:?}"));
            node.node_publish_volume(timed(volume.publish(&volume.target), CALL))
                .await
                .unwrap_or_else(|e| panic!("{what}: publish: {e:?}"));
            let before = format!("written before SNAP crashed, {what}").into_bytes();
            write_volume(&volume.target, &before);

            stack.emulator.restart_empty().await;
            let second = stack.path(&format!("pods/{}-2/volume", volume.id));
            let publish = volume.publish(&second);
            if kind != Kind::Block {
                let status = node
                    .node_publish_volume(timed(publish.clone(), CALL))
                    .await
                    .expect_err("the old filesystem is still mounted");
                assert_eq!(status.code(), Code::Aborted, "{what}: {status:?}");
                let first_pod = volume.target.display().to_string();
                for part in ["no longer shows", "still mounted at", first_pod.as_str()] {
                    assert!(
                        status.message().contains(part),
                        "{what}: {part:?} not in {status:?}"
                    );
                }
                assert_eq!(read_volume(&volume.target, before.len()), before, "{what}");
                unpublish(&mut node, &volume.id, &volume.target).await;
            }
            node.node_publish_volume(timed(publish, CALL))
                .await
                .unwrap_or_else(|e| panic!("{what}: the publish after SNAP came back: {e:?}"));
            assert_eq!(read_volume(&second, before.len()), before, "{what}");
            let after = format!("written after SNAP came back, {what}").into_bytes();
            write_volume(&second, &after);
            assert_eq!(read_volume(&second, after.len()), after, "{what}");

            if kind == Kind::Block {
                unpublish(&mut node, &volume.id, &volume.target).await;
            }
            unpublish(&mut node, &volume.id, &second).await;
            unstage(&mut node, &volume.id, &volume.staging).await;
            stack.assert_nothing_left(&volume.backing).await;
        }
    }
}
