//! A vendor plugin that breaks the `nvidia.storage.plugins.v1` rules on
//! purpose, for testing `plugin-check`: each [`Fault`] breaks one rule and is
//! switched on alone, so a test can tell which checks each rule stands for.
//!
//! With no fault it is a correct plugin whose devices are names in memory (no
//! SNAP behind it: the checker sees only the API), so a check that fails
//! against it can only be the fault's doing. It records no calls.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use snap_csi::proto::nvidia::storage::plugins::v1 as api;
use tonic::{Code, Request, Response, Status};

use api::identity_service_server::IdentityService;
use api::storage_plugin_service_capability::rpc::Type as Capability;
use api::storage_plugin_service_server::StoragePluginService;

use super::plugin::{self, TestPlugin};

/// One broken rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Probe answers ready=false.
    NotReady,
    /// CreateDevice makes another device, with another name, on every call.
    NewNameEachCreate,
    /// DeleteDevice of a device that does not exist answers NOT_FOUND.
    DeleteAbsentFails,
    /// GetDevice answers OK for a device that does not exist.
    GetAbsentOk,
    /// ListDevices takes any starting_token, an unknown one as the start.
    AnyToken,
    /// The RPCs of what it does not advertise answer INTERNAL.
    UnadvertisedInternal,
}

/// A running broken plugin; stops when dropped.
pub struct BrokenPlugin {
    pub server: TestPlugin,
    devices: Arc<Mutex<Devices>>,
}

impl BrokenPlugin {
    pub fn socket(&self) -> &Path {
        &self.server.socket
    }

    /// The devices it holds, as (volume id, device name).
    pub fn devices(&self) -> Vec<(String, String)> {
        let devices = self.devices.lock().unwrap();
        devices
            .by_name
            .iter()
            .map(|(name, volume)| (volume.clone(), name.clone()))
            .collect()
    }
}

/// Starts it on `<dir>/broken-plugin.sock`, advertising `capabilities`.
pub fn start(dir: &Path, capabilities: &[Capability], faults: &[Fault]) -> BrokenPlugin {
    let devices = Arc::new(Mutex::new(Devices::default()));
    let plugin = Broken {
        capabilities: capabilities.to_vec(),
        faults: faults.to_vec(),
        devices: Arc::clone(&devices),
    };
    let server = plugin::serve(dir.join("broken-plugin.sock"), plugin, Arc::default());
    BrokenPlugin { server, devices }
}

#[derive(Debug, Default)]
struct Devices {
    /// Device name → volume id.
    by_name: BTreeMap<String, String>,
    /// Makes every NewNameEachCreate name new.
    made: u64,
}

#[derive(Debug, Clone)]
struct Broken {
    capabilities: Vec<Capability>,
    faults: Vec<Fault>,
    devices: Arc<Mutex<Devices>>,
}

impl Broken {
    fn has(&self, fault: Fault) -> bool {
        self.faults.contains(&fault)
    }

    /// The answer of an RPC whose capability is not advertised.
    fn gate(&self, capability: Capability, rpc: &str) -> Result<(), Status> {
        if self.capabilities.contains(&capability) {
            return Ok(());
        }
        let code = if self.has(Fault::UnadvertisedInternal) {
            Code::Internal
        } else {
            Code::Unimplemented
        };
        Err(Status::new(code, format!("{rpc} is not implemented")))
    }
}

#[tonic::async_trait]
impl IdentityService for Broken {
    async fn get_plugin_info(
        &self,
        _: Request<api::GetPluginInfoRequest>,
    ) -> Result<Response<api::GetPluginInfoResponse>, Status> {
        Ok(Response::new(api::GetPluginInfoResponse {
            name: "broken-plugin.snap-csi.io".into(),
            vendor_version: "0.0.1".into(),
            manifest: Default::default(),
        }))
    }

    async fn probe(
        &self,
        _: Request<api::ProbeRequest>,
    ) -> Result<Response<api::ProbeResponse>, Status> {
        Ok(Response::new(api::ProbeResponse {
            ready: Some(!self.has(Fault::NotReady)),
        }))
    }
}

