//! Playing external-provisioner (CreateVolume, DeleteVolume through the
//! controller proxy) and kubelet (stage, publish, unpublish, unstage on the
//! node) over real gRPC, the way `hack/player` does. Every call carries
//! kubelet's deadline; errors keep the `tonic::Status` (downcast it) so that a
//! caller can tell a code worth retrying from a final one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use snap_csi::node::service::{EMULATION_KEY, PLACEMENT_KEY};
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::controller_client::ControllerClient;
use snap_csi::proto::csi::v1::identity_client::IdentityClient;
use snap_csi::proto::csi::v1::node_client::NodeClient;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use snap_csi::proto::csi::v1::volume_capability::{
    AccessMode, AccessType, BlockVolume, MountVolume,
};
use tonic::transport::{Channel, Endpoint};

/// kubelet's own deadline is 2 minutes for stage; ours is the same by
/// default, so a stuck call fails the caller instead of hanging it.
const DEADLINE: Duration = Duration::from_secs(120);

/// A StorageClass's parameters: the sample controller's `backend` (`aio`,
/// `nvmf`), and for the node, which the controller passes them on to in the
/// volume context, the `emulation` (`nvme`, `virtio-blk`) and the
/// `placement` (`dedicated`, `packed`; none: the node's default).
pub fn parameters(
    backend: &str,
    emulation: &str,
    placement: Option<&str>,
) -> HashMap<String, String> {
    let mut parameters = HashMap::from([
        ("backend".to_string(), backend.to_string()),
        (EMULATION_KEY.to_string(), emulation.to_string()),
    ]);
    if let Some(placement) = placement {
        parameters.insert(PLACEMENT_KEY.to_string(), placement.to_string());
    }
    parameters
}

pub async fn channel(endpoint: &str) -> anyhow::Result<Channel> {
    Endpoint::try_from(endpoint.to_string())
        .with_context(|| format!("endpoint {endpoint}"))?
        .connect()
        .await
        .with_context(|| format!("connecting to {endpoint}"))
}

fn request<T>(message: T, deadline: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(deadline);
    request
}

/// Raw block, or a filesystem type (`ext4`, `xfs`, `virtiofs`) for one
/// node, or a filesystem device many nodes write at once (virtio-fs,
/// MULTI_NODE_MULTI_WRITER: a ReadWriteMany claim).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Block,
    Filesystem(String),
    Shared,
}

impl Kind {
    fn capability(&self) -> csi::VolumeCapability {
        let access_type = match self {
            Kind::Block => AccessType::Block(BlockVolume {}),
            Kind::Filesystem(fs) => AccessType::Mount(MountVolume {
                fs_type: fs.clone(),
                mount_flags: vec!["noatime".into()],
                volume_mount_group: String::new(),
            }),
            Kind::Shared => AccessType::Mount(MountVolume {
                fs_type: "virtiofs".into(),
                mount_flags: vec![],
                volume_mount_group: String::new(),
            }),
        };
        let mode = match self {
            Kind::Shared => Mode::MultiNodeMultiWriter,
            _ => Mode::SingleNodeWriter,
        };
        csi::VolumeCapability {
            access_type: Some(access_type),
            access_mode: Some(AccessMode { mode: mode as i32 }),
        }
    }
}

/// A volume the provisioner made, with kubelet's paths for it.
#[derive(Debug, Clone)]
pub struct Volume {
    pub id: String,
    pub kind: Kind,
    pub context: HashMap<String, String>,
    pub staging: PathBuf,
    pub target: PathBuf,
    /// NodeStageVolume's secrets (kubelet reads them from the Secret the
    /// StorageClass names), e.g. an encrypted volume's key.
    pub stage_secrets: HashMap<String, String>,
}

/// The provisioner's and kubelet's connections (one each, like theirs;
/// clones share the HTTP/2 connection).
#[derive(Debug, Clone)]
pub struct Clients {
    pub controller: ControllerClient<Channel>,
    pub node: NodeClient<Channel>,
    /// Each call's deadline (kubelet's two minutes unless changed).
    pub deadline: Duration,
}

impl Clients {
    pub async fn connect(controller: &str, node: &str) -> anyhow::Result<Clients> {
        Ok(Clients {
            controller: ControllerClient::new(channel(controller).await?),
            node: NodeClient::new(channel(node).await?),
            deadline: DEADLINE,
        })
    }

    /// The same provisioner with another host's kubelet (its node at `node`).
    pub async fn with_node(&self, node: &str) -> anyhow::Result<Clients> {
        Ok(Clients {
            node: NodeClient::new(channel(node).await?),
            ..self.clone()
        })
    }

