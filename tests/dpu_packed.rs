//! The packed placement in the DPU attach layer, against the SNAP emulator
//! and the test vendor plugin, with real loop devices found only through the
//! sysfs tree: volumes are namespaces on pool controllers that stay on the
//! host, each new one appears under its pool's existing controller, a detach
//! takes only its own namespace, concurrent and crashed stages converge on
//! exactly one namespace per volume, and a packed stage costs three
//! dependent SNAP round trips. Co-located, or through a real DPU agent in a
//! split-mode run (`common::dpu`).

mod common;

use std::collections::{HashMap, HashSet};

use common::attach::{Stack, deadline, nvme_bdf};
use common::loop_devices_of;
use snap_csi::dpu::names::{VolumeNames, pool_nqn};
use snap_csi::dpu::{Attachment, DpuError, Emulation, HostLocator};
use snap_csi::spdk::bdev::BdevAioCreate;
use snap_csi::spdk::snap::{
    NvmeControllerList, NvmeNamespaceCreate, NvmeSubsystem, NvmeSubsystemCreate, NvmeSubsystemList,
};

fn nsid_of(locator: &HostLocator) -> u32 {
    match locator {
        HostLocator::Nvme { nsid, .. } => *nsid,
        other => panic!("not NVMe: {other:?}"),
    }
}

async fn subsystems(stack: &Stack) -> Vec<NvmeSubsystem> {
    stack.snap.call(&NvmeSubsystemList {}).await.unwrap()
}

/// The namespaces carrying the volume's UUID, in any subsystem.
async fn namespaces_of(stack: &Stack, volume_id: &str) -> Vec<(String, u32)> {
    let uuid = VolumeNames::new(volume_id).namespace_uuid;
    subsystems(stack)
        .await
        .iter()
        .flat_map(|s| {
            s.namespaces
                .iter()
                .filter(|n| n.uuid.as_deref() == Some(uuid.as_str()))
                .map(|n| (s.nqn.clone(), n.nsid))
        })
        .collect()
}

/// The host's NVMe controllers under the function at `bdf` and the
/// namespaces under each (`nvme<X>` -> [`nvme<X>c<X>n<Y>`], paths as native
/// multipath names them), as its sysfs tree shows them.
fn host_controllers(stack: &Stack, bdf: &str) -> HashMap<String, Vec<String>> {
    let function = stack
        .emulator
        .sysfs_root
        .join("bus/pci/devices")
        .join(format!("0000:{bdf}"))
        .join("nvme");
    let names = |dir: &std::path::Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    names(&function)
        .into_iter()
        .map(|controller| {
            let disks = names(&function.join(&controller))
                .into_iter()
                .filter(|n| n.starts_with(&format!("{controller}c")))
                .collect();
            (controller, disks)
        })
        .collect()
}

async fn attach_packed(stack: &Stack, volume_id: &str, per_controller: u32) -> Attachment {
    stack
        .dpu
        .attach(&stack.packed_request(volume_id, per_controller), deadline())
        .await
        .unwrap()
}

