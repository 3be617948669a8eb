//! AIO QoS changes made live: the plugin follows the AIO backend's records.
//!
//! The controller cannot reach SNAP, so a ModifyVolume of an AIO volume only
//! rewrites the volume's QoS record in the pool ([`crate::csi::aio`]). The
//! plugin, beside SNAP, follows the records of the AIO bdevs it knows: every
//! period it reads each one's record (a local file read, no SPDK call) and,
//! when the limits it gives differ from those last set, sets them with
//! `bdev_set_qos_limit`. A change is live within a period; it costs SNAP one
//! call, and a period with no change costs SNAP nothing, so the node's
//! round-trip budgets and the bench's call counts are untouched.
//!
//! The bdevs known are those CreateDevice made or found, and, once after a
//! start, those SNAP lists (AIO bdevs of ours whose file has a record
//! directory beside it): a restarted plugin follows the volumes attached
//! before it, and sets their recorded limits once in case a change came
//! while it was down. DeleteDevice forgets a bdev; one gone from SNAP
//! otherwise (-19) is forgotten at its next change.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use snap_csi::jsonrpc::RpcClient;
use snap_csi::spdk::bdev::BdevGetBdevs;
use tokio::time::Instant;

use crate::backend::Kind;
use crate::names::parse_device_name;
use crate::qos::{self, QosLimits};

/// The AIO bdevs followed, by device name.
#[derive(Debug, Default)]
pub struct Followed {
    bdevs: Mutex<HashMap<String, Entry>>,
    /// Whether SNAP's bdevs made before this start were listed yet.
    adopted: AtomicBool,
}

#[derive(Debug, Clone)]
struct Entry {
    volume_id: String,
    /// The record directory beside the volume's file.
    records: PathBuf,
    /// The volume context's limits, which the record overlays.
    given: QosLimits,
    /// What was set last; `None`: not known (adopted after a start).
    applied: Option<QosLimits>,
}

impl Followed {
    /// Follows `device` over `path` from now; `applied` is what was just set.
    /// Files without a record directory beside them have nothing to follow.
    pub fn follow(
        &self,
        device: &str,
        volume_id: &str,
        path: &str,
        given: QosLimits,
        applied: QosLimits,
    ) {
        let Some(records) = qos::record_dir(Path::new(path)).filter(|d| d.is_dir()) else {
            return;
        };
        self.lock().insert(
            device.to_string(),
            Entry {
                volume_id: volume_id.to_string(),
                records,
                given,
                applied: Some(applied),
            },
        );
    }

    pub fn forget(&self, device: &str) {
        self.lock().remove(device);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.bdevs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Lists SNAP's AIO bdevs of ours once, following those with records.
    async fn adopt(&self, spdk: &RpcClient, deadline: Instant) {
        if self.adopted.load(Ordering::Relaxed) {
            return;
        }
        let bdevs = match spdk.call_until(&BdevGetBdevs::default(), deadline).await {
            Ok(bdevs) => bdevs,
            Err(e) => {
                tracing::debug!("QoS records: SNAP's bdevs not listed yet: {e}");
                return;
            }
        };
        let mut followed = self.lock();
        for bdev in bdevs {
            let (Some((Kind::Aio, volume_id)), Some(aio)) =
                (parse_device_name(&bdev.name), bdev.driver_specific.aio)
            else {
                continue;
            };
            let Some(records) = qos::record_dir(Path::new(&aio.filename)).filter(|d| d.is_dir())
            else {
                continue;
            };
            followed.entry(bdev.name).or_insert(Entry {
                volume_id,
                records,
                given: QosLimits::default(),
                applied: None,
            });
        }
        self.adopted.store(true, Ordering::Relaxed);
    }

    /// One pass: every followed bdev whose record gives other limits than
    /// those last set gets them.
    pub async fn sync(&self, spdk: &RpcClient, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        self.adopt(spdk, deadline).await;
        let entries: Vec<(String, Entry)> = self
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (device, entry) in entries {
            let recorded = match qos::recorded(&entry.records, &entry.volume_id) {
                Ok(recorded) => recorded,
                Err(e) => {
                    tracing::warn!(%device, "QoS record unreadable: {e}");
                    continue;
                }
            };
            let wanted = recorded.map_or(entry.given, |r| entry.given.overlaid(r));
            if entry.applied == Some(wanted) || wanted.is_empty() {
                continue;
            }
            let done = match spdk.call_until(&wanted.request(&device), deadline).await {
                Ok(_) => {
                    tracing::info!(%device, volume_id = %entry.volume_id, limits = ?wanted,
                        "QoS limits changed live");
                    true
                }
                Err(e) if e.is_no_such_device() => {
                    self.forget(&device);
                    continue;
                }
                // SNAP unreachable: tried again next period.
                Err(e) if e.is_transient() => {
                    tracing::debug!(%device, "setting QoS limits: {e}");
                    false
                }
                // Refused: not tried again (nor logged) until the record changes.
                Err(e) => {
                    tracing::warn!(%device, volume_id = %entry.volume_id, limits = ?wanted,
                        "SNAP refuses these QoS limits; the next attach reports why: {e}");
                    true
                }
            };
            if done && let Some(e) = self.lock().get_mut(&device) {
                e.applied = Some(wanted);
            }
        }
    }
}

/// Follows forever, a pass every `period`; the caller aborts it.
pub async fn run(followed: &Followed, spdk: &RpcClient, period: Duration, timeout: Duration) {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        followed.sync(spdk, timeout).await;
    }
}
