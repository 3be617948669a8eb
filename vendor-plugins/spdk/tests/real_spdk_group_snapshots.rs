//! Group snapshots against a real NVMe-oF target (the patched `spdk_tgt` of
//! hack/spdk, whose `nvmf_subsystem_pause` really holds I/O) while a second
//! `spdk_tgt` writes the volumes over NVMe/TCP: the snapshots are
//! write-order consistent under load, and no path out of a group snapshot,
//! a crash included, leaves a subsystem paused. Runs when
//! `SNAP_CSI_SPDK_TGT` names an `spdk_tgt` binary.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::Source;
use common::csi::{Backends, Csi, MIB, from_snapshot, volume};
use common::nvme_io::Remote;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::spdk::nvmf::{NvmfDeleteSubsystem, NvmfSubsystemPause};
use tokio::sync::watch;
use tonic::Code;

const BACKEND: &str = "nvmf";
/// Group snapshots taken while the writer runs.
const SNAPSHOTS: usize = 6;
/// Writes (to both volumes) between one snapshot and the next, at least.
const WRITES_BETWEEN: u64 = 3;

async fn controller() -> Option<Csi> {
    let source = Source::real()?;
    let backends = Backends {
        aio: false,
        nvmf: true,
        default: BACKEND,
    };
    Some(Csi::start_on(backends, &source).await)
}

/// Where the initiator reaches a volume.
fn remote<'a>(csi: &'a Csi, volume: &'a csi::Volume) -> Remote<'a> {
    let context = &volume.volume_context;
    Remote {
        initiator: csi.target().initiator.as_ref().unwrap().client(),
        traddr: &context["traddr"],
        trsvcid: &context["trsvcid"],
        subnqn: &context["subnqn"],
    }
}

fn counter(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes[..8].try_into().unwrap())
}

/// A writer alternates between two volumes, each write waiting for the one
/// before (A gets i, then B gets i, then A gets i + 1, ...), while group
/// snapshots of both are taken; restored, every pair (a, b) must be a state
/// the volumes were in at one instant: a == b or a == b + 1. b > a would be
/// a write on B whose earlier write on A is missing; a > b + 1 a write on A
/// whose earlier one on B is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_snapshots_under_a_writer_are_write_order_consistent() {
    let Some(csi) = controller().await else {
        return;
    };
    let a = csi
        .create(volume("pvc-writer-a", BACKEND, 8 * MIB, 0))
        .await
        .unwrap();
    let b = csi
        .create(volume("pvc-writer-b", BACKEND, 8 * MIB, 0))
        .await
        .unwrap();
    let (remote_a, remote_b) = (remote(&csi, &a), remote(&csi, &b));
    let (written, mut progress) = watch::channel(0u64);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        async move {
            let (wa, wb) = (remote_a.attach("wa").await, remote_b.attach("wb").await);
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                wa.write(0, &i.to_le_bytes()).await;
                wb.write(0, &i.to_le_bytes()).await;
                written.send_replace(i);
            }
            wa.detach().await;
            wb.detach().await;
            i
        }
    };
    let snapshots = async {
        let mut groups = vec![];
        for n in 0..SNAPSHOTS {
            let floor = *progress.borrow_and_update() + WRITES_BETWEEN;
            progress.wait_for(|&i| i >= floor).await.unwrap();
            groups.push(
                csi.create_group_snapshot(
                    &format!("gs-writer-{n}"),
                    &[&a.volume_id, &b.volume_id],
                    HashMap::new(),
                )
                .await
                .unwrap(),
            );
        }
        stop.store(true, Ordering::Relaxed);
        groups
    };
    let (writes, groups) = tokio::join!(writer, snapshots);
    assert!(
        writes > SNAPSHOTS as u64 * WRITES_BETWEEN,
        "{writes} writes"
    );

    let mut pairs = vec![];
    for (n, group) in groups.iter().enumerate() {
        let of = |v: &str| {
            group
                .snapshots
                .iter()
                .find(|s| s.source_volume_id == v)
                .unwrap()
                .snapshot_id
                .clone()
        };
        let mut values = vec![];
        for (source, tag) in [(&a, "a"), (&b, "b")] {
            let restored = csi
                .create(from_snapshot(
                    volume(&format!("pvc-r{n}{tag}"), BACKEND, 0, 0),
                    &of(&source.volume_id),
                ))
                .await
                .unwrap();
            values.push(counter(&csi.read(&restored, 0, 8).await));
            csi.delete(&restored.volume_id).await.unwrap();
        }
        pairs.push((values[0], values[1]));
    }
    for &(a, b) in &pairs {
        assert!(
            a == b || a == b + 1,
            "group snapshot pairs (A, B) {pairs:?}: ({a}, {b}) is no state the volumes were in"
        );
    }
    // The writer was running through every snapshot, not before or after.
    assert!(pairs.iter().all(|&(a, _)| a > 0 && a < writes), "{pairs:?}");
    for group in &groups {
        let ids: Vec<&str> = group
            .snapshots
            .iter()
            .map(|s| s.snapshot_id.as_str())
            .collect();
        csi.delete_group_snapshot(&group.group_snapshot_id, &ids)
            .await
            .unwrap();
    }
    csi.delete(&a.volume_id).await.unwrap();
    csi.delete(&b.volume_id).await.unwrap();
}

