//! What happens to a host, on a real Linux kernel (`common::guest_node`):
//! a volume grows under a mounted filesystem, a function goes away under
//! one, the node dies in the middle of its calls, SNAP dies under a
//! published volume, the host reboots, and a second host shares a
//! ReadWriteMany filesystem device with the first.
//!
//! What this does not prove: QEMU's devices stand in for SNAP's (a
//! virtio-blk device grows by QEMU's `block_resize`, as SNAP passes an SPDK
//! resize on; QEMU's NVMe namespace cannot grow, so NVMe growth is proven on
//! the emulated tree only); a function pulled by QMP is the surprise removal
//! a host sees, not SNAP's own reason for it; TCG's timing.

mod common;

use common::guest_node::{
    GuestNode, KUBELET_DIR, Kind, Published, VOLUME, stage_and_publish, stage_and_publish_share,
};
use common::node::{grow_on_the_dpu, stage_request, unpublish, unstage};
use snap_csi::proto::csi::v1 as csi;

/// The disk the guest's kernel mounted at `target`, as `/dev/...`.
fn mounted_disk(host: &mut GuestNode, target: &std::path::Path) -> String {
    let source = host
        .sh(&format!("findmnt -no SOURCE {}", target.display()))
        .unwrap();
    source.trim().to_owned()
}

/// The guest shows the one virtio-blk disk of the one volume, none twice.
fn assert_one_disk(host: &mut GuestNode) {
    let disks = host.sh("ls /sys/block | grep ^vd").unwrap();
    assert_eq!(disks.lines().count(), 1, "disks: {disks}");
}

/// The node's NodeGetVolumeStats for the volume published at `target`.
async fn stats(
    host: &mut GuestNode,
    volume_id: &str,
    target: &std::path::Path,
) -> csi::NodeGetVolumeStatsResponse {
    host.client
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: volume_id.into(),
            volume_path: target.display().to_string(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap_or_else(|e| panic!("stats of {volume_id}: {e}"))
        .into_inner()
}

fn total_bytes(stats: &csi::NodeGetVolumeStatsResponse) -> i64 {
    stats
        .usage
        .iter()
        .find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32)
        .map_or(0, |u| u.total)
}

/// The controller grows a mounted virtio-blk volume on the DPU side (its
/// file grows, SPDK rescans, the host's disk grows); NodeExpandVolume then
/// grows the ext4 on it online, and the pod sees the room.
#[tokio::test(flavor = "multi_thread")]
async fn a_virtio_blk_volume_grows_online_on_a_real_kernel() {
    let mut host = GuestNode::start("virtio-blk").await;
    let id = "pvc-grow";
    let Published {
        backing,
        staging,
        target,
    } = stage_and_publish(&mut host, id, Kind::Mount("ext4"), false).await;
    let before = total_bytes(&stats(&mut host, id, &target).await);

    grow_on_the_dpu(&host.emulator, &backing, 2 * VOLUME).await;

    let grown = host
        .client
        .node_expand_volume(csi::NodeExpandVolumeRequest {
            volume_id: id.into(),
            volume_path: target.display().to_string(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: (2 * VOLUME) as i64,
                limit_bytes: 0,
            }),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(Kind::Mount("ext4").capability()),
            secrets: Default::default(),
        })
        .await
        .unwrap_or_else(|e| panic!("expand: {e}\n{}", host.node_log()))
        .into_inner();
    assert_eq!(grown.capacity_bytes, (2 * VOLUME) as i64);

    let disk = mounted_disk(&mut host, &target);
    let size = host.sh(&format!("blockdev --getsize64 {disk}")).unwrap();
    assert_eq!(size.trim().parse::<u64>().unwrap(), 2 * VOLUME, "{disk}");
    let after = total_bytes(&stats(&mut host, id, &target).await);
    assert!(after > before + (VOLUME / 2) as i64, "{before} -> {after}");
    // The pod's own view: room past the old size, written and read back.
    host.sh(&format!(
        "t={}; df -B1 --output=size $t | tail -1 | awk '{{exit !($1 > {VOLUME})}}' && \
         head -c {} /dev/zero >$t/big && sync && rm $t/big",
        target.display(),
        VOLUME * 3 / 4
    ))
    .unwrap();

    unpublish(&mut host.client, id, &target).await;
    unstage(&mut host.client, id, &staging).await;
    host.assert_nothing_left().await;
}

