//! The CSI controller's filesystem backend over real gRPC: volumes are ext4
//! images in a share, each loop-mounted on its directory (as root, on a
//! btrfs loop file; see `src/csi/fs.rs`). What a host writes is stood in for
//! by writes into the volume's directory, and what it sees in `df` by
//! `statvfs` of it, which is what SNAP's fsdev serves and answers.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use common::csi::{Backends, Csi, MIB, capability, from_snapshot, from_volume, volume};
use common::share::Share;
use snap_csi::proto::csi::v1 as csi;
use snap_csi_spdk_plugin::csi::FsConfig;
use tonic::Code;

use csi::volume_capability::AccessType;
use csi::volume_capability::access_mode::Mode;

const BACKEND: &str = "fs";
/// ENOSPC: a write past the volume's size.
const ENOSPC: i32 = 28;

async fn controller(share: &Share, capacity: Option<u64>) -> Csi {
    let backends = Backends {
        aio: false,
        nvmf: false,
        default: BACKEND,
    };
    Csi::start_with(backends, &common::Source::Emulator, |config| {
        config.fs = Some(FsConfig {
            share: share.dir.clone(),
            capacity,
        });
    })
    .await
}

fn shared(fs_type: &str) -> csi::VolumeCapability {
    capability(
        AccessType::Mount(csi::volume_capability::MountVolume {
            fs_type: fs_type.into(),
            ..Default::default()
        }),
        Mode::MultiNodeMultiWriter,
    )
}

fn fs_volume(name: &str, bytes: u64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        volume_capabilities: vec![shared("virtiofs")],
        ..volume(name, BACKEND, bytes, 0)
    }
}

/// Writes `mib` MiB of data into `dir/name`, flushed: the error a host
/// would see, if any.
fn write_mib(dir: &Path, name: &str, mib: usize) -> std::io::Result<()> {
    let mut file = std::fs::File::create(dir.join(name))?;
    let chunk = vec![0x5a_u8; MIB as usize];
    for _ in 0..mib {
        file.write_all(&chunk)?;
    }
    file.sync_all()
}

fn path_of(volume: &csi::Volume) -> &Path {
    Path::new(&volume.volume_context["path"])
}

#[tokio::test]
async fn a_volume_holds_what_it_was_created_with_and_grows_online() {
    let share = Share::new(512 * MIB);
    let csi = controller(&share, Some(300 * MIB)).await;
    let before = csi.capacity(BACKEND).await.unwrap().available_capacity as u64;
    assert_eq!(before, 300 * MIB);

    let created = csi.create(fs_volume("pvc-fs-1", 64 * MIB)).await.unwrap();
    assert_eq!(created.volume_id, "fs-pvc-fs-1");
    assert_eq!(created.capacity_bytes as u64, 64 * MIB);
    assert_eq!(created.volume_context["backend"], "fs");
    assert_eq!(created.volume_context["snap-csi.io/emulation"], "virtio-fs");
    assert_eq!(path_of(&created), share.dir.join("fs-pvc-fs-1"));
    // Retried: the same volume.
    let again = csi.create(fs_volume("pvc-fs-1", 64 * MIB)).await.unwrap();
    assert_eq!(again, created);
    let after = csi.capacity(BACKEND).await.unwrap().available_capacity as u64;
    assert_eq!(after, before - 64 * MIB);

    let dir = path_of(&created);
    write_mib(dir, "a", 40).unwrap();
    let full = write_mib(dir, "b", 40).unwrap_err();
    assert_eq!(full.raw_os_error(), Some(ENOSPC), "{full}");
    std::fs::remove_file(dir.join("b")).unwrap();

    let expanded = csi
        .expand(&created.volume_id, 128 * MIB, Some(shared("")))
        .await
        .unwrap();
    assert_eq!(expanded.capacity_bytes as u64, 128 * MIB);
    assert!(
        !expanded.node_expansion_required,
        "the volume's filesystem grows online"
    );
    write_mib(dir, "b", 40).unwrap();
    let listed = csi.list(0, "").await.unwrap();
    let sizes: Vec<(String, i64)> = listed
        .entries
        .iter()
        .map(|e| {
            let v = e.volume.as_ref().unwrap();
            (v.volume_id.clone(), v.capacity_bytes)
        })
        .collect();
    assert_eq!(sizes, [("fs-pvc-fs-1".to_string(), (128 * MIB) as i64)]);

    csi.delete(&created.volume_id).await.unwrap();
    csi.delete(&created.volume_id).await.unwrap();
    assert!(!dir.exists());
    assert!(csi.list_all(0).await.is_empty());
    assert!(share.leftovers().is_empty(), "{:?}", share.leftovers());
    let back = csi.capacity(BACKEND).await.unwrap().available_capacity as u64;
    assert_eq!(back, before);
}

