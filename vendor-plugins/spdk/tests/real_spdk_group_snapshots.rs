//! Group snapshots against a real NVMe-oF target (the patched `spdk_tgt` of
//! hack/spdk, whose `nvmf_subsystem_pause` really holds I/O) while a second
//! `spdk_tgt` writes the volumes over NVMe/TCP: the snapshots are
//! write-order consistent under load, and no path out of a group snapshot,
//! a crash included, leaves a subsystem paused. Runs when
//! `SNAP_CSI_SPDK_TGT` names an `spdk_tgt` binary.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use common::Source;
use common::csi::{Backends, Csi, MIB, from_snapshot, volume};
use common::group_snapshots::member_of;
use common::nvme_io::Remote;
use futures::future::join_all;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::spdk::nvmf::{NvmfDeleteSubsystem, NvmfSubsystemPause};
use tokio::sync::watch;
use tonic::Code;

const BACKEND: &str = "nvmf";
/// Group snapshots taken while the writers run.
const SNAPSHOTS: usize = 8;
/// Writers, each alternating between the volumes on a block of its own.
const STREAMS: u64 = 16;
/// Writes (to both volumes) per writer between one snapshot and the next,
/// on average, at least.
const WRITES_BETWEEN: u64 = 2;

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

/// Writers alternate between two volumes, each write waiting for the one
/// before (A gets i, then B gets i, then A gets i + 1, ...), while group
/// snapshots of both are taken; restored, every pair (a, b) must be a state
/// the volumes were in at one instant: a == b or a == b + 1. b > a would be
/// a write on B whose earlier write on A is missing; a > b + 1 a write on A
/// whose earlier one on B is. [`STREAMS`] such writers run at once, each on
/// a block of its own, so that a snapshot cut at the wrong moment is caught
/// by one of them.
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
    let (wa, wb) = (remote_a.attach("wa").await, remote_b.attach("wb").await);
    let block = wa.block_size();
    let (written, mut progress) = watch::channel(0u64);
    let stop = AtomicBool::new(false);
    let stream = async |k: u64| {
        let mut i = 0u64;
        let mut data = vec![0u8; block as usize];
        while !stop.load(Ordering::Relaxed) {
            i += 1;
            data[..8].copy_from_slice(&i.to_le_bytes());
            wa.write_blocks(k, &data).await;
            wb.write_blocks(k, &data).await;
            written.send_modify(|n| *n += 1);
        }
        i
    };
    let snapshots = async {
        let mut groups = vec![];
        for n in 0..SNAPSHOTS {
            let floor = *progress.borrow_and_update() + WRITES_BETWEEN * STREAMS;
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
    let (writes, groups) = tokio::join!(join_all((0..STREAMS).map(stream)), snapshots);
    wa.detach().await;
    wb.detach().await;

    let mut pairs = vec![];
    for (n, group) in groups.iter().enumerate() {
        let of = |v: &str| member_of(group, v);
        let mut values = vec![];
        for (source, tag) in [(&a, "a"), (&b, "b")] {
            let restored = csi
                .create(from_snapshot(
                    volume(&format!("pvc-r{n}{tag}"), BACKEND, 0, 0),
                    &of(&source.volume_id),
                ))
                .await
                .unwrap();
            let bytes = csi.read(&restored, 0, (STREAMS * block) as usize).await;
            values.push(
                bytes
                    .chunks(block as usize)
                    .map(counter)
                    .collect::<Vec<_>>(),
            );
            csi.delete(&restored.volume_id).await.unwrap();
        }
        pairs.push(
            values[0]
                .iter()
                .copied()
                .zip(values[1].iter().copied())
                .collect::<Vec<_>>(),
        );
    }
    for (n, snapshot) in pairs.iter().enumerate() {
        for (k, &(a, b)) in snapshot.iter().enumerate() {
            assert!(
                a == b || a == b + 1,
                "group snapshot {n}, writer {k}: (A, B) = ({a}, {b}) is no state the volumes \
                 were in; every pair: {pairs:?}"
            );
            // The writers were running through every snapshot.
            assert!(a > 0 && a <= writes[k], "{pairs:?}");
        }
    }
    for group in &groups {
        csi.delete_whole_group_snapshot(group).await;
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
