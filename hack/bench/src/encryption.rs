//! Section 8: what encryption costs a stage. On section 1's stack, `--volumes`
//! plain and as many encrypted block volumes (AIO, NVMe; the StorageClass
//! parameter `snap-csi.io/encryption: aes-xts`, the key in NodeStage's
//! secrets as kubelet passes it), one at a time and alternating so that
//! background load hits both alike: each is created, staged, unstaged and
//! deleted, the stage and unstage timed from kubelet's side with the node's
//! and the plugin's SNAP calls read around them. The dependent SNAP round
//! trips of each kind are counted by the emulator itself (`trips.rs`): an
//! encrypted stage makes one more (the key, then the crypto bdev over the
//! plugin's, before SNAP exposes it).

use std::time::{Duration, Instant};

use serde::Serialize;
use snap_csi::dpu::crypto::{AES_XTS_VALUE, ENCRYPTION, KEY_SECRET};

use crate::csi::{Clients, Kind, Volume, parameters};
use crate::packed::list;
use crate::prom::{Outbound, scrape};
use crate::report::Report;
use crate::stack::Stack;
use crate::stats::{Summary, Verdict, percentile};
use crate::table::{Table, ms, num};
use crate::targets::Target;
use crate::trips::{EncryptionTrips, count_encryption};
use crate::{Args, Work};

/// A fixed AES-XTS key (data key, then a different tweak key): the bench
/// measures time, not secrecy.
const KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\
                   ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

/// One RPC on one kind of volume (sections 8 and 10).
#[derive(Debug, Clone, Serialize)]
pub struct StageRow {
    pub rpc: String,
    pub latency: Summary,
    pub p95_ms: f64,
    /// SNAP calls per call (the node's and the plugin's), mean.
    pub snap_calls: f64,
}

/// Everything section 8 reports.
#[derive(Debug, Clone, Serialize)]
pub struct Encryption {
    pub volumes: usize,
    pub rows: Vec<StageRow>,
    pub trips: EncryptionTrips,
}

/// The extra dependent round trips an encrypted stage may make: the key and
/// the crypto bdev are created together, in one.
const EXTRA_STAGE_TRIPS: u64 = 1;

/// Section 8 on `stack` (section 1's), then the round trips counted apart.
pub async fn run(
    args: &Args,
    work: &Work,
    stack: &Stack,
    clients: &Clients,
) -> anyhow::Result<Encryption> {
    let mut clients = clients.clone();
    // (row, latency, SNAP calls), in the order taken.
    let mut taken: Vec<(String, Duration, f64)> = Vec::new();
    for i in 0..args.volumes {
        for encrypted in [i % 2 == 0, i % 2 != 0] {
            let kind = if encrypted { "encrypted" } else { "plain" };
            let mut parameters = parameters("aio", "nvme", None);
            if encrypted {
                parameters.insert(ENCRYPTION.into(), AES_XTS_VALUE.into());
            }
            let mut volume = clients
                .create_with(
                    &stack.kubelet,
                    &format!("crypt-{kind}-{i}"),
                    &Kind::Block,
                    args.size_mib,
                    parameters,
                )
                .await?;
            if encrypted {
                volume.stage_secrets.insert(KEY_SECRET.into(), KEY.into());
            }
            for stage in [true, false] {
                let rpc = if stage { "NodeStage" } else { "NodeUnstage" };
                let (latency, calls) = timed(stack, &mut clients, &volume, stage).await?;
                taken.push((format!("{rpc} block ({kind})"), latency, calls));
            }
            clients.delete(&volume).await?;
        }
    }
    let rows = stage_rows(
        &[
            "NodeStage block (plain)",
            "NodeStage block (encrypted)",
            "NodeUnstage block (plain)",
            "NodeUnstage block (encrypted)",
        ],
        &taken,
    );
    eprintln!("bench: section 8: counting the SNAP round trips of plain and encrypted stages");
    let trips = count_encryption(args, work.dir.path(), KEY).await?;
    Ok(Encryption {
        volumes: args.volumes,
        rows,
        trips,
    })
}