#[tokio::test]
async fn snapshots_keep_the_tree_and_clones_start_from_it() {
    let share = Share::new(512 * MIB);
    let csi = controller(&share, None).await;
    let source = csi.create(fs_volume("pvc-fs-src", 32 * MIB)).await.unwrap();
    let dir = path_of(&source);
    std::fs::create_dir(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/file"), b"before").unwrap();

    let snapshot = csi.snapshot("snap-1", &source.volume_id).await.unwrap();
    assert_eq!(snapshot.snapshot_id, "snap-fs-snap-1");
    assert_eq!(snapshot.size_bytes as u64, 32 * MIB);
    std::fs::write(dir.join("sub/file"), b"after").unwrap();

    let restored = csi
        .create(from_snapshot(
            fs_volume("pvc-fs-restored", 32 * MIB),
            &snapshot.snapshot_id,
        ))
        .await
        .unwrap();
    let cloned = csi
        .create(from_volume(
            fs_volume("pvc-fs-clone", 48 * MIB),
            &source.volume_id,
        ))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(path_of(&restored).join("sub/file")).unwrap(),
        b"before"
    );
    assert_eq!(
        std::fs::read(path_of(&cloned).join("sub/file")).unwrap(),
        b"after"
    );
    assert_eq!(cloned.capacity_bytes as u64, 48 * MIB);
    // Each is its own tree.
    std::fs::write(path_of(&cloned).join("sub/file"), b"clone").unwrap();
    assert_eq!(std::fs::read(dir.join("sub/file")).unwrap(), b"after");
    // A block-only source of another backend is refused, changing nothing.
    let error = csi
        .create(from_snapshot(fs_volume("pvc-x", MIB), "snap-aio-s"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument, "{error:?}");

    for volume in [&restored, &cloned, &source] {
        csi.delete(&volume.volume_id).await.unwrap();
    }
    csi.delete_snapshot(&snapshot.snapshot_id).await.unwrap();
    csi.delete_snapshot(&snapshot.snapshot_id).await.unwrap();
    assert!(share.leftovers().is_empty(), "{:?}", share.leftovers());
}

#[tokio::test]
async fn block_options_and_capabilities_are_refused_and_change_nothing() {
    let share = Share::new(256 * MIB);
    let csi = controller(&share, None).await;
    let with = |pairs: &[(&str, &str)]| {
        let mut request = fs_volume("pvc-refused", 8 * MIB);
        for (k, v) in pairs {
            request.parameters.insert(k.to_string(), v.to_string());
        }
        request
    };
    let refusals = [
        ("placement", with(&[("snap-csi.io/placement", "dedicated")])),
        ("encryption", with(&[("snap-csi.io/encryption", "aes-xts")])),
        ("emulation", with(&[("snap-csi.io/emulation", "nvme")])),
        ("QoS", with(&[("snap-csi.io/qos-rw-iops", "1000")])),
        (
            "QoS",
            csi::CreateVolumeRequest {
                mutable_parameters: HashMap::from([(
                    "snap-csi.io/qos-rw-iops".to_string(),
                    "1000".to_string(),
                )]),
                ..with(&[])
            },
        ),
        (
            "block device",
            csi::CreateVolumeRequest {
                volume_capabilities: vec![common::csi::block()],
                ..with(&[])
            },
        ),
        (
            "fs_type \"ext4\"",
            csi::CreateVolumeRequest {
                volume_capabilities: vec![shared("ext4")],
                ..with(&[])
            },
        ),
    ];
    for (named, request) in refusals {
        let error = csi.create(request).await.unwrap_err();
        assert_eq!(error.code(), Code::InvalidArgument, "{named}: {error:?}");
        assert!(error.message().contains(named), "{named}: {error:?}");
    }
    // virtio-fs alone chooses this backend; on a block backend it is refused.
    let mut by_emulation = volume("pvc-by-emulation", "", 8 * MIB, 0);
    by_emulation.volume_capabilities = vec![shared("")];
    by_emulation
        .parameters
        .insert("snap-csi.io/emulation".to_string(), "virtio-fs".to_string());
    let made = csi.create(by_emulation.clone()).await.unwrap();
    assert_eq!(made.volume_id, "fs-pvc-by-emulation");
    by_emulation
        .parameters
        .insert("backend".to_string(), "aio".to_string());
    let error = csi.create(by_emulation).await.unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument, "{error:?}");

    // ModifyVolume: nothing asked is done; QoS is refused.
    csi.modify(&made.volume_id, &[]).await.unwrap();
    let error = csi
        .modify(&made.volume_id, &[("snap-csi.io/qos-rw-iops", "1000")])
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument, "{error:?}");
    let validated = csi
        .validate(&made.volume_id, vec![common::csi::block()])
        .await
        .unwrap();
    assert!(validated.confirmed.is_none(), "{validated:?}");
    let validated = csi
        .validate(&made.volume_id, vec![shared("virtiofs")])
        .await
        .unwrap();
    assert!(validated.confirmed.is_some(), "{validated:?}");

    csi.delete(&made.volume_id).await.unwrap();
    assert!(share.leftovers().is_empty(), "{:?}", share.leftovers());
}

