//! `csi-player`: plays external-provisioner and kubelet against a running
//! snap-csi stack (`hack/local-up.sh` prints the endpoints), over real gRPC.
//!
//! Each volume goes through its whole life — CreateVolume, NodeStage,
//! NodePublish, a write and a read-back through the published path,
//! NodeUnpublish, NodeUnstage, DeleteVolume — and the player prints one table
//! row per volume with how long each step took. Any failure stops the run
//! with a non-zero exit.

use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::controller_client::ControllerClient;
use snap_csi::proto::csi::v1::node_client::NodeClient;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use snap_csi::proto::csi::v1::volume_capability::{
    AccessMode, AccessType, BlockVolume, MountVolume,
};
use tonic::transport::{Channel, Endpoint};

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
    /// Volumes as backend:emulation:kind, comma separated (kind: ext4, xfs, block).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "aio:nvme:ext4,aio:virtio-blk:xfs,aio:nvme:block,nvmf:nvme:xfs,nvmf:virtio-blk:ext4,nvmf:virtio-blk:block"
    )]
    volumes: Vec<String>,
    /// Size of each volume in MiB (xfs needs at least 300).
    #[arg(long, default_value_t = 512)]
    size_mib: i64,
}

/// One volume's plan.
#[derive(Debug, Clone)]
struct Plan {
    backend: String,
    emulation: String,
    kind: String,
}

impl Plan {
    fn parse(spec: &str) -> anyhow::Result<Plan> {
        let parts: Vec<&str> = spec.split(':').collect();
        let [backend, emulation, kind] = parts[..] else {
            bail!("{spec:?}: expected backend:emulation:kind");
        };
        if !matches!(kind, "ext4" | "xfs" | "block") {
            bail!("{spec:?}: kind must be ext4, xfs or block");
        }
        Ok(Plan {
            backend: backend.into(),
            emulation: emulation.into(),
            kind: kind.into(),
        })
    }

    fn capability(&self) -> csi::VolumeCapability {
        let access_type = match self.kind.as_str() {
            "block" => AccessType::Block(BlockVolume {}),
            fs => AccessType::Mount(MountVolume {
                fs_type: fs.into(),
                mount_flags: vec!["noatime".into()],
                volume_mount_group: String::new(),
            }),
        };
        csi::VolumeCapability {
            access_type: Some(access_type),
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
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

async fn channel(endpoint: &str) -> anyhow::Result<Channel> {
    Endpoint::try_from(endpoint.to_string())
        .with_context(|| format!("endpoint {endpoint}"))?
        .connect()
        .await
        .with_context(|| format!("connecting to {endpoint}"))
}

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
    controller: &mut ControllerClient<Channel>,
    node: &mut NodeClient<Channel>,
    index: usize,
    plan: &Plan,
) -> anyhow::Result<Vec<Duration>> {
    let mut times = Vec::new();
    let name = format!(
        "player-{index}-{}-{}-{}",
        plan.backend, plan.emulation, plan.kind
    );
    let capability = plan.capability();
    let block = plan.kind == "block";
    let volume = timed(&mut times, "CreateVolume", async {
        let response = controller
            .create_volume(csi::CreateVolumeRequest {
                name: name.clone(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: args.size_mib << 20,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![capability.clone()],
                parameters: [
                    ("backend".to_string(), plan.backend.clone()),
                    ("snap-csi.io/emulation".to_string(), plan.emulation.clone()),
                ]
                .into(),
                ..Default::default()
            })
            .await?;
        response
            .into_inner()
            .volume
            .context("CreateVolume answered no volume")
    })
    .await?;
    let volume_id = volume.volume_id.clone();
    let staging = args
        .kubelet_dir
        .join("plugins/csi.snap-csi.io/staging")
        .join(&name);
    let target = args.kubelet_dir.join("pods/player/volumes").join(&name);
    fs::create_dir_all(&staging)?;
    fs::create_dir_all(target.parent().context("target has a parent")?)?;

    timed(&mut times, "NodeStageVolume", async {
        node.node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: volume_id.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(capability.clone()),
            volume_context: volume.volume_context.clone(),
            ..Default::default()
        })
        .await?;
        Ok(())
    })
    .await?;
    timed(&mut times, "NodePublishVolume", async {
        node.node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: volume_id.clone(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(capability.clone()),
            volume_context: volume.volume_context.clone(),
            ..Default::default()
        })
        .await?;
        Ok(())
    })
    .await?;
    let data: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    timed(&mut times, "write", async { write(&target, block, &data) }).await?;
    let back = timed(&mut times, "read", async {
        read(&target, block, data.len())
    })
    .await?;
    if back != data {
        bail!("{name}: the bytes read back differ from those written");
    }
    timed(&mut times, "NodeUnpublishVolume", async {
        node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: volume_id.clone(),
            target_path: target.display().to_string(),
        })
        .await?;
        Ok(())
    })
    .await?;
    timed(&mut times, "NodeUnstageVolume", async {
        node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: volume_id.clone(),
            staging_target_path: staging.display().to_string(),
        })
        .await?;
        Ok(())
    })
    .await?;
    timed(&mut times, "DeleteVolume", async {
        controller
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: volume_id.clone(),
                secrets: Default::default(),
            })
            .await?;
        Ok(())
    })
    .await?;
    let _ = fs::remove_dir(&staging);
    Ok(times)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let plans = args
        .volumes
        .iter()
        .map(|spec| Plan::parse(spec))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut controller = ControllerClient::new(channel(&args.controller).await?);
    let mut node = NodeClient::new(channel(&args.node).await?);

    print!("{:<6} {:<11} {:<6}", "backend", "emulation", "kind");
    for step in STEPS {
        print!(" {step:>9}");
    }
    println!("  (ms)");
    let started = Instant::now();
    for (index, plan) in plans.iter().enumerate() {
        let times = lifecycle(&args, &mut controller, &mut node, index, plan)
            .await
            .with_context(|| {
                format!(
                    "volume {index} ({}:{}:{})",
                    plan.backend, plan.emulation, plan.kind
                )
            })?;
        print!(
            "{:<7} {:<11} {:<6}",
            plan.backend, plan.emulation, plan.kind
        );
        for time in times {
            print!(" {:>9.1}", time.as_secs_f64() * 1000.0);
        }
        println!();
    }
    println!(
        "{} volumes through their whole life in {:.2} s",
        plans.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
