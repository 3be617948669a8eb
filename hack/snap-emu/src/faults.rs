//! Faults a test switches on while the emulator runs, through a handle it
//! keeps from the [`Config`](crate::Config): the failures of a real SNAP and
//! host that a client must survive, made on demand and deterministically
//! (nothing here waits for a clock). None of them is a SNAP method: they are
//! not on the wire, so the emulator stays byte-compatible with SPDK.
//!
//! - [`Faults::hold`] / [`Faults::hold_after`]: SNAP keeps its answers (its
//!   RPC thread stuck, or a poll slower than the caller's deadline) until
//!   [`Faults::release`]; requests are read and queued, then answered in order.
//!   [`Faults::held`] counts the requests waiting, so a test knows where a
//!   client stands.
//! - [`Faults::garble`]: every request is answered with bytes that are not
//!   JSON-RPC (another program on SNAP's socket), and the connection closed.
//! - [`Faults::begin_live_update`] / [`Faults::end_live_update`]: the RPC
//!   server goes away (its socket removed, every connection closed, calls in
//!   flight unanswered) and comes back later with everything it held: bdevs,
//!   subsystems, namespaces, controllers, and the host's disks, which stay
//!   attached in between. That is what a SNAP live update keeps (a new SNAP
//!   process takes the controllers over; the host sees no hot-unplug). What
//!   it does not prove: the state is carried in memory, not replayed into a
//!   new process from its configuration, so identifiers such as `ctrl_id`
//!   are kept by construction; and I/O paused or requeued by SNAP during the
//!   switch is not modelled: the kernel serves a direct exposure's loop
//!   device, and the data path keeps serving the others.
//! - [`Faults::miss_discovery`] / [`Faults::rescan`]: the host does not
//!   discover a disk whose namespace UUID (NVMe) or serial (virtio-blk) is
//!   given (a missed AEN, a hot-plug that never happens) until a rescan; SNAP's
//!   own state is unaffected, as SNAP does not know what the host's driver saw.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use tokio::sync::watch;

/// The handle; clones share the faults. The default has none switched on.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    state: watch::Sender<State>,
    /// The host sides of the emulators using these faults, for rescans.
    hosts: Mutex<Vec<Weak<dyn Rescan>>>,
}

#[derive(Debug, Default)]
struct State {
    /// How many more requests are answered before the rest are held; `None`
    /// answers all.
    allowance: Option<u64>,
    /// Requests waiting for a release.
    held: u64,
    garbage: bool,
    /// A live update is under way: the server should be down.
    updating: bool,
    /// The server is down for a live update.
    down: bool,
    /// Disk identities the host does not discover.
    missed: HashSet<String>,
}

/// A host side that looks again for the disks it missed (see
/// [`Faults::rescan`]); the host side registers itself, so that the faults
/// need not know it.
pub(crate) trait Rescan: Send + Sync {
    /// Discovers the missed disks with `identity`.
    fn rescan(self: Arc<Self>, identity: &str);
}

/// What to do with one request.
pub(crate) enum Admit {
    Answer,
    Garbage,
}

/// The bytes a garbled SNAP answers: not JSON, let alone JSON-RPC.
pub(crate) const GARBAGE: &[u8] = b"\x00\xffSSH-2.0-not-json-rpc\r\n";

impl Faults {
    /// Holds every request from now on, until [`Faults::release`].
    pub fn hold(&self) {
        self.hold_after(0);
    }

    /// Answers `count` more requests, then holds the rest until [`Faults::release`].
    pub fn hold_after(&self, count: u64) {
        self.inner.state.send_modify(|s| s.allowance = Some(count));
    }

    /// Answers every held request, in order, and those that follow.
    pub fn release(&self) {
        self.inner.state.send_modify(|s| s.allowance = None);
    }

    /// How many requests are waiting for a release.
    pub fn held(&self) -> u64 {
        self.inner.state.borrow().held
    }

    /// Waits until at least `count` requests are held.
    pub async fn until_held(&self, count: u64) {
        let mut state = self.inner.state.subscribe();
        let _ = state.wait_for(|s| s.held >= count).await;
    }

    /// Answers garbage (and closes the connection) while `on`.
    pub fn garble(&self, on: bool) {
        self.inner.state.send_modify(|s| s.garbage = on);
    }

    /// Takes the RPC server down as a live update does, keeping its state;
    /// returns once its socket is gone and its connections are closed.
    pub async fn begin_live_update(&self) {
        self.inner.state.send_modify(|s| s.updating = true);
        let mut state = self.inner.state.subscribe();
        let _ = state.wait_for(|s| s.down).await;
    }

