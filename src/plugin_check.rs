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
//! completed), filesystem devices (it asks for block devices, as snap-csi
//! does), and that the device is usable inside SNAP.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use tokio::net::UnixStream;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::dpu::plugin::{LIST_PAGE, VOLUME_MODE_BLOCK};
use crate::grpc::{call_until, unix_channel};
use crate::proto::nvidia::storage::plugins::v1 as api;
use api::identity_service_client::IdentityServiceClient;
use api::storage_plugin_service_capability::rpc::Type as Capability;
use api::storage_plugin_service_client::StoragePluginServiceClient;

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
    pub const CLEANUP: &str = "cleanup";

    pub const ALL: [&str; 20] = [
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

/// The sentences of the API text the checks stand on, quoted in FAILs.
mod text {
    pub const UNIMPLEMENTED: &str = "All the RPC methods that are not implemented by the plugin \
        MUST reply with the non-ok gRPC status code, 12 UNIMPLEMENTED.";
    pub const PLUGIN_INFO: &str = "This method should return the name of the plugin (e.g., \
        example-vendor-plugin.example) and the version of the plugin (e.g., 1.0). On success, the \
        method should reply 0 OK in the gRPC status code.";
    pub const PROBE: &str = "The plugin should verify its internal state and returns 0 OK if the \
        validation succeeds. If the plugin is still initializing, but is otherwise perfectly \
        healthy, it shall return 0 OK with the ready field set to False.";
    pub const CAPABILITIES: &str = "This API allows the SNAP Node-Driver to check the supported \
        capabilities of the storage service provided by the plugin. (Return codes: 0 OK.)";
    pub const SNAP_PROVIDER: &str = "If the plugin uses the default SNAP process (provided by \
        NVIDIA) then an empty string should be returned. Otherwise, a unique name represents the \
        SNAP process used by this plugin should be returned.";
    pub const CREATE: &str = "Business logic required by the plugin: 1. Allocate a unique device \
        name to be used by SNAP [...] 4. Return the device name";
    pub const CREATE_IDEMPOTENT: &str = "The operation must be idempotent. If the device \
        corresponding to the volume_id is already created and is identical to the specified \
        access_modes and volume_mode the plugin must reply 0 OK with the corresponding \
        CreateDeviceResponse message.";
    pub const DELETE: &str = "Business logic required by the plugin: 1. Remove the device from \
        the SNAP process. (Return codes: 0 OK.)";
    pub const DELETE_IDEMPOTENT: &str = "The operation must be idempotent. If the device \
        corresponding to the volume_id and the device_name does not exist, the plugin must reply \
        0 OK.";
    pub const GET_DEVICE: &str = "A Storage vendor plugin must implement this API if it has \
        GET_DEVICE_STATS capability. The plugin shall return the information about the device \
        corresponding to the volume_id and the device_name.";
    pub const GET_NOT_FOUND: &str = "If the device corresponding to the volume_id and the \
        device_name does not exist, the plugin must reply 5 NOT_FOUND.";
    pub const LIST: &str = "A Storage vendor plugin must implement this API if it has \
        LIST_DEVICES capability. The plugin shall return the information about all the devices \
        that it knows about.";
    pub const LIST_ABORTED: &str = "Return codes: [...] 10 ABORTED Indicates that starting_token \
        is not valid";
}

/// What one check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Fail,
    Skip,
}

/// One printed line: `PASS <name>: <detail>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    pub name: &'static str,
    pub verdict: Verdict,
    pub detail: String,
}

impl fmt::Display for CheckResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = match self.verdict {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Skip => "SKIP",
        };
        write!(f, "{verdict} {}: {}", self.name, self.detail)
    }
}

/// Every check's result, in order.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub results: Vec<CheckResult>,
}

impl Report {
    pub fn passed(&self) -> usize {
        self.count(Verdict::Pass)
    }

    pub fn failed(&self) -> usize {
        self.count(Verdict::Fail)
    }

    /// The names of the checks with `verdict`, in order.
    pub fn names(&self, verdict: Verdict) -> Vec<&'static str> {
        self.results
            .iter()
            .filter(|r| r.verdict == verdict)
            .map(|r| r.name)
            .collect()
    }

    /// `N passed, M failed`.
    pub fn summary(&self) -> String {
        format!("{} passed, {} failed", self.passed(), self.failed())
    }

    fn count(&self, verdict: Verdict) -> usize {
        self.results.iter().filter(|r| r.verdict == verdict).count()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for result in &self.results {
            writeln!(f, "{result}")?;
        }
        write!(f, "{}", self.summary())
    }
}

/// What a run needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The plugin's UNIX socket.
    pub socket: PathBuf,
    /// The volume_context CreateDevice gets; the plugin needs it to find the
    /// storage (e.g. `backend=aio`, `path=/tmp/x.img`).
    pub volume_context: HashMap<String, String>,
    /// How long each check may take, all its calls together.
    pub timeout: Duration,
}

