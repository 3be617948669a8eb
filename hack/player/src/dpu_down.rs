//! One DPU of a host with two down while a pod writes on each: a raw block
//! volume pinned to each DPU, written as a pod does (O_DIRECT, each write
//! synced: the harness's [`Writer`]), then DPU B stops answering without
//! going away. Co-located, its SNAP emulator is stopped (SIGSTOP: SNAP
//! hung); split, its DPU agent, the node's one way to it. The node must see
//! it (`snap_csi_dpu_up` 0 for B, 1 for A), call B's volume abnormal with B
//! named and A's healthy, stay ready (Probe), and stage a new volume whose
//! first choice is B on A, while A's pod writes without an error. Then B
//! goes on (SIGCONT): up again, its volume healthy, and B holds nothing of
//! the new volume. Every block of both volumes is read back as last written.
//!
//! What the emulator does not model: the emulated host's devices are loop
//! devices, which the kernel serves without the emulator, so B's pod writes
//! on while its SNAP is stopped; on a BlueField whose SNAP hangs, B's I/O
//! would stall (and fail after the host's NVMe I/O timeout). A stopped agent
//! leaves SNAP serving, on a BlueField as here.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use snap_csi::proto::csi::v1::identity_client::IdentityClient;
use snap_csi_harness::csi::{self, Clients, Kind, Volume, parameters};
use snap_csi_harness::dpus::{self, Stopped};
use snap_csi_harness::paths::{Seen, Writer};
use snap_csi_harness::prom;

/// The node's gauge of each DPU: 1 while its last probe found it serving.
const DPU_UP: &str = "snap_csi_dpu_up";
/// How long the node may take to show B down: its next probe within 2 s,
/// which gives up after 3 s, and a scrape that waits for the DPU's I/O
/// counters (up to 5 s from a DPU that does not answer).
const SEEN_DOWN: Duration = Duration::from_secs(12);
/// How long it may take to show B up again once it answers: the next probe
/// within 2 s, on a loaded machine.
const SEEN_UP: Duration = Duration::from_secs(20);
/// How long the node's background clearing of a DPU a stage passed over
/// may take (its detach is retried after 1 s, doubling: a DPU back 8 s
/// after the stage is cleared within 15 s).
const CLEARING: Duration = Duration::from_secs(30);
/// Writes a pod makes between two events, to show it is writing.
const WRITES: u64 = 32;
/// How long the pods' writes may take on a loaded machine.
const BUDGET: Duration = Duration::from_secs(60);
/// How much each pod writes over and over (from the player's offset).
const SPAN: u64 = 64 << 20;
/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(100);
/// Names tried for a new volume whose first choice is B: the hash sends
/// half of all ids to each DPU.
const NEW_TRIES: usize = 32;
/// The liveness probe sidecar's `--probe-timeout` (deploy/kubernetes): a
/// slower Probe restarts the node's container.
const LIVENESS_TIMEOUT: Duration = Duration::from_secs(3);
/// NodeGetVolumeStats' deadline for B's volume while B is down. kubelet's
/// is 2 minutes, and the node spends all of it: for a DPU its watch knows
/// down it probes again under the caller's deadline, which a hung DPU never
/// answers. 10 s leaves that probe the 3 s the watch gives its own.
const STATS_DEADLINE: Duration = Duration::from_secs(10);

/// How DPU B is taken down.
#[derive(Debug)]
pub enum Down {
    /// Co-located: the SNAP emulator at this socket.
    Snap(PathBuf),
    /// Split: the agent serving at this endpoint.
    Agent(String),
}

impl Down {
    /// Stops the process (until the result is dropped); what was stopped.
    fn stop(&self) -> anyhow::Result<(Stopped, String)> {
        let (pid, what) = match self {
            Down::Snap(socket) => {
                let socket = socket.to_str().context("SNAP_SOCKET_B is not UTF-8")?;
                let pid = dpus::process("snap-emu", &["--socket", socket])?;
                (pid, "SNAP emulator")
            }
            Down::Agent(endpoint) => {
                let pid = dpus::process("snap-csi", &["--listen", endpoint])?;
                (pid, "DPU agent")
            }
        };
        Ok((Stopped::new(pid)?, format!("{what} (pid {pid}) stopped")))
    }

    /// What the emulator keeps doing that a BlueField may not.
    fn caveat(&self) -> &'static str {
        match self {
            Down::Snap(_) => {
                "the emulator's loop devices serve the host without SNAP; a BlueField \
                 whose SNAP hangs would stall them"
            }
            Down::Agent(_) => "its SNAP serves on without the agent, as on a BlueField",
        }
    }
}

