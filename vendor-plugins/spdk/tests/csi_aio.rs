//! The CSI controller's AIO backend: volumes are sparse files in a pool
//! directory (over real gRPC; see `common/scenarios.rs` for what each checks).

mod common;

use common::csi::{Backends, Csi};
use common::scenarios;

const BACKEND: &str = "aio";

async fn controller() -> Csi {
    Csi::start(Backends {
        aio: true,
        nvmf: false,
        default: "aio",
    })
    .await
}

#[tokio::test]
async fn create_is_idempotent_by_name() {
    let csi = controller().await;
    scenarios::create_is_idempotent_by_name(&csi, BACKEND).await;
    csi.stop().await;
}

#[tokio::test]
async fn capacity_ranges_are_honoured() {
    let csi = controller().await;
    scenarios::capacity_ranges_are_honoured(&csi, BACKEND).await;
}

#[tokio::test]
async fn bad_requests_leave_nothing() {
    let csi = controller().await;
    scenarios::bad_requests_leave_nothing(&csi, BACKEND).await;
}

#[tokio::test]
async fn lists_page_and_refuse_foreign_tokens() {
    let csi = controller().await;
    scenarios::lists_page_and_refuse_foreign_tokens(&csi, BACKEND).await;
}

#[tokio::test]
async fn capabilities_are_validated() {
    let csi = controller().await;
    scenarios::capabilities_are_validated(&csi, BACKEND).await;
}

#[tokio::test]
async fn volumes_expand() {
    let csi = controller().await;
    scenarios::volumes_expand(&csi, BACKEND).await;
}

#[tokio::test]
async fn snapshots_keep_their_data() {
    let csi = controller().await;
    scenarios::snapshots_keep_their_data(&csi, BACKEND).await;
}

#[tokio::test]
async fn volumes_clone_volumes() {
    let csi = controller().await;
    scenarios::volumes_clone_volumes(&csi, BACKEND).await;
}

#[tokio::test]
async fn volume_groups_hold_and_delete_their_volumes() {
    let csi = controller().await;
    scenarios::volume_groups_hold_and_delete_their_volumes(&csi, BACKEND).await;
}

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
