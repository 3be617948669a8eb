//! The CSI controller's behaviour, written once and run for each backend
//! (`csi_aio.rs`, `csi_nvmf.rs`). Every scenario ends with nothing left in
//! the pool or on the target.

use std::collections::HashMap;

use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::volumegroup as vg;
use tonic::Code;

use super::csi::*;
// Used by `scenario_tests!` in the crates that expand it.
#[allow(unused_imports)]
pub use super::group_snapshots::group_snapshots_restore_and_go_together;
#[allow(unused_imports)]
pub use super::qos_scenarios::qos_limits_are_created_modified_and_checked;
use super::{TIMEOUT, equal, eventually, timed};
use csi::volume_capability::AccessType;
use csi::volume_capability::access_mode::Mode;

/// Defines one `#[tokio::test]` per scenario below, each on a fresh controller
/// from `$controller` (an `Option<Csi>` expression, `None` skipping) serving
/// `$backend`, so every backend's test file, and the real-SPDK suite, runs the
/// same list and a new scenario reaches them all.
#[macro_export]
macro_rules! scenario_tests {
    ($controller:expr, $backend:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn create_is_idempotent_by_name() {
            let Some(csi) = $controller else {
                return;
            };
            $crate::common::scenarios::create_is_idempotent_by_name(&csi, $backend).await;
            // Once per backend, a graceful stop is checked to remove the socket.
            csi.stop().await;
        }

        $crate::scenario_tests!(
            @dropped $controller, $backend,
            capacity_ranges_are_honoured,
            bad_requests_leave_nothing,
            lists_page_and_refuse_foreign_tokens,
            capabilities_are_validated,
            volumes_expand,
            snapshots_keep_their_data,
            volumes_clone_volumes,
            volume_groups_hold_and_delete_their_volumes,
            group_snapshots_restore_and_go_together,
            qos_limits_are_created_modified_and_checked,
        );
    };
    (@dropped $controller:expr, $backend:expr, $($scenario:ident,)+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                let Some(csi) = $controller else {
                    return;
                };
                $crate::common::scenarios::$scenario(&csi, $backend).await;
            }
        )+
    };
}

/// The allocation unit of `backend` (the emulator's lvstores use 4 MiB clusters).
pub fn unit(backend: &str) -> u64 {
    if backend == "nvmf" { 4 * MIB } else { MIB }
}

async fn assert_empty(csi: &Csi) {
    let left = csi.leftovers().await;
    assert!(left.is_empty(), "left behind: {left:?}");
}

pub async fn create_is_idempotent_by_name(csi: &Csi, backend: &str) {
    let mut request = volume("pvc-a", backend, 16 * MIB, 0);
    request
        .parameters
        .insert("snap-csi.io/emulation".into(), "virtio-blk".into());
    request
        .parameters
        .insert("csi.storage.k8s.io/pvc/name".into(), "data".into());
    let created = csi.create(request.clone()).await.unwrap();
    assert_eq!(created.volume_id, format!("{backend}-pvc-a"));
    assert_eq!(created.capacity_bytes, (16 * MIB) as i64);
    let context = &created.volume_context;
    assert_eq!(context["backend"], backend);
    assert_eq!(context["snap-csi.io/emulation"], "virtio-blk");
    assert_eq!(context["csi.storage.k8s.io/pvc/name"], "data");
    // Exactly what the plugin's CreateDevice reads.
    snap_csi_spdk_plugin::backend::Backend::from_context(context).unwrap();
    if backend == "aio" {
        assert_eq!(
            context["path"],
            csi.pool.join("aio-pvc-a.img").display().to_string()
        );
        assert_eq!(std::fs::metadata(&context["path"]).unwrap().len(), 16 * MIB);
    } else {
        assert_eq!(context["subnqn"], "nqn.2024-01.io.snap-csi:nvmf-pvc-a");
        assert_eq!(context["trtype"], "tcp");
        assert_eq!(context["adrfam"], "ipv4");
        assert_eq!(context["traddr"], "127.0.0.1");
        assert_eq!(context["trsvcid"], csi.target().listen_port.to_string());
    }

    // The same request, and a compatible one, give the same volume.
    assert_eq!(csi.create(request.clone()).await.unwrap(), created);
    let compatible = volume("pvc-a", backend, 8 * MIB, 32 * MIB);
    let again = csi.create(compatible).await.unwrap();
    assert_eq!(again.volume_id, created.volume_id);
    assert_eq!(again.capacity_bytes, created.capacity_bytes);
    let status = assert_code(
        csi.create(volume("pvc-a", backend, 32 * MIB, 0)).await,
        Code::AlreadyExists,
        "a bigger volume under the same name",
    );
    assert!(status.message().contains("pvc-a"), "{status:?}");
    assert_code(
        csi.create(volume("pvc-a", backend, MIB, 8 * MIB)).await,
        Code::AlreadyExists,
        "a smaller limit under the same name",
    );
    assert_eq!(csi.list_all(0).await, [created.volume_id.as_str()]);

    csi.delete(&created.volume_id).await.unwrap();
    csi.delete(&created.volume_id).await.unwrap();
    csi.delete("pvc-not-ours").await.unwrap();
    assert_code(csi.delete("").await, Code::InvalidArgument, "empty id");
    assert!(csi.list_all(0).await.is_empty());
    assert_empty(csi).await;
}

