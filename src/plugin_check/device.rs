//! The life of a device: CreateDevice (and again, idempotent), GetDevice,
//! DeleteDevice (and again, and of one never made), and the final clean-up.

use tonic::Code;

use super::checker::{Checker, Device};
use super::report::checks;
use super::show::show;
use super::text;
use crate::dpu::plugin::VOLUME_MODE_BLOCK;

impl Checker<'_> {
    pub(super) async fn create_device(&mut self) -> Option<Device> {
        let name = checks::CREATE_DEVICE;
        let volume_id = self.run_id.clone();
        match self.call_create(&volume_id, self.deadline()).await {
            Ok(response) => {
                let device = Device {
                    volume_id: volume_id.clone(),
                    device_name: response.device_name,
                };
                // Kept even when unnamed: cleanup still tries to delete it.
                self.created.push(device.clone());
                if device.device_name.is_empty() {
                    self.fail(
                        name,
                        format!(
                            "expected a device name, CreateDevice of volume {volume_id:?} \
                             answered 0 OK with an empty device_name. The API text: {:?}",
                            text::CREATE
                        ),
                    );
                    return None;
                }
                self.pass(
                    name,
                    format!(
                        "CreateDevice of volume {volume_id:?} answers 0 OK with device {:?}",
                        device.device_name
                    ),
                );
                Some(device)
            }
            Err(status) => {
                self.fail(
                    name,
                    format!(
                        "expected 0 OK with a device name, CreateDevice of volume {volume_id:?} \
                         (volume_mode {VOLUME_MODE_BLOCK:?}, access mode RWO, volume_context \
                         {:?}) answered {}; pass what the plugin needs with --volume-context. \
                         The API text: {:?}",
                        self.config.volume_context,
                        show(&status),
                        text::CREATE
                    ),
                );
                None
            }
        }
    }

    pub(super) async fn create_device_idempotent(&mut self, device: &Device) {
        let name = checks::CREATE_DEVICE_IDEMPOTENT;
        match self.call_create(&device.volume_id, self.deadline()).await {
            Ok(again) if again.device_name == device.device_name => self.pass(
                name,
                format!(
                    "CreateDevice of volume {:?} again with the same fields answers 0 OK with \
                     the same device {:?}",
                    device.volume_id, device.device_name
                ),
            ),
            Ok(again) => {
                self.created.push(Device {
                    volume_id: device.volume_id.clone(),
                    device_name: again.device_name.clone(),
                });
                self.fail(
                    name,
                    format!(
                        "expected the same device {:?} from CreateDevice of volume {:?} again \
                         with the same fields, got another device {:?}. The API text: {:?}",
                        device.device_name,
                        device.volume_id,
                        again.device_name,
                        text::CREATE_IDEMPOTENT
                    ),
                );
            }
            Err(status) => self.fail(
                name,
                format!(
                    "expected 0 OK with device {:?} from CreateDevice of volume {:?} again \
                     with the same fields, got {}. The API text: {:?}",
                    device.device_name,
                    device.volume_id,
                    show(&status),
                    text::CREATE_IDEMPOTENT
                ),
            ),
        }
    }

    pub(super) async fn get_device(&mut self, device: &Device) {
        let name = checks::GET_DEVICE;
        match self.call_get(device, self.deadline()).await {
            Ok(_) => self.pass(
                name,
                format!("GetDevice of {device} answers 0 OK after CreateDevice"),
            ),
            Err(status) => self.fail(
                name,
                format!(
                    "expected 0 OK for {device}, which CreateDevice just made, GetDevice \
                     answered {}. The API text: {:?}",
                    show(&status),
                    text::GET_DEVICE
                ),
            ),
        }
    }

    pub(super) async fn get_device_not_found(&mut self) {
        let absent = self.absent();
        self.expect_not_found(checks::GET_DEVICE_NOT_FOUND, &absent, "was never created")
            .await;
    }

    pub(super) async fn get_device_after_delete(&mut self, device: &Device) {
        self.expect_not_found(
            checks::GET_DEVICE_AFTER_DELETE,
            device,
            "DeleteDevice removed",
        )
        .await;
    }

    async fn expect_not_found(&mut self, name: &'static str, device: &Device, why: &str) {
        match self.call_get(device, self.deadline()).await {
            Err(status) if status.code() == Code::NotFound => self.pass(
                name,
                format!("GetDevice of {device}, which {why}, answers 5 NOT_FOUND"),
            ),
            Ok(_) => self.fail(
                name,
                format!(
                    "expected 5 NOT_FOUND for {device}, which {why}, GetDevice answered 0 OK. \
                     The API text: {:?}",
                    text::GET_NOT_FOUND
                ),
            ),
            Err(status) => self.fail(
                name,
                format!(
                    "expected 5 NOT_FOUND for {device}, which {why}, GetDevice answered {}. \
                     The API text: {:?}",
                    show(&status),
                    text::GET_NOT_FOUND
                ),
            ),
        }
    }

    /// True when the device is gone.
    pub(super) async fn delete_device(&mut self, device: &Device) -> bool {
        let name = checks::DELETE_DEVICE;
        match self.call_delete(device, self.deadline()).await {
            Ok(()) => {
                self.created.retain(|d| d != device);
                self.pass(name, format!("DeleteDevice of {device} answers 0 OK"));
                true
            }
            Err(status) => {
                self.fail(
                    name,
                    format!(
                        "expected 0 OK for {device}, which CreateDevice made, DeleteDevice \
                         answered {}. The API text: {:?}",
                        show(&status),
                        text::DELETE
                    ),
                );
                false
            }
        }
    }

    pub(super) async fn delete_device_idempotent(&mut self, device: &Device) {
        self.expect_delete_ok(
            checks::DELETE_DEVICE_IDEMPOTENT,
            device,
            "DeleteDevice already removed",
        )
        .await;
    }

    pub(super) async fn delete_device_absent(&mut self) {
        let absent = self.absent();
        self.expect_delete_ok(checks::DELETE_DEVICE_ABSENT, &absent, "was never created")
            .await;
    }

    async fn expect_delete_ok(&mut self, name: &'static str, device: &Device, why: &str) {
        match self.call_delete(device, self.deadline()).await {
            Ok(()) => self.pass(
                name,
                format!("DeleteDevice of {device}, which {why}, answers 0 OK"),
            ),
            Err(status) => self.fail(
                name,
                format!(
                    "expected 0 OK for {device}, which {why}, DeleteDevice answered {}. The \
                     API text: {:?}",
                    show(&status),
                    text::DELETE_IDEMPOTENT
                ),
            ),
        }
    }

    /// Deletes whatever the run made and has not deleted yet, whatever failed
    /// before.
    pub(super) async fn cleanup(&mut self) {
        let name = checks::CLEANUP;
        let leftovers = std::mem::take(&mut self.created);
        if leftovers.is_empty() {
            return self.skip(name, "nothing left to delete".to_string());
        }
        let mut failed = Vec::new();
        for device in &leftovers {
            // Each delete gets its own deadline: one slow delete must not
            // leave the others undone.
            if let Err(status) = self.call_delete(device, self.deadline()).await {
                failed.push(format!("{device}: DeleteDevice answered {}", show(&status)));
            }
        }
        if failed.is_empty() {
            self.pass(
                name,
                format!(
                    "DeleteDevice answers 0 OK for the {} devices the run still had",
                    leftovers.len()
                ),
            );
        } else {
            self.fail(
                name,
                format!(
                    "expected 0 OK deleting what the run made; left behind, delete by hand: {}. \
                     The API text: {:?}",
                    failed.join("; "),
                    text::DELETE
                ),
            );
        }
    }
}
