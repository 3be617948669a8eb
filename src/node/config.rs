//! Node service settings, layered: built-in defaults, then a config file,
//! then environment variables and flags (clap), each overriding the last.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::dpu::Emulation;
use crate::settings::{defaults_or_file, flags_over, seconds, seconds_flag};

/// Everything the node service can be told.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// The CSI socket kubelet talks to.
    pub endpoint: PathBuf,
    /// Reported by GetPluginInfo; must match the CSIDriver object.
    pub driver_name: String,
    /// This node's id as kubelet knows it (default: the host name).
    pub node_id: String,
    /// Staging and target paths must lie under this directory.
    pub kubelet_dir: PathBuf,
    /// Where per-volume records live.
    pub state_dir: PathBuf,
    /// sysfs root to find host devices in (`/sys`; the emulator's tree in tests).
    pub sysfs_root: PathBuf,
    /// The vendor plugin's socket on the DPU side.
    pub plugin_socket: PathBuf,
    /// SNAP socket path for a provider name; `{provider}` is replaced.
    pub snap_socket_template: String,
    /// How volumes are exposed unless the volume context says otherwise.
    pub emulation: EmulationSetting,
    /// The DPU's name, reported as this node's topology segment.
    pub dpu_name: String,
    /// How long a stage waits for the host device to appear.
    #[serde(with = "seconds")]
    pub device_wait: Duration,
    /// Upper bound on one CSI call when kubelet gives no deadline.
    #[serde(with = "seconds")]
    pub call_timeout: Duration,
    /// Where to serve Prometheus metrics (`/metrics`); none when unset.
    pub metrics_address: Option<std::net::SocketAddr>,
}

/// `nvme` or `virtio-blk` in files, flags and volume contexts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EmulationSetting {
    Nvme,
    VirtioBlk,
}

impl EmulationSetting {
    pub fn parse(value: &str) -> Option<EmulationSetting> {
        match value {
            "nvme" => Some(EmulationSetting::Nvme),
            "virtio-blk" => Some(EmulationSetting::VirtioBlk),
            _ => None,
        }
    }
}

impl From<EmulationSetting> for Emulation {
    fn from(value: EmulationSetting) -> Self {
        match value {
            EmulationSetting::Nvme => Emulation::Nvme,
            EmulationSetting::VirtioBlk => Emulation::VirtioBlk,
        }
    }
}

/// The NVIDIA DPF convention for a SNAP provider's socket.
pub const DEFAULT_SNAP_SOCKET_TEMPLATE: &str =
    "/var/lib/nvidia/storage/snap/providers/{provider}/snap.sock";

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            endpoint: "/csi/csi.sock".into(),
            driver_name: crate::DRIVER_NAME.into(),
            node_id: hostname(),
            kubelet_dir: "/var/lib/kubelet".into(),
            state_dir: "/var/lib/snap-csi".into(),
            sysfs_root: "/sys".into(),
            plugin_socket: "/var/lib/nvidia/storage/snap/plugins/spdk/dpu.sock".into(),
            snap_socket_template: DEFAULT_SNAP_SOCKET_TEMPLATE.into(),
            emulation: EmulationSetting::Nvme,
            dpu_name: hostname(),
            device_wait: Duration::from_secs(30),
            call_timeout: Duration::from_secs(120),
            metrics_address: None,
        }
    }
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
}

