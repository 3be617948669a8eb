//! Node service settings, layered: built-in defaults, then a config file,
//! then environment variables and flags (clap), each overriding the last.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::dpus::{DPU_INSECURE_FLAG, DpuSetting, DpuSpec, Reach};
use crate::dpu::plugin::DEFAULT_SNAP_SOCKET_TEMPLATE;
use crate::dpu::{Emulation, Placement};
use crate::grpc::LinkAddress;
use crate::settings::{defaults_or_file, flags_over, seconds, seconds_flag};
use crate::tls::TlsFiles;

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
    pub emulation: Emulation,
    /// How NVMe volumes are placed unless the volume context says otherwise
    /// (virtio-blk volumes are always dedicated).
    pub placement: PlacementSetting,
    /// How many namespaces a pool controller of packed volumes carries.
    pub namespaces_per_controller: u32,
    /// What NodeGetInfo reports as the most volumes this node takes; unset:
    /// the capacity of the default emulation under the default placement.
    pub max_volumes_per_node: Option<u64>,
    /// The DPU's name: this node's topology segment, and in split mode the
    /// name the DPU agent's certificate must carry. Empty: the node id (never
    /// the host name, which in a pod changes with every restart).
    pub dpu_name: String,
    /// The DPU agent, in split mode: `https://HOST:PORT` (mutual TLS) or
    /// `unix:///PATH`. Unset: co-located mode (the vendor plugin's and SNAP's
    /// sockets are reachable from this host).
    pub dpu_endpoint: Option<String>,
    /// Allows a plaintext `http://LOOPBACK-IP:PORT` agent endpoint (tests).
    pub dpu_insecure_plaintext: bool,
    /// A host with several DPUs: each one (file only; see [`super::dpus`]).
    /// Given, `dpu_name` and `dpu_endpoint` must not be.
    pub dpus: Vec<DpuSetting>,
    /// This node's certificate and key, and the CA of DPU agent certificates.
    pub dpu_tls: TlsFiles,
    /// How long a stage waits for the host device to appear.
    #[serde(with = "seconds")]
    pub device_wait: Duration,
    /// Upper bound on one CSI call when kubelet gives no deadline.
    #[serde(with = "seconds")]
    pub call_timeout: Duration,
    /// Where to serve Prometheus metrics (`/metrics`); none when unset.
    pub metrics_address: Option<std::net::SocketAddr>,
    /// At start, unstage the volumes staged here that nothing under the
    /// kubelet directory uses (NodeUnstage never came); off: only report them.
    pub unstage_orphans: bool,
    /// For the emulator only: the emulator's directory of the host's
    /// virtio-fs devices (`<dir>/<tag>`, a UNIX socket each). Set, a stage
    /// mounts FUSE itself and hands the connection to the tag's socket
    /// (crate `fuse-handoff`) instead of mounting the tag with the kernel's
    /// virtiofs, which a host without real virtio-fs functions cannot.
    /// Unset on a real host.
    pub virtiofs_emulated_dir: Option<PathBuf>,
}

/// The node's emulation setting is the DPU side's [`Emulation`], which
/// names itself in files, flags and volume contexts (the node's suites
/// know it by this name).
pub use crate::dpu::Emulation as EmulationSetting;

/// `dedicated` or `packed` in files, flags and volume contexts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlacementSetting {
    Dedicated,
    Packed,
}

impl PlacementSetting {
    pub fn parse(value: &str) -> Option<PlacementSetting> {
        match value {
            "dedicated" => Some(PlacementSetting::Dedicated),
            "packed" => Some(PlacementSetting::Packed),
            _ => None,
        }
    }

    /// The DPU side's placement, with the pools' size for packed.
    pub fn with(self, namespaces_per_controller: u32) -> Placement {
        match self {
            PlacementSetting::Dedicated => Placement::Dedicated,
            PlacementSetting::Packed => Placement::Packed {
                namespaces_per_controller,
            },
        }
    }
}

