//! The plugin's CSI controller in-process over real gRPC on a UNIX socket,
//! with an AIO pool in a temporary directory and an in-process emulator or a
//! real `spdk_tgt` playing the remote NVMe-oF target (pool bdev and lvstore
//! made here, as an operator would), plus the calls and checks the CSI
//! tests share.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use snap_csi::grpc::unix_channel;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::volumegroup as vg;
use snap_csi::spdk::bdev::{BdevAioCreate, BdevGetBdevs};
use snap_csi::spdk::lvol::{BdevLvolCreateLvstore, BdevLvolGetLvstores};
use snap_csi::spdk::nvmf::NvmfGetSubsystems;
use snap_csi_spdk_plugin::config::Config;
use snap_csi_spdk_plugin::csi::{AioConfig, CsiConfig, NvmfConfig};
use snap_csi_spdk_plugin::service::ServiceConfig;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::nvme_io::Remote;
use super::{Source, Spdk, TIMEOUT, every_page, free_tcp_port, sparse_file, timed};
use csi::controller_client::ControllerClient;
use csi::group_controller_client::GroupControllerClient;
use csi::identity_client::IdentityClient;
use csi::volume_capability::access_mode::Mode;
use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use vg::controller_client::ControllerClient as GroupClient;

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
/// The AIO pool's capacity and the target's pool bdev: room for the 1 GiB
/// default, sparse so it costs nothing.
pub const POOL: u64 = 2 * GIB;
pub const LVSTORE: &str = "lvs0";

/// The NVMe-oF target: an SPDK with a pool bdev and lvstore. With real
/// SPDK, a second `spdk_tgt` is the host that reads and writes volumes over
/// NVMe/TCP; the emulator's lvols are files, read directly.
pub struct Target {
    pub spdk: Spdk,
    pub initiator: Option<Spdk>,
    pub listen_port: u16,
}

impl Target {
    pub async fn start(source: &Source) -> Target {
        let target = source.target().await;
        let initiator = match source {
            Source::Emulator => None,
            Source::Real(_) => Some(source.snap().await),
        };
        let pool = target.dir.path().join("pool.img");
        sparse_file(&pool, POOL);
        let spdk = target.client();
        spdk.call(&BdevAioCreate {
            name: "pool0".into(),
            filename: pool.display().to_string(),
            block_size: Some(4096),
            readonly: None,
        })
        .await
        .unwrap();
        spdk.call(&BdevLvolCreateLvstore {
            bdev_name: "pool0".into(),
            lvs_name: LVSTORE.into(),
            cluster_sz: None,
        })
        .await
        .unwrap();
        Target {
            spdk: target,
            initiator,
            listen_port: free_tcp_port(),
        }
    }

    /// Reads or writes a volume's bytes through the initiator; `None`
    /// without one (the emulator's target).
    fn remote<'a>(&'a self, volume: &'a csi::Volume) -> Option<Remote<'a>> {
        let initiator = self.initiator.as_ref()?;
        let context = &volume.volume_context;
        Some(Remote {
            initiator: initiator.client(),
            traddr: &context["traddr"],
            trsvcid: &context["trsvcid"],
            subnqn: &context["subnqn"],
        })
    }

    /// The file holding lvol `<lvstore>/<name>`'s bytes.
    pub async fn lvol_file(&self, name: &str) -> PathBuf {
        let spdk = self.spdk.client();
        let lvs = spdk
            .call(&BdevLvolGetLvstores {
                uuid: None,
                lvs_name: Some(LVSTORE.into()),
            })
            .await
            .unwrap();
        let bdev = spdk
            .call(&BdevGetBdevs {
                name: Some(format!("{LVSTORE}/{name}")),
                timeout: None,
            })
            .await
            .unwrap();
        self.spdk
            .dir
            .path()
            .join("state/lvstores")
            .join(format!("lvs-{}", lvs[0].uuid))
            .join(format!("{}.img", bdev[0].name))
    }

    /// Stops the emulated target and starts it again on its directory, its
    /// pool made again by its start-up configuration (a real target's
    /// `--json`): it finds its lvstore on the pool, and nothing else.
    pub async fn restart(&mut self) {
        let pool = self.spdk.dir.path().join("pool.img");
        let saved = self.spdk.dir.path().join("target.json");
        let config = serde_json::json!({"subsystems": [{"subsystem": "bdev", "config": [
            {"method": "bdev_aio_create",
             "params": {"name": "pool0", "filename": pool, "block_size": 4096}}
        ]}]});
        std::fs::write(&saved, config.to_string()).unwrap();
        self.spdk
            .restart(|c| {
                let mut c = c.without_snap();
                c.json_config = Some(saved);
                c
            })
            .await;
    }

