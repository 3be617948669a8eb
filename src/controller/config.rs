//! Controller proxy settings, layered like the node's: built-in defaults,
//! then a config file, then environment variables and flags (clap).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use config::ConfigError;
use serde::Deserialize;
use tonic::transport::{Channel, Endpoint};

use crate::settings::{defaults_or_file, flags_over, seconds, seconds_flag};

/// Everything the controller proxy can be told.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControllerConfig {
    /// Our CSI socket, where the external-provisioner and the other sidecars call.
    pub endpoint: PathBuf,
    /// The vendor's CSI controller: `unix:///path` or `http://host:port`.
    /// Required; checked by [`VendorEndpoint::parse`].
    pub vendor_endpoint: String,
    /// Upper bound on one forwarded call, retries included; the caller's
    /// deadline shortens it.
    #[serde(with = "seconds")]
    pub call_timeout: Duration,
    /// Reported by GetPluginInfo instead of the vendor's name: the node's
    /// name by default, so that one CSIDriver serves both.
    pub driver_name: String,
    /// Forward capability values a CSI v1.11 client cannot decode
    /// (see [`super::capabilities`]).
    pub forward_newer_capabilities: bool,
    /// Where to serve Prometheus metrics (`/metrics`); none when unset.
    pub metrics_address: Option<std::net::SocketAddr>,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            endpoint: "/csi/csi.sock".into(),
            vendor_endpoint: String::new(),
            call_timeout: Duration::from_secs(120),
            driver_name: crate::DRIVER_NAME.into(),
            forward_newer_capabilities: false,
            metrics_address: None,
        }
    }
}

/// Where the vendor's CSI controller listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VendorEndpoint {
    /// `unix:///path`: a socket shared in the pod.
    Unix(PathBuf),
    /// `http://host:port`: plain gRPC over TCP (no TLS; for a sidecar on
    /// localhost or a trusted network).
    Tcp(String),
}

impl VendorEndpoint {
    pub fn parse(endpoint: &str) -> Result<VendorEndpoint, String> {
        let expected = "expected unix:///absolute/path or http://host:port";
        let parsed = if let Some(path) = endpoint.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(format!("vendor endpoint {endpoint:?}: {expected}"));
            }
            VendorEndpoint::Unix(path.into())
        } else if let Some(authority) = endpoint.strip_prefix("http://") {
            let uri: tonic::transport::Uri = endpoint
                .parse()
                .map_err(|e| format!("vendor endpoint {endpoint:?}: {e}; {expected}"))?;
            // A path would be silently dropped by the channel: refuse it
            // rather than connect somewhere other than what was written.
            if uri.port().is_none() || authority.contains('/') {
                return Err(format!("vendor endpoint {endpoint:?}: {expected}"));
            }
            VendorEndpoint::Tcp(endpoint.to_string())
        } else {
            return Err(format!("vendor endpoint {endpoint:?}: {expected}"));
        };
        // Whatever tonic would refuse when the proxy starts is refused here,
        // with the setting named, so that `channel` cannot fail.
        parsed
            .endpoint()
            .map_err(|e| format!("vendor endpoint {endpoint:?}: {e}; {expected}"))?;
        Ok(parsed)
    }

    fn endpoint(&self) -> Result<Endpoint, tonic::transport::Error> {
        match self {
            VendorEndpoint::Unix(path) => {
                Endpoint::from_shared(format!("unix://{}", path.display()))
            }
            VendorEndpoint::Tcp(uri) => Endpoint::from_shared(uri.clone()),
        }
    }

    /// A channel that connects on first use and again after each break, so
    /// the proxy can start before the vendor and outlive its restarts.
    /// Must be called inside a Tokio runtime: the channel spawns its worker.
    pub fn channel(&self) -> Channel {
        self.endpoint()
            .expect("VendorEndpoint::parse admits only endpoints tonic accepts")
            .connect_lazy()
    }
}

impl fmt::Display for VendorEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VendorEndpoint::Unix(path) => write!(f, "unix://{}", path.display()),
            VendorEndpoint::Tcp(uri) => f.write_str(uri),
        }
    }
}

/// Flags (and their environment variables) for `snap-csi controller`; each
/// one given overrides the config file.
#[derive(Debug, Default, clap::Args)]
pub struct ControllerArgs {
    /// A TOML file with any of the settings below (snake_case keys).
    #[arg(long, env = "SNAP_CSI_CONFIG")]
    pub config: Option<PathBuf>,
    /// Our CSI socket path [default: /csi/csi.sock].
    #[arg(long, env = "SNAP_CSI_ENDPOINT")]
    pub endpoint: Option<PathBuf>,
    /// The vendor's CSI controller: unix:///path or http://host:port (required).
    #[arg(long, env = "SNAP_CSI_VENDOR_ENDPOINT")]
    pub vendor_endpoint: Option<String>,
    /// Seconds one call may take, retries included, when the caller allows
    /// more (or sets no deadline) [default: 120].
    #[arg(long, env = "SNAP_CSI_CALL_TIMEOUT")]
    pub call_timeout: Option<f64>,
    /// CSI driver name to report instead of the vendor's [default: csi.snap-csi.io].
    #[arg(long, env = "SNAP_CSI_DRIVER_NAME")]
    pub driver_name: Option<String>,
    /// Forward capability values that sidecars built on CSI v1.11 cannot
    /// decode (CSI 1.12's GET_SNAPSHOT); dropped otherwise, as such sidecars
    /// crash on them.
    #[arg(long, env = "SNAP_CSI_FORWARD_NEWER_CAPABILITIES")]
    pub forward_newer_capabilities: bool,
    /// Serve Prometheus metrics on this address (e.g. 0.0.0.0:9811).
    #[arg(long, env = "SNAP_CSI_METRICS_ADDRESS")]
    pub metrics_address: Option<std::net::SocketAddr>,
}

