//! Volumes whose NodeUnstage never came (issue 11's scenario 4: the pod was
//! force-deleted, the node out of service), on the real stack. At start the
//! node reports every staged volume that nothing under the kubelet
//! directory uses (`snap_csi_orphaned_volumes`, a log line each) and leaves
//! it; with `--unstage-orphans` it unstages them. A published volume is
//! never one of them.
//!
//! One test in its own binary: the metrics registry is process-wide, and a
//! node started by another test in the same process would count too.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::loop_devices_of;
use common::node::{
    NodeStack, block_capability, mount_capability, mounts_under, read_volume, scrape,
    stage_and_publish, unpublish, unstage, write_volume,
};
use snap_csi::dpu::names::VolumeNames;
use snap_csi::node::config::EmulationSetting;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use snap_csi::spdk::snap::NvmeSubsystemList;

const SIZE: u64 = 64 << 20;

/// Everything logged in this process (the node runs in it), as text.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn capture() -> Log {
        let log = Log::default();
        let writer = log.clone();
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .init();
        log
    }

    /// The lines logged since `from` (a length of the log) that say `what`.
    fn lines(&self, from: usize, what: &str) -> Vec<String> {
        let text = self.0.lock().unwrap()[from..].to_vec();
        String::from_utf8(text)
            .unwrap()
            .lines()
            .filter(|l| l.contains(what))
            .map(str::to_string)
            .collect()
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// The node's `snap_csi_orphaned_volumes`.
async fn orphaned(stack: &NodeStack) -> i64 {
    let page = scrape(stack.config.metrics_address.unwrap()).await;
    page.lines()
        .find_map(|l| l.strip_prefix("snap_csi_orphaned_volumes "))
        .unwrap_or_else(|| panic!("no snap_csi_orphaned_volumes in:\n{page}"))
        .trim()
        .parse()
        .unwrap()
}

/// The volumes SNAP exposes, by the NQN derived from their ids.
async fn exposed(stack: &NodeStack, volume_ids: &[&str]) -> Vec<String> {
    let subsystems = stack
        .emulator
        .client()
        .call(&NvmeSubsystemList {})
        .await
        .unwrap();
    volume_ids
        .iter()
        .filter(|id| {
            let nqn = VolumeNames::new(id).nqn;
            subsystems.iter().any(|s| s.nqn == nqn)
        })
        .map(|id| id.to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_reported_and_unstaged_only_when_asked_and_never_a_published_volume() {
    let log = Log::capture();
    let mut stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let filesystem = mount_capability("ext4", Mode::SingleNodeWriter);
    let block = block_capability(Mode::SingleNodeWriter);
    // Two published volumes and two whose pods went without an unpublish
    // and unstage (force-deleted: kubelet's pod directories are gone too).
    let volumes = [
        ("pvc-pub-fs", filesystem.clone(), true),
        ("pvc-pub-blk", block.clone(), true),
        ("pvc-orphan-fs", filesystem.clone(), false),
        ("pvc-orphan-blk", block.clone(), false),
    ];
    let (kubelet, root) = (stack.kubelet.clone(), stack.emulator.root().to_path_buf());
    let staging = |id: &str| kubelet.join("plugins/staging").join(id);
    let target = |id: &str| kubelet.join("pods").join(id).join("volume");
    let backing = |id: &str| root.join(format!("{id}.img"));
    for (id, capability, _) in &volumes {
        stack.backing_file(&format!("{id}.img"), SIZE);
        std::fs::create_dir_all(staging(id)).unwrap();
        std::fs::create_dir_all(target(id).parent().unwrap()).unwrap();
        stage_and_publish(
            &mut node,
            id,
            (&staging(id), &target(id)),
            capability.clone(),
            &backing(id),
            false,
        )
        .await;
        write_volume(&target(id), id.as_bytes());
    }
    for (id, _, published) in &volumes {
        if !published {
            // What a force delete leaves: the pod's mount gone, no NodeUnstage.
            nix::mount::umount2(&target(id), nix::mount::MntFlags::MNT_DETACH).unwrap();
        }
    }
    let all: Vec<&str> = volumes.iter().map(|(id, _, _)| *id).collect();
    let orphans = ["pvc-orphan-fs", "pvc-orphan-blk"];

    // Reported, and left as they are.
    let start = log.len();
    stack.restart_node(|_| {}).await;
    assert_eq!(orphaned(&stack).await, 2);
    let reported = log.lines(start, "nothing under the kubelet directory uses it");
    assert_eq!(reported.len(), 2, "one line per orphan: {reported:#?}");
    for id in orphans {
        assert!(
            reported
                .iter()
                .any(|l| l.contains(&format!("volume_id={id}"))),
            "{id} not reported: {reported:#?}"
        );
    }
    assert_eq!(stack.records(), 4);
    assert_eq!(exposed(&stack, &all).await, all);
    assert_eq!(mounts_under(&staging("pvc-orphan-fs")).len(), 1);

    // Unstaged when asked; the published volumes stay as they were.
    stack.restart_node(|c| c.unstage_orphans = true).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while orphaned(&stack).await != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the orphans were not unstaged"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(stack.records(), 2);
    assert_eq!(
        exposed(&stack, &all).await,
        ["pvc-pub-fs", "pvc-pub-blk"],
        "the orphans are detached from SNAP, the published volumes are not"
    );
    for id in orphans {
        assert!(
            loop_devices_of(&backing(id)).is_empty(),
            "{id} is on the host"
        );
        assert!(mounts_under(&staging(id)).is_empty(), "{id} is mounted");
    }
    node = stack.client.clone();
    for (id, _, published) in &volumes {
        if *published {
            let data = read_volume(&target(id), id.len());
            assert_eq!(data, id.as_bytes(), "{id} is still published");
            unpublish(&mut node, id, &target(id)).await;
        }
        unstage(&mut node, id, &staging(id)).await;
    }
    let last = backing("pvc-pub-fs");
    stack.assert_nothing_left(Path::new(&last)).await;
    for id in all {
        assert!(
            loop_devices_of(&backing(id)).is_empty(),
            "{id} is on the host"
        );
    }
}
