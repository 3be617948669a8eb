//! Controller proxy settings, layered like the node's: built-in defaults,
//! then a config file, then environment variables and flags (clap).

use std::path::PathBuf;
use std::time::Duration;

use config::ConfigError;
use serde::Deserialize;
use tonic::transport::Endpoint;

use crate::grpc::{Link, LinkAddress};
use crate::settings::{defaults_or_file, flags_over, seconds, seconds_flag};
use crate::tls::TlsFiles;

/// The flag that allows plaintext to a loopback vendor endpoint.
pub const VENDOR_INSECURE_FLAG: &str = "--vendor-insecure-plaintext";

/// Everything the controller proxy can be told.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControllerConfig {
    /// Our CSI socket, where the external-provisioner and the other sidecars call.
    pub endpoint: PathBuf,
    /// The vendor's CSI controller: `https://HOST:PORT` (mutual TLS),
    /// `unix:///PATH`, or `http://LOOPBACK-IP:PORT` with
    /// `vendor_insecure_plaintext`. Required; checked by
    /// [`ControllerConfig::vendor_link`]. Its calls carry the StorageClass's
    /// secrets: across a network they are authenticated both ways and
    /// private.
    pub vendor_endpoint: String,
    /// The DNS name (or IP) the vendor's server certificate must carry;
    /// empty: the endpoint's host.
    pub vendor_name: String,
    /// Allow plaintext over TCP to a loopback address (no authentication).
    pub vendor_insecure_plaintext: bool,
    /// Our client certificate, its key, and the CA that signs the vendor's
    /// certificate, re-read when they change (as the DPU link's).
    pub vendor_tls: TlsFiles,
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
            vendor_name: String::new(),
            vendor_insecure_plaintext: false,
            vendor_tls: TlsFiles::default(),
            call_timeout: Duration::from_secs(120),
            driver_name: crate::settings::DRIVER_NAME.into(),
            forward_newer_capabilities: false,
            metrics_address: None,
        }
    }
}

impl ControllerConfig {
    /// The vendor's address, checked: `https://` (mutual TLS), a UNIX
    /// socket, or plaintext on loopback with the insecure flag.
    pub fn vendor_link(&self) -> Result<LinkAddress, String> {
        LinkAddress::parse(
            &self.vendor_endpoint,
            self.vendor_insecure_plaintext,
            VENDOR_INSECURE_FLAG,
        )
        .map_err(|e| format!("--vendor-endpoint {e}"))
    }

    /// The name the vendor's server certificate must carry: the configured
    /// one, else the endpoint's host.
    pub fn vendor_peer_name(&self, link: &LinkAddress) -> String {
        match (self.vendor_name.as_str(), link.tls_host()) {
            ("", Some(host)) => host.to_string(),
            (name, _) => name.to_string(),
        }
    }

