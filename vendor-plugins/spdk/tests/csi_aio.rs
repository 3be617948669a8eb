//! The CSI controller's AIO backend: volumes are sparse files in a pool
//! directory (over real gRPC; see `common/scenarios.rs` for what each checks).

mod common;

use common::csi::{Backends, Csi};

const BACKEND: &str = "aio";

async fn controller() -> Csi {
    Csi::start(Backends {
        aio: true,
        nvmf: false,
        default: "aio",
    })
    .await
}

scenario_tests!(Some(controller().await), BACKEND);

/// A CreateVolume interrupted while writing its file leaves only a hidden
/// temporary file, which the next attempt replaces and DeleteVolume removes;
/// lists never show it.
#[tokio::test]
async fn interrupted_creates_leave_only_temporary_files() {
    use common::csi::{MIB, volume};

    let csi = controller().await;
    std::fs::create_dir_all(&csi.pool).unwrap();
    let temp = csi.pool.join(".aio-pvc-t.img.tmp");
    std::fs::write(&temp, b"half a copy").unwrap();
    assert!(csi.list_all(0).await.is_empty());
    let created = csi
        .create(volume("pvc-t", BACKEND, 4 * MIB, 0))
        .await
        .unwrap();
    assert!(!temp.exists());
    assert_eq!(
        std::fs::metadata(&created.volume_context["path"])
            .unwrap()
            .len(),
        4 * MIB
    );
    csi.delete(&created.volume_id).await.unwrap();

    std::fs::write(&temp, b"given up").unwrap();
    csi.delete("aio-pvc-t").await.unwrap();
    assert!(!temp.exists());
    assert!(csi.leftovers().await.is_empty());
}
