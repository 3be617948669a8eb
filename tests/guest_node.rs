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
//! stand in for SNAP's; NVMe volumes are `guest_node_nvme.rs`'s; TCG's
//! timing is not a host's.

mod common;

use common::guest_node::{Disk, GuestNode, SNAP_CSI, stage_and_publish_share, volume_matrix};
use common::node::{unpublish, unstage};

#[tokio::test(flavor = "multi_thread")]
async fn virtio_blk_volumes_staged_by_the_node_on_a_real_kernel() {
    let mut host = GuestNode::start("virtio-blk").await;
    let kernel = host.sh("uname -r").unwrap();
    eprintln!("guest kernel {}", kernel.trim());
    volume_matrix(&mut host, Disk::VirtioBlk).await;
    host.assert_nothing_left().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_virtio_fs_volume_staged_by_the_node_on_a_real_kernel() {
    let mut host = GuestNode::start("virtio-blk").await;
    let share = host.dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    let volume_id = "pvc-fs";
    let (staging, target) = stage_and_publish_share(&mut host, volume_id, &share).await;
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
    host.assert_nothing_left().await;
}
