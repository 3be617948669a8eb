//! ListDevices: the device made is listed, paging lists every device, a
//! token never handed out is ABORTED, and a deleted device is gone.

use tonic::Code;

use super::calls::show_entries;
use super::checker::{Checker, Device};
use super::report::checks;
use super::show::{counted, show};
use super::text;
use crate::dpu::plugin::LIST_PAGE;

impl Checker<'_> {
    pub(super) async fn list_devices(&mut self, device: &Device) {
        let name = checks::LIST_DEVICES;
        match self.list_all(LIST_PAGE, self.deadline()).await {
            Ok(listing) if listing.has(device) => self.pass(
                name,
                format!(
                    "ListDevices ({} in {}) lists {device}",
                    counted(listing.entries.len(), "entry", "entries"),
                    counted(listing.pages, "page", "pages")
                ),
            ),
            Ok(listing) => self.fail(
                name,
                format!(
                    "expected ListDevices to list {device}, which CreateDevice made; it lists \
                     {}. The API text: {:?}",
                    show_entries(&listing.entries),
                    text::LIST
                ),
            ),
            Err(e) => self.fail(name, format!("{e}. The API text: {:?}", text::LIST)),
        }
    }

    pub(super) async fn list_devices_paging(&mut self) {
        let name = checks::LIST_DEVICES_PAGING;
        let deadline = self.deadline();
        let mut paged = Vec::new();
        for n in 1..=3 {
            let volume_id = self.volume_id(&format!("page-{n}"));
            match self.call_create(&volume_id, deadline).await {
                Ok(response) => {
                    let device = Device {
                        volume_id,
                        device_name: response.device_name,
                    };
                    self.created.push(device.clone());
                    paged.push(device);
                }
                Err(status) => {
                    return self.fail(
                        name,
                        format!(
                            "could not make the 3 devices to page over: CreateDevice of volume \
                             {volume_id:?} answered {}, expected 0 OK. The API text: {:?}",
                            show(&status),
                            text::CREATE
                        ),
                    );
                }
            }
        }
        let listing = match self.list_all(1, deadline).await {
            Ok(listing) => listing,
            Err(e) => {
                return self.fail(
                    name,
                    format!(
                        "paging with max_entries 1: {e}. The API text: {:?}",
                        text::LIST
                    ),
                );
            }
        };
        let missing: Vec<String> = paged
            .iter()
            .filter(|d| !listing.has(d))
            .map(Device::to_string)
            .collect();
        if !missing.is_empty() {
            return self.fail(
                name,
                format!(
                    "paging with max_entries 1 through {} did not list {} (nothing else \
                     was creating or deleting devices through plugin-check meanwhile); it \
                     listed {}. The API text: {:?}",
                    counted(listing.pages, "page", "pages"),
                    missing.join(", "),
                    show_entries(&listing.entries),
                    text::LIST
                ),
            );
        }
        let mut detail = format!(
            "paging with max_entries 1 through {} lists all 3 devices it created",
            counted(listing.pages, "page", "pages")
        );
        // Not a failure: the text gives max_entries no meaning.
        if listing.largest_page > 1 {
            detail.push_str(&format!(
                " (pages held up to {} entries: max_entries is not honoured, which the API text \
                 does not require)",
                listing.largest_page
            ));
        }
        self.pass(name, detail);
    }

    pub(super) async fn list_devices_bad_token(&mut self) {
        let name = checks::LIST_DEVICES_BAD_TOKEN;
        let token = format!("{}-not-a-token", self.run_id);
        let answer = self
            .call_list(LIST_PAGE, token.clone(), self.deadline())
            .await;
        match answer {
            Err(status) if status.code() == Code::Aborted => self.pass(
                name,
                format!("ListDevices with starting_token {token:?}, never handed out, answers 10 ABORTED"),
            ),
            Ok(page) => self.fail(
                name,
                format!(
                    "expected 10 ABORTED for starting_token {token:?}, which the plugin never \
                     handed out, ListDevices answered 0 OK ({}). The API text: {:?}",
                    counted(page.entries.len(), "entry", "entries"),
                    text::LIST_ABORTED
                ),
            ),
            Err(status) => self.fail(
                name,
                format!(
                    "expected 10 ABORTED for starting_token {token:?}, which the plugin never \
                     handed out, ListDevices answered {}. The API text: {:?}",
                    show(&status),
                    text::LIST_ABORTED
                ),
            ),
        }
    }

    pub(super) async fn list_devices_after_delete(&mut self, device: &Device) {
        let name = checks::LIST_DEVICES_AFTER_DELETE;
        match self.list_all(LIST_PAGE, self.deadline()).await {
            Ok(listing) => {
                let still: Vec<_> = listing
                    .entries
                    .iter()
                    .filter(|e| e.device_name == device.device_name)
                    .cloned()
                    .collect();
                if still.is_empty() {
                    self.pass(
                        name,
                        format!("ListDevices no longer lists {device} after DeleteDevice"),
                    );
                } else {
                    self.fail(
                        name,
                        format!(
                            "expected ListDevices not to list {device} after DeleteDevice \
                             answered 0 OK, it lists {}. The API text: {:?}",
                            show_entries(&still),
                            text::LIST
                        ),
                    );
                }
            }
            Err(e) => self.fail(name, format!("{e}. The API text: {:?}", text::LIST)),
        }
    }
}
