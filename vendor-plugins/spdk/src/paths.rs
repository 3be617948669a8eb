//! The paths of remote (NVMe-oF) volumes: how each is attached, and the
//! paths of multipath devices kept attached.
//!
//! Every path of a volume is one `bdev_nvme_attach_controller` under the
//! volume's controller name, with the same reconnect policy
//! ([`CTRLR_LOSS_TIMEOUT_SEC`], [`RECONNECT_DELAY_SEC`]); several paths are
//! attached with `multipath: "multipath"`, so that SPDK keeps every one
//! connected under one bdev. SPDK itself reconnects a path it has attached:
//! a target's listener that goes away and comes back is taken up again
//! without us, the bdev serving through the other paths meanwhile.
//!
//! Two things SPDK does not do, which the keeper ([`Kept`]) does: attach a
//! path that could not be reached when CreateDevice asked (SPDK fails that
//! attach and forgets it; CreateDevice succeeds on the paths it could
//! reach), and attach again a path SPDK gave up on (lost for longer than
//! the reconnect policy, SPDK deletes that path's controller). For each
//! multipath device CreateDevice made or found since the plugin started,
//! it keeps the paths its volume context lists; every [`PERIOD`], while it
//! keeps any, it reads `bdev_nvme_get_controllers` once and attaches every
//! path a device lacks (one round trip for all of them). A failure is logged
//! once per path until it changes, and tried again the next period. A
//! device gone from SPDK (DeleteDevice, or every path given up) is
//! forgotten, never made again here. DeleteDevice and the keeper take turns
//! on a device ([`Kept::turn`]), so a path attached late never outlives the
//! device's DeleteDevice as a controller of its own.
//!
//! What a restarted plugin keeps is what CreateDevice gives it again: a
//! path missing across a plugin restart is attached at its volume's next
//! CreateDevice (a NodeStage). A plugin without background calls
//! (`aio_follow_period` zero, for tests counting round trips) keeps nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::join_all;
use snap_csi::jsonrpc::{RpcClient, RpcError};
use snap_csi::spdk::nvme::{
    BdevNvmeAttachController, BdevNvmeAttachPath, BdevNvmeGetControllers, MULTIPATH,
    NvmeBdevController, NvmeBdevPath,
};
use tokio::sync::{Mutex as TurnLock, OwnedMutexGuard};
use tokio::time::Instant;

use crate::backend::{NvmfPath, NvmfTarget};

/// A remote volume's controller, its target lost (restarting, its path
/// down), is reconnected every second, the host's I/O held meanwhile, for
/// as long as the Linux NVMe host's own default `ctrl_loss_tmo` (ten
/// minutes); then SPDK deletes it and the host loses the disk. SPDK's
/// default (0) would fail every I/O of a target restart and never reconnect.
/// Each path of a multipath device has the same policy: the bdev serves on
/// through the others while one is reconnected.
///
/// `fast_io_fail_timeout_sec` is left unset (0: never) on purpose: it
/// fails the I/O queued for a controller reconnecting longer than that,
/// which on a single-path volume is a target restart's I/O (an error the
/// host's filesystem sees), and on a multipath device changes nothing
/// while another path is up (its I/O is not queued on the lost one). A
/// silent path loss is found by [`TRANSPORT_ACK_TIMEOUT`], not by these.
///
/// The delay between reconnects is the price of a silently lost path on
/// SPDK v24.09: each attempt blocks the reactor ~2 s (see
/// [`TRANSPORT_ACK_TIMEOUT`]), so 1 s keeps it blocked two thirds of the
/// time while the path is down (5 s measured twice the writes, the same
/// longest stall); it is kept at 1 s because it is also how soon a target
/// that restarted (a refused connection, which does not block) serves a
/// single-path volume again.
pub const CTRLR_LOSS_TIMEOUT_SEC: i32 = 600;
pub const RECONNECT_DELAY_SEC: u32 = 1;

