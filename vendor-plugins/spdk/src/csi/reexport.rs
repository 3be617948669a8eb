//! Exports a restarted target lost, restored while the controller serves.
//!
//! A restarted NVMe-oF target finds its lvols again (its blobstore is on its
//! pool) but not its subsystems, listeners and QoS limits, which SPDK keeps in
//! memory: the DPUs' controllers would reconnect to nothing. Every [`PERIOD`]
//! the controller asks each backend for the volumes whose export is lost
//! ([`VolumeBackend::lost_exports`]) and exports each again under the
//! volume's own hold, so it never races a CreateVolume, DeleteVolume or
//! ModifyVolume of it: a volume busy now is looked at again next period.
//! A look while the target is down fails quietly and is simply repeated.

use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior};

use super::CsiController;
use super::controller::volume_key;
use super::ids::parse_volume_id;
use super::store::VolumeBackend;

/// How often the controller looks: the longest a restarted target's volumes
/// wait, beyond its own start, for their exports.
pub const PERIOD: Duration = Duration::from_secs(2);

impl CsiController {
    /// Restores lost exports every [`PERIOD`], for as long as it runs.
    pub async fn keep_exports(&self) {
        let mut tick = tokio::time::interval(PERIOD);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.restore_exports().await;
        }
    }

    /// One look at every backend; how many volumes were exported again.
    pub async fn restore_exports(&self) -> usize {
        let deadline = Instant::now() + self.inner.call_timeout;
        let mut restored = 0;
        for backend in self.backends() {
            restored += self.restore_backend(backend, deadline).await;
        }
        restored
    }

    async fn restore_backend(&self, backend: &dyn VolumeBackend, deadline: Instant) -> usize {
        let lost = match backend.lost_exports(deadline).await {
            Ok(lost) => lost,
            Err(status) => {
                tracing::debug!("looking for lost exports: {}", status.message());
                return 0;
            }
        };
        let mut restored = 0;
        for volume_id in lost {
            let Some((_, slug)) = parse_volume_id(&volume_id) else {
                continue;
            };
            let Ok(_held) = self.inner.busy.try_hold(&volume_key(slug)) else {
                continue;
            };
            match backend.export_again(&volume_id, deadline).await {
                Ok(()) => {
                    restored += 1;
                    tracing::warn!(%volume_id, "exported again: the target had lost its export");
                }
                Err(status) => tracing::warn!(
                    %volume_id,
                    "exporting again failed: {}; retried in {PERIOD:?}",
                    status.message()
                ),
            }
        }
        restored
    }
}