    /// Brings the RPC server back with the state it had; returns once it
    /// listens again.
    pub async fn end_live_update(&self) {
        self.inner.state.send_modify(|s| s.updating = false);
        let mut state = self.inner.state.subscribe();
        let _ = state.wait_for(|s| !s.down).await;
    }

    /// The host will not discover a disk with this namespace UUID (NVMe,
    /// lowercase and hyphenated) or serial (virtio-blk) until [`Faults::rescan`].
    pub fn miss_discovery(&self, identity: &str) {
        self.inner.state.send_modify(|s| {
            s.missed.insert(identity.to_string());
        });
    }

    /// The host discovers the disks with `identity` that it missed, and any
    /// that appear later.
    pub fn rescan(&self, identity: &str) {
        self.inner.state.send_modify(|s| {
            s.missed.remove(identity);
        });
        let hosts = self
            .inner
            .hosts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for host in hosts.iter().filter_map(Weak::upgrade) {
            host.rescan(identity);
        }
    }

    pub(crate) fn register_host<H: Rescan + 'static>(&self, host: &Arc<H>) {
        let mut hosts = self
            .inner
            .hosts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        hosts.retain(|h| h.strong_count() > 0);
        let host: Weak<H> = Arc::downgrade(host);
        hosts.push(host);
    }

    pub(crate) fn misses(&self, identity: &str) -> bool {
        self.inner.state.borrow().missed.contains(identity)
    }

    /// Waits until a request may be answered (or must be garbled). Safe to
    /// cancel: a request dropped while held no longer counts as held.
    pub(crate) async fn admit(&self) -> Admit {
        let mut changes = self.inner.state.subscribe();
        let mut waiting: Option<HeldRequest<'_>> = None;
        loop {
            let mut admit = None;
            self.inner.state.send_if_modified(|s| {
                if s.garbage {
                    admit = Some(Admit::Garbage);
                    return false;
                }
                match s.allowance {
                    None => {
                        admit = Some(Admit::Answer);
                        false
                    }
                    Some(0) => false,
                    Some(n) => {
                        s.allowance = Some(n - 1);
                        admit = Some(Admit::Answer);
                        true
                    }
                }
            });
            if let Some(admit) = admit {
                return admit;
            }
            if waiting.is_none() {
                self.inner.state.send_modify(|s| s.held += 1);
                waiting = Some(HeldRequest(self));
            }
            if changes.changed().await.is_err() {
                return Admit::Answer;
            }
        }
    }

    /// Waits until a live update begins.
    pub(crate) async fn update_begun(&self) {
        let mut state = self.inner.state.subscribe();
        let _ = state.wait_for(|s| s.updating).await;
    }

    /// Waits until the live update under way ends.
    pub(crate) async fn update_ended(&self) {
        let mut state = self.inner.state.subscribe();
        let _ = state.wait_for(|s| !s.updating).await;
    }

    /// The server says whether it is down for a live update.
    pub(crate) fn set_down(&self, down: bool) {
        self.inner.state.send_modify(|s| s.down = down);
    }
}

/// A request counted as held until dropped (answered or cancelled).
struct HeldRequest<'a>(&'a Faults);

impl Drop for HeldRequest<'_> {
    fn drop(&mut self) {
        self.0.inner.state.send_modify(|s| s.held -= 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(admit: Admit) -> bool {
        matches!(admit, Admit::Answer)
    }

    #[tokio::test]
    async fn held_requests_wait_for_the_release_and_a_cancelled_one_stops_counting() {
        let faults = Faults::default();
        faults.hold_after(2);
        assert!(answered(faults.admit().await));
        assert!(answered(faults.admit().await));
        let first = tokio::spawn({
            let faults = faults.clone();
            async move { answered(faults.admit().await) }
        });
        let cancelled = tokio::spawn({
            let faults = faults.clone();
            async move { answered(faults.admit().await) }
        });
        faults.until_held(2).await;
        cancelled.abort();
        assert!(cancelled.await.unwrap_err().is_cancelled());
        assert_eq!(faults.held(), 1, "an abandoned request is not held");
        faults.release();
        assert!(first.await.unwrap());
        assert_eq!(faults.held(), 0);
        assert!(answered(faults.admit().await), "released for good");
    }

    #[tokio::test]
    async fn garbage_wins_over_holding_and_ends_when_switched_off() {
        let faults = Faults::default();
        faults.hold();
        faults.garble(true);
        assert!(!answered(faults.admit().await));
        faults.garble(false);
        faults.release();
        assert!(answered(faults.admit().await));
    }

    #[test]
    fn a_missed_identity_is_found_again_by_a_rescan() {
        let faults = Faults::default();
        faults.miss_discovery("serial-1");
        assert!(faults.misses("serial-1"));
        assert!(!faults.misses("serial-2"));
        faults.rescan("serial-1");
        assert!(!faults.misses("serial-1"));
    }
}