pub async fn capacity_ranges_are_honoured(csi: &Csi, backend: &str) {
    let unit = unit(backend);
    let default = csi
        .create(volume("pvc-default", backend, 0, 0))
        .await
        .unwrap();
    assert_eq!(default.capacity_bytes, GIB as i64);
    let exact = csi
        .create(volume("pvc-exact", backend, 8 * MIB, 8 * MIB))
        .await
        .unwrap();
    assert_eq!(exact.capacity_bytes, (8 * MIB) as i64);
    let rounded = csi
        .create(volume("pvc-rounded", backend, 5 * MIB, 0))
        .await
        .unwrap();
    assert_eq!(
        rounded.capacity_bytes,
        ((5 * MIB).div_ceil(unit) * unit) as i64
    );
    let capacity = csi.capacity(backend).await.unwrap();
    assert!(capacity.available_capacity > 0);
    assert_eq!(capacity.minimum_volume_size, Some(unit as i64));

    let status = assert_code(
        csi.create(volume("pvc-inverted", backend, 16 * MIB, 8 * MIB))
            .await,
        Code::InvalidArgument,
        "limit below required",
    );
    assert!(status.message().contains("limit_bytes"), "{status:?}");
    assert_code(
        csi.create(volume("pvc-huge", backend, 3 * GIB, 0)).await,
        Code::OutOfRange,
        "more than the whole pool",
    );
    if backend == "nvmf" {
        // No whole cluster between 5 and 7 MiB.
        assert_code(
            csi.create(volume("pvc-between", backend, 5 * MIB, 7 * MIB))
                .await,
            Code::OutOfRange,
            "no unit within the range",
        );
    } else {
        // Provisioned space counts against the pool's capacity: 2 GiB
        // less the 1 GiB default and the others leave less than 1 GiB.
        assert_code(
            csi.create(volume("pvc-more", backend, GIB, 0)).await,
            Code::ResourceExhausted,
            "more than the pool has left",
        );
        assert!(csi.capacity(backend).await.unwrap().available_capacity < GIB as i64);
    }
    for v in [default, exact, rounded] {
        csi.delete(&v.volume_id).await.unwrap();
    }
    assert_empty(csi).await;
}

