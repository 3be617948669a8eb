//! A remote volume's network paths, seen from outside as a user would check
//! them: one cut on the NVMe-oF target while a pod writes, and what the pod
//! saw meanwhile (the longest a single write waited, and any error), then
//! every byte read back.
//!
//! A path is cut one of two ways ([`How`]). [`How::Listener`] removes its
//! listener from the volume's subsystem on the target: SPDK then closes the
//! connections that came in through it, so the initiator knows at once (a
//! port shut down); the sample controller puts a lost listener back within
//! its re-export period, which is the path's return. [`How::Silent`] drops
//! the path's packets ([`Blackhole`]) as a cable pulled or a switch dead
//! would: nothing is closed, the initiator finds out only by its own
//! timeouts; the path returns when the [`Cut`] is dropped.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::fcntl::OFlag;
use snap_csi::jsonrpc::RpcClient;
pub use snap_csi::spdk::nvmf::ListenAddress;
use snap_csi::spdk::nvmf::{NvmfGetSubsystems, NvmfSubsystemRemoveListener};

use crate::prom::Page;

/// One write: small enough that a stall shows as itself, not as bandwidth.
const BLOCK: usize = 64 << 10;

/// The listeners of subsystem `nqn` on the target behind `socket`: the
/// volume's paths, as the target serves them now.
pub async fn listeners(socket: &Path, nqn: &str) -> anyhow::Result<Vec<ListenAddress>> {
    let get = NvmfGetSubsystems {
        nqn: Some(nqn.to_string()),
    };
    let subsystems = RpcClient::new(socket)
        .call(&get)
        .await
        .with_context(|| format!("listing subsystem {nqn} on the target"))?;
    Ok(subsystems
        .into_iter()
        .flat_map(|s| s.listen_addresses)
        .collect())
}

/// A path as the sample plugin's `/metrics` shows it: whether SPDK has it
/// connected and whether I/O goes through it; `None` when the page has no
/// such path of the volume.
pub fn plugin_state(page: &Page, volume_id: &str, path: &ListenAddress) -> Option<(bool, bool)> {
    let labels = [
        ("volume_id", volume_id),
        ("traddr", path.traddr.as_str()),
        ("trsvcid", path.trsvcid.as_str()),
    ];
    let connected = page.value("snap_csi_plugin_nvmf_path_connected", &labels)?;
    let current = page.value("snap_csi_plugin_nvmf_path_current", &labels)?;
    Some((connected == 1.0, current == 1.0))
}

/// `ADDR:PORT`, as a path is shown.
pub fn show(path: &ListenAddress) -> String {
    format!("{}:{}", path.traddr, path.trsvcid)
}

/// How often a wait below looks again.
const POLL: Duration = Duration::from_millis(50);

