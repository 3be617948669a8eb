//! Per-volume I/O metrics: each scrape of the node's `/metrics` lists every
//! staged volume's bytes, operations and time read and written, as the
//! volume's bdev on the DPU counts them.
//!
//! The counters of every bdev come from one `bdev_get_iostat` per DPU
//! (through its agent in split mode), whatever the number of volumes, kept for
//! [`FRESH_FOR`]: scrapes within it, and those arriving while a read is in
//! flight, share that read. A read has [`READ_TIMEOUT`]; when a DPU's
//! fails, the page leaves its volumes' series out (one more
//! `snap_csi_volume_io_errors_total`; `snap_csi_dpu_up` names the DPU)
//! rather than show old counts as new, and when every DPU's fails it says
//! so (`snap_csi_volume_io_up` 0). The volumes themselves are the records, read on every scrape, so a
//! volume unstaged is gone from the next page.
//!
//! A volume's bdev is its crypto bdev when SPDK lists one under the name
//! derived from the volume id (an encrypted volume: SNAP exposes that one),
//! else the vendor plugin's device in the record. A volume DPF attached (no
//! device of ours) has no series.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::context::METADATA_LABELS;
use super::fleet::Fleet;
use super::records::{Records, VolumeRecord};
use crate::dpu::names::VolumeNames;
use crate::dpu::{BdevIostat, DpuError, IoStats};
use crate::metrics::{VolumeIo, VolumeIoSource};

/// How long one read of the counters serves scrapes: Prometheus scrapes
/// every 15 s or more, so only scrapes that come together share a read.
const FRESH_FOR: Duration = Duration::from_secs(1);
/// A read not answered by then fails: well inside Prometheus' default
/// 10 s scrape timeout.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The node's [`VolumeIoSource`].
#[derive(Debug)]
pub(super) struct NodeVolumeIo {
    records: Records,
    fleet: Arc<Fleet>,
    /// The latest read; locked across a read so that scrapes arriving
    /// meanwhile wait for it instead of asking again.
    last: Mutex<Option<Reading>>,
}

#[derive(Debug)]
struct Reading {
    started: Instant,
    /// Each DPU's counters, in the fleet's order; `None` where the read failed.
    stats: Arc<Vec<Option<IoStats>>>,
}

impl NodeVolumeIo {
    pub(super) fn new(records: Records, fleet: Arc<Fleet>) -> Self {
        NodeVolumeIo {
            records,
            fleet,
            last: Mutex::new(None),
        }
    }

    /// The counters of a read sent less than [`FRESH_FOR`] before this
    /// scrape came (so also one that was in flight then), or read now.
    async fn stats(&self) -> Arc<Vec<Option<IoStats>>> {
        let came = Instant::now();
        let mut last = self.last.lock().await;
        if let Some(reading) = last.as_ref()
            && came.saturating_duration_since(reading.started) < FRESH_FOR
        {
            return Arc::clone(&reading.stats);
        }
        let started = Instant::now();
        let members = self.fleet.members();
        // A DPU known down would only make the page wait out the timeout.
        let read = join_all(members.iter().map(|m| async {
            match self.fleet.known_down(m) {
                true => Err(DpuError::Unavailable(format!("DPU {} is down", m.name()))),
                false => m.dpu().io_stats(started + READ_TIMEOUT).await,
            }
        }))
        .await;
        let stats: Vec<Option<IoStats>> = read
            .into_iter()
            .enumerate()
            .map(|(i, result)| {
                let dpu = members[i].name();
                let failed_before = last.as_ref().is_some_and(|r| r.stats[i].is_none());
                match result {
                    Ok(stats) => {
                        if failed_before {
                            tracing::info!(%dpu, "the DPU's I/O counters can be read again");
                        }
                        Some(stats)
                    }
                    Err(e) => {
                        crate::metrics::observe_volume_io_error();
                        // Once per outage, not once per scrape.
                        if !failed_before {
                            tracing::warn!(%dpu, "cannot read the DPU's I/O counters, its volumes' I/O metrics left out: {e}");
                        }
                        None
                    }
                }
            })
            .collect();
        let stats = Arc::new(stats);
        *last = Some(Reading {
            started,
            stats: Arc::clone(&stats),
        });
        stats
    }
}

