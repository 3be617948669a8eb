//! The target's listeners: a subsystem listener really listens on its
//! `traddr:trsvcid` (one socket per distinct address, shared by subsystems),
//! so "nothing listens there" and "that NQN is not offered there" fail
//! exactly as with a real target. A connection is a host's handshake (see
//! [`super::wire`]), kept for the life of its controller, or an initiator
//! volume's I/O (see [`super::io`]); either way the target that owns the
//! listener ([`Admit`]) decides.

use std::net::ToSocketAddrs;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::io::BufReader;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use super::conns::{Cut, ListenKey};
use super::io::Gate;
use super::wire::{self, Accepted, ConnectReply, ConnectRequest, read_line, write_json};
use crate::bdev::registry::Bdevs;
use crate::datapath::remote::{IO_PROTO, IoHello};
use crate::datapath::volume::Volume;
use crate::registry::{Cx, Family, Shared};

/// What a listener asks of the target that owns it.
pub(crate) trait Admit: Family {
    /// A host's handshake arrived on listener `key`: admit it or say why
    /// not. Dropping `kick` closes the connection.
    fn connect(
        &mut self,
        key: &ListenKey,
        subnqn: &str,
        hostnqn: &str,
        kick: oneshot::Sender<()>,
        bdevs: &Bdevs,
    ) -> Result<Accepted, String>;

    /// The host's connection closed.
    fn disconnect(&mut self, subnqn: &str, cntlid: u16);

    /// An I/O connection's hello: the namespace's data path volume and the
    /// subsystem's pause gate; the connection is recorded with `cut`, its
    /// mark should its listener go.
    fn open_io(
        &mut self,
        key: &ListenKey,
        hello: &IoHello,
        cut: &Arc<Cut>,
        cx: &Cx<'_>,
    ) -> Result<(Volume, Arc<Gate>), String>;
}

fn gone() -> std::io::Error {
    std::io::Error::from(std::io::ErrorKind::NotConnected)
}

/// A bound listener; dropping the handle does not stop it, `abort` does.
#[derive(Debug)]
pub(crate) struct Listener {
    pub task: tokio::task::AbortHandle,
}

/// Binds `traddr:trsvcid` and serves handshakes on it.
pub(crate) fn listen<T: Admit>(
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
    let task = tokio::spawn(accept_loop::<T>(shared, listener, key)).abort_handle();
    Ok(Listener { task })
}

async fn accept_loop<T: Admit>(shared: Weak<Shared>, listener: TcpListener, key: ListenKey) {
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            // Out of descriptors or similar: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let shared = shared.clone();
        let key = key.clone();
        tokio::spawn(async move {
            if let Err(e) = serve_host::<T>(shared, stream, key).await {
                tracing::debug!("NVMe-oF handshake from {peer} ended: {e}");
            }
        });
    }
}

/// Target side of one connection.
async fn serve_host<T: Admit>(
    shared: Weak<Shared>,
    stream: TcpStream,
    key: ListenKey,
) -> std::io::Result<()> {
    let mut stream = BufReader::new(stream);
    let line = read_line(&mut stream).await?;
    let bad = || std::io::Error::from(std::io::ErrorKind::InvalidData);
    if let Ok(hello) = serde_json::from_str::<IoHello>(&line)
        && hello.proto == IO_PROTO
    {
        return serve_io::<T>(shared, stream, key, hello).await;
    }
    let req: ConnectRequest = serde_json::from_str(&line).map_err(|_| bad())?;
    if req.proto != wire::PROTO {
        return Err(bad());
    }
    let Some(sh) = shared.upgrade() else {
        return Ok(());
    };
    let (kick_tx, kick_rx) = oneshot::channel();
    let outcome = {
        let mut state = sh.state.lock().await;
        let (target, cx) = state.family::<T>().ok_or_else(gone)?;
        target.connect(&key, &req.subnqn, &req.hostnqn, kick_tx, cx.bdevs)
    };
    drop(sh);
    let reply = match &outcome {
        Ok(acc) => ConnectReply {
            proto: wire::PROTO.into(),
            accepted: Some(acc.clone()),
            error: None,
        },
        Err(e) => ConnectReply {
            proto: wire::PROTO.into(),
            accepted: None,
            error: Some(e.clone()),
        },
    };
    let written = write_json(&mut stream, &reply).await;
    if let Ok(acc) = outcome {
        if written.is_ok() {
            wire::hold(&mut stream, kick_rx).await;
        }
        if let Some(sh) = shared.upgrade() {
            let mut state = sh.state.lock().await;
            if let Some((target, _)) = state.family::<T>() {
                target.disconnect(&req.subnqn, acc.cntlid);
            }
        }
    }
    written
}

/// Target side of an I/O connection (see [`super::io`]): the
/// namespace is looked up once, then its frames are served on a thread of
/// their own, since a paused subsystem holds them there.
async fn serve_io<T: Admit>(
    shared: Weak<Shared>,
    mut stream: BufReader<TcpStream>,
    key: ListenKey,
    mut hello: IoHello,
) -> std::io::Result<()> {
    let Some(sh) = shared.upgrade() else {
        return Ok(());
    };
    let cut = Arc::new(Cut::default());
    let opened = {
        let mut state = sh.state.lock().await;
        let (target, cx) = state.family::<T>().ok_or_else(gone)?;
        target.open_io(&key, &hello, &cut, &cx)
    };
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
    tokio::task::spawn_blocking(move || super::io::serve(stream, &volume, &file, &gate, &cut))
        .await
        .map_err(std::io::Error::other)
}
