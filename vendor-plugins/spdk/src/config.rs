//! The plugin's settings and the binary's flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use snap_csi::dpu::plugin::{PROVIDER_PLACEHOLDER, snap_socket_path};
use snap_csi::node::dpus::is_label_name;
use snap_csi::settings::MAX_SECONDS;

use crate::backend::{Devices, Kind};
use crate::csi::{AioConfig, CsiConfig, DpuPlugin, FsConfig, HostDpu, NvmfConfig};
use crate::service::ServiceConfig;

/// Where DPF looks for this plugin (`plugins/<plugin-name>/dpu.sock`).
pub const DEFAULT_PLUGIN_SOCKET: &str = "/var/lib/nvidia/storage/snap/plugins/spdk/dpu.sock";
/// Where a stock SNAP container serves its JSON-RPC.
pub const DEFAULT_SPDK_SOCKET: &str = "/var/tmp/spdk.sock";
/// Where the CSI controller keeps volume groups and NVMe-oF snapshot records.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/snap-csi-spdk-plugin";

/// Everything a running plugin needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Our gRPC socket.
    pub plugin_socket: PathBuf,
    /// SNAP's SPDK JSON-RPC socket.
    pub spdk_socket: PathBuf,
    pub service: ServiceConfig,
    /// The CSI controller, when `--csi-socket` is given.
    pub csi: Option<CsiConfig>,
    /// Where to serve Prometheus metrics (`/metrics`), if anywhere.
    pub metrics_address: Option<std::net::SocketAddr>,
}