/// The function behind a mounted volume leaves the host (a surprise
/// removal: SNAP's function is gone): the node reports the volume abnormal,
/// and kubelet's unpublish and unstage still succeed and leave nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_function_removed_under_a_mount_is_reported_and_unstaged() {
    let mut host = GuestNode::start("virtio-blk").await;
    let id = "pvc-pulled";
    let Published {
        staging, target, ..
    } = stage_and_publish(&mut host, id, Kind::Mount("ext4"), false).await;
    host.sh(&format!("echo before >{}/file && sync", target.display()))
        .unwrap();
    let healthy = stats(&mut host, id, &target).await;
    assert_eq!(healthy.volume_condition.map(|c| c.abnormal), Some(false));

    let disk = mounted_disk(&mut host, &target);
    let name = disk.trim_start_matches("/dev/");
    let function = host
        .sh(&format!(
            "basename $(dirname $(readlink -f /sys/block/{name}/device))"
        ))
        .unwrap();
    let bus = function
        .trim()
        .strip_prefix("0000:")
        .and_then(|f| f.strip_suffix(":00.0"))
        .unwrap_or_else(|| panic!("{name} is on {function}, not a root port's function"))
        .to_owned();
    tokio::task::block_in_place(|| host.guest.remove(&format!("snap-{bus}"))).unwrap();
    tokio::task::block_in_place(|| {
        host.guest.wait_until(
            &format!("[ ! -e /sys/block/{name} ] && echo gone"),
            std::time::Duration::from_secs(60),
        )
    })
    .unwrap();

    let sick = stats(&mut host, id, &target).await;
    let condition = sick.volume_condition.expect("a condition");
    assert!(condition.abnormal, "{condition:?}");
    // Why, as an operator reads it: not a filesystem that failed by itself.
    assert!(
        condition.message.contains("is gone from the host"),
        "{condition:?}"
    );

    unpublish(&mut host.client, id, &target).await;
    unstage(&mut host.client, id, &staging).await;
    host.assert_nothing_left().await;
}

/// The node is killed (SIGKILL) in the guest right after it made the
/// filesystem, and again right after it unmounted the staging path:
/// kubelet's retries, to the restarted node, converge with one disk and
/// leave nothing.
#[tokio::test(flavor = "multi_thread")]
async fn the_node_killed_in_the_guest_converges_on_retry() {
    let mut host = GuestNode::start("virtio-blk").await;
    let id = "pvc-killed";
    let kind = Kind::Mount("ext4");
    host.restart_node(Some("stage:format")).await;
    let backing = host.dir.path().join(format!("{id}.img"));
    common::sparse_file(&backing, VOLUME);
    let (staging, target) = host.paths(id);
    let request = stage_request(id, &staging, kind.capability(), &backing);
    let crashed = host.client.node_stage_volume(request.clone()).await;
    assert!(crashed.is_err(), "the stage outlived its kill: {crashed:?}");
    assert!(!host.node_runs(), "the node did not die after stage:format");

    host.restart_node(None).await;
    let volume = Published {
        backing,
        staging,
        target,
    };
    volume.stage_and_publish(&mut host, id, kind, false).await;
    assert_one_disk(&mut host);
    let Published {
        staging, target, ..
    } = volume;
    host.sh(&format!(
        "echo {id} >{0}/written && sync && [ \"$(cat {0}/written)\" = {id} ]",
        target.display()
    ))
    .unwrap();
    unpublish(&mut host.client, id, &target).await;

    host.restart_node(Some("unstage:unmount")).await;
    let unstage_request = csi::NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
    };
    let crashed = host.client.node_unstage_volume(unstage_request).await;
    assert!(
        crashed.is_err(),
        "the unstage outlived its kill: {crashed:?}"
    );
    assert!(
        !host.node_runs(),
        "the node did not die after unstage:unmount"
    );
    host.restart_node(None).await;
    unstage(&mut host.client, id, &staging).await;
    host.assert_nothing_left().await;
}

/// The host reboots with a volume staged and published: its mounts are
/// gone, SNAP's function stays plugged, and the node's state directory
/// stays (a host's disk). Kubelet stages and publishes the volume again:
/// the node finds the same disk, formats nothing, the pod reads what it
/// wrote before, and the unstage leaves nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_host_reboot_stages_the_volume_again_with_its_data() {
    let mut host = GuestNode::start("virtio-blk").await;
    let id = "pvc-reboot";
    let kind = Kind::Mount("xfs");
    let volume = stage_and_publish(&mut host, id, kind, false).await;
    let Published {
        staging, target, ..
    } = &volume;
    host.sh(&format!(
        "echo before-the-reboot >{}/file && sync",
        target.display()
    ))
    .unwrap();
    let boot = host.sh("cat /proc/sys/kernel/random/boot_id").unwrap();

    host.reboot().await;
    assert_ne!(
        host.sh("cat /proc/sys/kernel/random/boot_id").unwrap(),
        boot
    );
    let mounted = host
        .sh(&format!(
            "findmnt -rno TARGET | grep '^{KUBELET_DIR}/' || true"
        ))
        .unwrap();
    assert_eq!(mounted.trim(), "", "mounts that outlived the reboot");
    // Kubelet makes its directories again.
    assert_eq!(host.paths(id), (staging.clone(), target.clone()));
    volume.stage_and_publish(&mut host, id, kind, false).await;
    assert_eq!(
        host.sh(&format!("cat {}/file", target.display())).unwrap(),
        "before-the-reboot\n"
    );
    assert_one_disk(&mut host);

    unpublish(&mut host.client, id, target).await;
    unstage(&mut host.client, id, staging).await;
    host.assert_nothing_left().await;
}