    /// CreateVolume (AIO, exposed as NVMe); makes kubelet's directories.
    pub async fn create(
        &mut self,
        kubelet: &Path,
        name: &str,
        kind: &Kind,
        size_mib: i64,
    ) -> anyhow::Result<Volume> {
        self.create_on(kubelet, name, kind, size_mib, "aio", "nvme")
            .await
    }

    /// CreateVolume on `backend` (`aio`, `nvmf`), exposed as `emulation`
    /// (`nvme`, `virtio-blk`); makes kubelet's directories.
    pub async fn create_on(
        &mut self,
        kubelet: &Path,
        name: &str,
        kind: &Kind,
        size_mib: i64,
        backend: &str,
        emulation: &str,
    ) -> anyhow::Result<Volume> {
        self.create_with(
            kubelet,
            name,
            kind,
            size_mib,
            parameters(backend, emulation, None),
        )
        .await
    }

    /// CreateVolume with these StorageClass parameters ([`parameters`]);
    /// makes kubelet's directories.
    pub async fn create_with(
        &mut self,
        kubelet: &Path,
        name: &str,
        kind: &Kind,
        size_mib: i64,
        parameters: HashMap<String, String>,
    ) -> anyhow::Result<Volume> {
        let response = self
            .controller
            .create_volume(request(
                csi::CreateVolumeRequest {
                    name: name.to_string(),
                    capacity_range: Some(csi::CapacityRange {
                        required_bytes: size_mib << 20,
                        limit_bytes: 0,
                    }),
                    volume_capabilities: vec![kind.capability()],
                    parameters,
                    ..Default::default()
                },
                self.deadline,
            ))
            .await
            .with_context(|| format!("CreateVolume {name}"))?
            .into_inner()
            .volume
            .context("CreateVolume answered no volume")?;
        let (staging, target) = kubelet_paths(kubelet, name)?;
        Ok(Volume {
            id: response.volume_id,
            kind: kind.clone(),
            context: response.volume_context,
            staging,
            target,
            stage_secrets: HashMap::new(),
        })
    }

    pub async fn stage(&mut self, volume: &Volume) -> anyhow::Result<()> {
        self.node
            .node_stage_volume(request(
                csi::NodeStageVolumeRequest {
                    volume_id: volume.id.clone(),
                    staging_target_path: volume.staging.display().to_string(),
                    volume_capability: Some(volume.kind.capability()),
                    volume_context: volume.context.clone(),
                    secrets: volume.stage_secrets.clone(),
                    ..Default::default()
                },
                self.deadline,
            ))
            .await
            .with_context(|| format!("NodeStageVolume {}", volume.id))?;
        Ok(())
    }

    pub async fn publish(&mut self, volume: &Volume) -> anyhow::Result<()> {
        self.node
            .node_publish_volume(request(
                csi::NodePublishVolumeRequest {
                    volume_id: volume.id.clone(),
                    staging_target_path: volume.staging.display().to_string(),
                    target_path: volume.target.display().to_string(),
                    volume_capability: Some(volume.kind.capability()),
                    volume_context: volume.context.clone(),
                    ..Default::default()
                },
                self.deadline,
            ))
            .await
            .with_context(|| format!("NodePublishVolume {}", volume.id))?;
        Ok(())
    }

    pub async fn unpublish(&mut self, volume: &Volume) -> anyhow::Result<()> {
        self.node
            .node_unpublish_volume(request(
                csi::NodeUnpublishVolumeRequest {
                    volume_id: volume.id.clone(),
                    target_path: volume.target.display().to_string(),
                },
                self.deadline,
            ))
            .await
            .with_context(|| format!("NodeUnpublishVolume {}", volume.id))?;
        Ok(())
    }

    pub async fn unstage(&mut self, volume: &Volume) -> anyhow::Result<()> {
        self.node
            .node_unstage_volume(request(
                csi::NodeUnstageVolumeRequest {
                    volume_id: volume.id.clone(),
                    staging_target_path: volume.staging.display().to_string(),
                },
                self.deadline,
            ))
            .await
            .with_context(|| format!("NodeUnstageVolume {}", volume.id))?;
        Ok(())
    }

    /// NodeGetVolumeStats of the published volume, as kubelet's metrics
    /// and volume health monitoring read it.
    pub async fn stats(
        &mut self,
        volume: &Volume,
    ) -> anyhow::Result<csi::NodeGetVolumeStatsResponse> {
        Ok(self
            .node
            .node_get_volume_stats(request(
                csi::NodeGetVolumeStatsRequest {
                    volume_id: volume.id.clone(),
                    volume_path: volume.target.display().to_string(),
                    staging_target_path: volume.staging.display().to_string(),
                },
                self.deadline,
            ))
            .await
            .with_context(|| format!("NodeGetVolumeStats {}", volume.id))?
            .into_inner())
    }

