//! A scripted vendor CSI controller for the controller proxy's tests: CSI
//! Identity, Controller and (optionally) GroupController and the VolumeGroup
//! Controller over real gRPC, on a UNIX socket, TCP, or TCP with mutual TLS.
//!
//! Every call is recorded (the request as received, and the `grpc-timeout`
//! it came with) and answered from a per-method script: a response, a status
//! or silence; a method with nothing scripted answers its default response.
//! Dropping the vendor stops it at once, in-flight calls and all, as a
//! crashed vendor would.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::volumegroup as vg;
use snap_csi::tls::TlsFiles;
use tokio::sync::oneshot;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::transport::server::Router;
use tonic::{Code, Request, Response, Status};

/// How the vendor answers one call.
pub enum Answer {
    Reply(Box<dyn Any + Send>),
    Fail {
        code: Code,
        message: String,
        details: Vec<u8>,
    },
    /// No answer, ever: a vendor that hangs.
    Silent,
}

impl Answer {
    /// Answers `response`, which must be the method's response type.
    pub fn reply<T: Send + 'static>(response: T) -> Answer {
        Answer::Reply(Box::new(response))
    }

    pub fn fail(code: Code, message: &str) -> Answer {
        Answer::Fail {
            code,
            message: message.into(),
            details: Vec::new(),
        }
    }
}

/// Which optional services the vendor serves (Identity and Controller always).
#[derive(Debug, Clone, Copy)]
pub struct Services {
    pub group_controller: bool,
    pub volume_group: bool,
}

impl Services {
    pub const ALL: Services = Services {
        group_controller: true,
        volume_group: true,
    };
    /// Identity and Controller only: the others answer UNIMPLEMENTED, as
    /// tonic (and grpc-go) do for a service that is not registered.
    pub const BASIC: Services = Services {
        group_controller: false,
        volume_group: false,
    };
}

/// One call as the vendor received it.
pub struct Received {
    pub method: &'static str,
    pub request: Box<dyn Any + Send>,
    pub timeout: Option<Duration>,
}

#[derive(Default)]
struct State {
    received: Mutex<Vec<Received>>,
    script: Mutex<HashMap<&'static str, VecDeque<Answer>>>,
}

/// A running fake vendor; stops when dropped.
pub struct FakeVendor {
    /// How the proxy reaches it: `unix:///...` or `http://127.0.0.1:<port>`.
    pub endpoint: String,
    state: Arc<State>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A bound listener, handed to the vendor's own runtime.
enum Listener {
    Unix(std::os::unix::net::UnixListener),
    Tcp(std::net::TcpListener),
    /// Mutual TLS with these files, accepting only a client certificate
    /// naming the host given.
    Tls(std::net::TcpListener, TlsFiles, String),
}

impl FakeVendor {
    /// A vendor listening on `<dir>/vendor.sock` when this returns.
    pub async fn unix(dir: &Path, services: Services) -> FakeVendor {
        let socket = dir.join("vendor.sock");
        let _ = std::fs::remove_file(&socket);
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        FakeVendor::serve(
            format!("unix://{}", socket.display()),
            Listener::Unix(listener),
            services,
        )
    }

    /// A vendor listening on a free TCP port of 127.0.0.1 when this returns.
    pub async fn tcp(services: Services) -> FakeVendor {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        FakeVendor::serve(endpoint, Listener::Tcp(listener), services)
    }

    /// A vendor on a free TCP port of 127.0.0.1 that speaks mutual TLS only:
    /// it presents `files`' certificate and accepts only a client
    /// certificate signed by their CA that names `client`.
    pub async fn tls(services: Services, files: TlsFiles, client: &str) -> FakeVendor {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("https://{}", listener.local_addr().unwrap());
        let listener = Listener::Tls(listener, files, client.to_string());
        FakeVendor::serve(endpoint, listener, services)
    }

