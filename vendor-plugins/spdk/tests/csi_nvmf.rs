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

/// A CreateVolume interrupted after its lvol (or part of its subsystem) was
/// made is finished by the next one; one given up is removed by DeleteVolume,
/// helper snapshot included.
#[tokio::test]
async fn interrupted_creates_are_finished_or_cleaned_up() {
    use common::csi::{LVSTORE, MIB, from_volume, volume};
    use snap_csi::spdk::lvol::{BdevLvolCreate, BdevLvolSnapshot};
    use snap_csi::spdk::nvmf::NvmfCreateSubsystem;

    let csi = controller().await;
    let spdk = csi.target().spdk.client();
    // The lvol made, the subsystem begun, then the controller died.
    spdk.call(&BdevLvolCreate {
        lvol_name: "nvmf-pvc-half".into(),
        size_in_mib: 8,
        lvs_name: Some(LVSTORE.into()),
        uuid: None,
        thin_provision: Some(true),
    })
    .await
    .unwrap();
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
