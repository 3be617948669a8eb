//! The plugin's settings and the binary's flags.

use std::path::PathBuf;
use std::time::Duration;

use snap_csi::dpu::plugin::{PROVIDER_PLACEHOLDER, snap_socket_path};

use crate::service::ServiceConfig;

/// Where DPF looks for this plugin (`plugins/<plugin-name>/dpu.sock`).
pub const DEFAULT_PLUGIN_SOCKET: &str = "/var/lib/nvidia/storage/snap/plugins/spdk/dpu.sock";
/// Where a stock SNAP container serves its JSON-RPC.
pub const DEFAULT_SPDK_SOCKET: &str = "/var/tmp/spdk.sock";

/// Everything a running plugin needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Our gRPC socket.
    pub plugin_socket: PathBuf,
    /// SNAP's SPDK JSON-RPC socket.
    pub spdk_socket: PathBuf,
    pub service: ServiceConfig,
}

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
    version,
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
    /// Log line format (the filter is RUST_LOG, default "info").
    #[arg(long, env = "SPDK_PLUGIN_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl Args {
    /// The configuration these flags give, or why there is none.
    pub fn resolve(&self) -> Result<Config, String> {
        if !self.snap_provider.is_empty() {
            // The node turns the name into a socket path: refuse here what it would refuse.
            snap_socket_path(PROVIDER_PLACEHOLDER, &self.snap_provider)
                .map_err(|e| format!("--snap-provider: {e}"))?;
        }
        if self.call_timeout == 0 {
            return Err("--call-timeout must be at least 1 second".into());
        }
        Ok(Config {
            plugin_socket: self.plugin_socket.clone(),
            spdk_socket: self.spdk_socket.clone(),
            service: ServiceConfig {
                snap_provider: self.snap_provider.clone(),
                call_timeout: Duration::from_secs(self.call_timeout),
            },
        })
    }
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
    }

    #[test]
    fn providers_must_be_plain_names() {
        let args = Args::try_parse_from(["p", "--snap-provider", "acme-snap"]).unwrap();
        assert_eq!(args.resolve().unwrap().service.snap_provider, "acme-snap");
        let args = Args::try_parse_from(["p", "--snap-provider", "../x"]).unwrap();
        assert!(args.resolve().unwrap_err().contains("--snap-provider"));
        let args = Args::try_parse_from(["p", "--call-timeout", "0"]).unwrap();
        assert!(args.resolve().is_err());
        assert!(Args::try_parse_from(["p", "--log-format", "xml"]).is_err());
    }
}
