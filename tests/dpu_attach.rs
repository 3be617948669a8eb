//! The DPU attach layer against the SNAP emulator and the test vendor plugin
//! over real gRPC, as root with real loop devices: volumes are found on the
//! "host" only through the sysfs tree, SNAP's own lists show exactly one of
//! everything, and a detach leaves no subsystem, controller, bdev or loop
//! device behind. Co-located, or in a split-mode run (`common::dpu`) through
//! a real DPU agent over mutual TLS: the same behaviour either way.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::attach::{SIZE, Stack, deadline, function_count, functions, nvme_bdf};
use common::dpu::TestDpu;
use common::plugin;
use common::{assert_kept_deadline, loop_devices_of, round_trips};
use snap_csi::dpu::names::{NSID, VolumeNames};
use snap_csi::dpu::{AttachRequest, DpuError, Emulation, HostLocator};
use snap_csi::proto::nvidia::storage::plugins::v1::storage_plugin_service_capability::rpc::Type as Capability;
use snap_csi::spdk::bdev::BdevAioCreate;
use snap_csi::spdk::snap::{
    EmulationType, NvmeControllerAttachNs, NvmeControllerCreate, NvmeControllerList,
    NvmeNamespaceCreate, NvmeSubsystemCreate, NvmeSubsystemList, VirtioBlkControllerList,
};
use snap_emu::FunctionLayout;
use tokio::time::Instant;

#[tokio::test]
async fn nvme_attach_is_seen_by_the_host_repeats_identically_and_detaches_without_a_trace() {
    let stack = Stack::start().await;
    assert!(stack.dpu.probe(deadline()).await.unwrap());
    // One NVMe and one virtio-blk PF with 16 VFs each.
    assert_eq!(function_count(&stack).await, 34);

    let first = stack.attach("vol-nvme", Emulation::Nvme).await;
    assert_eq!(first.device_name, plugin::device_name("vol-nvme"));
    let names = VolumeNames::new("vol-nvme");
    let HostLocator::Nvme { nsid, uuid, .. } = &first.locator else {
        panic!("{:?}", first.locator);
    };
    assert_eq!(
        (*nsid, uuid.as_deref()),
        (NSID, Some(names.namespace_uuid.as_str()))
    );
    let device = stack.discovered(&first.locator).await;
    assert_eq!(device.size_bytes, SIZE);
    assert_eq!(loop_devices_of(&stack.backing("vol-nvme")).len(), 1);

    let again = stack.attach("vol-nvme", Emulation::Nvme).await;
    assert_eq!(again, first);
    let subsystems = stack.snap.call(&NvmeSubsystemList {}).await.unwrap();
    let ours: Vec<_> = subsystems.iter().filter(|s| s.nqn == names.nqn).collect();
    assert_eq!(ours.len(), 1);
    assert_eq!(ours[0].controllers.len(), 1);
    assert_eq!(ours[0].namespaces.len(), 1);
    assert_eq!(ours[0].namespaces[0].bdev, first.device_name);
    assert_eq!(
        stack.snap.call(&NvmeControllerList {}).await.unwrap().len(),
        1
    );
    assert_eq!(loop_devices_of(&stack.backing("vol-nvme")).len(), 1);

    stack
        .dpu
        .detach("vol-nvme", Some(&first.device_name), deadline())
        .await
        .unwrap();
    stack.assert_gone("vol-nvme").await;
    assert_eq!(stack.host_device(&first.locator), None);
    assert!(
        stack
            .snap
            .call(&NvmeControllerList {})
            .await
            .unwrap()
            .is_empty()
    );
    stack
        .dpu
        .detach("vol-nvme", Some(&first.device_name), deadline())
        .await
        .expect("a second detach finds nothing to do");
    let listed = functions(&stack.snap).await;
    assert!(
        !listed.is_empty()
            && listed
                .iter()
                .all(|f| f.ctrl_id.is_none() && f.vfs.iter().all(|v| v.ctrl_id.is_none())),
        "every function is free again: {listed:?}"
    );
}

