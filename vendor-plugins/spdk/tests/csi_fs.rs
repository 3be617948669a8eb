//! The CSI controller's filesystem backend over real gRPC: volumes are
//! btrfs subvolumes in a share, each held to its size by a quota (as root,
//! on a btrfs loop file; see `src/csi/fs.rs`). What a host writes is stood
//! in for by writes into the volume's directory, which is what SNAP's fsdev
//! serves.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use common::csi::{Backends, Csi, MIB, capability, from_snapshot, from_volume, volume};
use common::share::BtrfsShare;
use snap_csi::proto::csi::v1 as csi;
use snap_csi_spdk_plugin::csi::FsConfig;
use tonic::Code;

use csi::volume_capability::AccessType;
use csi::volume_capability::access_mode::Mode;

const BACKEND: &str = "fs";
/// EDQUOT: a write past the volume's quota.
const EDQUOT: i32 = 122;

async fn controller(share: &BtrfsShare, capacity: Option<u64>) -> Csi {
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
    let share = BtrfsShare::new(512 * MIB);
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
    assert_eq!(full.raw_os_error(), Some(EDQUOT), "{full}");
    std::fs::remove_file(dir.join("b")).unwrap();

    let expanded = csi
        .expand(&created.volume_id, 128 * MIB, Some(shared("")))
        .await
        .unwrap();
    assert_eq!(expanded.capacity_bytes as u64, 128 * MIB);
    assert!(!expanded.node_expansion_required, "the quota is the size");
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
    let share = BtrfsShare::new(512 * MIB);
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
    let share = BtrfsShare::new(256 * MIB);
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

/// A CreateVolume interrupted before its rename leaves a hidden temporary
/// subvolume: lists never show it, the next attempt replaces it, and a
/// DeleteVolume removes it.
#[tokio::test]
async fn interrupted_creates_leave_only_a_temporary_the_next_call_replaces() {
    let share = BtrfsShare::new(256 * MIB);
    let csi = controller(&share, None).await;
    let temp = share.dir.join(".fs-pvc-t.tmp");
    let made = std::process::Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(&temp)
        .output()
        .unwrap();
    assert!(made.status.success());
    std::fs::write(temp.join("half"), b"a crashed copy").unwrap();
    assert!(csi.list_all(0).await.is_empty());
    let created = csi.create(fs_volume("pvc-t", 4 * MIB)).await.unwrap();
    assert!(!temp.exists());
    assert!(!path_of(&created).join("half").exists());
    csi.delete(&created.volume_id).await.unwrap();

    let made = std::process::Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(&temp)
        .output()
        .unwrap();
    assert!(made.status.success());
    csi.delete("fs-pvc-t").await.unwrap();
    assert!(share.leftovers().is_empty(), "{:?}", share.leftovers());
}

/// Probe says what the share lacks: a directory that is not btrfs with
/// quotas cannot hold a volume to its size.
#[tokio::test]
async fn a_share_without_quotas_is_not_ready() {
    let share = BtrfsShare::new(256 * MIB);
    let csi = controller(&share, None).await;
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
    assert_eq!(probe(&csi).await, Some(true));
    let disabled = std::process::Command::new("btrfs")
        .args(["quota", "disable"])
        .arg(&share.dir)
        .status()
        .unwrap();
    assert!(disabled.success());
    assert_eq!(probe(&csi).await, Some(false));
}

/// A group snapshot of idle volumes holds each member's tree; one taken
/// while a member is written fails and leaves no snapshot.
#[tokio::test]
async fn group_snapshots_of_idle_volumes_are_made_and_of_written_ones_refused() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    let share = BtrfsShare::new(512 * MIB);
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

    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let writer = {
        let (stop, written) = (stop.clone(), written.clone());
        let dir = path_of(&a).to_path_buf();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let n = written.fetch_add(1, Ordering::Relaxed);
                std::fs::write(dir.join("busy"), n.to_le_bytes()).unwrap();
            }
        })
    };
    // Writes land in an attempt's window only if the writer is scheduled
    // then: a few attempts, each made while it keeps writing.
    let mut refused = None;
    for attempt in 0..5 {
        let floor = written.load(Ordering::Relaxed) + 2;
        while written.load(Ordering::Relaxed) < floor {
            tokio::task::yield_now().await;
        }
        let name = format!("gs-busy-{attempt}");
        match csi.create_group_snapshot(&name, &ids, HashMap::new()).await {
            Err(status) => {
                refused = Some(status);
                break;
            }
            Ok(group) => csi.delete_whole_group_snapshot(&group).await,
        }
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let error = refused.expect("a group snapshot made while a member was written");
    assert_eq!(error.code(), Code::FailedPrecondition, "{error:?}");
    assert!(error.message().contains("written"), "{error:?}");
    for volume in [&a, &b] {
        csi.delete(&volume.volume_id).await.unwrap();
    }
    assert!(share.leftovers().is_empty(), "{:?}", share.leftovers());
}
