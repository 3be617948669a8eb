//! Section 2: what the kernel and the wire cost at the least, measured by
//! the bench itself in the same run, so that each RPC can be stated as a
//! multiple of its floor on however noisy a machine.
//!
//! - Empty gRPC round trip and JSON-RPC round trip (`probe.rs`); for
//!   comparison the node's own GetPluginCapabilities (no I/O, but its tower
//!   layers and runtime).
//! - Bind mount: what publish and unpublish must do at the least, on the
//!   same kind of paths: create the target (a directory for a filesystem
//!   volume, a file for a block one), bind-mount the source onto it (the
//!   staged filesystem's mount point; the published device node), and
//!   unmount and remove it.
//!
//! Then the node's own NodePublish and NodeUnpublish, repeated on one
//! filesystem and one block volume.
//!
//! Every iteration takes one sample of each, in turn, so that background
//! load (a CI run on the same two cores) falls on floors and RPCs alike:
//! each RPC sample is divided by the floor sampled in the same iteration
//! just before it, and the target is on the median quotient (`Paired`).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use serde::Serialize;
use snap_csi::proto::csi::v1::identity_client::IdentityClient;

use crate::csi::{Clients, Kind, channel};
use crate::probe::{Probe, capabilities};
use crate::prom::scrape;
use crate::stack::Stack;
use crate::stats::{Paired, Summary};

#[derive(Debug, Clone, Serialize)]
pub struct Floors {
    /// The bench's own trivial server: the floor.
    pub grpc_empty: Summary,
    /// The node's GetPluginCapabilities, for comparison.
    pub node_get_plugin_capabilities: Summary,
    pub jsonrpc_round_trip: Summary,
    /// mkdir + bind mount of a mounted filesystem onto it.
    pub publish_dir: Summary,
    /// umount + rmdir.
    pub unpublish_dir: Summary,
    /// create an empty file + bind mount of a device node onto it.
    pub publish_file: Summary,
    /// umount + unlink.
    pub unpublish_file: Summary,
    /// The mount(2) and umount2(2) calls alone, directory case.
    pub bind_alone: Summary,
    pub umount_alone: Summary,
    /// rmdir alone, right after the unmount.
    pub rmdir_alone: Summary,
    /// The node's own publish and unpublish, repeated on one staged volume
    /// of each kind, interleaved with the floors (many more samples than
    /// section 1 has).
    pub node_publish_block: Summary,
    pub node_unpublish_block: Summary,
    pub node_publish_fs: Summary,
    pub node_unpublish_fs: Summary,
    /// Of those, the mean time by the node's own clock (its gRPC layer).
    pub node_served_publish_ms: f64,
    pub node_served_unpublish_ms: f64,
    /// Each of the node's calls above against its floor sampled in the same
    /// iteration: gRPC + create + bind (publish), gRPC + umount + remove
    /// (unpublish).
    pub publish_block_ratio: Paired,
    pub unpublish_block_ratio: Paired,
    pub publish_fs_ratio: Paired,
    pub unpublish_fs_ratio: Paired,
}

/// Publish's and unpublish's least work, once: create the target, bind
/// `source` onto it; unmount it, remove it. Returns (create + bind,
/// unmount + remove, bind alone, unmount alone, remove alone).
fn bind_cycle(source: &Path, target: &Path, directory: bool) -> anyhow::Result<[Duration; 5]> {
    let started = Instant::now();
    if directory {
        std::fs::create_dir(target)?;
    } else {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(target)?;
    }
    let bind_started = Instant::now();
    let mounted = mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    );
    let bound = Instant::now();
    mounted.with_context(|| format!("bind {} at {}", source.display(), target.display()))?;
    let umount_started = Instant::now();
    let unmounted = umount2(target, MntFlags::UMOUNT_NOFOLLOW);
    let umount_done = Instant::now();
    unmounted.with_context(|| format!("unmount {}", target.display()))?;
    if directory {
        std::fs::remove_dir(target)?;
    } else {
        std::fs::remove_file(target)?;
    }
    let done = Instant::now();
    Ok([
        bound - started,
        done - umount_started,
        bound - bind_started,
        umount_done - umount_started,
        done - umount_done,
    ])
}

/// Every sample, by what it measures.
#[derive(Debug, Default)]
struct Samples {
    grpc_empty: Vec<Duration>,
    node_capabilities: Vec<Duration>,
    jsonrpc: Vec<Duration>,
    dir: [Vec<Duration>; 5],
    file: [Vec<Duration>; 5],
    /// publish block, unpublish block, publish fs, unpublish fs.
    node: [Vec<Duration>; 4],
}