pub async fn bad_requests_leave_nothing(csi: &Csi, backend: &str) {
    let cases: Vec<(&str, csi::CreateVolumeRequest, Code)> = vec![
        (
            "unknown backend",
            volume("pvc-b", "ceph", MIB, 0),
            Code::InvalidArgument,
        ),
        (
            "unknown parameter",
            {
                let mut r = volume("pvc-b", backend, MIB, 0);
                r.parameters.insert("replicas".into(), "3".into());
                r
            },
            Code::InvalidArgument,
        ),
        (
            "bad emulation",
            {
                let mut r = volume("pvc-b", backend, MIB, 0);
                r.parameters
                    .insert("snap-csi.io/emulation".into(), "scsi".into());
                r
            },
            Code::InvalidArgument,
        ),
        (
            "empty name",
            volume("", backend, MIB, 0),
            Code::InvalidArgument,
        ),
        (
            "control character",
            volume("pvc\u{7}b", backend, MIB, 0),
            Code::InvalidArgument,
        ),
        (
            "overlong name",
            volume(&"n".repeat(129), backend, MIB, 0),
            Code::InvalidArgument,
        ),
        (
            "no capabilities",
            {
                let mut r = volume("pvc-b", backend, MIB, 0);
                r.volume_capabilities.clear();
                r
            },
            Code::InvalidArgument,
        ),
        (
            "multi-node",
            {
                let mut r = volume("pvc-b", backend, MIB, 0);
                r.volume_capabilities = vec![capability(
                    AccessType::Block(Default::default()),
                    Mode::MultiNodeMultiWriter,
                )];
                r
            },
            Code::InvalidArgument,
        ),
        (
            "unknown filesystem",
            {
                let mut r = volume("pvc-b", backend, MIB, 0);
                r.volume_capabilities = vec![capability(
                    AccessType::Mount(csi::volume_capability::MountVolume {
                        fs_type: "zfs".into(),
                        ..Default::default()
                    }),
                    Mode::SingleNodeWriter,
                )];
                r
            },
            Code::InvalidArgument,
        ),
        (
            "negative size",
            {
                let mut r = volume("pvc-b", backend, MIB, 0);
                r.capacity_range.as_mut().unwrap().required_bytes = -1;
                r
            },
            Code::InvalidArgument,
        ),
        (
            "over the pool",
            volume("pvc-b", backend, 4 * GIB, 0),
            Code::OutOfRange,
        ),
        (
            "missing snapshot",
            from_snapshot(
                volume("pvc-b", backend, MIB, 0),
                &format!("snap-{backend}-nope"),
            ),
            Code::NotFound,
        ),
        (
            "foreign snapshot id",
            from_snapshot(volume("pvc-b", backend, MIB, 0), "snapshot-of-someone-else"),
            Code::NotFound,
        ),
        (
            "missing source volume",
            from_volume(volume("pvc-b", backend, MIB, 0), &format!("{backend}-nope")),
            Code::NotFound,
        ),
    ];
    for (what, request, code) in cases {
        let status = assert_code(csi.create(request).await, code, what);
        assert!(!status.message().is_empty(), "{what}: a message says why");
    }
    assert!(csi.list_all(0).await.is_empty());
    assert_empty(csi).await;
}

pub async fn lists_page_and_refuse_foreign_tokens(csi: &Csi, backend: &str) {
    let mut ids = vec![];
    for name in ["pvc-c", "pvc-a", "pvc-b"] {
        ids.push(
            csi.create(volume(name, backend, 4 * MIB, 0))
                .await
                .unwrap()
                .volume_id,
        );
    }
    ids.sort();
    assert_eq!(csi.list_all(2).await, ids);
    assert_eq!(csi.list_all(1).await, ids);
    let first = csi.list(2, "").await.unwrap();
    assert_eq!(first.entries.len(), 2);
    let entry = first.entries[0].volume.as_ref().unwrap();
    assert_eq!(entry.capacity_bytes, (4 * MIB) as i64);
    assert_eq!(entry.volume_context["backend"], backend);
    assert!(!first.next_token.is_empty());
    let last = csi.list(2, &first.next_token).await.unwrap();
    assert_eq!(last.entries.len(), 1);
    assert!(last.next_token.is_empty());
    // A token is a position: it stays good after its volume is gone.
    csi.delete(&ids[1]).await.unwrap();
    let after = csi.list(0, &first.next_token).await.unwrap();
    assert_eq!(after.entries.len(), 1);
    for bad in ["garbage", "after:nothing-of-ours", "after:"] {
        assert_code(csi.list(1, bad).await, Code::Aborted, bad);
    }
    assert_code(
        csi.list(-1, "").await,
        Code::InvalidArgument,
        "negative max",
    );
    for id in [&ids[0], &ids[2]] {
        csi.delete(id).await.unwrap();
    }
    assert_empty(csi).await;
}

