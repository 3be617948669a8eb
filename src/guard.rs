//! One operation per volume at a time.
//!
//! CSI lets the CO send a second call for a volume while the first is still
//! running (a retry after its own timeout). Running both would race on the
//! same mount points and SNAP objects. The node refuses the second
//! ([`VolumeGuard::try_hold`]: ABORTED, the CO retries later). The DPU agent
//! makes it wait ([`VolumeGuard::hold_until`]): its caller is the node, whose
//! own guard already serialises a volume, so a second call there is the
//! retry of one the link lost, and it converges fastest right after the
//! first. Different volumes never wait for each other: the lock only guards
//! a set of names, never any I/O.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::time::Instant;

/// The set of volumes with an operation in flight.
#[derive(Debug, Clone, Default)]
pub struct VolumeGuard {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    busy: Mutex<HashSet<String>>,
    /// Woken whenever a volume is freed.
    freed: Notify,
}

/// Held while an operation on one volume runs; frees the volume when dropped.
#[derive(Debug)]
pub struct Held {
    shared: Arc<Shared>,
    volume_id: String,
}

impl VolumeGuard {
    /// Claims `volume_id`, or `None` if another operation holds it.
    pub fn try_hold(&self, volume_id: &str) -> Option<Held> {
        let mut busy = self.shared.busy.lock().unwrap_or_else(|e| e.into_inner());
        busy.insert(volume_id.to_string()).then(|| Held {
            shared: Arc::clone(&self.shared),
            volume_id: volume_id.to_string(),
        })
    }

    /// Claims `volume_id`, waiting for the operation that holds it to end;
    /// `None` if it still runs at `deadline`.
    pub async fn hold_until(&self, volume_id: &str, deadline: Instant) -> Option<Held> {
        loop {
            // Registered before looking, so a free between the look and the
            // wait still wakes us.
            let freed = self.shared.freed.notified();
            if let Some(held) = self.try_hold(volume_id) {
                return Some(held);
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return None;
            }
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut busy = self.shared.busy.lock().unwrap_or_else(|e| e.into_inner());
        busy.remove(&self.volume_id);
        drop(busy);
        self.shared.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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

    #[tokio::test]
    async fn a_waiting_hold_gets_the_volume_when_it_is_freed_or_gives_up_at_its_deadline() {
        let guard = VolumeGuard::default();
        let first = guard.try_hold("pvc-1").unwrap();
        let soon = Instant::now() + Duration::from_millis(50);
        assert!(guard.hold_until("pvc-1", soon).await.is_none());
        assert!(Instant::now() >= soon);

        let waiter = {
            let guard = guard.clone();
            tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(5);
                guard.hold_until("pvc-1", deadline).await.is_some()
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(first);
        assert!(waiter.await.unwrap(), "the waiter got the freed volume");
        assert!(
            guard.try_hold("pvc-1").is_some(),
            "and freed it when it ended"
        );
    }
}
