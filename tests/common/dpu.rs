//! The DPU attach layer a test runs against, chosen by `SNAP_CSI_TEST_DPU`:
//! `colocated` (the default: in the test's process, over the plugin's and
//! SNAP's sockets) or `split`: a real DPU agent on its own thread and
//! runtime, reached over mutual TLS on loopback with certificates made for
//! the test, as a BlueField host reaches its DPU. The test command runs the
//! node and DPU suites both ways.

use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use snap_csi::agent::AgentConfig;
use snap_csi::dpu::colocated::Colocated;
use snap_csi::dpu::remote::RemoteDpu;
use snap_csi::dpu::{
    AttachRequest, Attachment, DpuAttach, DpuError, HostLocator, Inventory, IoStats,
};
use snap_csi::grpc::LinkAddress;
use snap_csi::tls::TlsFiles;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::{Semaphore, oneshot};
use tokio::time::Instant;

use super::pki::{Pki, Role};
use super::shared::free_local_address;

pub const MODE_ENV: &str = "SNAP_CSI_TEST_DPU";
/// The names the test certificates carry.
pub const DPU_NAME: &str = "dpu-1";
pub const HOST_NAME: &str = "node-1";

/// Whether this run tests split mode.
pub fn split() -> bool {
    match std::env::var(MODE_ENV).as_deref() {
        Ok("split") => true,
        Ok("colocated") | Err(_) => false,
        Ok(other) => panic!("{MODE_ENV}={other}: expected split or colocated"),
    }
}

/// A DPU agent serving the plugin at `plugin_socket` and the SNAP at
/// `snap_template`, stopped when dropped.
pub struct Agent {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<anyhow::Result<()>>>,
    pub address: LinkAddress,
    /// What a node presents: its certificate naming [`HOST_NAME`].
    pub node_tls: TlsFiles,
    pub config: AgentConfig,
}

impl Agent {
    /// An agent over the co-located attach layer of the plugin at
    /// `plugin_socket` and the SNAP at `snap_template`; its certificates and
    /// their CA are made under `dir`.
    pub async fn start(plugin_socket: &Path, snap_template: &str, dir: &Path) -> Agent {
        let (mut config, node_tls, _) = test_config(dir);
        config.plugin_socket = plugin_socket.to_path_buf();
        config.snap_socket_template = snap_template.to_string();
        Agent::launch(config, node_tls, None).await
    }

    /// An agent serving `dpu` (a test's own attach layer).
    pub async fn serving(dpu: Arc<dyn DpuAttach>, dir: &Path) -> Agent {
        let (config, node_tls, _) = test_config(dir);
        Agent::launch(config, node_tls, Some(dpu)).await
    }

    /// Starts an agent with `config` (over `dpu`, or over the plugin and SNAP
    /// it names); `node_tls` is what its nodes present.
    pub async fn launch(
        config: AgentConfig,
        node_tls: TlsFiles,
        dpu: Option<Arc<dyn DpuAttach>>,
    ) -> Agent {
        let address = config.address().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let agent_config = config.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            // Stopped as if killed: a graceful stop would wait for the node's
            // connection to close, whose runtime may be the one blocked in
            // this agent's drop.
            let never = std::future::pending::<()>();
            runtime.block_on(async move {
                let serving = async move {
                    match dpu {
                        Some(dpu) => snap_csi::agent::serve(agent_config, dpu, never).await,
                        None => snap_csi::agent::run(agent_config, never).await,
                    }
                };
                tokio::select! {
                    served = serving => served,
                    _ = stopped => Ok(()),
                }
            })
        });
        let agent = Agent {
            stop: Some(stop),
            thread: Some(thread),
            address,
            node_tls,
            config,
        };
        agent.wait_listening().await;
        agent
    }

    async fn wait_listening(&self) {
        let host_port = match &self.address {
            LinkAddress::Tls(host_port) => host_port.clone(),
            LinkAddress::Plaintext(socket) => socket.to_string(),
            LinkAddress::Unix(path) => panic!("test agents listen on TCP, not {}", path.display()),
        };
        for _ in 0..500 {
            if tokio::net::TcpStream::connect(&host_port).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the DPU agent does not listen on {host_port}");
    }

    /// The node's side of the link to this agent.
    pub fn remote(&self) -> RemoteDpu {
        RemoteDpu::new(self.address.clone(), DPU_NAME, &self.node_tls).unwrap()
    }

    /// The node flags that reach this agent.
    pub fn node_args(&self) -> Vec<String> {
        vec![
            format!("--dpu-endpoint={}", self.address),
            format!("--dpu-name={DPU_NAME}"),
            format!("--dpu-tls-cert={}", self.node_tls.cert.display()),
            format!("--dpu-tls-key={}", self.node_tls.key.display()),
            format!("--dpu-tls-ca={}", self.node_tls.ca.display()),
        ]
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            match thread.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("DPU agent: {e:#}"),
                Err(_) => eprintln!("DPU agent thread panicked"),
            }
        }
    }
}