    /// Serves on a runtime of its own, so that dropping it ends every
    /// connection at once (tonic runs each connection as a task of its own,
    /// which outlives the accepting task).
    fn serve(endpoint: String, listener: Listener, services: Services) -> FakeVendor {
        let state = Arc::new(State::default());
        let router = router(Vendor(Arc::clone(&state)), services);
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let serving = async move {
                    match listener {
                        Listener::Unix(l) => {
                            l.set_nonblocking(true).unwrap();
                            let l = tokio::net::UnixListener::from_std(l).unwrap();
                            router.serve_with_incoming(UnixListenerStream::new(l)).await
                        }
                        Listener::Tcp(l) => {
                            l.set_nonblocking(true).unwrap();
                            let l = tokio::net::TcpListener::from_std(l).unwrap();
                            router.serve_with_incoming(TcpListenerStream::new(l)).await
                        }
                        Listener::Tls(l, files, client) => {
                            use snap_csi::tls::{Reloading, listen, peer_name, server_config};
                            l.set_nonblocking(true).unwrap();
                            let l = tokio::net::TcpListener::from_std(l).unwrap();
                            let name = peer_name(&client).unwrap();
                            let tls = Reloading::new(files, server_config(name)).unwrap();
                            let incoming = listen::incoming(l, Arc::new(tls), client);
                            router.serve_with_incoming(incoming).await
                        }
                    }
                };
                tokio::select! {
                    _ = serving => {}
                    _ = stopped => {}
                }
            });
        });
        FakeVendor {
            endpoint,
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Appends answers to `method`'s script, used one per call in order.
    pub fn script(&self, method: &'static str, answers: impl IntoIterator<Item = Answer>) {
        self.state
            .script
            .lock()
            .unwrap()
            .entry(method)
            .or_default()
            .extend(answers);
    }

    /// Every request `method` received, in order, as the vendor decoded it.
    pub fn received<T: Clone + 'static>(&self, method: &str) -> Vec<T> {
        self.state
            .received
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.method == method)
            .map(|r| {
                r.request
                    .downcast_ref::<T>()
                    .unwrap_or_else(|| panic!("{method} received another request type"))
                    .clone()
            })
            .collect()
    }

    /// The `grpc-timeout` of each call of `method`, in order.
    pub fn timeouts(&self, method: &str) -> Vec<Option<Duration>> {
        self.state
            .received
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.method == method)
            .map(|r| r.timeout)
            .collect()
    }

    /// How many calls of any method arrived.
    pub fn call_count(&self) -> usize {
        self.state.received.lock().unwrap().len()
    }
}

impl Drop for FakeVendor {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn router(vendor: Vendor, services: Services) -> Router {
    let mut router = tonic::transport::Server::builder()
        .add_service(csi::identity_server::IdentityServer::new(vendor.clone()))
        .add_service(csi::controller_server::ControllerServer::new(
            vendor.clone(),
        ));
    if services.group_controller {
        router = router.add_service(csi::group_controller_server::GroupControllerServer::new(
            vendor.clone(),
        ));
    }
    if services.volume_group {
        router = router.add_service(vg::controller_server::ControllerServer::new(vendor));
    }
    router
}

#[derive(Clone)]
struct Vendor(Arc<State>);

impl Vendor {
    /// Records the call, then answers it from the script.
    async fn answer<Req: Send + 'static, Resp: Default + Send + 'static>(
        &self,
        method: &'static str,
        request: Request<Req>,
    ) -> Result<Response<Resp>, Status> {
        let timeout = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(snap_csi::deadline::parse_grpc_timeout);
        self.0.received.lock().unwrap().push(Received {
            method,
            request: Box::new(request.into_inner()),
            timeout,
        });
        let next = self
            .0
            .script
            .lock()
            .unwrap()
            .get_mut(method)
            .and_then(VecDeque::pop_front);
        match next {
            None => Ok(Response::new(Resp::default())),
            Some(Answer::Reply(reply)) => match reply.downcast::<Resp>() {
                Ok(reply) => Ok(Response::new(*reply)),
                Err(_) => panic!("{method}: the script holds a reply of another type"),
            },
            Some(Answer::Fail {
                code,
                message,
                details,
            }) => Err(Status::with_details(code, message, details.into())),
            Some(Answer::Silent) => std::future::pending().await,
        }
    }
}

#[tonic::async_trait]
impl csi::identity_server::Identity for Vendor {
    async fn get_plugin_info(
        &self,
        request: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        self.answer("GetPluginInfo", request).await
    }

    async fn get_plugin_capabilities(
        &self,
        request: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        self.answer("GetPluginCapabilities", request).await
    }

