//! Volumes staged and published by the node on a real Linux kernel: the node
//! runs in a guest host (Debian's kernel under QEMU), SNAP's functions are
//! hot-plugged into it by the emulator (its guest host: root ports, ACPI
//! hot-plug), and the DPU agent, the plugin and the emulator run on this
//! machine, reached over the guest's link with mutual TLS, as on a BlueField
//! host in split mode (`common::guest_node`).
//!
//! What a pod would check, checked in the guest: the filesystem on the
//! kernel's own disk, what is written reads back, a read-only volume refuses
//! writes, a raw block volume has the volume's size; a filesystem device's
//! files reach the share on the DPU side; after unstage the guest has no
//! disk or tag left and SNAP holds nothing.
//!
//! What this does not prove: QEMU's virtio-blk and vhost-user-fs devices
//! stand in for SNAP's; NVMe volumes are not staged here (the emulator's
//! guest host has no NVMe yet: `hack/snap-emu/src/host/guest/mod.rs`); TCG's
//! timing is not a host's.

mod common;

use common::guest_node::{GuestNode, SNAP_CSI};
use common::node::{
    assert_snap_holds_nothing, block_capability, mount_capability, publish_request, stage_request,
    unpublish, unstage,
};
use common::virtio_fs;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;

const MIB: u64 = 1 << 20;
/// Large enough for mkfs.xfs (300 MiB at least).
const VOLUME: u64 = 512 * MIB;

/// How a test volume is asked for and what a pod checks of it.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Mount(&'static str),
    Block,
}

/// Stages and publishes `volume_id` as `kind` (read-only if `readonly`),
/// checks it as a pod would, and takes it down.
async fn round_trip(host: &mut GuestNode, volume_id: &str, kind: Kind, readonly: bool) {
    let backing = host.dir.path().join(format!("{volume_id}.img"));
    common::sparse_file(&backing, VOLUME);
    let (staging, target) = host.paths(volume_id);
    let capability = match kind {
        Kind::Mount(fs) => mount_capability(fs, Mode::SingleNodeWriter),
        Kind::Block => block_capability(Mode::SingleNodeWriter),
    };
    let staged = host
        .client
        .node_stage_volume(stage_request(
            volume_id,
            &staging,
            capability.clone(),
            &backing,
        ))
        .await;
    if let Err(e) = staged {
        panic!("stage {volume_id}: {e}\n{}", host.node_log());
    }
    host.client
        .node_publish_volume(publish_request(
            volume_id, &staging, &target, capability, readonly,
        ))
        .await
        .unwrap_or_else(|e| panic!("publish {volume_id}: {e}"));

    let target_s = target.display();
    match kind {
        Kind::Mount(fs) => {
            let mounted = host
                .sh(&format!("findmnt -no SOURCE,FSTYPE {target_s}"))
                .unwrap();
            let (source, fstype) = mounted.trim().split_once(' ').unwrap();
            assert!(
                source.starts_with("/dev/vd"),
                "{volume_id} is mounted from {source}, not the guest's virtio-blk disk"
            );
            assert_eq!(fstype.trim(), fs);
            if readonly {
                let refused = host.sh(&format!("touch {target_s}/x 2>&1")).unwrap_err();
                assert!(
                    format!("{refused:#}").contains("Read-only file system"),
                    "{refused:#}"
                );
            } else {
                host.sh(&format!(
                    "echo {volume_id} >{target_s}/written && sync && \
                     [ \"$(cat {target_s}/written)\" = {volume_id} ]"
                ))
                .unwrap();
            }
        }
        Kind::Block => {
            let size = host
                .sh(&format!("blockdev --getsize64 {target_s}"))
                .unwrap();
            assert_eq!(size.trim().parse::<u64>().unwrap(), VOLUME);
            host.sh(&format!(
                "(printf snap-csi; head -c 504 /dev/zero) | \
                 dd of={target_s} iflag=fullblock oflag=direct bs=512 count=1 status=none"
            ))
            .unwrap();
        }
    }

    unpublish(&mut host.client, volume_id, &target).await;
    unstage(&mut host.client, volume_id, &staging).await;
    if let Kind::Block = kind {
        // What the pod wrote reached the volume's bytes on the DPU side.
        let head = std::fs::read(&backing).unwrap();
        assert_eq!(&head[..8], b"snap-csi");
    }
}

/// No disk, no virtio-fs tag in the guest, nothing held by SNAP.
async fn assert_nothing_left(host: &mut GuestNode) {
    let left = host
        .sh("ls /sys/block | grep '^vd' || true; ls -A /sys/fs/virtiofs")
        .unwrap();
    assert_eq!(left.trim(), "", "the guest still has {left}");
    assert_snap_holds_nothing(&host.emulator).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn virtio_blk_volumes_staged_by_the_node_on_a_real_kernel() {
    let mut host = GuestNode::start("virtio-blk").await;
    let kernel = host.sh("uname -r").unwrap();
    eprintln!("guest kernel {}", kernel.trim());
    round_trip(&mut host, "pvc-ext4", Kind::Mount("ext4"), false).await;
    round_trip(&mut host, "pvc-xfs", Kind::Mount("xfs"), false).await;
    round_trip(&mut host, "pvc-block", Kind::Block, false).await;
    round_trip(&mut host, "pvc-ro", Kind::Mount("ext4"), true).await;
    assert_nothing_left(&mut host).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_virtio_fs_volume_staged_by_the_node_on_a_real_kernel() {
    let mut host = GuestNode::start("virtio-blk").await;
    let share = host.dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    let volume_id = "pvc-fs";
    let (staging, target) = host.paths(volume_id);
    let capability = mount_capability("", Mode::MultiNodeMultiWriter);
    let staged = host
        .client
        .node_stage_volume(virtio_fs::stage_request(
            volume_id,
            &staging,
            capability.clone(),
            &share,
        ))
        .await;
    if let Err(e) = staged {
        panic!("stage {volume_id}: {e}\n{}", host.node_log());
    }
    host.client
        .node_publish_volume(virtio_fs::publish_request(
            volume_id,
            (&staging, &target),
            capability,
            &share,
            false,
        ))
        .await
        .unwrap();
    let target_s = target.display();
    let fstype = host.sh(&format!("findmnt -no FSTYPE {target_s}")).unwrap();
    assert_eq!(fstype.trim(), "virtiofs");
    // The node found the tag through the kernel's list, as a stage does.
    let tag = host
        .sh(&format!("findmnt -no SOURCE {}", staging.display()))
        .unwrap();
    host.sh(&format!("{SNAP_CSI} find-device --tag {}", tag.trim()))
        .unwrap();
    host.sh(&format!("echo from-the-pod >{target_s}/written && sync"))
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(share.join("written")).unwrap(),
        "from-the-pod\n"
    );
    std::fs::write(share.join("from-the-dpu"), "hello\n").unwrap();
    assert_eq!(
        host.sh(&format!("cat {target_s}/from-the-dpu")).unwrap(),
        "hello\n"
    );
    unpublish(&mut host.client, volume_id, &target).await;
    unstage(&mut host.client, volume_id, &staging).await;
    assert_nothing_left(&mut host).await;
}
