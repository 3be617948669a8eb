//! Serving gRPC on a UNIX socket the way a CSI plugin must (and, for the DPU
//! agent, on any stream of connections).
//!
//! The socket is created with mode 0600 (only kubelet, as root, may talk to
//! us), and appears at its path only with that mode; a stale socket left by
//! a crashed run is removed, but any other file at that path is refused
//! rather than deleted. Shutdown stops accepting new connections and lets
//! calls in flight finish.

use std::future::Future;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::UnixListener;
use tokio_stream::Stream;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;
use tonic::transport::server::Connected;
use tonic::transport::server::Router;
use tower::layer::util::{Identity, Stack};

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{}: exists and is not a socket; refusing to replace it", .0.display())]
    NotASocket(std::path::PathBuf),
    #[error("cannot listen on {}: {source}", path.display())]
    Listen {
        path: std::path::PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("metrics endpoint failed: {source}")]
    Metrics {
        #[source]
        source: io::Error,
    },
}

/// Binds `path` (mode 0600) for `router`, without serving yet.
pub fn bind(path: &Path) -> Result<UnixListener, ServeError> {
    let listen_error = |source| ServeError::Listen {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(listen_error)?;
        }
        Ok(_) => return Err(ServeError::NotASocket(path.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(listen_error(e)),
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(listen_error)?;
    }
    // Made private under a temporary name and only then renamed into place:
    // at its path the socket is never open to others, not for an instant.
    let staged = path.with_file_name(format!(
        ".{}.{}",
        path.file_name()
            .map_or_else(Default::default, |n| n.to_string_lossy()),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&staged);
    let listener = UnixListener::bind(&staged).map_err(listen_error)?;
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&staged, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&staged);
            listen_error(e)
        })?;
    Ok(listener)
}

/// A router whose every call is recorded in [`crate::metrics`].
pub type MeteredRouter = Router<Stack<crate::metrics::GrpcMetricsLayer, Identity>>;

/// A gRPC server that records every call's latency and status code.
pub fn builder() -> Server<Stack<crate::metrics::GrpcMetricsLayer, Identity>> {
    Server::builder().layer(crate::metrics::GrpcMetricsLayer)
}

/// Serves `router` on `listener`, and Prometheus metrics on `metrics` when
/// given (see [`crate::metrics::bind`]), until `shutdown` completes; then
/// removes the socket.
pub async fn serve(
    router: MeteredRouter,
    listener: UnixListener,
    path: &Path,
    metrics: Option<tokio::net::TcpListener>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let served = serve_incoming(router, UnixListenerStream::new(listener), metrics, shutdown).await;
    let _ = std::fs::remove_file(path);
    served
}

/// Serves `router` on the connections `incoming` yields (the DPU agent's
/// TCP or TLS connections), and metrics as [`serve`] does, until `shutdown`.
pub async fn serve_incoming<IO, IE>(
    router: MeteredRouter,
    incoming: impl Stream<Item = Result<IO, IE>>,
    metrics: Option<tokio::net::TcpListener>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError>
where
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IE: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let shutdown = futures::FutureExt::shared(shutdown);
    let (served, metered) = tokio::join!(
        router.serve_with_incoming_shutdown(incoming, shutdown.clone()),
        crate::metrics::serve_optional(metrics, shutdown),
    );
    served?;
    metered.map_err(|source| ServeError::Metrics { source })?;
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
pub async fn termination() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers we can only run until killed.
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_socket_is_private_and_a_stale_one_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/csi.sock");
        let first = bind(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A crashed run leaves its socket behind; the next run takes its place.
        drop(first);
        let second = bind(&path).unwrap();
        assert!(tokio::net::UnixStream::connect(&path).await.is_ok());
        drop(second);
    }

    #[tokio::test]
    async fn a_file_that_is_not_a_socket_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        std::fs::write(&path, b"precious").unwrap();
        let error = bind(&path).unwrap_err();
        assert!(matches!(error, ServeError::NotASocket(_)), "{error}");
        assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    }
}