#[async_trait::async_trait]
impl VolumeIoSource for NodeVolumeIo {
    async fn read(&self) -> Option<Vec<VolumeIo>> {
        let records = self.records.clone();
        let records = match tokio::task::spawn_blocking(move || records.all()).await {
            Ok(Ok(records)) => records,
            Ok(Err(e)) => {
                tracing::warn!("cannot list volume records for the I/O metrics: {e}");
                return None;
            }
            Err(e) => {
                tracing::warn!("listing volume records for the I/O metrics: {e}");
                return None;
            }
        };
        // Unreadable records are reported at start (`reconcile`).
        let records: Vec<VolumeRecord> = records.into_iter().filter_map(Result::ok).collect();
        if records.is_empty() {
            return Some(Vec::new());
        }
        let stats = self.stats().await;
        if stats.iter().all(Option::is_none) {
            return None;
        }
        let members = self.fleet.members();
        let mut found = Vec::new();
        for (member, stats) in members.iter().zip(stats.iter()) {
            let Some(stats) = stats else { continue };
            let held: Vec<VolumeRecord> = records
                .iter()
                .filter(|r| {
                    self.fleet
                        .recorded(r.dpu.as_deref())
                        .is_ok_and(|on| std::ptr::eq(on, member))
                })
                .cloned()
                .collect();
            found.extend(volumes(&held, stats));
        }
        Some(found)
    }
}

/// Each volume of `records` whose bdev `stats` lists, with its counters.
fn volumes(records: &[VolumeRecord], stats: &IoStats) -> Vec<VolumeIo> {
    let bdevs: HashMap<&str, &BdevIostat> =
        stats.bdevs.iter().map(|b| (b.name.as_str(), b)).collect();
    // SPDK's tick rate is never 0; were it, times would be infinite.
    let seconds = |ticks: u64| match stats.tick_rate {
        0 => 0.0,
        rate => ticks as f64 / rate as f64,
    };
    records
        .iter()
        .filter_map(|record| {
            let bdev = exposed_bdev(record, &bdevs)?;
            Some(VolumeIo {
                labels: labels(record),
                read_bytes: bdev.bytes_read,
                written_bytes: bdev.bytes_written,
                reads: bdev.num_read_ops,
                writes: bdev.num_write_ops,
                read_seconds: seconds(bdev.read_latency_ticks),
                write_seconds: seconds(bdev.write_latency_ticks),
            })
        })
        .collect()
}

/// The bdev SNAP exposes for the volume (see the module doc).
fn exposed_bdev<'a>(
    record: &VolumeRecord,
    bdevs: &HashMap<&str, &'a BdevIostat>,
) -> Option<&'a BdevIostat> {
    let crypto = VolumeNames::new(&record.volume_id).crypto_bdev;
    bdevs
        .get(crypto.as_str())
        .or_else(|| bdevs.get(record.device_name.as_deref()?))
        .copied()
}

