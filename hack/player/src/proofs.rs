//! What the DPU's data path does to a volume, shown from outside as a user
//! would check it: an encrypted volume's storage holds no byte of what the
//! pod wrote, and a rate-limited volume writes at its limit, then at the
//! new one after ControllerModifyVolume.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use snap_csi_harness::csi::{Clients, Volume};

/// The StorageClass parameter asking for encryption, its value, and the
/// NodeStage secret holding the key (`snap_csi::dpu::crypto`).
pub const ENCRYPTION: (&str, &str) = ("snap-csi.io/encryption", "aes-xts");
pub const KEY_SECRET: &str = "encryption-key";
/// The write-bandwidth limit a QoS volume starts with, and the one
/// ControllerModifyVolume sets (MiB/s).
pub const QOS_KEY: &str = "snap-csi.io/qos-w-mbytes-per-sec";
const FIRST_LIMIT: u64 = 8;
const SECOND_LIMIT: u64 = 16;
/// How long AIO limits take to follow a change: the sample plugin's
/// `--aio-follow-period` (1 s), with room.
const AIO_FOLLOW: Duration = Duration::from_millis(1500);

/// The key the demo hands over (`SNAP_CSI_DEMO_KEY`, so that it can look
/// for it in every process's log afterwards), or a fresh AES-XTS key
/// (2 × 256 bits), as `openssl rand -hex 64` makes one.
pub fn demo_key() -> anyhow::Result<String> {
    if let Ok(key) = std::env::var("SNAP_CSI_DEMO_KEY") {
        return Ok(key);
    }
    let mut bytes = [0u8; 64];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The StorageClass parameters that start a QoS volume at its first limit.
pub fn qos_parameters() -> HashMap<String, String> {
    HashMap::from([(QOS_KEY.to_string(), FIRST_LIMIT.to_string())])
}

/// After the volume is unstaged: its AIO file holds what was written only
/// as ciphertext.
pub fn encryption(volume: &Volume, written: &[u8], offset: u64) -> anyhow::Result<String> {
    let path = volume
        .context
        .get("path")
        .context("an encrypted demo volume is an AIO volume (its context names its file)")?;
    let stored = std::fs::read(path).with_context(|| path.clone())?;
    let at = usize::try_from(offset)?;
    let region = stored
        .get(at..at + written.len())
        .context("the file is shorter than what was written")?;
    if region.iter().all(|b| *b == 0) {
        bail!("{path}: nothing reached the storage where the pod wrote");
    }
    // A plaintext leak would sit block-aligned, as the pod wrote it: look
    // for every 4 KiB block of what was written in every 4 KiB block of the
    // file (a block's first 64 bytes identify it; the written data is not
    // periodic within 64 bytes).
    let samples: std::collections::HashSet<&[u8]> =
        written.chunks(4096).map(|c| &c[..64]).collect();
    if let Some(at) = stored
        .chunks_exact(4096)
        .position(|block| samples.contains(&block[..64]))
    {
        bail!("{path}: plaintext on the storage at byte {}", at * 4096);
    }
    Ok(format!(
        "encryption: {path} holds ciphertext only (none of the {} blocks written is in any of \
         its {} blocks), and the pod read its bytes back intact",
        written.len() / 4096,
        stored.len() / 4096
    ))
}

/// Writes at the first limit, raises it with ControllerModifyVolume and
/// writes at the second; each rate must be near its limit.
pub async fn qos(clients: &mut Clients, volume: &Volume, device: &Path) -> anyhow::Result<String> {
    let first = write_rate(device, FIRST_LIMIT)?;
    let modify = HashMap::from([(QOS_KEY.to_string(), SECOND_LIMIT.to_string())]);
    clients.modify(volume, modify).await?;
    if volume.context.get("backend").map(String::as_str) == Some("aio") {
        tokio::time::sleep(AIO_FOLLOW).await;
    }
    let second = write_rate(device, SECOND_LIMIT)?;
    for (rate, limit) in [(first, FIRST_LIMIT), (second, SECOND_LIMIT)] {
        let limit = limit as f64;
        if rate > limit * 1.1 || rate < limit * 0.5 {
            bail!("writes ran at {rate:.1} MiB/s under a limit of {limit} MiB/s");
        }
    }
    Ok(format!(
        "qos: writes at {first:.1} MiB/s under a {FIRST_LIMIT} MiB/s limit; after \
         ControllerModifyVolume to {SECOND_LIMIT} MiB/s: {second:.1} MiB/s"
    ))
}

/// MiB/s of one second's worth of writes at `limit`, synced, from 8 MiB on.
fn write_rate(device: &Path, limit: u64) -> anyhow::Result<f64> {
    let bytes = limit << 20;
    let mut file = OpenOptions::new().write(true).open(device)?;
    file.seek(SeekFrom::Start(8 << 20))?;
    let chunk = vec![0x5a_u8; 1 << 20];
    let started = Instant::now();
    for _ in 0..limit {
        file.write_all(&chunk)?;
    }
    file.sync_all()?;
    Ok(bytes as f64 / (1 << 20) as f64 / started.elapsed().as_secs_f64())
}

/// The node's per-volume I/O series of `volume` on the node's page at
/// `url`, as Prometheus would scrape them while the volume is staged: the
/// bytes the DPU counted.
pub fn volume_io(url: &str, volume: &Volume) -> anyhow::Result<String> {
    let address = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .context("NODE_METRICS is http://HOST:PORT/metrics")?;
    let mut stream = std::net::TcpStream::connect(address)?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )?;
    let mut page = String::new();
    stream.read_to_string(&mut page)?;
    let label = format!("volume_id=\"{}\"", volume.id);
    let series: Vec<&str> = page
        .lines()
        .filter(|l| l.starts_with("snap_csi_volume_") && l.contains(&label))
        .filter(|l| l.contains("written_bytes") || l.contains("writes_completed"))
        .collect();
    if series.is_empty() {
        bail!(
            "the node's page lists no I/O of staged volume {}",
            volume.id
        );
    }
    Ok(format!("metrics: {}", series.join("\n           ")))
}