impl ControllerArgs {
    /// Defaults, then the config file, then what was given here; a missing
    /// or malformed vendor endpoint is an error here, before anything starts.
    pub fn resolve(&self) -> Result<ControllerConfig, ConfigError> {
        let mut resolved: ControllerConfig = defaults_or_file(self.config.as_deref())?;
        flags_over!(
            self => resolved,
            [endpoint, vendor_endpoint, driver_name],
            optional [metrics_address]
        );
        // A flag can turn forwarding on, not off: absent, the file decides.
        resolved.forward_newer_capabilities |= self.forward_newer_capabilities;
        seconds_flag(
            &mut resolved.call_timeout,
            "call-timeout",
            self.call_timeout,
        )?;
        if resolved.vendor_endpoint.is_empty() {
            return Err(ConfigError::Message(
                "--vendor-endpoint is required (unix:///path or http://host:port)".into(),
            ));
        }
        VendorEndpoint::parse(&resolved.vendor_endpoint).map_err(ConfigError::Message)?;
        if resolved.call_timeout.is_zero() {
            return Err(ConfigError::Message(
                "--call-timeout must be more than zero".into(),
            ));
        }
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
            "controller.toml",
            "vendor_endpoint = \"unix:///run/vendor.sock\"\ncall_timeout = 2.5\ndriver_name = \"from.file\"\n",
        );
        let args = ControllerArgs {
            config: Some(file),
            driver_name: Some("from.flag".into()),
            ..Default::default()
        };
        let config = args.resolve().unwrap();
        assert_eq!(config.vendor_endpoint, "unix:///run/vendor.sock");
        assert_eq!(config.call_timeout, Duration::from_millis(2500));
        assert_eq!(config.driver_name, "from.flag");
        assert_eq!(config.endpoint, PathBuf::from("/csi/csi.sock"));
    }

    #[test]
    fn the_nodes_driver_name_and_csi_v1_11_capabilities_by_default() {
        let args = ControllerArgs {
            vendor_endpoint: Some("unix:///run/vendor.sock".into()),
            ..Default::default()
        };
        let config = args.resolve().unwrap();
        assert_eq!(
            config.driver_name,
            crate::node::NodeConfig::default().driver_name
        );
        assert!(!config.forward_newer_capabilities);

        let (_dir, file) = test_file(
            "controller.toml",
            "vendor_endpoint = \"unix:///x\"\nforward_newer_capabilities = true\n",
        );
        let from_file = ControllerArgs {
            config: Some(file),
            ..Default::default()
        };
        assert!(from_file.resolve().unwrap().forward_newer_capabilities);
        let from_flag = ControllerArgs {
            forward_newer_capabilities: true,
            ..args
        };
        assert!(from_flag.resolve().unwrap().forward_newer_capabilities);
    }

    #[test]
    fn the_vendor_endpoint_is_required_and_checked() {
        assert!(ControllerArgs::default().resolve().is_err());
        for bad in [
            "/run/vendor.sock",
            "unix://run/vendor.sock",
            "tcp://127.0.0.1:5000",
            "http://127.0.0.1",
            "http://127.0.0.1:5000/csi",
            "https://vendor:443",
            "http://vendor host:5000",
        ] {
            let args = ControllerArgs {
                vendor_endpoint: Some(bad.into()),
                ..Default::default()
            };
            assert!(args.resolve().is_err(), "{bad}");
        }
    }

    /// What parses makes a channel without a panic; a socket path may hold
    /// anything a file name can (tonic takes a `unix://` path as it is, not
    /// as a URI).
    #[tokio::test]
    async fn every_endpoint_that_parses_makes_a_channel() {
        for endpoint in [
            "unix:///run/vendor.sock",
            "unix:///run/path with space/vendor.sock",
            "unix:///run/100%/{vendor}.sock",
            "http://127.0.0.1:5000",
            "http://[::1]:5000",
            "http://vendor.example:5000",
        ] {
            let parsed = VendorEndpoint::parse(endpoint).unwrap();
            assert_eq!(parsed.to_string(), endpoint);
            drop(parsed.channel());
        }
    }

    #[test]
    fn unix_and_tcp_endpoints_parse_and_print_as_written() {
        for good in [
            "unix:///run/vendor.sock",
            "http://127.0.0.1:5000",
            "http://vendor:9000",
        ] {
            let endpoint = VendorEndpoint::parse(good).unwrap();
            assert_eq!(endpoint.to_string(), good);
        }
        assert_eq!(
            VendorEndpoint::parse("unix:///run/v.sock").unwrap(),
            VendorEndpoint::Unix("/run/v.sock".into())
        );
    }

    #[test]
    fn an_unknown_key_in_the_file_is_an_error() {
        let (_dir, file) = test_file("controller.toml", "vendor_endpont = \"unix:///x\"\n");
        let args = ControllerArgs {
            config: Some(file),
            vendor_endpoint: Some("unix:///x".into()),
            ..Default::default()
        };
        assert!(args.resolve().is_err());
    }
}
