//! The NVMe-oF "TCP transport" between emulator instances.
//!
//! This is a control-plane handshake over real TCP with a shared-file data
//! path, NOT NVMe/TCP. A subsystem listener really listens on its
//! `traddr:trsvcid` (one socket per distinct address, shared by subsystems),
//! so "nothing listens there" and "that NQN is not offered there" fail exactly
//! as with a real target. An initiator (`bdev_nvme_attach_controller`) sends
//! one JSON line `{"proto":"snap-emu-nvmf/1","subnqn":...,"hostnqn":...}`;
//! the target answers one JSON line with a controller id and every namespace
//! (NSID, UUID, geometry and the [`Backing`] file range). The initiator's
//! `<name>n<nsid>` bdevs then use that same file, which works because both
//! instances run on one machine. The connection stays open for the life of the
//! controller: the target lists it, and closing either end ends it. A real
//! NVMe/TCP host or target on the other end simply fails the handshake.
//! An initiator's data path volume opens a connection of its own on the
//! same listener for its I/O instead (see [`crate::nvmf_io`]).
//!
//! [`Backing`]: crate::datapath::Backing

use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::sync::Weak;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use crate::datapath::remote::{IO_PROTO, IoHello};
use crate::state::Shared;

pub(crate) const PROTO: &str = "snap-emu-nvmf/1";
/// Bound on the handshake line so a stray client cannot make us buffer forever.
const MAX_LINE: u64 = 1 << 20;
/// How long either side waits for the other's handshake line.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Default connect timeout when the caller gives none.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ConnectRequest {
    pub proto: String,
    pub subnqn: String,
    pub hostnqn: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WireNamespace {
    pub nsid: u32,
    pub uuid: String,
    pub block_size: u32,
    pub num_blocks: u64,
    pub path: PathBuf,
    pub offset: u64,
    pub size: u64,
    pub read_only: bool,
    pub unmap: bool,
    pub copy: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Accepted {
    pub cntlid: u16,
    pub serial_number: String,
    pub model_number: String,
    pub namespaces: Vec<WireNamespace>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ConnectReply {
    pub proto: String,
    pub accepted: Option<Accepted>,
    pub error: Option<String>,
}

/// Why an attach failed, mapped by the caller onto SPDK's errors.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ConnectError {
    /// Nothing answers at that address (SPDK: -19).
    Unreachable,
    /// Something answered but refused or spoke another protocol (SPDK: -5).
    Rejected(String),
}

/// A bound listener; dropping the handle does not stop it, `abort` does.
#[derive(Debug)]
pub(crate) struct Listener {
    pub task: tokio::task::AbortHandle,
}

/// Binds `traddr:trsvcid` and serves handshakes on it.
pub(crate) fn listen(
    shared: Weak<Shared>,
    traddr: &str,
    trsvcid: &str,
) -> std::io::Result<Listener> {
    let port: u16 = trsvcid
        .parse()
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let addr = (traddr, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::AddrNotAvailable))?;
    let std_listener = std::net::TcpListener::bind(addr)?;
    std_listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(std_listener)?;
    let key = (traddr.to_owned(), trsvcid.to_owned());
    let task = tokio::spawn(accept_loop(shared, listener, key)).abort_handle();
    Ok(Listener { task })
}

async fn accept_loop(shared: Weak<Shared>, listener: TcpListener, key: (String, String)) {
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            // Out of descriptors or similar: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let shared = shared.clone();
        let key = key.clone();
        tokio::spawn(async move {
            if let Err(e) = serve_host(shared, stream, key).await {
                tracing::debug!("NVMe-oF handshake from {peer} ended: {e}");
            }
        });
    }
}

async fn read_line(stream: &mut BufReader<TcpStream>) -> std::io::Result<String> {
    let mut line = String::new();
    let mut limited = (&mut *stream).take(MAX_LINE);
    let read = limited.read_line(&mut line);
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, read).await {
        Ok(Ok(0)) => Err(std::io::ErrorKind::UnexpectedEof.into()),
        Ok(Ok(_)) if !line.ends_with('\n') => Err(std::io::ErrorKind::InvalidData.into()),
        Ok(Ok(_)) => Ok(line),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
    }
}

async fn write_json<T: Serialize>(stream: &mut BufReader<TcpStream>, v: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(v).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let w = stream.get_mut().write_all(&line);
    tokio::time::timeout(HANDSHAKE_TIMEOUT, w)
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
}