    /// The published volume's condition (NodeGetVolumeStats).
    pub async fn condition(&mut self, volume: &Volume) -> anyhow::Result<csi::VolumeCondition> {
        self.stats(volume)
            .await?
            .volume_condition
            .context("NodeGetVolumeStats answered no condition")
    }

    /// ControllerModifyVolume, as the resizer sends it when a PVC's
    /// VolumeAttributesClass changes.
    pub async fn modify(
        &mut self,
        volume: &Volume,
        mutable_parameters: HashMap<String, String>,
    ) -> anyhow::Result<()> {
        self.controller
            .controller_modify_volume(request(
                csi::ControllerModifyVolumeRequest {
                    volume_id: volume.id.clone(),
                    mutable_parameters,
                    ..Default::default()
                },
                self.deadline,
            ))
            .await
            .with_context(|| format!("ControllerModifyVolume {}", volume.id))?;
        Ok(())
    }

    /// DeleteVolume, then kubelet's directories go.
    pub async fn delete(&mut self, volume: &Volume) -> anyhow::Result<()> {
        self.controller
            .delete_volume(request(
                csi::DeleteVolumeRequest {
                    volume_id: volume.id.clone(),
                    secrets: Default::default(),
                },
                self.deadline,
            ))
            .await
            .with_context(|| format!("DeleteVolume {}", volume.id))?;
        // remove_dir, never remove_dir_all: should something still be
        // mounted there, it must not be emptied.
        for dir in [
            Some(volume.staging.as_path()),
            volume.staging.parent(),
            volume.target.parent(),
        ]
        .into_iter()
        .flatten()
        {
            let _ = std::fs::remove_dir(dir);
        }
        Ok(())
    }
}

/// The directories below `kubelet` that hold one directory per volume (its
/// staging directory's, its target's), as kubelet lays them out for a pod.
/// kubelet's staging and target paths for the volume named `name`: kubelet
/// creates the staging directory and the target's parent; the driver
/// creates the target itself.
fn kubelet_paths(kubelet: &Path, name: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
    let [staging_parent, target_parent] = volume_parents(kubelet);
    let staging = staging_parent.join(name).join("globalmount");
    let target = target_parent.join(name).join("mount");
    std::fs::create_dir_all(&staging)?;
    std::fs::create_dir_all(target.parent().context("target has a parent")?)?;
    Ok((staging, target))
}

impl Volume {
    /// Kubelet's directories of the volume in a guest host (its
    /// `snap-csi-guest` command socket, local-up's GUEST_EXEC), where the
    /// node mounts: the guest's kubelet directory is its own, at the same
    /// path as this machine's (`hack/lib/local-up-vm.sh`).
    pub fn make_dirs_in_guest(&self, socket: &Path) -> anyhow::Result<()> {
        let parent = self.target.parent().context("target has a parent")?;
        let script = format!("mkdir -p {} {}", self.staging.display(), parent.display());
        crate::guest::exec(socket, &script)?.stdout_of(&script)?;
        Ok(())
    }

    /// The staging path kubelet checks for other mounts before it unstages
    /// (a filesystem volume's; a block volume has none).
    pub fn device_mount_path(&self) -> Option<&Path> {
        (self.kind != Kind::Block).then_some(self.staging.as_path())
    }

    /// The same volume as another host's kubelet (directory `kubelet`) lays
    /// it out, for a volume many nodes use.
    pub fn on_host(&self, kubelet: &Path, name: &str) -> anyhow::Result<Volume> {
        let (staging, target) = kubelet_paths(kubelet, name)?;
        Ok(Volume {
            staging,
            target,
            ..self.clone()
        })
    }
}

pub fn volume_parents(kubelet: &Path) -> [PathBuf; 2] {
    [
        kubelet.join("plugins/kubernetes.io/csi/csi.snap-csi.io/harness"),
        kubelet.join("pods/harness/volumes"),
    ]
}

/// Probe: whether the plugin says it is ready.
pub async fn probe(identity: &mut IdentityClient<Channel>) -> anyhow::Result<bool> {
    probe_within(identity, DEADLINE).await
}

/// Probe with the deadline `within`, as the liveness probe sidecar asks it
/// (its `--probe-timeout`).
pub async fn probe_within(
    identity: &mut IdentityClient<Channel>,
    within: Duration,
) -> anyhow::Result<bool> {
    let answer = identity
        .probe(request(csi::ProbeRequest {}, within))
        .await?
        .into_inner();
    Ok(answer.ready.unwrap_or(false))
}
