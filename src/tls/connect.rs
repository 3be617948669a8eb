//! The node's side of a connection: TCP to the agent's address, then the
//! handshake with the current settings, accepting only a certificate that
//! names the DPU the node expects (whatever address it was reached at).
//!
//! With TLS 1.3 the client's handshake ends before the server has checked
//! the client's certificate; an agent that refuses this node answers with an
//! alert that surfaces on the connection's first read, as the failure of the
//! call that opened it.

use std::sync::Arc;

use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// Connects to `address` (`host:port`) and authenticates `name` there.
pub async fn connect(
    address: &str,
    name: ServerName<'static>,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(address).await?;
    let _ = tcp.set_nodelay(true);
    let result = TlsConnector::from(config).connect(name, tcp).await;
    let outcome = if result.is_ok() { "ok" } else { "refused" };
    crate::metrics::observe_handshake("client", outcome);
    result
}