/// `--version` and the start line: the crate's version and the commit it
/// was built from (build.rs), so that an image says what it runs.
pub const VERSION: &str = env!("SNAP_CSI_VERSION");

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Command line of `snap-csi-spdk-plugin`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "snap-csi-spdk-plugin",
    version = VERSION,
    about = "nvidia.storage.plugins.v1 vendor plugin: SPDK AIO and NVMe-oF bdevs inside SNAP"
)]
pub struct Args {
    /// The UNIX socket to serve the plugin API on (created with mode 0600).
    #[arg(long, env = "SPDK_PLUGIN_SOCKET", default_value = DEFAULT_PLUGIN_SOCKET)]
    pub plugin_socket: PathBuf,
    /// SNAP's SPDK JSON-RPC socket.
    #[arg(long, env = "SPDK_PLUGIN_SPDK_SOCKET", default_value = DEFAULT_SPDK_SOCKET)]
    pub spdk_socket: PathBuf,
    /// The SNAP provider to name in GetSNAPProvider; empty means NVIDIA's default SNAP.
    #[arg(long, env = "SPDK_PLUGIN_SNAP_PROVIDER", default_value = "")]
    pub snap_provider: String,
    /// Seconds a call may take at most, and the time given to a call without a deadline.
    #[arg(long, env = "SPDK_PLUGIN_CALL_TIMEOUT", default_value_t = 30)]
    pub call_timeout: u64,
    /// Seconds between looks at attached AIO volumes' files and QoS records,
    /// which grow their bdevs after a ControllerExpandVolume and apply a
    /// ModifyVolume live (at least 1: the controller advertises online expansion).
    #[arg(long, env = "SPDK_PLUGIN_AIO_FOLLOW_PERIOD", default_value_t = 1)]
    pub aio_follow_period: u64,
    /// Also make filesystem devices (backend `fs`, SPDK aio fsdevs SNAP serves
    /// as virtio-fs) of volume directories inside this share (absolute, as
    /// SNAP sees it; on a BlueField where the DPU mounted the NFS export).
    /// With --csi-socket, the controller also makes the fs backend's volumes
    /// there: ext4 images loop-mounted on their directories (the share must
    /// support reflinks: btrfs, or XFS with reflink=1).
    #[arg(long, env = "SPDK_PLUGIN_FS_SHARE")]
    pub fs_share: Option<PathBuf>,
    /// Serve filesystem devices with DOCA SNAP's NFS fsdev (`fsdev_nfs_create`,
    /// as NVIDIA's DPF storage plugin does) from this NFS server, whose export
    /// --fs-share is (its path on the server; the DPU mounts nothing); without
    /// it, SPDK's aio fsdev over --fs-share as the DPU sees it.
    #[arg(long, env = "SPDK_PLUGIN_FS_NFS_SERVER")]
    pub fs_nfs_server: Option<String>,
    /// CSI controller: bytes the filesystem share may hold [default: the filesystem's size].
    #[arg(long, env = "SPDK_PLUGIN_FS_SHARE_CAPACITY")]
    pub fs_share_capacity: Option<u64>,
    /// Make no block devices (AIO, NVMe-oF): a plugin of filesystem devices only.
    #[arg(long, env = "SPDK_PLUGIN_NO_BLOCK_DEVICES")]
    pub no_block_devices: bool,
    /// Log line format (the filter is RUST_LOG, default "info").
    #[arg(long, env = "SPDK_PLUGIN_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Serve Prometheus metrics on this address (e.g. 0.0.0.0:9812).
    #[arg(long, env = "SPDK_PLUGIN_METRICS_ADDRESS")]
    pub metrics_address: Option<std::net::SocketAddr>,
    /// Also serve the CSI controller (Identity, Controller, VolumeGroup) on this UNIX socket.
    #[arg(long, env = "SPDK_PLUGIN_CSI_SOCKET")]
    pub csi_socket: Option<PathBuf>,
    /// CSI controller: where volume groups and NVMe-oF snapshot records are kept.
    #[arg(long, env = "SPDK_PLUGIN_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// CSI controller: the AIO backend's pool directory (absolute; volumes are
    /// `<dir>/<volume id>.img`, and SNAP must see them at that path).
    #[arg(long, env = "SPDK_PLUGIN_AIO_POOL_DIR")]
    pub aio_pool_dir: Option<PathBuf>,
    /// CSI controller: bytes the AIO pool may hold [default: the filesystem's free space].
    #[arg(long, env = "SPDK_PLUGIN_AIO_POOL_CAPACITY")]
    pub aio_pool_capacity: Option<u64>,
    /// CSI controller: the one DPU whose storage holds the AIO pool, as its
    /// node names it, on the host --aio-node names: AIO volumes are then used
    /// only on that host, and only on that DPU there [default: every DPU
    /// reaches the pool].
    #[arg(long, env = "SPDK_PLUGIN_AIO_DPU")]
    pub aio_dpu: Option<String>,
    /// CSI controller: with --aio-dpu, the node id of the host whose DPU that
    /// is (DPUs are named alike on every host).
    #[arg(long, env = "SPDK_PLUGIN_AIO_NODE")]
    pub aio_node: Option<String>,
    /// CSI controller: the NVMe-oF backend's target, its SPDK JSON-RPC socket.
    #[arg(long, env = "SPDK_PLUGIN_NVMF_TARGET_SOCKET")]
    pub nvmf_target_socket: Option<PathBuf>,
    /// CSI controller: the lvstore on the target that holds the volumes (it must exist).
    #[arg(long, env = "SPDK_PLUGIN_NVMF_LVSTORE")]
    pub nvmf_lvstore: Option<String>,
    /// CSI controller: the target's NVMe/TCP listener as initiators reach it
    /// (ADDR:PORT); given again (or comma-separated), more listeners: each
    /// volume's subsystem listens on every one, and a volume of a StorageClass
    /// with `nvmf-multipath: "true"` is attached through all of them.
    #[arg(long, env = "SPDK_PLUGIN_NVMF_LISTEN", value_delimiter = ',')]
    pub nvmf_listen: Vec<SocketAddr>,
    /// CSI controller: the backend of volumes whose parameters name none
    /// [default: aio when configured, else nvmf when configured, else fs].
    #[arg(long, env = "SPDK_PLUGIN_DEFAULT_BACKEND", value_parser = ["aio", "nvmf", "fs"])]
    pub default_backend: Option<String>,
    /// CSI controller: list GET_SNAPSHOT (CSI 1.12) in ControllerGetCapabilities;
    /// sidecars built on CSI v1.11 crash on it, so only for sidecars built on 1.12.
    #[arg(long, env = "SPDK_PLUGIN_ADVERTISE_GET_SNAPSHOT")]
    pub advertise_get_snapshot: bool,
    /// CSI controller: a DPU's vendor plugin socket, under its host's node
    /// id and the DPU's name as the node gives it (NODE_ID/NAME=PATH; NAME=PATH
    /// where one host has DPUs: every host may name its DPU `bf3-a`); given
    /// again (or comma-separated), more DPUs. DeleteVolume asks each for its devices (ListDevices) and refuses
    /// a volume one serves (FAILED_PRECONDITION) or while one does not answer
    /// (UNAVAILABLE). Without it, DeleteVolume checks nothing: a volume still
    /// staged on a host is deleted.
    #[arg(
        long = "dpu-plugin",
        env = "SPDK_PLUGIN_DPU_PLUGIN",
        value_delimiter = ',',
        value_name = "NODE_ID/NAME=PATH",
        value_parser = parse_dpu_plugin
    )]
    pub dpu_plugins: Vec<DpuPlugin>,
}

