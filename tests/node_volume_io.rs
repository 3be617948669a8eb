//! The node's per-volume I/O series on its `/metrics` page: every staged
//! volume's bytes, operations and time read and written, labelled with the
//! volume id and the PV and PVC the volume context names, from one
//! `bdev_get_iostat` per scrape whatever the number of volumes; left out,
//! not shown stale, when SNAP does not answer; gone once a volume is
//! unstaged. Runs co-located and split (`SNAP_CSI_TEST_DPU=split`). One test
//! in its own process, because the registry is process-wide.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::assert_kept_deadline;
use common::node::{
    NodeStack, block_capability, mount_capability, publish_request, scrape, stage_request,
    unpublish, unstage,
};
use snap_csi::node::config::EmulationSetting;
use snap_csi::node::service::EMULATION_KEY;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;

/// The node's deadline on one read of SNAP's counters (`volume_io.rs`).
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one read serves scrapes (`volume_io.rs`).
const FRESH_FOR: Duration = Duration::from_secs(1);

const IOSTAT_OK: &str =
    r#"snap_csi_outbound_requests_total{target="snap",method="bdev_get_iostat",outcome="ok"}"#;

/// The value of the sample `series` (name and labels exactly as the page
/// prints them), if the page has it.
fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|value| value.parse().unwrap())
}

/// `bdev_get_iostat` calls made so far in this process: the node's own in
/// co-located mode, the DPU agent's (on a thread here) in split mode.
fn iostat_calls(page: &str) -> f64 {
    sample(page, IOSTAT_OK).unwrap_or(0.0)
}

/// Writes `data` at `offset` of a file or device (created if need be) and
/// flushes it to the disk.
fn write_flushed(path: &Path, offset: u64, data: &[u8]) {
    use std::io::{Seek, SeekFrom, Write};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap();
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.write_all(data).unwrap();
    file.sync_all().unwrap();
}

/// Reads `len` bytes of a block volume at `offset`, a place nothing has read
/// or written before, so that the read reaches the device.
fn read_uncached(device: &Path, offset: u64, len: usize) {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(device).unwrap();
    file.seek(SeekFrom::Start(offset)).unwrap();
    let mut data = vec![0; len];
    file.read_exact(&mut data).unwrap();
}

