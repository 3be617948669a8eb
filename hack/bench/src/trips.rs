//! Section 7's round trips: the dependent SNAP round trips of one stage and
//! one unstage for each placement, counted by the emulator's own poller
//! (`snap_emu::Rounds`), not inferred from time. The emulator runs in this
//! process with replies on the next tick (`counting_round_trips`), the
//! sample plugin in front of it, and the node's DPU attach layer
//! (`Colocated`: what NodeStage and NodeUnstage run co-located, and the
//! agent in split mode) makes every SNAP and plugin call of a stage; the
//! node's own work (its record, the mount) calls neither. Each attach is
//! followed, as in a stage, by waiting until the host shows the disk.
//!
//! Section 8 counts the same way a dedicated stage and unstage plain and
//! encrypted (`count_encryption`): the encrypted one adds the key and the
//! crypto bdev over the plugin's.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;
use snap_csi::dpu::colocated::Colocated;
use snap_csi::dpu::crypto::{AES_XTS_VALUE, ENCRYPTION, KEY_SECRET};
use snap_csi::dpu::plugin::AccessMode;
use snap_csi::dpu::{
    AttachRequest, Attachment, DpuAttach, Emulation, HostLocator, Placement, VolumeMode,
};
use snap_csi::host::Sysfs;
use snap_csi_spdk_plugin::backend::{AIO, BACKEND_KEY, PATH_KEY};
use snap_csi_spdk_plugin::service::ServiceConfig;
use snap_emu::{Config, InProcess};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::Args;

/// Dependent round trips, each as the emulator's count moved.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Trips {
    /// The poller period they were counted at (µs).
    pub period_us: u64,
    /// A new volume's attach, and its detach, with its own function.
    pub dedicated_attach: Vec<u64>,
    pub dedicated_detach: Vec<u64>,
    /// The same, packed: the first volume builds its pool (subsystem,
    /// controller on a free function, resume), the others are a namespace
    /// on its live controller.
    pub packed_attach: Vec<u64>,
    pub packed_detach: Vec<u64>,
}

impl Trips {
    /// (placement, attaches, detaches), for the table.
    pub fn rows(&self) -> Vec<(&'static str, &[u64], &[u64])> {
        let (first, rest) = self.packed_attach.split_at(self.packed_attach.len().min(1));
        vec![
            ("dedicated", &self.dedicated_attach, &self.dedicated_detach),
            ("packed, building its pool", first, &[]),
            ("packed, onto the live pool", rest, &self.packed_detach),
        ]
    }

    /// The most round trips a packed stage onto a live pool took.
    pub fn packed_live(&self) -> Option<u64> {
        self.packed_attach.iter().skip(1).copied().max()
    }
}

/// How long an attach or the host's discovery may take, one volume alone.
const CALL_DEADLINE: Duration = Duration::from_secs(60);