/// `--dpu-plugin [NODE_ID/]NAME=PATH`.
fn parse_dpu_plugin(value: &str) -> Result<DpuPlugin, String> {
    let (name, path) = value
        .split_once('=')
        .ok_or_else(|| format!("{value:?} is not NODE_ID/NAME=PATH"))?;
    // A node id is a label value where the node reports DPUs (it is the
    // value of their topology segment), so the same form as a DPU's name.
    let (node, dpu) = name.split_once('/').unwrap_or(("", name));
    if name.starts_with('/') || !node.is_empty() && !is_label_name(node) {
        return Err(format!(
            "{node:?} is not a node id as the node reports it with DPUs (a Kubernetes label \
             value: letters, digits, '-', '_', '.', at most 63)"
        ));
    }
    if !is_label_name(dpu) {
        return Err(format!(
            "{dpu:?} is not a DPU's name as the node gives it (a Kubernetes label name: \
             letters, digits, '-', '_', '.', at most 63)"
        ));
    }
    if path.is_empty() {
        return Err(format!("DPU {name} has no socket path"));
    }
    Ok(DpuPlugin {
        name: name.to_string(),
        socket: PathBuf::from(path),
    })
}

/// The DPUs' plugins: no DPU (host and name) or socket twice (a typo that
/// would leave a DPU unchecked).
fn check_dpu_plugins(plugins: &[DpuPlugin]) -> Result<Vec<DpuPlugin>, String> {
    for (i, plugin) in plugins.iter().enumerate() {
        if let Some(other) = plugins[..i]
            .iter()
            .find(|p| p.name == plugin.name || p.socket == plugin.socket)
        {
            return Err(format!(
                "--dpu-plugin {}={} and {}={} repeat a DPU or a socket",
                other.name,
                other.socket.display(),
                plugin.name,
                plugin.socket.display()
            ));
        }
    }
    Ok(plugins.to_vec())
}

