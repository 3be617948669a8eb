//! Connecting to a peer: one HTTP/2 connection per [`Link`], opened on first
//! use and again after it breaks (tonic's lazy channel), over a UNIX
//! socket, plaintext TCP on loopback, or mutual TLS ([`crate::tls`]) that
//! accepts only a server certificate naming the expected peer, whatever
//! address it was reached at. When this end's certificate files change, the
//! next call opens a new connection with them; calls in flight finish on
//! the old one.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::address::LinkAddress;
use crate::tls::{Reloading, TlsError, TlsFiles, client_config, connect, peer_name};

/// The connection to one peer, and how to open it again.
#[derive(Debug)]
pub struct Link {
    address: LinkAddress,
    transport: Transport,
    endpoint: Endpoint,
    /// The connection and the TLS generation it was opened with.
    channel: Mutex<Option<(u64, Channel)>>,
}

#[derive(Debug, Clone)]
enum Transport {
    Tls {
        host_port: String,
        peer: ServerName<'static>,
        settings: Arc<Reloading<rustls::ClientConfig>>,
    },
    Unix(PathBuf),
    Plaintext(SocketAddr),
}

impl Link {
    /// The link to `address` with `endpoint`'s connection settings (its URI
    /// only fills the `:authority` header: the address decides). Over TLS it
    /// presents `tls`'s certificate and accepts only one naming `peer`; the
    /// files are read now (bad ones are a configuration error). Nothing is
    /// connected until the first call.
    pub fn new(
        address: LinkAddress,
        peer: &str,
        tls: &TlsFiles,
        endpoint: Endpoint,
    ) -> Result<Link, TlsError> {
        let transport = match &address {
            LinkAddress::Tls(host_port) => Transport::Tls {
                host_port: host_port.clone(),
                peer: peer_name(peer)?,
                settings: Arc::new(Reloading::new(tls.clone(), client_config)?),
            },
            LinkAddress::Unix(path) => Transport::Unix(path.clone()),
            LinkAddress::Plaintext(socket) => Transport::Plaintext(*socket),
        };
        Ok(Link {
            address,
            transport,
            endpoint,
            channel: Mutex::new(None),
        })
    }

    pub fn address(&self) -> &LinkAddress {
        &self.address
    }

    /// The current connection, or a new one when this end's TLS files
    /// changed since it was opened. Must be called inside a Tokio runtime:
    /// a new channel spawns its worker.
    pub fn channel(&self) -> Channel {
        let generation = match &self.transport {
            Transport::Tls { settings, .. } => settings.current().0,
            Transport::Unix(_) | Transport::Plaintext(_) => 0,
        };
        let mut slot = self.channel.lock().unwrap_or_else(|e| e.into_inner());
        match slot.as_ref() {
            Some((opened, channel)) if *opened == generation => channel.clone(),
            _ => {
                let channel = self.open();
                *slot = Some((generation, channel.clone()));
                channel
            }
        }
    }

    /// A channel that connects on first use and after each break.
    fn open(&self) -> Channel {
        let endpoint = self.endpoint.clone();
        match self.transport.clone() {
            Transport::Tls {
                host_port,
                peer,
                settings,
            } => endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let (_, config) = settings.current();
                let (host_port, peer) = (host_port.clone(), peer.clone());
                async move {
                    connect::connect(&host_port, peer, config)
                        .await
                        .map(TokioIo::new)
                }
            })),
            Transport::Unix(path) => unix_channel_with(endpoint, path),
            Transport::Plaintext(socket) => {
                endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| async move {
                    let tcp = tokio::net::TcpStream::connect(socket).await?;
                    let _ = tcp.set_nodelay(true);
                    Ok::<_, std::io::Error>(TokioIo::new(tcp))
                }))
            }
        }
    }
}

/// A channel to a UNIX socket, connected on first use and after each break.
/// Must be called inside a Tokio runtime: the channel spawns its worker.
pub fn unix_channel(socket: PathBuf) -> Channel {
    // The URI only fills the :authority header; the connector ignores it.
    unix_channel_with(Endpoint::from_static("http://vendor-plugin"), socket)
}

/// [`unix_channel`] with `endpoint`'s connection settings.
pub fn unix_channel_with(endpoint: Endpoint, socket: PathBuf) -> Channel {
    endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
        let socket = socket.clone();
        async move { UnixStream::connect(socket).await.map(TokioIo::new) }
    }))
}
