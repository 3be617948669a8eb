//! `csi-player`: plays external-provisioner and kubelet against a running
//! snap-csi stack (`hack/local-up.sh` prints the endpoints), over real gRPC.
//!
//! Each volume goes through its whole life — CreateVolume, NodeStage,
//! NodePublish, a write and a read-back through the published path,
//! NodeUnpublish, NodeUnstage, DeleteVolume — and the player prints one table
//! row per volume with how long each step took. Any failure stops the run
//! with a non-zero exit. A volume may also show what the DPU's data path
//! does (`proofs`): an encrypted one's storage holds ciphertext only, a
//! rate-limited one writes at its limit, then at the one ControllerModifyVolume
//! sets, a multipath one loses the network path its I/O takes while the pod
//! writes, without an error or a lost byte (`failover`). On a host with two
//! DPUs each row names the DPU the node's record puts the volume on, both
//! DPUs must hold some, and one DPU is taken down while a pod writes on
//! each (`dpu_down`). Given a second host, a ReadWriteMany filesystem
//! volume is used by both at once (`shared`).

mod dpu_down;
mod failover;
mod pod_host;
mod proofs;
mod shared;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use clap::Parser;
use snap_csi::node::fleet::DPU_KEY;
use snap_csi_harness::csi::{Clients, Kind, Volume, parameters};
use snap_csi_harness::dpus;

use pod_host::{OFFSET, PodHost};

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Volumes through their whole life against a snap-csi stack, timed"
)]
struct Args {
    /// The controller's CSI endpoint (`unix:///...`).
    #[arg(long, env = "CSI_CONTROLLER_ENDPOINT")]
    controller: String,
    /// The node's CSI endpoint (`unix:///...`).
    #[arg(long, env = "CSI_NODE_ENDPOINT")]
    node: String,
    /// kubelet's directory on this node; staging and target paths go below it.
    #[arg(long, env = "KUBELET_DIR")]
    kubelet_dir: PathBuf,
    /// Volumes as backend:emulation:kind[:encrypted|:qos|:multipath], comma
    /// separated (kind: ext4, xfs, block, or virtiofs for backend fs;
    /// encrypted and qos volumes are AIO block ones, whose proofs read the
    /// AIO file and write the raw device; multipath ones NVMe-oF block ones).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "aio:nvme:ext4,aio:virtio-blk:xfs,aio:nvme:block,nvmf:nvme:xfs,nvmf:virtio-blk:ext4,nvmf:virtio-blk:block,fs:virtio-fs:virtiofs,aio:nvme:block:encrypted,aio:virtio-blk:block:qos,nvmf:nvme:block:multipath"
    )]
    volumes: Vec<String>,
    /// The NVMe-oF target's JSON-RPC socket, where a multipath volume's
    /// paths are cut.
    #[arg(long, env = "NVMF_TARGET_SOCKET")]
    nvmf_target_socket: Option<PathBuf>,
    /// The sample plugin's Prometheus page, which shows each path's state.
    #[arg(long, env = "PLUGIN_METRICS")]
    plugin_metrics: Option<String>,
    /// The node's Prometheus page (per-volume I/O, each DPU's state).
    #[arg(long, env = "NODE_METRICS")]
    node_metrics: Option<String>,
    /// The node's state directory, whose records name each volume's DPU.
    #[arg(long, env = "NODE_STATE_DIR")]
    node_state_dir: PathBuf,
    /// The host's DPUs, in the node's order, comma separated
    /// (`hack/local-up.sh` prints them; `--dpus 2`: two).
    #[arg(long, env = "DPUS", value_delimiter = ',', required = true)]
    dpus: Vec<String>,
    /// The second DPU's plugin: its socket and its Prometheus page.
    #[arg(long, env = "PLUGIN_SOCKET_B")]
    plugin_socket_b: Option<PathBuf>,
    #[arg(long, env = "PLUGIN_METRICS_B")]
    plugin_metrics_b: Option<String>,
    /// The second DPU's SNAP (co-located: the process taken down).
    #[arg(long, env = "SNAP_SOCKET_B")]
    snap_socket_b: Option<PathBuf>,
    /// Split mode: the second DPU's agent (the process taken down).
    #[arg(long, env = "DPU_AGENT_ENDPOINT_B")]
    agent_endpoint_b: Option<String>,
    /// Size of each volume in MiB (xfs needs at least 300).
    #[arg(long, default_value_t = 512)]
    size_mib: i64,
    /// A second host's node endpoint (`hack/local-up.sh --second-host`): a
    /// ReadWriteMany filesystem volume is then shared by both hosts.
    #[arg(long, env = "CSI_NODE2_ENDPOINT", requires = "kubelet2_dir")]
    node2: Option<String>,
    /// The second host's kubelet directory.
    #[arg(long, env = "KUBELET2_DIR")]
    kubelet2_dir: Option<PathBuf>,
    /// The guest host's command socket (`hack/local-up.sh --host vm`): the
    /// node runs in the guest, and so does the pod's side of each volume;
    /// each row then names the device the guest's kernel mounted. One DPU,
    /// plain volumes only (the proofs read this machine's devices).
    #[arg(long, env = "GUEST_EXEC")]
    guest_exec: Option<PathBuf>,
    /// The second guest host's command socket (`hack/local-up.sh --host vm
    /// --second-host`): the second host's pods run there.
    #[arg(long, env = "GUEST2_EXEC")]
    guest2_exec: Option<PathBuf>,
}