impl Args {
    /// The configuration these flags give, or why there is none.
    pub fn resolve(&self) -> Result<Config, String> {
        if !self.snap_provider.is_empty() {
            // The node turns the name into a socket path: refuse here what it would refuse.
            snap_socket_path(PROVIDER_PLACEHOLDER, &self.snap_provider)
                .map_err(|e| format!("--snap-provider: {e}"))?;
        }
        if !(1..=MAX_SECONDS).contains(&self.call_timeout) {
            return Err(format!(
                "--call-timeout must be from 1 to {MAX_SECONDS} seconds (a year)"
            ));
        }
        if !(1..=MAX_SECONDS).contains(&self.aio_follow_period) {
            return Err(format!(
                "--aio-follow-period must be from 1 to {MAX_SECONDS} seconds (a year): attached \
                 AIO volumes grow only while followed"
            ));
        }
        let devices = self.devices()?;
        let call_timeout = Duration::from_secs(self.call_timeout);
        Ok(Config {
            plugin_socket: self.plugin_socket.clone(),
            spdk_socket: self.spdk_socket.clone(),
            service: ServiceConfig {
                snap_provider: self.snap_provider.clone(),
                call_timeout,
                aio_follow_period: Duration::from_secs(self.aio_follow_period),
                devices,
            },
            csi: self.csi(call_timeout)?,
            metrics_address: self.metrics_address,
        })
    }

    fn devices(&self) -> Result<Devices, String> {
        if let Some(share) = self.fs_share.as_ref().filter(|s| !s.is_absolute()) {
            return Err(format!(
                "--fs-share must be absolute (it is SNAP's path to the volumes), got {}",
                share.display()
            ));
        }
        if self.no_block_devices && self.fs_share.is_none() {
            return Err(
                "--no-block-devices needs --fs-share: the plugin would make nothing".into(),
            );
        }
        if self.fs_nfs_server.is_some() && self.fs_share.is_none() {
            return Err("--fs-nfs-server needs --fs-share, the export's path on the server".into());
        }
        if self
            .fs_nfs_server
            .as_ref()
            .is_some_and(|s| s.is_empty() || s.chars().any(|c| c.is_whitespace()))
        {
            return Err("--fs-nfs-server must be a host name or address".into());
        }
        Ok(Devices {
            block: !self.no_block_devices,
            fs_share: self.fs_share.clone(),
            fs_nfs_server: self.fs_nfs_server.clone(),
        })
    }

    fn csi(&self, call_timeout: Duration) -> Result<Option<CsiConfig>, String> {
        let Some(socket) = &self.csi_socket else {
            if !self.dpu_plugins.is_empty() {
                return Err("--dpu-plugin needs --csi-socket: only the controller asks".into());
            }
            return Ok(None);
        };
        let aio = match &self.aio_pool_dir {
            Some(dir) if dir.is_absolute() => Some(AioConfig {
                pool_dir: dir.clone(),
                capacity: self.aio_pool_capacity,
                dpu: self.aio_host_dpu()?,
            }),
            Some(dir) => {
                return Err(format!(
                    "--aio-pool-dir must be absolute (it is SNAP's path to the files), got {}",
                    dir.display()
                ));
            }
            None if self.aio_pool_capacity.is_some()
                || self.aio_dpu.is_some()
                || self.aio_node.is_some() =>
            {
                return Err(
                    "--aio-pool-capacity, --aio-dpu and --aio-node need --aio-pool-dir".into(),
                );
            }
            None => None,
        };
        let nvmf = match (
            &self.nvmf_target_socket,
            &self.nvmf_lvstore,
            self.nvmf_listen.as_slice(),
        ) {
            (Some(target_socket), Some(lvstore), listen @ [_, ..]) if !lvstore.is_empty() => {
                Some(NvmfConfig {
                    target_socket: target_socket.clone(),
                    lvstore: lvstore.clone(),
                    listen: check_listeners(listen)?,
                })
            }
            (None, None, []) => None,
            _ => {
                return Err(
                    "the NVMe-oF backend needs all of --nvmf-target-socket, --nvmf-lvstore and \
                     --nvmf-listen"
                        .into(),
                );
            }
        };
        if self.fs_share_capacity.is_some() && self.fs_share.is_none() {
            return Err("--fs-share-capacity needs --fs-share".into());
        }
        let fs = self.fs_share.as_ref().map(|share| FsConfig {
            share: share.clone(),
            capacity: self.fs_share_capacity,
        });
        let default_backend = match self.default_backend.as_deref() {
            Some("aio") => Kind::Aio,
            Some("nvmf") => Kind::Nvmf,
            Some(_) => Kind::Fs,
            None if aio.is_some() => Kind::Aio,
            None if nvmf.is_some() => Kind::Nvmf,
            None => Kind::Fs,
        };
        let configured = match default_backend {
            Kind::Aio => aio.is_some(),
            Kind::Nvmf => nvmf.is_some(),
            Kind::Fs => fs.is_some(),
        };
        if !configured {
            return Err(format!(
                "--csi-socket needs a backend: --aio-pool-dir, the --nvmf-* flags or \
                 --fs-share (the default backend {} is not configured)",
                default_backend.as_str()
            ));
        }
        Ok(Some(CsiConfig {
            socket: socket.clone(),
            state_dir: self.state_dir.clone(),
            aio,
            nvmf,
            fs,
            default_backend,
            call_timeout,
            advertise_get_snapshot: self.advertise_get_snapshot,
            dpu_plugins: check_dpu_plugins(&self.dpu_plugins)?,
        }))
    }

