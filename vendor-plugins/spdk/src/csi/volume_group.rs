//! The VolumeGroup API's Controller (`csi-volumegroup.md`).
//!
//! A group is a record in `<state-dir>/volume-groups/` (its id, name,
//! parameters and member volume ids), written atomically; no backend has a
//! notion of groups, so membership is ours to keep. Groups are idempotent by
//! name (`group-<slug>` ids, [`super::ids`]); a volume belongs to at most one
//! group, and while it does DeleteVolume refuses it (FAILED_PRECONDITION), as
//! the API says; DeleteVolumeGroup deletes the group's volumes with it, and
//! none while a DPU serves one of them ([`super::in_use`]).
//! Membership changes run one at a time, so two groups can never both claim
//! a volume.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use snap_csi::proto::volumegroup as vg;
use tonic::{Request, Response, Status};

use super::controller::volume_key;
use super::ids::{check_name, group_id, is_group_id, parse_volume_id};
use super::params::only_co_metadata;
use super::{CsiController, max_entries};
use crate::errors::Failure;
use crate::paging::{page_by, parse_token_of};

/// One group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRecord {
    pub group_id: String,
    pub name: String,
    pub parameters: BTreeMap<String, String>,
    pub volume_ids: Vec<String>,
}

fn group_key(id: &str) -> String {
    format!("volume group {id}")
}

impl CsiController {
    fn group_record(&self, id: &str) -> Result<Option<GroupRecord>, Status> {
        if !is_group_id(id) {
            return Ok(None);
        }
        self.inner
            .groups
            .load(id)
            .map_err(|e| Failure::record("reading the volume group", e).into())
    }

    fn store_group(&self, record: &GroupRecord) -> Result<(), Status> {
        self.inner
            .groups
            .store(&record.group_id, record)
            .map_err(|e| Failure::record("writing the volume group", e).into())
    }

    /// The group as the API shows it: members with their size and context
    /// (a member gone from its backend shows 0 bytes).
    async fn group_message(
        &self,
        record: &GroupRecord,
        deadline: tokio::time::Instant,
    ) -> Result<vg::VolumeGroup, Status> {
        let mut volumes = Vec::with_capacity(record.volume_ids.len());
        for id in &record.volume_ids {
            let Some(backend) = parse_volume_id(id).and_then(|(kind, _)| self.backend(kind)) else {
                continue;
            };
            let size = backend.find(id, deadline).await?.map_or(0, |f| f.size);
            volumes.push(vg::VgVolume {
                capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX),
                volume_id: id.clone(),
                volume_context: backend.context(id, false),
                content_source: None,
                accessible_topology: backend
                    .topology()
                    .map(|segments| vg::VgTopology { segments })
                    .into_iter()
                    .collect(),
            });
        }
        Ok(vg::VolumeGroup {
            volume_group_id: record.group_id.clone(),
            volume_group_context: HashMap::from([("name".to_string(), record.name.clone())]),
            volumes,
        })
    }
}

fn required_id(id: &str) -> Result<(), Status> {
    if id.is_empty() {
        Err(Status::invalid_argument("volume_group_id is required"))
    } else {
        Ok(())
    }
}