/// `statvfs` of a volume's directory (what SPDK's fsdev answers a host's
/// statfs with, so what `df` in a pod and kubelet's capacity metrics show)
/// is the volume's own: its size less ext4's metadata, and what it holds.
#[tokio::test]
async fn a_volume_directory_says_its_own_size_and_use() {
    let share = Share::new(1024 * MIB);
    let csi = controller(&share, None).await;
    let created = csi.create(fs_volume("pvc-df", 64 * MIB)).await.unwrap();
    let dir = path_of(&created);
    let stat = |dir: &Path| {
        let s = nix::sys::statvfs::statvfs(dir).unwrap();
        let unit = s.fragment_size() as u64;
        let total = s.blocks() as u64 * unit;
        (total, total - s.blocks_free() as u64 * unit)
    };
    let (total, used) = stat(dir);
    assert!(
        (50 * MIB..=64 * MIB).contains(&total),
        "a 64 MiB volume shows {total} bytes"
    );
    write_mib(dir, "data", 8).unwrap();
    let (total_after, used_after) = stat(dir);
    assert_eq!(total_after, total);
    let grown = used_after - used;
    assert!(
        (8 * MIB..=9 * MIB).contains(&grown),
        "8 MiB written, used grew by {grown} bytes"
    );
    // The share's own statvfs is not the volume's.
    assert!(stat(&share.dir).0 > 512 * MIB);
    let full = write_mib(dir, "more", 64).unwrap_err();
    assert_eq!(full.raw_os_error(), Some(ENOSPC), "{full}");

    csi.delete(&created.volume_id).await.unwrap();
    assert!(share.leftovers().is_empty(), "{:?}", share.leftovers());
}

