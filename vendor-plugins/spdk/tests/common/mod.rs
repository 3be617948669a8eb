//! The plugin in-process over real gRPC on a UNIX socket, in front of an
//! in-process SNAP emulator (as root: NVMe and virtio-blk exposure makes
//! real loop devices) or a real `spdk_tgt`, plus the calls tests make.

#![allow(dead_code)]

pub mod csi;
pub mod group_snapshots;
pub mod multipath;
pub mod nvme_io;
pub mod plugin_scenarios;
pub mod proxy;
pub mod qos_scenarios;
pub mod rounds;
pub mod scenarios;
pub mod share;

// Helpers the root crate's tests use too (another crate: included by path).
#[path = "../../../../tests/common/csi_v1_11.rs"]
pub mod csi_v1_11;
#[path = "../../../../tests/common/direct_io.rs"]
pub mod direct_io;
#[path = "../../../../tests/common/dpu.rs"]
pub mod dpu;
#[path = "../../../../tests/common/pki.rs"]
pub mod pki;
#[path = "../../../../tests/common/real_spdk.rs"]
pub mod real_spdk;
#[path = "../../../../tests/common/shared.rs"]
mod shared;

// Each test crate uses some of them, as with `dead_code` above.
use shared::loop_devices_under;
#[allow(unused_imports)]
pub use shared::{
    ROUND_TRIP_PERIOD, assert_kept_deadline, discovered, free_tcp_port, loop_devices_of,
    round_trips, sparse_file, timed,
};

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use snap_csi::grpc::unix_channel;
use snap_csi::jsonrpc::RpcClient;
use snap_csi::proto::nvidia::storage::plugins::v1 as api;
use snap_csi::spdk::bdev::{BdevAioCreate, BdevGetBdevs};
use snap_csi::spdk::fsdev::{ConfigCall, FrameworkGetConfig};
use snap_csi::spdk::nvme::{BdevNvmeGetControllers, NvmeBdevController};
use snap_csi::spdk::nvmf::{
    ListenAddress, NvmfCreateSubsystem, NvmfCreateTransport, NvmfNamespaceParams,
    NvmfSubsystemAddListener, NvmfSubsystemAddNs,
};
use snap_csi_spdk_plugin::backend::{
    ADRFAM_KEY, AIO, BACKEND_KEY, Devices, FS, NVMF, PATH_KEY, SUBNQN_KEY, TRADDR_KEY, TRSVCID_KEY,
    TRTYPE_KEY,
};
use snap_csi_spdk_plugin::config::Config;
use snap_csi_spdk_plugin::service::ServiceConfig;
use snap_emu::InProcess;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::Status;
use tonic::transport::Channel;

use real_spdk::{SpdkTgt, Suite};

use api::identity_service_client::IdentityServiceClient;
use api::storage_plugin_service_client::StoragePluginServiceClient;

/// What tests give a call, unless they test deadlines.
pub const TIMEOUT: Duration = Duration::from_secs(20);
/// Size of the backing files tests make.
pub const SIZE: u64 = 16 << 20;

/// Where a test's SPDK processes come from: in-process emulators, or real
/// `spdk_tgt` processes (`tests/common/real_spdk.rs`), whose turn on the
/// machine lasts as long as any of them runs.
#[derive(Clone)]
pub enum Source {
    Emulator,
    Real(Arc<Suite>),
}

impl Source {
    /// Real SPDK, or `None` where `SNAP_CSI_SKIP_REAL_SPDK=1` skips it (the
    /// suite said so).
    pub fn real() -> Option<Source> {
        Suite::acquire().map(|suite| Source::Real(Arc::new(suite)))
    }

    /// The DPU's SPDK. A real one has no SNAP methods, and needs none for
    /// what the plugin service does: it makes and removes bdevs.
    pub async fn snap(&self) -> Spdk {
        match self {
            Source::Emulator => Spdk::snap().await,
            Source::Real(suite) => Spdk::real(suite),
        }
    }

    /// A plain SPDK target, e.g. a remote NVMe-oF target.
    pub async fn target(&self) -> Spdk {
        match self {
            Source::Emulator => Spdk::target().await,
            Source::Real(suite) => Spdk::real(suite),
        }
    }
}

enum Process {
    Emulated(InProcess),
    Real(SpdkTgt, Arc<Suite>),
}