    /// `--aio-dpu` and `--aio-node`: both or neither, since a DPU's name
    /// alone names one on every host; each as the node reports it in the
    /// DPU's topology segment, where both must be label names.
    fn aio_host_dpu(&self) -> Result<Option<HostDpu>, String> {
        let (name, node_id) = match (&self.aio_dpu, &self.aio_node) {
            (Some(name), Some(node_id)) => (name, node_id),
            (None, None) => return Ok(None),
            _ => {
                return Err(
                    "--aio-dpu and --aio-node go together: the DPU that holds the AIO pool is \
                     named by its name and its host's node id, as DPUs are named alike on \
                     every host"
                        .into(),
                );
            }
        };
        if !is_label_name(name) {
            return Err(format!(
                "--aio-dpu must be a DPU's name as the node gives it (a Kubernetes label \
                 name: letters, digits, '-', '_', '.', at most 63), got {name:?}"
            ));
        }
        if !is_label_name(node_id) {
            return Err(format!(
                "--aio-node must be the node id of the DPU's host, as its node gives it (a \
                 Kubernetes label value: letters, digits, '-', '_', '.', at most 63), got \
                 {node_id:?}"
            ));
        }
        Ok(Some(HostDpu {
            name: name.clone(),
            node_id: node_id.clone(),
        }))
    }
}