/// The most namespaces a pool controller may be asked to carry: SNAP's
/// default `mnan` (the emulator's too), which a subsystem created without
/// one gets. A SNAP that allows fewer lists less, and NodeGetInfo counts that.
pub const MAX_NAMESPACES_PER_CONTROLLER: u32 = 1024;

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            endpoint: "/csi/csi.sock".into(),
            driver_name: crate::settings::DRIVER_NAME.into(),
            node_id: hostname(),
            kubelet_dir: "/var/lib/kubelet".into(),
            state_dir: "/var/lib/snap-csi".into(),
            sysfs_root: "/sys".into(),
            plugin_socket: "/var/lib/nvidia/storage/snap/plugins/spdk/dpu.sock".into(),
            snap_socket_template: DEFAULT_SNAP_SOCKET_TEMPLATE.into(),
            emulation: Emulation::Nvme,
            placement: PlacementSetting::Dedicated,
            namespaces_per_controller: crate::dpu::DEFAULT_NAMESPACES_PER_CONTROLLER,
            max_volumes_per_node: None,
            dpu_name: String::new(),
            dpu_endpoint: None,
            dpu_insecure_plaintext: false,
            dpus: Vec::new(),
            dpu_tls: TlsFiles::default(),
            device_wait: Duration::from_secs(30),
            call_timeout: Duration::from_secs(120),
            metrics_address: None,
            unstage_orphans: false,
            virtiofs_emulated_dir: None,
        }
    }
}

impl NodeConfig {
    /// The DPU agent's address in split mode, checked; `None`: co-located.
    pub fn dpu_link(&self) -> Result<Option<LinkAddress>, String> {
        self.dpu_endpoint
            .as_deref()
            .map(|endpoint| {
                LinkAddress::parse(endpoint, self.dpu_insecure_plaintext, DPU_INSECURE_FLAG)
                    .map_err(|e| format!("--dpu-endpoint {e}"))
            })
            .transpose()
    }
}

impl NodeConfig {
    /// Every DPU this node reaches, in the configured order (the first
    /// serves volumes recorded by a node that knew only one), checked: the
    /// `dpus` list, or the single-DPU settings as its one entry; and the
    /// node id, which values their topology segments.
    pub fn dpu_specs(&self) -> Result<Vec<DpuSpec>, String> {
        let sockets = Reach::Sockets {
            plugin_socket: self.plugin_socket.clone(),
            snap_socket_template: self.snap_socket_template.clone(),
        };
        let specs = if self.dpus.is_empty() {
            vec![DpuSpec {
                name: self.dpu_name.clone(),
                pci_domain: 0,
                reach: match self.dpu_link()? {
                    Some(address) => Reach::Agent(address),
                    None => sockets,
                },
            }]
        } else {
            super::dpus::specs(&self.dpus, &sockets, self.dpu_insecure_plaintext)?
        };
        super::dpus::check_node_id(&self.node_id, &specs)?;
        Ok(specs)
    }

