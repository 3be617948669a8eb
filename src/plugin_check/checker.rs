//! One run of the checks: the order they run in, what each needs before it
//! may run, and the results as they come.

use std::fmt;

use tokio::net::UnixStream;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::config::{CheckError, Config};
use super::report::{CheckResult, Report, Verdict, checks};
use super::show::{capability_name, one_line};
use crate::grpc::unix_channel;
use crate::proto::nvidia::storage::plugins::v1 as api;
use api::identity_service_client::IdentityServiceClient;
use api::storage_plugin_service_capability::rpc::Type as Capability;
use api::storage_plugin_service_client::StoragePluginServiceClient;

/// The checks that need the device create-device made.
const AFTER_CREATE: [&str; 8] = [
    checks::CREATE_DEVICE_IDEMPOTENT,
    checks::GET_DEVICE,
    checks::LIST_DEVICES,
    checks::LIST_DEVICES_PAGING,
    checks::DELETE_DEVICE,
    checks::DELETE_DEVICE_IDEMPOTENT,
    checks::GET_DEVICE_AFTER_DELETE,
    checks::LIST_DEVICES_AFTER_DELETE,
];

/// The checks that need delete-device to have deleted it.
const AFTER_DELETE: [&str; 3] = [
    checks::DELETE_DEVICE_IDEMPOTENT,
    checks::GET_DEVICE_AFTER_DELETE,
    checks::LIST_DEVICES_AFTER_DELETE,
];

/// Runs every check against the plugin at `config.socket`, handing each
/// result to `on_result` as soon as it is known (a hanging call then shows
/// where it hangs), and returns them all.
pub async fn run(
    config: &Config,
    on_result: &mut dyn FnMut(&CheckResult),
) -> Result<Report, CheckError> {
    // One clear error beats twenty FAILs that all say "transport error".
    match tokio::time::timeout(config.timeout, UnixStream::connect(&config.socket)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(unreachable(config, e.to_string())),
        Err(_) => {
            return Err(unreachable(
                config,
                format!("no connection within {:?}", config.timeout),
            ));
        }
    }
    let channel = unix_channel(config.socket.clone());
    let mut checker = Checker {
        identity: IdentityServiceClient::new(channel.clone()),
        storage: StoragePluginServiceClient::new(channel),
        config,
        run_id: format!(
            "plugin-check-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ),
        created: Vec::new(),
        report: Report::default(),
        on_result,
    };
    checker.run().await;
    Ok(checker.report)
}

fn unreachable(config: &Config, reason: String) -> CheckError {
    CheckError::Unreachable {
        socket: config.socket.display().to_string(),
        reason,
    }
}

/// A device as the API names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Device {
    pub(super) volume_id: String,
    pub(super) device_name: String,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "(volume_id {:?}, device_name {:?})",
            self.volume_id, self.device_name
        )
    }
}

/// What StoragePluginGetCapabilities advertised (the known types).
#[derive(Debug)]
pub(super) struct Advertised(pub(super) Vec<Capability>);

/// A listing through every page.
#[derive(Debug)]
pub(super) struct Listing {
    pub(super) entries: Vec<api::list_devices_response::Entry>,
    pub(super) pages: usize,
    pub(super) largest_page: usize,
}

impl Listing {
    pub(super) fn has(&self, device: &Device) -> bool {
        self.entries
            .iter()
            .any(|e| e.volume_id == device.volume_id && e.device_name == device.device_name)
    }
}

pub(super) struct Checker<'a> {
    pub(super) identity: IdentityServiceClient<Channel>,
    pub(super) storage: StoragePluginServiceClient<Channel>,
    pub(super) config: &'a Config,
    pub(super) run_id: String,
    /// Every device a CreateDevice named and no DeleteDevice has removed yet:
    /// what the final phase deletes.
    pub(super) created: Vec<Device>,
    pub(super) report: Report,
    pub(super) on_result: &'a mut dyn FnMut(&CheckResult),
}

