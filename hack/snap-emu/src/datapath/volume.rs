//! What one exposure serves through the data path: a [`Volume`] over a
//! bdev's bytes ([`Backing`]), with the [`BdevIo`] of every bdev its I/O
//! passes, a cipher for a crypto bdev and the target of an NVMe-oF one.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::cipher::Cipher;
use super::qos::Qos;
use super::remote::Remote;
use super::stats::{IoKind, IoStats};

/// Where a bdev's bytes live: a byte range of a regular file or block device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backing {
    pub path: PathBuf,
    pub offset: u64,
    pub size: u64,
    pub read_only: bool,
}

/// What an exposure shows the host: a byte range directly, or a [`Volume`]
/// through the emulator's data path.
#[derive(Debug, Clone)]
pub enum Source {
    Direct(Backing),
    DataPath(Arc<Volume>),
}

impl From<Backing> for Source {
    fn from(backing: Backing) -> Self {
        Self::Direct(backing)
    }
}

/// One bdev's share of the data path: its rate limits and its counters.
/// Shared by the bdev and every [`Volume`] it is a layer of, so a limit set
/// by RPC applies at once to I/O in flight through the data path.
#[derive(Debug, Default)]
pub struct BdevIo {
    pub qos: Qos,
    pub stats: IoStats,
}

/// What one exposure serves.
#[derive(Debug)]
pub struct Volume {
    /// The bytes: a range of a file or block device.
    pub backing: Backing,
    /// The exposed bdev's block size (what `stat` shows as the file's block
    /// size, and the unit a cipher works in).
    pub block_size: u32,
    /// The exposed bdev, then each bdev under it.
    pub layers: Vec<Arc<BdevIo>>,
    /// A crypto bdev's cipher: the backing holds its blocks encrypted.
    pub(crate) cipher: Option<Arc<Cipher>>,
    /// An NVMe-oF namespace's target, which serves its bytes (and holds
    /// them while its subsystem is paused) instead of the file.
    pub(crate) remote: Option<Arc<Remote>>,
}

impl Volume {
    /// Whether its I/O must be served one at a time, in order, on the
    /// volume's own thread: rate limits make I/O wait in line, as SPDK
    /// queues it, a cipher's read-modify-writes of partial blocks must not
    /// interleave, and a remote target answers one request at a time and
    /// may hold it (its own limits, a pause).
    pub(crate) fn in_order(&self) -> bool {
        self.cipher.is_some()
            || self.remote.is_some()
            || self.layers.iter().any(|l| l.qos.is_limited())
    }

    /// Takes the QoS quota of a read or write of `bytes` at every layer if
    /// they all have it now; takes nothing otherwise.
    pub(crate) fn try_admit(&self, read: bool, bytes: u64) -> bool {
        for (i, layer) in self.layers.iter().enumerate() {
            if !layer.qos.try_admit(read, bytes) {
                for above in &self.layers[..i] {
                    above.qos.give_back(read, bytes);
                }
                return false;
            }
        }
        true
    }

    /// Waits for the QoS quota of a read or write of `bytes`, in line since
    /// `arrived`, at each layer in turn, as the I/O would queue at each bdev
    /// it passes.
    pub(crate) fn admit(&self, read: bool, bytes: u64, arrived: Instant) {
        for layer in &self.layers {
            layer.qos.admit(read, bytes, arrived);
        }
    }

    /// Does an admitted I/O of `bytes` that arrived at `arrived` (`f`) and
    /// counts it at every layer.
    pub(crate) fn account<T>(
        &self,
        kind: IoKind,
        bytes: u64,
        arrived: Instant,
        f: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<T> {
        let out = f()?;
        let latency = arrived.elapsed();
        for layer in &self.layers {
            layer.stats.record(kind, bytes, latency);
        }
        Ok(out)
    }

    /// Reads `len` bytes at `offset` of the bdev from `file` (its backing,
    /// opened), decrypted; the caller keeps the range inside the bdev.
    pub(crate) fn read(&self, file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let Some(cipher) = &self.cipher else {
            return self.read_raw(file, offset, len);
        };
        let (first, span, skip) = self.blocks(offset, len);
        let mut buf = self.read_raw(file, first * u64::from(self.block_size), span)?;
        cipher.decrypt(first, self.block_size, &mut buf);
        buf.truncate(skip + len);
        buf.drain(..skip);
        Ok(buf)
    }

    /// Writes `data` at `offset` of the bdev, encrypted: whole blocks, a
    /// partial one read, decrypted and merged first.
    pub(crate) fn write(&self, file: &File, offset: u64, data: &[u8]) -> io::Result<()> {
        let Some(cipher) = &self.cipher else {
            return self.write_raw(file, offset, data);
        };
        let (first, span, skip) = self.blocks(offset, data.len());
        let at = first * u64::from(self.block_size);
        let mut buf = if skip == 0 && span == data.len() {
            data.to_vec()
        } else {
            let mut old = self.read_raw(file, at, span)?;
            cipher.decrypt(first, self.block_size, &mut old);
            old[skip..skip + data.len()].copy_from_slice(data);
            old
        };
        cipher.encrypt(first, self.block_size, &mut buf);
        self.write_raw(file, at, &buf)
    }

    /// Writes `len` zeroes at `offset` of a crypto bdev, encrypted as any
    /// write, so that they read back as zeroes: SPDK's crypto vbdev takes no
    /// write-zeroes, and the bdev layer writes zeroes through it instead.
    pub(crate) fn write_zeroes(&self, file: &File, offset: u64, len: u64) -> io::Result<()> {
        const CHUNK: u64 = 1 << 20;
        let zeroes = vec![0; usize::try_from(CHUNK.min(len)).unwrap_or(0)];
        let mut done = 0;
        while done < len {
            let n = CHUNK.min(len - done);
            self.write(file, offset + done, &zeroes[..n as usize])?;
            done += n;
        }
        Ok(())
    }

    /// Writes bytes to the backing as they are (or to the target).
    fn write_raw(&self, file: &File, offset: u64, data: &[u8]) -> io::Result<()> {
        match &self.remote {
            Some(remote) => remote.write(offset, data),
            None => file.write_all_at(data, self.backing.offset + offset),
        }
    }

    /// The whole blocks covering `len` bytes at `offset`: the first block,
    /// their length in bytes, and where the bytes start in them.
    fn blocks(&self, offset: u64, len: usize) -> (u64, usize, usize) {
        let bs = u64::from(self.block_size);
        let first = offset / bs;
        let end = (offset + len as u64).div_ceil(bs);
        let span = usize::try_from((end - first) * bs).unwrap_or(usize::MAX);
        (
            first,
            span,
            usize::try_from(offset - first * bs).unwrap_or(0),
        )
    }

    /// Reads the backing's bytes as they are (or the target's).
    fn read_raw(&self, file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        if let Some(remote) = &self.remote {
            return remote.read(offset, len);
        }
        let mut buf = vec![0; len];
        let mut done = 0;
        while done < len {
            let at = self.backing.offset + offset + done as u64;
            match file.read_at(&mut buf[done..], at) {
                // A file shorter than the bdev reads as zeros past its end.
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(buf)
    }
}
