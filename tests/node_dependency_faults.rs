//! The node's dependencies failing under it (catalogue scenario 7): the
//! vendor plugin or SNAP down, stuck (answering after the caller's deadline),
//! or answering bytes that are not its protocol. Every node call that needs
//! the dependency ends within kubelet's deadline with UNAVAILABLE or
//! DEADLINE_EXCEEDED and a message naming it; Probe says not ready (and is
//! not an error, so kubelet does not restart a healthy node); when the
//! dependency is back, Probe turns ready and the same calls converge, with
//! no restart of the node.
//!
//! Real stack: the SNAP emulator (its faults switched on through
//! `snap_emu::Faults`), the test vendor plugin, the node over real gRPC; in
//! a split-mode run, through a DPU agent over mutual TLS.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::node::{
    NodeStack, connect, mount_capability, stage_and_publish, stage_request, unpublish, unstage,
};
use common::timed;
use snap_csi::node::config::EmulationSetting;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::identity_client::IdentityClient;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::Code;

/// The deadline kubelet gives each call here.
const KUBELET_TIMEOUT: Duration = Duration::from_secs(4);
/// How long recovery may take once the dependency is back.
const RECOVERY: Duration = Duration::from_secs(30);
const SIZE: u64 = 64 << 20;

/// What fails, and how.
#[derive(Debug, Clone, Copy)]
enum Fault {
    PluginDown,
    PluginStuck,
    PluginGarbage,
    SnapDown,
    SnapStuck,
    SnapGarbage,
}

impl Fault {
    fn snap(self) -> bool {
        matches!(
            self,
            Fault::SnapDown | Fault::SnapStuck | Fault::SnapGarbage
        )
    }
}

/// A socket that answers every connection with bytes that are not HTTP/2
/// (another program where the plugin should listen), then closes it.
struct GarbageSocket {
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl GarbageSocket {
    fn bind(path: &Path) -> GarbageSocket {
        let _ = std::fs::remove_file(path);
        let listener = tokio::net::UnixListener::bind(path).unwrap();
        let task = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            while let Ok((mut stream, _)) = listener.accept().await {
                let _ = stream
                    .write_all(b"\x00\xffnot-http2-not-grpc\r\n\r\n")
                    .await;
            }
        });
        GarbageSocket {
            path: path.to_path_buf(),
            task,
        }
    }
}

impl Drop for GarbageSocket {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

struct Scene {
    stack: NodeStack,
    identity: IdentityClient<tonic::transport::Channel>,
    garbage: Option<GarbageSocket>,
}

impl Scene {
    async fn inject(&mut self, fault: Fault) {
        let faults = &self.stack.emulator.faults;
        match fault {
            Fault::PluginDown => self.stack.stop_plugin().await,
            Fault::PluginStuck => self.stack.plugin.as_ref().unwrap().stall(true),
            Fault::PluginGarbage => {
                let socket = self.stack.config.plugin_socket.clone();
                self.stack.stop_plugin().await;
                self.garbage = Some(GarbageSocket::bind(&socket));
            }
            Fault::SnapDown => faults.begin_live_update().await,
            Fault::SnapStuck => faults.hold(),
            Fault::SnapGarbage => faults.garble(true),
        }
    }

    async fn lift(&mut self, fault: Fault) {
        let faults = &self.stack.emulator.faults;
        match fault {
            Fault::PluginDown => self.stack.restart_plugin().await,
            Fault::PluginStuck => self.stack.plugin.as_ref().unwrap().stall(false),
            Fault::PluginGarbage => {
                self.garbage = None;
                self.stack.restart_plugin().await;
            }
            Fault::SnapDown => faults.end_live_update().await,
            Fault::SnapStuck => faults.release(),
            Fault::SnapGarbage => faults.garble(false),
        }
    }

    /// What a message about the fault must name: the dependency and where it is.
    fn named(&self, fault: Fault) -> (String, String) {
        if fault.snap() {
            (
                "SNAP".into(),
                self.stack.emulator.socket.display().to_string(),
            )
        } else {
            (
                "vendor plugin".into(),
                self.stack.config.plugin_socket.display().to_string(),
            )
        }
    }

