//! The GroupController's calls and its scenario, run for each backend with
//! the others in `scenarios.rs`.

use std::collections::HashMap;

use snap_csi::json_dir::JsonDir;
use snap_csi::proto::csi::v1 as csi;
use snap_csi_spdk_plugin::csi::nvmf::PauseIntent;
use tonic::{Code, Status};

use super::csi::*;
use super::{TIMEOUT, timed};

impl Csi {
    pub async fn create_group_snapshot(
        &self,
        name: &str,
        volumes: &[&str],
        parameters: HashMap<String, String>,
    ) -> Result<csi::VolumeGroupSnapshot, Status> {
        let request = csi::CreateVolumeGroupSnapshotRequest {
            name: name.into(),
            source_volume_ids: volumes.iter().map(|v| v.to_string()).collect(),
            secrets: HashMap::new(),
            parameters,
        };
        Ok(self
            .group_snapshots
            .clone()
            .create_volume_group_snapshot(timed(request, TIMEOUT))
            .await?
            .into_inner()
            .group_snapshot
            .expect("a group snapshot"))
    }

    pub async fn get_group_snapshot(
        &self,
        id: &str,
        snapshot_ids: &[&str],
    ) -> Result<csi::VolumeGroupSnapshot, Status> {
        let request = csi::GetVolumeGroupSnapshotRequest {
            group_snapshot_id: id.into(),
            snapshot_ids: snapshot_ids.iter().map(|s| s.to_string()).collect(),
            secrets: HashMap::new(),
        };
        Ok(self
            .group_snapshots
            .clone()
            .get_volume_group_snapshot(timed(request, TIMEOUT))
            .await?
            .into_inner()
            .group_snapshot
            .expect("a group snapshot"))
    }

    pub async fn delete_group_snapshot(
        &self,
        id: &str,
        snapshot_ids: &[&str],
    ) -> Result<(), Status> {
        let request = csi::DeleteVolumeGroupSnapshotRequest {
            group_snapshot_id: id.into(),
            snapshot_ids: snapshot_ids.iter().map(|s| s.to_string()).collect(),
            secrets: HashMap::new(),
        };
        self.group_snapshots
            .clone()
            .delete_volume_group_snapshot(timed(request, TIMEOUT))
            .await?;
        Ok(())
    }
}

impl Csi {
    /// How many records the controller's state directory holds under `dir`.
    pub fn state_records(&self, dir: &str) -> usize {
        JsonDir::open(self.state.join(dir))
            .unwrap()
            .count()
            .unwrap()
    }

    /// The pause intent a controller writes before pausing `nqns`.
    pub fn store_pause_intent(&self, group_snapshot_id: &str, nqns: &[&str]) {
        let intent = PauseIntent {
            group_snapshot_id: group_snapshot_id.into(),
            nqns: nqns.iter().map(|n| n.to_string()).collect(),
        };
        JsonDir::open(self.state.join("nvmf-paused"))
            .unwrap()
            .store(group_snapshot_id, &intent)
            .unwrap();
    }
}

impl Csi {
    /// Deletes a group snapshot, naming its members.
    pub async fn delete_whole_group_snapshot(&self, group: &csi::VolumeGroupSnapshot) {
        self.delete_group_snapshot(&group.group_snapshot_id, &member_ids(group))
            .await
            .unwrap();
    }
}

/// The snapshot id of `volume_id`'s member of a group snapshot.
pub fn member_of(group: &csi::VolumeGroupSnapshot, volume_id: &str) -> String {
    group
        .snapshots
        .iter()
        .find(|s| s.source_volume_id == volume_id)
        .unwrap_or_else(|| panic!("no member of {volume_id} in {group:?}"))
        .snapshot_id
        .clone()
}

/// The member snapshot ids of a group snapshot, sorted.
pub fn member_ids(group: &csi::VolumeGroupSnapshot) -> Vec<&str> {
    let mut ids: Vec<&str> = group
        .snapshots
        .iter()
        .map(|s| s.snapshot_id.as_str())
        .collect();
    ids.sort_unstable();
    ids
}