/// A pause that cannot complete the group (a member's subsystem is gone)
/// fails the call with nothing left, and the member that was paused is not
/// left so: a write to it completes (it would wait for a resume that never
/// comes, and time out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_group_snapshot_resumes_what_it_paused_and_leaves_nothing() {
    let Some(csi) = controller().await else {
        return;
    };
    let a = csi
        .create(volume("pvc-fail-a", BACKEND, 8 * MIB, 0))
        .await
        .unwrap();
    let b = csi
        .create(volume("pvc-fail-b", BACKEND, 8 * MIB, 0))
        .await
        .unwrap();
    let spdk = csi.target().spdk.client();
    spdk.call(&NvmfDeleteSubsystem {
        nqn: b.volume_context["subnqn"].clone(),
    })
    .await
    .unwrap();
    let before = csi.target().objects().await;
    let status = csi
        .create_group_snapshot("gs-fail", &[&a.volume_id, &b.volume_id], HashMap::new())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(status.message().contains(&b.volume_id), "{status:?}");
    assert_eq!(csi.target().objects().await, before, "nothing made");
    assert_eq!(csi.state_records("nvmf-paused"), 0);
    assert_eq!(csi.state_records("group-snapshots"), 0);
    assert_eq!(csi.state_records("nvmf-snapshots"), 0);
    csi.write(&a, MIB, b"still writable").await;
    assert_eq!(csi.read(&a, MIB, 14).await, b"still writable");
    csi.delete(&a.volume_id).await.unwrap();
    csi.delete(&b.volume_id).await.unwrap();
}

/// A controller that died between pause and resume left its intent record
/// and a paused subsystem: the next controller resumes it as it starts, and
/// a write that waited in the target completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_that_died_mid_group_snapshot_resumes_at_start() {
    let Some(mut csi) = controller().await else {
        return;
    };
    let a = csi
        .create(volume("pvc-crash-a", BACKEND, 8 * MIB, 0))
        .await
        .unwrap();
    let nqn = a.volume_context["subnqn"].clone();
    // As the controller does it: the intent first, then the pause.
    csi.store_pause_intent("gsnap-nvmf-crashed", &[&nqn]);
    csi.target()
        .spdk
        .client()
        .call(&NvmfSubsystemPause {
            nqn: nqn.clone(),
            nsid: Some(1),
        })
        .await
        .unwrap();
    csi.restart().await;
    csi.write(&a, MIB, b"after the crash").await;
    assert_eq!(csi.read(&a, MIB, 15).await, b"after the crash");
    // The next group operation waits for the start-up's recovery: by then
    // the record is gone.
    csi.delete_group_snapshot("gsnap-nvmf-none", &[])
        .await
        .unwrap();
    assert_eq!(csi.state_records("nvmf-paused"), 0);
    csi.delete(&a.volume_id).await.unwrap();
}