#[tokio::test]
async fn virtio_blk_attach_is_seen_by_the_host_repeats_identically_and_detaches_without_a_trace() {
    let stack = Stack::start().await;
    let first = stack.attach("vol-vblk", Emulation::VirtioBlk).await;
    let names = VolumeNames::new("vol-vblk");
    let HostLocator::VirtioBlk { serial, .. } = &first.locator else {
        panic!("{:?}", first.locator);
    };
    assert_eq!(serial, &names.serial);
    let device = stack.discovered(&first.locator).await;
    assert_eq!(device.size_bytes, SIZE);

    let again = stack.attach("vol-vblk", Emulation::VirtioBlk).await;
    assert_eq!(again, first);
    let controllers = stack.snap.call(&VirtioBlkControllerList {}).await.unwrap();
    assert_eq!(controllers.len(), 1);
    assert_eq!(
        controllers[0].bdev.as_deref(),
        Some(first.device_name.as_str())
    );
    assert_eq!(loop_devices_of(&stack.backing("vol-vblk")).len(), 1);

    stack
        .dpu
        .detach("vol-vblk", Some(&first.device_name), deadline())
        .await
        .unwrap();
    stack.assert_gone("vol-vblk").await;
    assert_eq!(stack.host_device(&first.locator), None);
    stack
        .dpu
        .detach("vol-vblk", Some(&first.device_name), deadline())
        .await
        .unwrap();
}

/// A previous attempt died after `steps` of NVIDIA's order: the attach
/// continues from there and never makes a second anything.
async fn crash_after(stack: &Stack, volume_id: &str, steps: usize) -> Option<String> {
    let names = VolumeNames::new(volume_id);
    let request = stack.request(volume_id, Emulation::Nvme);
    let device = plugin::device_name(volume_id);
    stack
        .snap
        .call(&BdevAioCreate {
            name: device.clone(),
            filename: request.volume_context[plugin::PATH_KEY].clone(),
            block_size: Some(512),
            readonly: None,
        })
        .await
        .unwrap();
    if steps >= 1 {
        stack
            .snap
            .call(&NvmeSubsystemCreate {
                nqn: names.nqn.clone(),
                mn: None,
                sn: None,
                nn: None,
                mnan: None,
            })
            .await
            .unwrap();
    }
    if steps >= 2 {
        stack
            .snap
            .call(&NvmeNamespaceCreate {
                bdev_type: "spdk".into(),
                nqn: names.nqn.clone(),
                nsid: NSID,
                uuid: names.namespace_uuid.clone(),
                bdev_name: device,
            })
            .await
            .unwrap();
    }
    if steps < 3 {
        return None;
    }
    let free = functions(&stack.snap)
        .await
        .into_iter()
        .filter(|pf| pf.emulation_type == EmulationType::Nvme)
        .flat_map(|pf| {
            let vfs = pf
                .vfs
                .iter()
                .map(|v| (v.pci_bdf.clone(), v.ctrl_id.clone()));
            std::iter::once((pf.pci_bdf.clone(), pf.ctrl_id.clone()))
                .chain(vfs)
                .collect::<Vec<_>>()
        })
        .find(|(_, ctrl)| ctrl.is_none())
        .map(|(bdf, _)| bdf)
        .unwrap();
    let ctrl_id = stack
        .snap
        .call(&NvmeControllerCreate {
            nqn: names.nqn.clone(),
            pci_bdf: Some(free),
            suspended: Some(true),
            ..Default::default()
        })
        .await
        .unwrap()
        .ctrl_id;
    if steps >= 4 {
        stack
            .snap
            .call(&NvmeControllerAttachNs {
                ctrl_id: ctrl_id.clone(),
                nsid: NSID,
            })
            .await
            .unwrap();
    }
    Some(ctrl_id)
}