/// Target side of one connection.
async fn serve_host(
    shared: Weak<Shared>,
    stream: TcpStream,
    key: (String, String),
) -> std::io::Result<()> {
    let mut stream = BufReader::new(stream);
    let line = read_line(&mut stream).await?;
    let bad = || std::io::Error::from(std::io::ErrorKind::InvalidData);
    if let Ok(hello) = serde_json::from_str::<IoHello>(&line)
        && hello.proto == IO_PROTO
    {
        return serve_io(shared, stream, key, hello).await;
    }
    let req: ConnectRequest = serde_json::from_str(&line).map_err(|_| bad())?;
    if req.proto != PROTO {
        return Err(bad());
    }
    let Some(sh) = shared.upgrade() else {
        return Ok(());
    };
    let (kick_tx, kick_rx) = oneshot::channel();
    let outcome = sh
        .state
        .lock()
        .await
        .nvmf_connect(&key, &req.subnqn, &req.hostnqn, kick_tx);
    drop(sh);
    let reply = match &outcome {
        Ok(acc) => ConnectReply {
            proto: PROTO.into(),
            accepted: Some(acc.clone()),
            error: None,
        },
        Err(e) => ConnectReply {
            proto: PROTO.into(),
            accepted: None,
            error: Some(e.clone()),
        },
    };
    let written = write_json(&mut stream, &reply).await;
    if let Ok(acc) = outcome {
        if written.is_ok() {
            hold(&mut stream, kick_rx).await;
        }
        if let Some(sh) = shared.upgrade() {
            sh.state
                .lock()
                .await
                .nvmf_disconnect(&req.subnqn, acc.cntlid);
        }
    }
    written
}

/// Target side of an I/O connection (see [`crate::nvmf_io`]): the
/// namespace is looked up once, then its frames are served on a thread of
/// their own, since a paused subsystem holds them there.
async fn serve_io(
    shared: Weak<Shared>,
    mut stream: BufReader<TcpStream>,
    key: (String, String),
    mut hello: IoHello,
) -> std::io::Result<()> {
    let Some(sh) = shared.upgrade() else {
        return Ok(());
    };
    let opened = sh.state.lock().await.nvmf_io_open(&key, &hello);
    drop(sh);
    let opened = opened.and_then(|(volume, gate)| {
        let b = &volume.backing;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(!b.read_only)
            .open(&b.path)
            .map_err(|e| format!("opening {}: {e}", b.path.display()))?;
        Ok((volume, gate, file))
    });
    hello.error = opened.as_ref().err().cloned();
    write_json(&mut stream, &hello).await?;
    let Ok((volume, gate, file)) = opened else {
        return Ok(());
    };
    let stream = stream.into_inner().into_std()?;
    stream.set_nonblocking(false)?;
    tokio::task::spawn_blocking(move || crate::nvmf_io::serve(stream, &volume, &file, &gate))
        .await
        .map_err(std::io::Error::other)
}

/// Keeps a controller connection until the peer closes it or we are told to drop it.
async fn hold(stream: &mut BufReader<TcpStream>, mut kick: oneshot::Receiver<()>) {
    let mut scratch = [0u8; 512];
    loop {
        tokio::select! {
            _ = &mut kick => return,
            r = stream.read(&mut scratch) => match r {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
        }
    }
}

/// Initiator side: connects and performs the handshake, bounded by `timeout`.
pub(crate) async fn connect(
    traddr: &str,
    trsvcid: &str,
    req: ConnectRequest,
    timeout: Duration,
) -> Result<(TcpStream, Accepted), ConnectError> {
    let port: u16 = trsvcid.parse().map_err(|_| ConnectError::Unreachable)?;
    let host = traddr.to_owned();
    let stream =
        match tokio::time::timeout(timeout, TcpStream::connect((host.as_str(), port))).await {
            Ok(Ok(s)) => s,
            _ => return Err(ConnectError::Unreachable),
        };
    let mut stream = BufReader::new(stream);
    write_json(&mut stream, &req)
        .await
        .map_err(|e| ConnectError::Rejected(e.to_string()))?;
    let line = read_line(&mut stream)
        .await
        .map_err(|e| ConnectError::Rejected(e.to_string()))?;
    let reply: ConnectReply =
        serde_json::from_str(&line).map_err(|e| ConnectError::Rejected(e.to_string()))?;
    if reply.proto != PROTO {
        return Err(ConnectError::Rejected("not an emulator".into()));
    }
    match (reply.accepted, reply.error) {
        (Some(acc), _) => Ok((stream.into_inner(), acc)),
        (None, e) => Err(ConnectError::Rejected(e.unwrap_or_default())),
    }
}

/// Keeps the initiator's end open until the controller is detached.
pub(crate) fn hold_initiator(stream: TcpStream) -> oneshot::Sender<()> {
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let mut stream = BufReader::new(stream);
        hold(&mut stream, rx).await;
    });
    tx
}