#[tokio::test]
async fn packed_volumes_share_live_controllers_and_a_detach_takes_only_its_namespace() {
    let stack = Stack::start().await;
    let ids: Vec<String> = (0..6).map(|i| format!("vol-packed-{i}")).collect();
    let mut attached = Vec::new();
    for id in &ids {
        attached.push(attach_packed(&stack, id, 4).await);
    }
    // Four to a pool: pool-0 takes NSIDs 1-4, pool-1 the rest.
    let bdfs: Vec<&str> = attached.iter().map(|a| nvme_bdf(&a.locator)).collect();
    let nsids: Vec<u32> = attached.iter().map(|a| nsid_of(&a.locator)).collect();
    assert_eq!(nsids, [1, 2, 3, 4, 1, 2]);
    assert!(bdfs[..4].iter().all(|b| *b == bdfs[0]), "{bdfs:?}");
    assert!(bdfs[4..].iter().all(|b| *b == bdfs[4]), "{bdfs:?}");
    assert_ne!(bdfs[0], bdfs[4]);
    assert_eq!(
        stack.snap.call(&NvmeControllerList {}).await.unwrap().len(),
        2,
        "one controller per pool, none per volume"
    );
    let mut devices = Vec::new();
    for a in &attached {
        devices.push(stack.discovered(&a.locator).await);
    }
    // As a host shows it: new namespaces under the pool's one controller.
    let pool0 = host_controllers(&stack, bdfs[0]);
    assert_eq!(pool0.len(), 1, "{pool0:?}");
    let (controller, disks) = pool0.iter().next().unwrap();
    assert_eq!(disks.len(), 4, "{pool0:?}");
    let before: Vec<String> = disks.clone();

    // Detaching the second volume takes only its namespace and disk.
    stack
        .dpu
        .detach(&ids[1], Some(&attached[1].device_name), deadline())
        .await
        .unwrap();
    stack.assert_gone(&ids[1]).await;
    assert!(namespaces_of(&stack, &ids[1]).await.is_empty());
    assert_eq!(stack.host_device(&attached[1].locator), None);
    for (i, a) in attached.iter().enumerate().filter(|(i, _)| *i != 1) {
        let device = stack.host_device(&a.locator).expect("the others stay");
        assert_eq!(device, devices[i], "{} kept its disk", ids[i]);
    }
    let after = host_controllers(&stack, bdfs[0]);
    assert_eq!(
        after.len(),
        1,
        "the controller stays on the host: {after:?}"
    );
    assert_eq!(
        after[controller],
        [before[0].clone(), before[2].clone(), before[3].clone()],
        "only the detached namespace's disk went"
    );
    assert_eq!(
        stack.snap.call(&NvmeControllerList {}).await.unwrap().len(),
        2,
        "the pool's controller stays"
    );
    // The freed slot is the lowest: the next volume takes it.
    let next = attach_packed(&stack, "vol-packed-next", 4).await;
    assert_eq!(
        (nvme_bdf(&next.locator), nsid_of(&next.locator)),
        (bdfs[0], 2)
    );

    // The inventory tells pools from leaks and finds every packed volume.
    let inventory = stack.dpu.inventory(deadline()).await.unwrap();
    let pools: Vec<(String, u32, u32)> = inventory
        .pools
        .iter()
        .map(|p| (p.nqn.clone(), p.namespaces, p.capacity))
        .collect();
    assert_eq!(pools, [(pool_nqn(0), 4, 4), (pool_nqn(1), 2, 4)]);
    let pool_functions: Vec<&str> = inventory
        .functions
        .iter()
        .filter(|f| f.pool.is_some())
        .map(|f| f.bdf.as_str())
        .collect();
    assert_eq!(pool_functions, [bdfs[0], bdfs[4]]);
    let keys: HashSet<&str> = inventory.volumes.iter().map(|v| v.key.as_str()).collect();
    for id in ids.iter().filter(|id| *id != &ids[1]) {
        assert!(
            keys.contains(VolumeNames::new(id).namespace_uuid.as_str()),
            "{id}"
        );
    }

    for id in ids.iter().chain(["vol-packed-next".to_string()].iter()) {
        stack.dpu.detach(id, None, deadline()).await.unwrap();
        stack.assert_gone(id).await;
    }
    // Empty pools stay warm: their controllers remain, with no namespace.
    let left = subsystems(&stack).await;
    assert_eq!(left.len(), 2);
    assert!(
        left.iter()
            .all(|s| s.namespaces.is_empty() && s.controllers.len() == 1)
    );
    assert!(
        common::node::host_disks(&stack.emulator.sysfs_root).is_empty(),
        "no disk left on the host"
    );
    let again = attach_packed(&stack, "vol-packed-warm", 4).await;
    assert_eq!(
        (nvme_bdf(&again.locator), nsid_of(&again.locator)),
        (bdfs[0], 1),
        "a warm pool is reused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_packed_attaches_take_distinct_slots_and_build_each_pool_once() {
    let stack = Stack::start().await;
    let ids: Vec<String> = (0..40).map(|i| format!("vol-burst-{i}")).collect();
    let requests: Vec<_> = ids.iter().map(|id| stack.packed_request(id, 16)).collect();
    let attachments = stack.attach_all_at_once(&requests).await;
    let slots: HashSet<(&str, u32)> = attachments
        .iter()
        .map(|a| (nvme_bdf(&a.locator), nsid_of(&a.locator)))
        .collect();
    assert_eq!(slots.len(), 40, "every volume has its own slot");
    let mut per_function: HashMap<&str, usize> = HashMap::new();
    for (bdf, _) in &slots {
        *per_function.entry(bdf).or_default() += 1;
    }
    let mut counts: Vec<usize> = per_function.into_values().collect();
    counts.sort_unstable();
    assert_eq!(counts, [8, 16, 16], "three pools, filled lowest first");
    let pools = subsystems(&stack).await;
    assert_eq!(pools.len(), 3, "{pools:?}");
    assert!(pools.iter().all(|p| p.controllers.len() == 1));
    for (id, a) in ids.iter().zip(&attachments) {
        assert_eq!(namespaces_of(&stack, id).await.len(), 1, "{id}");
        stack.discovered(&a.locator).await;
        assert_eq!(loop_devices_of(&stack.backing(id)).len(), 1, "{id}");
    }

    // Half leave while as many new ones come: the new take slots (freed or
    // not) no one else holds, in the pools there are.
    let (leaving, staying) = ids.split_at(20);
    let newcomers: Vec<String> = (0..20).map(|i| format!("vol-next-{i}")).collect();
    let requests: Vec<_> = newcomers
        .iter()
        .map(|id| stack.packed_request(id, 16))
        .collect();
    let (arrived, ()) = tokio::join!(
        stack.attach_all_at_once(&requests),
        stack.detach_all_at_once(leaving)
    );
    let mut slots: Vec<(&str, u32)> = attachments[20..]
        .iter()
        .chain(&arrived)
        .map(|a| (nvme_bdf(&a.locator), nsid_of(&a.locator)))
        .collect();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), 40, "every volume has its own slot");
    for (id, a) in newcomers.iter().zip(&arrived) {
        assert_eq!(namespaces_of(&stack, id).await.len(), 1, "{id}");
        stack.discovered(&a.locator).await;
    }
    let pools = subsystems(&stack).await;
    assert!(pools.len() <= 4, "{pools:?}");
    assert!(pools.iter().all(|p| p.controllers.len() == 1));

    stack.detach_all_at_once(staying).await;
    stack.detach_all_at_once(&newcomers).await;
    assert!(
        subsystems(&stack)
            .await
            .iter()
            .all(|s| s.namespaces.is_empty())
    );
}

