//! The sample plugin's CSI controller: Identity, Controller and the
//! VolumeGroup API's Controller, for the same two backends the plugin
//! service attaches (served on `--csi-socket`, behind `snap-csi controller`).
//!
//! - AIO ([`aio`]): volumes are sparse files in a pool directory.
//! - NVMe-oF ([`nvmf`]): volumes are thin lvols on a remote SPDK target's
//!   lvstore, each exported through its own subsystem.
//! - Filesystem ([`fs`]): volumes are ext4 images in a share, each
//!   loop-mounted on its directory there ([`fs_image`]), served as
//!   filesystem devices (virtio-fs).
//!
//! Volumes keep no state of ours: their ids are derived from their names
//! ([`ids`]) and their objects are found in the backends under those ids, so
//! a restarted controller loses nothing and a retried CreateVolume finds (or
//! finishes) its earlier work. What no backend can hold lives in small JSON
//! records ([`store::SnapshotRecord`], volume groups, and what an NVMe-oF
//! target forgets when it restarts: [`nvmf_export::VolumeRecord`]). The volume context of
//! every volume is exactly what the plugin's CreateDevice reads
//! ([`crate::backend`]).
//!
//! Layout: [`controller`] (the CSI Controller RPCs), [`modify`]
//! (ControllerModifyVolume: QoS limits), [`identity`],
//! [`volume_group`], [`group_snapshot`] (GroupController), [`store`] (what a backend offers: [`aio`], [`nvmf`]),
//! [`params`] (parameters and capabilities), [`sizes`] (capacity ranges),
//! [`nvmf_export`] (an NVMe-oF volume's subsystem, limits and record),
//! [`reexport`] (what a restarted target lost, exported again), [`in_use`]
//! (DeleteVolume refused while a DPU serves the volume).
//! Failures become CSI codes in the crate's one map, [`crate::errors`]; the
//! refusals of a volume in use, which are answers about the DPUs rather than
//! failures, beside their check in [`in_use`].

pub mod aio;
pub mod controller;
pub mod fs;
pub mod fs_image;
pub mod group_snapshot;
pub mod identity;
pub mod ids;
pub mod in_use;
pub mod modify;
pub mod nvmf;
pub mod nvmf_export;
pub mod params;
pub mod reexport;
pub mod sizes;
pub mod store;
pub mod volume_group;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use snap_csi::deadline::call_deadline;
use snap_csi::guard::{Held, VolumeGuard};
use snap_csi::json_dir::JsonDir;
use snap_csi::jsonrpc::RpcClient;
use tokio::time::Instant;
use tonic::{Request, Status};

use crate::backend::Kind;
pub use aio::HostDpu;
pub use in_use::DpuPlugin;
use store::VolumeBackend;

