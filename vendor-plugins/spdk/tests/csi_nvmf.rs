//! The CSI controller's NVMe-oF backend: volumes are lvols on an emulator
//! playing the remote SPDK target (see `common/scenarios.rs`).

mod common;

use common::csi::{Backends, Csi};

const BACKEND: &str = "nvmf";

async fn controller() -> Csi {
    Csi::start(Backends {
        aio: false,
        nvmf: true,
        default: "nvmf",
    })
    .await
}

scenario_tests!(Some(controller().await), BACKEND);

/// The lvol of volume `volume_id` (8 MiB, thin), as an interrupted
/// CreateVolume leaves it.
async fn half_made(csi: &Csi, volume_id: &str) {
    use common::csi::LVSTORE;
    use snap_csi::spdk::lvol::BdevLvolCreate;

    let create = BdevLvolCreate {
        lvol_name: volume_id.into(),
        size_in_mib: 8,
        lvs_name: Some(LVSTORE.into()),
        uuid: None,
        thin_provision: Some(true),
    };
    csi.target().spdk.client().call(&create).await.unwrap();
}

/// A CreateVolume interrupted after its lvol (or part of its subsystem) was
/// made is finished by the next one; one given up is removed by DeleteVolume,
/// helper snapshot included.
#[tokio::test]
async fn interrupted_creates_are_finished_or_cleaned_up() {
    use common::csi::{LVSTORE, MIB, from_volume, volume};
    use snap_csi::spdk::lvol::BdevLvolSnapshot;
    use snap_csi::spdk::nvmf::NvmfCreateSubsystem;

    let csi = controller().await;
    let spdk = csi.target().spdk.client();
    // The lvol made, the subsystem begun, then the controller died.
    half_made(&csi, "nvmf-pvc-half").await;
    spdk.call(&NvmfCreateSubsystem {
        nqn: "nqn.2024-01.io.snap-csi:nvmf-pvc-half".into(),
        serial_number: None,
        model_number: None,
        allow_any_host: Some(true),
        max_namespaces: Some(1),
    })
    .await
    .unwrap();
    let finished = csi
        .create(volume("pvc-half", BACKEND, 8 * MIB, 0))
        .await
        .unwrap();
    assert_eq!(finished.volume_id, "nvmf-pvc-half");
    let subsystem = &spdk
        .call(&snap_csi::spdk::nvmf::NvmfGetSubsystems {
            nqn: Some("nqn.2024-01.io.snap-csi:nvmf-pvc-half".into()),
        })
        .await
        .unwrap()[0];
    assert_eq!(subsystem.namespaces.len(), 1);
    assert_eq!(subsystem.listen_addresses.len(), 1);
    // Finished once, it is simply there.
    assert_eq!(
        csi.create(volume("pvc-half", BACKEND, 8 * MIB, 0))
            .await
            .unwrap(),
        finished
    );

    // A clone from a volume that got as far as its helper snapshot, then was
    // given up: DeleteVolume leaves nothing of it.
    spdk.call(&BdevLvolSnapshot {
        lvol_name: format!("{LVSTORE}/nvmf-pvc-half"),
        snapshot_name: "tmp-nvmf-pvc-abandoned".into(),
    })
    .await
    .unwrap();
    csi.delete("nvmf-pvc-abandoned").await.unwrap();
    // ... and a retried clone reuses the helper snapshot and removes it.
    spdk.call(&BdevLvolSnapshot {
        lvol_name: format!("{LVSTORE}/nvmf-pvc-half"),
        snapshot_name: "tmp-nvmf-pvc-retried".into(),
    })
    .await
    .unwrap();
    let retried = csi
        .create(from_volume(
            volume("pvc-retried", BACKEND, 8 * MIB, 0),
            &finished.volume_id,
        ))
        .await
        .unwrap();
    let mut left = csi.leftovers().await;
    // The two volumes' own records; gone with them (checked below).
    left.retain(|o| !o.contains("/nvmf-volumes/"));
    left.sort();
    assert_eq!(
        left,
        [
            "lvs0/nvmf-pvc-half",
            "lvs0/nvmf-pvc-retried",
            "nqn.2024-01.io.snap-csi:nvmf-pvc-half",
            "nqn.2024-01.io.snap-csi:nvmf-pvc-retried",
        ]
    );
    for v in [&finished, &retried] {
        csi.delete(&v.volume_id).await.unwrap();
    }
    assert!(csi.leftovers().await.is_empty());
}

/// A pause intent left by a controller that died between pause and resume
/// is resumed and dropped by the next one before any group snapshot
/// operation of its own (the real target's pause is proven in
/// `real_spdk_group_snapshots.rs`; the emulator holds no I/O).
#[tokio::test]
async fn a_pause_intent_left_by_a_crash_is_resumed_and_dropped() {
    use common::csi::{MIB, volume};
    use std::collections::HashMap;

    let mut csi = controller().await;
    let a = csi
        .create(volume("pvc-intent", BACKEND, 8 * MIB, 0))
        .await
        .unwrap();
    csi.store_pause_intent(
        "gsnap-nvmf-crashed",
        &[
            &a.volume_context["subnqn"],
            "nqn.2024-01.io.snap-csi:nvmf-gone",
        ],
    );
    csi.restart().await;
    // Waits for the start-up's recovery, then finds nothing left to resume.
    csi.delete_group_snapshot("gsnap-nvmf-none", &[])
        .await
        .unwrap();
    assert_eq!(csi.state_records("nvmf-paused"), 0);
    // A group snapshot writes its own intent and drops it when done.
    let group = csi
        .create_group_snapshot("gs-intent", &[&a.volume_id], HashMap::new())
        .await
        .unwrap();
    assert_eq!(csi.state_records("nvmf-paused"), 0);
    csi.delete_whole_group_snapshot(&group).await;
    csi.delete(&a.volume_id).await.unwrap();
}

