//! The emulator's data path: exposed bdevs whose bytes must pass through the
//! emulator (QoS limits to enforce, and, with the lead's crypto, data to
//! encrypt) reach the host as a loop device over a file that the emulator
//! serves itself through FUSE, so that it sees every read and write, rather
//! than a loop device straight over the bdev's backing file.
//!
//! - [`Volume`]: what one exposed bdev's file serves, the bdev's byte range
//!   ([`Backing`]) and its [`BdevIo`] layers: the exposed bdev first, then
//!   each bdev under it. Every I/O waits for the QoS quota of each layer
//!   (`qos`, SPDK's timeslice token buckets) and is counted in each layer's
//!   [`IoStats`] (`stats`), which `bdev_get_iostat` reports, as SPDK counts an
//!   I/O at each bdev it passes.
//! - `fuse`: the FUSE mount (one per host side, `<host state>/datapath`),
//!   one file per exposure, and the crash clean-up of a dead mount.
//! - [`DataPathMode`] and `Emulator::needs_data_path`: which exposures go
//!   through it (`--data-path`). A crypto bdev always does: only the data
//!   path applies its cipher (AES-XTS per block, `crate::crypto`), so the
//!   host reads plaintext while the backing holds ciphertext.
//!
//! Files are opened with FOPEN_DIRECT_IO, so no page cache sits between the
//! loop device and the emulator, and every read reaches it; the loop device
//! runs in direct I/O mode and the mount takes asynchronous direct I/O and
//! parallel direct writes, so the host's queue of I/O reaches the emulator
//! as requests in flight together, as it reaches SPDK.

mod fuse;
mod qos;
mod stats;

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Instant;

pub(crate) use fuse::DataPath;
pub use qos::{Qos, RateLimit, TIMESLICE};
pub use stats::{IoKind, IoSnapshot, IoStats, OpSnapshot};

use crate::bdev::{Bdev, BdevKind};
use crate::crypto::Cipher;
use crate::host::{Backing, Source};
use crate::nvmf_io::Remote;
use crate::rpc::{ENODEV, RpcError};
use crate::state::Emulator;

/// Which exposed bdevs are served through the data path (`--data-path`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DataPathMode {
    /// Those that need it (see `Emulator::needs_data_path`); the rest direct.
    #[default]
    Auto,
    /// Every exposed bdev.
    Fuse,
    /// None but crypto bdevs: loop devices straight over the backing files;
    /// QoS limits are then not enforced.
    Direct,
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
    /// queues it, and a cipher's read-modify-writes of partial blocks must
    /// not interleave.
    fn in_order(&self) -> bool {
        self.cipher.is_some() || self.layers.iter().any(|l| l.qos.is_limited())
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

    /// Waits for the QoS quota of a read or write of `bytes` at each layer
    /// in turn, as the I/O would queue at each bdev it passes.
    pub(crate) fn admit(&self, read: bool, bytes: u64) {
        for layer in &self.layers {
            layer.qos.admit(read, bytes);
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

impl Emulator {
    /// The bdev and every bdev its I/O passes through, top first.
    pub(crate) fn io_layers(&self, bdev: &Bdev) -> Vec<Arc<BdevIo>> {
        let mut layers = vec![Arc::clone(&bdev.io)];
        let under = match &bdev.kind {
            // An lvol's blobstore writes to the bdev under its store.
            BdevKind::Lvol { lvs_uuid, .. } => self
                .lvstores
                .iter()
                .find(|s| s.uuid == *lvs_uuid)
                .and_then(|s| self.bdevs.get(&s.base_bdev)),
            BdevKind::Crypto { base, .. } => self.bdevs.get(base),
            BdevKind::Aio { .. }
            | BdevKind::Malloc { .. }
            | BdevKind::Null { .. }
            | BdevKind::Nvme(_) => None,
        };
        if let Some(base) = under {
            layers.extend(self.io_layers(base));
        }
        layers
    }

    /// Whether an exposure of `bdev` must pass through the emulator in
    /// `auto` mode: some layer has rate limits to enforce.
    fn needs_data_path(&self, bdev: &Bdev) -> bool {
        self.io_layers(bdev).iter().any(|l| l.qos.is_limited())
    }

    /// How an exposure of `bdev` reaches the host; `read_only` adds to the
    /// bdev's own read-only-ness (a read-only virtio-blk controller). A
    /// crypto bdev goes through the data path whatever the mode (directly,
    /// the host would see ciphertext); one whose key is gone is -ENODEV.
    pub(crate) fn host_source(&self, bdev: &Bdev, read_only: bool) -> Result<Source, RpcError> {
        let mut volume = self.volume_of(bdev)?;
        volume.backing.read_only |= read_only;
        let through = volume.cipher.is_some()
            || match self.data_path {
                DataPathMode::Direct => false,
                DataPathMode::Fuse => true,
                DataPathMode::Auto => self.needs_data_path(bdev),
            };
        if !through {
            return Ok(Source::Direct(volume.backing));
        }
        Ok(Source::DataPath(Arc::new(volume)))
    }

    /// What the data path serves for `bdev`: its bytes, layers, cipher,
    /// and for an NVMe-oF namespace its target. A crypto bdev whose key
    /// is gone is -ENODEV.
    pub(crate) fn volume_of(&self, bdev: &Bdev) -> Result<Volume, RpcError> {
        let cipher = match &bdev.kind {
            BdevKind::Crypto { key_name, .. } => Some(
                self.crypto
                    .cipher(key_name)
                    .ok_or(RpcError::errno(ENODEV))?,
            ),
            _ => None,
        };
        Ok(Volume {
            backing: self.backing_of(bdev),
            block_size: bdev.block_size,
            layers: self.io_layers(bdev),
            cipher,
            remote: self.nvme_remote(bdev).map(Arc::new),
        })
    }
}