    /// The placement settings make sense together (the file is not checked
    /// by clap's ranges).
    fn check_placement(&self) -> Result<(), String> {
        if !(1..=MAX_NAMESPACES_PER_CONTROLLER).contains(&self.namespaces_per_controller) {
            return Err(format!(
                "namespaces per controller must be 1 to {MAX_NAMESPACES_PER_CONTROLLER}, not {}",
                self.namespaces_per_controller
            ));
        }
        if self.max_volumes_per_node == Some(0) || self.max_volumes_per_node > Some(i64::MAX as u64)
        {
            return Err("max volumes per node must be at least 1 (and fit CSI's int64)".into());
        }
        Ok(())
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
    /// Default emulation: nvme, virtio-blk or virtio-fs.
    #[arg(long, env = "SNAP_CSI_EMULATION", value_parser = Emulation::ALL.map(Emulation::name))]
    pub emulation: Option<String>,
    /// Default placement of NVMe volumes: dedicated (a function each) or packed (namespaces on shared pool controllers).
    #[arg(long, env = "SNAP_CSI_PLACEMENT", value_parser = ["dedicated", "packed"])]
    pub placement: Option<String>,
    /// Namespaces one pool controller carries under the packed placement (1 to 1024).
    #[arg(long, env = "SNAP_CSI_NAMESPACES_PER_CONTROLLER", value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_NAMESPACES_PER_CONTROLLER)))]
    pub namespaces_per_controller: Option<u32>,
    /// The volume limit NodeGetInfo reports (default: the default emulation's capacity under the default placement).
    #[arg(long, env = "SNAP_CSI_MAX_VOLUMES_PER_NODE", value_parser = clap::value_parser!(u64).range(1..=i64::MAX as u64))]
    pub max_volumes_per_node: Option<u64>,
    /// The DPU's name: topology segment, and the agent certificate's name (default: the node id).
    #[arg(long, env = "SNAP_CSI_DPU_NAME")]
    pub dpu_name: Option<String>,
    /// The DPU agent (split mode): https://HOST:PORT or unix:///PATH; unset: co-located.
    #[arg(long, env = "SNAP_CSI_DPU_ENDPOINT")]
    pub dpu_endpoint: Option<String>,
    /// Allow a plaintext http://127.0.0.1:PORT agent endpoint (no authentication; tests only).
    #[arg(long, env = "SNAP_CSI_DPU_INSECURE_PLAINTEXT")]
    pub dpu_insecure_plaintext: bool,
    /// This node's certificate chain for the agent link (PEM).
    #[arg(long, env = "SNAP_CSI_DPU_TLS_CERT")]
    pub dpu_tls_cert: Option<PathBuf>,
    /// This node's private key for the agent link (PEM).
    #[arg(long, env = "SNAP_CSI_DPU_TLS_KEY")]
    pub dpu_tls_key: Option<PathBuf>,
    /// The CA that signs DPU agent certificates (PEM).
    #[arg(long, env = "SNAP_CSI_DPU_TLS_CA")]
    pub dpu_tls_ca: Option<PathBuf>,
    /// Seconds a stage waits for the host device.
    #[arg(long, env = "SNAP_CSI_DEVICE_WAIT")]
    pub device_wait: Option<f64>,
    /// Seconds one call may take when kubelet sets no deadline.
    #[arg(long, env = "SNAP_CSI_CALL_TIMEOUT")]
    pub call_timeout: Option<f64>,
    /// Serve Prometheus metrics on this address (e.g. 0.0.0.0:9810).
    #[arg(long, env = "SNAP_CSI_METRICS_ADDRESS")]
    pub metrics_address: Option<std::net::SocketAddr>,
    /// At start, unstage staged volumes nothing under the kubelet directory uses (default: only report them).
    #[arg(long, env = "SNAP_CSI_UNSTAGE_ORPHANS")]
    pub unstage_orphans: bool,
    /// For the emulator only: the emulator's directory of virtio-fs devices, a socket per tag (<dir>/<tag>); unset on a real host.
    #[arg(long, env = "SNAP_CSI_VIRTIOFS_EMULATED_DIR")]
    pub virtiofs_emulated_dir: Option<PathBuf>,
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
            optional [metrics_address, dpu_endpoint, max_volumes_per_node, virtiofs_emulated_dir]
        );
        if let Some(value) = self.namespaces_per_controller {
            resolved.namespaces_per_controller = value;
        }
        flags_over!(self => resolved.dpu_tls, [dpu_tls_cert => cert, dpu_tls_key => key, dpu_tls_ca => ca]);
        resolved.dpu_insecure_plaintext |= self.dpu_insecure_plaintext;
        resolved.unstage_orphans |= self.unstage_orphans;
        if !resolved.dpus.is_empty() {
            for (given, key) in [
                (!resolved.dpu_name.is_empty(), "dpu_name"),
                (resolved.dpu_endpoint.is_some(), "dpu_endpoint"),
            ] {
                if given {
                    return Err(config::ConfigError::Message(format!(
                        "{key} is for a host with one DPU; with dpus, each entry names its own"
                    )));
                }
            }
        }
        if resolved.dpu_name.is_empty() {
            resolved.dpu_name = resolved.node_id.clone();
        }
        resolved.dpu_specs().map_err(config::ConfigError::Message)?;
        if let Some(value) = &self.emulation {
            resolved.emulation = Emulation::parse(value).ok_or_else(|| {
                config::ConfigError::Message(format!("unknown emulation {value}"))
            })?;
        }
        if let Some(value) = &self.placement {
            resolved.placement = PlacementSetting::parse(value).ok_or_else(|| {
                config::ConfigError::Message(format!("unknown placement {value}"))
            })?;
        }
        resolved
            .check_placement()
            .map_err(config::ConfigError::Message)?;
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
        assert_eq!(config.emulation, Emulation::VirtioBlk);
        assert_eq!(config.device_wait, Duration::from_millis(2500));
        assert_eq!(config.kubelet_dir, PathBuf::from("/var/lib/kubelet"));
        assert_eq!(
            config.dpu_name, "flag-node",
            "the DPU name follows the node id"
        );
        assert_eq!(
            config.dpu_link(),
            Ok(None),
            "co-located unless an endpoint is given"
        );
    }

    #[test]
    fn split_mode_takes_an_agent_endpoint_and_its_tls_files() {
        let (_dir, file) = test_file(
            "node.toml",
            "dpu_endpoint = \"https://192.168.100.2:9830\"\ndpu_name = \"bf3-a\"\n[dpu_tls]\nca = \"/etc/ca.pem\"\n",
        );
        let args = NodeArgs {
            config: Some(file),
            dpu_tls_key: Some("/flag/key.pem".into()),
            ..Default::default()
        };
        let config = args.resolve().unwrap();
        assert_eq!(
            config.dpu_link(),
            Ok(Some(LinkAddress::Tls("192.168.100.2:9830".into())))
        );
        assert_eq!(config.dpu_name, "bf3-a");
        assert_eq!(config.dpu_tls.ca, PathBuf::from("/etc/ca.pem"));
        assert_eq!(config.dpu_tls.key, PathBuf::from("/flag/key.pem"));
        assert_eq!(config.dpu_tls.cert, TlsFiles::default().cert);

        let plaintext = NodeArgs {
            dpu_endpoint: Some("http://10.1.2.3:9830".into()),
            dpu_insecure_plaintext: true,
            ..Default::default()
        };
        let error = plaintext.resolve().unwrap_err().to_string();
        assert!(error.contains("non-loopback"), "{error}");
    }

    #[test]
    fn placement_settings_layer_and_are_checked_together() {
        let (_dir, file) = test_file(
            "node.toml",
            "placement = \"packed\"\nnamespaces_per_controller = 64\nmax_volumes_per_node = 100\n",
        );
        let args = NodeArgs {
            config: Some(file),
            namespaces_per_controller: Some(8),
            ..Default::default()
        };
        let config = args.resolve().unwrap();
        assert_eq!(config.placement, PlacementSetting::Packed);
        assert_eq!(config.namespaces_per_controller, 8);
        assert_eq!(config.max_volumes_per_node, Some(100));
        assert_eq!(
            config.placement.with(8),
            Placement::Packed {
                namespaces_per_controller: 8
            }
        );
        let defaults = NodeArgs::default().resolve().unwrap();
        assert_eq!(defaults.placement, PlacementSetting::Dedicated);
        assert_eq!(defaults.namespaces_per_controller, 32);
        assert_eq!(defaults.max_volumes_per_node, None);

        for bad in [
            "namespaces_per_controller = 0",
            "namespaces_per_controller = 1025",
            "max_volumes_per_node = 0",
        ] {
            let (_dir, file) = test_file("node.toml", bad);
            let args = NodeArgs {
                config: Some(file),
                ..Default::default()
            };
            assert!(args.resolve().is_err(), "{bad} was accepted");
        }
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

    fn resolve_dpus(toml: &str) -> Result<Vec<DpuSpec>, String> {
        let (_dir, file) = test_file("node.toml", toml);
        let args = NodeArgs {
            config: Some(file),
            ..Default::default()
        };
        args.resolve()
            .map_err(|e| e.to_string())
            .and_then(|c| c.dpu_specs())
    }

    #[test]
    fn two_dpus_are_listed_with_their_domains_and_reach() {
        let specs = resolve_dpus(
            "plugin_socket = \"/p.sock\"\n\
             [[dpus]]\nname = \"bf3-a\"\n\
             [[dpus]]\nname = \"bf3-b\"\npci_domain = \"1\"\nsnap_socket_template = \"/b/snap.sock\"\nplugin_socket = \"/b/p.sock\"\n",
        )
        .unwrap();
        assert_eq!(specs.len(), 2);
        assert_eq!((specs[0].name.as_str(), specs[0].pci_domain), ("bf3-a", 0));
        assert_eq!((specs[1].name.as_str(), specs[1].pci_domain), ("bf3-b", 1));
        assert!(
            matches!(&specs[0].reach, Reach::Sockets { plugin_socket, .. } if plugin_socket == &PathBuf::from("/p.sock"))
        );
        let split = resolve_dpus(
            "[[dpus]]\nname = \"a\"\nendpoint = \"https://10.0.0.1:9830\"\n\
             [[dpus]]\nname = \"b\"\npci_domain = \"0002\"\nendpoint = \"https://10.0.1.1:9830\"\n",
        )
        .unwrap();
        assert_eq!(
            split[1].reach,
            Reach::Agent(LinkAddress::Tls("10.0.1.1:9830".into()))
        );
    }

    #[test]
    fn one_dpu_comes_from_the_single_settings() {
        let specs = resolve_dpus("dpu_name = \"bf3\"\n").unwrap();
        assert_eq!(specs.len(), 1);
        assert_eq!((specs[0].name.as_str(), specs[0].pci_domain), ("bf3", 0));
    }

    #[test]
    fn a_node_id_valuing_a_dpu_segment_must_be_a_label_value() {
        let long = "n".repeat(64);
        let resolve = |node_id: &str, toml: &str| {
            let (_dir, file) = test_file("node.toml", toml);
            let args = NodeArgs {
                config: Some(file),
                node_id: Some(node_id.into()),
                ..Default::default()
            };
            args.resolve().map_err(|e| e.to_string())
        };
        for (node_id, toml) in [
            (long.as_str(), "dpu_name = \"bf3-a\"\n"),
            (long.as_str(), "[[dpus]]\nname = \"bf3-a\"\n"),
            ("host-1.", "dpu_name = \"bf3-a\"\n"),
            ("host/1", "dpu_name = \"bf3-a\"\n"),
        ] {
            let error = resolve(node_id, toml).unwrap_err();
            for part in ["--node-id", "63", "dpu.snap-csi.io/bf3-a"] {
                assert!(error.contains(part), "{node_id} {toml}: {error}");
            }
        }
        assert_eq!(
            resolve("host-1.example", "dpu_name = \"bf3-a\"\n")
                .unwrap()
                .node_id,
            "host-1.example"
        );
        // Named after a node id too long for a label, the one DPU has no
        // segment of its own (as before), so nothing carries the id.
        assert_eq!(resolve(&long, "").unwrap().dpu_name, long);
    }

    #[test]
    fn bad_lists_are_refused_with_the_reason() {
        for (toml, why) in [
            (
                "[[dpus]]\nname = \"a\"\n[[dpus]]\nname = \"a\"\npci_domain = \"1\"\nplugin_socket = \"/x\"\n",
                "must differ",
            ),
            (
                "[[dpus]]\nname = \"a\"\n[[dpus]]\nname = \"b\"\n",
                "must differ",
            ),
            (
                "[[dpus]]\nname = \"a\"\npci_domain = \"10000\"\n",
                "hex digits",
            ),
            (
                "[[dpus]]\nname = \"a\"\npci_domain = \"zz\"\n",
                "hex digits",
            ),
            ("[[dpus]]\nname = \"-a\"\n", "letters, digits"),
            ("[[dpus]]\nname = \"\"\n", "letters, digits"),
            (
                "[[dpus]]\nname = \"a\"\nendpoint = \"https://10.0.0.1:1\"\nplugin_socket = \"/x\"\n",
                "takes no sockets",
            ),
            (
                "[[dpus]]\nname = \"a\"\nendpoint = \"http://10.0.0.1:1\"\n",
                "endpoint",
            ),
            ("dpu_name = \"x\"\n[[dpus]]\nname = \"a\"\n", "dpu_name"),
            (
                "dpu_endpoint = \"https://10.0.0.1:1\"\n[[dpus]]\nname = \"a\"\n",
                "dpu_endpoint",
            ),
            ("[[dpus]]\nname = \"a\"\nsocket = \"/x\"\n", "socket"),
        ] {
            let error = resolve_dpus(toml).unwrap_err();
            assert!(error.contains(why), "{toml}: {error}");
        }
    }
}