/// Waits until the target lists `path` of `nqn` again (the controller's
/// re-export of a cut listener); an error once `deadline` has passed.
pub async fn wait_listed(
    socket: &Path,
    nqn: &str,
    path: &ListenAddress,
    deadline: Instant,
) -> anyhow::Result<()> {
    while !listeners(socket, nqn).await?.contains(path) {
        if Instant::now() >= deadline {
            bail!(
                "the controller did not restore listener {} of {nqn}",
                show(path)
            );
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}

/// Whether every path is connected, and then which one is current (the
/// index of the first marked so): `None` while a path is not connected, or
/// the page does not show it.
pub fn all_connected(states: &[Option<(bool, bool)>]) -> Option<Option<usize>> {
    if states.is_empty() || !states.iter().all(|s| s.is_some_and(|(c, _)| c)) {
        return None;
    }
    Some(states.iter().position(|s| s.is_some_and(|(_, cur)| cur)))
}

/// Waits until the plugin's page (`metrics`) shows every one of `all`
/// connected; the path I/O goes through then, if the page names one. An
/// error once `deadline` has passed.
pub async fn wait_connected(
    metrics: &str,
    volume_id: &str,
    all: &[ListenAddress],
    deadline: Instant,
) -> anyhow::Result<Option<ListenAddress>> {
    loop {
        let page = crate::prom::scrape(metrics).await?;
        let states: Vec<_> = all
            .iter()
            .map(|p| plugin_state(&page, volume_id, p))
            .collect();
        if let Some(current) = all_connected(&states) {
            return Ok(current.map(|i| all[i].clone()));
        }
        if Instant::now() >= deadline {
            bail!(
                "the plugin's page does not show every path of {volume_id} connected: {states:?}"
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// How a path is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// The target removes the path's listener and closes its connections.
    Listener,
    /// The path's packets are dropped; no connection is told.
    Silent,
}

/// A path cut by [`cut_as`]: a silent cut lasts as long as this value.
#[derive(Debug)]
pub enum Cut {
    Listener,
    Silent(Blackhole),
}

/// Cuts `path` of `nqn` (on the target behind `socket`) as `how` says.
pub async fn cut_as(
    how: How,
    socket: &Path,
    nqn: &str,
    path: &ListenAddress,
) -> anyhow::Result<Cut> {
    match how {
        How::Listener => cut(socket, nqn, path).await.map(|()| Cut::Listener),
        How::Silent => Blackhole::new(path).map(Cut::Silent),
    }
}

/// Removes `path`'s listener from `nqn` on the target behind `socket`
/// ([`How::Listener`]).
pub async fn cut(socket: &Path, nqn: &str, path: &ListenAddress) -> anyhow::Result<()> {
    let remove = NvmfSubsystemRemoveListener {
        nqn: nqn.to_string(),
        listen_address: path.clone(),
    };
    RpcClient::new(socket)
        .call(&remove)
        .await
        .with_context(|| {
            format!(
                "removing listener {}:{} of {nqn}",
                path.traddr, path.trsvcid
            )
        })?;
    Ok(())
}

/// One path's packets dropped, both ways, until dropped itself: an
/// nftables table of its own (`inet snapcsi_cut_<pid>_<n>`), nothing else
/// on the machine touched, deleted by `Drop` (a test that panics unwinds
/// through it too). Its one chain, on the input hook ahead of every other
/// (priority -300), drops every TCP packet to or from the listener's
/// address and port: on loopback, where the tests' target and initiator
/// meet, each packet of the path passes that hook once, so the path goes
/// silent both ways; nothing is refused or reset, so no socket hears of it
/// (a drop on the output hook is reported to the local sender, its
/// transmit failing with EPERM: not silent). With a target on another
/// machine, its packets are dropped as they arrive here, which is what the
/// initiator sees of a dead link (the target still gets the requests). A
/// process killed outright leaves its table behind, named by its pid:
/// `nft delete table inet snapcsi_cut_<pid>_<n>`.
#[derive(Debug)]
pub struct Blackhole {
    table: String,
}

impl Blackhole {
    pub fn new(path: &ListenAddress) -> anyhow::Result<Blackhole> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let table = format!(
            "snapcsi_cut_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let ruleset = blackhole_ruleset(&table, path)?;
        nft(&ruleset).with_context(|| format!("silencing path {}", show(path)))?;
        Ok(Blackhole { table })
    }

    /// The table's name, as `nft list tables` shows it.
    pub fn table(&self) -> &str {
        &self.table
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        if let Err(error) = nft(&format!("delete table inet {}\n", self.table)) {
            eprintln!("could not remove nftables table {}: {error:#}", self.table);
        }
    }
}

/// The nftables script that makes table `table` drop `path`'s packets.
fn blackhole_ruleset(table: &str, path: &ListenAddress) -> anyhow::Result<String> {
    let family = match path.adrfam.to_ascii_lowercase().as_str() {
        "ipv4" => "ip",
        "ipv6" => "ip6",
        other => bail!("cannot silence a path of address family {other:?}"),
    };
    if !path.trtype.eq_ignore_ascii_case("tcp") {
        bail!("cannot silence a path of transport {:?}", path.trtype);
    }
    let address: std::net::IpAddr = path
        .traddr
        .parse()
        .with_context(|| format!("path address {:?}", path.traddr))?;
    let port: u16 = path
        .trsvcid
        .parse()
        .with_context(|| format!("path port {:?}", path.trsvcid))?;
    Ok(format!(
        "table inet {table} {{\n\
         \tchain input {{\n\
         \t\ttype filter hook input priority -300; policy accept;\n\
         \t\t{family} daddr {address} tcp dport {port} drop\n\
         \t\t{family} saddr {address} tcp sport {port} drop\n\
         \t}}\n\
         }}\n"
    ))
}

/// Runs `nft -f -` on `script`.
fn nft(script: &str) -> anyhow::Result<()> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running nft")?;
    child
        .stdin
        .take()
        .context("nft's stdin")?
        .write_all(script.as_bytes())?;
    let output = child.wait_with_output()?;
    if !output.status.success() {
        bail!(
            "nft: {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// What the writer saw.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    pub writes: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// The longest one write took.
    pub longest: Duration,
    /// The longest since [`Writer::take_window`] last looked.
    window: Duration,
}

/// How far the writer has come, and what it saw.
#[derive(Debug, Default)]
struct Progress {
    seen: Mutex<Seen>,
    moved: Condvar,
}

/// Writes a block device one block at a time (O_DIRECT, each write to the
/// device before the next: the pod's `fsync`ed writes), round and round
/// over `span` bytes from `offset`, each block a pattern naming its round,
/// timing every write.
#[derive(Debug)]
pub struct Writer {
    device: PathBuf,
    offset: u64,
    progress: Arc<Progress>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<anyhow::Result<Vec<u32>>>>,
}

impl Writer {
    pub fn start(device: &Path, offset: u64, span: u64) -> anyhow::Result<Writer> {
        let file = open(device)?;
        let blocks = usize::try_from(span)? / BLOCK;
        if blocks == 0 {
            bail!("a span of {span} bytes holds no {BLOCK}-byte block");
        }
        let progress = Arc::new(Progress::default());
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (progress, stop) = (progress.clone(), stop.clone());
            std::thread::spawn(move || write_rounds(&file, offset, blocks, &progress, &stop))
        };
        Ok(Writer {
            device: device.to_path_buf(),
            offset,
            progress,
            stop,
            thread: Some(thread),
        })
    }

    /// What it has seen so far.
    pub fn seen(&self) -> Seen {
        lock(&self.progress.seen).clone()
    }

    /// The longest one write took since the last call (or the start): the
    /// stall of one window, such as a path's failure.
    pub fn take_window(&self) -> Duration {
        std::mem::take(&mut lock(&self.progress.seen).window)
    }

    /// Waits until `more` writes beyond those done now have ended, well or
    /// not; `false` if `within` passed first (the writer is stuck).
    pub fn wait_writes(&self, more: u64, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut seen = lock(&self.progress.seen);
        let goal = seen.writes + seen.errors + more;
        while seen.writes + seen.errors < goal {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            seen = self
                .progress
                .moved
                .wait_timeout(seen, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }

    /// Stops writing; [`Written::verify`] then reads it back.
    pub fn stop(mut self) -> anyhow::Result<Written> {
        self.stop.store(true, Ordering::Relaxed);
        let rounds = self
            .thread
            .take()
            .context("the writer was stopped before")?
            .join()
            .map_err(|_| anyhow::anyhow!("the writer panicked"))??;
        Ok(Written {
            device: self.device.clone(),
            offset: self.offset,
            rounds,
            seen: self.seen(),
        })
    }
}

/// What a stopped [`Writer`] wrote.
#[derive(Debug)]
pub struct Written {
    device: PathBuf,
    offset: u64,
    /// Per block, how many rounds wrote it (0: none, or its last write failed).
    rounds: Vec<u32>,
    pub seen: Seen,
}

impl Written {
    /// Reads every block back: an error unless each holds what its last
    /// write put there.
    pub fn verify(&self) -> anyhow::Result<()> {
        let file = open(&self.device)?;
        let (mut buf, mut want) = (Aligned::new(), Aligned::new());
        for (index, round) in self.rounds.iter().enumerate() {
            let Some(round) = round.checked_sub(1) else {
                continue;
            };
            let at = self.offset + (index * BLOCK) as u64;
            file.read_exact_at(buf.get(), at)
                .with_context(|| format!("reading back {} at {at}", self.device.display()))?;
            fill(want.get(), index, round);
            if buf.get() != want.get() {
                bail!(
                    "{} at {at}: the block does not hold its last write (round {round})",
                    self.device.display()
                );
            }
        }
        Ok(())
    }

    /// How many bytes the writes carried.
    pub fn bytes(&self) -> u64 {
        self.seen.writes * BLOCK as u64
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The writer's loop; returns, per block, how many rounds wrote it
/// (0: never), so that the read-back knows what each must hold.
fn write_rounds(
    file: &File,
    offset: u64,
    blocks: usize,
    progress: &Progress,
    stop: &AtomicBool,
) -> anyhow::Result<Vec<u32>> {
    let mut rounds = vec![0u32; blocks];
    let mut buf = Aligned::new();
    let mut index = 0;
    while !stop.load(Ordering::Relaxed) {
        let round = rounds[index];
        fill(buf.get(), index, round);
        let began = Instant::now();
        let result = file.write_all_at(buf.get(), offset + (index * BLOCK) as u64);
        let took = began.elapsed();
        let mut seen = lock(&progress.seen);
        seen.longest = seen.longest.max(took);
        seen.window = seen.window.max(took);
        match result {
            Ok(()) => {
                seen.writes += 1;
                rounds[index] = round + 1;
            }
            Err(error) => {
                seen.errors += 1;
                seen.first_error.get_or_insert_with(|| error.to_string());
                // What the block holds now is unknown: the read-back skips it.
                rounds[index] = 0;
            }
        }
        drop(seen);
        progress.moved.notify_all();
        index = (index + 1) % blocks;
    }
    Ok(rounds)
}

fn open(device: &Path) -> anyhow::Result<File> {
    File::options()
        .read(true)
        .write(true)
        .custom_flags((OFlag::O_DIRECT | OFlag::O_DSYNC).bits())
        .open(device)
        .with_context(|| format!("opening {}", device.display()))
}

/// Every 8 bytes: the block's index, the round and a word of the offset,
/// so a block from the wrong place or the wrong round never matches.
fn fill(buf: &mut [u8], index: usize, round: u32) {
    for (word, chunk) in buf.chunks_exact_mut(8).enumerate() {
        let value = ((index as u64) << 40) ^ (u64::from(round) << 20) ^ word as u64;
        chunk.copy_from_slice(&value.to_le_bytes());
    }
}

/// A block-sized buffer at a 4 KiB boundary, as O_DIRECT wants it.
struct Aligned {
    raw: Vec<u8>,
    start: usize,
}

impl Aligned {
    fn new() -> Aligned {
        let raw = vec![0u8; BLOCK + 4096];
        let start = raw.as_ptr().align_offset(4096);
        Aligned { raw, start }
    }

    fn get(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + BLOCK]
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_connected_names_the_current_one() {
        let up = Some((true, false));
        let current = Some((true, true));
        assert_eq!(all_connected(&[up, current]), Some(Some(1)));
        assert_eq!(all_connected(&[current, up]), Some(Some(0)));
        // Both connected, neither carrying I/O (no channel open): connected.
        assert_eq!(all_connected(&[up, up]), Some(None));
        // A path down or missing from the page (SPDK did not answer): not yet.
        assert_eq!(all_connected(&[current, Some((false, false))]), None);
        assert_eq!(all_connected(&[current, None]), None);
        assert_eq!(all_connected(&[]), None);
    }

    fn address(adrfam: &str, traddr: &str, trsvcid: &str) -> ListenAddress {
        ListenAddress {
            trtype: "tcp".into(),
            adrfam: adrfam.into(),
            traddr: traddr.into(),
            trsvcid: trsvcid.into(),
        }
    }

    #[test]
    fn a_silent_cut_drops_the_paths_packets_both_ways() {
        let rules = blackhole_ruleset("t", &address("ipv4", "127.0.0.1", "4420")).unwrap();
        assert!(rules.contains("hook input priority -300"), "{rules}");
        assert!(
            rules.contains("ip daddr 127.0.0.1 tcp dport 4420 drop"),
            "{rules}"
        );
        assert!(
            rules.contains("ip saddr 127.0.0.1 tcp sport 4420 drop"),
            "{rules}"
        );
        let v6 = blackhole_ruleset("t", &address("IPv6", "::1", "4420")).unwrap();
        assert!(v6.contains("ip6 daddr ::1 tcp dport 4420 drop"), "{v6}");
        for bad in [
            address("ipv4", "localhost", "4420"),
            address("ipv4", "127.0.0.1", "x"),
            address("ib", "127.0.0.1", "4420"),
        ] {
            assert!(blackhole_ruleset("t", &bad).is_err(), "{bad:?}");
        }
    }

    /// The real thing, as root (nftables): a connection to a silenced
    /// port neither connects nor is refused, the table is listed while the
    /// cut lasts and gone after it.
    #[test]
    fn a_silent_cut_swallows_the_port_until_dropped() {
        use std::net::{TcpListener, TcpStream};
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let root = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0");
        if !root {
            eprintln!("skipped: nftables needs root");
            return;
        }
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap();
        let path = address("ipv4", "127.0.0.1", &at.port().to_string());
        let tables = || {
            let out = Command::new("nft")
                .args(["list", "tables"])
                .output()
                .unwrap();
            String::from_utf8(out.stdout).unwrap()
        };
        let hole = Blackhole::new(&path).unwrap();
        assert!(tables().contains(hole.table()), "{}", tables());
        let error = TcpStream::connect_timeout(&at, Duration::from_millis(300)).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::TimedOut, "{error}");
        let table = hole.table().to_string();
        drop(hole);
        assert!(!tables().contains(&table), "{}", tables());
        TcpStream::connect_timeout(&at, Duration::from_secs(5)).unwrap();
    }

    #[test]
    fn a_block_names_its_place_and_round() {
        let (mut a, mut b) = (Aligned::new(), Aligned::new());
        fill(a.get(), 3, 7);
        fill(b.get(), 3, 7);
        assert_eq!(a.get(), b.get());
        fill(b.get(), 4, 7);
        assert_ne!(a.get(), b.get());
        fill(b.get(), 3, 8);
        assert_ne!(a.get(), b.get());
    }

    #[test]
    fn writes_are_read_back_and_a_changed_block_is_caught() {
        let dir = std::env::temp_dir().join(format!("paths-writer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let device = dir.join("disk");
        std::fs::write(&device, vec![0u8; 8 * BLOCK]).unwrap();
        let writer = Writer::start(&device, BLOCK as u64, 4 * BLOCK as u64).unwrap();
        assert!(writer.wait_writes(10, Duration::from_secs(60)));
        let written = writer.stop().unwrap();
        assert!(written.seen.writes >= 10, "{:?}", written.seen);
        assert_eq!(
            (written.seen.errors, written.bytes()),
            (0, written.seen.writes * BLOCK as u64)
        );
        written.verify().unwrap();

        // Another block where the first one's last write should be.
        let mut buf = Aligned::new();
        fill(buf.get(), 9, 0);
        open(&device)
            .unwrap()
            .write_all_at(buf.get(), BLOCK as u64)
            .unwrap();
        let error = written.verify().unwrap_err().to_string();
        assert!(error.contains("does not hold its last write"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