/// The controller's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsiConfig {
    /// Where CSI is served.
    pub socket: PathBuf,
    /// Volume group and group snapshot records, the NVMe-oF backend's
    /// snapshot records and pause intents.
    pub state_dir: PathBuf,
    pub aio: Option<AioConfig>,
    pub nvmf: Option<NvmfConfig>,
    pub fs: Option<FsConfig>,
    /// The backend of a volume whose parameters and source name none.
    pub default_backend: Kind,
    /// Cap on a call, and the time of one without a deadline.
    pub call_timeout: Duration,
    /// Whether ControllerGetCapabilities lists GET_SNAPSHOT (see
    /// [`controller::capabilities`]).
    pub advertise_get_snapshot: bool,
    /// The DPUs' vendor plugins DeleteVolume asks whether a volume is in
    /// use ([`in_use`]); none: it does not ask.
    pub dpu_plugins: Vec<DpuPlugin>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AioConfig {
    /// Absolute: it goes into volume contexts as SNAP's path to the files.
    pub pool_dir: PathBuf,
    /// Bytes the pool may hold; `None`: the filesystem's free space.
    pub capacity: Option<u64>,
    /// The one DPU whose storage holds the pool; `None`: every DPU reaches it.
    pub dpu: Option<HostDpu>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmfConfig {
    /// The target's SPDK JSON-RPC socket.
    pub target_socket: PathBuf,
    /// An lvstore that exists on the target.
    pub lvstore: String,
    /// The target's TCP listeners, as initiators reach them: every volume's
    /// subsystem listens on each; the first is a volume's first path.
    pub listen: Vec<SocketAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsConfig {
    /// Absolute: it goes into volume contexts as SNAP's path to the trees.
    pub share: PathBuf,
    /// Bytes of volumes and snapshots the share may hold; `None`: the
    /// filesystem's size.
    pub capacity: Option<u64>,
}

/// The three services' shared state; cheap to clone into each server.
#[derive(Debug, Clone)]
pub struct CsiController {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    backends: HashMap<Kind, Box<dyn VolumeBackend>>,
    default_backend: Kind,
    call_timeout: Duration,
    advertise_get_snapshot: bool,
    dpus: in_use::DpuPlugins,
    /// One operation per volume, snapshot or group name at a time.
    busy: VolumeGuard,
    groups: JsonDir,
    /// Group membership changes one at a time: a volume joins one group only.
    group_changes: tokio::sync::Mutex<()>,
    group_snapshots: JsonDir,
    /// Group snapshot operations one at a time (see [`group_snapshot`]).
    group_snapshot_turn: tokio::sync::Mutex<()>,
}

impl CsiController {
    /// Opens the pool and state directories; no backend and no DPU is
    /// contacted. Must be called inside a Tokio runtime (the DPUs' clients).
    pub fn new(config: &CsiConfig) -> std::io::Result<CsiController> {
        let mut backends: HashMap<Kind, Box<dyn VolumeBackend>> = HashMap::new();
        if let Some(aio) = &config.aio {
            backends.insert(
                Kind::Aio,
                Box::new(aio::AioPool::open(
                    &aio.pool_dir,
                    aio.capacity,
                    aio.dpu.clone(),
                )?),
            );
        }
        if let Some(nvmf) = &config.nvmf {
            let rpc = RpcClient::with_timeout(&nvmf.target_socket, config.call_timeout);
            let records = JsonDir::open(config.state_dir.join("nvmf-snapshots"))?;
            let intents = JsonDir::open(config.state_dir.join("nvmf-paused"))?;
            let volumes = JsonDir::open(config.state_dir.join("nvmf-volumes"))?;
            backends.insert(
                Kind::Nvmf,
                Box::new(nvmf::NvmfTarget::new(
                    rpc,
                    nvmf.lvstore.clone(),
                    nvmf.listen.clone(),
                    records,
                    intents,
                    volumes,
                )),
            );
        }
        if let Some(fs) = &config.fs {
            backends.insert(
                Kind::Fs,
                Box::new(fs::FsShare::open(&fs.share, fs.capacity)?),
            );
        }
        Ok(CsiController {
            inner: Arc::new(Inner {
                backends,
                default_backend: config.default_backend,
                call_timeout: config.call_timeout,
                advertise_get_snapshot: config.advertise_get_snapshot,
                dpus: in_use::DpuPlugins::new(&config.dpu_plugins),
                busy: VolumeGuard::default(),
                groups: JsonDir::open(config.state_dir.join("volume-groups"))?,
                group_changes: tokio::sync::Mutex::new(()),
                group_snapshots: JsonDir::open(config.state_dir.join("group-snapshots"))?,
                group_snapshot_turn: tokio::sync::Mutex::new(()),
            }),
        })
    }

    fn deadline<T>(&self, request: &Request<T>) -> Instant {
        call_deadline(request, self.inner.call_timeout)
    }

    fn backend(&self, kind: Kind) -> Option<&dyn VolumeBackend> {
        self.inner.backends.get(&kind).map(|b| b.as_ref())
    }

    /// The backend of an existing object, which must be configured.
    fn backend_of(&self, kind: Kind, what: &str) -> Result<&dyn VolumeBackend, Status> {
        self.backend(kind).ok_or_else(|| {
            Status::failed_precondition(format!(
                "{what} is on the {} backend, which this controller is not configured for",
                kind.as_str()
            ))
        })
    }

    /// Configured backends in a fixed order.
    fn backends(&self) -> impl Iterator<Item = &dyn VolumeBackend> {
        Kind::ALL.into_iter().filter_map(|k| self.backend(k))
    }

    /// Claims `key` for this call; a second call on it gets ABORTED.
    fn hold(&self, key: String) -> Result<Held, Status> {
        self.inner.busy.try_hold(&key).map_err(|_| {
            Status::aborted(format!(
                "an operation on {key} is already in progress; retry later"
            ))
        })
    }
}

/// `max_entries` of a list request, which must not be negative.
fn max_entries(value: i32) -> Result<usize, Status> {
    usize::try_from(value).map_err(|_| {
        Status::invalid_argument(format!("max_entries is {value}; it must not be negative"))
    })
}