/// `transport_ack_timeout` of `bdev_nvme_set_options` on the DPU's SPDK:
/// NVMe/TCP sockets get `TCP_USER_TIMEOUT` = 2^8 ms, so a connection whose
/// sent bytes (an I/O, or a keep-alive every half KATO) go unacknowledged
/// that long is closed by the kernel, its I/O aborted and at once retried
/// by the multipath bdev on another path (`bdev_retry_count`, SPDK's 3),
/// the path reset and reconnected every [`RECONNECT_DELAY_SEC`]. It is
/// the only thing that finds a *silent* path loss (packets gone, nothing
/// closed). With SPDK's default (0) the write on the lost path waits as long
/// as the link is down (measured: a 20 s cut, writes of 20.9 s, 23.7 s);
/// keep-alive does not help (SPDK's host sends it and never checks the
/// answer), nor do `fast_io_fail_timeout_sec` and `ctrlr_loss_timeout_sec`
/// (clocks of a reconnect that never starts), and a per-command
/// `timeout_us` with `action_on_timeout: reset` is worse: its reset
/// reconnects in a blocking `connect()` that, without this timeout, holds
/// SPDK's reactor for the kernel's SYN retries (over 30 s measured).
///
/// What it costs, on SPDK v24.09 (`tests/real_spdk.rs`, a silent cut of
/// the current path under a writer, one reactor): SPDK's TCP `connect()`
/// blocks its thread, and a SYN lost in the void is given up no sooner
/// than the kernel's first SYN retransmission (1 s), whatever this
/// timeout. So the failover stalls a write ~1.7 s (the kernel gives the
/// socket up ~0.7 s after the cut, then the reset's `connect()` blocks
/// ~1 s); 9 measured ~2.0 s, 10 ~2.5 s, 11 ~4.5 s. While the path stays
/// silent, every reconnect attempt (SPDK chains two) blocks the reactor
/// ~2.05 s, once per [`RECONNECT_DELAY_SEC`] + 2 s, whatever the value.
///
/// Why 8, not shorter or longer: the kernel retransmits at least once
/// before it honours the timeout, so 8 gives a path up only when neither a
/// segment nor its retransmission is acknowledged (or the target leaves
/// its window shut 256 ms: an SPDK target reads its sockets on every
/// poll, so that is a target stuck, not busy); a slow target never trips
/// it, the kernel acknowledges whatever the target's load. A false alarm
/// on a live link costs a reconnect that succeeds at once (no blocking:
/// the SYN is answered), the other path carrying the I/O meanwhile. A
/// longer value only lengthens the failover.
///
/// Global, not per attach: SPDK's `bdev_nvme_attach_controller` has no
/// such parameter, and `bdev_nvme_set_options` is refused once any NVMe
/// controller exists, so it belongs to SNAP's start-up configuration,
/// not to the plugin's calls.
pub const TRANSPORT_ACK_TIMEOUT: u8 = 8;

/// The `bdev_nvme_set_options` parameters SNAP's SPDK should start with
/// for the plugin's paths: [`TRANSPORT_ACK_TIMEOUT`], the rest SPDK's
/// defaults. Keep-alive stays at 10 s. It sends the bytes whose missing
/// acknowledgement finds a loss on a path with nothing else unacknowledged,
/// which is also a path whose write the target acknowledged before the cut
/// and whose answer the cut lost: that write waits for the next keep-alive
/// (every 5 s; the bench's section 11 measured 5.6 s on the emulator, one
/// cut in ~40). A shorter timeout shortens that wait, but a target drops a
/// controller whose keep-alive is late, and while a path stays silent
/// SPDK's reactor blocks ~2 s per reconnect round, delaying the healthy
/// path's keep-alive too: 10 s keeps such false losses away (2 s measured
/// the same typical stalls, with more traffic). `bdev_retry_count` stays 3: an I/O aborted on the lost path
/// is retried on another at once, not counted against it.
pub fn snap_bdev_nvme_options() -> serde_json::Value {
    serde_json::json!({ "transport_ack_timeout": TRANSPORT_ACK_TIMEOUT })
}

/// How often the keeper looks at the multipath devices it keeps.
pub const PERIOD: Duration = Duration::from_secs(2);

/// `bdev_nvme_attach_controller` of `path` of `target` as controller `name`.
pub fn attach(name: &str, target: &NvmfTarget, path: &NvmfPath) -> BdevNvmeAttachController {
    BdevNvmeAttachController {
        name: name.to_string(),
        trtype: target.trtype.clone(),
        traddr: path.traddr.clone(),
        adrfam: Some(target.adrfam.clone()),
        trsvcid: Some(path.trsvcid.clone()),
        subnqn: Some(target.subnqn.clone()),
        hostnqn: target.hostnqn.clone(),
        ctrlr_loss_timeout_sec: Some(CTRLR_LOSS_TIMEOUT_SEC),
        reconnect_delay_sec: Some(RECONNECT_DELAY_SEC),
    }
}

/// [`attach`] as one path of a multipath device.
pub fn attach_path(name: &str, target: &NvmfTarget, path: &NvmfPath) -> BdevNvmeAttachPath {
    BdevNvmeAttachPath {
        controller: attach(name, target, path),
        multipath: MULTIPATH,
    }
}

/// An attach's answer that says the path is there already: -114 for the
/// controller's first path, -17 for any other (SPDK finds its address
/// among the controllers).
pub fn is_attached_already(error: &RpcError) -> bool {
    error.is_already_attached() || error.is_exists()
}