/// The host with two DPUs, as the proof reaches it.
#[derive(Debug)]
pub struct Host {
    pub kubelet: PathBuf,
    /// The node's CSI endpoint (its Probe).
    pub node: String,
    pub node_metrics: String,
    pub state_dir: PathBuf,
    /// A, then B (the one taken down), in the node's order.
    pub dpus: [String; 2],
    pub plugin_socket_b: PathBuf,
    pub snap_socket_b: PathBuf,
    pub down: Down,
    pub size_mib: i64,
}

impl Host {
    async fn create(&self, clients: &mut Clients, name: &str) -> anyhow::Result<Volume> {
        let parameters = parameters("aio", "nvme", None);
        clients
            .create_with(&self.kubelet, name, &Kind::Block, self.size_mib, parameters)
            .await
    }

    /// The DPU the node's record puts the staged volume on, and where the
    /// host finds its device.
    fn landed(&self, volume: &Volume) -> anyhow::Result<(String, String)> {
        let (dpu, record) = dpus::recorded_on(&self.state_dir, &volume.id, &self.dpus)?;
        Ok((dpu, record.locator.to_string()))
    }

    /// Waits until the node's page shows `snap_csi_dpu_up` of A and B as
    /// `want`; how long after `since`, or an error once `budget` has passed.
    async fn wait_up(
        &self,
        want: [f64; 2],
        since: Instant,
        budget: Duration,
    ) -> anyhow::Result<f64> {
        loop {
            let page = prom::scrape(&self.node_metrics).await?;
            let now: Vec<Option<f64>> = self
                .dpus
                .iter()
                .map(|dpu| page.value(DPU_UP, &[("dpu", dpu)]))
                .collect();
            if now.iter().zip(want).all(|(now, want)| *now == Some(want)) {
                return Ok(since.elapsed().as_secs_f64());
            }
            if since.elapsed() > budget {
                bail!(
                    "the node's page shows {DPU_UP} {now:?} for {:?} after {budget:?}, not {want:?}",
                    self.dpus
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until B holds nothing of `volume` (the node clears a DPU a
    /// stage passed over in the background); how long after `since`.
    async fn wait_cleared(&self, volume: &Volume, since: Instant) -> anyhow::Result<f64> {
        loop {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            let left = dpus::held(
                &self.plugin_socket_b,
                &self.snap_socket_b,
                &volume.id,
                deadline,
            )
            .await?;
            if left.is_empty() {
                return Ok(since.elapsed().as_secs_f64());
            }
            if since.elapsed() > CLEARING {
                bail!(
                    "{} still holds new volume {} {CLEARING:?} after its return: {}",
                    self.dpus[1],
                    volume.id,
                    left.join("; ")
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// What a pod saw in one stretch: writes ended, errors, the longest write.
fn stretch(before: &Seen, now: &Seen, longest: Duration) -> String {
    format!(
        "{} writes, longest {:.0} ms, {} I/O error(s)",
        now.writes - before.writes,
        longest.as_secs_f64() * 1e3,
        now.errors - before.errors
    )
}

/// The proof's lines; an error if the node or a pod did not behave.
pub async fn dpu_down(clients: &mut Clients, host: &Host) -> anyhow::Result<Vec<String>> {
    let [a, b] = &host.dpus;
    let (mut volumes, mut devices) = (Vec::new(), Vec::new());
    for (index, dpu) in host.dpus.iter().enumerate() {
        let mut volume = host
            .create(clients, &format!("player-dpu-down-{index}"))
            .await?;
        super::pin(&mut volume, dpu);
        clients.stage(&volume).await?;
        clients.publish(&volume).await?;
        let (landed, device) = host.landed(&volume)?;
        ensure!(
            landed == *dpu,
            "{} pinned to {dpu} is on {landed}",
            volume.id
        );
        volumes.push(volume);
        devices.push(format!("{dpu}'s at {device}"));
    }
    // Made now, staged while B is down: the id decides its first choice.
    let mut tries = 0;
    let new = loop {
        let volume = host
            .create(clients, &format!("player-dpu-down-new-{tries}"))
            .await?;
        if dpus::first_choice(&host.dpus, &volume.id)? == *b {
            break volume;
        }
        clients.delete(&volume).await?;
        tries += 1;
        ensure!(
            tries < NEW_TRIES,
            "no volume of {NEW_TRIES} names goes to {b} first"
        );
    };
    let writers = volumes
        .iter()
        .map(|v| Writer::start(&v.target, super::OFFSET, SPAN))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for writer in &writers {
        ensure!(
            writer.wait_writes(WRITES, BUDGET),
            "a pod's first writes did not end"
        );
        writer.take_window();
    }
    let before: Vec<Seen> = writers.iter().map(Writer::seen).collect();

    let (stopped, what) = host.down.stop()?;
    let down_at = Instant::now();
    let mut lines = vec![format!(
        "one DPU down, {b}: its {what}, a pod writing on a volume on each DPU ({})",
        devices.join("; ")
    )];
    let seen = host.wait_up([1.0, 0.0], down_at, SEEN_DOWN).await?;
    lines.push(format!(
        "  the node's page: {DPU_UP} {b} 0, {a} 1, {seen:.1} s after the stop"
    ));

    let asked = Instant::now();
    let mut quick = Clients {
        deadline: STATS_DEADLINE,
        ..clients.clone()
    };
    let on_b = quick.condition(&volumes[1]).await?;
    let took = asked.elapsed().as_secs_f64();
    ensure!(
        on_b.abnormal && on_b.message.contains(b.as_str()),
        "NodeGetVolumeStats of {b}'s volume: {on_b:?}, not abnormal naming {b}"
    );
    let on_a = clients.condition(&volumes[0]).await?;
    ensure!(
        !on_a.abnormal,
        "NodeGetVolumeStats of {a}'s volume: {on_a:?}"
    );
    lines.push(format!(
        "  NodeGetVolumeStats of {b}'s volume (in {:.0} ms): abnormal, {:?}; {a}'s: healthy",
        took * 1e3,
        on_b.message
    ));

    let asked = Instant::now();
    let mut identity = IdentityClient::new(csi::channel(&host.node).await?);
    ensure!(
        csi::probe_within(&mut identity, LIVENESS_TIMEOUT)
            .await
            .context("Probe")?,
        "Probe is not ready (or not within the liveness probe's {LIVENESS_TIMEOUT:?}) while {a} serves"
    );
    lines.push(format!(
        "  Probe (the liveness probe's {} s deadline): ready, in {:.0} ms",
        LIVENESS_TIMEOUT.as_secs(),
        asked.elapsed().as_secs_f64() * 1e3
    ));

    let asked = Instant::now();
    clients.stage(&new).await?;
    let took = asked.elapsed().as_secs_f64();
    let (landed, device) = host.landed(&new)?;
    ensure!(
        landed == *a,
        "new volume {} (first choice {b}, down) was staged on {landed}",
        new.id
    );
    lines.push(format!(
        "  new volume {}: first choice {b} (down), staged on {landed} ({device}) in {:.0} ms",
        new.id,
        took * 1e3
    ));
    ensure!(
        writers[0].wait_writes(WRITES, BUDGET),
        "{a}'s pod stopped writing while {b} was down"
    );
    let during: Vec<String> = writers
        .iter()
        .zip(&before)
        .map(|(w, before)| stretch(before, &w.seen(), w.take_window()))
        .collect();
    lines.push(format!(
        "  while {b} was down ({:.1} s): {a}'s pod {}; {b}'s pod {} ({})",
        down_at.elapsed().as_secs_f64(),
        during[0],
        during[1],
        host.down.caveat()
    ));

    drop(stopped);
    let back_at = Instant::now();
    let up = host.wait_up([1.0, 1.0], back_at, SEEN_UP).await?;
    let on_b = clients.condition(&volumes[1]).await?;
    ensure!(
        !on_b.abnormal,
        "NodeGetVolumeStats of {b}'s volume after its return: {on_b:?}"
    );
    let cleared = host.wait_cleared(&new, back_at).await?;
    lines.push(format!(
        "  {b} back (SIGCONT): {DPU_UP} 1 after {up:.1} s, its volume healthy; it holds \
         nothing of the new volume ({cleared:.1} s after its return)"
    ));
    clients.unstage(&new).await?;
    clients.delete(&new).await?;

    let mut written = Vec::new();
    for writer in writers {
        written.push(writer.stop()?);
    }
    let on_a = &written[0].seen;
    if on_a.errors > 0 {
        bail!(
            "{a}'s pod saw {} I/O error(s) while {b} was down (first: {})",
            on_a.errors,
            on_a.first_error.as_deref().unwrap_or("?")
        );
    }
    for (done, volume) in written.iter().zip(&volumes) {
        done.verify()
            .with_context(|| format!("reading back {}", volume.id))?;
    }
    for volume in &volumes {
        clients.unpublish(volume).await?;
        clients.unstage(volume).await?;
        clients.delete(volume).await?;
    }
    lines.push(format!(
        "  {a}'s pod: {} writes ({} MiB), 0 I/O errors; {b}'s pod: {} writes ({} MiB), {} \
         I/O error(s); every block of both read back as last written; all torn down",
        on_a.writes,
        written[0].bytes() >> 20,
        written[1].seen.writes,
        written[1].bytes() >> 20,
        written[1].seen.errors
    ));
    Ok(lines)
}
