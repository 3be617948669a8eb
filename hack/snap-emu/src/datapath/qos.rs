//! Rate limits of one bdev, enforced as SPDK's bdev layer does: a quota per
//! 1 ms timeslice for each limit (`limit × 1 ms`, at least 1 I/O or 512
//! bytes), an I/O passes while every quota it touches is still positive and
//! may overrun it (a 1 MiB write under a 1 MiB/s limit passes once, then
//! waits a second), the overrun is carried into the next timeslices, and
//! I/O that finds no quota waits, in order, for the next timeslice.
//!
//! SPDK refills the quotas from a poller every timeslice; here the I/O
//! refills them itself, for as many timeslices as have passed, which comes
//! to the same numbers (`refill`), including SPDK's catching up when its
//! poller runs late: the timeslices that began while an I/O waited in line
//! (asleep, or behind others on a busy machine) are those of a late poller,
//! as SPDK's poller would have given each of them a quota for it.

use std::sync::{Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

/// SPDK_BDEV_QOS_TIMESLICE_IN_USEC.
pub const TIMESLICE: Duration = Duration::from_millis(1);
const SLICES_PER_SEC: u64 = 1000;
/// SPDK_BDEV_QOS_MIN_IO_PER_TIMESLICE and SPDK_BDEV_QOS_MIN_BYTE_PER_TIMESLICE.
const MIN_IOS_PER_SLICE: i64 = 1;
const MIN_BYTES_PER_SLICE: i64 = 512;

/// SPDK's `enum spdk_bdev_qos_rate_limit_type`, in its order, which is also
/// the order `assigned_rate_limits` lists them in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimit {
    RwIops,
    RwBps,
    RBps,
    WBps,
}

impl RateLimit {
    pub const ALL: [RateLimit; 4] = [Self::RwIops, Self::RwBps, Self::RBps, Self::WBps];

    /// The parameter of `bdev_set_qos_limit` and key of `assigned_rate_limits`.
    pub fn rpc_name(self) -> &'static str {
        match self {
            Self::RwIops => "rw_ios_per_sec",
            Self::RwBps => "rw_mbytes_per_sec",
            Self::RBps => "r_mbytes_per_sec",
            Self::WBps => "w_mbytes_per_sec",
        }
    }

    pub fn is_iops(self) -> bool {
        self == Self::RwIops
    }

    /// What an I/O costs against this limit.
    fn cost(self, read: bool, bytes: u64) -> i64 {
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        match self {
            Self::RwIops => 1,
            Self::RwBps => bytes,
            Self::RBps if read => bytes,
            Self::WBps if !read => bytes,
            Self::RBps | Self::WBps => 0,
        }
    }
}

/// One bdev's limits and quotas.
#[derive(Debug)]
pub struct Qos {
    state: Mutex<Buckets>,
}

#[derive(Debug)]
struct Buckets {
    /// Per second (I/Os or bytes), 0 for none, indexed like [`RateLimit::ALL`].
    limits: [u64; 4],
    /// 0 where there is no limit.
    max_per_slice: [i64; 4],
    remaining: [i64; 4],
    /// Start of the current timeslice.
    slice_start: Instant,
}

impl Default for Qos {
    fn default() -> Self {
        Self {
            state: Mutex::new(Buckets {
                limits: [0; 4],
                max_per_slice: [0; 4],
                remaining: [0; 4],
                slice_start: Instant::now(),
            }),
        }
    }
}

impl Qos {
    fn lock(&self) -> std::sync::MutexGuard<'_, Buckets> {
        // Only ever left consistent: a panic elsewhere is no reason to stop.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Per second, 0 for none, in [`RateLimit::ALL`] order.
    pub fn limits(&self) -> [u64; 4] {
        self.lock().limits
    }

    pub fn is_limited(&self) -> bool {
        self.lock().limits.iter().any(|&l| l > 0)
    }