    /// The client enforces the deadline it sends, so an answer is one that
    /// came within it.
    async fn ready(&mut self) -> bool {
        let probe = self
            .identity
            .probe(timed(csi::ProbeRequest {}, KUBELET_TIMEOUT))
            .await
            .expect("Probe answers within its deadline, ready or not");
        probe.into_inner().ready == Some(true)
    }
}

/// Asserts that `call` failed as a dependency failure should: in time, with
/// UNAVAILABLE or DEADLINE_EXCEEDED, naming the dependency and its socket.
/// In time is the client's own event: it enforces the deadline it sent
/// (tonic answers CANCELLED "Timeout expired" when its timer wins), so a
/// status the node sent is one that came before the deadline.
fn assert_dependency_failure<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, tonic::Status>,
    (dependency, socket): &(String, String),
) {
    let status = result.expect_err(what);
    assert!(
        matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded)
            && !snap_csi::grpc::unanswered(&status),
        "{what}: not the node's answer within the deadline: {status:?}"
    );
    assert!(
        status.message().contains(dependency.as_str())
            && status.message().contains(socket.as_str()),
        "{what}: the message names neither {dependency} nor {socket}: {status:?}"
    );
}

async fn timed_call<T>(call: impl Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    let out = call.await;
    (out, started.elapsed())
}

async fn survives(fault: Fault) {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let identity = IdentityClient::new(connect(&stack.config.endpoint).await);
    let mut scene = Scene {
        stack,
        identity,
        garbage: None,
    };
    let mut node = scene.stack.client.clone();
    let capability = mount_capability("ext4", Mode::SingleNodeWriter);
    // One volume staged and published before the fault, one new.
    let old_backing = scene.stack.backing_file("old.img", SIZE);
    let old_staging = scene.stack.path("staging/pvc-old");
    std::fs::create_dir_all(&old_staging).unwrap();
    let old_target = scene.stack.path("pods/a/volumes/pvc-old");
    stage_and_publish(
        &mut node,
        "pvc-old",
        (&old_staging, &old_target),
        capability.clone(),
        &old_backing,
        false,
    )
    .await;
    let new_backing = scene.stack.backing_file("new.img", SIZE);
    let new_staging = scene.stack.path("staging/pvc-new");
    std::fs::create_dir_all(&new_staging).unwrap();
    assert!(scene.ready().await, "ready before the fault");

    scene.inject(fault).await;
    let named = scene.named(fault);
    let stage = stage_request("pvc-new", &new_staging, capability.clone(), &new_backing);
    let result = node
        .node_stage_volume(timed(stage.clone(), KUBELET_TIMEOUT))
        .await;
    assert_dependency_failure("NodeStageVolume", result, &named);

    // Unpublish is the host's alone; unstage needs the DPU.
    unpublish(&mut node, "pvc-old", &old_target).await;
    let unstage_request = csi::NodeUnstageVolumeRequest {
        volume_id: "pvc-old".into(),
        staging_target_path: old_staging.display().to_string(),
    };
    let result = node
        .node_unstage_volume(timed(unstage_request.clone(), KUBELET_TIMEOUT))
        .await;
    assert_dependency_failure("NodeUnstageVolume", result, &named);
    if fault.snap() {
        // The plugin's description is kept, so only SNAP's listing is asked.
        let result = node
            .node_get_info(timed(csi::NodeGetInfoRequest {}, KUBELET_TIMEOUT))
            .await;
        assert_dependency_failure("NodeGetInfo", result, &named);
    }
    assert!(!scene.ready().await, "Probe says not ready under {fault:?}");

    scene.lift(fault).await;
    let recovering = Instant::now();
    while !scene.ready().await {
        assert!(
            recovering.elapsed() < RECOVERY,
            "not ready {RECOVERY:?} after {fault:?} ended"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The same calls converge, on the same node process.
    node.node_unstage_volume(timed(unstage_request, KUBELET_TIMEOUT))
        .await
        .expect("the unstage converges");
    node.node_stage_volume(timed(stage, KUBELET_TIMEOUT))
        .await
        .expect("the stage converges");
    let new_target = scene.stack.path("pods/b/volumes/pvc-new");
    stage_and_publish(
        &mut node,
        "pvc-new",
        (&new_staging, &new_target),
        capability,
        &new_backing,
        false,
    )
    .await;
    unpublish(&mut node, "pvc-new", &new_target).await;
    unstage(&mut node, "pvc-new", &new_staging).await;
    scene.stack.assert_nothing_left(&old_backing).await;
    scene.stack.assert_nothing_left(&new_backing).await;
}

/// One test per fault, each on a stack of its own.
macro_rules! faults {
    ($($test:ident: $fault:ident,)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            survives(Fault::$fault).await;
        }
    )*};
}

