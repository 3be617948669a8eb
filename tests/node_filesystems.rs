//! What the node's filesystems do on volumes users really have (issue 11,
//! scenarios 10 to 12): a filesystem shut down after I/O errors, a large
//! thin volume, an xfs clone beside its source. Real stack: the SNAP
//! emulator, the test plugin, loop devices, mkfs and mounts.

mod common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use common::node::{
    NodeStack, mount_capability, mounts_under, publish_request, scrape, stage_and_publish,
    stage_request, unpublish, unstage,
};
use snap_csi::node::config::EmulationSetting;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::node_client::NodeClient;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use tonic::transport::Channel;

const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

/// Where the thin-volume test puts a block of its own before the stage: in
/// the middle of an ext4 flex group (past its bitmaps and inode tables) and
/// of an xfs allocation group, so no mkfs writes there.
const MARK_OFFSET: u64 = 701 * GIB + (64 << 20);

fn run(program: &str, args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(out.status.success(), "{program} {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Stages a 1 TiB sparse volume with `fs_type`: mkfs must neither discard
/// the device (on a thin volume that takes minutes; on the emulator's loop
/// device it punches holes, so the block written before would read as
/// zeros) nor zero it (which allocates: without lazy inode table init,
/// mkfs.ext4 makes 17 GiB of a 1 TiB file real).
async fn thin_volume(emulation: EmulationSetting, fs_type: &str) {
    let stack = NodeStack::start(emulation).await;
    let mut node = stack.client.clone();
    let backing = stack.backing_file("thin.img", TIB);
    let mark = [0xa5u8; 4096];
    {
        let mut file = fs::OpenOptions::new().write(true).open(&backing).unwrap();
        file.seek(SeekFrom::Start(MARK_OFFSET)).unwrap();
        file.write_all(&mark).unwrap();
        file.sync_all().unwrap();
    }
    let staging = stack.path(&format!("staging/pvc-thin-{fs_type}"));
    fs::create_dir_all(&staging).unwrap();
    let capability = mount_capability(fs_type, Mode::SingleNodeWriter);
    let started = Instant::now();
    node.node_stage_volume(stage_request("pvc-thin", &staging, capability, &backing))
        .await
        .unwrap();
    println!(
        "stage of a 1 TiB thin volume with {fs_type} (attach, mkfs, mount) took {:?}",
        started.elapsed()
    );
    let usage = nix::sys::statvfs::statvfs(&staging).unwrap();
    assert!(
        usage.blocks() * usage.fragment_size() > TIB * 9 / 10,
        "the filesystem spans the volume: {usage:?}"
    );

    let allocated = fs::metadata(&backing).unwrap().blocks() * 512;
    println!("{fs_type} on 1 TiB: {} MiB allocated", allocated >> 20);
    // mkfs.xfs writes its whole log (512 MiB here); mkfs.ext4 ~16 MiB.
    assert!(
        allocated < GIB,
        "{fs_type}: {allocated} bytes of the thin volume are allocated"
    );
    let mut found = [0u8; 4096];
    let mut file = fs::File::open(&backing).unwrap();
    file.seek(SeekFrom::Start(MARK_OFFSET)).unwrap();
    file.read_exact(&mut found).unwrap();
    assert!(
        found == mark,
        "{fs_type}: mkfs discarded or zeroed the volume"
    );
    unstage(&mut node, "pvc-thin", &staging).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext4_on_a_1_tib_thin_volume_is_made_lazily_without_discard() {
    thin_volume(EmulationSetting::Nvme, "ext4").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xfs_on_a_1_tib_thin_volume_is_made_without_discard() {
    thin_volume(EmulationSetting::VirtioBlk, "xfs").await;
}

fn filesystem_uuid(backing: &Path) -> String {
    run(
        "blkid",
        &[
            "-p".as_ref(),
            "-s".as_ref(),
            "UUID".as_ref(),
            "-o".as_ref(),
            "value".as_ref(),
            backing.as_os_str(),
        ],
    )
    .trim()
    .to_string()
}

/// A clone of an xfs volume taken while it is mounted (a snapshot restored,
/// a volume cloned: a byte copy, its log not clean, its UUID the same)
/// mounts on the node where its source is mounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xfs_clone_mounts_beside_its_mounted_source() {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let capability = mount_capability("xfs", Mode::SingleNodeWriter);
    let source = stack.backing_file("source.img", 512 << 20);
    let source_staging = stack.path("staging/pvc-source");
    fs::create_dir_all(&source_staging).unwrap();
    node.node_stage_volume(stage_request(
        "pvc-source",
        &source_staging,
        capability.clone(),
        &source,
    ))
    .await
    .unwrap();
    let file = source_staging.join("before-clone");
    fs::write(&file, b"from the source").unwrap();
    fs::File::open(&file).unwrap().sync_all().unwrap();
    fs::File::open(&source_staging).unwrap().sync_all().unwrap();

    let clone = stack.emulator.root().join("clone.img");
    run(
        "cp",
        &[
            "--sparse=always".as_ref(),
            source.as_os_str(),
            clone.as_os_str(),
        ],
    );
    assert_eq!(filesystem_uuid(&clone), filesystem_uuid(&source));
    let clone_staging = stack.path("staging/pvc-clone");
    fs::create_dir_all(&clone_staging).unwrap();
    node.node_stage_volume(stage_request(
        "pvc-clone",
        &clone_staging,
        capability,
        &clone,
    ))
    .await
    .unwrap();

    assert_eq!(
        mounts_under(&stack.kubelet).len(),
        2,
        "both mounted at once"
    );
    assert_eq!(
        fs::read(clone_staging.join("before-clone")).unwrap(),
        b"from the source"
    );
    fs::write(clone_staging.join("only-in-clone"), b"clone").unwrap();
    assert!(
        !source_staging.join("only-in-clone").exists(),
        "two filesystems, not one"
    );
    unstage(&mut node, "pvc-clone", &clone_staging).await;
    unstage(&mut node, "pvc-source", &source_staging).await;
    assert!(mounts_under(&stack.kubelet).is_empty());
}

async fn condition(
    node: &mut NodeClient<Channel>,
    volume_id: &str,
    path: &Path,
) -> csi::VolumeCondition {
    node.node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
        volume_id: volume_id.into(),
        volume_path: path.display().to_string(),
        staging_target_path: String::new(),
    })
    .await
    .unwrap()
    .into_inner()
    .volume_condition
    .unwrap()
}

/// The node's `snap_csi_volume_condition_abnormal` for `volume_id`, if any.
async fn condition_metric(stack: &NodeStack, volume_id: &str) -> Option<String> {
    let page = scrape(stack.config.metrics_address.unwrap()).await;
    let prefix = format!("snap_csi_volume_condition_abnormal{{volume_id=\"{volume_id}\"}} ");
    page.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(str::to_string)
}

/// A filesystem shuts down under a pod, for real: the shutdown ioctl, which
/// XFS and ext4 share (XFS_IOC_GOINGDOWN and EXT4_IOC_SHUTDOWN are both
/// `_IOR('X', 125, u32)`), issued by `xfs_io`, as an I/O error it cannot
/// survive would. Stats say so and why, and so does the metric; a stage
/// while it is published refuses, naming where; unpublished, the stage
/// repairs it, and what was synced before is there.
async fn shut_down(emulation: EmulationSetting, fs_type: &str) {
    let stack = NodeStack::start(emulation).await;
    let mut node = stack.client.clone();
    let volume_id = format!("pvc-down-{fs_type}");
    let backing = stack.backing_file("down.img", 512 << 20);
    let staging = stack.path(&format!("staging/{volume_id}"));
    fs::create_dir_all(&staging).unwrap();
    let target = stack.path(&format!("pods/p/volumes/{volume_id}"));
    let capability = mount_capability(fs_type, Mode::SingleNodeWriter);
    stage_and_publish(
        &mut node,
        &volume_id,
        (&staging, &target),
        capability.clone(),
        &backing,
        false,
    )
    .await;
    let file = target.join("synced");
    fs::write(&file, b"before the shutdown").unwrap();
    fs::File::open(&file).unwrap().sync_all().unwrap();
    fs::File::open(&target).unwrap().sync_all().unwrap();
    use csi::node_service_capability::{Type, rpc};
    let capabilities = node
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert!(
        capabilities.iter().any(|c| matches!(
            c.r#type,
            Some(Type::Rpc(r)) if r.r#type == rpc::Type::VolumeCondition as i32
        )),
        "kubelet asks for the condition only of a node that offers it: {capabilities:?}"
    );
    let healthy = condition(&mut node, &volume_id, &target).await;
    assert!(!healthy.abnormal, "{healthy:?}");
    assert_eq!(
        condition_metric(&stack, &volume_id).await.as_deref(),
        Some("0")
    );

    run(
        "xfs_io",
        &[
            "-x".as_ref(),
            "-c".as_ref(),
            "shutdown".as_ref(),
            target.as_os_str(),
        ],
    );
    let write = fs::write(target.join("after"), b"x").unwrap_err();
    assert_eq!(
        write.raw_os_error(),
        Some(nix::errno::Errno::EIO as i32),
        "{write}"
    );
    for path in [&target, &staging] {
        let sick = condition(&mut node, &volume_id, path).await;
        assert!(sick.abnormal, "{sick:?}");
        assert!(sick.message.contains("shut down"), "{sick:?}");
    }
    assert_eq!(
        condition_metric(&stack, &volume_id).await.as_deref(),
        Some("1")
    );

    let stage = stage_request(&volume_id, &staging, capability.clone(), &backing);
    let refused = node.node_stage_volume(stage.clone()).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(refused.message().contains("shut down"), "{refused:?}");
    assert!(
        refused.message().contains(&*target.to_string_lossy()),
        "names where it is still published: {refused:?}"
    );
    unpublish(&mut node, &volume_id, &target).await;
    node.node_stage_volume(stage).await.unwrap();
    node.node_publish_volume(publish_request(
        &volume_id, &staging, &target, capability, false,
    ))
    .await
    .unwrap();
    assert_eq!(fs::read(&file).unwrap(), b"before the shutdown");
    fs::write(target.join("after"), b"writable again").unwrap();
    let repaired = condition(&mut node, &volume_id, &target).await;
    assert!(!repaired.abnormal, "{repaired:?}");
    assert_eq!(
        condition_metric(&stack, &volume_id).await.as_deref(),
        Some("0")
    );

    unpublish(&mut node, &volume_id, &target).await;
    unstage(&mut node, &volume_id, &staging).await;
    assert_eq!(condition_metric(&stack, &volume_id).await, None, "unstaged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext4_shut_down_is_reported_and_repaired_at_the_next_stage() {
    shut_down(EmulationSetting::Nvme, "ext4").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xfs_shut_down_is_reported_and_repaired_at_the_next_stage() {
    shut_down(EmulationSetting::VirtioBlk, "xfs").await;
}

/// ext4 mounted with `errors=remount-ro` meets an error (the kernel's own
/// trigger, `/sys/fs/ext4/DEV/trigger_fs_error`, goes through the same
/// ext4_error path a corrupted block does): the kernel makes it read-only,
/// stats say so and count the error, and the next stage, unpublished,
/// checks it (e2fsck -p, forced by the error flag) and mounts it writable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext4_read_only_after_an_error_is_reported_and_repaired() {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let backing = stack.backing_file("errors.img", 128 << 20);
    let staging = stack.path("staging/pvc-errors");
    fs::create_dir_all(&staging).unwrap();
    let target = stack.path("pods/p/volumes/pvc-errors");
    let mut capability = mount_capability("ext4", Mode::SingleNodeWriter);
    if let Some(csi::volume_capability::AccessType::Mount(mount)) = &mut capability.access_type {
        mount.mount_flags.push("errors=remount-ro".into());
    }
    stage_and_publish(
        &mut node,
        "pvc-errors",
        (&staging, &target),
        capability.clone(),
        &backing,
        false,
    )
    .await;
    let loops = common::loop_devices_of(&backing);
    let device = loops[0]
        .split(':')
        .next()
        .unwrap()
        .trim_start_matches("/dev/");
    fs::write(
        format!("/sys/fs/ext4/{device}/trigger_fs_error"),
        "scenario 10",
    )
    .unwrap();
    let write = fs::write(target.join("after"), b"x").unwrap_err();
    assert_eq!(
        write.raw_os_error(),
        Some(nix::errno::Errno::EROFS as i32),
        "{write}"
    );
    let sick = condition(&mut node, "pvc-errors", &target).await;
    assert!(sick.abnormal, "{sick:?}");
    assert!(sick.message.contains("read-only after errors"), "{sick:?}");
    assert_eq!(
        condition_metric(&stack, "pvc-errors").await.as_deref(),
        Some("1")
    );

    unpublish(&mut node, "pvc-errors", &target).await;
    let stage = stage_request("pvc-errors", &staging, capability, &backing);
    node.node_stage_volume(stage).await.unwrap();
    fs::write(staging.join("after"), b"writable again").unwrap();
    let repaired = condition(&mut node, "pvc-errors", &staging).await;
    assert!(!repaired.abnormal, "e2fsck cleared the error: {repaired:?}");
    unstage(&mut node, "pvc-errors", &staging).await;
}