/// An SPDK (the emulator or a real `spdk_tgt`) with a directory for files.
pub struct Spdk {
    // Declared first: stopped (loop devices detached) before the directory goes.
    process: Process,
    pub dir: tempfile::TempDir,
}

impl Spdk {
    /// The DPU's SNAP, emulated.
    pub async fn snap() -> Spdk {
        Spdk::start(|c| c).await
    }

    /// A plain `spdk_tgt`, emulated.
    pub async fn target() -> Spdk {
        Spdk::start(snap_emu::Config::without_snap).await
    }

    /// An emulator configured by `configure`.
    pub async fn start(configure: impl FnOnce(snap_emu::Config) -> snap_emu::Config) -> Spdk {
        let dir = tempfile::tempdir().unwrap();
        let config = configure(snap_emu::Config::for_test(dir.path()));
        let spdk = InProcess::start(config).await.unwrap();
        Spdk {
            process: Process::Emulated(spdk),
            dir,
        }
    }

    /// Stops the emulator and starts another on its directory, configured
    /// by `configure`, as a process restarted there would be.
    pub async fn restart(&mut self, configure: impl FnOnce(snap_emu::Config) -> snap_emu::Config) {
        let Process::Emulated(running) = &mut self.process else {
            panic!("only an emulator is restarted here")
        };
        let config = configure(snap_emu::Config::for_test(self.dir.path()));
        running.restart(config).await.unwrap();
    }