pub async fn capabilities_are_validated(csi: &Csi, backend: &str) {
    let v = csi
        .create(volume("pvc-v", backend, 4 * MIB, 0))
        .await
        .unwrap();
    let ok = csi
        .validate(&v.volume_id, vec![mount(), block()])
        .await
        .unwrap();
    let confirmed = ok.confirmed.expect("confirmed");
    assert_eq!(confirmed.volume_capabilities.len(), 2);
    let multi = capability(
        AccessType::Block(Default::default()),
        Mode::MultiNodeReaderOnly,
    );
    let refused = csi
        .validate(&v.volume_id, vec![mount(), multi])
        .await
        .unwrap();
    assert!(refused.confirmed.is_none());
    assert!(
        refused.message.contains("MULTI_NODE_READER_ONLY"),
        "{refused:?}"
    );
    assert_code(
        csi.validate(&format!("{backend}-nope"), vec![mount()])
            .await,
        Code::NotFound,
        "unknown volume",
    );
    assert_code(
        csi.validate("not-ours", vec![mount()]).await,
        Code::NotFound,
        "foreign id",
    );
    assert_code(
        csi.validate(&v.volume_id, vec![]).await,
        Code::InvalidArgument,
        "no capabilities",
    );
    csi.delete(&v.volume_id).await.unwrap();
    assert_empty(csi).await;
}

pub async fn volumes_expand(csi: &Csi, backend: &str) {
    let v = csi
        .create(volume("pvc-x", backend, 16 * MIB, 0))
        .await
        .unwrap();
    // Attached over NVMe/TCP by a real initiator (the emulator's fabric is
    // none), the volume grows online: SPDK's bdev_nvme sees the target's
    // namespace grow. (AIO online growth is the plugin's: `plugin_scenarios`.)
    let remote = csi.remote(&v);
    let attached = match &remote {
        Some(remote) => Some(remote.attach("online").await),
        None => None,
    };
    let grown = csi
        .expand(&v.volume_id, 32 * MIB, Some(mount()))
        .await
        .unwrap();
    assert_eq!(grown.capacity_bytes, (32 * MIB) as i64);
    assert!(
        grown.node_expansion_required,
        "a filesystem grows on the node"
    );
    assert_eq!(csi.size(&v).await, 32 * MIB);
    let block_grown = csi
        .expand(&v.volume_id, 40 * MIB, Some(block()))
        .await
        .unwrap();
    assert_eq!(block_grown.capacity_bytes, (40 * MIB) as i64);
    assert!(!block_grown.node_expansion_required);
    if let Some(session) = attached {
        eventually("the attached namespace's bytes", || async {
            equal(session.size().await, 40 * MIB)
        })
        .await;
        session.detach().await;
    }
    // Asking for less than it has: done, never shrunk.
    let same = csi.expand(&v.volume_id, 8 * MIB, None).await.unwrap();
    assert_eq!(same.capacity_bytes, (40 * MIB) as i64);
    assert_eq!(
        csi.list(0, "").await.unwrap().entries[0]
            .volume
            .as_ref()
            .unwrap()
            .capacity_bytes,
        (40 * MIB) as i64
    );
    assert_code(
        csi.expand(&v.volume_id, 8 * GIB, None).await,
        Code::OutOfRange,
        "beyond the pool",
    );
    assert_code(
        csi.expand(&format!("{backend}-nope"), 8 * MIB, None).await,
        Code::NotFound,
        "unknown volume",
    );
    csi.delete(&v.volume_id).await.unwrap();
    assert_empty(csi).await;
}

fn list_by(snapshot_id: &str, source: &str, max: i32) -> csi::ListSnapshotsRequest {
    csi::ListSnapshotsRequest {
        max_entries: max,
        snapshot_id: snapshot_id.into(),
        source_volume_id: source.into(),
        ..Default::default()
    }
}