/// A run that could not start.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("invalid arguments: {0}")]
    Usage(String),
    #[error("cannot connect to the plugin at {socket}: {reason}")]
    Unreachable { socket: String, reason: String },
}

/// `snap-csi plugin-check`.
#[derive(Debug, clap::Args)]
pub struct PluginCheckArgs {
    /// The plugin's socket: `unix:///path/to/plugin.sock`.
    #[arg(long)]
    pub endpoint: String,
    /// A volume_context entry the plugin needs to create a device; repeat for more.
    #[arg(long = "volume-context", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub volume_context: Vec<(String, String)>,
    /// Seconds each check may take, all its calls together.
    #[arg(long, default_value_t = 30.0)]
    pub timeout: f64,
}

impl PluginCheckArgs {
    pub fn resolve(&self) -> Result<Config, CheckError> {
        let socket = parse_endpoint(&self.endpoint)?;
        let timeout = crate::settings::duration_from_secs(self.timeout)
            .ok()
            .filter(|t| !t.is_zero())
            .ok_or_else(|| {
                CheckError::Usage(format!(
                    "--timeout {} is not a positive number of seconds up to {} (a year)",
                    self.timeout,
                    crate::settings::MAX_SECONDS
                ))
            })?;
        let mut volume_context = HashMap::new();
        for (key, value) in &self.volume_context {
            if volume_context.insert(key.clone(), value.clone()).is_some() {
                return Err(CheckError::Usage(format!(
                    "--volume-context {key} is given twice"
                )));
            }
        }
        Ok(Config {
            socket,
            volume_context,
            timeout,
        })
    }
}

/// The subcommand: prints each result as it comes, then the summary; exits 1
/// when a check failed and 2 when the run could not start.
pub async fn run_cli(args: &PluginCheckArgs) -> ExitCode {
    let report = match args.resolve() {
        Ok(config) => run(&config, &mut |result| println!("{result}")).await,
        Err(e) => Err(e),
    };
    match report {
        Ok(report) => {
            println!("{}", report.summary());
            if report.failed() == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("plugin-check: {e}");
            ExitCode::from(2)
        }
    }
}