impl Checker<'_> {
    async fn run(&mut self) {
        self.plugin_info().await;
        self.probe().await;
        let advertised = self.capabilities().await;
        self.snap_provider().await;

        let advertised = advertised.as_ref();
        self.create_delete_unimplemented(advertised).await;
        self.get_device_unimplemented(advertised).await;
        self.list_devices_unimplemented(advertised).await;

        let no_block = lacking(advertised, Capability::CreateDeleteBlockDevice);
        let no_fs = lacking(advertised, Capability::CreateDeleteFsDevice);
        // DeleteDevice is implemented by a plugin of either kind.
        let no_delete = no_block.clone().filter(|_| no_fs.is_some());
        let no_stats = lacking(advertised, Capability::GetDeviceStats);
        let no_list = lacking(advertised, Capability::ListDevices);
        if self.may_run(checks::GET_DEVICE_NOT_FOUND, &no_stats) {
            self.get_device_not_found().await;
        }
        if self.may_run(checks::DELETE_DEVICE_ABSENT, &no_delete) {
            self.delete_device_absent().await;
        }
        if self.may_run(checks::LIST_DEVICES_BAD_TOKEN, &no_list) {
            self.list_devices_bad_token().await;
        }
        let device = match &no_block {
            Some(why) => {
                self.skip(checks::CREATE_DEVICE, why.clone());
                Err(why.clone())
            }
            None => self
                .create_device()
                .await
                .ok_or_else(|| "needs a device, and create-device made none".to_string()),
        };
        match device {
            Ok(device) => self.device_life(&device, &no_stats, &no_list).await,
            Err(why) => {
                for name in AFTER_CREATE {
                    self.skip(name, why.clone());
                }
            }
        }
        if self.may_run(checks::FS_DEVICE, &no_fs) {
            self.fs_device(&no_stats).await;
        }
        self.unoffered_kind_refused(advertised).await;
        self.cleanup().await;
    }

    /// The checks on the device create-device made.
    async fn device_life(
        &mut self,
        device: &Device,
        no_stats: &Option<String>,
        no_list: &Option<String>,
    ) {
        self.create_device_idempotent(device).await;
        if self.may_run(checks::GET_DEVICE, no_stats) {
            self.get_device(device).await;
        }
        if self.may_run(checks::LIST_DEVICES, no_list) {
            self.list_devices(device).await;
        }
        if self.may_run(checks::LIST_DEVICES_PAGING, no_list) {
            self.list_devices_paging().await;
        }
        if !self.delete_device(device).await {
            let why = "needs the deletion delete-device did not do".to_string();
            for name in AFTER_DELETE {
                self.skip(name, why.clone());
            }
            return;
        }
        self.delete_device_idempotent(device).await;
        if self.may_run(checks::GET_DEVICE_AFTER_DELETE, no_stats) {
            self.get_device_after_delete(device).await;
        }
        if self.may_run(checks::LIST_DEVICES_AFTER_DELETE, no_list) {
            self.list_devices_after_delete(device).await;
        }
    }

    // ----- bookkeeping -----

    pub(super) fn deadline(&self) -> Instant {
        Instant::now() + self.config.timeout
    }

    pub(super) fn volume_id(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.run_id)
    }

    /// A device no one created: its volume id is this run's, its name made up.
    pub(super) fn absent(&self) -> Device {
        let name = self.volume_id("absent");
        Device {
            volume_id: name.clone(),
            device_name: name,
        }
    }

    /// Records `name` as skipped when `unmet` says why; true otherwise.
    pub(super) fn may_run(&mut self, name: &'static str, unmet: &Option<String>) -> bool {
        match unmet {
            Some(why) => {
                self.skip(name, why.clone());
                false
            }
            None => true,
        }
    }

    pub(super) fn pass(&mut self, name: &'static str, detail: String) {
        self.record(name, Verdict::Pass, detail);
    }

    pub(super) fn fail(&mut self, name: &'static str, detail: String) {
        self.record(name, Verdict::Fail, detail);
    }

    pub(super) fn skip(&mut self, name: &'static str, detail: String) {
        self.record(name, Verdict::Skip, detail);
    }

    pub(super) fn record(&mut self, name: &'static str, verdict: Verdict, detail: String) {
        let result = CheckResult {
            name,
            verdict,
            detail: one_line(&detail),
        };
        (self.on_result)(&result);
        self.report.results.push(result);
    }
}

/// Why checks of `capability` are skipped, or `None` when it is advertised.
pub(super) fn lacking(advertised: Option<&Advertised>, capability: Capability) -> Option<String> {
    match advertised {
        None => Some(capabilities_unknown()),
        Some(a) if a.0.contains(&capability) => None,
        Some(_) => Some(format!(
            "the plugin does not advertise {}",
            capability_name(capability)
        )),
    }
}

pub(super) fn capabilities_unknown() -> String {
    "StoragePluginGetCapabilities failed, so what the plugin implements is unknown".to_string()
}