impl Args {
    fn pod_host(&self) -> PodHost {
        PodHost::of(self.guest_exec.as_ref())
    }

    fn two_dpus(&self) -> bool {
        self.dpus.len() > 1
    }

    /// The page of the plugin of DPU `dpu`, where its volumes' paths show.
    fn plugin_metrics_of(&self, dpu: &str) -> Option<&str> {
        match self.dpus.iter().position(|d| d == dpu) {
            Some(0) => self.plugin_metrics.as_deref(),
            Some(1) => self.plugin_metrics_b.as_deref(),
            _ => None,
        }
    }

    /// The second DPU's parts the DPU-down proof needs.
    fn dpu_down_host(&self) -> anyhow::Result<dpu_down::Host> {
        let (Some(plugin_socket), Some(snap_socket), Some(node_metrics)) = (
            &self.plugin_socket_b,
            &self.snap_socket_b,
            &self.node_metrics,
        ) else {
            bail!("two DPUs need PLUGIN_SOCKET_B, SNAP_SOCKET_B and NODE_METRICS");
        };
        let down = match &self.agent_endpoint_b {
            Some(endpoint) => dpu_down::Down::Agent(endpoint.clone()),
            None => dpu_down::Down::Snap(snap_socket.clone()),
        };
        Ok(dpu_down::Host {
            kubelet: self.kubelet_dir.clone(),
            node: self.node.clone(),
            node_metrics: node_metrics.clone(),
            state_dir: self.node_state_dir.clone(),
            dpus: [self.dpus[0].clone(), self.dpus[1].clone()],
            plugin_socket_b: plugin_socket.clone(),
            snap_socket_b: snap_socket.clone(),
            down,
            size_mib: self.size_mib,
        })
    }
}

/// Pins the volume to DPU `dpu` as a PersistentVolume's volumeAttributes
/// would ([`DPU_KEY`] in its volume context): the sample controller takes no
/// such StorageClass parameter (it refuses keys it does not know).
fn pin(volume: &mut Volume, dpu: &str) {
    volume.context.insert(DPU_KEY.into(), dpu.into());
}

/// One volume's plan.
#[derive(Debug, Clone)]
struct Plan {
    backend: String,
    emulation: String,
    kind: Kind,
    feature: Feature,
}

/// What the DPU's data path does to the volume besides carrying it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Feature {
    Plain,
    Encrypted,
    Qos,
    Multipath,
}

impl Plan {
    fn parse(spec: &str) -> anyhow::Result<Plan> {
        let parts: Vec<&str> = spec.split(':').collect();
        let (backend, emulation, kind, feature) = match parts[..] {
            [backend, emulation, kind] => (backend, emulation, kind, Feature::Plain),
            [backend, emulation, kind, "encrypted"] => {
                (backend, emulation, kind, Feature::Encrypted)
            }
            [backend, emulation, kind, "qos"] => (backend, emulation, kind, Feature::Qos),
            [backend, emulation, kind, "multipath"] => {
                (backend, emulation, kind, Feature::Multipath)
            }
            _ => bail!("{spec:?}: expected backend:emulation:kind[:encrypted|:qos|:multipath]"),
        };
        match feature {
            Feature::Plain => {}
            Feature::Multipath if (backend, kind) != ("nvmf", "block") => {
                bail!("{spec:?}: multipath volumes are nvmf block volumes")
            }
            Feature::Encrypted | Feature::Qos if (backend, kind) != ("aio", "block") => {
                bail!("{spec:?}: encrypted and qos volumes are aio block volumes")
            }
            Feature::Encrypted | Feature::Qos | Feature::Multipath => {}
        }
        let kind = match kind {
            "block" => Kind::Block,
            "ext4" | "xfs" | "virtiofs" => Kind::Filesystem(kind.into()),
            _ => bail!("{spec:?}: kind must be ext4, xfs, virtiofs or block"),
        };
        Ok(Plan {
            backend: backend.into(),
            emulation: emulation.into(),
            kind,
            feature,
        })
    }