/// The directory a volume is served from is immutable under its mount: if
/// the mount is missing (a reboot, before the controller starts again),
/// nothing lands in the share's own directory, and a controller that
/// starts mounts every volume again.
#[tokio::test]
async fn an_unmounted_volume_refuses_writes_and_is_mounted_at_start() {
    let share = Share::new(512 * MIB);
    let csi = controller(&share, None).await;
    let created = csi.create(fs_volume("pvc-m", 16 * MIB)).await.unwrap();
    let dir = path_of(&created).to_path_buf();
    std::fs::write(dir.join("kept"), b"in the volume").unwrap();
    drop(csi);
    let unmounted = std::process::Command::new("umount")
        .arg(&dir)
        .status()
        .unwrap();
    assert!(unmounted.success());
    assert!(share.mounts().is_empty());
    let refused = std::fs::write(dir.join("lost"), b"x").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(1), "EPERM: {refused}");

    let csi = controller(&share, None).await;
    let mut mounted = false;
    for _ in 0..100 {
        mounted = share.mounts() == [dir.clone()];
        if mounted {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(mounted, "{:?}", share.mounts());
    assert_eq!(std::fs::read(dir.join("kept")).unwrap(), b"in the volume");
    csi.delete(&created.volume_id).await.unwrap();
    assert!(share.leftovers().is_empty(), "{:?}", share.leftovers());
}

/// SPDK's fsdev holds the volume's directory open while a DPU serves it:
/// the mount is busy, and DeleteVolume says so and removes nothing (also
/// when no DPU was asked, as here).
#[tokio::test]
async fn a_volume_held_open_is_not_deleted() {
    let share = Share::new(256 * MIB);
    let csi = controller(&share, None).await;
    let created = csi.create(fs_volume("pvc-held", 8 * MIB)).await.unwrap();
    let dir = path_of(&created).to_path_buf();
    std::fs::write(dir.join("data"), b"served").unwrap();
    let served = std::fs::File::open(&dir).unwrap();
    let refused = csi.delete(&created.volume_id).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("busy"), "{refused:?}");
    assert_eq!(
        csi.list_all(0).await,
        std::slice::from_ref(&created.volume_id)
    );
    assert_eq!(std::fs::read(dir.join("data")).unwrap(), b"served");

    drop(served);
    csi.delete(&created.volume_id).await.unwrap();
    assert!(!dir.exists());
    assert!(share.leftovers().is_empty(), "{:?}", share.leftovers());
}

/// A CreateVolume interrupted before its rename leaves a hidden temporary
/// image: lists never show it, the next attempt replaces it, and a
/// DeleteVolume removes it.
#[tokio::test]
async fn interrupted_creates_leave_only_a_temporary_the_next_call_replaces() {
    let share = Share::new(256 * MIB);
    let csi = controller(&share, None).await;
    let temp = share.dir.join(".images/.fs-pvc-t.img.tmp");
    std::fs::write(&temp, b"a crashed copy").unwrap();
    assert!(csi.list_all(0).await.is_empty());
    let created = csi.create(fs_volume("pvc-t", 4 * MIB)).await.unwrap();
    assert!(!temp.exists());
    assert_eq!(created.capacity_bytes as u64, 4 * MIB);
    std::fs::write(path_of(&created).join("f"), b"fresh").unwrap();
    csi.delete(&created.volume_id).await.unwrap();

    std::fs::write(&temp, b"a crashed copy").unwrap();
    csi.delete("fs-pvc-t").await.unwrap();
    assert!(share.leftovers().is_empty(), "{:?}", share.leftovers());
}