/// The emulator, the plugin in front of it and the attach layer, in `dir`.
struct Rig {
    emulator: InProcess,
    dpu: Colocated,
    sysfs: Sysfs,
    dir: std::path::PathBuf,
    stop_plugin: Option<oneshot::Sender<()>>,
    plugin: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Rig {
    async fn start(dir: &Path, period: Duration) -> anyhow::Result<Rig> {
        std::fs::create_dir_all(dir)?;
        let emulator = InProcess::start(
            Config::new(dir.join("snap.sock"), dir.join("snap")).counting_round_trips(period),
        )
        .await?;
        let plugin_socket = dir.join("plugin.sock");
        let listening = snap_csi_spdk_plugin::bind(&snap_csi_spdk_plugin::Config {
            plugin_socket: plugin_socket.clone(),
            spdk_socket: emulator.socket().to_path_buf(),
            service: ServiceConfig {
                snap_provider: String::new(),
                call_timeout: CALL_DEADLINE,
                // No background calls among the round trips counted.
                aio_follow_period: Duration::ZERO,
                devices: Default::default(),
            },
            csi: None,
            metrics_address: None,
        })?;
        let (stop_plugin, stopped) = oneshot::channel::<()>();
        let plugin = tokio::spawn(async move {
            listening
                .serve(async move {
                    let _ = stopped.await;
                })
                .await
                .context("the plugin")
        });
        let dpu = Colocated::new(plugin_socket, emulator.socket().display().to_string());
        // The plugin's self-description is asked once per process, not per
        // volume: not part of any stage's count.
        if !dpu.probe(deadline()).await? {
            bail!("the plugin is not ready");
        }
        Ok(Rig {
            sysfs: Sysfs::new(emulator.sysfs_root()),
            emulator,
            dpu,
            dir: dir.to_path_buf(),
            stop_plugin: Some(stop_plugin),
            plugin: Some(plugin),
        })
    }

    /// Runs `call` and says how many dependent round trips it made.
    async fn counted<T>(&self, call: impl Future<Output = T>) -> (T, u64) {
        let before = self.emulator.rounds();
        let out = call.await;
        (out, self.emulator.rounds() - before)
    }

    /// A new AIO volume's attach request (its 64 MiB file made here),
    /// encrypted with `key` (hex) when given.
    fn request(
        &self,
        volume_id: &str,
        placement: Placement,
        key: Option<&str>,
    ) -> anyhow::Result<AttachRequest> {
        let file = self.dir.join(format!("{volume_id}.img"));
        std::fs::File::create(&file)?.set_len(64 << 20)?;
        let mut volume_context = HashMap::from([
            (BACKEND_KEY.to_string(), AIO.to_string()),
            (PATH_KEY.to_string(), file.display().to_string()),
        ]);
        let mut secrets = HashMap::new();
        if let Some(key) = key {
            volume_context.insert(ENCRYPTION.to_string(), AES_XTS_VALUE.to_string());
            secrets.insert(KEY_SECRET.to_string(), key.to_string());
        }
        Ok(AttachRequest {
            volume_id: volume_id.into(),
            access_modes: vec![AccessMode::Rwo],
            volume_mode: VolumeMode::Block,
            publish_context: HashMap::new(),
            volume_context,
            storage_parameters: HashMap::new(),
            emulation: Emulation::Nvme,
            placement,
            attached_before: false,
            secrets,
        })
    }

    /// Attaches `request` (counted) and waits until the host shows its disk.
    async fn attach(&self, request: &AttachRequest) -> anyhow::Result<(Attachment, u64)> {
        let (attached, trips) = self.counted(self.dpu.attach(request, deadline())).await;
        let attached = attached.with_context(|| format!("attaching {}", request.volume_id))?;
        let HostLocator::Nvme {
            bdf,
            nsid,
            uuid,
            serial,
        } = &attached.locator
        else {
            bail!("{}: not an NVMe namespace", request.volume_id);
        };
        let waiting = Instant::now();
        while self
            .sysfs
            .find_nvme_namespace(bdf, *nsid, uuid.as_deref(), serial.as_deref())?
            .is_none()
        {
            if waiting.elapsed() > CALL_DEADLINE {
                bail!("{}: the host never showed the disk", request.volume_id);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok((attached, trips))
    }

    async fn detach(&self, volume_id: &str, attached: &Attachment) -> anyhow::Result<u64> {
        let (detached, trips) = self
            .counted(
                self.dpu
                    .detach(volume_id, Some(&attached.device_name), deadline()),
            )
            .await;
        detached.with_context(|| format!("detaching {volume_id}"))?;
        Ok(trips)
    }

    async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop_plugin.take() {
            let _ = stop.send(());
        }
        if let Some(plugin) = self.plugin.take() {
            plugin.await??;
        }
        self.emulator.stop()
    }
}

fn deadline() -> Instant {
    Instant::now() + CALL_DEADLINE
}

/// Attaches `count` volumes one after the other, then detaches them, each
/// counted; encrypted with `key` when given.
async fn lives(
    rig: &Rig,
    prefix: &str,
    count: usize,
    placement: Placement,
    key: Option<&str>,
) -> anyhow::Result<(Vec<u64>, Vec<u64>)> {
    let mut attached = Vec::new();
    let mut attaches = Vec::new();
    for i in 0..count {
        let request = rig.request(&format!("{prefix}-{i}"), placement, key)?;
        let (attachment, trips) = rig.attach(&request).await?;
        attaches.push(trips);
        attached.push((request.volume_id, attachment));
    }
    let mut detaches = Vec::new();
    for (volume_id, attachment) in &attached {
        detaches.push(rig.detach(volume_id, attachment).await?);
    }
    Ok((attaches, detaches))
}

/// Counts the round trips of `--count-volumes` stages and unstages of each
/// placement, on an emulator polling every `--count-period-us`.
pub async fn count(args: &Args, work: &Path) -> anyhow::Result<Trips> {
    let period = Duration::from_micros(args.count_period_us);
    let rig = Rig::start(&work.join("trips"), period).await?;
    let packed = Placement::Packed {
        namespaces_per_controller: args.packed_namespaces_per_controller,
    };
    let counted = async {
        let dedicated = lives(
            &rig,
            "trips-dedicated",
            args.count_volumes,
            Placement::Dedicated,
            None,
        )
        .await?;
        // One more: the first builds the pool.
        let packed = lives(&rig, "trips-packed", args.count_volumes + 1, packed, None).await?;
        anyhow::Ok((dedicated, packed))
    }
    .await;
    rig.stop().await?;
    let ((dedicated_attach, dedicated_detach), (packed_attach, packed_detach)) = counted?;
    Ok(Trips {
        period_us: args.count_period_us,
        dedicated_attach,
        dedicated_detach,
        packed_attach,
        packed_detach,
    })
}

/// Section 8's counts: dedicated NVMe stages and unstages, plain and
/// encrypted.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EncryptionTrips {
    pub period_us: u64,
    pub plain_attach: Vec<u64>,
    pub plain_detach: Vec<u64>,
    pub encrypted_attach: Vec<u64>,
    pub encrypted_detach: Vec<u64>,
}

/// Counts `--count-volumes` plain and as many encrypted (with `key`) stages
/// and unstages, on an emulator polling every `--count-period-us`.
pub async fn count_encryption(
    args: &Args,
    work: &Path,
    key: &str,
) -> anyhow::Result<EncryptionTrips> {
    let period = Duration::from_micros(args.count_period_us);
    let rig = Rig::start(&work.join("trips-encryption"), period).await?;
    let counted = async {
        let n = args.count_volumes;
        let plain = lives(&rig, "trips-plain", n, Placement::Dedicated, None).await?;
        let encrypted = lives(&rig, "trips-crypt", n, Placement::Dedicated, Some(key)).await?;
        anyhow::Ok((plain, encrypted))
    }
    .await;
    rig.stop().await?;
    let ((plain_attach, plain_detach), (encrypted_attach, encrypted_detach)) = counted?;
    Ok(EncryptionTrips {
        period_us: args.count_period_us,
        plain_attach,
        plain_detach,
        encrypted_attach,
        encrypted_detach,
    })
}
