//! One worker: volume after volume through a random life, playing
//! external-provisioner and kubelet. Like kubelet, every failed call is
//! retried (with backoff) until it succeeds; one that has not succeeded
//! within [`BUDGET`] is a failure, reported with its last error, and the
//! volume is still torn down. Unpublish and unstage are followed by a look
//! at the mount table (an OK that left the mount behind is a leak), and
//! every restage by reading the volume's pattern back.

use std::future::Future;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use snap_csi_harness::csi::{Clients, Kind, Volume, parameters};

use crate::data::{Pattern, Verdict};
use crate::rng::Rng;
use crate::tally::Tally;

/// How long a call may keep failing before it counts as not converging.
pub const BUDGET: Duration = Duration::from_secs(60);
/// The longest pause between two attempts (kubelet's backoff grows further;
/// a short cap finds a convergence sooner).
const MAX_PAUSE: Duration = Duration::from_secs(2);
/// Every volume is big enough for xfs (Debian 12's mkfs.xfs wants 300 MiB).
const SIZE_MIB: i64 = 320;

#[derive(Debug)]
pub struct Worker {
    pub id: usize,
    pub clients: Clients,
    pub kubelet: std::path::PathBuf,
    pub tally: Arc<Tally>,
    /// Set at the end of the round: finish this volume, start no other.
    pub stop: Arc<AtomicBool>,
    pub rng: Rng,
    /// Percent of unpublishes that meet a process holding the mount.
    pub holder_percent: u64,
}

/// Runs `call` until it succeeds or [`BUDGET`] has passed since the first
/// attempt; counts the success as an operation, each failure under its code.
pub async fn converge<T, F, Fut>(
    tally: &Tally,
    call: &str,
    subject: &str,
    mut attempt: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let started = Instant::now();
    let mut pause = Duration::from_millis(100);
    loop {
        match attempt().await {
            Ok(value) => {
                tally.operation();
                return Ok(value);
            }
            Err(error) => {
                let (code, message) = match error.downcast_ref::<tonic::Status>() {
                    Some(status) => (format!("{:?}", status.code()), status.message().to_string()),
                    None => ("not a gRPC status".to_string(), format!("{error:#}")),
                };
                tally.attempt_failed(call, &code, &message);
                if started.elapsed() + pause >= BUDGET {
                    return Err(error.context(format!(
                        "{call} {subject}: still failing after {:.0} s",
                        started.elapsed().as_secs_f64()
                    )));
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_PAUSE);
            }
        }
    }
}

impl Worker {
    pub async fn run(mut self) {
        let mut serial = 0;
        while !self.stop.load(Ordering::Relaxed) {
            serial += 1;
            self.lifecycle(serial).await;
        }
    }

    async fn lifecycle(&mut self, serial: u64) {
        let backend = *self.rng.pick(&["aio", "nvmf"]);
        let emulation = *self.rng.pick(&["nvme", "virtio-blk"]);
        // A virtio-blk function has one disk: only NVMe packs.
        let placement = match emulation {
            "nvme" => *self.rng.pick(&["dedicated", "packed"]),
            _ => "dedicated",
        };
        let kind = self
            .rng
            .pick(&[
                Kind::Block,
                Kind::Filesystem("ext4".into()),
                Kind::Filesystem("xfs".into()),
            ])
            .clone();
        let name = format!("chaos-w{}-{serial}", self.id);
        let shape = format!("{backend}, {emulation} {placement}, {}", kind_name(&kind));
        self.tally.volume(&shape);
        let label = format!("{name} ({shape})");
        let created = converge(&self.tally, "CreateVolume", &label, || {
            let mut clients = self.clients.clone();
            let (kubelet, name, kind) = (self.kubelet.clone(), name.clone(), kind.clone());
            let parameters = parameters(backend, emulation, Some(placement));
            async move {
                clients
                    .create_with(&kubelet, &name, &kind, SIZE_MIB, parameters)
                    .await
            }
        })
        .await;
        let volume = match created {
            Ok(volume) => volume,
            Err(error) => return self.tally.stuck(format!("{error:#}")),
        };
        if let Err(error) = self.exercise(&volume, &label).await {
            self.tally.stuck(format!("{label}: {error:#}"));
        }
        // Torn down whatever happened: every step is idempotent.
        if let Err(error) = self.unpublish(&volume, &label, false).await {
            self.tally.stuck(format!("{error:#}"));
        }
        if let Err(error) = self.unstage(&volume, &label).await {
            self.tally.stuck(format!("{error:#}"));
        }
        let deleted = converge(&self.tally, "DeleteVolume", &label, || {
            let (mut clients, volume) = (self.clients.clone(), volume.clone());
            async move { clients.delete(&volume).await }
        })
        .await;
        if let Err(error) = deleted {
            self.tally.stuck(format!("{error:#}"));
        }
    }

    /// Stage, publish, write; then one to three times: maybe read back while
    /// published, unpublish (maybe against a holder), unstage, restage,
    /// republish, read back, maybe write a new pattern.
    async fn exercise(&mut self, volume: &Volume, label: &str) -> anyhow::Result<()> {
        let block = volume.kind == Kind::Block;
        self.stage_and_publish(volume, label).await?;
        let mut pattern = Pattern::new(&mut self.rng, block);
        self.write(volume, &pattern).await?;
        for restage in 1..=self.rng.range(1, 3) {
            if self.rng.chance(30) {
                self.verify(volume, label, &pattern, "while published")
                    .await?;
            }
            let held = self.rng.chance(self.holder_percent);
            self.unpublish(volume, label, held).await?;
            self.unstage(volume, label).await?;
            self.stage_and_publish(volume, label).await?;
            self.verify(volume, label, &pattern, &format!("after restage {restage}"))
                .await?;
            if self.rng.chance(50) {
                pattern = Pattern::new(&mut self.rng, block);
                self.write(volume, &pattern).await?;
            }
        }
        Ok(())
    }