/// Probe says what the share lacks: snapshots and clones are reflink
/// copies, which ext4 cannot make.
#[tokio::test]
async fn a_share_without_reflinks_is_not_ready() {
    let probe = |csi: &Csi| {
        let mut identity = csi.identity.clone();
        async move {
            identity
                .probe(csi::ProbeRequest {})
                .await
                .unwrap()
                .into_inner()
                .ready
        }
    };
    let share = Share::new(256 * MIB);
    let csi = controller(&share, None).await;
    assert_eq!(probe(&csi).await, Some(true));
    assert!(share.leftovers().is_empty(), "{:?}", share.leftovers());
    let ext4 = Share::ext4(64 * MIB);
    let csi = controller(&ext4, None).await;
    assert_eq!(probe(&csi).await, Some(false));
}

/// A group snapshot freezes every member at once: each member's snapshot
/// holds its tree, also while a member is written throughout (the writes
/// wait for the thaw).
#[tokio::test]
async fn group_snapshots_are_of_one_instant_even_under_writes() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    let share = Share::new(512 * MIB);
    let csi = controller(&share, None).await;
    let a = csi.create(fs_volume("pvc-ga", 16 * MIB)).await.unwrap();
    let b = csi.create(fs_volume("pvc-gb", 16 * MIB)).await.unwrap();
    std::fs::write(path_of(&a).join("f"), b"a").unwrap();
    std::fs::write(path_of(&b).join("f"), b"b").unwrap();
    let ids = [a.volume_id.as_str(), b.volume_id.as_str()];
    let group = csi
        .create_group_snapshot("gs-idle", &ids, HashMap::new())
        .await
        .unwrap();
    assert_eq!(group.snapshots.len(), 2);
    for snapshot in &group.snapshots {
        let restored = csi
            .create(from_snapshot(
                fs_volume(&format!("r-{}", snapshot.source_volume_id), 16 * MIB),
                &snapshot.snapshot_id,
            ))
            .await
            .unwrap();
        let want = if snapshot.source_volume_id == a.volume_id {
            b"a"
        } else {
            b"b"
        };
        assert_eq!(std::fs::read(path_of(&restored).join("f")).unwrap(), want);
        csi.delete(&restored.volume_id).await.unwrap();
    }
    csi.delete_whole_group_snapshot(&group).await;

    // Both members written in turn, the same counter into each: in one
    // instant, b holds what a holds or the one before.
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let writer = {
        let (stop, written) = (stop.clone(), written.clone());
        let (da, db) = (path_of(&a).to_path_buf(), path_of(&b).to_path_buf());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let n = written.fetch_add(1, Ordering::Relaxed);
                for dir in [&da, &db] {
                    std::fs::write(dir.join("busy.new"), n.to_le_bytes()).unwrap();
                    std::fs::rename(dir.join("busy.new"), dir.join("busy")).unwrap();
                }
            }
        })
    };
    while written.load(Ordering::Relaxed) < 10 {
        tokio::task::yield_now().await;
    }
    let group = csi
        .create_group_snapshot("gs-busy", &ids, HashMap::new())
        .await
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let mut counters = HashMap::new();
    for snapshot in &group.snapshots {
        let restored = csi
            .create(from_snapshot(
                fs_volume(&format!("rb-{}", snapshot.source_volume_id), 16 * MIB),
                &snapshot.snapshot_id,
            ))
            .await
            .unwrap();
        let held = std::fs::read(path_of(&restored).join("busy")).unwrap();
        let held = u64::from_le_bytes(held.try_into().expect("a whole counter"));
        counters.insert(snapshot.source_volume_id.clone(), held);
        csi.delete(&restored.volume_id).await.unwrap();
    }
    let (in_a, in_b) = (counters[&a.volume_id], counters[&b.volume_id]);
    assert!(in_b == in_a || in_b + 1 == in_a, "a {in_a}, b {in_b}");
    csi.delete_whole_group_snapshot(&group).await;
    for volume in [&a, &b] {
        csi.delete(&volume.volume_id).await.unwrap();
    }
    assert!(share.leftovers().is_empty(), "{:?}", share.leftovers());
}
