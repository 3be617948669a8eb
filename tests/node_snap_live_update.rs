//! SNAP restarting under staged volumes with I/O running (catalogue
//! scenario 6): a live update, in which a new SNAP process takes over the
//! controllers of the old one (DOCA SNAP-4's live update; its crash recovery
//! likewise needs every controller re-created with the same configuration).
//! The host keeps its disks, SNAP's JSON-RPC socket is gone for a while, and
//! the calls in flight on it are lost.
//!
//! Proved here: the data written to every volume before and during the
//! update is intact afterwards, read back after a restage (through a new
//! loop device, from the backing file, not the page cache); the node does
//! nothing to the volumes because SNAP went away (no unmount, no detach);
//! node calls made during the update converge once SNAP is back, with
//! nothing duplicated; and Probe reports the gap.
//!
//! What the emulator does not prove (see `snap_emu::faults`): it carries
//! SNAP's state across the gap in memory instead of a new process rebuilding
//! it from its configuration, and the host's I/O never passes through it
//! (the kernel serves the loop devices), so I/O that a real SNAP pauses and
//! resumes during the switch, and the host driver's timeouts while it waits,
//! are not exercised. A SNAP that comes back empty (a crash without
//! recovery) is another scenario: the volumes' controllers are gone and
//! only a restage can bring them back.

mod common;

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::node::{
    NodeStack, block_capability, connect, mount_capability, mounts_under, publish_request,
    stage_request, unpublish, unstage,
};
use common::timed;
use snap_csi::node::config::EmulationSetting;
use snap_csi::node::service::EMULATION_KEY;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::identity_client::IdentityClient;
use snap_csi::proto::csi::v1::node_client::NodeClient;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use snap_csi::spdk::snap::{NvmeSubsystemList, VirtioBlkControllerList};
use tonic::transport::Channel;

const SIZE: u64 = 64 << 20;
/// Records of the ring each writer fills over and over.
const SLOTS: u64 = 256;
const RECORD: usize = 4096;
/// Where a block volume's ring starts (past anything a probe might read).
const BLOCK_OFFSET: u64 = 1 << 20;
/// How many records each writer must complete while SNAP is away.
const DURING: u64 = 64;
const BOUND: Duration = Duration::from_secs(60);

/// Record `n`: its number, then bytes derived from it; the slot is `n % SLOTS`.
fn record(n: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; RECORD];
    bytes[..8].copy_from_slice(&n.to_le_bytes());
    let mut x = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for b in &mut bytes[8..] {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    bytes
}

/// One volume under test.
struct Volume {
    id: &'static str,
    block: bool,
    emulation: &'static str,
    backing: PathBuf,
    staging: PathBuf,
    target: PathBuf,
}

impl Volume {
    fn new(stack: &NodeStack, id: &'static str, emulation: &'static str, block: bool) -> Volume {
        let staging = stack.path(&format!("staging/{id}"));
        if !block {
            std::fs::create_dir_all(&staging).unwrap();
        }
        Volume {
            id,
            block,
            emulation,
            backing: stack.backing_file(&format!("{id}.img"), SIZE),
            staging,
            target: stack.path(&format!("pods/p/volumes/{id}")),
        }
    }

    fn capability(&self) -> csi::VolumeCapability {
        if self.block {
            block_capability(Mode::SingleNodeWriter)
        } else {
            mount_capability("ext4", Mode::SingleNodeWriter)
        }
    }

    fn stage(&self) -> csi::NodeStageVolumeRequest {
        let mut request = stage_request(self.id, &self.staging, self.capability(), &self.backing);
        request
            .volume_context
            .insert(EMULATION_KEY.into(), self.emulation.into());
        request
    }

    async fn stage_and_publish(&self, node: &mut NodeClient<Channel>) {
        node.node_stage_volume(self.stage())
            .await
            .unwrap_or_else(|e| panic!("stage {}: {e:?}", self.id));
        node.node_publish_volume(publish_request(
            self.id,
            &self.staging,
            &self.target,
            self.capability(),
            false,
        ))
        .await
        .unwrap_or_else(|e| panic!("publish {}: {e:?}", self.id));
    }

    /// The file (or device) the ring lives in, and where in it.
    fn ring(&self) -> (PathBuf, u64) {
        if self.block {
            (self.target.clone(), BLOCK_OFFSET)
        } else {
            (self.target.join("ring.bin"), 0)
        }
    }

    /// Every slot holds the last record written to it (`written` records in
    /// all, numbered from 0), byte for byte.
    fn verify(&self, written: u64) {
        let (path, base) = self.ring();
        let mut file = File::open(&path).unwrap();
        for slot in 0..SLOTS.min(written) {
            let last = slot + (written - 1 - slot) / SLOTS * SLOTS;
            let mut bytes = vec![0u8; RECORD];
            file.seek(SeekFrom::Start(base + slot * RECORD as u64))
                .unwrap();
            file.read_exact(&mut bytes).unwrap();
            assert!(
                bytes == record(last),
                "{}: slot {slot} does not hold record {last}",
                self.id
            );
        }
    }
}

