//! jsonrpsee transport over a UNIX stream socket with JSON-value framing.

use std::path::Path;

use jsonrpsee::core::client::{ReceivedMessage, TransportReceiverT, TransportSenderT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use super::framing::{FramingError, JsonFramer};

/// Why the connection can no longer carry calls.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
    #[error("server closed the connection")]
    Closed,
    #[error("server closed the connection in the middle of a reply ({0} bytes received)")]
    Truncated(usize),
    #[error(transparent)]
    Framing(#[from] FramingError),
}

/// Opens a connection and splits it into jsonrpsee's sender and receiver halves.
pub async fn connect(socket: &Path) -> std::io::Result<(Sender, Receiver)> {
    let stream = UnixStream::connect(socket).await?;
    let (read, write) = stream.into_split();
    Ok((
        Sender { write },
        Receiver {
            read,
            framer: JsonFramer::default(),
            chunk: vec![0; READ_CHUNK],
        },
    ))
}

/// Big enough that a typical list reply arrives in one read.
const READ_CHUNK: usize = 64 * 1024;

#[derive(Debug)]
pub struct Sender {
    write: OwnedWriteHalf,
}

impl TransportSenderT for Sender {
    type Error = TransportError;

    async fn send(&mut self, msg: String) -> Result<(), Self::Error> {
        self.write.write_all(msg.as_bytes()).await?;
        Ok(())
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.write.shutdown().await?;
        Ok(())
    }
}

#[derive(Debug)]
pub struct Receiver {
    read: OwnedReadHalf,
    framer: JsonFramer,
    chunk: Vec<u8>,
}

impl TransportReceiverT for Receiver {
    type Error = TransportError;

    async fn receive(&mut self) -> Result<ReceivedMessage, Self::Error> {
        loop {
            if let Some(value) = self.framer.next_value()? {
                return Ok(ReceivedMessage::Bytes(value));
            }
            let n = self.read.read(&mut self.chunk).await?;
            if n == 0 {
                return Err(match self.framer.pending() {
                    0 => TransportError::Closed,
                    partial => TransportError::Truncated(partial),
                });
            }
            self.framer.extend(&self.chunk[..n]);
        }
    }
}
