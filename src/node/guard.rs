//! One operation per volume at a time.
//!
//! CSI lets the CO send a second call for a volume while the first is still
//! running (a retry after its own timeout). Running both would race on the
//! same mount points and SNAP objects, so the second gets ABORTED and the CO
//! retries later. Different volumes never wait for each other: the lock only
//! guards a set of names, never any I/O.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// The set of volumes with an operation in flight.
#[derive(Debug, Clone, Default)]
pub struct VolumeGuard {
    busy: Arc<Mutex<HashSet<String>>>,
}

/// Held while an operation on one volume runs; frees the volume when dropped.
#[derive(Debug)]
pub struct Held {
    busy: Arc<Mutex<HashSet<String>>>,
    volume_id: String,
}

impl VolumeGuard {
    /// Claims `volume_id`, or `None` if another operation holds it.
    pub fn try_hold(&self, volume_id: &str) -> Option<Held> {
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        busy.insert(volume_id.to_string()).then(|| Held {
            busy: Arc::clone(&self.busy),
            volume_id: volume_id.to_string(),
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        busy.remove(&self.volume_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_hold_on_the_same_volume_fails_until_the_first_is_dropped() {
        let guard = VolumeGuard::default();
        let first = guard.try_hold("pvc-1").unwrap();
        assert!(guard.try_hold("pvc-1").is_none());
        let other = guard.try_hold("pvc-2");
        assert!(other.is_some(), "other volumes do not wait");
        drop(first);
        assert!(guard.try_hold("pvc-1").is_some());
    }
}