faults! {
    the_vendor_plugin_down: PluginDown,
    the_vendor_plugin_stuck: PluginStuck,
    the_vendor_plugin_answering_garbage: PluginGarbage,
    snap_down: SnapDown,
    snap_stuck: SnapStuck,
    snap_answering_garbage: SnapGarbage,
}

/// How long the node waits for a disk in the missing-disk test (its
/// `--device-wait`, 30 s by default), short to keep the test quick.
const DEVICE_WAIT: Duration = Duration::from_secs(2);

/// The disk of a volume never appears on the host (catalogue scenario 8: a
/// missed AEN, a hot-plug that does not happen). The stage waits its
/// device-wait setting, not kubelet's whole deadline, says which device is
/// missing, and leaves what it did for the retry: one attachment, no mount.
/// Retried while the disk is still missing it fails the same way and makes
/// nothing twice; after the host finds the disk (a rescan) it converges. A
/// volume unstaged without its disk ever appearing leaves nothing, and the
/// disk does not turn up later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_the_host_never_sees_fails_the_stage_in_time_and_the_retry_converges() {
    for emulation in [EmulationSetting::Nvme, EmulationSetting::VirtioBlk] {
        let tweaks = common::node::Tweaks {
            device_wait: Some(DEVICE_WAIT),
            ..Default::default()
        };
        let stack = NodeStack::start_with(emulation, tweaks).await;
        let mut node = stack.client.clone();
        let faults = &stack.emulator.faults;
        let capability = mount_capability("ext4", Mode::SingleNodeWriter);
        for (volume_id, unstaged_missing) in [("pvc-late", false), ("pvc-never", true)] {
            let names = snap_csi::dpu::names::VolumeNames::new(volume_id);
            let identity = match emulation {
                EmulationSetting::Nvme => names.namespace_uuid.clone(),
                EmulationSetting::VirtioBlk => names.serial.clone(),
                EmulationSetting::VirtioFs => unreachable!("a block emulation"),
            };
            let backing = stack.backing_file(&format!("{volume_id}.img"), SIZE);
            let staging = stack.path(&format!("staging/{volume_id}"));
            std::fs::create_dir_all(&staging).unwrap();
            let stage = stage_request(volume_id, &staging, capability.clone(), &backing);
            faults.miss_discovery(&identity);
            for attempt in 0..2 {
                let (result, took) =
                    timed_call(node.node_stage_volume(timed(stage.clone(), 5 * DEVICE_WAIT))).await;
                let status = result.expect_err("no disk, no stage");
                assert!(
                    matches!(status.code(), Code::DeadlineExceeded | Code::Unavailable),
                    "{emulation:?} attempt {attempt}: {status:?}"
                );
                assert!(
                    status.message().contains(&identity),
                    "the message names the missing device: {status:?}"
                );
                assert!(
                    // It waited (half the wait, as it gives up when the next
                    // look would come too late), and gave up by its own
                    // setting, not at kubelet's deadline (five waits): a
                    // loaded machine may add seconds to the calls around
                    // the wait, not three waits.
                    took >= DEVICE_WAIT / 2 && took < 4 * DEVICE_WAIT,
                    "{emulation:?} attempt {attempt}: gave up after {took:?}, waiting {DEVICE_WAIT:?}"
                );
                // Exposed once, on no host device, mounted nowhere: what a
                // retry continues.
                common::node::assert_exposed_once(&stack).await;
                assert!(common::loop_devices_of(&backing).is_empty());
                assert!(common::node::mounts_under(&staging).is_empty());
            }
            if unstaged_missing {
                unstage(&mut node, volume_id, &staging).await;
                stack.assert_nothing_left(&backing).await;
                // A rescan after the unstage finds nothing to show.
                faults.rescan(&identity);
                stack.assert_nothing_left(&backing).await;
                continue;
            }
            faults.rescan(&identity);
            node.node_stage_volume(timed(stage, 5 * DEVICE_WAIT))
                .await
                .expect("the retry after the disk appeared converges");
            common::node::assert_attached_once(&stack, &backing, &staging, false).await;
            let target = stack.path(&format!("pods/p/volumes/{volume_id}"));
            stage_and_publish(
                &mut node,
                volume_id,
                (&staging, &target),
                capability.clone(),
                &backing,
                false,
            )
            .await;
            unpublish(&mut node, volume_id, &target).await;
            unstage(&mut node, volume_id, &staging).await;
            stack.assert_nothing_left(&backing).await;
        }
    }
}
