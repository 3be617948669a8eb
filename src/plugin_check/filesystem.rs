//! Filesystem devices (CREATE_DELETE_FS_DEVICE): one device's whole life
//! with volume_mode "Filesystem", and the refusal of the kind of device a
//! plugin does not offer.

use tonic::Status;

use super::checker::{Advertised, Checker, Device, capabilities_unknown};
use super::report::checks;
use super::show::{capability_name, show};
use super::text;
use crate::proto::nvidia::storage::plugins::v1::storage_plugin_service_capability::rpc::Type as Capability;

const FILESYSTEM: &str = "Filesystem";
const BLOCK: &str = "Block";

impl Checker<'_> {
    /// CreateDevice (volume_mode "Filesystem"), again, GetDevice (when
    /// GET_DEVICE_STATS is advertised), DeleteDevice, again: one check,
    /// failed at its first wrong answer.
    pub(super) async fn fs_device(&mut self, no_stats: &Option<String>) {
        let name = checks::FS_DEVICE;
        match self.fs_device_life(no_stats.is_none()).await {
            Ok(done) => self.pass(name, done),
            Err(failure) => self.fail(name, failure),
        }
    }

    async fn fs_device_life(&mut self, get: bool) -> Result<String, String> {
        let volume_id = self.volume_id("fs");
        let context = self.config.fs_context().clone();
        let made = self
            .call_create_as(&volume_id, FILESYSTEM, &context, self.deadline())
            .await
            .map_err(|status| {
                format!(
                    "expected 0 OK with a device name, CreateDevice of volume {volume_id:?} \
                     (volume_mode {FILESYSTEM:?}, access mode RWO, volume_context {context:?}) \
                     answered {}; pass what the plugin needs with --fs-volume-context. The API \
                     text: {:?}",
                    show(&status),
                    text::CREATE
                )
            })?;
        let device = Device {
            volume_id,
            device_name: made.device_name,
        };
        self.created.push(device.clone());
        if device.device_name.is_empty() {
            return Err(format!(
                "expected a device name, CreateDevice of a filesystem device answered 0 OK with \
                 an empty device_name. The API text: {:?}",
                text::CREATE
            ));
        }
        let again = self
            .call_create_as(&device.volume_id, FILESYSTEM, &context, self.deadline())
            .await;
        match again {
            Ok(again) if again.device_name == device.device_name => {}
            Ok(again) => {
                self.created.push(Device {
                    device_name: again.device_name.clone(),
                    ..device.clone()
                });
                return Err(format!(
                    "expected the same device from CreateDevice of {device} again (volume_mode \
                     {FILESYSTEM:?}), got another device {:?}. The API text: {:?}",
                    again.device_name,
                    text::CREATE_IDEMPOTENT
                ));
            }
            Err(status) => return Err(again_failed(&device, &status)),
        }
        if get {
            let found = self.call_get(&device, self.deadline()).await;
            match found {
                Ok(found) if found.volume_mode.eq_ignore_ascii_case(FILESYSTEM) => {}
                Ok(found) => {
                    return Err(format!(
                        "expected volume_mode {FILESYSTEM:?} from GetDevice of {device}, which \
                         CreateDevice made as one, got {:?}. The API text: {:?}",
                        found.volume_mode,
                        text::GET_DEVICE
                    ));
                }
                Err(status) => {
                    return Err(format!(
                        "expected 0 OK from GetDevice of {device}, which CreateDevice just \
                         made, got {}. The API text: {:?}",
                        show(&status),
                        text::GET_DEVICE
                    ));
                }
            }
        }
        for (attempt, quote) in [("", text::DELETE), (" again", text::DELETE_IDEMPOTENT)] {
            if let Err(status) = self.call_delete(&device, self.deadline()).await {
                return Err(format!(
                    "expected 0 OK from DeleteDevice of filesystem device {device}{attempt}, \
                     got {}. The API text: {quote:?}",
                    show(&status)
                ));
            }
            self.created.retain(|d| *d != device);
        }
        Ok(format!(
            "CreateDevice (volume_mode {FILESYSTEM:?}) of volume {:?} answers 0 OK with device \
             {:?}, and again the same;{} DeleteDevice answers 0 OK, and again",
            device.volume_id,
            device.device_name,
            if get {
                " GetDevice answers its volume_mode;"
            } else {
                ""
            }
        ))
    }

    /// A plugin that advertises one kind of device must not make the other.
    pub(super) async fn unoffered_kind_refused(&mut self, advertised: Option<&Advertised>) {
        let name = checks::UNOFFERED_KIND_REFUSED;
        let Some(advertised) = advertised else {
            return self.skip(name, capabilities_unknown());
        };
        let block = advertised.0.contains(&Capability::CreateDeleteBlockDevice);
        let fs = advertised.0.contains(&Capability::CreateDeleteFsDevice);
        let (mode, context, offered) = match (block, fs) {
            (true, false) => (
                FILESYSTEM,
                self.config.volume_context.clone(),
                Capability::CreateDeleteBlockDevice,
            ),
            (false, true) => (
                BLOCK,
                self.config.fs_context().clone(),
                Capability::CreateDeleteFsDevice,
            ),
            _ => {
                return self.skip(
                    name,
                    "the plugin offers both kinds of device, or neither".to_string(),
                );
            }
        };
        let volume_id = self.volume_id("unoffered");
        let offered = capability_name(offered);
        match self
            .call_create_as(&volume_id, mode, &context, self.deadline())
            .await
        {
            Ok(made) => {
                self.created.push(Device {
                    volume_id: volume_id.clone(),
                    device_name: made.device_name.clone(),
                });
                self.fail(
                    name,
                    format!(
                        "expected a non-OK code (9 FAILED_PRECONDITION) from CreateDevice of \
                         volume {volume_id:?} with volume_mode {mode:?} by a plugin that \
                         advertises only {offered}, got 0 OK with device {:?}. The API text: \
                         {:?} {:?}",
                        made.device_name,
                        text::CAPABILITY_KINDS,
                        text::CREATE_UNABLE
                    ),
                );
            }
            Err(status) => self.pass(
                name,
                format!(
                    "CreateDevice with volume_mode {mode:?}, which a plugin advertising only \
                     {offered} does not make, answers {}",
                    show(&status)
                ),
            ),
        }
    }
}

fn again_failed(device: &Device, status: &Status) -> String {
    format!(
        "expected 0 OK with the same device from CreateDevice of {device} again (volume_mode \
         {FILESYSTEM:?}), got {}. The API text: {:?}",
        show(status),
        text::CREATE_IDEMPOTENT
    )
}