/// SNAP crashes under a published volume and comes back empty, as SPDK
/// does: the host loses the function (the restarted emulator unplugs what
/// the crashed one showed), and the node says the volume's device is gone.
/// The next pod's publish waits while the first pod still has the old
/// filesystem mounted, then attaches the volume again, with its data. (Each
/// of those publishes first gives the device the node's device wait, 30 s
/// by default, to show again, as after a reconnect it would.)
#[tokio::test(flavor = "multi_thread")]
async fn snap_crashed_under_a_published_volume_heals_on_the_next_publish() {
    let mut host = GuestNode::start("virtio-blk").await;
    let id = "pvc-snap-crash";
    let kind = Kind::Mount("ext4");
    let Published {
        staging, target, ..
    } = stage_and_publish(&mut host, id, kind, false).await;
    host.sh(&format!(
        "echo before-the-crash >{}/file && sync",
        target.display()
    ))
    .unwrap();

    host.emulator.restart_empty().await;
    let disks = host.sh("ls /sys/block | grep ^vd || true").unwrap();
    assert_eq!(
        disks.trim(),
        "",
        "the crashed SNAP's disk is still on the host"
    );
    let condition = stats(&mut host, id, &target)
        .await
        .volume_condition
        .expect("a condition");
    assert!(
        condition.abnormal && condition.message.contains("is gone from the host"),
        "{condition:?}"
    );

    let second = std::path::PathBuf::from(format!("{KUBELET_DIR}/pods/{id}-2/volume"));
    host.sh(&format!("mkdir -p {}", second.parent().unwrap().display()))
        .unwrap();
    let publish = common::node::publish_request(id, &staging, &second, kind.capability(), false);
    let waits = host
        .client
        .node_publish_volume(publish.clone())
        .await
        .expect_err("the first pod still has the old filesystem mounted");
    assert_eq!(waits.code(), tonic::Code::Aborted, "{waits:?}");
    unpublish(&mut host.client, id, &target).await;
    host.client
        .node_publish_volume(publish)
        .await
        .unwrap_or_else(|e| panic!("publish after SNAP came back: {e}\n{}", host.node_log()));
    assert_eq!(
        host.sh(&format!("cat {}/file", second.display())).unwrap(),
        "before-the-crash\n"
    );
    assert_one_disk(&mut host);

    unpublish(&mut host.client, id, &second).await;
    unstage(&mut host.client, id, &staging).await;
    host.assert_nothing_left().await;
}

/// Two hosts (two guests, each with its DPU side) share one ReadWriteMany
/// filesystem device over the same tree: each pod sees what the other
/// wrote.
#[tokio::test(flavor = "multi_thread")]
async fn two_hosts_share_a_read_write_many_volume() {
    let second = tokio::spawn(GuestNode::start("virtio-blk"));
    let mut first = GuestNode::start("virtio-blk").await;
    let mut second = second.await.unwrap();
    let share = first.dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    let id = "pvc-shared";
    let (staging_1, target_1) = stage_and_publish_share(&mut first, id, &share).await;
    let (staging_2, target_2) = stage_and_publish_share(&mut second, id, &share).await;

    first
        .sh(&format!(
            "echo from-host-1 >{}/one && sync",
            target_1.display()
        ))
        .unwrap();
    assert_eq!(
        second
            .sh(&format!("cat {}/one", target_2.display()))
            .unwrap(),
        "from-host-1\n"
    );
    second
        .sh(&format!(
            "echo from-host-2 >>{}/one && sync",
            target_2.display()
        ))
        .unwrap();
    assert_eq!(
        first
            .sh(&format!("cat {}/one", target_1.display()))
            .unwrap(),
        "from-host-1\nfrom-host-2\n"
    );

    for (host, staging, target) in [
        (&mut first, &staging_1, &target_1),
        (&mut second, &staging_2, &target_2),
    ] {
        unpublish(&mut host.client, id, target).await;
        unstage(&mut host.client, id, staging).await;
        host.assert_nothing_left().await;
    }
    assert_eq!(
        std::fs::read_to_string(share.join("one")).unwrap(),
        "from-host-1\nfrom-host-2\n"
    );
}