    /// Replaces the limits given (`Some(0)` removes one) and starts every
    /// quota afresh, as `bdev_qos_update_max_quota_per_timeslice` does; I/O
    /// admitted from now on sees the new limits.
    pub fn set(&self, limits: [Option<u64>; 4]) {
        let mut b = self.lock();
        let was_limited = b.limits.iter().any(|&l| l > 0);
        for (i, kind) in RateLimit::ALL.into_iter().enumerate() {
            if let Some(limit) = limits[i] {
                b.limits[i] = limit;
            }
            let per_slice = i64::try_from(b.limits[i] / SLICES_PER_SEC).unwrap_or(i64::MAX);
            let min = if kind.is_iops() {
                MIN_IOS_PER_SLICE
            } else {
                MIN_BYTES_PER_SLICE
            };
            b.max_per_slice[i] = if b.limits[i] == 0 {
                0
            } else {
                per_slice.max(min)
            };
            b.remaining[i] = b.max_per_slice[i];
        }
        if !was_limited {
            b.slice_start = Instant::now();
        }
    }

    /// Takes the I/O's share of the quotas if they have it now; takes
    /// nothing otherwise.
    pub fn try_admit(&self, read: bool, bytes: u64) -> bool {
        let mut b = self.lock();
        b.refill(Instant::now(), false);
        b.try_take(read, bytes)
    }

    /// Gives back what [`try_admit`](Self::try_admit) took (SPDK's rewind,
    /// for an I/O that a bdev below had no quota for yet).
    pub fn give_back(&self, read: bool, bytes: u64) {
        let mut b = self.lock();
        for (i, kind) in RateLimit::ALL.into_iter().enumerate() {
            if b.max_per_slice[i] > 0 {
                b.remaining[i] = b.remaining[i].saturating_add(kind.cost(read, bytes));
            }
        }
    }

    /// Waits until the I/O, in line since `arrived`, fits the quotas, then
    /// takes its share of them.
    pub fn admit(&self, read: bool, bytes: u64, arrived: Instant) {
        loop {
            let mut b = self.lock();
            let now = Instant::now();
            b.refill_waited(arrived, now);
            if b.try_take(read, bytes) {
                return;
            }
            let next = b.slice_start + TIMESLICE;
            drop(b);
            thread::sleep(next.saturating_duration_since(now));
        }
    }
}

impl Buckets {
    /// Brings the quotas to the current timeslice. SPDK's poller, once per
    /// timeslice, drops what is left over (keeping an overrun) and adds a
    /// quota: after `k` timeslices on time that is `min(overrun + k × quota,
    /// quota)`. A poller `late` by `k` timeslices (I/O was waiting for it)
    /// drops the leftover once and adds `k` quotas, so that I/O in line
    /// catches up on the timeslices it missed.
    fn refill(&mut self, now: Instant, late: bool) {
        let elapsed = now.saturating_duration_since(self.slice_start);
        let slices = elapsed.as_nanos() / TIMESLICE.as_nanos();
        if slices == 0 {
            return;
        }
        let k = i64::try_from(slices).unwrap_or(i64::MAX);
        for i in 0..4 {
            let max = self.max_per_slice[i];
            if max > 0 {
                let debt = self.remaining[i].min(0);
                let refilled = debt.saturating_add(k.saturating_mul(max));
                self.remaining[i] = if late { refilled } else { refilled.min(max) };
            }
        }
        let advance = u32::try_from(slices).unwrap_or(u32::MAX);
        self.slice_start += TIMESLICE * advance;
    }

    /// Brings the quotas to `now` for an I/O in line since `arrived`: the
    /// timeslices before it arrived had nothing waiting, those since are a
    /// late poller's.
    fn refill_waited(&mut self, arrived: Instant, now: Instant) {
        self.refill(arrived.min(now), false);
        self.refill(now, true);
    }