    /// Every lvol name in the lvstore and every subsystem NQN.
    pub async fn objects(&self) -> Vec<String> {
        let spdk = self.spdk.client();
        let prefix = format!("{LVSTORE}/");
        let mut out: Vec<String> = spdk
            .call(&BdevGetBdevs::default())
            .await
            .unwrap()
            .into_iter()
            .flat_map(|b| b.aliases)
            .filter(|a| a.starts_with(&prefix))
            .collect();
        out.extend(
            spdk.call(&NvmfGetSubsystems::default())
                .await
                .unwrap()
                .into_iter()
                .filter(|s| s.subtype != "Discovery")
                .map(|s| s.nqn),
        );
        out.sort();
        out
    }
}

/// Which backends a controller has.
#[derive(Debug, Clone, Copy)]
pub struct Backends {
    pub aio: bool,
    pub nvmf: bool,
    pub default: &'static str,
}

impl Backends {
    pub const BOTH: Backends = Backends {
        aio: true,
        nvmf: true,
        default: "aio",
    };
}

/// The controller served in-process; stops when dropped.
pub struct Csi {
    pub socket: PathBuf,
    pub identity: IdentityClient<Channel>,
    pub controller: ControllerClient<Channel>,
    pub groups: GroupClient<Channel>,
    pub group_snapshots: GroupControllerClient<Channel>,
    pub pool: PathBuf,
    pub state: PathBuf,
    pub target: Option<Target>,
    config: Config,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    pub dir: tempfile::TempDir,
}

fn serve(config: &Config) -> (oneshot::Sender<()>, JoinHandle<()>) {
    let listening = snap_csi_spdk_plugin::bind(config).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.await;
        };
        listening.serve(shutdown).await.unwrap();
    });
    (stop, task)
}

impl Csi {
    /// A controller whose NVMe-oF target (if it has that backend) is an emulator.
    pub async fn start(backends: Backends) -> Csi {
        Csi::start_with(backends, &Source::Emulator, |_| {}).await
    }

    /// A controller whose NVMe-oF target comes from `source`.
    pub async fn start_on(backends: Backends, source: &Source) -> Csi {
        Csi::start_with(backends, source, |_| {}).await
    }

    /// A controller on `source` with the settings `configure` makes over the
    /// tests' own.
    pub async fn start_with(
        backends: Backends,
        source: &Source,
        configure: impl FnOnce(&mut CsiConfig),
    ) -> Csi {
        let dir = tempfile::tempdir().unwrap();
        let target = if backends.nvmf {
            Some(Target::start(source).await)
        } else {
            None
        };
        let socket = dir.path().join("csi/csi.sock");
        let pool = dir.path().join("pool");
        let state = dir.path().join("state");
        let mut config = Config {
            plugin_socket: dir.path().join("plugin/dpu.sock"),
            // The plugin service is not called here.
            spdk_socket: dir.path().join("no-snap.sock"),
            service: ServiceConfig {
                snap_provider: String::new(),
                call_timeout: Duration::from_secs(30),
                aio_follow_period: Duration::ZERO,
                devices: Default::default(),
            },
            csi: Some(CsiConfig {
                socket: socket.clone(),
                state_dir: state.clone(),
                aio: backends.aio.then(|| AioConfig {
                    pool_dir: pool.clone(),
                    capacity: Some(POOL),
                    dpu: None,
                }),
                nvmf: target.as_ref().map(|t| NvmfConfig {
                    target_socket: t.spdk.socket().to_path_buf(),
                    lvstore: LVSTORE.into(),
                    listen: vec![format!("127.0.0.1:{}", t.listen_port).parse().unwrap()],
                }),
                fs: None,
                default_backend: snap_csi_spdk_plugin::csi::params::parse_backend(backends.default)
                    .unwrap(),
                call_timeout: Duration::from_secs(30),
                advertise_get_snapshot: false,
                dpu_plugins: vec![],
            }),
            metrics_address: None,
        };
        configure(config.csi.as_mut().expect("a CSI controller"));
        let (stop, task) = serve(&config);
        let channel = unix_channel(socket.clone());
        Csi {
            identity: IdentityClient::new(channel.clone()),
            controller: ControllerClient::new(channel.clone()),
            group_snapshots: GroupControllerClient::new(channel.clone()),
            groups: GroupClient::new(channel),
            socket,
            pool,
            state,
            target,
            config,
            stop: Some(stop),
            task: Some(task),
            dir,
        }
    }