#[tokio::test]
async fn an_nvme_attach_continues_where_a_crashed_attempt_stopped() {
    let stack = Stack::start().await;
    for steps in 0..=4 {
        let volume_id = format!("vol-crash-{steps}");
        let ctrl_id = crash_after(&stack, &volume_id, steps).await;
        let attachment = stack.attach(&volume_id, Emulation::Nvme).await;
        // After any number of steps, the host sees the volume.
        stack.discovered(&attachment.locator).await;
        let names = VolumeNames::new(&volume_id);
        let subsystems = stack.snap.call(&NvmeSubsystemList {}).await.unwrap();
        let ours: Vec<_> = subsystems.iter().filter(|s| s.nqn == names.nqn).collect();
        assert_eq!(ours.len(), 1, "after {steps} steps");
        assert_eq!(ours[0].namespaces.len(), 1, "after {steps} steps");
        assert_eq!(ours[0].controllers.len(), 1, "after {steps} steps");
        if let Some(ctrl_id) = ctrl_id {
            assert_eq!(
                ours[0].controllers[0].ctrl_id, ctrl_id,
                "the suspended controller is reused"
            );
        }
        assert_eq!(loop_devices_of(&stack.backing(&volume_id)).len(), 1);
    }
    for steps in 0..=4 {
        let volume_id = format!("vol-crash-{steps}");
        stack
            .dpu
            .detach(&volume_id, None, deadline())
            .await
            .unwrap();
        stack.assert_gone(&volume_id).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_concurrent_attaches_get_sixteen_functions() {
    let stack = Stack::start().await;
    let ids: Vec<String> = (0..16).map(|i| format!("vol-many-{i}")).collect();
    let requests: Vec<AttachRequest> = ids
        .iter()
        .map(|id| stack.request(id, Emulation::Nvme))
        .collect();
    let attachments = stack.attach_all_at_once(&requests).await;
    let bdfs: HashSet<&str> = attachments.iter().map(|a| nvme_bdf(&a.locator)).collect();
    assert_eq!(bdfs.len(), 16, "{bdfs:?}");
    for attachment in &attachments {
        stack.discovered(&attachment.locator).await;
    }
    assert_eq!(
        stack.snap.call(&NvmeControllerList {}).await.unwrap().len(),
        16
    );

    stack.detach_all_at_once(&ids).await;
}

#[tokio::test]
async fn no_free_function_is_exhausted_and_the_partial_attach_detaches() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start_with(dir.path(), |c| {
        c.with_functions(FunctionLayout {
            nvme_pfs: 1,
            nvme_vfs_per_pf: 0,
            virtio_blk_pfs: 1,
            virtio_blk_vfs_per_pf: 0,
        })
    })
    .await;
    assert_eq!(function_count(&stack).await, 2);
    for emulation in [Emulation::Nvme, Emulation::VirtioBlk] {
        let taken = format!("vol-taken-{emulation:?}");
        let refused = format!("vol-refused-{emulation:?}");
        stack.attach(&taken, emulation).await;
        let error = stack
            .dpu
            .attach(&stack.request(&refused, emulation), deadline())
            .await
            .unwrap_err();
        assert!(matches!(error, DpuError::Exhausted(_)), "{error:?}");
        assert!(error.to_string().contains("no free"), "{error}");
        for id in [&refused, &taken] {
            stack.dpu.detach(id, None, deadline()).await.unwrap();
            stack.assert_gone(id).await;
        }
    }
}

#[tokio::test]
async fn a_plugin_that_is_down_is_unavailable_within_the_deadline() {
    let stack = Stack::start().await;
    let missing = stack.emulator.root().join("no-plugin.sock");
    let TestDpu { attach: dpu, .. } = &stack.layer(&missing, &stack.emulator.socket).await;
    let request = stack.request("vol-down", Emulation::Nvme);

    let started = Instant::now();
    let error = dpu
        .attach(&request, started + Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(error, DpuError::Unavailable(_)), "{error:?}");
    assert!(
        error.to_string().contains(&missing.display().to_string()),
        "{error}"
    );
    assert_kept_deadline("attach", started, Duration::from_secs(1));
    let error = dpu
        .detach(
            "vol-down",
            None,
            Instant::now() + Duration::from_millis(300),
        )
        .await
        .unwrap_err();
    assert!(matches!(error, DpuError::Unavailable(_)), "{error:?}");
    assert!(
        dpu.probe(Instant::now() + Duration::from_millis(300))
            .await
            .is_err()
    );

    // A plugin that answered once and then went away.
    assert!(stack.dpu.probe(deadline()).await.unwrap());
    let Stack {
        plugin,
        dpu,
        agent: _agent,
        ..
    } = stack;
    plugin.stop().await;
    let started = Instant::now();
    let error = dpu
        .attach(&request, started + Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(error, DpuError::Unavailable(_)), "{error:?}");
    assert_kept_deadline("attach", started, Duration::from_secs(1));
}

#[tokio::test]
async fn a_snap_that_is_down_is_unavailable_and_named() {
    let stack = Stack::start().await;
    let missing = stack.emulator.root().join("no-snap.sock");
    let TestDpu { attach: dpu, .. } = &stack.layer(&stack.plugin.socket, &missing).await;
    let started = Instant::now();
    let error = dpu
        .attach(
            &stack.request("vol-nosnap", Emulation::VirtioBlk),
            started + Duration::from_secs(1),
        )
        .await
        .unwrap_err();
    assert!(matches!(error, DpuError::Unavailable(_)), "{error:?}");
    assert!(error.to_string().contains("SNAP at"), "{error}");
    assert!(
        error.to_string().contains(&missing.display().to_string()),
        "{error}"
    );
    assert_kept_deadline("attach", started, Duration::from_secs(1));
    assert!(
        dpu.probe(Instant::now() + Duration::from_millis(300))
            .await
            .is_err()
    );
    // CreateDevice ran (it is idempotent); the volume's detach removes it.
    stack
        .dpu
        .detach("vol-nosnap", None, deadline())
        .await
        .unwrap();
    stack.assert_gone("vol-nosnap").await;
}

#[tokio::test]
async fn a_detach_without_the_device_name_finds_it_in_snap_or_in_the_plugin() {
    let stack = Stack::start().await;
    // SNAP still shows the bdev.
    stack.attach("vol-noname", Emulation::Nvme).await;
    stack
        .dpu
        .detach("vol-noname", None, deadline())
        .await
        .unwrap();
    stack.assert_gone("vol-noname").await;
    assert!(stack.plugin.calls().contains(&format!(
        "DeleteDevice vol-noname {}",
        plugin::device_name("vol-noname")
    )));

    // A crash after CreateDevice only: SNAP shows nothing, ListDevices does.
    crash_after(&stack, "vol-listed", 0).await;
    stack
        .dpu
        .detach("vol-listed", None, deadline())
        .await
        .unwrap();
    stack.assert_gone("vol-listed").await;
    assert!(stack.plugin.calls().contains(&format!(
        "DeleteDevice vol-listed {}",
        plugin::device_name("vol-listed")
    )));

    // Nothing anywhere: the plugin's list is authoritative, nothing to delete.
    stack
        .dpu
        .detach("vol-never", None, deadline())
        .await
        .unwrap();
    assert!(
        !stack
            .plugin
            .calls()
            .iter()
            .any(|c| c.starts_with("DeleteDevice vol-never"))
    );
}

#[tokio::test]
async fn without_list_devices_a_nameless_detach_asks_get_device_then_deletes_by_volume_id() {
    let stack = Stack::with_capabilities(&[
        Capability::CreateDeleteBlockDevice,
        Capability::GetDeviceStats,
    ])
    .await;
    crash_after(&stack, "vol-get", 0).await;
    stack.dpu.detach("vol-get", None, deadline()).await.unwrap();
    stack.assert_gone("vol-get").await;
    stack
        .dpu
        .detach("vol-never", None, deadline())
        .await
        .unwrap();
    let calls = stack.plugin.calls();
    assert!(
        calls.contains(&"GetDevice vol-get ".to_string()),
        "{calls:?}"
    );
    assert!(
        calls.contains(&"DeleteDevice vol-get ".to_string()),
        "{calls:?}"
    );
    assert!(
        calls.contains(&"GetDevice vol-never ".to_string()),
        "{calls:?}"
    );
    assert!(
        !calls
            .iter()
            .any(|c| c.starts_with("DeleteDevice vol-never")),
        "{calls:?}"
    );
    assert!(
        !calls.iter().any(|c| c == "ListDevices"),
        "capability honoured: {calls:?}"
    );
}

#[tokio::test]
async fn with_neither_a_nameless_detach_deletes_by_volume_id_and_capabilities_are_honoured() {
    let stack = Stack::with_capabilities(&[Capability::CreateDeleteBlockDevice]).await;
    crash_after(&stack, "vol-blind", 0).await;
    stack
        .dpu
        .detach("vol-blind", None, deadline())
        .await
        .unwrap();
    stack.assert_gone("vol-blind").await;
    let calls = stack.plugin.calls();
    assert_eq!(calls, ["DeleteDevice vol-blind ".to_string()]);

    let stack = Stack::with_capabilities(&[Capability::ListDevices]).await;
    let error = stack
        .dpu
        .attach(&stack.request("vol-nocap", Emulation::Nvme), deadline())
        .await
        .unwrap_err();
    assert!(
        matches!(error, DpuError::FailedPrecondition(_)),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .contains("TYPE_CREATE_DELETE_BLOCK_DEVICE"),
        "{error}"
    );
    assert!(
        stack.plugin.calls().is_empty(),
        "no CreateDevice without the capability"
    );
}

#[tokio::test]
async fn bad_requests_are_invalid_arguments() {
    let stack = Stack::start().await;
    let mut request = stack.request("vol-bad", Emulation::Nvme);
    request.volume_context.clear();
    let error = stack.dpu.attach(&request, deadline()).await.unwrap_err();
    assert!(matches!(error, DpuError::InvalidArgument(_)), "{error:?}");
    assert!(error.to_string().contains("path"), "{error}");
    request.volume_id.clear();
    let error = stack.dpu.attach(&request, deadline()).await.unwrap_err();
    assert!(matches!(error, DpuError::InvalidArgument(_)), "{error:?}");
    let error = stack.dpu.detach("", None, deadline()).await.unwrap_err();
    assert!(matches!(error, DpuError::InvalidArgument(_)), "{error:?}");
}

#[tokio::test]
async fn attach_and_detach_cost_the_designed_number_of_dependent_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start_with(dir.path(), |c| {
        c.counting_round_trips(common::ROUND_TRIP_PERIOD)
    })
    .await;
    let rounds = || stack.emulator.rounds();
    // The plugin's self-description is asked once per process, not per volume.
    assert!(stack.dpu.probe(deadline()).await.unwrap());

    // [new, retried, detach]
    let nvme = stack.request("vol-rt-nvme", Emulation::Nvme);
    assert_eq!(stack.round_trips_of_a_life(&nvme).await, [5, 1, 4], "NVMe");
    let virtio = stack.request("vol-rt-vblk", Emulation::VirtioBlk);
    assert_eq!(
        stack.round_trips_of_a_life(&virtio).await,
        [2, 1, 3],
        "virtio-blk"
    );

    // Without the caller's record (a crash before it was written), the
    // attach learns from SNAP's -17 that the subsystem exists and reads it.
    let first = stack.dpu.attach(&nvme, deadline()).await.unwrap();
    let (again, trips) = round_trips(rounds, stack.dpu.attach(&nvme, deadline())).await;
    assert_eq!(again.unwrap(), first);
    assert_eq!(trips, 3, "repeated NVMe attach, not known to be attached");
    stack
        .dpu
        .detach("vol-rt-nvme", None, deadline())
        .await
        .unwrap();
    stack.assert_gone("vol-rt-nvme").await;
}