/// The path of one of SPDK's controllers.
pub fn path_of(ctrlr: &NvmeBdevPath) -> NvmfPath {
    NvmfPath {
        traddr: ctrlr.trid.traddr.clone(),
        trsvcid: ctrlr.trid.trsvcid.clone().unwrap_or_default(),
    }
}

/// The multipath devices kept, by controller name.
#[derive(Debug, Default)]
pub struct Kept {
    devices: Mutex<HashMap<String, Arc<Entry>>>,
}

#[derive(Debug)]
struct Entry {
    volume_id: String,
    target: NvmfTarget,
    /// Held while the keeper attaches this device's paths, and while
    /// DeleteDevice detaches it.
    turn: Arc<TurnLock<()>>,
    /// Each path's last failure, logged once.
    failures: Mutex<HashMap<NvmfPath, String>>,
}

/// A device kept: its volume and the paths it should have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    pub controller: String,
    pub volume_id: String,
    pub paths: Vec<NvmfPath>,
}

impl Kept {
    /// Keeps `target`'s paths attached to controller `controller` from now.
    pub fn keep(&self, controller: &str, volume_id: &str, target: &NvmfTarget) {
        let mut devices = self.lock();
        if devices
            .get(controller)
            .is_some_and(|e| e.target == *target && e.volume_id == volume_id)
        {
            return;
        }
        devices.insert(
            controller.to_string(),
            Arc::new(Entry {
                volume_id: volume_id.to_string(),
                target: target.clone(),
                turn: Arc::default(),
                failures: Mutex::default(),
            }),
        );
    }

    /// Stops keeping `controller`.
    pub fn forget(&self, controller: &str) {
        self.lock().remove(controller);
    }

    /// `controller`'s turn, when it is kept: waited for until `deadline`
    /// (`Err` when it passed), held by the caller until it drops it.
    pub async fn turn(
        &self,
        controller: &str,
        deadline: Instant,
    ) -> Result<Option<OwnedMutexGuard<()>>, tokio::time::error::Elapsed> {
        let turn = self.lock().get(controller).map(|e| Arc::clone(&e.turn));
        match turn {
            Some(turn) => tokio::time::timeout_at(deadline, turn.lock_owned())
                .await
                .map(Some),
            None => Ok(None),
        }
    }