/// One row per name of `rows`, from the `(row, latency, SNAP calls)` taken.
pub(crate) fn stage_rows(rows: &[&str], taken: &[(String, Duration, f64)]) -> Vec<StageRow> {
    rows.iter()
        .map(|rpc| {
            let of: Vec<_> = taken.iter().filter(|(row, ..)| row == rpc).collect();
            let mut sorted: Vec<f64> = of.iter().map(|(_, l, _)| l.as_secs_f64() * 1e3).collect();
            sorted.sort_by(f64::total_cmp);
            StageRow {
                rpc: rpc.to_string(),
                latency: Summary::of_ms(&sorted),
                p95_ms: if sorted.is_empty() {
                    0.0
                } else {
                    percentile(&sorted, 0.95)
                },
                snap_calls: of.iter().map(|(.., c)| c).sum::<f64>() / of.len().max(1) as f64,
            }
        })
        .collect()
}

/// Stages (or unstages) `volume`: its latency and the SNAP calls it made.
pub(crate) async fn timed(
    stack: &Stack,
    clients: &mut Clients,
    volume: &Volume,
    stage: bool,
) -> anyhow::Result<(Duration, f64)> {
    let calls = async || -> anyhow::Result<f64> {
        let (node, plugin) =
            tokio::try_join!(scrape(&stack.node_metrics), scrape(&stack.plugin_metrics))?;
        Ok(Outbound::of(&node).snap_calls + Outbound::of(&plugin).snap_calls)
    };
    let before = calls().await?;
    let started = Instant::now();
    if stage {
        clients.stage(volume).await?;
    } else {
        clients.unstage(volume).await?;
    }
    let latency = started.elapsed();
    Ok((latency, calls().await? - before))
}

impl Report {
    /// Section 8.
    pub fn print_encryption(&self) {
        let Some(e) = &self.encryption else {
            return;
        };
        println!();
        println!(
            "8. Stage with and without encryption (ms; {} block volumes of each kind, AIO, NVMe, one at a time)",
            e.volumes
        );
        let t = &e.trips;
        let trips = [
            (&t.plain_attach, &t.plain_detach),
            (&t.encrypted_attach, &t.encrypted_detach),
        ];
        let mut table = Table::new(&[
            "rpc",
            "n",
            "p50",
            "p95",
            "max",
            "SNAP calls",
            "dependent trips",
        ]);
        for (i, r) in e.rows.iter().enumerate() {
            // Rows: stage plain, stage encrypted, unstage plain, unstage encrypted.
            let (attach, detach) = trips[i % 2];
            table.row(vec![
                r.rpc.clone(),
                r.latency.samples.to_string(),
                ms(r.latency.p50_ms),
                ms(r.p95_ms),
                ms(r.latency.max_ms),
                num(r.snap_calls),
                list(if i < 2 { attach } else { detach }),
            ]);
        }
        table.print();
        println!(
            "   (dependent trips: counted by an emulator in this process replying on a {} ms tick, {} volume(s) of each kind)",
            t.period_us / 1000,
            t.plain_attach.len()
        );
    }

    pub fn encryption_targets(&self) -> Vec<Target> {
        let Some(t) = self.encryption.as_ref().map(|e| &e.trips) else {
            return Vec::new();
        };
        let (Some(plain), Some(encrypted)) =
            (t.plain_attach.iter().max(), t.encrypted_attach.iter().max())
        else {
            return Vec::new();
        };
        // Every stage of a kind must agree, and the two differ by exactly one.
        let steady = t.plain_attach.iter().all(|n| n == plain)
            && t.encrypted_attach.iter().all(|n| n == encrypted);
        vec![Target {
            target: format!(
                "encrypted NodeStage = plain + {EXTRA_STAGE_TRIPS} dependent SNAP round trip"
            ),
            measured: format!("{} vs {}", list(&t.encrypted_attach), list(&t.plain_attach)),
            verdict: Verdict::of(steady && *encrypted == plain + EXTRA_STAGE_TRIPS),
        }]
    }
}
