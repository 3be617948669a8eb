//! Attached AIO volumes followed live: their files' sizes and their QoS
//! records.
//!
//! The controller cannot reach SNAP, so two of its changes to an AIO volume
//! reach an attached bdev only through the plugin, which runs beside SNAP:
//! ControllerExpandVolume grows the volume's file, and SPDK's `bdev_aio`
//! keeps the size it read at `bdev_aio_create` until `bdev_aio_rescan`;
//! ModifyVolume rewrites the volume's QoS record in the pool
//! ([`crate::csi::aio`]). Every period the plugin looks, for each AIO bdev it
//! knows, at the file's size and at the volume's record when it has one
//! (local reads, no SPDK call): a file with more whole blocks than the bdev
//! gets `bdev_aio_rescan` (SNAP then shows the host the larger disk), limits
//! other than those last set get `bdev_set_qos_limit`. A change is live
//! within a period and costs SNAP one call; a period with no change costs
//! SNAP nothing, so the node's round-trip budgets and the bench's call
//! counts are untouched.
//!
//! The bdevs known are those CreateDevice made (at the size their file had
//! just before) or found (size not known: rescanned once), and, once after a
//! start, those SNAP lists (our AIO bdevs, with their sizes): a restarted
//! plugin follows the volumes attached before it, grows those whose file grew
//! while it was down, and sets their recorded limits once in case a change
//! came meanwhile. DeleteDevice forgets a bdev; one gone from SNAP otherwise
//! (-19) is forgotten at its next change.
//!
//! The plugin reads the files by the path SNAP opens them by, so it must see
//! the same filesystem; a file it cannot see is reported once, and its bdev
//! then grows only when made anew (the next attach).

use std::collections::HashMap;
use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use snap_csi::jsonrpc::RpcClient;
use snap_csi::spdk::bdev::{BdevAioRescan, BdevGetBdevs};
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
    /// The volume's file (or block device), as SNAP opened it.
    path: PathBuf,
    block_size: u64,
    /// The bdev's blocks as far as known; `None`: not known, rescanned once.
    blocks: Option<u64>,
    /// The file could not be seen at the last look (reported once).
    unseen: bool,
    /// The record directory beside the file; none: no QoS record to follow.
    records: Option<PathBuf>,
    /// The volume context's limits, which the record overlays.
    given: QosLimits,
    /// What was set last; `None`: not known (adopted after a start).
    applied: Option<QosLimits>,
}

/// What CreateDevice tells the follower about the AIO bdev it made or found.
#[derive(Debug, Clone, Copy)]
pub struct Attached<'a> {
    pub device: &'a str,
    pub volume_id: &'a str,
    pub path: &'a str,
    pub block_size: u32,
    /// The bdev's blocks if CreateDevice made it, `None` if it found it.
    pub blocks: Option<u64>,
    /// The volume context's limits, and those just set.
    pub given: QosLimits,
    pub applied: QosLimits,
}

/// The size of the file or block device at `path` (a block device's length
/// is not in its metadata).
pub fn backing_size(path: &Path) -> std::io::Result<u64> {
    let meta = std::fs::metadata(path)?;
    if std::os::unix::fs::FileTypeExt::is_block_device(&meta.file_type()) {
        return File::open(path)?.seek(SeekFrom::End(0));
    }
    Ok(meta.len())
}

impl Followed {
    /// Follows a bdev CreateDevice made or found, from now. A bdev already
    /// followed keeps the size known of it.
    pub fn follow(&self, attached: Attached<'_>) {
        let path = PathBuf::from(attached.path);
        let records = qos::record_dir(&path).filter(|d| d.is_dir());
        let mut followed = self.lock();
        let blocks = attached.blocks.or_else(|| {
            followed
                .get(attached.device)
                .filter(|e| e.path == path)
                .and_then(|e| e.blocks)
        });
        followed.insert(
            attached.device.to_string(),
            Entry {
                volume_id: attached.volume_id.to_string(),
                path,
                block_size: u64::from(attached.block_size),
                blocks,
                unseen: false,
                records,
                given: attached.given,
                applied: Some(attached.applied),
            },
        );
    }

