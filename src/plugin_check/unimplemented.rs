//! What the plugin does not advertise must answer UNIMPLEMENTED.

use tonic::{Code, Status};

use super::checker::{Advertised, Checker, Device, capabilities_unknown};
use super::report::checks;
use super::show::{capability_name, show};
use super::text;
use crate::dpu::plugin::LIST_PAGE;
use crate::proto::nvidia::storage::plugins::v1::storage_plugin_service_capability::rpc::Type as Capability;

impl Checker<'_> {
    pub(super) async fn create_delete_unimplemented(&mut self, advertised: Option<&Advertised>) {
        let name = checks::CREATE_DELETE_UNIMPLEMENTED;
        let Some(advertised) = advertised else {
            return self.skip(name, capabilities_unknown());
        };
        // A plugin of filesystem devices implements CreateDevice too.
        if let Some(c) = [
            Capability::CreateDeleteBlockDevice,
            Capability::CreateDeleteFsDevice,
        ]
        .into_iter()
        .find(|c| advertised.0.contains(c))
        {
            return self.skip(
                name,
                format!(
                    "{} is advertised, so CreateDevice and DeleteDevice are implemented",
                    capability_name(c)
                ),
            );
        }
        let deadline = self.deadline();
        let volume_id = self.volume_id("unadvertised");
        let create = self.call_create(&volume_id, deadline).await;
        if let Ok(response) = &create {
            // Unadvertised but made anyway: it must not outlive the run.
            self.created.push(Device {
                volume_id,
                device_name: response.device_name.clone(),
            });
        }
        let delete = self.call_delete(&self.absent(), deadline).await;
        let verdicts = [("CreateDevice", create.map(drop)), ("DeleteDevice", delete)];
        let what = "CREATE_DELETE_BLOCK_DEVICE nor CREATE_DELETE_FS_DEVICE";
        self.judge_unimplemented(name, what, &verdicts);
    }

    pub(super) async fn get_device_unimplemented(&mut self, advertised: Option<&Advertised>) {
        let name = checks::GET_DEVICE_UNIMPLEMENTED;
        let Some(advertised) = advertised else {
            return self.skip(name, capabilities_unknown());
        };
        if advertised.0.contains(&Capability::GetDeviceStats) {
            return self.skip(
                name,
                "GET_DEVICE_STATS is advertised; GetDevice is checked below".to_string(),
            );
        }
        let absent = self.absent();
        let answer = self.call_get(&absent, self.deadline()).await.map(drop);
        self.judge_unimplemented(name, "GET_DEVICE_STATS", &[("GetDevice", answer)]);
    }

    pub(super) async fn list_devices_unimplemented(&mut self, advertised: Option<&Advertised>) {
        let name = checks::LIST_DEVICES_UNIMPLEMENTED;
        let Some(advertised) = advertised else {
            return self.skip(name, capabilities_unknown());
        };
        if advertised.0.contains(&Capability::ListDevices) {
            return self.skip(
                name,
                "LIST_DEVICES is advertised; ListDevices is checked below".to_string(),
            );
        }
        let answer = self
            .call_list(LIST_PAGE, String::new(), self.deadline())
            .await
            .map(drop);
        self.judge_unimplemented(name, "LIST_DEVICES", &[("ListDevices", answer)]);
    }

    /// PASS when every one of `answers` is UNIMPLEMENTED; `unadvertised`
    /// names the capability (or capabilities) the plugin left out.
    fn judge_unimplemented(
        &mut self,
        name: &'static str,
        unadvertised: &str,
        answers: &[(&str, Result<(), Status>)],
    ) {
        let rpcs = answers
            .iter()
            .map(|(rpc, _)| *rpc)
            .collect::<Vec<_>>()
            .join(" and ");
        let wrong: Vec<String> = answers
            .iter()
            .filter_map(|(rpc, answer)| match answer {
                Err(status) if status.code() == Code::Unimplemented => None,
                Err(status) => Some(format!("{rpc} answered {}", show(status))),
                Ok(()) => Some(format!("{rpc} answered 0 OK")),
            })
            .collect();
        if wrong.is_empty() {
            return self.pass(
                name,
                format!(
                    "{rpcs} {} 12 UNIMPLEMENTED, as the capabilities say \
                     ({unadvertised} not advertised)",
                    if answers.len() == 1 {
                        "answers"
                    } else {
                        "answer"
                    }
                ),
            );
        }
        self.fail(
            name,
            format!(
                "the plugin does not advertise {unadvertised}, so expected 12 UNIMPLEMENTED, \
                 but {}. If it is implemented, advertise it (snap-csi calls only what is \
                 advertised); otherwise answer UNIMPLEMENTED. The API text: {:?}",
                wrong.join("; "),
                text::UNIMPLEMENTED
            ),
        );
    }
}