/// `unix:///abs/path` or `unix:path`, as gRPC names UNIX sockets.
pub fn parse_endpoint(endpoint: &str) -> Result<PathBuf, CheckError> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .filter(|p| !p.is_empty())
        .ok_or_else(|| {
            CheckError::Usage(format!(
                "--endpoint {endpoint:?}: expected unix:///path/to/plugin.sock \
                 (plugins serve nvidia.storage.plugins.v1 on a UNIX socket)"
            ))
        })?;
    Ok(PathBuf::from(path))
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

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
        let no_stats = lacking(advertised, Capability::GetDeviceStats);
        let no_list = lacking(advertised, Capability::ListDevices);
        if self.may_run(checks::GET_DEVICE_NOT_FOUND, &no_stats) {
            self.get_device_not_found().await;
        }
        if self.may_run(checks::DELETE_DEVICE_ABSENT, &no_block) {
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

    // ----- identity and capabilities -----

    async fn plugin_info(&mut self) {
        let name = checks::PLUGIN_INFO;
        let mut c = self.identity.clone();
        let answer = call_until(
            "GetPluginInfo",
            self.deadline(),
            api::GetPluginInfoRequest {},
            |r| async move { c.get_plugin_info(r).await },
        )
        .await;
        match answer {
            Ok(info) if !info.name.is_empty() && !info.vendor_version.is_empty() => self.pass(
                name,
                format!(
                    "GetPluginInfo names the plugin {:?}, version {:?}",
                    info.name, info.vendor_version
                ),
            ),
            Ok(info) => self.fail(
                name,
                format!(
                    "expected a non-empty name and vendor_version, got name {:?} and \
                     vendor_version {:?}. The API text: {:?}",
                    info.name,
                    info.vendor_version,
                    text::PLUGIN_INFO
                ),
            ),
            Err(status) => self.fail(
                name,
                format!(
                    "expected 0 OK, GetPluginInfo answered {}. The API text: {:?}",
                    show(&status),
                    text::PLUGIN_INFO
                ),
            ),
        }
    }

    async fn probe(&mut self) {
        let name = checks::PROBE;
        let mut c = self.identity.clone();
        let answer = call_until(
            "Probe",
            self.deadline(),
            api::ProbeRequest {},
            |r| async move { c.probe(r).await },
        )
        .await;
        match answer.map(|p| p.ready) {
            Ok(Some(true)) => self.pass(name, "Probe answers 0 OK, ready".to_string()),
            // The API copies CSI's ProbeResponse, where an unset `ready` means
            // ready; our node reads it so too.
            Ok(None) => self.pass(
                name,
                "Probe answers 0 OK with ready unset, which counts as ready (as in CSI's Probe)"
                    .to_string(),
            ),
            Ok(Some(false)) => self.fail(
                name,
                format!(
                    "the plugin is not ready: expected ready=true from a healthy plugin, \
                     Probe answered 0 OK with ready=false (still initializing), so checks \
                     below may fail for that reason alone. The API text: {:?}",
                    text::PROBE
                ),
            ),
            Err(status) => self.fail(
                name,
                format!(
                    "expected 0 OK, Probe answered {}. The API text: {:?}",
                    show(&status),
                    text::PROBE
                ),
            ),
        }
    }

    async fn capabilities(&mut self) -> Option<Advertised> {
        let name = checks::CAPABILITIES;
        let mut c = self.storage.clone();
        let answer = call_until(
            "StoragePluginGetCapabilities",
            self.deadline(),
            api::StoragePluginGetCapabilitiesRequest {},
            |r| async move { c.storage_plugin_get_capabilities(r).await },
        )
        .await;
        match answer {
            Ok(response) => {
                let mut known = Vec::new();
                let mut unknown = Vec::new();
                for capability in &response.capabilities {
                    match capability.r#type {
                        Some(api::storage_plugin_service_capability::Type::Rpc(rpc)) => {
                            match Capability::try_from(rpc.r#type) {
                                Ok(Capability::Unspecified) | Err(_) => unknown.push(rpc.r#type),
                                Ok(known_type) => known.push(known_type),
                            }
                        }
                        None => unknown.push(0),
                    }
                }
                let mut detail = format!(
                    "StoragePluginGetCapabilities answers 0 OK advertising [{}]",
                    known
                        .iter()
                        .map(|c| capability_name(*c))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                if !unknown.is_empty() {
                    detail.push_str(&format!(
                        " (and entries of unknown or unspecified type {unknown:?}, ignored)"
                    ));
                }
                self.pass(name, detail);
                Some(Advertised(known))
            }
            Err(status) => {
                self.fail(
                    name,
                    format!(
                        "expected 0 OK, StoragePluginGetCapabilities answered {}; the checks \
                         that depend on capabilities are skipped. The API text: {:?}",
                        show(&status),
                        text::CAPABILITIES
                    ),
                );
                None
            }
        }
    }

    async fn snap_provider(&mut self) {
        let name = checks::SNAP_PROVIDER;
        let mut c = self.storage.clone();
        let answer = call_until(
            "GetSNAPProvider",
            self.deadline(),
            api::GetSnapProviderRequest {},
            |r| async move { c.get_snap_provider(r).await },
        )
        .await;
        match answer {
            Ok(p) if p.provider_name.is_empty() => self.pass(
                name,
                "GetSNAPProvider answers 0 OK: the default SNAP provider".to_string(),
            ),
            Ok(p) => self.pass(
                name,
                format!(
                    "GetSNAPProvider answers 0 OK: SNAP provider {:?}",
                    p.provider_name
                ),
            ),
            Err(status) => self.fail(
                name,
                format!(
                    "expected 0 OK, GetSNAPProvider answered {}. The API text: {:?}",
                    show(&status),
                    text::SNAP_PROVIDER
                ),
            ),
        }
    }

    // ----- what is not advertised answers UNIMPLEMENTED -----

    async fn create_delete_unimplemented(&mut self, advertised: Option<&Advertised>) {
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

    async fn get_device_unimplemented(&mut self, advertised: Option<&Advertised>) {
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

    async fn list_devices_unimplemented(&mut self, advertised: Option<&Advertised>) {
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

    // ----- the life of a device -----

    async fn create_device(&mut self) -> Option<Device> {
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

    async fn create_device_idempotent(&mut self, device: &Device) {
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

    async fn get_device(&mut self, device: &Device) {
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

    async fn get_device_not_found(&mut self) {
        let absent = self.absent();
        self.expect_not_found(checks::GET_DEVICE_NOT_FOUND, &absent, "was never created")
            .await;
    }

    async fn get_device_after_delete(&mut self, device: &Device) {
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

    async fn list_devices(&mut self, device: &Device) {
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

    async fn list_devices_paging(&mut self) {
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

    async fn list_devices_bad_token(&mut self) {
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

    /// True when the device is gone.
    async fn delete_device(&mut self, device: &Device) -> bool {
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

    async fn delete_device_idempotent(&mut self, device: &Device) {
        self.expect_delete_ok(
            checks::DELETE_DEVICE_IDEMPOTENT,
            device,
            "DeleteDevice already removed",
        )
        .await;
    }

    async fn delete_device_absent(&mut self) {
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

    async fn list_devices_after_delete(&mut self, device: &Device) {
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

    /// Deletes whatever the run made and has not deleted yet, whatever failed
    /// before.
    async fn cleanup(&mut self) {
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

    // ----- calls -----

    async fn call_create(
        &self,
        volume_id: &str,
        deadline: Instant,
    ) -> Result<api::CreateDeviceResponse, Status> {
        let request = api::CreateDeviceRequest {
            volume_id: volume_id.to_string(),
            access_modes: vec![api::AccessMode::Rwo as i32],
            volume_mode: VOLUME_MODE_BLOCK.to_string(),
            publish_context: HashMap::new(),
            volume_context: self.config.volume_context.clone(),
            storage_parameters: HashMap::new(),
        };
        let mut c = self.storage.clone();
        call_until("CreateDevice", deadline, request, |r| async move {
            c.create_device(r).await
        })
        .await
    }

    async fn call_delete(&self, device: &Device, deadline: Instant) -> Result<(), Status> {
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

    async fn call_get(
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

    async fn call_list(
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
    async fn list_all(&self, max_entries: i32, deadline: Instant) -> Result<Listing, String> {
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

/// `LIST_DEVICES`, as the API text spells capabilities.
fn capability_name(capability: Capability) -> &'static str {
    let name = capability.as_str_name();
    name.strip_prefix("TYPE_").unwrap_or(name)
}

/// A status as the API text writes codes (`5 NOT_FOUND`), with its message.
fn show(status: &Status) -> String {
    let code = status.code();
    let name = match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    };
    if status.message().is_empty() {
        format!("{} {name}", code as i32)
    } else {
        format!("{} {name} ({:?})", code as i32, status.message())
    }
}

fn show_entries(entries: &[api::list_devices_response::Entry]) -> String {
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

/// `1 page`, `2 pages`.
fn counted(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// One result is one line, whatever a plugin puts in its messages.
fn one_line(s: &str) -> String {
    s.split(['\n', '\r']).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_unix_sockets() {
        assert_eq!(
            parse_endpoint("unix:///run/plugin.sock").unwrap(),
            PathBuf::from("/run/plugin.sock")
        );
        assert_eq!(
            parse_endpoint("unix:plugin.sock").unwrap(),
            PathBuf::from("plugin.sock")
        );
        for bad in ["/run/plugin.sock", "tcp://1.2.3.4:5", "unix://", ""] {
            assert!(parse_endpoint(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn volume_context_entries_are_key_value() {
        assert_eq!(
            parse_key_value("path=/tmp/x=y.img").unwrap(),
            ("path".to_string(), "/tmp/x=y.img".to_string())
        );
        assert_eq!(
            parse_key_value("empty=").unwrap(),
            ("empty".to_string(), String::new())
        );
        assert!(parse_key_value("novalue").is_err());
        assert!(parse_key_value("=value").is_err());
    }

    #[test]
    fn a_key_given_twice_is_refused() {
        let args = PluginCheckArgs {
            endpoint: "unix:///x.sock".into(),
            volume_context: vec![("a".into(), "1".into()), ("a".into(), "2".into())],
            timeout: 5.0,
        };
        assert!(matches!(args.resolve(), Err(CheckError::Usage(_))));
    }

    #[test]
    fn a_timeout_must_be_positive() {
        for timeout in [0.0, -1.0, f64::NAN] {
            let args = PluginCheckArgs {
                endpoint: "unix:///x.sock".into(),
                volume_context: vec![],
                timeout,
            };
            assert!(
                matches!(args.resolve(), Err(CheckError::Usage(_))),
                "{timeout}"
            );
        }
    }

    #[test]
    fn statuses_read_as_the_api_text_writes_them() {
        assert_eq!(show(&Status::not_found("")), "5 NOT_FOUND");
        assert_eq!(
            show(&Status::unimplemented("no")),
            "12 UNIMPLEMENTED (\"no\")"
        );
        assert_eq!(capability_name(Capability::ListDevices), "LIST_DEVICES");
    }

    #[test]
    fn results_print_one_line_each_and_the_summary_alone() {
        let report = Report {
            results: vec![
                CheckResult {
                    name: checks::PROBE,
                    verdict: Verdict::Pass,
                    detail: "ok".into(),
                },
                CheckResult {
                    name: checks::CLEANUP,
                    verdict: Verdict::Fail,
                    detail: one_line("a\nb"),
                },
                CheckResult {
                    name: checks::LIST_DEVICES,
                    verdict: Verdict::Skip,
                    detail: "why".into(),
                },
            ],
        };
        assert_eq!(
            report.to_string(),
            "PASS probe: ok\nFAIL cleanup: a b\nSKIP list-devices: why\n1 passed, 1 failed"
        );
    }
}