pub async fn group_snapshots_restore_and_go_together(csi: &Csi, backend: &str) {
    let a = csi
        .create(volume("pvc-gsa", backend, 8 * MIB, 0))
        .await
        .unwrap();
    let b = csi
        .create(volume("pvc-gsb", backend, 8 * MIB, 0))
        .await
        .unwrap();
    let c = csi
        .create(volume("pvc-gsc", backend, 8 * MIB, 0))
        .await
        .unwrap();
    let (a_id, b_id) = (a.volume_id.as_str(), b.volume_id.as_str());
    csi.write(&a, MIB, b"a before").await;
    csi.write(&b, 2 * MIB, b"b before").await;

    let group = csi
        .create_group_snapshot("gs-1", &[b_id, a_id], HashMap::new())
        .await
        .unwrap();
    assert_eq!(group.group_snapshot_id, format!("gsnap-{backend}-gs-1"));
    assert!(group.ready_to_use);
    assert_eq!(group.snapshots.len(), 2);
    let taken = group.creation_time.unwrap();
    for s in &group.snapshots {
        assert_eq!(s.group_snapshot_id, group.group_snapshot_id);
        assert!(s.ready_to_use);
        assert_eq!(s.creation_time, Some(taken));
        assert_eq!(s.size_bytes, (8 * MIB) as i64);
    }
    let mut sources: Vec<&str> = group
        .snapshots
        .iter()
        .map(|s| s.source_volume_id.as_str())
        .collect();
    sources.sort_unstable();
    assert_eq!(sources, [a_id, b_id]);
    let of = |volume: &str| member_of(&group, volume);
    let members = member_ids(&group);

    // Idempotent by name, whatever the order; other volumes or parameters
    // under that name are refused and change nothing.
    assert_eq!(
        csi.create_group_snapshot("gs-1", &[a_id, b_id], HashMap::new())
            .await
            .unwrap(),
        group
    );
    assert_code(
        csi.create_group_snapshot("gs-1", &[a_id, c.volume_id.as_str()], HashMap::new())
            .await,
        Code::AlreadyExists,
        "same name, other volumes",
    );
    let metadata = HashMap::from([(
        "csi.storage.k8s.io/volumegroupsnapshot/name".to_string(),
        "x".to_string(),
    )]);
    assert_code(
        csi.create_group_snapshot("gs-1", &[a_id, b_id], metadata)
            .await,
        Code::AlreadyExists,
        "same name, other parameters",
    );
    // Bad requests, each its code, nothing made.
    for (name, volumes, parameters, code, what) in [
        (
            "",
            vec![a_id],
            HashMap::new(),
            Code::InvalidArgument,
            "no name",
        ),
        (
            "gs-x",
            vec![],
            HashMap::new(),
            Code::InvalidArgument,
            "no volumes",
        ),
        (
            "gs-x",
            vec![a_id, a_id],
            HashMap::new(),
            Code::InvalidArgument,
            "a volume twice",
        ),
        (
            "gs-x",
            vec![a_id],
            HashMap::from([("bogus".to_string(), "1".to_string())]),
            Code::InvalidArgument,
            "an unknown parameter",
        ),
        (
            "gs-x",
            vec![a_id, "pvc-foreign"],
            HashMap::new(),
            Code::NotFound,
            "a foreign id",
        ),
        (
            "gs-x",
            vec![a_id, &format!("{backend}-nope")],
            HashMap::new(),
            Code::NotFound,
            "a volume that does not exist",
        ),
        (
            "gs-x",
            vec![
                a_id,
                if backend == "aio" {
                    "nvmf-pvc-1"
                } else {
                    "aio-pvc-1"
                },
            ],
            HashMap::new(),
            Code::FailedPrecondition,
            "volumes on two backends",
        ),
    ] {
        assert_code(
            csi.create_group_snapshot(name, &volumes, parameters).await,
            code,
            what,
        );
    }
    assert_code(
        csi.get_group_snapshot(&format!("gsnap-{backend}-gs-x"), &[])
            .await,
        Code::NotFound,
        "nothing was made by a refused request",
    );

    // Members are listed with their group, restore as volumes, and go only
    // with their group.
    let listed = csi
        .list_snapshots(csi::ListSnapshotsRequest {
            snapshot_id: of(a_id),
            ..Default::default()
        })
        .await
        .unwrap();
    let listed = listed.entries[0].snapshot.as_ref().unwrap();
    assert_eq!(listed.group_snapshot_id, group.group_snapshot_id);
    assert_eq!(listed.source_volume_id, a_id);
    let mut all = csi
        .list_snapshots_all(csi::ListSnapshotsRequest::default())
        .await;
    all.sort();
    assert_eq!(all, members);
    csi.write(&a, MIB, b"a after!").await;
    let restored = csi
        .create(from_snapshot(volume("pvc-gsr", backend, 0, 0), &of(a_id)))
        .await
        .unwrap();
    assert_eq!(csi.read(&restored, MIB, 8).await, b"a before");
    let restored_b = csi
        .create(from_snapshot(volume("pvc-gsrb", backend, 0, 0), &of(b_id)))
        .await
        .unwrap();
    assert_eq!(csi.read(&restored_b, 2 * MIB, 8).await, b"b before");
    let status = assert_code(
        csi.delete_snapshot(&of(a_id)).await,
        Code::FailedPrecondition,
        "a member deleted alone",
    );
    assert!(
        status.message().contains(&group.group_snapshot_id),
        "{status:?}"
    );

    // Get and Delete check the members they are told of.
    assert_eq!(
        csi.get_group_snapshot(&group.group_snapshot_id, &members)
            .await
            .unwrap(),
        group
    );
    for (ids, what) in [(&members[..1], "a member missing"), (&[][..], "no members")] {
        assert_code(
            csi.get_group_snapshot(&group.group_snapshot_id, ids).await,
            Code::InvalidArgument,
            what,
        );
        assert_code(
            csi.delete_group_snapshot(&group.group_snapshot_id, ids)
                .await,
            Code::InvalidArgument,
            what,
        );
    }
    assert_code(
        csi.get_group_snapshot("", &[]).await,
        Code::InvalidArgument,
        "no id",
    );
    assert_code(
        csi.delete_group_snapshot("", &[]).await,
        Code::InvalidArgument,
        "no id",
    );
    assert_code(
        csi.get_group_snapshot("gsnap-nope", &[]).await,
        Code::NotFound,
        "a foreign id",
    );

    // Deleting takes the members; the volumes made from them stay whole.
    csi.delete_group_snapshot(&group.group_snapshot_id, &members)
        .await
        .unwrap();
    csi.delete_group_snapshot(&group.group_snapshot_id, &members)
        .await
        .unwrap();
    csi.delete_group_snapshot("gsnap-nope", &[]).await.unwrap();
    assert_code(
        csi.get_group_snapshot(&group.group_snapshot_id, &members)
            .await,
        Code::NotFound,
        "a deleted group snapshot",
    );
    assert!(
        csi.list_snapshots_all(csi::ListSnapshotsRequest::default())
            .await
            .is_empty()
    );
    assert_eq!(csi.read(&restored, MIB, 8).await, b"a before");
    for v in [&a, &b, &c, &restored, &restored_b] {
        csi.delete(&v.volume_id).await.unwrap();
    }
    assert!(csi.list_all(0).await.is_empty());
}