    /// Every device kept and the paths it should have.
    pub fn wanted(&self) -> Vec<Wanted> {
        self.lock()
            .iter()
            .map(|(controller, entry)| Wanted {
                controller: controller.clone(),
                volume_id: entry.volume_id.clone(),
                paths: entry.target.paths(),
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Entry>>> {
        self.devices.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `entry` is still what `controller` keeps (not forgotten, nor
    /// replaced by a later CreateDevice's).
    fn still(&self, controller: &str, entry: &Arc<Entry>) -> bool {
        self.lock()
            .get(controller)
            .is_some_and(|e| Arc::ptr_eq(e, entry))
    }

    /// One pass: attaches every path a kept device lacks.
    pub async fn sync(&self, spdk: &RpcClient, timeout: Duration) {
        let entries: Vec<(String, Arc<Entry>)> = self
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), Arc::clone(v)))
            .collect();
        if entries.is_empty() {
            return;
        }
        let deadline = Instant::now() + timeout;
        let controllers = match spdk
            .call_until(&BdevNvmeGetControllers::default(), deadline)
            .await
        {
            Ok(controllers) => controllers,
            Err(e) => {
                tracing::debug!("keeping multipath devices' paths: SPDK not read: {e}");
                return;
            }
        };
        let listed: HashMap<&str, &NvmeBdevController> =
            controllers.iter().map(|c| (c.name.as_str(), c)).collect();
        join_all(entries.iter().map(|(controller, entry)| {
            self.sync_device(
                spdk,
                controller,
                entry,
                listed.get(controller.as_str()),
                deadline,
            )
        }))
        .await;
    }

    async fn sync_device(
        &self,
        spdk: &RpcClient,
        controller: &str,
        entry: &Arc<Entry>,
        listed: Option<&&NvmeBdevController>,
        deadline: Instant,
    ) {
        let volume_id = &entry.volume_id;
        let Some(listed) = listed else {
            // Never made again here: the node stages the volume anew.
            if self.still(controller, entry) {
                tracing::warn!(%volume_id, %controller,
                    "the multipath device is gone from SPDK (deleted, or every path given up): \
                     its paths are no longer kept");
                self.forget(controller);
            }
            return;
        };
        let present: Vec<NvmfPath> = listed.ctrlrs.iter().map(path_of).collect();
        let missing: Vec<NvmfPath> = entry
            .target
            .paths()
            .into_iter()
            .filter(|p| !present.contains(p))
            .collect();
        if missing.is_empty() {
            return;
        }
        let Ok(_turn) = tokio::time::timeout_at(deadline, entry.turn.lock()).await else {
            return;
        };
        // DeleteDevice came first: nothing of it is to be attached again.
        if !self.still(controller, entry) {
            return;
        }
        let attaches: Vec<BdevNvmeAttachPath> = missing
            .iter()
            .map(|path| attach_path(controller, &entry.target, path))
            .collect();
        let attached = join_all(attaches.iter().map(|a| spdk.call_until(a, deadline))).await;
        let mut failures = entry
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (path, result) in missing.iter().zip(attached) {
            match result {
                Ok(_) => {
                    failures.remove(path);
                    tracing::info!(%volume_id, %controller, %path, "path attached");
                }
                Err(e) if is_attached_already(&e) => {
                    failures.remove(path);
                }
                Err(e) => {
                    let now = e.to_string();
                    if failures.get(path) != Some(&now) {
                        tracing::warn!(%volume_id, %controller, %path,
                            "path not attached, tried again every {PERIOD:?}: {now}");
                        failures.insert(path.clone(), now);
                    }
                }
            }
        }
    }
}

/// Keeps forever, a pass every [`PERIOD`]; the caller aborts it.
pub async fn run(kept: &Kept, spdk: &RpcClient, timeout: Duration) {
    let mut ticks = tokio::time::interval(PERIOD);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        kept.sync(spdk, timeout).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(extra: &[&str]) -> NvmfTarget {
        NvmfTarget {
            trtype: "tcp".into(),
            traddr: "10.0.0.1".into(),
            trsvcid: "4420".into(),
            adrfam: "ipv4".into(),
            subnqn: "nqn.2024-01.io.x:v".into(),
            hostnqn: None,
            extra_paths: extra
                .iter()
                .map(|a| NvmfPath {
                    traddr: a.to_string(),
                    trsvcid: "4420".into(),
                })
                .collect(),
        }
    }

    #[test]
    fn snap_is_told_to_give_up_a_silent_path_in_a_quarter_second() {
        let options = snap_bdev_nvme_options();
        assert_eq!(options, serde_json::json!({"transport_ack_timeout": 8}));
        // SPDK's TCP transport takes 0..=31 (0: never); 2^8 ms.
        assert!((1..=31).contains(&TRANSPORT_ACK_TIMEOUT));
        assert_eq!(1u64 << TRANSPORT_ACK_TIMEOUT, 256);
        // The reconnect policy SPDK checks at attach: a delay within the loss
        // timeout, and no fast I/O failure.
        let attach = attach("c", &target(&[]), &target(&[]).paths()[0]);
        assert_eq!(attach.reconnect_delay_sec, Some(RECONNECT_DELAY_SEC));
        assert_eq!(attach.ctrlr_loss_timeout_sec, Some(CTRLR_LOSS_TIMEOUT_SEC));
        assert!(i64::from(RECONNECT_DELAY_SEC) <= i64::from(CTRLR_LOSS_TIMEOUT_SEC));
    }

    #[tokio::test]
    async fn devices_are_kept_until_forgotten_and_delete_waits_its_turn() {
        let kept = Kept::default();
        kept.keep("c", "v", &target(&["10.0.0.2"]));
        let wanted = kept.wanted();
        assert_eq!(wanted.len(), 1);
        assert_eq!(wanted[0].paths.len(), 2);
        assert_eq!(wanted[0].paths[1].to_string(), "10.0.0.2:4420");

        // A repeat keeps the entry (and its turn); another target replaces it.
        let first = Arc::clone(&kept.lock()["c"]);
        kept.keep("c", "v", &target(&["10.0.0.2"]));
        assert!(kept.still("c", &first));
        kept.keep("c", "v", &target(&["10.0.0.3"]));
        assert!(!kept.still("c", &first));

        let soon = || Instant::now() + Duration::from_millis(50);
        let held = kept.turn("c", soon()).await.unwrap().unwrap();
        assert!(kept.turn("c", soon()).await.is_err(), "one turn at a time");
        drop(held);
        assert!(kept.turn("c", soon()).await.unwrap().is_some());
        assert!(kept.turn("other", soon()).await.unwrap().is_none());
        kept.forget("c");
        assert!(kept.wanted().is_empty());
    }

    #[test]
    fn every_path_has_the_same_reconnect_policy() {
        let target = target(&["10.0.0.2"]);
        let paths = target.paths();
        let attaches: Vec<BdevNvmeAttachPath> =
            paths.iter().map(|p| attach_path("c", &target, p)).collect();
        assert_eq!(attaches[1].controller.traddr, "10.0.0.2");
        for a in &attaches {
            assert_eq!(a.controller.name, "c");
            assert_eq!(a.controller.ctrlr_loss_timeout_sec, Some(600));
            assert_eq!(a.controller.reconnect_delay_sec, Some(1));
            assert_eq!(a.multipath, "multipath");
        }
    }
}
