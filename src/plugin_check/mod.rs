//! `snap-csi plugin-check`: checks a vendor plugin against the text of the
//! `nvidia.storage.plugins.v1` API (`storage-plugins-v1-api.txt`).
//!
//! It speaks to the plugin only through that API, as SNAP's node driver and
//! our node do, and judges each answer by the sentence of the text that
//! governs it. Every FAIL quotes that sentence: the reader is the vendor's
//! engineer, who has the API text, not our code.
//!
//! It really creates devices, from the operator's `--volume-context`, under
//! volume ids `plugin-check-<random>[-...]` (so a run never touches a real
//! volume and two runs never collide), and deletes every one it made in a
//! final phase that runs whatever failed before it.
//!
//! What it does not prove: behaviour under concurrent calls, a retry after a
//! call that timed out half-way (its idempotency checks repeat calls that
//! completed), and that the device is usable inside SNAP.
//!
//! Each kind of device the plugin advertises is checked: block devices
//! (CREATE_DELETE_BLOCK_DEVICE, volume_mode "Block") by the device checks,
//! filesystem devices (CREATE_DELETE_FS_DEVICE, volume_mode "Filesystem") by
//! `fs-device`; a plugin of one kind must refuse a CreateDevice of the other.

mod calls;
mod config;
mod device;
mod filesystem;
mod identity;
mod listing;
mod report;
mod text;
mod unimplemented;

pub use config::{CheckError, Config, PluginCheckArgs, parse_endpoint, run_cli};
pub use report::{CheckResult, Report, Verdict};

use std::fmt;

use tokio::net::UnixStream;
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::grpc::unix_channel;
use crate::proto::nvidia::storage::plugins::v1 as api;
use api::identity_service_client::IdentityServiceClient;
use api::storage_plugin_service_capability::rpc::Type as Capability;
use api::storage_plugin_service_client::StoragePluginServiceClient;
use calls::{capability_name, one_line};

/// The checks, in the order they run and print.
pub mod checks {
    pub const PLUGIN_INFO: &str = "plugin-info";
    pub const PROBE: &str = "probe";
    pub const CAPABILITIES: &str = "capabilities";
    pub const SNAP_PROVIDER: &str = "snap-provider";
    pub const CREATE_DELETE_UNIMPLEMENTED: &str = "create-delete-unimplemented";
    pub const GET_DEVICE_UNIMPLEMENTED: &str = "get-device-unimplemented";
    pub const LIST_DEVICES_UNIMPLEMENTED: &str = "list-devices-unimplemented";
    pub const GET_DEVICE_NOT_FOUND: &str = "get-device-not-found";
    pub const DELETE_DEVICE_ABSENT: &str = "delete-device-absent";
    pub const LIST_DEVICES_BAD_TOKEN: &str = "list-devices-bad-token";
    pub const CREATE_DEVICE: &str = "create-device";
    pub const CREATE_DEVICE_IDEMPOTENT: &str = "create-device-idempotent";
    pub const GET_DEVICE: &str = "get-device";
    pub const LIST_DEVICES: &str = "list-devices";
    pub const LIST_DEVICES_PAGING: &str = "list-devices-paging";
    pub const DELETE_DEVICE: &str = "delete-device";
    pub const DELETE_DEVICE_IDEMPOTENT: &str = "delete-device-idempotent";
    pub const GET_DEVICE_AFTER_DELETE: &str = "get-device-after-delete";
    pub const LIST_DEVICES_AFTER_DELETE: &str = "list-devices-after-delete";
    pub const FS_DEVICE: &str = "fs-device";
    pub const UNOFFERED_KIND_REFUSED: &str = "unoffered-kind-refused";
    pub const CLEANUP: &str = "cleanup";

    pub const ALL: [&str; 22] = [
        PLUGIN_INFO,
        PROBE,
        CAPABILITIES,
        SNAP_PROVIDER,
        CREATE_DELETE_UNIMPLEMENTED,
        GET_DEVICE_UNIMPLEMENTED,
        LIST_DEVICES_UNIMPLEMENTED,
        GET_DEVICE_NOT_FOUND,
        DELETE_DEVICE_ABSENT,
        LIST_DEVICES_BAD_TOKEN,
        CREATE_DEVICE,
        CREATE_DEVICE_IDEMPOTENT,
        GET_DEVICE,
        LIST_DEVICES,
        LIST_DEVICES_PAGING,
        DELETE_DEVICE,
        DELETE_DEVICE_IDEMPOTENT,
        GET_DEVICE_AFTER_DELETE,
        LIST_DEVICES_AFTER_DELETE,
        FS_DEVICE,
        UNOFFERED_KIND_REFUSED,
        CLEANUP,
    ];
}

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
struct Device {
    volume_id: String,
    device_name: String,
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
struct Advertised(Vec<Capability>);

/// A listing through every page.
#[derive(Debug)]
struct Listing {
    entries: Vec<api::list_devices_response::Entry>,
    pages: usize,
    largest_page: usize,
}

impl Listing {
    fn has(&self, device: &Device) -> bool {
        self.entries
            .iter()
            .any(|e| e.volume_id == device.volume_id && e.device_name == device.device_name)
    }
}

struct Checker<'a> {
    identity: IdentityServiceClient<Channel>,
    storage: StoragePluginServiceClient<Channel>,
    config: &'a Config,
    run_id: String,
    /// Every device a CreateDevice named and no DeleteDevice has removed yet:
    /// what the final phase deletes.
    created: Vec<Device>,
    report: Report,
    on_result: &'a mut dyn FnMut(&CheckResult),
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

    fn deadline(&self) -> Instant {
        Instant::now() + self.config.timeout
    }

    fn volume_id(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.run_id)
    }

    /// A device no one created: its volume id is this run's, its name made up.
    fn absent(&self) -> Device {
        let name = self.volume_id("absent");
        Device {
            volume_id: name.clone(),
            device_name: name,
        }
    }

    /// Records `name` as skipped when `unmet` says why; true otherwise.
    fn may_run(&mut self, name: &'static str, unmet: &Option<String>) -> bool {
        match unmet {
            Some(why) => {
                self.skip(name, why.clone());
                false
            }
            None => true,
        }
    }

    fn pass(&mut self, name: &'static str, detail: String) {
        self.record(name, Verdict::Pass, detail);
    }

    fn fail(&mut self, name: &'static str, detail: String) {
        self.record(name, Verdict::Fail, detail);
    }

    fn skip(&mut self, name: &'static str, detail: String) {
        self.record(name, Verdict::Skip, detail);
    }

    fn record(&mut self, name: &'static str, verdict: Verdict, detail: String) {
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
fn lacking(advertised: Option<&Advertised>, capability: Capability) -> Option<String> {
    match advertised {
        None => Some(capabilities_unknown()),
        Some(a) if a.0.contains(&capability) => None,
        Some(_) => Some(format!(
            "the plugin does not advertise {}",
            capability_name(capability)
        )),
    }
}

fn capabilities_unknown() -> String {
    "StoragePluginGetCapabilities failed, so what the plugin implements is unknown".to_string()
}
