//! A scripted JSON-RPC server on a UNIX socket, for the client's tests: the
//! unit tests beside the client and `tests/jsonrpc_faults.rs` both include
//! this file, so the two suites script servers the same way.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::{UnixListener, UnixStream};

pub struct Server {
    _dir: tempfile::TempDir,
    pub socket: PathBuf,
    /// Connections accepted so far.
    pub connections: Arc<AtomicUsize>,
}

/// Runs `script(n, stream)` on the n-th accepted connection (0-based).
pub fn serve<F, Fut>(script: F) -> Server
where
    F: Fn(usize, UnixStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("spdk.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&connections);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(script(n, stream));
        }
    });
    Server {
        _dir: dir,
        socket,
        connections,
    }
}
