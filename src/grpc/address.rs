//! Addresses of a gRPC link, written the same way by every setting that
//! names one: the DPU agent's `--listen`, the node's `--dpu-endpoint` and
//! the controller proxy's `--vendor-endpoint`.
//!
//! - `https://HOST:PORT`: mutual TLS over TCP, the only way across a network.
//! - `unix:///PATH`: plaintext on a local socket (a DPU that is its own node,
//!   tests): only what can open the socket file can talk.
//! - `http://IP:PORT`: plaintext over TCP, only with the flag whose name says
//!   it is insecure, and only on a loopback address.

use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkAddress {
    /// `HOST:PORT` (a name or an IP; brackets around IPv6).
    Tls(String),
    Unix(PathBuf),
    /// Loopback only.
    Plaintext(SocketAddr),
}

const FORMS: &str = "https://HOST:PORT (mutual TLS), unix:///PATH, or http://LOOPBACK-IP:PORT with the insecure-plaintext flag";

impl LinkAddress {
    /// Parses `address`; `insecure` is the insecure-plaintext flag, named
    /// `flag` in the error.
    pub fn parse(address: &str, insecure: bool, flag: &str) -> Result<LinkAddress, String> {
        let parsed = if let Some(host_port) = address.strip_prefix("https://") {
            // `https://USER:PASSWORD@HOST:PORT` would parse, and be logged
            // (the start line, errors): refused without being echoed. The
            // link authenticates by certificate only.
            if host_port.contains('@') {
                return Err(
                    "an https:// address takes no user or password (the link authenticates by \
                     certificate); expected https://HOST:PORT"
                        .into(),
                );
            }
            let uri: http::Uri = address
                .parse()
                .map_err(|e| format!("{address:?}: {e}; expected {FORMS}"))?;
            if uri.port().is_none() || host_port.contains('/') {
                return Err(format!(
                    "{address:?}: expected https://HOST:PORT, without a path"
                ));
            }
            LinkAddress::Tls(host_port.to_string())
        } else if let Some(path) = address.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(format!("{address:?}: expected unix:///ABSOLUTE/PATH"));
            }
            LinkAddress::Unix(path.into())
        } else if let Some(socket) = address.strip_prefix("http://") {
            if !insecure {
                return Err(format!(
                    "{address:?}: plaintext over TCP would let anyone on the network read and \
                     make its calls; use https:// (mutual TLS), or give {flag} for a loopback test"
                ));
            }
            let socket: SocketAddr = socket
                .parse()
                .map_err(|_| format!("{address:?}: expected http://IP:PORT"))?;
            if !socket.ip().is_loopback() {
                return Err(format!(
                    "{address:?}: {flag} refuses a non-loopback address: plaintext must not leave this machine"
                ));
            }
            LinkAddress::Plaintext(socket)
        } else {
            return Err(format!("{address:?}: expected {FORMS}"));
        };
        if insecure && !matches!(parsed, LinkAddress::Plaintext(_)) {
            return Err(format!(
                "{flag} applies only to an http:// address, not {address:?}"
            ));
        }
        Ok(parsed)
    }
}

impl LinkAddress {
    /// The host of an `https://` address, as written (an IPv6 address
    /// without its brackets): the name a peer's certificate is expected to
    /// carry when no other is configured.
    pub fn tls_host(&self) -> Option<&str> {
        let LinkAddress::Tls(host_port) = self else {
            return None;
        };
        let host = host_port
            .rsplit_once(':')
            .map_or(host_port.as_str(), |(host, _)| host);
        Some(host.trim_start_matches('[').trim_end_matches(']'))
    }
}

impl std::fmt::Display for LinkAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkAddress::Tls(host_port) => write!(f, "https://{host_port}"),
            LinkAddress::Unix(path) => write!(f, "unix://{}", path.display()),
            LinkAddress::Plaintext(socket) => write!(f, "http://{socket}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAG: &str = "--insecure-plaintext";

    #[test]
    fn the_three_forms_parse() {
        assert_eq!(
            LinkAddress::parse("https://dpu-7.example:9830", false, FLAG),
            Ok(LinkAddress::Tls("dpu-7.example:9830".into()))
        );
        assert_eq!(
            LinkAddress::parse("https://[fd00::2]:9830", false, FLAG),
            Ok(LinkAddress::Tls("[fd00::2]:9830".into()))
        );
        assert_eq!(
            LinkAddress::parse("unix:///run/snap-csi/agent.sock", false, FLAG),
            Ok(LinkAddress::Unix("/run/snap-csi/agent.sock".into()))
        );
        assert_eq!(
            LinkAddress::parse("http://127.0.0.1:9830", true, FLAG),
            Ok(LinkAddress::Plaintext("127.0.0.1:9830".parse().unwrap()))
        );
        let shown = LinkAddress::parse("https://10.0.0.2:9830", false, FLAG).unwrap();
        assert_eq!(shown.to_string(), "https://10.0.0.2:9830");
        assert_eq!(shown.tls_host(), Some("10.0.0.2"));
        let v6 = LinkAddress::parse("https://[fd00::2]:9830", false, FLAG).unwrap();
        assert_eq!(v6.tls_host(), Some("fd00::2"));
        let unix = LinkAddress::parse("unix:///x.sock", false, FLAG).unwrap();
        assert_eq!(unix.tls_host(), None);
    }

    #[test]
    fn plaintext_needs_the_flag_and_stays_on_loopback() {
        let error = LinkAddress::parse("http://127.0.0.1:9830", false, FLAG).unwrap_err();
        assert!(error.contains(FLAG), "{error}");
        for remote in [
            "http://10.0.0.2:9830",
            "http://0.0.0.0:9830",
            "http://[fd00::2]:1",
        ] {
            let error = LinkAddress::parse(remote, true, FLAG).unwrap_err();
            assert!(error.contains("non-loopback"), "{remote}: {error}");
        }
        let error = LinkAddress::parse("http://localhost:9830", true, FLAG).unwrap_err();
        assert!(error.contains("IP:PORT"), "{error}");
        let error = LinkAddress::parse("https://10.0.0.2:9830", true, FLAG).unwrap_err();
        assert!(error.contains("applies only"), "{error}");
    }

    /// A socket path is a path, not a URI: a space in it is kept, and the
    /// link connects to it by path (`unix_channel_with`), so nothing later
    /// can refuse or panic on what parsed here.
    #[test]
    fn a_unix_path_is_taken_as_written() {
        assert_eq!(
            LinkAddress::parse("unix:///run/snap csi/agent.sock", false, FLAG),
            Ok(LinkAddress::Unix("/run/snap csi/agent.sock".into()))
        );
        let error = LinkAddress::parse("https://dpu 7:9830", false, FLAG).unwrap_err();
        assert!(error.contains("expected"), "{error}");
    }

    #[test]
    fn malformed_addresses_say_what_is_expected() {
        for bad in [
            "10.0.0.2:9830",
            "https://10.0.0.2",
            "https://10.0.0.2:9830/path",
            "unix://relative.sock",
            "grpc://x:1",
            "",
        ] {
            assert!(LinkAddress::parse(bad, false, FLAG).is_err(), "{bad}");
        }
    }

    /// Credentials in the address would be logged with it: refused, and not
    /// repeated in the error.
    #[test]
    fn user_info_is_refused_without_being_echoed() {
        for bad in ["https://user:s3cret@dpu:9830", "https://s3cret@dpu:9830"] {
            let error = LinkAddress::parse(bad, false, FLAG).unwrap_err();
            assert!(error.contains("no user or password"), "{error}");
            assert!(!error.contains("s3cret"), "{error}");
        }
    }
}