#[tokio::test]
async fn a_packed_attach_continues_where_a_crashed_attempt_stopped() {
    let stack = Stack::start().await;
    // A live pool to place into.
    attach_packed(&stack, "vol-first", 8).await;
    let plugin_device = |id: &str| common::plugin::device_name(id);
    let stack = &stack;
    let make_bdev = |id: &'static str| {
        let request = stack.packed_request(id, 8);
        async move {
            stack
                .snap
                .call(&BdevAioCreate {
                    name: plugin_device(id),
                    filename: request.volume_context[common::plugin::PATH_KEY].clone(),
                    block_size: Some(512),
                    readonly: None,
                })
                .await
                .unwrap();
        }
    };
    let namespace = |nqn: String, nsid: u32, id: &str| NvmeNamespaceCreate {
        bdev_type: "spdk".into(),
        nqn,
        nsid,
        uuid: VolumeNames::new(id).namespace_uuid,
        bdev_name: plugin_device(id),
    };

    // Crashed after the namespace was made, before it was attached.
    make_bdev("vol-unattached").await;
    stack
        .snap
        .call(&namespace(pool_nqn(0), 5, "vol-unattached"))
        .await
        .unwrap();
    let a = attach_packed(stack, "vol-unattached", 8).await;
    assert_eq!(nsid_of(&a.locator), 5, "the existing namespace is attached");
    stack.discovered(&a.locator).await;
    assert_eq!(
        namespaces_of(stack, "vol-unattached").await,
        [(pool_nqn(0), 5)]
    );

    // Crashed after building a pool's subsystem, before its controller: once
    // pool-0 is full, the stage finishes that one rather than make another.
    let fillers: Vec<String> = (0..6).map(|i| format!("vol-fill-{i}")).collect();
    for id in &fillers {
        attach_packed(stack, id, 8).await;
    }
    stack
        .snap
        .call(&NvmeSubsystemCreate {
            nqn: pool_nqn(1),
            mn: None,
            sn: None,
            nn: Some(8),
            mnan: Some(8),
        })
        .await
        .unwrap();
    let b = attach_packed(stack, "vol-after-half-pool", 8).await;
    stack.discovered(&b.locator).await;
    let pool1: Vec<NvmeSubsystem> = subsystems(stack)
        .await
        .into_iter()
        .filter(|s| s.nqn == pool_nqn(1))
        .collect();
    assert_eq!(
        pool1[0].controllers.len(),
        1,
        "the half-built pool got its controller"
    );
    assert_eq!(
        namespaces_of(stack, "vol-after-half-pool").await,
        [(pool_nqn(1), 1)]
    );

    // A lost answer left the volume twice: the stage keeps one.
    make_bdev("vol-twice").await;
    for (nqn, nsid) in [(pool_nqn(1), 7), (pool_nqn(1), 8)] {
        stack
            .snap
            .call(&namespace(nqn, nsid, "vol-twice"))
            .await
            .unwrap();
    }
    let c = attach_packed(stack, "vol-twice", 8).await;
    stack.discovered(&c.locator).await;
    assert_eq!(namespaces_of(stack, "vol-twice").await, [(pool_nqn(1), 7)]);

    let all = [
        "vol-first",
        "vol-unattached",
        "vol-after-half-pool",
        "vol-twice",
    ];
    for id in all
        .iter()
        .copied()
        .chain(fillers.iter().map(String::as_str))
    {
        stack.dpu.detach(id, None, deadline()).await.unwrap();
        stack.assert_gone(id).await;
    }
}