    async fn stage_and_publish(&self, volume: &Volume, label: &str) -> anyhow::Result<()> {
        converge(&self.tally, "NodeStageVolume", label, || {
            let (mut clients, volume) = (self.clients.clone(), volume.clone());
            async move { clients.stage(&volume).await }
        })
        .await?;
        converge(&self.tally, "NodePublishVolume", label, || {
            let (mut clients, volume) = (self.clients.clone(), volume.clone());
            async move { clients.publish(&volume).await }
        })
        .await?;
        Ok(())
    }

    /// NodeUnpublish until it succeeds; with `held`, a process keeps the
    /// published mount busy (its working directory there, or the block
    /// device open) for a random while, as a pod's straggler would.
    async fn unpublish(&mut self, volume: &Volume, label: &str, held: bool) -> anyhow::Result<()> {
        let holder = if held {
            let hold = self.rng.millis(300, 5000);
            match hold_mount(&volume.target, volume.kind == Kind::Block, hold) {
                Ok(child) => {
                    self.tally.fault("EBUSY holder");
                    Some(child)
                }
                // Not published (an earlier step failed): nothing to hold.
                Err(_) => None,
            }
        } else {
            None
        };
        let unpublished = converge(&self.tally, "NodeUnpublishVolume", label, || {
            let (mut clients, volume) = (self.clients.clone(), volume.clone());
            async move { clients.unpublish(&volume).await }
        });
        let result = match holder {
            Some(mut child) => {
                let (result, _) = tokio::join!(unpublished, child.wait());
                result
            }
            None => unpublished.await,
        };
        result?;
        self.expect_unmounted(&volume.target, label, "NodeUnpublishVolume");
        Ok(())
    }

    async fn unstage(&self, volume: &Volume, label: &str) -> anyhow::Result<()> {
        converge(&self.tally, "NodeUnstageVolume", label, || {
            let (mut clients, volume) = (self.clients.clone(), volume.clone());
            async move { clients.unstage(&volume).await }
        })
        .await?;
        self.expect_unmounted(&volume.staging, label, "NodeUnstageVolume");
        Ok(())
    }

    fn expect_unmounted(&self, path: &Path, label: &str, call: &str) {
        match mounted_at(path) {
            Ok(false) => {}
            Ok(true) => self.tally.leak(format!(
                "{label}: {call} answered OK but {} is still mounted",
                path.display()
            )),
            Err(error) => self.tally.leak(format!("{label}: {error:#}")),
        }
    }

    async fn write(&self, volume: &Volume, pattern: &Pattern) -> anyhow::Result<()> {
        let (target, block, pattern) = (
            volume.target.clone(),
            volume.kind == Kind::Block,
            pattern.clone(),
        );
        let written = tokio::task::spawn_blocking(move || pattern.write(&target, block)).await?;
        match written {
            Ok(()) => self.tally.operation(),
            Err(error) => self
                .tally
                .data_error(format!("{}: write failed: {error:#}", volume.id)),
        }
        Ok(())
    }

    async fn verify(
        &self,
        volume: &Volume,
        label: &str,
        pattern: &Pattern,
        when: &str,
    ) -> anyhow::Result<()> {
        let (target, block, copy) = (
            volume.target.clone(),
            volume.kind == Kind::Block,
            pattern.clone(),
        );
        let verdict = tokio::task::spawn_blocking(move || copy.verify(&target, block)).await?;
        match verdict {
            Ok(Verdict::Intact) => self.tally.operation(),
            Ok(Verdict::Differs { bytes, first }) => self.tally.data_error(format!(
                "{label} {when}: {bytes} bytes differ, the first at +{first}, of {}",
                pattern.describe()
            )),
            Err(error) => self.tally.data_error(format!(
                "{label} {when}: reading {} failed: {error:#}",
                pattern.describe()
            )),
        }
        Ok(())
    }
}

fn kind_name(kind: &Kind) -> &str {
    match kind {
        Kind::Block => "block",
        Kind::Filesystem(fs) => fs,
    }
}

/// A `sleep` whose working directory is the published filesystem, or whose
/// stdin is the published block device: either keeps the mount busy.
fn hold_mount(target: &Path, block: bool, hold: Duration) -> anyhow::Result<tokio::process::Child> {
    if !mounted_at(target)? {
        anyhow::bail!("{} is not mounted", target.display());
    }
    let mut command = tokio::process::Command::new("sleep");
    command
        .arg(format!("{:.3}", hold.as_secs_f64()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    if block {
        command.stdin(std::fs::File::open(target)?);
    } else {
        command.stdin(Stdio::null()).current_dir(target);
    }
    command.spawn().context("starting a holder")
}

/// Whether `path` is a mount point in this mount namespace.
pub fn mounted_at(path: &Path) -> anyhow::Result<bool> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").context("reading mountinfo")?;
    let wanted = path.to_string_lossy();
    Ok(table
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(wanted.as_ref())))
}