#[tonic::async_trait]
impl StoragePluginService for Broken {
    async fn storage_plugin_get_capabilities(
        &self,
        _: Request<api::StoragePluginGetCapabilitiesRequest>,
    ) -> Result<Response<api::StoragePluginGetCapabilitiesResponse>, Status> {
        Ok(Response::new(plugin::capabilities_response(
            &self.capabilities,
        )))
    }

    async fn get_snap_provider(
        &self,
        _: Request<api::GetSnapProviderRequest>,
    ) -> Result<Response<api::GetSnapProviderResponse>, Status> {
        Ok(Response::new(api::GetSnapProviderResponse {
            provider_name: String::new(),
        }))
    }

    async fn create_device(
        &self,
        request: Request<api::CreateDeviceRequest>,
    ) -> Result<Response<api::CreateDeviceResponse>, Status> {
        self.gate(Capability::CreateDeleteBlockDevice, "CreateDevice")?;
        let request = request.into_inner();
        // It makes block devices only, as it advertises.
        if request.volume_mode != "Block" {
            return Err(Status::failed_precondition(format!(
                "volume_mode {:?}: this plugin makes block devices only",
                request.volume_mode
            )));
        }
        let volume_id = request.volume_id;
        let mut devices = self.devices.lock().unwrap();
        let existing = devices
            .by_name
            .iter()
            .find(|(_, volume)| **volume == volume_id)
            .map(|(name, _)| name.clone());
        let device_name = match existing {
            Some(name) if !self.has(Fault::NewNameEachCreate) => name,
            _ => {
                devices.made += 1;
                let name = format!("mem-{}-{volume_id}", devices.made);
                devices.by_name.insert(name.clone(), volume_id);
                name
            }
        };
        Ok(Response::new(api::CreateDeviceResponse { device_name }))
    }

    async fn delete_device(
        &self,
        request: Request<api::DeleteDeviceRequest>,
    ) -> Result<Response<api::DeleteDeviceResponse>, Status> {
        self.gate(Capability::CreateDeleteBlockDevice, "DeleteDevice")?;
        let request = request.into_inner();
        let removed = self
            .devices
            .lock()
            .unwrap()
            .by_name
            .remove(&request.device_name);
        if removed.is_none() && self.has(Fault::DeleteAbsentFails) {
            return Err(Status::not_found(format!(
                "no device {}",
                request.device_name
            )));
        }
        Ok(Response::new(api::DeleteDeviceResponse {}))
    }

    async fn get_device(
        &self,
        request: Request<api::GetDeviceRequest>,
    ) -> Result<Response<api::GetDeviceResponse>, Status> {
        self.gate(Capability::GetDeviceStats, "GetDevice")?;
        let request = request.into_inner();
        let exists = self
            .devices
            .lock()
            .unwrap()
            .by_name
            .get(&request.device_name)
            .is_some_and(|volume| *volume == request.volume_id);
        if !exists && !self.has(Fault::GetAbsentOk) {
            return Err(Status::not_found(format!(
                "no device {}",
                request.device_name
            )));
        }
        Ok(Response::new(api::GetDeviceResponse {
            volume_mode: "Block".into(),
            ..Default::default()
        }))
    }

    async fn list_devices(
        &self,
        request: Request<api::ListDevicesRequest>,
    ) -> Result<Response<api::ListDevicesResponse>, Status> {
        self.gate(Capability::ListDevices, "ListDevices")?;
        let mut request = request.into_inner();
        if self.has(Fault::AnyToken) && request.starting_token.parse::<usize>().is_err() {
            request.starting_token.clear();
        }
        let entries = self
            .devices
            .lock()
            .unwrap()
            .by_name
            .iter()
            .map(|(name, volume)| api::list_devices_response::Entry {
                volume_id: volume.clone(),
                device_name: name.clone(),
            })
            .collect();
        plugin::page(entries, &request).map(Response::new)
    }
}