    /// Stops the controller abruptly (calls in flight are dropped) and starts
    /// a new one over the same pool, state directory and target.
    pub async fn restart(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
        let (stop, task) = serve(&self.config);
        self.stop = Some(stop);
        self.task = Some(task);
        let channel = unix_channel(self.socket.clone());
        self.identity = IdentityClient::new(channel.clone());
        self.controller = ControllerClient::new(channel.clone());
        self.group_snapshots = GroupControllerClient::new(channel.clone());
        self.groups = GroupClient::new(channel);
    }

    /// Stops the controller abruptly and leaves it stopped (its target
    /// running): nothing restores the target's exports until
    /// [`Csi::restart`].
    pub async fn halt(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    pub fn target(&self) -> &Target {
        self.target.as_ref().expect("an NVMe-oF target")
    }

    pub async fn create(&self, request: csi::CreateVolumeRequest) -> Result<csi::Volume, Status> {
        let response = self
            .controller
            .clone()
            .create_volume(timed(request, TIMEOUT))
            .await?;
        Ok(response.into_inner().volume.expect("a volume"))
    }

    pub async fn delete(&self, volume_id: &str) -> Result<(), Status> {
        let request = csi::DeleteVolumeRequest {
            volume_id: volume_id.into(),
            secrets: HashMap::new(),
        };
        self.controller
            .clone()
            .delete_volume(timed(request, TIMEOUT))
            .await?;
        Ok(())
    }

    pub async fn list(
        &self,
        max_entries: i32,
        starting_token: &str,
    ) -> Result<csi::ListVolumesResponse, Status> {
        let request = csi::ListVolumesRequest {
            max_entries,
            starting_token: starting_token.into(),
        };
        Ok(self
            .controller
            .clone()
            .list_volumes(timed(request, TIMEOUT))
            .await?
            .into_inner())
    }

    /// Every volume id, paging `page` at a time.
    pub async fn list_all(&self, page: i32) -> Vec<String> {
        every_page(String::new(), |token| async move {
            let response = self.list(page, &token).await.unwrap();
            assert!(page == 0 || response.entries.len() <= page as usize);
            let ids = response
                .entries
                .into_iter()
                .map(|e| e.volume.unwrap().volume_id)
                .collect();
            (ids, response.next_token)
        })
        .await
    }

    pub async fn expand(
        &self,
        volume_id: &str,
        required: u64,
        capability: Option<csi::VolumeCapability>,
    ) -> Result<csi::ControllerExpandVolumeResponse, Status> {
        expand_through(&self.controller, volume_id, required, capability).await
    }

    pub async fn modify(&self, volume_id: &str, pairs: &[(&str, &str)]) -> Result<(), Status> {
        let request = csi::ControllerModifyVolumeRequest {
            volume_id: volume_id.into(),
            secrets: HashMap::new(),
            mutable_parameters: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        self.controller
            .clone()
            .controller_modify_volume(timed(request, TIMEOUT))
            .await?;
        Ok(())
    }

    /// The QoS limits a volume gets, as `assigned_rate_limits` orders them
    /// (0: unlimited): NVMe-oF, those the target enforces on its lvol; AIO,
    /// those the plugin's CreateDevice will set (context and record).
    pub async fn qos_limits(&self, volume: &csi::Volume) -> [u64; 4] {
        if let Some(target) = &self.target
            && volume.volume_context["backend"] == "nvmf"
        {
            let lvol = format!("{LVSTORE}/{}", volume.volume_id);
            return target.spdk.rate_limits(&lvol).await;
        }
        use snap_csi_spdk_plugin::qos;
        let given = qos::context_limits(&volume.volume_id, &volume.volume_context).unwrap();
        let limits =
            qos::with_record(given, &volume.volume_id, &volume.volume_context["path"]).unwrap();
        [
            limits.rw_ios_per_sec,
            limits.rw_mbytes_per_sec,
            limits.r_mbytes_per_sec,
            limits.w_mbytes_per_sec,
        ]
        .map(Option::unwrap_or_default)
    }

    pub async fn validate(
        &self,
        volume_id: &str,
        capabilities: Vec<csi::VolumeCapability>,
    ) -> Result<csi::ValidateVolumeCapabilitiesResponse, Status> {
        let request = csi::ValidateVolumeCapabilitiesRequest {
            volume_id: volume_id.into(),
            volume_capabilities: capabilities,
            ..Default::default()
        };
        Ok(self
            .controller
            .clone()
            .validate_volume_capabilities(timed(request, TIMEOUT))
            .await?
            .into_inner())
    }

    pub async fn capacity(&self, backend: &str) -> Result<csi::GetCapacityResponse, Status> {
        let request = csi::GetCapacityRequest {
            parameters: HashMap::from([("backend".to_string(), backend.to_string())]),
            ..Default::default()
        };
        Ok(self
            .controller
            .clone()
            .get_capacity(timed(request, TIMEOUT))
            .await?
            .into_inner())
    }

    pub async fn snapshot(&self, name: &str, source: &str) -> Result<csi::Snapshot, Status> {
        let request = csi::CreateSnapshotRequest {
            source_volume_id: source.into(),
            name: name.into(),
            ..Default::default()
        };
        Ok(self
            .controller
            .clone()
            .create_snapshot(timed(request, TIMEOUT))
            .await?
            .into_inner()
            .snapshot
            .expect("a snapshot"))
    }

    pub async fn delete_snapshot(&self, snapshot_id: &str) -> Result<(), Status> {
        let request = csi::DeleteSnapshotRequest {
            snapshot_id: snapshot_id.into(),
            secrets: HashMap::new(),
        };
        self.controller
            .clone()
            .delete_snapshot(timed(request, TIMEOUT))
            .await?;
        Ok(())
    }

    pub async fn list_snapshots(
        &self,
        request: csi::ListSnapshotsRequest,
    ) -> Result<csi::ListSnapshotsResponse, Status> {
        Ok(self
            .controller
            .clone()
            .list_snapshots(timed(request, TIMEOUT))
            .await?
            .into_inner())
    }

    /// Ids of the snapshots listed for `request`, following every page.
    pub async fn list_snapshots_all(&self, request: csi::ListSnapshotsRequest) -> Vec<String> {
        let first = request.starting_token.clone();
        every_page(first, |token| {
            let request = csi::ListSnapshotsRequest {
                starting_token: token,
                ..request.clone()
            };
            async move {
                let response = self.list_snapshots(request).await.unwrap();
                let ids = response
                    .entries
                    .into_iter()
                    .map(|e| e.snapshot.unwrap().snapshot_id)
                    .collect();
                (ids, response.next_token)
            }
        })
        .await
    }

    /// The file holding a volume's bytes: the AIO file itself, or the
    /// emulated target's file behind the lvol.
    pub async fn backing(&self, volume: &csi::Volume) -> PathBuf {
        match volume.volume_context.get("backend").map(String::as_str) {
            Some("aio") => PathBuf::from(&volume.volume_context["path"]),
            Some("nvmf") => self.target().lvol_file(&volume.volume_id).await,
            other => panic!("backend {other:?}"),
        }
    }

    /// An NVMe-oF volume as a real initiator reaches it over NVMe/TCP;
    /// `None` for an AIO volume or without a real initiator (the emulator's).
    pub fn remote<'a>(&'a self, volume: &'a csi::Volume) -> Option<Remote<'a>> {
        if volume.volume_context["backend"] != "nvmf" {
            return None;
        }
        self.target.as_ref()?.remote(volume)
    }

    /// Writes a volume's bytes as its user would: through NVMe/TCP when a
    /// real initiator is there, else to the file behind it.
    pub async fn write(&self, volume: &csi::Volume, offset: u64, bytes: &[u8]) {
        match self.remote(volume) {
            Some(remote) => remote.write(offset, bytes).await,
            None => write_at(&self.backing(volume).await, offset, bytes),
        }
    }

    /// Reads a volume's bytes, as [`Csi::write`] writes them.
    pub async fn read(&self, volume: &csi::Volume, offset: u64, len: usize) -> Vec<u8> {
        match self.remote(volume) {
            Some(remote) => remote.read(offset, len).await,
            None => read_at(&self.backing(volume).await, offset, len),
        }
    }

    /// A volume's size: its file's, or its lvol's on the target.
    pub async fn size(&self, volume: &csi::Volume) -> u64 {
        if volume.volume_context["backend"] == "aio" {
            return std::fs::metadata(&volume.volume_context["path"])
                .unwrap()
                .len();
        }
        let bdev = &self
            .target()
            .spdk
            .client()
            .call(&BdevGetBdevs {
                name: Some(format!("{LVSTORE}/{}", volume.volume_id)),
                timeout: None,
            })
            .await
            .unwrap()[0];
        bdev.size_bytes().unwrap()
    }

    /// What the backends hold: pool files (snapshots and records included)
    /// and the target's lvols and subsystems.
    pub async fn leftovers(&self) -> Vec<String> {
        let mut out = vec![];
        if self.pool.exists() {
            for entry in walk(&self.pool) {
                out.push(
                    entry
                        .strip_prefix(&self.pool)
                        .unwrap()
                        .display()
                        .to_string(),
                );
            }
        }
        for records in ["nvmf-snapshots", "nvmf-volumes"] {
            let records = self.state.join(records);
            if records.exists() {
                out.extend(walk(&records).into_iter().map(|p| p.display().to_string()));
            }
        }
        if let Some(target) = &self.target {
            out.extend(target.objects().await);
        }
        out
    }

    /// Stops serving and waits until the socket is gone.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = self.task.take();
        let socket = self.socket.clone();
        // Graceful shutdown waits for our idle connections: drop them first.
        drop(self);
        if let Some(task) = task {
            tokio::time::timeout(TIMEOUT, task).await.unwrap().unwrap();
        }
        assert!(!socket.exists(), "the controller removes its socket");
    }
}

impl Drop for Csi {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Files under `dir`, recursively (directories themselves are not listed).
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out.sort();
    out
}

pub fn mount() -> csi::VolumeCapability {
    capability(
        AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            ..Default::default()
        }),
        Mode::SingleNodeWriter,
    )
}

