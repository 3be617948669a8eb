//! The NVMe-oF "TCP transport" between emulator instances, as both ends
//! speak it: the handshake's messages and the initiator's side of it, and
//! the names both ends spell alike.
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
//! controller: the target lists it, and closing either end ends it (the
//! initiator then reconnects as its policy says, see `crate::bdev::nvme`);
//! the initiator sends a keep-alive byte on it every half KATO, which the
//! target reads and drops.
//! A real NVMe/TCP host or target on the other end simply fails the handshake.
//! An initiator's data path volume opens a connection of its own on the
//! same listener for its I/O instead (see [`crate::datapath::remote`]).
//! The target's listeners are `super::listener`.
//!
//! [`Backing`]: crate::datapath::Backing

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use crate::datapath::paths::{self, AckTimeout};

pub(crate) const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

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

/// `spdk_nvme_transport_id_parse_adrfam`, which the target and the initiator
/// share: any case in, SPDK's spelling out.
pub(crate) fn adrfam_name(s: &str) -> Option<&'static str> {
    match s.to_ascii_lowercase().as_str() {
        "ipv4" => Some("IPv4"),
        "ipv6" => Some("IPv6"),
        "ib" => Some("IB"),
        "fc" => Some("FC"),
        "intra_host" => Some("INTRA_HOST"),
        _ => None,
    }
}

pub(crate) async fn read_line(stream: &mut BufReader<TcpStream>) -> std::io::Result<String> {
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

pub(crate) async fn write_json<T: Serialize>(
    stream: &mut BufReader<TcpStream>,
    v: &T,
) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(v).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let w = stream.get_mut().write_all(&line);
    tokio::time::timeout(HANDSHAKE_TIMEOUT, w)
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
}

/// Keeps a controller connection until the peer closes it or we are told to drop it.
pub(crate) async fn hold(stream: &mut BufReader<TcpStream>, mut kick: oneshot::Receiver<()>) {
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

/// Initiator side: connects (the socket with the controller's
/// `transport_ack_timeout`) and performs the handshake, bounded by `timeout`.
pub(crate) async fn connect(
    traddr: &str,
    trsvcid: &str,
    req: ConnectRequest,
    timeout: Duration,
    ack: AckTimeout,
) -> Result<(TcpStream, Accepted), ConnectError> {
    let port: u16 = trsvcid.parse().map_err(|_| ConnectError::Unreachable)?;
    // Each address in turn, as `TcpStream::connect` (and SPDK's posix sock).
    let connected = async {
        let mut last = std::io::Error::from(std::io::ErrorKind::AddrNotAvailable);
        for addr in tokio::net::lookup_host((traddr, port)).await? {
            match paths::connect_async(addr, ack).await {
                Ok(stream) => return Ok(stream),
                Err(e) => last = e,
            }
        }
        Err(last)
    };
    let stream = match tokio::time::timeout(timeout, connected).await {
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