    /// The link to the vendor, connected on first use and again after each
    /// break, so that the proxy can start before the vendor and outlive its
    /// restarts. Over TLS its certificate files are read now (bad ones are
    /// a configuration error) and followed afterwards.
    pub fn vendor(&self) -> Result<Link, String> {
        let link = self.vendor_link()?;
        let peer = self.vendor_peer_name(&link);
        // The URI only fills the :authority header; the address decides.
        let endpoint = Endpoint::from_static("http://vendor-csi-controller");
        Link::new(link, &peer, &self.vendor_tls, endpoint)
            .map_err(|e| format!("--vendor-tls-*: {e}"))
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
    /// The vendor's CSI controller (required): https://HOST:PORT (mutual
    /// TLS), unix:///PATH, or http://LOOPBACK-IP:PORT with
    /// --vendor-insecure-plaintext.
    #[arg(long, env = "SNAP_CSI_VENDOR_ENDPOINT")]
    pub vendor_endpoint: Option<String>,
    /// The name the vendor's server certificate must carry (default: the
    /// endpoint's host).
    #[arg(long, env = "SNAP_CSI_VENDOR_NAME")]
    pub vendor_name: Option<String>,
    /// Allow a plaintext http://LOOPBACK-IP:PORT vendor endpoint (no
    /// authentication; refuses any other address).
    #[arg(long, env = "SNAP_CSI_VENDOR_INSECURE_PLAINTEXT")]
    pub vendor_insecure_plaintext: bool,
    /// The proxy's client certificate chain for the vendor (PEM).
    #[arg(long, env = "SNAP_CSI_VENDOR_TLS_CERT")]
    pub vendor_tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, env = "SNAP_CSI_VENDOR_TLS_KEY")]
    pub vendor_tls_key: Option<PathBuf>,
    /// The CA that signs the vendor's server certificate (PEM).
    #[arg(long, env = "SNAP_CSI_VENDOR_TLS_CA")]
    pub vendor_tls_ca: Option<PathBuf>,
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
            [endpoint, vendor_endpoint, vendor_name, driver_name],
            optional [metrics_address]
        );
        flags_over!(self => resolved.vendor_tls, [vendor_tls_cert => cert, vendor_tls_key => key, vendor_tls_ca => ca]);
        resolved.vendor_insecure_plaintext |= self.vendor_insecure_plaintext;
        // A flag can turn forwarding on, not off: absent, the file decides.
        resolved.forward_newer_capabilities |= self.forward_newer_capabilities;
        seconds_flag(
            &mut resolved.call_timeout,
            "call-timeout",
            self.call_timeout,
        )?;
        if resolved.vendor_endpoint.is_empty() {
            return Err(ConfigError::Message(
                "--vendor-endpoint is required (https://HOST:PORT or unix:///PATH)".into(),
            ));
        }
        let link = resolved.vendor_link().map_err(ConfigError::Message)?;
        if matches!(link, LinkAddress::Tls(_)) {
            crate::tls::peer_name(&resolved.vendor_peer_name(&link))
                .map_err(|e| ConfigError::Message(format!("--vendor-name: {e}")))?;
        }
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
            "https://vendor:443/csi",
            "https://vendor",
            "http://vendor host:5000",
        ] {
            let args = ControllerArgs {
                vendor_endpoint: Some(bad.into()),
                ..Default::default()
            };
            assert!(args.resolve().is_err(), "{bad}");
        }
    }

    /// Secrets cross this link: plaintext only where nothing else can read
    /// it, and only when asked for by name.
    #[test]
    fn plaintext_to_the_vendor_needs_the_flag_and_loopback() {
        let resolve = |endpoint: &str, insecure: bool| {
            ControllerArgs {
                vendor_endpoint: Some(endpoint.into()),
                vendor_insecure_plaintext: insecure,
                ..Default::default()
            }
            .resolve()
            .map(|_| ())
            .map_err(|e| e.to_string())
        };
        let error = resolve("http://10.0.0.7:5000", false).unwrap_err();
        assert!(error.contains("https://"), "{error}");
        let error = resolve("http://10.0.0.7:5000", true).unwrap_err();
        assert!(error.contains("non-loopback"), "{error}");
        let error = resolve("http://127.0.0.1:5000", false).unwrap_err();
        assert!(error.contains(VENDOR_INSECURE_FLAG), "{error}");
        resolve("http://127.0.0.1:5000", true).unwrap();
        resolve("http://[::1]:5000", true).unwrap();
        resolve("unix:///run/vendor.sock", false).unwrap();
        resolve("https://vendor.example:5000", false).unwrap();
    }

    #[test]
    fn the_vendors_certificate_name_is_the_hosts_unless_given() {
        let args = ControllerArgs {
            vendor_endpoint: Some("https://10.0.0.7:5000".into()),
            vendor_tls_ca: Some("/flag/ca.pem".into()),
            ..Default::default()
        };
        let config = args.resolve().unwrap();
        let link = config.vendor_link().unwrap();
        assert_eq!(config.vendor_peer_name(&link), "10.0.0.7");
        assert_eq!(config.vendor_tls.ca, PathBuf::from("/flag/ca.pem"));
        let named = ControllerArgs {
            vendor_name: Some("csi.vendor.example".into()),
            ..args
        };
        let config = named.resolve().unwrap();
        assert_eq!(config.vendor_peer_name(&link), "csi.vendor.example");
        let bad = ControllerArgs {
            vendor_name: Some("not a name".into()),
            ..named
        };
        assert!(bad.resolve().is_err());
    }

    /// What parses makes a link without a panic; a socket path may hold
    /// anything a file name can (it is connected to by path, not as a URI).
    #[tokio::test]
    async fn every_endpoint_that_parses_makes_a_channel() {
        for endpoint in [
            "unix:///run/vendor.sock",
            "unix:///run/path with space/vendor.sock",
            "unix:///run/100%/{vendor}.sock",
            "http://127.0.0.1:5000",
            "http://[::1]:5000",
        ] {
            let config = ControllerConfig {
                vendor_endpoint: endpoint.into(),
                vendor_insecure_plaintext: endpoint.starts_with("http://"),
                ..Default::default()
            };
            let link = config.vendor().unwrap();
            assert_eq!(link.address().to_string(), endpoint);
            drop(link.channel());
        }
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
