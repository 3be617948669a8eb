//! The agent's listener: accepted TCP connections become authenticated TLS
//! connections for tonic. Each handshake runs in its own task with a time
//! limit, so a slow or hostile client never holds up another; a refused one
//! is logged once, with the peer and the reason.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::Reloading;

/// A handshake must be done within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a refused node is given to read why and hang up.
const LINGER: Duration = Duration::from_secs(1);

/// One authenticated connection.
#[derive(Debug)]
pub struct TlsConnection {
    stream: TlsStream<TcpStream>,
    local: Option<SocketAddr>,
    remote: SocketAddr,
}

/// Authenticated connections on `listener`, until the stream is dropped.
/// `host` is the host this agent serves, for the refusal's log line.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<Reloading<rustls::ServerConfig>>,
    host: String,
) -> impl Stream<Item = Result<TlsConnection, std::io::Error>> {
    let (ready, accepted) = mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let (tcp, remote) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of descriptors, say: wait rather than spin.
                        tracing::warn!("accepting a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = ready.closed() => return,
            };
            let _ = tcp.set_nodelay(true);
            let local = tcp.local_addr().ok();
            let (_, config) = tls.current();
            let (ready, host) = (ready.clone(), host.clone());
            tokio::spawn(async move {
                let handshake = TlsAcceptor::from(config).accept(tcp).into_fallible();
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                    Ok(Ok(stream)) => {
                        crate::metrics::observe_handshake("server", "ok");
                        let connection = TlsConnection {
                            stream,
                            local,
                            remote,
                        };
                        let _ = ready.send(Ok(connection)).await;
                    }
                    // A TCP check (a port probe, a load balancer) says nothing.
                    Ok(Err((e, _))) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        tracing::debug!(peer = %remote, "a connection closed before its TLS handshake");
                    }
                    Ok(Err((e, tcp))) => {
                        crate::metrics::observe_handshake("server", "refused");
                        tracing::warn!(peer = %remote, "refused a node's connection: {e} (this agent serves host {host})");
                        close_gently(tcp).await;
                    }
                    Err(_) => {
                        crate::metrics::observe_handshake("server", "timeout");
                        tracing::warn!(peer = %remote, "refused a connection: no TLS handshake within {HANDSHAKE_TIMEOUT:?}");
                    }
                }
            });
        }
    });
    ReceiverStream::new(accepted)
}

/// Closes a refused connection so that the node reads the TLS alert saying
/// why: in TLS 1.3 the node has already sent more by the time we refuse, and
/// closing with that unread would reset the connection and lose the alert.
async fn close_gently(mut tcp: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = tcp.shutdown().await;
    let mut unread = [0u8; 1024];
    let _ = tokio::time::timeout(LINGER, async {
        while matches!(tcp.read(&mut unread).await, Ok(n) if n > 0) {}
    })
    .await;
}

impl Connected for TlsConnection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        TcpConnectInfo {
            local_addr: self.local,
            remote_addr: Some(self.remote),
        }
    }
}

impl AsyncRead for TlsConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