#[tokio::test]
async fn a_packed_attach_costs_three_dependent_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start_with(dir.path(), |c| {
        c.counting_round_trips(common::ROUND_TRIP_PERIOD)
    })
    .await;
    assert!(stack.dpu.probe(deadline()).await.unwrap());
    // [new, retried, detach]; the first builds the pool (subsystem and
    // controller on top), the next finds it live.
    let builds = stack.packed_request("vol-rt-pool", 32);
    assert_eq!(stack.round_trips_of_a_life(&builds).await, [5, 1, 4]);
    let packed = stack.packed_request("vol-rt-packed", 32);
    assert_eq!(
        stack.round_trips_of_a_life(&packed).await,
        [3, 1, 4],
        "a packed stage on a live pool: CreateDevice with the listings, the namespace, the attach"
    );
}

#[tokio::test]
async fn packed_virtio_blk_is_an_invalid_argument_and_changes_nothing() {
    let stack = Stack::start().await;
    let request = snap_csi::dpu::AttachRequest {
        emulation: Emulation::VirtioBlk,
        ..stack.packed_request("vol-bad-packed", 8)
    };
    let error = stack.dpu.attach(&request, deadline()).await.unwrap_err();
    assert!(matches!(error, DpuError::InvalidArgument(_)), "{error:?}");
    assert!(error.to_string().contains("NVMe only"), "{error}");
    assert!(subsystems(&stack).await.is_empty());
    stack.assert_gone("vol-bad-packed").await;
}

/// A volume stays where its first stage placed it: a retry under another
/// placement (the node's default changed meanwhile) continues it there.
#[tokio::test]
async fn a_retry_under_another_placement_keeps_the_volume_where_it_is() {
    let stack = Stack::start().await;
    let dedicated = stack.attach("vol-was-dedicated", Emulation::Nvme).await;
    let retried = snap_csi::dpu::AttachRequest {
        attached_before: true,
        ..stack.packed_request("vol-was-dedicated", 8)
    };
    let again = stack.dpu.attach(&retried, deadline()).await.unwrap();
    assert_eq!(again, dedicated);
    assert!(namespaces_of(&stack, "vol-was-dedicated").await.len() == 1);

    let packed = attach_packed(&stack, "vol-was-packed", 8).await;
    let retried = snap_csi::dpu::AttachRequest {
        attached_before: true,
        ..stack.request("vol-was-packed", Emulation::Nvme)
    };
    let again = stack.dpu.attach(&retried, deadline()).await.unwrap();
    assert_eq!(again, packed);
    assert_eq!(
        namespaces_of(&stack, "vol-was-packed").await,
        [(pool_nqn(0), 1)]
    );
    let names: Vec<String> = subsystems(&stack)
        .await
        .into_iter()
        .map(|s| s.nqn)
        .collect();
    assert_eq!(
        names,
        [VolumeNames::new("vol-was-dedicated").nqn, pool_nqn(0)],
        "no subsystem of its own for the packed volume"
    );
    for id in ["vol-was-dedicated", "vol-was-packed"] {
        stack.dpu.detach(id, None, deadline()).await.unwrap();
        stack.assert_gone(id).await;
    }
}