/// A group snapshot whose members are not all there (a cut interrupted by a
/// crash) is not ready, and the retried CreateVolumeGroupSnapshot cuts every
/// member again in one window rather than completing it member by member.
#[tokio::test]
async fn an_interrupted_group_snapshot_is_cut_again_whole() {
    use common::csi::{LVSTORE, MIB, from_snapshot, volume};
    use common::group_snapshots::member_of;
    use snap_csi::spdk::lvol::BdevLvolDelete;
    use std::collections::HashMap;

    let csi = controller().await;
    let a = csi
        .create(volume("pvc-cut-a", BACKEND, 8 * MIB, 0))
        .await
        .unwrap();
    let b = csi
        .create(volume("pvc-cut-b", BACKEND, 8 * MIB, 0))
        .await
        .unwrap();
    let volumes = [a.volume_id.as_str(), b.volume_id.as_str()];
    csi.write(&a, MIB, b"old").await;
    let first = csi
        .create_group_snapshot("gs-cut", &volumes, HashMap::new())
        .await
        .unwrap();
    let lost = &first.snapshots[1].snapshot_id;
    csi.target()
        .spdk
        .client()
        .call(&BdevLvolDelete {
            name: format!("{LVSTORE}/{lost}"),
        })
        .await
        .unwrap();
    let ids: Vec<&str> = first
        .snapshots
        .iter()
        .map(|s| s.snapshot_id.as_str())
        .collect();
    let half = csi
        .get_group_snapshot(&first.group_snapshot_id, &ids)
        .await
        .unwrap();
    assert!(!half.ready_to_use);
    assert!(half.snapshots[0].ready_to_use && !half.snapshots[1].ready_to_use);
    csi.write(&a, MIB, b"new").await;
    let again = csi
        .create_group_snapshot("gs-cut", &volumes, HashMap::new())
        .await
        .unwrap();
    assert!(again.ready_to_use);
    assert_eq!(again.group_snapshot_id, first.group_snapshot_id);
    // Both members are new: the one that survived was cut again with the other.
    assert_ne!(again.creation_time, first.creation_time);
    assert!(
        again
            .snapshots
            .iter()
            .all(|s| s.creation_time == again.creation_time)
    );
    // And holds what A held at the retry, not at the first cut.
    let restored = csi
        .create(from_snapshot(
            volume("pvc-cut-r", BACKEND, 0, 0),
            &member_of(&again, &a.volume_id),
        ))
        .await
        .unwrap();
    assert_eq!(csi.read(&restored, MIB, 3).await, b"new");
    csi.delete(&restored.volume_id).await.unwrap();
    csi.delete_whole_group_snapshot(&again).await;
    for v in volumes {
        csi.delete(v).await.unwrap();
    }
    assert!(csi.target().objects().await.is_empty());
}

/// A restarted target (its pool made again by its start-up configuration)
/// finds its lvstore, and the controller exports every volume it had
/// exported again, QoS limits included (ModifyVolume's too), bytes intact;
/// a volume whose CreateVolume never finished is left for the next
/// CreateVolume, which may still have to decouple or grow it.
#[tokio::test]
async fn a_restarted_targets_volumes_are_exported_again_with_their_limits() {
    use common::csi::{LVSTORE, MIB, volume};
    use common::{equal, eventually};
    use snap_csi_spdk_plugin::qos::{RW_IOPS_KEY, W_MBYTES_KEY};

    let mut csi = controller().await;
    let mut request = volume("pvc-kept", BACKEND, 8 * MIB, 0);
    request.parameters.insert(RW_IOPS_KEY.into(), "4000".into());
    let kept = csi.create(request).await.unwrap();
    csi.modify(&kept.volume_id, &[(W_MBYTES_KEY, "20")])
        .await
        .unwrap();
    let plain = csi
        .create(volume("pvc-plain", BACKEND, 8 * MIB, 0))
        .await
        .unwrap();
    csi.write(&kept, 4096, b"kept across the restart").await;
    // A CreateVolume that made its lvol and then stopped.
    half_made(&csi, "nvmf-pvc-half").await;
    let limits = csi.qos_limits(&kept).await;
    assert_eq!(limits, [4000, 0, 0, 20]);
    let everything = csi.target().objects().await;

    csi.target.as_mut().unwrap().restart().await;
    // Only the lvols come back with the target itself.
    let lvols: Vec<String> = everything
        .iter()
        .filter(|o| o.starts_with(LVSTORE))
        .cloned()
        .collect();
    assert_eq!(csi.target().objects().await.len(), lvols.len());

    let half = "nqn.2024-01.io.snap-csi:nvmf-pvc-half".to_string();
    let want: Vec<String> = everything.into_iter().filter(|o| *o != half).collect();
    eventually("the exports restored", || async {
        equal(csi.target().objects().await, want.clone())
    })
    .await;
    assert_eq!(csi.qos_limits(&kept).await, limits);
    assert_eq!(csi.qos_limits(&plain).await, [0; 4]);
    assert_eq!(
        csi.read(&kept, 4096, 23).await,
        b"kept across the restart".to_vec()
    );

    for v in [&kept, &plain] {
        csi.delete(&v.volume_id).await.unwrap();
    }
    csi.delete("nvmf-pvc-half").await.unwrap();
    assert_eq!(csi.leftovers().await, Vec::<String>::new());
}
