//! Host I/O as a queue-keeping host does it, with O_DIRECT (so that every
//! byte reaches the device, not the page cache), for the tests that measure
//! a data path's rates: the emulator's and the whole stack's. Std and nix
//! only, so that both test crates include it by path.

#![allow(dead_code)]

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;

const KIB: usize = 1024;

/// A buffer O_DIRECT accepts (4 KiB aligned) of `len` bytes of `byte`.
pub struct Aligned {
    raw: Vec<u8>,
    at: usize,
    len: usize,
}

impl Aligned {
    pub fn new(len: usize, byte: u8) -> Self {
        let mut raw = vec![byte; len + 4 * KIB];
        let at = raw.as_ptr().align_offset(4 * KIB);
        raw[at..at + len].fill(byte);
        Self { raw, at, len }
    }

    pub fn get(&self) -> &[u8] {
        &self.raw[self.at..self.at + self.len]
    }

    pub fn get_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.at..self.at + self.len]
    }
}

pub fn open_direct(dev: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(OFlag::O_DIRECT.bits())
        .open(dev)
        .expect("open the host device with O_DIRECT")
}

/// Writes `size`-byte O_DIRECT writes back to back for `span` from eight
/// threads, as a host keeps a queue of I/O in flight (so that quotas are
/// used as soon as they come, not missed for one writer's turnaround);
/// returns the I/Os done and the time they took.
pub fn write_flat_out(dev: &Path, size: usize, span: Duration) -> (u64, Duration) {
    let start = Instant::now();
    let writers: Vec<_> = (0..8u64)
        .map(|w| {
            let f = open_direct(dev);
            std::thread::spawn(move || {
                let buf = Aligned::new(size, 0x5a);
                let slots = (1 << 20) / size as u64;
                let mut ios = 0;
                while start.elapsed() < span {
                    let at = (w * slots + ios % slots) * size as u64;
                    f.write_all_at(buf.get(), at).unwrap();
                    ios += 1;
                }
                ios
            })
        })
        .collect();
    let ios = writers.into_iter().map(|w| w.join().unwrap()).sum();
    (ios, start.elapsed())
}

pub fn assert_within_10_percent(what: &str, measured: f64, limit: f64) {
    assert!(
        (measured - limit).abs() <= limit * 0.1,
        "{what}: measured {measured:.1}, limit {limit}"
    );
}