    /// `bdev_qos_queue_io`: every applicable quota must still be positive;
    /// one that is not gives back what the others took.
    fn try_take(&mut self, read: bool, bytes: u64) -> bool {
        let costs = RateLimit::ALL.map(|kind| kind.cost(read, bytes));
        let applies = |i: usize| self.max_per_slice[i] > 0 && costs[i] > 0;
        if (0..4).any(|i| applies(i) && self.remaining[i] <= 0) {
            return false;
        }
        for (i, cost) in costs.iter().enumerate() {
            if applies(i) {
                self.remaining[i] = self.remaining[i].saturating_sub(*cost);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buckets(limits: [u64; 4]) -> (Qos, Instant) {
        let q = Qos::default();
        q.set(limits.map(Some));
        let start = q.lock().slice_start;
        (q, start)
    }

    #[test]
    fn an_iops_limit_passes_its_quota_per_timeslice() {
        let (q, t0) = buckets([2000, 0, 0, 0]);
        let mut b = q.lock();
        assert!(b.try_take(true, 4096));
        assert!(b.try_take(false, 4096));
        assert!(!b.try_take(true, 4096));
        b.refill(t0 + TIMESLICE, false);
        assert!(b.try_take(true, 4096));
    }

    #[test]
    fn an_overrun_is_paid_back_in_later_timeslices() {
        // 1 MiB/s is 1048 bytes per timeslice: a 1 MiB write passes, then
        // nothing passes until the overrun is paid back.
        let (q, t0) = buckets([0, 1 << 20, 0, 0]);
        let mut b = q.lock();
        assert!(b.try_take(false, 1 << 20));
        b.refill(t0 + TIMESLICE * 999, true);
        assert!(!b.try_take(false, 512));
        b.refill(t0 + TIMESLICE * 1002, true);
        assert!(b.try_take(false, 512));
    }

    #[test]
    fn idle_time_does_not_bank_quota() {
        let (q, t0) = buckets([1000, 0, 0, 0]);
        let mut b = q.lock();
        b.refill(t0 + Duration::from_secs(5), false);
        assert!(b.try_take(true, 512));
        assert!(!b.try_take(true, 512));
    }

    #[test]
    fn io_that_waited_catches_up_on_the_timeslices_it_missed() {
        let (q, t0) = buckets([1000, 0, 0, 0]);
        let mut b = q.lock();
        assert!(b.try_take(true, 512));
        // Its wake-up came 3 timeslices late: 3 I/Os pass at once.
        b.refill(t0 + TIMESLICE * 3, true);
        assert!((0..3).all(|_| b.try_take(true, 512)));
        assert!(!b.try_take(true, 512));
    }

    #[test]
    fn io_waiting_in_line_catches_up_on_the_timeslices_since_it_arrived() {
        let (q, t0) = buckets([1000, 0, 0, 0]);
        let mut b = q.lock();
        assert!(b.try_take(false, 512));
        // I/O in line since t0 + 1.5 ms; the busy machine gets to it at
        // t0 + 5 ms. The boundary before it arrived was an on-time poller's
        // (nothing waited); the four since, a late poller's, which drops the
        // leftover once and adds a quota for each.
        let arrived = t0 + TIMESLICE + TIMESLICE / 2;
        b.refill_waited(arrived, t0 + TIMESLICE * 5);
        assert!((0..4).all(|_| b.try_take(false, 512)));
        assert!(!b.try_take(false, 512));
        // One that arrives now, after an idle timeslice, finds no bank.
        let now = t0 + TIMESLICE * 7;
        b.refill_waited(now, now);
        assert!(b.try_take(false, 512));
        assert!(!b.try_take(false, 512));
    }

    #[test]
    fn read_and_write_limits_apply_to_their_direction_only() {
        let (q, _) = buckets([0, 0, 0, 1 << 20]);
        let mut b = q.lock();
        assert!(b.try_take(false, 4096));
        assert!(!b.try_take(false, 4096));
        assert!(b.try_take(true, 1 << 30));
    }

    #[test]
    fn a_refused_io_takes_nothing() {
        // The IOPS quota has room, the write quota has none: the IOPS quota
        // must be given back, or reads would starve.
        let (q, _) = buckets([1000, 0, 0, 1 << 20]);
        let mut b = q.lock();
        b.remaining[3] = 0;
        assert!(!b.try_take(false, 4096));
        assert_eq!(b.remaining[0], 1);
        assert!(b.try_take(true, 4096));
    }

    #[test]
    fn what_is_given_back_can_be_taken_again() {
        let (q, _) = buckets([1000, 0, 0, 0]);
        assert!(q.try_admit(false, 4096));
        assert!(!q.try_admit(false, 4096));
        q.give_back(false, 4096);
        assert!(q.try_admit(false, 4096));
    }

    #[test]
    fn removing_every_limit_unlimits() {
        let (q, _) = buckets([1000, 1 << 20, 0, 0]);
        assert!(q.is_limited());
        q.set([Some(0), None, None, None]);
        assert_eq!(q.limits(), [0, 1 << 20, 0, 0]);
        q.set([None, Some(0), None, None]);
        assert!(!q.is_limited());
    }
}
