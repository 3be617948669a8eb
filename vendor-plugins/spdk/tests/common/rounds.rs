//! A JSON-RPC proxy in front of any SPDK (a real `spdk_tgt` too) that counts
//! the dependent round trips its clients make, by the emulator's rule
//! (`snap_emu`'s poller): a request's round is one more than the highest
//! round of any reply forwarded before the request was read, on any
//! connection. Requests sent together count once; one sent after a reply
//! counts one more. Exact whatever the timing, as long as requests sent
//! together reach the proxy before the first of their replies comes back
//! (an NVMe-oF attach takes a connection to the target first).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinHandle;

/// The proxy; stops when dropped.
pub struct RoundCounter {
    socket: PathBuf,
    highest: Arc<AtomicU64>,
    task: JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl RoundCounter {
    /// A proxy to the SPDK at `upstream`, listening when this returns.
    pub fn start(upstream: &Path) -> RoundCounter {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("rounds.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let highest = Arc::new(AtomicU64::new(0));
        let replied = Arc::new(AtomicU64::new(0));
        let upstream = upstream.to_path_buf();
        let counted = Arc::clone(&highest);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = UnixStream::connect(&upstream).await.unwrap();
                tokio::spawn(pump(
                    client,
                    server,
                    Arc::clone(&counted),
                    Arc::clone(&replied),
                ));
            }
        });
        RoundCounter {
            socket,
            highest,
            task,
            _dir: dir,
        }
    }

    /// Where clients connect.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The highest round of a request so far.
    pub fn rounds(&self) -> u64 {
        self.highest.load(Ordering::SeqCst)
    }
}

impl Drop for RoundCounter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Complete JSON values at the front of `buffer`, removed from it.
fn values(buffer: &mut Vec<u8>) -> Vec<Value> {
    let mut out = vec![];
    let mut stream = serde_json::Deserializer::from_slice(buffer).into_iter::<Value>();
    let mut used = 0;
    while let Some(Ok(value)) = stream.next() {
        used = stream.byte_offset();
        out.push(value);
    }
    buffer.drain(..used);
    out
}

/// Forwards both ways, numbering each request's round as it is read and
/// raising the replied round as each reply goes back.
async fn pump(
    client: UnixStream,
    server: UnixStream,
    highest: Arc<AtomicU64>,
    replied: Arc<AtomicU64>,
) {
    let rounds: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let requests = {
        let rounds = Arc::clone(&rounds);
        let replied = Arc::clone(&replied);
        async move {
            let (mut buffer, mut chunk) = (vec![], [0u8; 4096]);
            loop {
                let n = client_read.read(&mut chunk).await.unwrap_or(0);
                if n == 0 {
                    return;
                }
                buffer.extend_from_slice(&chunk[..n]);
                for request in values(&mut buffer) {
                    let round = replied.load(Ordering::SeqCst) + 1;
                    highest.fetch_max(round, Ordering::SeqCst);
                    rounds
                        .lock()
                        .unwrap()
                        .insert(request["id"].to_string(), round);
                }
                if server_write.write_all(&chunk[..n]).await.is_err() {
                    return;
                }
            }
        }
    };
    let replies = async move {
        let (mut buffer, mut chunk) = (vec![], [0u8; 4096]);
        loop {
            let n = server_read.read(&mut chunk).await.unwrap_or(0);
            if n == 0 {
                return;
            }
            buffer.extend_from_slice(&chunk[..n]);
            let answered: Vec<u64> = values(&mut buffer)
                .iter()
                .filter_map(|reply| rounds.lock().unwrap().remove(&reply["id"].to_string()))
                .collect();
            // Raised before the reply leaves: a request it lets the client
            // send is read after.
            for round in answered {
                replied.fetch_max(round, Ordering::SeqCst);
            }
            if client_write.write_all(&chunk[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::join!(requests, replies);
}
