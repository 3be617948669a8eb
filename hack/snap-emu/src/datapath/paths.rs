//! The paths of one bdev_nvme controller name (SPDK's `nvme_bdev_ctrlr`):
//! every controller attached under the name is a path to the subsystem.
//! The initiator's control plane (`crate::bdev::nvme`) adds and removes them
//! and keeps each controller's connection, setting its state as SPDK's
//! reset and reconnect do; its namespaces' I/O (`super::remote`) reads them
//! to pick a path and waits on them when none is connected.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::Notify;

/// A controller's transport ID (TCP only: the one transport between emulators).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Trid {
    pub adrfam: &'static str,
    pub traddr: String,
    pub trsvcid: String,
    pub subnqn: String,
}

impl Trid {
    /// `nvme_bdev_dump_trid_json`.
    pub(crate) fn json(&self) -> Value {
        json!({
            "trtype": "TCP",
            "adrfam": self.adrfam,
            "traddr": self.traddr,
            "trsvcid": self.trsvcid,
            "subnqn": self.subnqn
        })
    }
}

/// How a controller rides out a lost connection: SPDK's
/// `reconnect_delay_sec`, `ctrlr_loss_timeout_sec` (`None`: -1, for ever)
/// and `fast_io_fail_timeout_sec` (`None`: 0, never).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resilience {
    pub reconnect_delay: Duration,
    pub ctrlr_loss: Option<Duration>,
    pub fast_io_fail: Option<Duration>,
}

impl Resilience {
    /// How long I/O waits for a lost path to come back.
    pub(crate) fn patience(&self) -> Option<Duration> {
        if self.reconnect_delay.is_zero() {
            return Some(Duration::ZERO);
        }
        match (self.fast_io_fail, self.ctrlr_loss) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether reconnecting stops after `lost` (SPDK deletes the
    /// controller once `ctrlr_loss_timeout_sec` has passed; without a delay
    /// it does not reconnect at all).
    pub(crate) fn gives_up(&self, lost: Duration) -> bool {
        self.reconnect_delay.is_zero() || self.ctrlr_loss.is_some_and(|l| lost >= l)
    }
}

/// `nvme_ctrlr_get_state_str` of a controller that is not being deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PathState {
    Enabled,
    Resetting,
    ReconnectIsDelayed,
    Failed,
}

impl PathState {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Enabled => "enabled",
            Self::Resetting => "resetting",
            Self::ReconnectIsDelayed => "reconnect_is_delayed",
            Self::Failed => "failed",
        }
    }
}

/// One controller under the name, as its namespaces' I/O sees it.
#[derive(Debug, Clone)]
pub(crate) struct Path {
    pub id: u64,
    /// The transport IDs: the one in use first, then failover's alternates.
    pub trids: Vec<Trid>,
    pub resilience: Resilience,
    pub cntlid: u16,
    pub state: PathState,
    /// Since when it is not connected, until it is again.
    pub lost_since: Option<Instant>,
    /// Woken when I/O got through on it while it was not connected: its
    /// controller, given up on, tries again.
    pub retry: Arc<Notify>,
}

impl Path {
    pub(crate) fn connected(&self) -> bool {
        self.state == PathState::Enabled
    }

    pub(crate) fn trid(&self) -> &Trid {
        &self.trids[0]
    }
}

/// SPDK's `spdk_bdev_nvme_multipath_policy` with its selector, named as
/// `bdev_nvme_set_multipath_policy` takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum MpPolicy {
    ActivePassive,
    ActiveActive,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Selector {
    RoundRobin,
    QueueDepth,
}

/// A bdev's multipath policy (`bdev_nvme_set_multipath_policy`), shared
/// with the I/O of its data path volumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    pub policy: MpPolicy,
    pub selector: Selector,
    pub rr_min_io: u32,
}

impl Default for Policy {
    /// `nvme_bdev_alloc`'s.
    fn default() -> Self {
        Self {
            policy: MpPolicy::ActivePassive,
            selector: Selector::RoundRobin,
            rr_min_io: u32::MAX,
        }
    }
}

/// The paths under one name, in the order they were attached (SPDK's
/// `io_path_list`, which active_passive prefers from the first).
#[derive(Debug, Default)]
pub(crate) struct Paths {
    inner: Mutex<Inner>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct Inner {
    paths: Vec<Path>,
    /// Bumped at every change: I/O that caches a path drops it then, as
    /// SPDK clears its channels' current path when one connects or fails.
    generation: u64,
    next_id: u64,
    /// The name is gone: waiting I/O gives up.
    detached: bool,
}

/// What the I/O reads of the paths at one instant.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub paths: Vec<Path>,
    pub generation: u64,
    pub detached: bool,
}

impl Paths {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn changed(&self, mut inner: MutexGuard<'_, Inner>) {
        inner.generation += 1;
        drop(inner);
        self.changed.notify_all();
    }

    /// A connected controller joins; its id.
    pub(crate) fn add(&self, trids: Vec<Trid>, resilience: Resilience, cntlid: u16) -> u64 {
        let mut inner = self.lock();
        let id = inner.next_id;
        inner.next_id += 1;
        inner.paths.push(Path {
            id,
            trids,
            resilience,
            cntlid,
            state: PathState::Enabled,
            lost_since: None,
            retry: Arc::default(),
        });
        self.changed(inner);
        id
    }

    pub(crate) fn remove(&self, id: u64) {
        let mut inner = self.lock();
        inner.paths.retain(|p| p.id != id);
        self.changed(inner);
    }

    /// The name is detached: I/O waiting for a path fails.
    pub(crate) fn detach(&self) {
        let mut inner = self.lock();
        inner.detached = true;
        inner.paths.clear();
        self.changed(inner);
    }

    /// A change that leaves the paths as they are but must clear what I/O
    /// cached (a new multipath policy).
    pub(crate) fn touch(&self) {
        self.changed(self.lock());
    }

    pub(crate) fn get(&self, id: u64) -> Option<Path> {
        self.lock().paths.iter().find(|p| p.id == id).cloned()
    }

    /// Changes a path, if it is still there.
    pub(crate) fn update(&self, id: u64, f: impl FnOnce(&mut Path)) -> bool {
        let mut inner = self.lock();
        let Some(path) = inner.paths.iter_mut().find(|p| p.id == id) else {
            return false;
        };
        f(path);
        self.changed(inner);
        true
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let inner = self.lock();
        Snapshot {
            paths: inner.paths.clone(),
            generation: inner.generation,
            detached: inner.detached,
        }
    }

    /// Waits up to `timeout` for a change after `generation`.
    pub(crate) fn wait(&self, generation: u64, timeout: Duration) {
        let inner = self.lock();
        let _ = self
            .changed
            .wait_timeout_while(inner, timeout, |i| i.generation == generation);
    }
}
