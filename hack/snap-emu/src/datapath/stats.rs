//! Per-bdev I/O counters of the data path, in the shape of SPDK's
//! `spdk_bdev_io_stat` (bytes, operations, latency ticks with their max and min).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The tick rate `bdev_get_iostat` reports (a 2.3 GHz TSC, as on the capture host).
pub(crate) const TICK_RATE: u64 = 2_300_000_000;

/// Which counters an I/O lands in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoKind {
    Read,
    Write,
    Unmap,
}

/// Counters of one bdev, updated by the data path's threads without a lock.
#[derive(Debug, Default)]
pub struct IoStats {
    read: OpStats,
    write: OpStats,
    unmap: OpStats,
}

#[derive(Debug)]
struct OpStats {
    bytes: AtomicU64,
    ops: AtomicU64,
    ticks: AtomicU64,
    max_ticks: AtomicU64,
    /// `u64::MAX` until the first I/O, as in SPDK.
    min_ticks: AtomicU64,
}

impl Default for OpStats {
    fn default() -> Self {
        Self {
            bytes: AtomicU64::new(0),
            ops: AtomicU64::new(0),
            ticks: AtomicU64::new(0),
            max_ticks: AtomicU64::new(0),
            min_ticks: AtomicU64::new(u64::MAX),
        }
    }
}

/// What one kind of I/O added up to; `min_ticks` is 0 before the first I/O,
/// as `spdk_bdev_dump_io_stat_json` prints it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct OpSnapshot {
    pub bytes: u64,
    pub ops: u64,
    pub ticks: u64,
    pub max_ticks: u64,
    pub min_ticks: u64,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IoSnapshot {
    pub read: OpSnapshot,
    pub write: OpSnapshot,
    pub unmap: OpSnapshot,
}

/// A duration in the ticks `bdev_get_iostat` reports.
pub(crate) fn ticks(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().saturating_mul(u128::from(TICK_RATE)) / 1_000_000_000)
        .unwrap_or(u64::MAX)
}

impl IoStats {
    /// Counts one completed I/O of `bytes` that took `latency` from its
    /// arrival (QoS queueing included, as SPDK measures from submission).
    pub fn record(&self, kind: IoKind, bytes: u64, latency: Duration) {
        let op = match kind {
            IoKind::Read => &self.read,
            IoKind::Write => &self.write,
            IoKind::Unmap => &self.unmap,
        };
        let t = ticks(latency);
        op.bytes.fetch_add(bytes, Ordering::Relaxed);
        op.ops.fetch_add(1, Ordering::Relaxed);
        op.ticks.fetch_add(t, Ordering::Relaxed);
        op.max_ticks.fetch_max(t, Ordering::Relaxed);
        op.min_ticks.fetch_min(t, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> IoSnapshot {
        IoSnapshot {
            read: self.read.snapshot(),
            write: self.write.snapshot(),
            unmap: self.unmap.snapshot(),
        }
    }
}

impl OpStats {
    fn snapshot(&self) -> OpSnapshot {
        let min = self.min_ticks.load(Ordering::Relaxed);
        OpSnapshot {
            bytes: self.bytes.load(Ordering::Relaxed),
            ops: self.ops.load(Ordering::Relaxed),
            ticks: self.ticks.load(Ordering::Relaxed),
            max_ticks: self.max_ticks.load(Ordering::Relaxed),
            min_ticks: if min == u64::MAX { 0 } else { min },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_extremes() {
        let s = IoStats::default();
        assert_eq!(s.snapshot(), IoSnapshot::default());
        s.record(IoKind::Write, 4096, Duration::from_micros(10));
        s.record(IoKind::Write, 512, Duration::from_micros(30));
        let w = s.snapshot().write;
        assert_eq!((w.bytes, w.ops), (4608, 2));
        assert_eq!(w.min_ticks, ticks(Duration::from_micros(10)));
        assert_eq!(w.max_ticks, ticks(Duration::from_micros(30)));
        assert_eq!(w.ticks, w.min_ticks + w.max_ticks);
        assert_eq!(s.snapshot().read, OpSnapshot::default());
    }
}