/// A fresh CA under `dir`, the agent's settings with a certificate naming
/// [`DPU_NAME`] and serving [`HOST_NAME`], the files of that host's node,
/// and the CA for more certificates.
pub fn test_config(dir: &Path) -> (AgentConfig, TlsFiles, Pki) {
    let pki = Pki::new(&dir.join("pki"), "ca");
    let config = AgentConfig {
        listen: format!("https://{}", free_local_address()),
        insecure_plaintext: false,
        host_name: HOST_NAME.into(),
        tls: pki.issue(Role::Agent, DPU_NAME),
        call_timeout: Duration::from_secs(60),
        ..AgentConfig::default()
    };
    let node_tls = pki.issue(Role::Node, HOST_NAME);
    (config, node_tls, pki)
}

/// An attach layer whose attaches wait until the test lets them go, one
/// permit each, so a test can hold a call in the middle: on its own it
/// answers `locator` for every volume; around another layer
/// ([`GatedDpu::around`]) it waits after that layer's attach returned, so the
/// DPU holds everything while the caller has not heard back.
#[derive(Debug)]
pub struct GatedDpu {
    pub gate: Semaphore,
    /// Attaches that reached the gate so far.
    pub attaches: AtomicUsize,
    /// Attaches dropped at the gate: their caller went away.
    pub cancelled: AtomicUsize,
    pub locator: HostLocator,
    inner: Option<Arc<dyn DpuAttach>>,
}

impl GatedDpu {
    pub fn new(locator: HostLocator) -> Arc<GatedDpu> {
        GatedDpu::build(locator, None)
    }

    /// Gates the attaches of `inner`, after it attached; the rest passes through.
    pub fn around(inner: Arc<dyn DpuAttach>) -> Arc<GatedDpu> {
        let unused = HostLocator::VirtioBlk {
            bdf: String::new(),
            serial: String::new(),
        };
        GatedDpu::build(unused, Some(inner))
    }

    fn build(locator: HostLocator, inner: Option<Arc<dyn DpuAttach>>) -> Arc<GatedDpu> {
        Arc::new(GatedDpu {
            gate: Semaphore::new(0),
            attaches: AtomicUsize::new(0),
            cancelled: AtomicUsize::new(0),
            locator,
            inner,
        })
    }

    /// Waits until at least `count` attaches have reached the gate.
    pub async fn started(&self, count: usize) {
        until("attaches started", || {
            self.attaches.load(Ordering::SeqCst) >= count
        })
        .await;
    }

    /// Waits until at least `count` attaches were dropped at the gate.
    pub async fn cancelled(&self, count: usize) {
        until("attaches cancelled", || {
            self.cancelled.load(Ordering::SeqCst) >= count
        })
        .await;
    }
}

/// Polls `done` (a counter a server task moves) for up to 5 s.
async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within 5 s");
}

/// Counts an attach as cancelled if dropped before it passed the gate.
struct AtGate<'a>(&'a AtomicUsize);

impl Drop for AtGate<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl DpuAttach for GatedDpu {
    async fn attach(
        &self,
        request: &AttachRequest,
        deadline: Instant,
    ) -> Result<Attachment, DpuError> {
        let attached = match &self.inner {
            Some(inner) => inner.attach(request, deadline).await?,
            None => Attachment {
                device_name: "gated".into(),
                locator: self.locator.clone(),
            },
        };
        self.attaches.fetch_add(1, Ordering::SeqCst);
        let at_gate = AtGate(&self.cancelled);
        self.gate
            .acquire()
            .await
            .map_err(|e| DpuError::Internal(e.to_string()))?
            .forget();
        std::mem::forget(at_gate);
        Ok(attached)
    }

    async fn detach(
        &self,
        volume_id: &str,
        device_name: Option<&str>,
        deadline: Instant,
    ) -> Result<(), DpuError> {
        match &self.inner {
            Some(inner) => inner.detach(volume_id, device_name, deadline).await,
            None => Ok(()),
        }
    }

    async fn probe(&self, deadline: Instant) -> Result<bool, DpuError> {
        match &self.inner {
            Some(inner) => inner.probe(deadline).await,
            None => Ok(true),
        }
    }

    async fn inventory(&self, deadline: Instant) -> Result<Inventory, DpuError> {
        match &self.inner {
            Some(inner) => inner.inventory(deadline).await,
            None => Ok(Inventory::default()),
        }
    }

    async fn io_stats(&self, deadline: Instant) -> Result<IoStats, DpuError> {
        match &self.inner {
            Some(inner) => inner.io_stats(deadline).await,
            None => Err(DpuError::Unavailable("no DPU behind the gate".into())),
        }
    }
}

/// The attach layer of one test: co-located, or split through an agent.
pub struct TestDpu {
    pub attach: Arc<dyn DpuAttach>,
    pub agent: Option<Agent>,
}

impl TestDpu {
    /// In the mode of this run; `dir` holds the split mode's certificates.
    pub async fn start(plugin_socket: &Path, snap_template: &str, dir: &Path) -> TestDpu {
        if split() {
            let agent = Agent::start(plugin_socket, snap_template, dir).await;
            TestDpu {
                attach: Arc::new(agent.remote()),
                agent: Some(agent),
            }
        } else {
            TestDpu {
                attach: Arc::new(Colocated::new(plugin_socket, snap_template)),
                agent: None,
            }
        }
    }
}
