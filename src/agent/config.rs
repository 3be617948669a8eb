//! DPU agent settings, layered like the node's: built-in defaults, then a
//! config file, then environment variables and flags (clap).

use std::path::PathBuf;
use std::time::Duration;

use config::ConfigError;
use serde::Deserialize;

use crate::dpu::plugin::DEFAULT_SNAP_SOCKET_TEMPLATE;
use crate::grpc::LinkAddress;
use crate::settings::{defaults_or_file, flags_over, seconds, seconds_flag};
use crate::tls::TlsFiles;

/// The flag that allows plaintext over TCP (loopback only).
pub const INSECURE_FLAG: &str = "--insecure-plaintext";

/// Everything the DPU agent can be told.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// Where the node reaches the agent: `https://ADDR:PORT` (mutual TLS),
    /// `unix:///PATH`, or `http://LOOPBACK-IP:PORT` with `insecure_plaintext`.
    pub listen: String,
    /// Allows `http://` on a loopback address (tests on one machine).
    pub insecure_plaintext: bool,
    /// The one host this agent serves: a node's client certificate must
    /// carry this DNS name. Required with `https://`.
    pub host_name: String,
    /// This agent's certificate and key, and the CA of node certificates.
    pub tls: TlsFiles,
    /// The vendor plugin's socket, beside SNAP.
    pub plugin_socket: PathBuf,
    /// SNAP socket path for a provider name; `{provider}` is replaced.
    pub snap_socket_template: String,
    /// Upper bound on one call when the node sends no deadline.
    #[serde(with = "seconds")]
    pub call_timeout: Duration,
    /// Where to serve Prometheus metrics (`/metrics`); none when unset.
    pub metrics_address: Option<std::net::SocketAddr>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            listen: "https://0.0.0.0:9830".into(),
            insecure_plaintext: false,
            host_name: String::new(),
            tls: TlsFiles::default(),
            plugin_socket: "/var/lib/nvidia/storage/snap/plugins/spdk/dpu.sock".into(),
            snap_socket_template: DEFAULT_SNAP_SOCKET_TEMPLATE.into(),
            call_timeout: Duration::from_secs(120),
            metrics_address: None,
        }
    }
}

impl AgentConfig {
    /// Where to listen, checked.
    pub fn address(&self) -> Result<LinkAddress, String> {
        let address = LinkAddress::parse(&self.listen, self.insecure_plaintext, INSECURE_FLAG)?;
        if matches!(address, LinkAddress::Tls(_)) && self.host_name.is_empty() {
            return Err(format!(
                "--host-name is required with {}: the agent serves exactly one host, and accepts \
                 only a client certificate naming it",
                self.listen
            ));
        }
        Ok(address)
    }
}

/// Flags (and their environment variables) for `snap-csi dpu-agent`; each
/// one given overrides the config file.
#[derive(Debug, Default, clap::Args)]
pub struct AgentArgs {
    /// A TOML file with any of the settings below (snake_case keys; the TLS
    /// files in a `[tls]` table with `cert`, `key`, `ca`).
    #[arg(long, env = "SNAP_CSI_CONFIG")]
    pub config: Option<PathBuf>,
    /// Listen address: https://ADDR:PORT, unix:///PATH, or http://127.0.0.1:PORT with --insecure-plaintext.
    #[arg(long, env = "SNAP_CSI_AGENT_LISTEN")]
    pub listen: Option<String>,
    /// Allow plaintext over TCP on a loopback address (no authentication; tests only).
    #[arg(long, env = "SNAP_CSI_AGENT_INSECURE_PLAINTEXT")]
    pub insecure_plaintext: bool,
    /// The host this agent serves; a node's certificate must name it.
    #[arg(long, env = "SNAP_CSI_AGENT_HOST_NAME")]
    pub host_name: Option<String>,
    /// This agent's certificate chain (PEM).
    #[arg(long, env = "SNAP_CSI_AGENT_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// This agent's private key (PEM).
    #[arg(long, env = "SNAP_CSI_AGENT_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// The CA that signs node certificates (PEM).
    #[arg(long, env = "SNAP_CSI_AGENT_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Vendor plugin socket.
    #[arg(long, env = "SNAP_CSI_PLUGIN_SOCKET")]
    pub plugin_socket: Option<PathBuf>,
    /// SNAP socket template (`{provider}` is replaced by the plugin's provider).
    #[arg(long, env = "SNAP_CSI_SNAP_SOCKET_TEMPLATE")]
    pub snap_socket_template: Option<String>,
    /// Seconds one call may take when the node sends no deadline.
    #[arg(long, env = "SNAP_CSI_CALL_TIMEOUT")]
    pub call_timeout: Option<f64>,
    /// Serve Prometheus metrics on this address (e.g. 0.0.0.0:9831).
    #[arg(long, env = "SNAP_CSI_METRICS_ADDRESS")]
    pub metrics_address: Option<std::net::SocketAddr>,
}

impl AgentArgs {
    /// Defaults, then the config file, then what was given here; checked.
    pub fn resolve(&self) -> Result<AgentConfig, ConfigError> {
        let mut resolved: AgentConfig = defaults_or_file(self.config.as_deref())?;
        flags_over!(
            self => resolved,
            [listen, host_name, plugin_socket, snap_socket_template],
            optional [metrics_address]
        );
        flags_over!(self => resolved.tls, [tls_cert => cert, tls_key => key, tls_ca => ca]);
        resolved.insecure_plaintext |= self.insecure_plaintext;
        seconds_flag(
            &mut resolved.call_timeout,
            "call-timeout",
            self.call_timeout,
        )?;
        resolved.address().map_err(ConfigError::Message)?;
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
            "agent.toml",
            "host_name = \"worker-1\"\ncall_timeout = 30\n[tls]\nca = \"/etc/ca.pem\"\n",
        );
        let args = AgentArgs {
            config: Some(file),
            tls_cert: Some("/flag/cert.pem".into()),
            ..Default::default()
        };
        let config = args.resolve().unwrap();
        assert_eq!(config.host_name, "worker-1");
        assert_eq!(config.call_timeout, Duration::from_secs(30));
        assert_eq!(config.tls.ca, PathBuf::from("/etc/ca.pem"));
        assert_eq!(config.tls.cert, PathBuf::from("/flag/cert.pem"));
        assert_eq!(config.tls.key, TlsFiles::default().key);
        assert_eq!(config.listen, "https://0.0.0.0:9830");
    }

    #[test]
    fn tls_without_a_host_and_plaintext_off_loopback_are_refused() {
        let error = AgentArgs::default().resolve().unwrap_err().to_string();
        assert!(error.contains("--host-name is required"), "{error}");
        let args = AgentArgs {
            listen: Some("http://10.0.0.2:9830".into()),
            insecure_plaintext: true,
            ..Default::default()
        };
        let error = args.resolve().unwrap_err().to_string();
        assert!(error.contains("non-loopback"), "{error}");
        let args = AgentArgs {
            listen: Some("unix:///run/agent.sock".into()),
            ..Default::default()
        };
        assert!(args.resolve().is_ok(), "a UNIX socket needs no host name");
    }
}
