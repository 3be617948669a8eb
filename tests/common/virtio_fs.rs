//! A host with a filesystem device as the virtio-fs tests drive it: a node
//! stack and the paths kubelet gives one volume there, the StorageClass's
//! virtio-fs context, and kubelet's teardown (which checks, as kubelet does,
//! that nothing else holds the staging path's filesystem before it
//! unstages).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use snap_csi::node::config::EmulationSetting;
use snap_csi::node::service::EMULATION_KEY;
use snap_csi::proto::csi::v1 as csi;

use snap_csi::spdk::snap::{VirtioFsDocaGetFunctions, VirtioFsGetDevices};

use super::kubelet_fs;
use super::node::{self, NodeStack, Tweaks, mounts_under, unpublish, unstage};

/// The volume's context as the StorageClass gives it: virtio-fs over `share`.
pub fn context(share: &Path) -> HashMap<String, String> {
    [
        (EMULATION_KEY.to_string(), "virtio-fs".to_string()),
        ("path".to_string(), share.display().to_string()),
    ]
    .into()
}

/// The common stage request, with the StorageClass's virtio-fs context and
/// no secrets.
pub fn stage_request(
    volume_id: &str,
    staging: &Path,
    capability: csi::VolumeCapability,
    share: &Path,
) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        secrets: HashMap::new(),
        volume_context: context(share),
        ..node::stage_request(volume_id, staging, capability, share)
    }
}

/// The common publish request, with the StorageClass's virtio-fs context.
pub fn publish_request(
    volume_id: &str,
    (staging, target): (&Path, &Path),
    capability: csi::VolumeCapability,
    share: &Path,
    readonly: bool,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_context: context(share),
        ..node::publish_request(volume_id, staging, target, capability, readonly)
    }
}

/// One host: a node stack and the paths kubelet gives one volume there.
pub struct Host {
    pub stack: NodeStack,
    pub staging: PathBuf,
    pub target: PathBuf,
}

impl Host {
    pub async fn start() -> Host {
        Host::start_with(Tweaks::default()).await
    }

    pub async fn start_with(tweaks: Tweaks) -> Host {
        let stack = NodeStack::start_with(EmulationSetting::Nvme, tweaks).await;
        let staging = stack.path("plugins/staging/pvc-fs");
        let target = stack.path("pods/a/volumes/pvc-fs");
        Host {
            stack,
            staging,
            target,
        }
    }

    pub async fn stage(
        &self,
        capability: csi::VolumeCapability,
        share: &Path,
    ) -> Result<(), tonic::Status> {
        let request = stage_request("pvc-fs", &self.staging, capability, share);
        self.stack
            .client
            .clone()
            .node_stage_volume(request)
            .await
            .map(drop)
    }

    pub async fn publish(
        &self,
        capability: csi::VolumeCapability,
        share: &Path,
        readonly: bool,
    ) -> Result<(), tonic::Status> {
        let paths = (self.staging.as_path(), self.target.as_path());
        let request = publish_request("pvc-fs", paths, capability, share, readonly);
        self.stack
            .client
            .clone()
            .node_publish_volume(request)
            .await
            .map(drop)
    }

    pub async fn stage_and_publish(&self, capability: csi::VolumeCapability, share: &Path) {
        self.stage(capability.clone(), share).await.unwrap();
        self.publish(capability, share, false).await.unwrap();
    }

    /// kubelet's teardown: unpublish, then (only if no other mount refers
    /// to the staging path's filesystem, kubelet's GetDeviceMountRefs check)
    /// unstage.
    pub async fn take_down(&self) {
        let mut node = self.stack.client.clone();
        unpublish(&mut node, "pvc-fs", &self.target).await;
        let refs = kubelet_fs::device_mount_refs(&self.staging).unwrap();
        assert!(
            refs.is_empty(),
            "kubelet would never unstage: {} is still mounted by other references {refs:?}",
            self.staging.display()
        );
        unstage(&mut node, "pvc-fs", &self.staging).await;
    }

    /// SNAP's virtio-fs devices and functions, the plugin's fsdevs' owner's
    /// census: how many of each this host's DPU holds.
    pub async fn snap_objects(&self) -> (usize, usize) {
        let snap = self.stack.emulator.client();
        let devices = snap.call(&VirtioFsGetDevices {}).await.unwrap();
        let functions = snap.call(&VirtioFsDocaGetFunctions {}).await.unwrap();
        let functions = functions.iter().map(|m| m.functions.len()).sum();
        (devices.len(), functions)
    }

    /// Nothing of the volume is left on this host or its DPU.
    pub async fn assert_nothing_left(&self) {
        assert_eq!(
            self.snap_objects().await,
            (0, 0),
            "a virtio-fs device or function is left"
        );
        assert!(
            mounts_under(&self.stack.kubelet).is_empty(),
            "a mount is left"
        );
        assert_eq!(self.stack.records(), 0, "a volume record is left");
        let calls = self.stack.plugin.as_ref().unwrap().calls();
        let created = calls
            .iter()
            .filter(|c| c.starts_with("CreateDevice"))
            .count();
        let deleted = calls
            .iter()
            .filter(|c| c.starts_with("DeleteDevice"))
            .count();
        assert!(
            deleted >= usize::from(created > 0),
            "DeleteDevice never came: {calls:?}"
        );
    }
}

pub fn fs_type_at(path: &Path) -> String {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let point = path.display().to_string();
    let line = table
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some(point.as_str()))
        .unwrap_or_else(|| panic!("nothing mounted at {point}"));
    let after = line.split(" - ").nth(1).unwrap();
    after.split(' ').next().unwrap().to_string()
}

/// Writes `data` to `name` under `dir` as a pod would before another reads
/// it: written, fsynced, closed.
pub fn write_file(dir: &Path, name: &str, data: &[u8]) {
    let mut file = std::fs::File::create(dir.join(name)).unwrap();
    file.write_all(data).unwrap();
    file.sync_all().unwrap();
}