    fn kind_name(&self) -> &str {
        match &self.kind {
            Kind::Block => "block",
            Kind::Filesystem(fs) => fs,
            Kind::Shared => "shared",
        }
    }
}

const STEPS: [&str; 8] = [
    "create",
    "stage",
    "publish",
    "write",
    "read",
    "unpublish",
    "unstage",
    "delete",
];

/// Runs `step`, recording its duration under `name`.
async fn timed<T>(
    times: &mut Vec<Duration>,
    name: &str,
    step: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    let started = Instant::now();
    let result = step.await.with_context(|| name.to_string())?;
    times.push(started.elapsed());
    Ok(result)
}

/// What one volume's life showed.
struct Lived {
    /// Each of [`STEPS`]' time.
    times: Vec<Duration>,
    /// What a guest host's kernel mounted for it.
    device: Option<String>,
    /// Its proof's lines, if it has a proof.
    proof: Option<String>,
    /// The DPU the node's record put it on.
    dpu: String,
}

async fn lifecycle(
    args: &Args,
    clients: &mut Clients,
    index: usize,
    plan: &Plan,
) -> anyhow::Result<Lived> {
    let mut times = Vec::new();
    let name = format!(
        "player-{index}-{}-{}-{}",
        plan.backend,
        plan.emulation,
        plan.kind_name()
    );
    let block = plan.kind == Kind::Block;
    let mut parameters = parameters(&plan.backend, &plan.emulation, None);
    match plan.feature {
        Feature::Encrypted => {
            let (key, value) = proofs::ENCRYPTION;
            parameters.insert(key.into(), value.into());
        }
        Feature::Qos => parameters.extend(proofs::qos_parameters()),
        Feature::Multipath => {
            let (key, value) = failover::MULTIPATH;
            parameters.insert(key.into(), value.into());
        }
        Feature::Plain => {}
    }
    let mut volume = timed(
        &mut times,
        "CreateVolume",
        clients.create_with(
            &args.kubelet_dir,
            &name,
            &plan.kind,
            args.size_mib,
            parameters,
        ),
    )
    .await?;
    if plan.feature == Feature::Encrypted {
        volume
            .stage_secrets
            .insert(proofs::KEY_SECRET.into(), proofs::demo_key()?);
    }
    // local-up's second DPU makes no filesystem devices (the emulated host
    // mounts virtio-fs through the first emulator alone): such a volume
    // goes to the first.
    if plan.kind == Kind::Filesystem("virtiofs".into()) && args.two_dpus() {
        pin(&mut volume, &args.dpus[0]);
    }
    let pod = args.pod_host();
    pod.prepare(&volume)?;
    timed(&mut times, "NodeStageVolume", clients.stage(&volume)).await?;
    // The guest's node keeps its records in the guest: its one DPU.
    let dpu = match pod {
        PodHost::Local => dpus::recorded_on(&args.node_state_dir, &volume.id, &args.dpus)?.0,
        PodHost::Guest(_) => args.dpus[0].clone(),
    };
    timed(&mut times, "NodePublishVolume", clients.publish(&volume)).await?;
    let data: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    let target = &volume.target;
    timed(&mut times, "write", async {
        pod.write(target, block, &data)
    })
    .await?;
    let back = timed(&mut times, "read", async {
        pod.read(target, block, data.len())
    })
    .await?;
    let device = pod.device(target)?;
    if back != data {
        bail!("{name}: the bytes read back differ from those written");
    }
    let mut proof = match plan.feature {
        Feature::Qos => Some(format!(
            "{}\n  {}",
            proofs::qos(clients, &volume, target).await?,
            proofs::volume_io(
                args.node_metrics
                    .as_deref()
                    .context("a qos volume needs NODE_METRICS")?,
                &volume
            )?
        )),
        Feature::Multipath => {
            let (Some(socket), Some(page)) =
                (&args.nvmf_target_socket, args.plugin_metrics_of(&dpu))
            else {
                bail!("a multipath volume needs NVMF_TARGET_SOCKET and its DPU's plugin's page");
            };
            Some(failover::failover(&volume, socket, page).await?)
        }
        Feature::Plain | Feature::Encrypted => None,
    };
    timed(
        &mut times,
        "NodeUnpublishVolume",
        clients.unpublish(&volume),
    )
    .await?;
    timed(&mut times, "NodeUnstageVolume", clients.unstage(&volume)).await?;
    if plan.feature == Feature::Encrypted {
        proof = Some(proofs::encryption(&volume, &data, OFFSET)?);
    }
    timed(&mut times, "DeleteVolume", clients.delete(&volume)).await?;
    Ok(Lived {
        times,
        device,
        proof,
        dpu,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let plans = args
        .volumes
        .iter()
        .map(|spec| Plan::parse(spec))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if args.guest_exec.is_some() {
        ensure!(!args.two_dpus(), "a guest host (GUEST_EXEC) has one DPU");
        ensure!(
            args.node2.is_none() || args.guest2_exec.is_some(),
            "the second host of a guest host is a guest too (GUEST2_EXEC)"
        );
        ensure!(
            plans.iter().all(|p| p.feature == Feature::Plain),
            "a guest host's volumes are plain ones (the proofs read this machine's devices)"
        );
    }
    let mut clients = Clients::connect(&args.controller, &args.node).await?;

    print!(
        "{:<7} {:<11} {:<8} {:<11}",
        "backend", "emulation", "kind", "dpu"
    );
    for step in STEPS {
        print!(" {step:>9}");
    }
    println!("  (ms)");
    let started = Instant::now();
    let mut landed: Vec<String> = Vec::new();
    for (index, plan) in plans.iter().enumerate() {
        let lived = lifecycle(&args, &mut clients, index, plan)
            .await
            .with_context(|| {
                format!(
                    "volume {index} ({}:{}:{})",
                    plan.backend,
                    plan.emulation,
                    plan.kind_name()
                )
            })?;
        print!(
            "{:<7} {:<11} {:<8} {:<11}",
            plan.backend,
            plan.emulation,
            plan.kind_name(),
            lived.dpu
        );
        for time in lived.times {
            print!(" {:>9.1}", time.as_secs_f64() * 1000.0);
        }
        println!();
        if let Some(device) = lived.device {
            println!("  the guest's kernel mounted {device}");
        }
        if let Some(proof) = lived.proof {
            println!("  {proof}");
        }
        landed.push(lived.dpu);
    }
    println!(
        "{} volumes through their whole life in {:.2} s",
        plans.len(),
        started.elapsed().as_secs_f64()
    );
    if args.two_dpus() {
        let counts: Vec<(&String, usize)> = args
            .dpus
            .iter()
            .map(|dpu| (dpu, landed.iter().filter(|d| *d == dpu).count()))
            .collect();
        let shown: Vec<String> = counts.iter().map(|(d, n)| format!("{d} {n}")).collect();
        println!("volumes by DPU (the node's records): {}", shown.join(", "));
        ensure!(
            counts.iter().all(|(_, n)| *n > 0),
            "the node placed no volume on some DPU: {}",
            shown.join(", ")
        );
        let host = args.dpu_down_host()?;
        let seen = dpu_down::dpu_down(&mut clients, &host)
            .await
            .context("one DPU down")?;
        for line in seen {
            println!("{line}");
        }
    }
    if let (Some(node), Some(kubelet)) = (&args.node2, &args.kubelet2_dir) {
        let other = shared::OtherHost {
            node: node.clone(),
            kubelet: kubelet.clone(),
            pod: PodHost::of(args.guest2_exec.as_ref()),
        };
        // On a host with two DPUs, host A's stage pins the volume to the
        // first, as the player's virtio-fs volumes are.
        let pinned = args.two_dpus().then(|| args.dpus[0].as_str());
        let seen = shared::shared(
            &mut clients,
            (&args.kubelet_dir, &args.pod_host()),
            &other,
            args.size_mib,
            pinned,
        )
        .await
        .context("the shared volume")?;
        for line in seen {
            println!("{line}");
        }
    }
    Ok(())
}