#[tonic::async_trait]
impl vg::controller_server::Controller for CsiController {
    async fn create_volume_group(
        &self,
        request: Request<vg::CreateVolumeGroupRequest>,
    ) -> Result<Response<vg::CreateVolumeGroupResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        check_name("name", &req.name).map_err(Status::invalid_argument)?;
        only_co_metadata("volume group", &req.parameters)?;
        let id = group_id(&req.name);
        let _held = self.hold(group_key(&id))?;
        let _changes = self.inner.group_changes.lock().await;
        let parameters: BTreeMap<String, String> = req.parameters.into_iter().collect();
        let record = match self.group_record(&id)? {
            Some(existing) if existing.parameters != parameters => {
                return Err(Status::already_exists(format!(
                    "volume group {id} (name {:?}) exists with other parameters",
                    req.name
                )));
            }
            Some(existing) => existing,
            None => {
                let record = GroupRecord {
                    group_id: id.clone(),
                    name: req.name,
                    parameters,
                    volume_ids: vec![],
                };
                self.store_group(&record)?;
                tracing::info!(volume_group_id = %id, "volume group created");
                record
            }
        };
        Ok(Response::new(vg::CreateVolumeGroupResponse {
            volume_group: Some(self.group_message(&record, deadline).await?),
        }))
    }

    async fn modify_volume_group_membership(
        &self,
        request: Request<vg::ModifyVolumeGroupMembershipRequest>,
    ) -> Result<Response<vg::ModifyVolumeGroupMembershipResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        required_id(&req.volume_group_id)?;
        let _held = self.hold(group_key(&req.volume_group_id))?;
        let _changes = self.inner.group_changes.lock().await;
        let mut record = self.group_record(&req.volume_group_id)?.ok_or_else(|| {
            Status::not_found(format!(
                "volume group {} does not exist",
                req.volume_group_id
            ))
        })?;
        let mut members: Vec<String> = vec![];
        for id in req.volume_ids {
            if members.contains(&id) {
                continue;
            }
            let not_found = || Status::not_found(format!("volume {id} does not exist"));
            let (kind, _) = parse_volume_id(&id).ok_or_else(not_found)?;
            let backend = self.backend(kind).ok_or_else(not_found)?;
            backend.find(&id, deadline).await?.ok_or_else(not_found)?;
            if let Some(group) = self.group_of(&id)?
                && group != record.group_id
            {
                return Err(Status::failed_precondition(format!(
                    "volume {id} belongs to volume group {group}; remove it there first"
                )));
            }
            members.push(id);
        }
        if record.volume_ids != members {
            record.volume_ids = members;
            self.store_group(&record)?;
            tracing::info!(
                volume_group_id = %record.group_id,
                members = record.volume_ids.len(),
                "volume group membership changed"
            );
        }
        Ok(Response::new(vg::ModifyVolumeGroupMembershipResponse {
            volume_group: Some(self.group_message(&record, deadline).await?),
        }))
    }

    async fn delete_volume_group(
        &self,
        request: Request<vg::DeleteVolumeGroupRequest>,
    ) -> Result<Response<vg::DeleteVolumeGroupResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        required_id(&req.volume_group_id)?;
        let _held = self.hold(group_key(&req.volume_group_id))?;
        // Its name held, the group's members cannot change (only calls that
        // hold it change them): they are checked before the membership lock,
        // which every group's changes wait for.
        let Some(record) = self.group_record(&req.volume_group_id)? else {
            return Ok(Response::new(vg::DeleteVolumeGroupResponse {}));
        };
        let members: Vec<&str> = record.volume_ids.iter().map(String::as_str).collect();
        self.refuse_in_use(&members, deadline).await.map_err(|s| {
            Status::new(
                s.code(),
                format!(
                    "volume group {} is not deleted, nor any of its volumes: {}",
                    record.group_id,
                    s.message()
                ),
            )
        })?;
        let _changes = self.inner.group_changes.lock().await;
        // Deleting a group deletes its volumes; a failure keeps the record so
        // that the retry finds the rest.
        for id in &record.volume_ids {
            if let Some((kind, slug)) = parse_volume_id(id) {
                let _volume = self.hold(volume_key(slug))?;
                self.delete_volume_of(kind, id, deadline).await?;
            }
        }
        self.inner
            .groups
            .remove(&record.group_id)
            .map_err(|e| Failure::record("removing the volume group", e))?;
        tracing::info!(volume_group_id = %record.group_id, "volume group deleted");
        Ok(Response::new(vg::DeleteVolumeGroupResponse {}))
    }

    async fn list_volume_groups(
        &self,
        request: Request<vg::ListVolumeGroupsRequest>,
    ) -> Result<Response<vg::ListVolumeGroupsResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        let max = max_entries(req.max_entries)?;
        let after = parse_token_of(&req.starting_token, is_group_id)?;
        let records: Vec<GroupRecord> = self
            .inner
            .groups
            .all()
            .map_err(|e| Failure::record("reading volume groups", e))?
            .into_iter()
            .flatten()
            .collect();
        let (page, next_token) = page_by(records, |r| r.group_id.as_str(), after, max);
        let mut entries = Vec::with_capacity(page.len());
        for record in &page {
            entries.push(vg::list_volume_groups_response::Entry {
                volume_group: Some(self.group_message(record, deadline).await?),
            });
        }
        Ok(Response::new(vg::ListVolumeGroupsResponse {
            entries,
            next_token,
        }))
    }

    async fn controller_get_volume_group(
        &self,
        request: Request<vg::ControllerGetVolumeGroupRequest>,
    ) -> Result<Response<vg::ControllerGetVolumeGroupResponse>, Status> {
        let deadline = self.deadline(&request);
        let req = request.into_inner();
        required_id(&req.volume_group_id)?;
        let record = self.group_record(&req.volume_group_id)?.ok_or_else(|| {
            Status::not_found(format!(
                "volume group {} does not exist",
                req.volume_group_id
            ))
        })?;
        Ok(Response::new(vg::ControllerGetVolumeGroupResponse {
            volume_group: Some(self.group_message(&record, deadline).await?),
        }))
    }
}
