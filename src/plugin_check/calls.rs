//! The calls the checks make, each once under the check's deadline, and how
//! their answers are written in the results.

use std::collections::{HashMap, HashSet};

use tokio::time::Instant;
use tonic::Status;

use super::checker::{Checker, Device, Listing};
use super::show::{counted, show};
use crate::dpu::plugin::VOLUME_MODE_BLOCK;
use crate::grpc::call_until;
use crate::proto::nvidia::storage::plugins::v1 as api;

impl Checker<'_> {
    /// CreateDevice of a block device.
    pub(super) async fn call_create(
        &self,
        volume_id: &str,
        deadline: Instant,
    ) -> Result<api::CreateDeviceResponse, Status> {
        let context = &self.config.volume_context;
        self.call_create_as(volume_id, VOLUME_MODE_BLOCK, context, deadline)
            .await
    }

    /// CreateDevice with `volume_mode` `mode` and `volume_context` `context`.
    pub(super) async fn call_create_as(
        &self,
        volume_id: &str,
        mode: &str,
        context: &HashMap<String, String>,
        deadline: Instant,
    ) -> Result<api::CreateDeviceResponse, Status> {
        let request = api::CreateDeviceRequest {
            volume_id: volume_id.to_string(),
            access_modes: vec![api::AccessMode::Rwo as i32],
            volume_mode: mode.to_string(),
            publish_context: HashMap::new(),
            volume_context: context.clone(),
            storage_parameters: HashMap::new(),
        };
        let mut c = self.storage.clone();
        call_until("CreateDevice", deadline, request, |r| async move {
            c.create_device(r).await
        })
        .await
    }

    pub(super) async fn call_delete(
        &self,
        device: &Device,
        deadline: Instant,
    ) -> Result<(), Status> {
        let request = api::DeleteDeviceRequest {
            volume_id: device.volume_id.clone(),
            device_name: device.device_name.clone(),
        };
        let mut c = self.storage.clone();
        call_until("DeleteDevice", deadline, request, |r| async move {
            c.delete_device(r).await
        })
        .await
        .map(drop)
    }

    pub(super) async fn call_get(
        &self,
        device: &Device,
        deadline: Instant,
    ) -> Result<api::GetDeviceResponse, Status> {
        let request = api::GetDeviceRequest {
            volume_id: device.volume_id.clone(),
            device_name: device.device_name.clone(),
        };
        let mut c = self.storage.clone();
        call_until("GetDevice", deadline, request, |r| async move {
            c.get_device(r).await
        })
        .await
    }

    pub(super) async fn call_list(
        &self,
        max_entries: i32,
        starting_token: String,
        deadline: Instant,
    ) -> Result<api::ListDevicesResponse, Status> {
        let request = api::ListDevicesRequest {
            max_entries,
            starting_token,
        };
        let mut c = self.storage.clone();
        call_until("ListDevices", deadline, request, |r| async move {
            c.list_devices(r).await
        })
        .await
    }

    /// Every page, following next_token; the error says what went wrong.
    pub(super) async fn list_all(
        &self,
        max_entries: i32,
        deadline: Instant,
    ) -> Result<Listing, String> {
        let mut listing = Listing {
            entries: Vec::new(),
            pages: 0,
            largest_page: 0,
        };
        let mut token = String::new();
        let mut handed_out = HashSet::new();
        loop {
            let page = self
                .call_list(max_entries, token.clone(), deadline)
                .await
                .map_err(|status| {
                    format!(
                        "expected 0 OK, ListDevices (max_entries {max_entries}, starting_token \
                         {token:?}, page {}) answered {}",
                        listing.pages + 1,
                        show(&status)
                    )
                })?;
            listing.pages += 1;
            listing.largest_page = listing.largest_page.max(page.entries.len());
            listing.entries.extend(page.entries);
            if page.next_token.is_empty() {
                return Ok(listing);
            }
            // A token handed out twice makes paging endless.
            if !handed_out.insert(page.next_token.clone()) {
                return Err(format!(
                    "ListDevices (max_entries {max_entries}) handed out next_token {:?} a \
                     second time, after {}: paging through it never ends",
                    page.next_token,
                    counted(listing.pages, "page", "pages")
                ));
            }
            token = page.next_token;
        }
    }
}

pub(super) fn show_entries(entries: &[api::list_devices_response::Entry]) -> String {
    if entries.is_empty() {
        return "nothing".to_string();
    }
    entries
        .iter()
        .map(|e| {
            Device {
                volume_id: e.volume_id.clone(),
                device_name: e.device_name.clone(),
            }
            .to_string()
        })
        .collect::<Vec<_>>()
        .join(", ")
}
