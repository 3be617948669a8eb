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

use common::node::{NodeStack, mount_capability, mounts_under, stage_request, unstage};
use snap_csi::node::config::EmulationSetting;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;

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