pub async fn snapshots_keep_their_data(csi: &Csi, backend: &str) {
    let source = csi
        .create(volume("pvc-src", backend, 16 * MIB, 0))
        .await
        .unwrap();
    let other = csi
        .create(volume("pvc-other", backend, 8 * MIB, 0))
        .await
        .unwrap();
    csi.write(&source, 5 * MIB, b"before the snapshot").await;

    let snap = csi.snapshot("snap-1", &source.volume_id).await.unwrap();
    assert_eq!(snap.snapshot_id, format!("snap-{backend}-snap-1"));
    assert_eq!(snap.source_volume_id, source.volume_id);
    assert_eq!(snap.size_bytes, (16 * MIB) as i64);
    assert!(snap.ready_to_use);
    let taken = snap.creation_time.unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!((now - 60..=now).contains(&taken.seconds), "{taken:?}");
    // Idempotent by name; another source under that name is refused.
    assert_eq!(
        csi.snapshot("snap-1", &source.volume_id).await.unwrap(),
        snap
    );
    assert_code(
        csi.snapshot("snap-1", &other.volume_id).await,
        Code::AlreadyExists,
        "same name, other source",
    );
    assert_code(
        csi.snapshot("snap-x", &format!("{backend}-nope")).await,
        Code::NotFound,
        "unknown source",
    );
    let snap2 = csi.snapshot("snap-2", &other.volume_id).await.unwrap();

    // The volume moves on; the snapshot does not.
    csi.write(&source, 5 * MIB, b"after the snapshot!").await;
    let restored = csi
        .create(from_snapshot(
            volume("pvc-restored", backend, 16 * MIB, 0),
            &snap.snapshot_id,
        ))
        .await
        .unwrap();
    assert_eq!(
        restored.content_source.as_ref().map(|s| s.r#type.is_some()),
        Some(true)
    );
    assert_eq!(
        csi.read(&restored, 5 * MIB, 19).await,
        b"before the snapshot"
    );
    // Bigger than its snapshot is fine; smaller is not possible.
    let bigger = csi
        .create(from_snapshot(
            volume("pvc-bigger", backend, 32 * MIB, 0),
            &snap.snapshot_id,
        ))
        .await
        .unwrap();
    assert_eq!(bigger.capacity_bytes, (32 * MIB) as i64);
    assert_eq!(csi.read(&bigger, 5 * MIB, 19).await, b"before the snapshot");
    assert_code(
        csi.create(from_snapshot(
            volume("pvc-small", backend, 4 * MIB, 8 * MIB),
            &snap.snapshot_id,
        ))
        .await,
        Code::OutOfRange,
        "smaller than the snapshot",
    );
    let other_backend = if backend == "aio" { "nvmf" } else { "aio" };
    assert_code(
        csi.create(from_snapshot(
            volume("pvc-cross", other_backend, 16 * MIB, 0),
            &snap.snapshot_id,
        ))
        .await,
        Code::InvalidArgument,
        "a source on another backend",
    );

    // Listing: by id, by source, all in pages; foreign tokens are refused.
    let mut all = vec![snap.snapshot_id.clone(), snap2.snapshot_id.clone()];
    all.sort();
    assert_eq!(csi.list_snapshots_all(list_by("", "", 1)).await, all);
    assert_eq!(
        csi.list_snapshots_all(list_by(&snap.snapshot_id, "", 0))
            .await,
        [snap.snapshot_id.as_str()]
    );
    assert_eq!(
        csi.list_snapshots_all(list_by("", &other.volume_id, 0))
            .await,
        [snap2.snapshot_id.as_str()]
    );
    assert!(
        csi.list_snapshots_all(list_by(&format!("snap-{backend}-nope"), "", 0))
            .await
            .is_empty()
    );
    assert!(
        csi.list_snapshots_all(list_by("garbage", "", 0))
            .await
            .is_empty()
    );
    let listed = csi
        .list_snapshots(list_by(&snap.snapshot_id, "", 0))
        .await
        .unwrap();
    assert_eq!(listed.entries[0].snapshot.as_ref().unwrap(), &snap);
    let mut bad = list_by("", "", 1);
    bad.starting_token = "nope".into();
    assert_code(
        csi.list_snapshots(bad).await,
        Code::Aborted,
        "foreign token",
    );
    let got = csi
        .controller
        .clone()
        .get_snapshot(timed(
            csi::GetSnapshotRequest {
                snapshot_id: snap.snapshot_id.clone(),
                ..Default::default()
            },
            TIMEOUT,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.snapshot.unwrap(), snap);

    // A snapshot outlives its volume and still makes volumes.
    csi.delete(&source.volume_id).await.unwrap();
    let late = csi
        .create(from_snapshot(
            volume("pvc-late", backend, 0, 0),
            &snap.snapshot_id,
        ))
        .await
        .unwrap();
    assert_eq!(late.capacity_bytes, (16 * MIB) as i64);
    assert_eq!(csi.read(&late, 5 * MIB, 19).await, b"before the snapshot");

    // Deleting snapshots leaves the volumes made from them whole.
    for s in [&snap.snapshot_id, &snap2.snapshot_id] {
        csi.delete_snapshot(s).await.unwrap();
        csi.delete_snapshot(s).await.unwrap();
    }
    csi.delete_snapshot("not-ours").await.unwrap();
    assert!(csi.list_snapshots_all(list_by("", "", 0)).await.is_empty());
    assert_eq!(
        csi.read(&restored, 5 * MIB, 19).await,
        b"before the snapshot"
    );
    for v in [&other, &restored, &bigger, &late] {
        csi.delete(&v.volume_id).await.unwrap();
    }
    assert_empty(csi).await;
}

pub async fn volumes_clone_volumes(csi: &Csi, backend: &str) {
    let source = csi
        .create(volume("pvc-orig", backend, 8 * MIB, 0))
        .await
        .unwrap();
    csi.write(&source, 3 * MIB, b"original bytes").await;
    let clone = csi
        .create(from_volume(
            volume("pvc-clone", backend, 8 * MIB, 0),
            &source.volume_id,
        ))
        .await
        .unwrap();
    assert_eq!(clone.capacity_bytes, (8 * MIB) as i64);
    assert_eq!(csi.read(&clone, 3 * MIB, 14).await, b"original bytes");
    // Idempotent, and independent of each other.
    let again = csi
        .create(from_volume(
            volume("pvc-clone", backend, 8 * MIB, 0),
            &source.volume_id,
        ))
        .await
        .unwrap();
    assert_eq!(again.volume_id, clone.volume_id);
    csi.write(&clone, 3 * MIB, b"changed clone!").await;
    assert_eq!(csi.read(&source, 3 * MIB, 14).await, b"original bytes");
    assert_eq!(csi.list_all(0).await.len(), 2, "no helper object is listed");
    csi.delete(&source.volume_id).await.unwrap();
    assert_eq!(csi.read(&clone, 3 * MIB, 14).await, b"changed clone!");
    csi.delete(&clone.volume_id).await.unwrap();
    assert_empty(csi).await;
}

async fn group_call<T, R>(
    csi: &Csi,
    request: T,
    call: impl AsyncFnOnce(
        vg::controller_client::ControllerClient<tonic::transport::Channel>,
        tonic::Request<T>,
    ) -> Result<tonic::Response<R>, tonic::Status>,
) -> Result<R, tonic::Status> {
    call(csi.groups.clone(), timed(request, TIMEOUT))
        .await
        .map(|r| r.into_inner())
}

async fn create_group(
    csi: &Csi,
    name: &str,
    parameters: HashMap<String, String>,
) -> Result<vg::VolumeGroup, tonic::Status> {
    let request = vg::CreateVolumeGroupRequest {
        name: name.into(),
        parameters,
        secrets: HashMap::new(),
    };
    group_call(csi, request, async |mut c, r| {
        c.create_volume_group(r).await
    })
    .await
    .map(|r| r.volume_group.unwrap())
}

async fn modify_group(
    csi: &Csi,
    id: &str,
    volumes: &[&str],
) -> Result<vg::VolumeGroup, tonic::Status> {
    let request = vg::ModifyVolumeGroupMembershipRequest {
        volume_group_id: id.into(),
        volume_ids: volumes.iter().map(|v| v.to_string()).collect(),
        secrets: HashMap::new(),
    };
    group_call(csi, request, async |mut c, r| {
        c.modify_volume_group_membership(r).await
    })
    .await
    .map(|r| r.volume_group.unwrap())
}

async fn get_group(csi: &Csi, id: &str) -> Result<vg::VolumeGroup, tonic::Status> {
    let request = vg::ControllerGetVolumeGroupRequest {
        volume_group_id: id.into(),
        secrets: HashMap::new(),
    };
    group_call(csi, request, async |mut c, r| {
        c.controller_get_volume_group(r).await
    })
    .await
    .map(|r| r.volume_group.unwrap())
}

async fn delete_group(csi: &Csi, id: &str) -> Result<(), tonic::Status> {
    let request = vg::DeleteVolumeGroupRequest {
        volume_group_id: id.into(),
        secrets: HashMap::new(),
    };
    group_call(csi, request, async |mut c, r| {
        c.delete_volume_group(r).await
    })
    .await
    .map(drop)
}

async fn list_groups(
    csi: &Csi,
    max: i32,
    token: &str,
) -> Result<vg::ListVolumeGroupsResponse, tonic::Status> {
    let request = vg::ListVolumeGroupsRequest {
        max_entries: max,
        starting_token: token.into(),
        secrets: HashMap::new(),
    };
    group_call(csi, request, async |mut c, r| c.list_volume_groups(r).await).await
}

fn members(group: &vg::VolumeGroup) -> Vec<String> {
    let mut ids: Vec<String> = group.volumes.iter().map(|v| v.volume_id.clone()).collect();
    ids.sort();
    ids
}

pub async fn volume_groups_hold_and_delete_their_volumes(csi: &Csi, backend: &str) {
    let a = csi
        .create(volume("pvc-ga", backend, 4 * MIB, 0))
        .await
        .unwrap()
        .volume_id;
    let b = csi
        .create(volume("pvc-gb", backend, 4 * MIB, 0))
        .await
        .unwrap()
        .volume_id;
    let group = create_group(csi, "group-1", HashMap::new()).await.unwrap();
    assert_eq!(group.volume_group_id, "group-group-1");
    assert!(group.volumes.is_empty());
    assert_eq!(
        create_group(csi, "group-1", HashMap::new()).await.unwrap(),
        group
    );
    let k8s = HashMap::from([("csi.storage.k8s.io/vgc".to_string(), "x".to_string())]);
    assert_code(
        create_group(csi, "group-1", k8s).await,
        Code::AlreadyExists,
        "other parameters",
    );
    let unknown = HashMap::from([("tier".to_string(), "gold".to_string())]);
    assert_code(
        create_group(csi, "group-2", unknown).await,
        Code::InvalidArgument,
        "unknown parameter",
    );
    assert_code(
        create_group(csi, "", HashMap::new()).await,
        Code::InvalidArgument,
        "no name",
    );
    let id = group.volume_group_id.clone();

    let modified = modify_group(csi, &id, &[&a, &b, &a]).await.unwrap();
    assert_eq!(members(&modified), {
        let mut m = vec![a.clone(), b.clone()];
        m.sort();
        m
    });
    assert_eq!(modified.volumes[0].capacity_bytes, (4 * MIB) as i64);
    assert_eq!(modified.volumes[0].volume_context["backend"], backend);
    assert_code(
        modify_group(csi, &id, &[&a, &format!("{backend}-nope")]).await,
        Code::NotFound,
        "unknown volume",
    );
    assert_code(
        modify_group(csi, "group-nope", &[&a]).await,
        Code::NotFound,
        "unknown group",
    );
    // The failed change changed nothing.
    assert_eq!(members(&get_group(csi, &id).await.unwrap()).len(), 2);
    let status = assert_code(csi.delete(&a).await, Code::FailedPrecondition, "a member");
    assert!(status.message().contains(&id), "{status:?}");
    let other = create_group(csi, "group-3", HashMap::new()).await.unwrap();
    assert_code(
        modify_group(csi, &other.volume_group_id, &[&a]).await,
        Code::FailedPrecondition,
        "a volume in another group",
    );

    // Listing pages; foreign tokens are refused.
    let first = list_groups(csi, 1, "").await.unwrap();
    assert_eq!(first.entries.len(), 1);
    let second = list_groups(csi, 1, &first.next_token).await.unwrap();
    assert_eq!(second.entries.len(), 1);
    assert!(second.next_token.is_empty());
    assert_code(
        list_groups(csi, 1, "bogus").await,
        Code::Aborted,
        "foreign token",
    );
    assert_code(
        get_group(csi, "group-nope").await,
        Code::NotFound,
        "unknown group",
    );

    // Out of the group, a volume stays and may be deleted; the group takes its members with it.
    let fewer = modify_group(csi, &id, &[&b]).await.unwrap();
    assert_eq!(members(&fewer), [b.as_str()]);
    delete_group(csi, &id).await.unwrap();
    delete_group(csi, &id).await.unwrap();
    delete_group(csi, "group-nope").await.unwrap();
    assert_code(get_group(csi, &id).await, Code::NotFound, "deleted group");
    assert_eq!(csi.list_all(0).await, [a.as_str()]);
    csi.delete(&a).await.unwrap();
    delete_group(csi, &other.volume_group_id).await.unwrap();
    assert!(list_groups(csi, 0, "").await.unwrap().entries.is_empty());
    assert_empty(csi).await;
}