/// The target's listeners: none twice, all of one address family (a
/// volume's paths share its context's `adrfam`), at most
/// [`MAX_PATHS`](crate::backend::MAX_PATHS) (a volume's paths).
fn check_listeners(listen: &[SocketAddr]) -> Result<Vec<SocketAddr>, String> {
    let mut seen = Vec::with_capacity(listen.len());
    for address in listen {
        if seen.contains(address) {
            return Err(format!("--nvmf-listen {address} is given twice"));
        }
        if address.is_ipv4() != listen[0].is_ipv4() {
            return Err(format!(
                "--nvmf-listen {address} and {} are of two address families: a volume's paths \
                 share one (its context's adrfam)",
                listen[0]
            ));
        }
        seen.push(*address);
    }
    if seen.len() > crate::backend::MAX_PATHS {
        return Err(format!(
            "--nvmf-listen is given {} times; a volume has at most {} paths",
            seen.len(),
            crate::backend::MAX_PATHS
        ));
    }
    Ok(seen)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn defaults_follow_dpf_and_snap_conventions() {
        let config = Args::try_parse_from(["p"]).unwrap().resolve().unwrap();
        assert_eq!(config.plugin_socket, PathBuf::from(DEFAULT_PLUGIN_SOCKET));
        assert_eq!(config.spdk_socket, PathBuf::from(DEFAULT_SPDK_SOCKET));
        assert_eq!(config.service.snap_provider, "");
        assert_eq!(config.service.call_timeout, Duration::from_secs(30));
        assert_eq!(config.service.aio_follow_period, Duration::from_secs(1));
        assert_eq!(config.service.devices, Devices::default());
    }

    #[test]
    fn filesystem_devices_need_an_absolute_share() {
        let devices = |args: &[&str]| {
            let mut all = vec!["p"];
            all.extend_from_slice(args);
            Args::try_parse_from(all)
                .unwrap()
                .resolve()
                .map(|c| c.service.devices)
        };
        let fs_only = devices(&["--fs-share", "/share", "--no-block-devices"]).unwrap();
        assert_eq!(fs_only.kinds(), [Kind::Fs]);
        assert_eq!(
            devices(&["--fs-share", "/share"]).unwrap().kinds(),
            Kind::ALL
        );
        let error = devices(&["--fs-share", "share"]).unwrap_err();
        assert!(error.contains("--fs-share must be absolute"), "{error}");
        let error = devices(&["--no-block-devices"]).unwrap_err();
        assert!(error.contains("needs --fs-share"), "{error}");
        let error = devices(&["--fs-nfs-server", "10.0.0.5"]).unwrap_err();
        assert!(error.contains("needs --fs-share"), "{error}");
        let nfs = devices(&["--fs-share", "/export", "--fs-nfs-server", "10.0.0.5"]).unwrap();
        assert_eq!(nfs.fs_nfs_server.as_deref(), Some("10.0.0.5"));
    }

    #[test]
    fn providers_must_be_plain_names() {
        let args = Args::try_parse_from(["p", "--snap-provider", "acme-snap"]).unwrap();
        assert_eq!(args.resolve().unwrap().service.snap_provider, "acme-snap");
        let args = Args::try_parse_from(["p", "--snap-provider", "../x"]).unwrap();
        assert!(args.resolve().unwrap_err().contains("--snap-provider"));
        for bad in ["0", "31536001", "18446744073709551615"] {
            let args = Args::try_parse_from(["p", "--call-timeout", bad]).unwrap();
            let error = args.resolve().unwrap_err();
            assert!(
                error.contains("--call-timeout must be from 1"),
                "{bad}: {error}"
            );
        }
        // Attached AIO volumes grow only while followed: never off.
        for bad in ["0", "31536001"] {
            let args = Args::try_parse_from(["p", "--aio-follow-period", bad]).unwrap();
            let error = args.resolve().unwrap_err();
            assert!(
                error.contains("--aio-follow-period must be from 1"),
                "{bad}: {error}"
            );
        }
        assert!(Args::try_parse_from(["p", "--log-format", "xml"]).is_err());
    }

    fn csi(args: &[&str]) -> Result<Option<CsiConfig>, String> {
        let mut all = vec!["p"];
        all.extend_from_slice(args);
        Args::try_parse_from(all).unwrap().resolve().map(|c| c.csi)
    }

    #[test]
    fn an_aio_pool_on_one_dpu_is_named_as_the_node_names_it_with_its_host() {
        let base = ["--csi-socket", "/run/csi.sock", "--aio-pool-dir", "/pool"];
        let with = |dpu: &[&str]| csi(&[&base[..], dpu].concat());
        let local = with(&["--aio-dpu", "bf3-b", "--aio-node", "host-1"])
            .unwrap()
            .unwrap();
        assert_eq!(
            local.aio.unwrap().dpu,
            Some(HostDpu {
                name: "bf3-b".into(),
                node_id: "host-1".into()
            })
        );
        for bad in ["", "bf3-", "bf3/b", &"b".repeat(64)] {
            let error = with(&["--aio-dpu", bad, "--aio-node", "host-1"]).unwrap_err();
            assert!(error.contains("--aio-dpu must be"), "{bad:?}: {error}");
            let error = with(&["--aio-dpu", "bf3-b", "--aio-node", bad]).unwrap_err();
            assert!(error.contains("--aio-node must be"), "{bad:?}: {error}");
        }
        // The name alone names a DPU on every host; the host alone, none.
        for half in [["--aio-dpu", "bf3-b"], ["--aio-node", "host-1"]] {
            let error = with(&half).unwrap_err();
            assert!(error.contains("go together"), "{half:?}: {error}");
            let error = csi(&[&["--csi-socket", "/s"][..], &half].concat()).unwrap_err();
            assert!(error.contains("--aio-pool-dir"), "{half:?}: {error}");
        }
    }

    #[test]
    fn the_csi_controller_needs_a_backend_and_whole_nvmf_settings() {
        assert_eq!(csi(&[]).unwrap(), None);
        let aio = csi(&["--csi-socket", "/run/csi.sock", "--aio-pool-dir", "/pool"])
            .unwrap()
            .unwrap();
        assert_eq!(aio.default_backend, Kind::Aio);
        assert_eq!(aio.state_dir, PathBuf::from(DEFAULT_STATE_DIR));
        assert!(aio.nvmf.is_none());
        let nvmf = [
            "--csi-socket",
            "/run/csi.sock",
            "--nvmf-target-socket",
            "/run/target.sock",
            "--nvmf-lvstore",
            "lvs0",
            "--nvmf-listen",
            "127.0.0.1:4420",
        ];
        let both = csi(&[
            &nvmf[..],
            &["--aio-pool-dir", "/pool", "--default-backend", "nvmf"],
        ]
        .concat())
        .unwrap()
        .unwrap();
        assert_eq!(both.default_backend, Kind::Nvmf);
        assert_eq!(
            both.nvmf.unwrap().listen,
            ["127.0.0.1:4420".parse().unwrap()]
        );
        assert!(
            csi(&["--csi-socket", "/s"])
                .unwrap_err()
                .contains("backend")
        );
        assert!(csi(&nvmf[..6]).unwrap_err().contains("--nvmf-listen"));
        assert!(
            csi(&["--csi-socket", "/s", "--aio-pool-dir", "pool"])
                .unwrap_err()
                .contains("absolute")
        );
        assert!(
            csi(&[
                "--csi-socket",
                "/s",
                "--aio-pool-dir",
                "/p",
                "--default-backend",
                "nvmf"
            ])
            .is_err()
        );
        assert!(Args::try_parse_from(["p", "--nvmf-listen", "localhost"]).is_err());
    }

    #[test]
    fn the_target_may_have_several_listeners_of_one_family() {
        let nvmf = |listen: &[&str]| {
            let mut args = vec![
                "--csi-socket",
                "/run/csi.sock",
                "--nvmf-target-socket",
                "/run/target.sock",
                "--nvmf-lvstore",
                "lvs0",
            ];
            for l in listen {
                args.extend(["--nvmf-listen", l]);
            }
            csi(&args).map(|c| c.unwrap().nvmf.unwrap().listen)
        };
        let two = nvmf(&["10.0.0.1:4420", "10.0.0.2:4420"]).unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!(two[1], "10.0.0.2:4420".parse().unwrap());
        // Comma-separated, as the environment variable gives them.
        assert_eq!(nvmf(&["10.0.0.1:4420,10.0.0.2:4420"]).unwrap(), two);
        let v6 = nvmf(&["[fd00::1]:4420", "[fd00::2]:4420"]).unwrap();
        assert_eq!(v6.len(), 2);
        for (bad, says) in [
            (&["10.0.0.1:4420", "10.0.0.1:4420"][..], "twice"),
            (
                &["10.0.0.1:4420", "[fd00::1]:4420"][..],
                "two address families",
            ),
        ] {
            let error = nvmf(bad).unwrap_err();
            assert!(error.contains(says), "{bad:?}: {error}");
        }
        let nine: Vec<String> = (0..9).map(|n| format!("10.0.0.1:{}", 4420 + n)).collect();
        let nine: Vec<&str> = nine.iter().map(String::as_str).collect();
        assert!(nvmf(&nine).unwrap_err().contains("at most 8 paths"));
    }

    #[test]
    fn dpu_plugins_are_named_as_the_node_names_dpus_and_none_is_given_twice() {
        let base = ["--csi-socket", "/run/csi.sock", "--aio-pool-dir", "/pool"];
        let with = |plugins: &[&str]| {
            let mut args = base.to_vec();
            for p in plugins {
                args.extend(["--dpu-plugin", p]);
            }
            csi(&args).map(|c| c.unwrap().dpu_plugins)
        };
        assert!(with(&[]).unwrap().is_empty());
        let plugin = |name: &str, socket: &str| DpuPlugin {
            name: name.into(),
            socket: socket.into(),
        };
        let two = with(&["bf-a=/run/a.sock", "bf-b=/run/b.sock"]).unwrap();
        assert_eq!(
            two,
            [plugin("bf-a", "/run/a.sock"), plugin("bf-b", "/run/b.sock")]
        );
        // Comma-separated, as the environment variable gives them.
        assert_eq!(with(&["bf-a=/run/a.sock,bf-b=/run/b.sock"]).unwrap(), two);
        // Two hosts whose DPUs have one name.
        assert_eq!(
            with(&["host-1/bf3-a=/run/a.sock", "host-2/bf3-a=/run/b.sock"]).unwrap(),
            [
                plugin("host-1/bf3-a", "/run/a.sock"),
                plugin("host-2/bf3-a", "/run/b.sock")
            ]
        );
        for bad in [
            "bf-a",
            "bf/a/b=/run/a.sock",
            "/bf-a=/run/a.sock",
            "host 1/bf-a=/run/a.sock",
            "=/run/a.sock",
            "bf-a=",
        ] {
            let mut args = base.to_vec();
            args.extend(["--dpu-plugin", bad]);
            let mut all = vec!["p"];
            all.extend(args);
            assert!(Args::try_parse_from(all).is_err(), "{bad}");
        }
        for twice in [
            &["bf-a=/run/a.sock", "bf-a=/run/b.sock"][..],
            &["bf-a=/run/a.sock", "bf-b=/run/a.sock"][..],
            &["host-1/bf-a=/run/a.sock", "host-1/bf-a=/run/b.sock"][..],
        ] {
            let error = with(twice).unwrap_err();
            assert!(error.contains("repeat a DPU or a socket"), "{error}");
        }
        let error = csi(&["--dpu-plugin", "bf-a=/run/a.sock"]).unwrap_err();
        assert!(error.contains("needs --csi-socket"), "{error}");
    }

    #[test]
    fn a_controller_with_only_a_share_serves_fs_volumes_by_default() {
        let csi = |args: &[&str]| {
            let mut all = vec!["p", "--csi-socket", "/run/csi.sock"];
            all.extend_from_slice(args);
            Args::try_parse_from(all)
                .unwrap()
                .resolve()
                .map(|c| c.csi.expect("a controller"))
        };
        let config = csi(&["--fs-share", "/share", "--fs-share-capacity", "1000"]).unwrap();
        assert_eq!(config.default_backend, Kind::Fs);
        assert_eq!(
            config.fs,
            Some(crate::csi::FsConfig {
                share: "/share".into(),
                capacity: Some(1000),
            })
        );
        let error = csi(&["--aio-pool-dir", "/pool", "--fs-share-capacity", "1000"]).unwrap_err();
        assert!(
            error.contains("--fs-share-capacity needs --fs-share"),
            "{error}"
        );
        let error = csi(&["--aio-pool-dir", "/pool", "--default-backend", "fs"]).unwrap_err();
        assert!(error.contains("--fs-share"), "{error}");
    }
}