struct Volume {
    id: &'static str,
    staging: PathBuf,
    target: PathBuf,
    backing: PathBuf,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_staged_volume_has_io_series_from_one_iostat_per_scrape() {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let address = stack.config.metrics_address.unwrap();
    let metadata = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (format!("csi.storage.k8s.io/{k}"), v.to_string()))
            .collect()
    };
    // (id, raw block?, what the volume context adds)
    let specs = [
        (
            "pvc-fs",
            false,
            metadata(&[
                ("pv/name", "pv-fs"),
                ("pvc/name", "data"),
                ("pvc/namespace", "team-a"),
            ]),
        ),
        ("pvc-blk", true, HashMap::new()),
        (
            "pvc-vblk",
            true,
            metadata(&[("pvc/name", "raw"), ("pvc/namespace", "team-b")])
                .into_iter()
                .chain([(EMULATION_KEY.to_string(), "virtio-blk".to_string())])
                .collect(),
        ),
    ];
    let mut volumes = Vec::new();
    for (id, block, context) in specs {
        let volume = Volume {
            id,
            staging: stack.path(&format!("staging/{id}")),
            target: stack.path(&format!("pods/p/volumes/{id}")),
            backing: stack.backing_file(&format!("{id}.img"), 64 << 20),
        };
        let capability = match block {
            true => block_capability(Mode::SingleNodeWriter),
            false => mount_capability("ext4", Mode::SingleNodeWriter),
        };
        if !block {
            std::fs::create_dir_all(&volume.target).unwrap();
        }
        std::fs::create_dir_all(&volume.staging).unwrap();
        let mut request = stage_request(id, &volume.staging, capability.clone(), &volume.backing);
        request.volume_context.extend(context);
        node.node_stage_volume(request).await.unwrap();
        let publish = publish_request(id, &volume.staging, &volume.target, capability, false);
        node.node_publish_volume(publish).await.unwrap();
        volumes.push(volume);
    }

    // The first scrape of this process: exactly one read of SNAP's counters
    // for the three volumes, and each volume's series with its names.
    let before = scrape(address).await;
    assert_eq!(iostat_calls(&before), 1.0, "{before}");
    if stack.agent.is_some() {
        let link = r#"snap_csi_outbound_requests_total{target="dpu-agent",method="GetIoStats",outcome="ok"}"#;
        assert_eq!(sample(&before, link), Some(1.0), "{before}");
    }
    assert_eq!(
        sample(&before, "snap_csi_volume_io_up"),
        Some(1.0),
        "{before}"
    );
    let labels = [
        (
            "pvc-fs",
            r#"volume_id="pvc-fs",pv="pv-fs",pvc="data",pvc_namespace="team-a""#,
        ),
        ("pvc-blk", r#"volume_id="pvc-blk""#),
        (
            "pvc-vblk",
            r#"volume_id="pvc-vblk",pvc="raw",pvc_namespace="team-b""#,
        ),
    ];
    let value = |page: &str, labels: &str, name: &str| {
        sample(page, &format!("snap_csi_volume_{name}_total{{{labels}}}"))
            .unwrap_or_else(|| panic!("no {name} of {{{labels}}} in:\n{page}"))
    };
    for (_, labels) in labels {
        for name in [
            "read_bytes",
            "written_bytes",
            "reads_completed",
            "writes_completed",
            "read_time_seconds",
            "write_time_seconds",
        ] {
            assert!(value(&before, labels, name) >= 0.0);
        }
    }

    // Through the host's devices: 1 MiB written (and flushed) to each
    // volume, 1 MiB read from each raw one where nothing was read before.
    const MIB: usize = 1 << 20;
    for volume in &volumes {
        let (path, offset) = match volume.id {
            "pvc-fs" => (volume.target.join("data.bin"), 0),
            _ => (volume.target.clone(), 1 << 20),
        };
        write_flushed(&path, offset, &vec![0x5a; MIB]);
        if volume.id != "pvc-fs" {
            read_uncached(&volume.target, 32 << 20, MIB);
        }
    }
    // The next read of the counters, once the first no longer serves.
    tokio::time::sleep(FRESH_FOR).await;
    let after = scrape(address).await;
    assert_eq!(iostat_calls(&after), 2.0, "{after}");
    for (id, labels) in labels {
        // What the volume's bdev counted of the host's I/O (the emulator
        // counts what reaches its disks).
        let grew = |name: &str| value(&after, labels, name) - value(&before, labels, name);
        let (written, writes) = (grew("written_bytes"), grew("writes_completed"));
        assert!(
            written >= MIB as f64 && writes >= 1.0,
            "{id}: {written} bytes in {writes} writes"
        );
        if id != "pvc-fs" {
            let (read, reads) = (grew("read_bytes"), grew("reads_completed"));
            assert!(
                read >= MIB as f64 && reads >= 1.0,
                "{id}: {read} bytes in {reads} reads"
            );
        }
    }
    let page = after;

    // Scrapes that come together share one read: at most one per interval
    // they spread over (eight at once on a loaded machine may straddle the
    // end of one).
    let calls = iostat_calls(&page);
    let together = Instant::now();
    let pages = futures::future::join_all((0..8).map(|_| scrape(address))).await;
    let spread = together.elapsed();
    let after = pages.iter().map(|p| iostat_calls(p)).fold(0.0, f64::max);
    let most = 1.0 + (spread.as_secs_f64() / FRESH_FOR.as_secs_f64()).floor();
    assert!(
        after - calls <= most,
        "8 scrapes over {spread:?} made {} reads",
        after - calls
    );
    assert!(pages.iter().all(|p| p.contains(r#"volume_id="pvc-vblk""#)));
    // Past the interval a scrape reads again, once; the next one shares it
    // if it is answered within the interval of the first one's start. A
    // pair that a loaded machine spread wider says nothing of sharing: it is
    // tried again (its first scrape is checked all the same).
    let mut calls = after;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        tokio::time::sleep(FRESH_FOR).await;
        let first = Instant::now();
        let read = iostat_calls(&scrape(address).await);
        assert_eq!(read, calls + 1.0, "a scrape past the interval reads again");
        calls = iostat_calls(&scrape(address).await);
        if first.elapsed() < FRESH_FOR {
            assert_eq!(calls, read, "a scrape within the interval shares the read");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no two scrapes within {FRESH_FOR:?} of each other"
        );
    }

    // SNAP holds its answers: the scrape answers by the read's deadline,
    // without the series rather than with old counts.
    stack.emulator.faults.hold();
    tokio::time::sleep(FRESH_FOR).await;
    let started = Instant::now();
    let page = scrape(address).await;
    assert_kept_deadline("a scrape while SNAP holds", started, READ_TIMEOUT);
    assert_eq!(sample(&page, "snap_csi_volume_io_up"), Some(0.0), "{page}");
    assert_eq!(
        sample(&page, "snap_csi_volume_io_errors_total"),
        Some(1.0),
        "{page}"
    );
    assert!(
        !page.contains("snap_csi_volume_read_bytes_total{"),
        "{page}"
    );
    stack.emulator.faults.release();
    let page = scrape(address).await;
    assert_eq!(sample(&page, "snap_csi_volume_io_up"), Some(1.0), "{page}");

    // Unstaged: its series are gone from the next page, the others stay.
    let gone = &volumes[1];
    unpublish(&mut node, gone.id, &gone.target).await;
    unstage(&mut node, gone.id, &gone.staging).await;
    let page = scrape(address).await;
    assert!(!page.contains(r#"volume_id="pvc-blk""#), "{page}");
    assert!(page.contains(r#"volume_id="pvc-fs""#), "{page}");

    for volume in &volumes[..] {
        if volume.id != gone.id {
            unpublish(&mut node, volume.id, &volume.target).await;
            unstage(&mut node, volume.id, &volume.staging).await;
        }
    }
    for volume in &volumes {
        stack.assert_nothing_left(&volume.backing).await;
    }
    let page = scrape(address).await;
    assert!(
        !page.contains("snap_csi_volume_written_bytes_total{"),
        "{page}"
    );
}
