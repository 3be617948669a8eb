//! The floors every section can pair its samples with: an empty gRPC round
//! trip (a trivial CSI Identity server that the bench serves itself on a
//! UNIX socket, on its own thread and runtime, so that a call crosses
//! threads as it crosses processes to the node, answering
//! GetPluginCapabilities with an empty list) and a JSON-RPC round trip
//! (`spdk_get_version` to the stack's SNAP emulator over a raw `UnixStream`,
//! replies split by the same streaming JSON framer the client uses).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use snap_csi::jsonrpc::JsonFramer;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::identity_client::IdentityClient;
use snap_csi::proto::csi::v1::identity_server::{Identity, IdentityServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::csi::channel;

/// Both floors, sampled together; the server stops when this is dropped.
pub struct Probe {
    empty: IdentityClient<Channel>,
    raw: RawRpc,
    // Declared last: dropped after the client that talks to it.
    _server: EmptyServer,
}

/// One sample of each floor.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    pub grpc: Duration,
    pub jsonrpc: Duration,
}

impl Probe {
    /// Serves the empty server at `socket` and connects to it and to SNAP's
    /// `snap_socket`.
    pub async fn start(socket: PathBuf, snap_socket: &Path) -> anyhow::Result<Probe> {
        let server = EmptyServer::start(socket.clone())?;
        Ok(Probe {
            empty: IdentityClient::new(channel(&format!("unix://{}", socket.display())).await?),
            raw: RawRpc::connect(snap_socket).await?,
            _server: server,
        })
    }

    pub async fn sample(&mut self) -> anyhow::Result<Sample> {
        Ok(Sample {
            grpc: capabilities(&mut self.empty).await?,
            jsonrpc: self.raw.round_trip().await?,
        })
    }
}

/// The trivial Identity service: no I/O, nothing to look up.
#[derive(Debug, Clone, Copy)]
struct Empty;

#[tonic::async_trait]
impl Identity for Empty {
    async fn get_plugin_info(
        &self,
        _request: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse::default()))
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::GetPluginCapabilitiesResponse::default()))
    }

    async fn probe(
        &self,
        _request: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}

/// The trivial server on its own thread; stops when dropped.
struct EmptyServer {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EmptyServer {
    fn start(socket: PathBuf) -> anyhow::Result<EmptyServer> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let listener = {
            let _entered = runtime.enter();
            UnixListener::bind(&socket).with_context(|| format!("binding {}", socket.display()))?
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            runtime.block_on(async move {
                let served = tonic::transport::Server::builder()
                    .add_service(IdentityServer::new(Empty))
                    .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                        let _ = stopped.await;
                    })
                    .await;
                if let Err(e) = served {
                    eprintln!("bench: the empty gRPC server failed: {e}");
                }
            });
            let _ = std::fs::remove_file(&socket);
        });
        Ok(EmptyServer {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for EmptyServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One timed GetPluginCapabilities.
pub async fn capabilities(identity: &mut IdentityClient<Channel>) -> anyhow::Result<Duration> {
    let started = Instant::now();
    identity
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await?;
    Ok(started.elapsed())
}

/// A raw JSON-RPC connection: one request written, its reply read whole.
pub struct RawRpc {
    stream: UnixStream,
    framer: JsonFramer,
    chunk: Vec<u8>,
    id: u64,
}

impl RawRpc {
    pub async fn connect(socket: &Path) -> anyhow::Result<RawRpc> {
        Ok(RawRpc {
            stream: UnixStream::connect(socket)
                .await
                .with_context(|| format!("connecting to {}", socket.display()))?,
            framer: JsonFramer::default(),
            chunk: vec![0u8; 64 * 1024],
            id: 0,
        })
    }

    /// One timed `spdk_get_version`.
    pub async fn round_trip(&mut self) -> anyhow::Result<Duration> {
        self.id += 1;
        let request = format!(
            r#"{{"jsonrpc":"2.0","method":"spdk_get_version","id":{}}}"#,
            self.id
        );
        let started = Instant::now();
        self.stream.write_all(request.as_bytes()).await?;
        let reply = loop {
            if let Some(value) = self.framer.next_value()? {
                break value;
            }
            let n = self.stream.read(&mut self.chunk).await?;
            if n == 0 {
                bail!("the emulator closed the connection");
            }
            self.framer.extend(&self.chunk[..n]);
        };
        let elapsed = started.elapsed();
        let reply: serde_json::Value = serde_json::from_slice(&reply)?;
        if reply.get("result").is_none() {
            bail!("spdk_get_version failed: {reply}");
        }
        Ok(elapsed)
    }
}