/// Writes records round the ring and syncs each, until stopped; `done`
/// counts the records on stable storage.
struct Writer {
    done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Writer {
    fn start(volume: &Volume) -> Writer {
        let (path, base) = volume.ring();
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (counter, stopped) = (Arc::clone(&done), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .unwrap();
            let mut n = 0;
            while !stopped.load(Ordering::SeqCst) {
                file.write_all_at(&record(n), base + (n % SLOTS) * RECORD as u64)
                    .unwrap();
                file.sync_data().unwrap();
                n += 1;
                counter.store(n, Ordering::SeqCst);
            }
        });
        Writer { done, stop, thread }
    }

    /// Waits until `more` records beyond `from` are on stable storage.
    fn until(&self, from: u64, more: u64) {
        let started = Instant::now();
        while self.done.load(Ordering::SeqCst) < from + more {
            assert!(started.elapsed() < BOUND, "the I/O stopped");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn finish(self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap();
        self.done.load(Ordering::SeqCst)
    }
}

/// How many controllers SNAP has, of both emulations.
async fn controllers(stack: &NodeStack) -> usize {
    let snap = stack.emulator.client();
    let nvme: usize = snap
        .call(&NvmeSubsystemList {})
        .await
        .unwrap()
        .iter()
        .map(|s| s.controllers.len())
        .sum();
    nvme + snap.call(&VirtioBlkControllerList {}).await.unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snap_live_update_keeps_every_volume_and_the_calls_around_it_converge() {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let mut identity = IdentityClient::new(connect(&stack.config.endpoint).await);
    let volumes = [
        Volume::new(&stack, "pvc-nvme-fs", "nvme", false),
        Volume::new(&stack, "pvc-vblk-fs", "virtio-blk", false),
        Volume::new(&stack, "pvc-nvme-block", "nvme", true),
    ];
    for volume in &volumes {
        volume.stage_and_publish(&mut node).await;
    }
    let mounts_before = mounts_under(&stack.kubelet).len();
    let writers: Vec<Writer> = volumes.iter().map(Writer::start).collect();
    for writer in &writers {
        writer.until(0, SLOTS);
    }

    stack.emulator.faults.begin_live_update().await;
    // A stage of a staged volume (kubelet retrying) and of a new one, both
    // needing SNAP: they wait inside their deadline.
    let late = Volume::new(&stack, "pvc-during", "nvme", false);
    let restage = tokio::spawn({
        let mut node = node.clone();
        let request = volumes[0].stage();
        async move { node.node_stage_volume(timed(request, BOUND)).await }
    });
    let new_stage = tokio::spawn({
        let mut node = node.clone();
        let request = late.stage();
        async move { node.node_stage_volume(timed(request, BOUND)).await }
    });
    // I/O goes on, and publishing needs no SNAP.
    let positions: Vec<u64> = writers
        .iter()
        .map(|w| w.done.load(Ordering::SeqCst))
        .collect();
    for (writer, from) in writers.iter().zip(&positions) {
        writer.until(*from, DURING);
    }
    // (Of another volume: the restage holds its own.)
    let second = stack.path("pods/q/volumes/pvc-vblk-fs");
    node.node_publish_volume(publish_request(
        volumes[1].id,
        &volumes[1].staging,
        &second,
        volumes[1].capability(),
        true,
    ))
    .await
    .expect("a publish needs no SNAP");
    let probe = identity
        .probe(timed(csi::ProbeRequest {}, Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(probe.into_inner().ready, Some(false), "SNAP is away");
    assert!(
        !restage.is_finished() && !new_stage.is_finished(),
        "nothing answers for SNAP while it is away"
    );
    stack.emulator.faults.end_live_update().await;

    restage
        .await
        .unwrap()
        .expect("the restage converges after the update");
    new_stage
        .await
        .unwrap()
        .expect("the new stage converges after the update");
    assert_eq!(
        controllers(&stack).await,
        volumes.len() + 1,
        "one controller per volume, none made twice"
    );
    assert_eq!(
        mounts_under(&stack.kubelet).len(),
        mounts_before + 2,
        "the update unmounted nothing (two mounts added since)"
    );
    let written: Vec<u64> = writers.into_iter().map(Writer::finish).collect();
    for (volume, written) in volumes.iter().zip(&written) {
        volume.verify(*written);
    }

    // Every later call converges; the data is on the volumes, not in a cache.
    unpublish(&mut node, volumes[1].id, &second).await;
    for (volume, written) in volumes.iter().zip(&written) {
        unpublish(&mut node, volume.id, &volume.target).await;
        unstage(&mut node, volume.id, &volume.staging).await;
        volume.stage_and_publish(&mut node).await;
        volume.verify(*written);
        println!("{}: {written} records verified", volume.id);
        unpublish(&mut node, volume.id, &volume.target).await;
        unstage(&mut node, volume.id, &volume.staging).await;
    }
    late.stage_and_publish(&mut node).await;
    unpublish(&mut node, late.id, &late.target).await;
    unstage(&mut node, late.id, &late.staging).await;
    for volume in volumes.iter().chain([&late]) {
        stack.assert_nothing_left(&volume.backing).await;
    }
}
