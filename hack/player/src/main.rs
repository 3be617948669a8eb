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
//! writes, without an error or a lost byte (`failover`). Given a second
//! host, a ReadWriteMany filesystem volume is used by both at once
//! (`shared`).

mod failover;
mod proofs;
mod shared;

use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use snap_csi_harness::csi::{Clients, Kind, parameters};

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

/// 1 MiB written past where mkfs or a partition table would go.
const OFFSET: u64 = 4 << 20;

fn data_path(target: &Path, block: bool) -> PathBuf {
    if block {
        target.to_path_buf()
    } else {
        target.join("player.bin")
    }
}

fn write(target: &Path, block: bool, data: &[u8]) -> anyhow::Result<()> {
    let path = data_path(target, block);
    let mut file = OpenOptions::new()
        .write(true)
        .create(!block)
        .open(&path)
        .with_context(|| path.display().to_string())?;
    if block {
        file.seek(SeekFrom::Start(OFFSET))?;
    }
    file.write_all(data)?;
    file.sync_all()?;
    Ok(())
}

fn read(target: &Path, block: bool, len: usize) -> anyhow::Result<Vec<u8>> {
    let path = data_path(target, block);
    let mut file = fs::File::open(&path).with_context(|| path.display().to_string())?;
    if block {
        file.seek(SeekFrom::Start(OFFSET))?;
    }
    let mut data = vec![0; len];
    file.read_exact(&mut data)?;
    Ok(data)
}

async fn lifecycle(
    args: &Args,
    clients: &mut Clients,
    index: usize,
    plan: &Plan,
) -> anyhow::Result<(Vec<Duration>, Option<String>)> {
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
    timed(&mut times, "NodeStageVolume", clients.stage(&volume)).await?;
    timed(&mut times, "NodePublishVolume", clients.publish(&volume)).await?;
    let data: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    let target = &volume.target;
    timed(&mut times, "write", async { write(target, block, &data) }).await?;
    let back = timed(&mut times, "read", async {
        read(target, block, data.len())
    })
    .await?;
    if back != data {
        bail!("{name}: the bytes read back differ from those written");
    }
    let mut proof = match plan.feature {
        Feature::Qos => Some(format!(
            "{}\n  {}",
            proofs::qos(clients, &volume, target).await?,
            proofs::volume_io(&volume)?
        )),
        Feature::Multipath => {
            let (Some(socket), Some(page)) = (&args.nvmf_target_socket, &args.plugin_metrics)
            else {
                bail!("a multipath volume needs NVMF_TARGET_SOCKET and PLUGIN_METRICS");
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
    Ok((times, proof))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let plans = args
        .volumes
        .iter()
        .map(|spec| Plan::parse(spec))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut clients = Clients::connect(&args.controller, &args.node).await?;

    print!("{:<7} {:<11} {:<8}", "backend", "emulation", "kind");
    for step in STEPS {
        print!(" {step:>9}");
    }
    println!("  (ms)");
    let started = Instant::now();
    for (index, plan) in plans.iter().enumerate() {
        let (times, proof) = lifecycle(&args, &mut clients, index, plan)
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
            "{:<7} {:<11} {:<8}",
            plan.backend,
            plan.emulation,
            plan.kind_name()
        );
        for time in times {
            print!(" {:>9.1}", time.as_secs_f64() * 1000.0);
        }
        println!();
        if let Some(proof) = proof {
            println!("  {proof}");
        }
    }
    println!(
        "{} volumes through their whole life in {:.2} s",
        plans.len(),
        started.elapsed().as_secs_f64()
    );
    if let (Some(node), Some(kubelet)) = (&args.node2, &args.kubelet2_dir) {
        let other = shared::OtherHost {
            node: node.clone(),
            kubelet: kubelet.clone(),
        };
        let seen = shared::shared(&mut clients, &args.kubelet_dir, &other, args.size_mib)
            .await
            .context("the shared volume")?;
        for line in seen {
            println!("{line}");
        }
    }
    Ok(())
}