    pub fn forget(&self, device: &str) {
        self.lock().remove(device);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.bdevs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Updates `device`'s entry if it is still followed.
    fn update(&self, device: &str, change: impl FnOnce(&mut Entry)) {
        if let Some(entry) = self.lock().get_mut(device) {
            change(entry);
        }
    }

    /// Lists SNAP's AIO bdevs of ours once, following each with its size.
    async fn adopt(&self, spdk: &RpcClient, deadline: Instant) {
        if self.adopted.load(Ordering::Relaxed) {
            return;
        }
        let bdevs = match spdk.call_until(&BdevGetBdevs::default(), deadline).await {
            Ok(bdevs) => bdevs,
            Err(e) => {
                tracing::debug!("following AIO volumes: SNAP's bdevs not listed yet: {e}");
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
            let path = PathBuf::from(aio.filename);
            let records = qos::record_dir(&path).filter(|d| d.is_dir());
            followed
                .entry(bdev.name)
                .and_modify(|e| {
                    e.blocks.get_or_insert(bdev.num_blocks);
                })
                .or_insert(Entry {
                    volume_id,
                    path,
                    block_size: u64::from(bdev.block_size),
                    blocks: Some(bdev.num_blocks),
                    unseen: false,
                    records,
                    given: QosLimits::default(),
                    applied: None,
                });
        }
        self.adopted.store(true, Ordering::Relaxed);
    }

    /// One pass: every followed bdev whose file has grown is rescanned, and
    /// every one whose record gives other limits than those last set gets them.
    pub async fn sync(&self, spdk: &RpcClient, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        self.adopt(spdk, deadline).await;
        let entries: Vec<(String, Entry)> = self
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (device, entry) in entries {
            if self.grow(spdk, &device, &entry, deadline).await {
                self.limit(spdk, &device, &entry, deadline).await;
            }
        }
    }

    /// Rescans `device` if its file holds more whole blocks than it has;
    /// false when the bdev is gone.
    async fn grow(&self, spdk: &RpcClient, device: &str, entry: &Entry, deadline: Instant) -> bool {
        let size = match backing_size(&entry.path) {
            Ok(size) => size,
            Err(e) => {
                if !entry.unseen {
                    tracing::warn!(%device, volume_id = %entry.volume_id, path = %entry.path.display(),
                        "cannot see the volume's file, so it grows only at its next attach \
                         (the plugin must see SNAP's files by the same path): {e}");
                    self.update(device, |e| e.unseen = true);
                }
                return true;
            }
        };
        if entry.unseen {
            self.update(device, |e| e.unseen = false);
        }
        let Some(blocks) = size.checked_div(entry.block_size) else {
            return true;
        };
        if entry.blocks.is_some_and(|known| blocks <= known) {
            return true;
        }
        let rescan = BdevAioRescan {
            name: device.to_string(),
        };
        match spdk.call_until(&rescan, deadline).await {
            Ok(_) => tracing::info!(%device, volume_id = %entry.volume_id, from = ?entry.blocks,
                to = blocks, "AIO bdev grown with its file"),
            Err(e) if e.is_no_such_device() => {
                self.forget(device);
                return false;
            }
            // SNAP unreachable: tried again next period.
            Err(e) if e.is_transient() => {
                tracing::debug!(%device, "rescanning: {e}");
                return true;
            }
            // Refused: not tried again (nor logged) until the file grows again.
            Err(e) => tracing::warn!(%device, volume_id = %entry.volume_id,
                "SNAP refuses to rescan the bdev; it grows at its next attach: {e}"),
        }
        self.update(device, |e| e.blocks = Some(blocks));
        true
    }

    /// Sets the limits `device`'s record gives, if they changed.
    async fn limit(&self, spdk: &RpcClient, device: &str, entry: &Entry, deadline: Instant) {
        let Some(records) = &entry.records else {
            return;
        };
        let recorded = match qos::recorded(records, &entry.volume_id) {
            Ok(recorded) => recorded,
            Err(e) => {
                tracing::warn!(%device, "QoS record unreadable: {e}");
                return;
            }
        };
        let wanted = recorded.map_or(entry.given, |r| entry.given.overlaid(r));
        if entry.applied == Some(wanted) || wanted.is_empty() {
            return;
        }
        match spdk.call_until(&wanted.request(device), deadline).await {
            Ok(_) => tracing::info!(%device, volume_id = %entry.volume_id, limits = ?wanted,
                "QoS limits changed live"),
            Err(e) if e.is_no_such_device() => {
                self.forget(device);
                return;
            }
            // SNAP unreachable: tried again next period.
            Err(e) if e.is_transient() => {
                tracing::debug!(%device, "setting QoS limits: {e}");
                return;
            }
            // Refused: not tried again (nor logged) until the record changes.
            Err(e) => tracing::warn!(%device, volume_id = %entry.volume_id, limits = ?wanted,
                "SNAP refuses these QoS limits; the next attach reports why: {e}"),
        }
        self.update(device, |e| e.applied = Some(wanted));
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