    async fn probe(
        &self,
        request: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        self.answer("Probe", request).await
    }
}

#[tonic::async_trait]
impl csi::controller_server::Controller for Vendor {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        self.answer("CreateVolume", request).await
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        self.answer("DeleteVolume", request).await
    }

    async fn controller_publish_volume(
        &self,
        request: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        self.answer("ControllerPublishVolume", request).await
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        self.answer("ControllerUnpublishVolume", request).await
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        self.answer("ValidateVolumeCapabilities", request).await
    }

    async fn list_volumes(
        &self,
        request: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        self.answer("ListVolumes", request).await
    }

    async fn get_capacity(
        &self,
        request: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        self.answer("GetCapacity", request).await
    }

    async fn controller_get_capabilities(
        &self,
        request: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        self.answer("ControllerGetCapabilities", request).await
    }

    async fn create_snapshot(
        &self,
        request: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        self.answer("CreateSnapshot", request).await
    }

    async fn delete_snapshot(
        &self,
        request: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        self.answer("DeleteSnapshot", request).await
    }

    async fn list_snapshots(
        &self,
        request: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        self.answer("ListSnapshots", request).await
    }

    async fn get_snapshot(
        &self,
        request: Request<csi::GetSnapshotRequest>,
    ) -> Result<Response<csi::GetSnapshotResponse>, Status> {
        self.answer("GetSnapshot", request).await
    }

    async fn controller_expand_volume(
        &self,
        request: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        self.answer("ControllerExpandVolume", request).await
    }

    async fn controller_get_volume(
        &self,
        request: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        self.answer("ControllerGetVolume", request).await
    }

    async fn controller_modify_volume(
        &self,
        request: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        self.answer("ControllerModifyVolume", request).await
    }
}

#[tonic::async_trait]
impl csi::group_controller_server::GroupController for Vendor {
    async fn group_controller_get_capabilities(
        &self,
        request: Request<csi::GroupControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::GroupControllerGetCapabilitiesResponse>, Status> {
        self.answer("GroupControllerGetCapabilities", request).await
    }

    async fn create_volume_group_snapshot(
        &self,
        request: Request<csi::CreateVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::CreateVolumeGroupSnapshotResponse>, Status> {
        self.answer("CreateVolumeGroupSnapshot", request).await
    }

    async fn delete_volume_group_snapshot(
        &self,
        request: Request<csi::DeleteVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::DeleteVolumeGroupSnapshotResponse>, Status> {
        self.answer("DeleteVolumeGroupSnapshot", request).await
    }

    async fn get_volume_group_snapshot(
        &self,
        request: Request<csi::GetVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::GetVolumeGroupSnapshotResponse>, Status> {
        self.answer("GetVolumeGroupSnapshot", request).await
    }
}

#[tonic::async_trait]
impl vg::controller_server::Controller for Vendor {
    async fn create_volume_group(
        &self,
        request: Request<vg::CreateVolumeGroupRequest>,
    ) -> Result<Response<vg::CreateVolumeGroupResponse>, Status> {
        self.answer("CreateVolumeGroup", request).await
    }

    async fn modify_volume_group_membership(
        &self,
        request: Request<vg::ModifyVolumeGroupMembershipRequest>,
    ) -> Result<Response<vg::ModifyVolumeGroupMembershipResponse>, Status> {
        self.answer("ModifyVolumeGroupMembership", request).await
    }

    async fn delete_volume_group(
        &self,
        request: Request<vg::DeleteVolumeGroupRequest>,
    ) -> Result<Response<vg::DeleteVolumeGroupResponse>, Status> {
        self.answer("DeleteVolumeGroup", request).await
    }

    async fn list_volume_groups(
        &self,
        request: Request<vg::ListVolumeGroupsRequest>,
    ) -> Result<Response<vg::ListVolumeGroupsResponse>, Status> {
        self.answer("ListVolumeGroups", request).await
    }

    async fn controller_get_volume_group(
        &self,
        request: Request<vg::ControllerGetVolumeGroupRequest>,
    ) -> Result<Response<vg::ControllerGetVolumeGroupResponse>, Status> {
        self.answer("ControllerGetVolumeGroup", request).await
    }
}