/// Measures every floor on `stack`, `iterations` samples of each, with one
/// filesystem and one block volume staged: the filesystem's staging mount
/// is the directory floor's source, the block volume published at one target
/// is the file floor's source while the node publishes it at another.
pub async fn run(
    stack: &Stack,
    clients: &Clients,
    work: &Path,
    fs: &str,
    size_mib: i64,
    iterations: usize,
) -> anyhow::Result<Floors> {
    let mut probe = Probe::start(work.join("empty-grpc.sock"), &stack.snap_socket()).await?;
    let mut node_identity = IdentityClient::new(channel(&stack.node).await?);

    let mut clients = clients.clone();
    let kubelet = stack.kubelet.clone();
    let fs_volume = clients
        .create(
            &kubelet,
            "floor-fs",
            &Kind::Filesystem(fs.to_string()),
            size_mib,
        )
        .await?;
    let block_volume = clients
        .create(&kubelet, "floor-block", &Kind::Block, size_mib)
        .await?;
    clients.stage(&fs_volume).await?;
    clients.stage(&block_volume).await?;
    clients.publish(&block_volume).await?;
    // The same volume at a second target, as for a second pod.
    let mut block_again = block_volume.clone();
    block_again.target = block_volume.target.with_file_name("again");
    let floor_dir = kubelet.join("pods/bench-floor");
    std::fs::create_dir_all(&floor_dir)?;
    let (dir_target, file_target) = (floor_dir.join("dir"), floor_dir.join("file"));

    let mut samples = Samples::default();
    let before = scrape(&stack.node_metrics).await?;
    let measured = async {
        // The first tenth warms up connections and caches, unrecorded.
        for i in 0..iterations + iterations / 10 {
            let keep = i >= iterations / 10;
            let floor = probe.sample().await?;
            let node = capabilities(&mut node_identity).await?;
            let dir = bind_cycle(&fs_volume.staging, &dir_target, true)?;
            let file = bind_cycle(&block_volume.target, &file_target, false)?;
            let mut rpcs = [Duration::ZERO; 4];
            for (volume, at) in [(&block_again, 0), (&fs_volume, 2)] {
                let started = Instant::now();
                clients.publish(volume).await?;
                let published = Instant::now();
                clients.unpublish(volume).await?;
                rpcs[at] = published - started;
                rpcs[at + 1] = published.elapsed();
            }
            if keep {
                samples.grpc_empty.push(floor.grpc);
                samples.node_capabilities.push(node);
                samples.jsonrpc.push(floor.jsonrpc);
                for (into, sample) in samples.dir.iter_mut().zip(dir) {
                    into.push(sample);
                }
                for (into, sample) in samples.file.iter_mut().zip(file) {
                    into.push(sample);
                }
                for (into, sample) in samples.node.iter_mut().zip(rpcs) {
                    into.push(sample);
                }
            }
        }
        anyhow::Ok(())
    }
    .await;
    let after = scrape(&stack.node_metrics).await?;
    drop(probe);
    // Tear down before looking at the outcome: nothing stays mounted.
    let _ = std::fs::remove_dir(&floor_dir);
    clients.unpublish(&block_volume).await?;
    clients.unstage(&block_volume).await?;
    clients.unstage(&fs_volume).await?;
    clients.delete(&block_volume).await?;
    clients.delete(&fs_volume).await?;
    measured?;
    // By the node's own clock, warm-up included: mean per call.
    let served_ms = |method: &str| {
        let sum = |page: &crate::prom::Page, name: &str| page.sum(name, &[("method", method)]);
        let seconds = sum(&after, "snap_csi_grpc_request_duration_seconds_sum")
            - sum(&before, "snap_csi_grpc_request_duration_seconds_sum");
        let calls = sum(&after, "snap_csi_grpc_request_duration_seconds_count")
            - sum(&before, "snap_csi_grpc_request_duration_seconds_count");
        seconds * 1e3 / calls.max(1.0)
    };
    let [
        publish_dir,
        unpublish_dir,
        bind_alone,
        umount_alone,
        rmdir_alone,
    ] = samples.dir.each_ref().map(|v| Summary::of(v));
    let [publish_file, unpublish_file, ..] = samples.file.each_ref().map(|v| Summary::of(v));
    let [publish_block, unpublish_block, publish_fs, unpublish_fs] =
        samples.node.each_ref().map(|v| Summary::of(v));
    // Iteration by iteration: the gRPC floor plus the host's least work.
    let ms = |v: &[Duration]| v.iter().map(|d| d.as_secs_f64() * 1e3).collect::<Vec<_>>();
    let grpc = ms(&samples.grpc_empty);
    let ratio = |host: &[Duration], node: &[Duration]| {
        let floor: Vec<f64> = grpc.iter().zip(ms(host)).map(|(g, h)| g + h).collect();
        Paired::of(&floor, &ms(node))
    };
    Ok(Floors {
        grpc_empty: Summary::of(&samples.grpc_empty),
        node_get_plugin_capabilities: Summary::of(&samples.node_capabilities),
        jsonrpc_round_trip: Summary::of(&samples.jsonrpc),
        publish_dir,
        unpublish_dir,
        publish_file,
        unpublish_file,
        bind_alone,
        umount_alone,
        rmdir_alone,
        node_publish_block: publish_block,
        node_unpublish_block: unpublish_block,
        node_publish_fs: publish_fs,
        node_unpublish_fs: unpublish_fs,
        node_served_publish_ms: served_ms("Node/NodePublishVolume"),
        node_served_unpublish_ms: served_ms("Node/NodeUnpublishVolume"),
        publish_block_ratio: ratio(&samples.file[0], &samples.node[0]),
        unpublish_block_ratio: ratio(&samples.file[1], &samples.node[1]),
        publish_fs_ratio: ratio(&samples.dir[0], &samples.node[2]),
        unpublish_fs_ratio: ratio(&samples.dir[1], &samples.node[3]),
    })
}
