//! What the run counts: operations that converged, faults injected, data that
//! came back wrong, I/O refused while a volume's device was gone (a pod
//! restart then finds its data: expected, counted), calls that never
//! converged, leaks found by the census, and shortfalls (what the run
//! promised and did not do: a fault that could not be injected, a kind of
//! fault that never fired, a kill-trial cell without a landed kill);
//! with the codes the stack answered on the way, for the round's summary.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Tally {
    operations: AtomicU64,
    faults: AtomicU64,
    data_errors: AtomicU64,
    refused: AtomicU64,
    stuck: AtomicU64,
    leaks: AtomicU64,
    shortfalls: AtomicU64,
    /// Faults by kind, and failed attempts by call and code, each with the
    /// first message seen.
    detail: Mutex<BTreeMap<String, (u64, String)>>,
    /// Faults by kind over the whole run, for the last lines.
    kinds: Mutex<BTreeMap<String, u64>>,
}

/// The totals, for the last line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    pub operations: u64,
    pub faults: u64,
    pub leaks: u64,
    pub data_errors: u64,
    pub refused: u64,
    pub stuck: u64,
    pub shortfalls: u64,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Tally {
    pub fn operation(&self) {
        self.operations.fetch_add(1, Ordering::Relaxed);
    }

    pub fn fault(&self, kind: &str) {
        self.faults.fetch_add(1, Ordering::Relaxed);
        *lock(&self.kinds).entry(kind.to_string()).or_insert(0) += 1;
        self.note(format!("fault {kind}"), "");
    }

    /// Faults by kind over the whole run.
    pub fn kinds(&self) -> BTreeMap<String, u64> {
        lock(&self.kinds).clone()
    }

    /// A volume begun: its backend, emulation and kind (the round's coverage).
    pub fn volume(&self, shape: &str) {
        self.note(format!("volume {shape}"), "");
    }

    /// A failed attempt that will be retried.
    pub fn attempt_failed(&self, call: &str, code: &str, message: &str) {
        self.note(format!("retried {call}: {code}"), message);
    }

    pub fn data_error(&self, what: String) {
        self.data_errors.fetch_add(1, Ordering::Relaxed);
        eprintln!("chaos: DATA ERROR: {what}");
    }

    /// A pod's I/O refused because its device went away under it (SNAP
    /// restarted empty): the pod restarts, not a failure unless the new pod
    /// finds its data lost or is refused again.
    pub fn refused(&self, what: String) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        eprintln!("chaos: I/O refused, the pod restarts: {what}");
    }

    pub fn stuck(&self, what: String) {
        self.stuck.fetch_add(1, Ordering::Relaxed);
        eprintln!("chaos: DID NOT CONVERGE: {what}");
    }

    /// Something the run promised to test and did not: it fails the run,
    /// which would otherwise report as tested what was not.
    pub fn shortfall(&self, what: String) {
        self.shortfalls.fetch_add(1, Ordering::Relaxed);
        eprintln!("chaos: NOT TESTED: {what}");
    }

    pub fn leak(&self, what: String) {
        self.leaks.fetch_add(1, Ordering::Relaxed);
        eprintln!("chaos: LEAK: {what}");
    }

    /// A stuck volume an operator unpublished and unstaged by hand.
    pub fn cleaned_by_hand(&self, label: &str) {
        self.note("stuck volumes cleaned up by hand".to_string(), label);
    }

    /// Something the census found that the design keeps on purpose.
    pub fn kept(&self, what: &str) {
        self.note("census: kept by design (packed pool)".to_string(), what);
    }

    /// Something seen, for the round's summary (with the first message).
    pub fn note(&self, key: impl Into<String>, message: &str) {
        self.note_times(key, 1, message);
    }

    /// Something seen `times` times at once.
    pub fn note_times(&self, key: impl Into<String>, times: u64, message: &str) {
        let mut detail = lock(&self.detail);
        let entry = detail
            .entry(key.into())
            .or_insert_with(|| (0, message.to_string()));
        entry.0 += times;
    }

    /// The details noted so far, emptied (one round's worth at a time).
    pub fn take_detail(&self) -> BTreeMap<String, (u64, String)> {
        std::mem::take(&mut *lock(&self.detail))
    }

    pub fn totals(&self) -> Totals {
        Totals {
            operations: self.operations.load(Ordering::Relaxed),
            faults: self.faults.load(Ordering::Relaxed),
            leaks: self.leaks.load(Ordering::Relaxed),
            data_errors: self.data_errors.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            stuck: self.stuck.load(Ordering::Relaxed),
            shortfalls: self.shortfalls.load(Ordering::Relaxed),
        }
    }
}
