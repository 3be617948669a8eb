//! Host I/O as a queue-keeping host does it, with O_DIRECT (so that every
//! byte reaches the device, not the page cache), for the tests that measure
//! a data path's rates: the emulator's and the whole stack's. Std and nix
//! only, so that both test crates include it by path.

#![allow(dead_code)]

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// How many `size`-byte O_DIRECT writes a second `writers` threads get
/// through `dev`, writing back to back (each in a MiB of its own), as a
/// host keeps a queue of I/O in flight: counted over `window` once they
/// have run for `warmup`, so that the rate is the steady one, not a short
/// run's start and end, and a loaded machine slows the writers without
/// moving the figure while they still keep the device busy.
pub fn steady_write_rate(
    dev: &Path,
    size: usize,
    writers: u64,
    warmup: Duration,
    window: Duration,
) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..writers)
        .map(|w| {
            let f = open_direct(dev);
            let (done, stop) = (Arc::clone(&done), Arc::clone(&stop));
            std::thread::spawn(move || {
                let buf = Aligned::new(size, 0x5a);
                let slots = (1 << 20) / size as u64;
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let at = (w * slots + n % slots) * size as u64;
                    f.write_all_at(buf.get(), at).unwrap();
                    done.fetch_add(1, Ordering::Relaxed);
                    n += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(warmup);
    let (before, start) = (done.load(Ordering::Relaxed), Instant::now());
    std::thread::sleep(window);
    let (after, end) = (done.load(Ordering::Relaxed), Instant::now());
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    (after - before) as f64 / (end - start).as_secs_f64()
}

/// What a rate limit promises: never above it (10% for a counting
/// window's edges). Reaching it is the machine's part: a loaded one offers
/// less, so the rate is reported, and only one under a quarter of the
/// limit fails (a limit applied in another unit is a thousand times off).
pub fn assert_limit_held(what: &str, measured: f64, limit: f64) {
    println!(
        "{what}: {measured:.1} under a limit of {limit} ({:.0}% of it)",
        measured / limit * 100.0
    );
    assert!(
        measured <= limit * 1.1,
        "{what}: measured {measured:.1}, above the limit {limit}"
    );
    assert!(
        measured >= limit / 4.0,
        "{what}: measured {measured:.1}, not a quarter of the limit {limit}: \
         a limit applied in another unit?"
    );
}