    fn real(suite: &Arc<Suite>) -> Spdk {
        Spdk {
            process: Process::Real(suite.spdk_tgt(), Arc::clone(suite)),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn socket(&self) -> &Path {
        match &self.process {
            Process::Emulated(spdk) => spdk.socket(),
            Process::Real(spdk, _) => &spdk.socket,
        }
    }

    /// The emulator, for what only it has (SNAP's host side).
    pub fn emulator(&self) -> &InProcess {
        match &self.process {
            Process::Emulated(spdk) => spdk,
            Process::Real(..) => panic!("a real spdk_tgt has no emulated host side"),
        }
    }

    pub fn client(&self) -> RpcClient {
        RpcClient::new(self.socket())
    }

    /// The host's disks of a volume on `backing`: loop devices over the file
    /// itself, or over the file the emulator's data path serves it through
    /// (NVMe-oF volumes under `--data-path auto`), below its state directory.
    pub fn host_disks(&self, backing: &Path) -> usize {
        let datapath = self.dir.path().join("state/host/datapath");
        loop_devices_of(backing).len() + loop_devices_under(&datapath).len()
    }

    /// The names of SNAP's aio fsdevs, from the fsdev subsystem's
    /// configuration (SPDK v24.09 has no other listing).
    pub async fn fsdevs(&self) -> Vec<String> {
        let query = FrameworkGetConfig {
            name: "fsdev".into(),
        };
        let calls = self.client().call(&query).await.unwrap();
        calls
            .iter()
            .filter_map(ConfigCall::fsdev)
            .map(|(name, _)| name.to_string())
            .collect()
    }

    /// A sparse backing file under the directory.
    pub fn file(&self, name: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        sparse_file(&path, SIZE);
        path
    }

    /// Names of all bdevs.
    pub async fn bdevs(&self) -> Vec<String> {
        self.client()
            .call(&BdevGetBdevs::default())
            .await
            .unwrap()
            .into_iter()
            .map(|b| b.name)
            .collect()
    }

    /// A bdev's QoS limits as SPDK reports them (`assigned_rate_limits` of
    /// `bdev_get_bdevs`): IOPS, then read/write, read and write MiB/s;
    /// 0 is unlimited.
    pub async fn rate_limits(&self, bdev: &str) -> [u64; 4] {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        let listed = self
            .client()
            .call_raw(
                "bdev_get_bdevs",
                Some(&serde_json::json!({ "name": bdev })),
                deadline,
            )
            .await
            .unwrap();
        let limits = &listed[0]["assigned_rate_limits"];
        [
            "rw_ios_per_sec",
            "rw_mbytes_per_sec",
            "r_mbytes_per_sec",
            "w_mbytes_per_sec",
        ]
        .map(|key| limits[key].as_u64().expect("a limit"))
    }

    /// Waits until a bdev's QoS limits are `want` (something outside the
    /// call being tested sets them: the plugin's follower).
    pub async fn rate_limits_become(&self, bdev: &str, want: [u64; 4]) {
        let what = format!("{bdev}'s QoS limits");
        eventually(&what, || async {
            equal(self.rate_limits(bdev).await, want)
        })
        .await;
    }

    /// A bdev's size in blocks.
    pub async fn num_blocks(&self, bdev: &str) -> u64 {
        let query = BdevGetBdevs {
            name: Some(bdev.into()),
            timeout: None,
        };
        self.client().call(&query).await.unwrap()[0].num_blocks
    }

    /// Waits until a bdev has `want` blocks (the plugin's follower grows it).
    pub async fn num_blocks_become(&self, bdev: &str, want: u64) {
        let what = format!("{bdev}'s blocks");
        eventually(&what, || async { equal(self.num_blocks(bdev).await, want) }).await;
    }

    /// The NVMe-oF controllers SPDK has attached.
    pub async fn nvme_controllers(&self) -> Vec<NvmeBdevController> {
        self.client()
            .call(&BdevNvmeGetControllers::default())
            .await
            .unwrap()
    }
}

/// Polls `check` every 20 ms until it answers `Ok`, for what something
/// outside the call being tested does (the plugin's follower); fails after
/// [`TIMEOUT`] with `what` and the last answer.
pub async fn eventually<T, F>(what: &str, mut check: impl FnMut() -> F) -> T
where
    F: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        match check().await {
            Ok(done) => return done,
            Err(now) => assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: {now} after {TIMEOUT:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// For [`eventually`]: done when `now` is `want`, else what it is.
pub fn equal<T: PartialEq + std::fmt::Debug>(now: T, want: T) -> Result<(), String> {
    if now == want {
        Ok(())
    } else {
        Err(format!("{now:?}, not {want:?}"))
    }
}

/// Grows the file at `path` to `size` bytes, keeping what it holds (as
/// ControllerExpandVolume grows an AIO volume's file).
pub fn grow(path: &Path, size: u64) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.set_len(size).unwrap();
}

/// The plugin served in-process; stops when dropped.
pub struct Plugin {
    pub socket: PathBuf,
    pub identity: IdentityServiceClient<Channel>,
    pub storage: StoragePluginServiceClient<Channel>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Plugin {
    /// The node's DPU attach layer in front of this plugin, whose empty
    /// provider maps to `snap`'s socket (a template without a placeholder
    /// names it outright); behind a DPU agent in a split-mode run.
    pub async fn attach_layer(&self, snap: &Spdk) -> dpu::TestDpu {
        let dir = snap.dir.path().join("dpu-link");
        dpu::TestDpu::start(&self.socket, &snap.socket().display().to_string(), &dir).await
    }

    /// The plugin in front of the SPDK at `spdk_socket`; it listens when this returns.
    pub async fn start(spdk_socket: &Path) -> Plugin {
        Plugin::start_with(spdk_socket, "").await
    }

    pub async fn start_with(spdk_socket: &Path, provider: &str) -> Plugin {
        Plugin::serve(spdk_socket, provider, Duration::ZERO, Devices::default()).await
    }

    /// A plugin making the kinds of device `devices` says.
    pub async fn start_making(spdk_socket: &Path, devices: Devices) -> Plugin {
        Plugin::serve(spdk_socket, "", Duration::ZERO, devices).await
    }

    /// A plugin that follows attached AIO volumes (their files' sizes and
    /// QoS records) every `period`; the others do not: a background call
    /// would upset round-trip counts.
    pub async fn start_following(spdk_socket: &Path, period: Duration) -> Plugin {
        Plugin::serve(spdk_socket, "", period, Devices::default()).await
    }

    /// A plugin with its background work on, as the binary runs (AIO
    /// volumes followed every `period`, multipath devices' paths kept),
    /// serving its `/metrics` page at `metrics`.
    pub async fn start_with_metrics(
        spdk_socket: &Path,
        period: Duration,
        metrics: std::net::SocketAddr,
    ) -> Plugin {
        Plugin::serve_all(spdk_socket, "", period, Devices::default(), Some(metrics)).await
    }

    async fn serve(
        spdk_socket: &Path,
        provider: &str,
        aio_follow_period: Duration,
        devices: Devices,
    ) -> Plugin {
        Plugin::serve_all(spdk_socket, provider, aio_follow_period, devices, None).await
    }

    async fn serve_all(
        spdk_socket: &Path,
        provider: &str,
        aio_follow_period: Duration,
        devices: Devices,
        metrics_address: Option<std::net::SocketAddr>,
    ) -> Plugin {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("plugins/spdk/dpu.sock");
        let config = Config {
            plugin_socket: socket.clone(),
            spdk_socket: spdk_socket.to_path_buf(),
            service: ServiceConfig {
                snap_provider: provider.into(),
                call_timeout: Duration::from_secs(30),
                aio_follow_period,
                devices,
            },
            csi: None,
            metrics_address,
        };
        let listening = snap_csi_spdk_plugin::bind(&config).unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            listening.serve(shutdown).await.unwrap();
        });
        let channel = unix_channel(socket.clone());
        Plugin {
            identity: IdentityServiceClient::new(channel.clone()),
            storage: StoragePluginServiceClient::new(channel),
            socket,
            stop: Some(stop),
            task: Some(task),
            _dir: dir,
        }
    }

    /// Stops serving, as SIGTERM would, and waits until the socket is gone.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Graceful shutdown waits for our own idle connection: drop it.
        let (socket, task) = (self.socket.clone(), self.task.take());
        drop(self);
        if let Some(task) = task {
            tokio::time::timeout(TIMEOUT, task).await.unwrap().unwrap();
        }
        assert!(!socket.exists(), "the plugin removes its socket");
    }

    pub async fn create(
        &self,
        volume_id: &str,
        context: HashMap<String, String>,
    ) -> Result<String, Status> {
        self.create_as(volume_id, "Block", context).await
    }

    /// CreateDevice with `volume_mode` `mode`.
    pub async fn create_as(
        &self,
        volume_id: &str,
        mode: &str,
        context: HashMap<String, String>,
    ) -> Result<String, Status> {
        let request = api::CreateDeviceRequest {
            volume_id: volume_id.into(),
            access_modes: vec![api::AccessMode::Rwo as i32],
            volume_mode: mode.into(),
            publish_context: HashMap::new(),
            volume_context: context,
            storage_parameters: HashMap::new(),
        };
        self.create_request(request, TIMEOUT).await
    }

    pub async fn create_request(
        &self,
        request: api::CreateDeviceRequest,
        timeout: Duration,
    ) -> Result<String, Status> {
        let response = self
            .storage
            .clone()
            .create_device(timed(request, timeout))
            .await?;
        Ok(response.into_inner().device_name)
    }

    pub async fn delete(&self, volume_id: &str, device_name: &str) -> Result<(), Status> {
        let request = api::DeleteDeviceRequest {
            volume_id: volume_id.into(),
            device_name: device_name.into(),
        };
        self.storage
            .clone()
            .delete_device(timed(request, TIMEOUT))
            .await?;
        Ok(())
    }

    pub async fn get(
        &self,
        volume_id: &str,
        device_name: &str,
    ) -> Result<api::GetDeviceResponse, Status> {
        let request = api::GetDeviceRequest {
            volume_id: volume_id.into(),
            device_name: device_name.into(),
        };
        let response = self
            .storage
            .clone()
            .get_device(timed(request, TIMEOUT))
            .await?;
        Ok(response.into_inner())
    }

    pub async fn list(
        &self,
        max_entries: i32,
        starting_token: &str,
    ) -> Result<api::ListDevicesResponse, Status> {
        let request = api::ListDevicesRequest {
            max_entries,
            starting_token: starting_token.into(),
        };
        let response = self
            .storage
            .clone()
            .list_devices(timed(request, TIMEOUT))
            .await?;
        Ok(response.into_inner())
    }

    /// Every (volume id, device name) listed, paging `page` at a time.
    pub async fn list_all(&self, page: i32) -> Vec<(String, String)> {
        every_page(String::new(), |token| async move {
            let response = self.list(page, &token).await.unwrap();
            assert!(page == 0 || response.entries.len() <= page as usize);
            let entries = response
                .entries
                .into_iter()
                .map(|e| (e.volume_id, e.device_name))
                .collect();
            (entries, response.next_token)
        })
        .await
    }

    /// The SNAP provider GetSNAPProvider names.
    pub async fn provider(&self) -> Result<String, Status> {
        let response = self
            .storage
            .clone()
            .get_snap_provider(timed(api::GetSnapProviderRequest {}, TIMEOUT))
            .await?;
        Ok(response.into_inner().provider_name)
    }

    pub async fn probe(&self, timeout: Duration) -> Result<Option<bool>, Status> {
        let response = self
            .identity
            .clone()
            .probe(timed(api::ProbeRequest {}, timeout))
            .await?;
        Ok(response.into_inner().ready)
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Every item of a paged list, from the page at `first` to the one with no
/// next token: `page(token)` answers one page's items and the next token.
pub async fn every_page<T, Fut>(first: String, mut page: impl FnMut(String) -> Fut) -> Vec<T>
where
    Fut: Future<Output = (Vec<T>, String)>,
{
    let mut all = vec![];
    let mut token = first;
    loop {
        let (items, next) = page(token).await;
        all.extend(items);
        if next.is_empty() {
            return all;
        }
        token = next;
    }
}

pub fn aio_context(path: &Path) -> HashMap<String, String> {
    HashMap::from([
        (BACKEND_KEY.to_string(), AIO.to_string()),
        (PATH_KEY.to_string(), path.display().to_string()),
    ])
}

pub fn fs_context(dir: &Path) -> HashMap<String, String> {
    HashMap::from([
        (BACKEND_KEY.to_string(), FS.to_string()),
        (PATH_KEY.to_string(), dir.display().to_string()),
    ])
}

pub fn nvmf_context(port: u16, subnqn: &str) -> HashMap<String, String> {
    HashMap::from([
        (BACKEND_KEY.to_string(), NVMF.to_string()),
        (TRTYPE_KEY.to_string(), "tcp".to_string()),
        (TRADDR_KEY.to_string(), "127.0.0.1".to_string()),
        (TRSVCID_KEY.to_string(), port.to_string()),
        (ADRFAM_KEY.to_string(), "ipv4".to_string()),
        (SUBNQN_KEY.to_string(), subnqn.to_string()),
    ])
}

/// The TCP transport (made once) and an empty subsystem `nqn` of one
/// namespace, open to any host.
pub async fn subsystem(t: &RpcClient, nqn: &str, serial: &str) {
    match t
        .call(&NvmfCreateTransport {
            trtype: "TCP".into(),
        })
        .await
    {
        Ok(_) => {}
        // Made for an earlier export: a second one answers -32603.
        Err(e) if e.code() == Some(snap_csi::jsonrpc::code::INTERNAL_ERROR) => {}
        Err(e) => panic!("{e}"),
    }
    t.call(&NvmfCreateSubsystem {
        nqn: nqn.into(),
        serial_number: Some(serial.into()),
        model_number: None,
        allow_any_host: Some(true),
        max_namespaces: Some(1),
    })
    .await
    .unwrap();
}

/// Exports an AIO bdev over a fresh file as subsystem `nqn` (namespace 1) on
/// `target`, listening on 127.0.0.1; returns the port.
pub async fn export(target: &Spdk, name: &str, nqn: &str) -> u16 {
    let t = target.client();
    let file = target.file(&format!("{name}.img"));
    t.call(&BdevAioCreate {
        name: name.into(),
        filename: file.display().to_string(),
        block_size: Some(512),
        readonly: None,
    })
    .await
    .unwrap();
    subsystem(&t, nqn, "SN1").await;
    let nsid = t
        .call(&NvmfSubsystemAddNs {
            nqn: nqn.into(),
            namespace: NvmfNamespaceParams {
                bdev_name: name.into(),
                nsid: None,
                uuid: None,
            },
        })
        .await
        .unwrap();
    assert_eq!(nsid, 1);
    listen(target, nqn).await
}

/// Makes subsystem `nqn` of `target` listen on a free TCP port of
/// 127.0.0.1; returns the port.
pub async fn listen(target: &Spdk, nqn: &str) -> u16 {
    let port = free_tcp_port();
    target
        .client()
        .call(&NvmfSubsystemAddListener {
            nqn: nqn.into(),
            listen_address: ListenAddress {
                trtype: "tcp".into(),
                adrfam: "ipv4".into(),
                traddr: "127.0.0.1".into(),
                trsvcid: port.to_string(),
            },
        })
        .await
        .unwrap();
    port
}