/// ControllerExpandVolume to `required` bytes through `controller` (the
/// sample controller's, or the proxy's in front of it).
pub async fn expand_through(
    controller: &ControllerClient<Channel>,
    volume_id: &str,
    required: u64,
    capability: Option<csi::VolumeCapability>,
) -> Result<csi::ControllerExpandVolumeResponse, Status> {
    let request = csi::ControllerExpandVolumeRequest {
        volume_id: volume_id.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: required as i64,
            limit_bytes: 0,
        }),
        secrets: HashMap::new(),
        volume_capability: capability,
    };
    Ok(controller
        .clone()
        .controller_expand_volume(timed(request, TIMEOUT))
        .await?
        .into_inner())
}

pub fn block() -> csi::VolumeCapability {
    capability(AccessType::Block(BlockVolume {}), Mode::SingleNodeWriter)
}

pub fn capability(access: AccessType, mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(access),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

/// A CreateVolume of `name` on `backend` (none when empty), `required`
/// to `limit` bytes (0: not given; both 0: no range).
pub fn volume(name: &str, backend: &str, required: u64, limit: u64) -> csi::CreateVolumeRequest {
    let mut parameters = HashMap::new();
    if !backend.is_empty() {
        parameters.insert("backend".to_string(), backend.to_string());
    }
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: (required > 0 || limit > 0).then_some(csi::CapacityRange {
            required_bytes: required as i64,
            limit_bytes: limit as i64,
        }),
        volume_capabilities: vec![mount()],
        parameters,
        ..Default::default()
    }
}

pub fn from_snapshot(
    mut request: csi::CreateVolumeRequest,
    snapshot_id: &str,
) -> csi::CreateVolumeRequest {
    request.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: snapshot_id.into(),
            },
        )),
    });
    request
}

pub fn from_volume(
    mut request: csi::CreateVolumeRequest,
    volume_id: &str,
) -> csi::CreateVolumeRequest {
    request.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: volume_id.into(),
            },
        )),
    });
    request
}

pub fn write_at(path: &Path, offset: u64, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(bytes).unwrap();
    f.sync_all().unwrap();
}

pub fn read_at(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut f = std::fs::File::open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    let mut buf = vec![0; len];
    f.read_exact(&mut buf).unwrap();
    buf
}

pub fn assert_code<T: std::fmt::Debug>(
    result: Result<T, Status>,
    code: Code,
    what: &str,
) -> Status {
    match result {
        Err(status) if status.code() == code => status,
        other => panic!("{what}: expected {code:?}, got {other:?}"),
    }
}