/// Flags (and their environment variables) for `snap-csi node`; each one
/// given overrides the config file.
#[derive(Debug, Default, clap::Args)]
pub struct NodeArgs {
    /// A TOML file with any of the settings below (snake_case keys).
    #[arg(long, env = "SNAP_CSI_CONFIG")]
    pub config: Option<PathBuf>,
    /// CSI socket path.
    #[arg(long, env = "SNAP_CSI_ENDPOINT")]
    pub endpoint: Option<PathBuf>,
    /// CSI driver name.
    #[arg(long, env = "SNAP_CSI_DRIVER_NAME")]
    pub driver_name: Option<String>,
    /// This node's id.
    #[arg(long, env = "SNAP_CSI_NODE_ID")]
    pub node_id: Option<String>,
    /// Root that staging and target paths must be under.
    #[arg(long, env = "SNAP_CSI_KUBELET_DIR")]
    pub kubelet_dir: Option<PathBuf>,
    /// Directory for per-volume records.
    #[arg(long, env = "SNAP_CSI_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// sysfs root for host device lookup.
    #[arg(long, env = "SNAP_CSI_SYSFS_ROOT")]
    pub sysfs_root: Option<PathBuf>,
    /// Vendor plugin socket.
    #[arg(long, env = "SNAP_CSI_PLUGIN_SOCKET")]
    pub plugin_socket: Option<PathBuf>,
    /// SNAP socket template (`{provider}` is replaced by the plugin's provider).
    #[arg(long, env = "SNAP_CSI_SNAP_SOCKET_TEMPLATE")]
    pub snap_socket_template: Option<String>,
    /// Default emulation: nvme or virtio-blk.
    #[arg(long, env = "SNAP_CSI_EMULATION", value_parser = ["nvme", "virtio-blk"])]
    pub emulation: Option<String>,
    /// The DPU's name for the topology segment.
    #[arg(long, env = "SNAP_CSI_DPU_NAME")]
    pub dpu_name: Option<String>,
    /// Seconds a stage waits for the host device.
    #[arg(long, env = "SNAP_CSI_DEVICE_WAIT")]
    pub device_wait: Option<f64>,
    /// Seconds one call may take when kubelet sets no deadline.
    #[arg(long, env = "SNAP_CSI_CALL_TIMEOUT")]
    pub call_timeout: Option<f64>,
    /// Serve Prometheus metrics on this address (e.g. 0.0.0.0:9810).
    #[arg(long, env = "SNAP_CSI_METRICS_ADDRESS")]
    pub metrics_address: Option<std::net::SocketAddr>,
}

impl NodeArgs {
    /// Defaults, then the config file, then what was given here.
    pub fn resolve(&self) -> Result<NodeConfig, config::ConfigError> {
        let mut resolved: NodeConfig = defaults_or_file(self.config.as_deref())?;
        flags_over!(
            self => resolved,
            [
                endpoint,
                driver_name,
                node_id,
                kubelet_dir,
                state_dir,
                sysfs_root,
                plugin_socket,
                snap_socket_template,
                dpu_name,
            ],
            optional [metrics_address]
        );
        if let Some(value) = &self.emulation {
            resolved.emulation = EmulationSetting::parse(value).ok_or_else(|| {
                config::ConfigError::Message(format!("unknown emulation {value}"))
            })?;
        }
        seconds_flag(&mut resolved.device_wait, "device-wait", self.device_wait)?;
        seconds_flag(
            &mut resolved.call_timeout,
            "call-timeout",
            self.call_timeout,
        )?;
        Ok(resolved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::test_file;

    #[test]
    fn flags_override_the_file_which_overrides_defaults() {
        let (_dir, file) = test_file(
            "node.toml",
            "driver_name = \"from.file\"\nnode_id = \"file-node\"\nemulation = \"virtio-blk\"\ndevice_wait = 2.5\n",
        );
        let args = NodeArgs {
            config: Some(file),
            node_id: Some("flag-node".into()),
            ..Default::default()
        };
        let config = args.resolve().unwrap();
        assert_eq!(config.driver_name, "from.file");
        assert_eq!(config.node_id, "flag-node");
        assert_eq!(config.emulation, EmulationSetting::VirtioBlk);
        assert_eq!(config.device_wait, Duration::from_millis(2500));
        assert_eq!(config.kubelet_dir, PathBuf::from("/var/lib/kubelet"));
    }

    #[test]
    fn an_unknown_key_in_the_file_is_an_error() {
        let (_dir, file) = test_file("node.toml", "drivr_name = \"typo\"\n");
        let args = NodeArgs {
            config: Some(file),
            ..Default::default()
        };
        assert!(args.resolve().is_err());
    }
}