fn labels(record: &VolumeRecord) -> Vec<(&'static str, String)> {
    let mut labels = vec![("volume_id", record.volume_id.clone())];
    for (key, label) in METADATA_LABELS {
        if let Some(value) = record.volume_context.get(key) {
            labels.push((label, value.clone()));
        }
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dpu::DpuAttach;
    use crate::node::records::sample;

    fn bdev(name: &str, written: u64) -> BdevIostat {
        BdevIostat {
            name: name.into(),
            bytes_read: 4096,
            num_read_ops: 1,
            bytes_written: written,
            num_write_ops: 2,
            bytes_unmapped: 0,
            num_unmap_ops: 0,
            read_latency_ticks: 1_000,
            write_latency_ticks: 3_000,
        }
    }

    #[test]
    fn each_volume_gets_its_exposed_bdev_and_its_names() {
        let mut plain = sample("pvc-plain");
        plain.device_name = Some("aio-plain".into());
        plain.volume_context.extend([
            ("csi.storage.k8s.io/pv/name".to_string(), "pv-1".to_string()),
            (
                "csi.storage.k8s.io/pvc/name".to_string(),
                "data".to_string(),
            ),
            (
                "csi.storage.k8s.io/pvc/namespace".to_string(),
                "team".to_string(),
            ),
        ]);
        let mut encrypted = sample("pvc-crypt");
        encrypted.device_name = Some("aio-crypt".into());
        let mut dpf = sample("pvc-dpf");
        dpf.device_name = None;
        let mut gone = sample("pvc-gone");
        gone.device_name = Some("aio-gone".into());
        let crypto = VolumeNames::new("pvc-crypt").crypto_bdev;
        let stats = IoStats {
            tick_rate: 1_000,
            ticks: 0,
            bdevs: vec![
                bdev("aio-plain", 8192),
                bdev("aio-crypt", 1),
                bdev(&crypto, 12288),
            ],
        };
        let volumes = volumes(&[plain, encrypted, dpf, gone], &stats);
        assert_eq!(
            volumes,
            [
                VolumeIo {
                    labels: vec![
                        ("volume_id", "pvc-plain".into()),
                        ("pv", "pv-1".into()),
                        ("pvc", "data".into()),
                        ("pvc_namespace", "team".into()),
                    ],
                    read_bytes: 4096,
                    written_bytes: 8192,
                    reads: 1,
                    writes: 2,
                    read_seconds: 1.0,
                    write_seconds: 3.0,
                },
                // The crypto bdev, not the plugin's under it.
                VolumeIo {
                    labels: vec![("volume_id", "pvc-crypt".into())],
                    read_bytes: 4096,
                    written_bytes: 12288,
                    reads: 1,
                    writes: 2,
                    read_seconds: 1.0,
                    write_seconds: 3.0,
                },
            ]
        );
    }

    /// A DPU whose counters answer after `delay`, or fail, counting the reads.
    #[derive(Debug, Default)]
    struct Counters {
        reads: std::sync::atomic::AtomicUsize,
        failing: std::sync::atomic::AtomicBool,
    }

    #[async_trait::async_trait]
    impl DpuAttach for Counters {
        async fn attach(
            &self,
            _: &crate::dpu::AttachRequest,
            _: Instant,
        ) -> Result<crate::dpu::Attachment, crate::dpu::DpuError> {
            unreachable!("the metrics only read")
        }
        async fn detach(
            &self,
            _: &str,
            _: Option<&str>,
            _: Instant,
        ) -> Result<(), crate::dpu::DpuError> {
            unreachable!("the metrics only read")
        }
        async fn probe(&self, _: Instant) -> Result<bool, crate::dpu::DpuError> {
            unreachable!("the metrics only read")
        }
        async fn inventory(
            &self,
            _: Instant,
        ) -> Result<crate::dpu::Inventory, crate::dpu::DpuError> {
            unreachable!("the metrics only read")
        }
        async fn io_stats(&self, _: Instant) -> Result<IoStats, crate::dpu::DpuError> {
            use std::sync::atomic::Ordering;
            self.reads.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            match self.failing.load(Ordering::SeqCst) {
                true => Err(crate::dpu::DpuError::Unavailable("SNAP is away".into())),
                false => Ok(IoStats {
                    tick_rate: 1_000,
                    ticks: 0,
                    bdevs: vec![bdev("aio-x", 512), bdev("aio-y", 1024)],
                }),
            }
        }
    }

    #[tokio::test]
    async fn scrapes_share_one_read_and_a_failed_one_shows_nothing() {
        use std::sync::atomic::Ordering;
        let dir = tempfile::tempdir().unwrap();
        let records = Records::open(dir.path()).unwrap();
        let dpu = Arc::new(Counters::default());
        let fleet = Fleet::new(vec![("dpu".into(), 0, Arc::clone(&dpu) as _)]);
        let source = NodeVolumeIo::new(records.clone(), Arc::new(fleet));
        let reads = || dpu.reads.load(Ordering::SeqCst);

        // Nothing staged: nothing to ask.
        assert_eq!(source.read().await, Some(Vec::new()));
        assert_eq!(reads(), 0);

        records.store(&sample("pvc-x")).unwrap();
        let mut y = sample("pvc-y");
        y.device_name = Some("aio-y".into());
        records.store(&y).unwrap();
        // Eight scrapes at once, while the first read is in flight: one read.
        let pages = futures::future::join_all((0..8).map(|_| source.read())).await;
        assert_eq!(reads(), 1);
        assert!(
            pages
                .iter()
                .all(|p| p.as_ref().is_some_and(|v| v.len() == 2))
        );
        // Within the second: the same read.
        assert_eq!(source.read().await, pages[0]);
        assert_eq!(reads(), 1);

        // After it, a new read, which fails: no series, not the old ones.
        tokio::time::sleep(FRESH_FOR).await;
        dpu.failing.store(true, Ordering::SeqCst);
        assert_eq!(source.read().await, None);
        assert_eq!(reads(), 2);
        tokio::time::sleep(FRESH_FOR).await;
        dpu.failing.store(false, Ordering::SeqCst);
        assert_eq!(source.read().await, pages[0]);
        assert_eq!(reads(), 3);

        // Unstaged: gone from the next page, also from a cached read.
        records.remove("pvc-y").unwrap();
        let page = source.read().await.unwrap();
        assert_eq!(reads(), 3);
        assert_eq!(page.len(), 1);
        assert_eq!(page[0].labels, [("volume_id", "pvc-x".to_string())]);
    }
}
