//! Our own conformance checks of the CSI Identity and Node services, written
//! from the spec's MUSTs (`shared/spec/csi-spec.md`, `csi-field-docs.txt`):
//! required fields, the specified error codes, idempotent undo of what is not
//! there, and that a refused request changes nothing.

mod common;

use std::os::unix::fs::symlink;

use common::node::{
    NodeStack, block_capability, mount_capability, mounts_under, publish_request,
    stage_and_publish, stage_request,
};
use snap_csi::node::config::EmulationSetting;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::identity_client::IdentityClient;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use snap_csi::spdk::bdev::BdevGetBdevs;
use snap_csi::spdk::snap::{EmulationFunctionList, EmulationType, NvmeSubsystemList};
use tonic::Code;

/// Nothing exists after a refused call: no bdev, no SNAP object, no mount, no record.
async fn assert_no_trace(stack: &NodeStack) {
    let snap = stack.emulator.client();
    assert!(
        snap.call(&BdevGetBdevs::default())
            .await
            .unwrap()
            .is_empty()
    );
    assert!(snap.call(&NvmeSubsystemList {}).await.unwrap().is_empty());
    assert!(mounts_under(&stack.kubelet).is_empty());
    let records = std::fs::read_dir(stack.config.state_dir.join("volumes"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(records, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_answers_as_the_spec_requires() {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut identity = IdentityClient::new(common::node::connect(&stack.config.endpoint).await);
    let info = identity
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    // Name: domain notation, at most 63 characters; vendor_version REQUIRED.
    assert_eq!(info.name, "csi.snap-csi.io");
    assert!(info.name.len() <= 63);
    assert!(!info.vendor_version.is_empty());
    let probe = identity
        .probe(csi::ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(true), "plugin and SNAP are up");
    // The capabilities of the whole plugin, the same from every instance:
    // csi-sanity, like any CO, reads CONTROLLER_SERVICE from the node's.
    let plugin = identity
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let services: Vec<i32> = plugin
        .capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(csi::plugin_capability::Type::Service(s)) => Some(s.r#type),
            _ => None,
        })
        .collect();
    use csi::plugin_capability::service::Type as Service;
    assert_eq!(
        services,
        [
            Service::ControllerService as i32,
            Service::VolumeAccessibilityConstraints as i32
        ]
    );

    let mut node = stack.client.clone();
    let capabilities = node
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    let stage = csi::node_service_capability::rpc::Type::StageUnstageVolume as i32;
    assert!(capabilities.iter().any(|c| matches!(
        &c.r#type,
        Some(csi::node_service_capability::Type::Rpc(rpc)) if rpc.r#type == stage
    )));
    let info = node
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(!info.node_id.is_empty(), "node_id is REQUIRED");
    // The limit is the DPU's emulated functions of the default emulation
    // (NVMe), PFs and VFs, as SNAP lists them: one volume each under the
    // default placement (0 would tell the CO there is no limit).
    let functions: usize = stack
        .emulator
        .client()
        .call(&EmulationFunctionList { all: true })
        .await
        .unwrap()
        .iter()
        .filter(|pf| pf.emulation_type == EmulationType::Nvme)
        .map(|pf| 1 + pf.vfs.len())
        .sum();
    assert!(functions > 0);
    assert_eq!(usize::try_from(info.max_volumes_per_node), Ok(functions));
    let topology = info.accessible_topology.unwrap();
    assert_eq!(
        topology
            .segments
            .get("topology.snap-csi.io/dpu")
            .map(String::as_str),
        Some("dpu-1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_is_not_ready_while_the_vendor_plugin_is_down() {
    let mut stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut identity = IdentityClient::new(common::node::connect(&stack.config.endpoint).await);
    stack.stop_plugin().await;
    let probe = identity
        .probe(csi::ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_invalid_request_class_gets_its_code_and_leaves_no_trace() {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let backing = stack.backing_file("vol.img", 64 << 20);
    let staging = stack.path("staging/pvc-x");
    std::fs::create_dir_all(&staging).unwrap();
    let target = stack.path("pods/x/volumes/pvc-x");
    let good = mount_capability("ext4", Mode::SingleNodeWriter);

    let outside = tempfile::tempdir().unwrap();
    let escape = stack.path("escape");
    symlink(outside.path(), &escape).unwrap();

    let mut stage_cases: Vec<(&str, csi::NodeStageVolumeRequest, Code)> = Vec::new();
    let base = stage_request("pvc-x", &staging, good.clone(), &backing);
    stage_cases.push((
        "no volume id",
        csi::NodeStageVolumeRequest {
            volume_id: String::new(),
            ..base.clone()
        },
        Code::InvalidArgument,
    ));
    stage_cases.push((
        "no staging path",
        csi::NodeStageVolumeRequest {
            staging_target_path: String::new(),
            ..base.clone()
        },
        Code::InvalidArgument,
    ));
    stage_cases.push((
        "no capability",
        csi::NodeStageVolumeRequest {
            volume_capability: None,
            ..base.clone()
        },
        Code::InvalidArgument,
    ));
    stage_cases.push((
        "relative staging path",
        csi::NodeStageVolumeRequest {
            staging_target_path: "staging/pvc-x".into(),
            ..base.clone()
        },
        Code::InvalidArgument,
    ));
    stage_cases.push((
        "staging path outside kubelet's directory",
        csi::NodeStageVolumeRequest {
            staging_target_path: outside.path().display().to_string(),
            ..base.clone()
        },
        Code::InvalidArgument,
    ));
    stage_cases.push((
        "staging path through a symlink",
        csi::NodeStageVolumeRequest {
            staging_target_path: escape.join("pvc-x").display().to_string(),
            ..base.clone()
        },
        Code::InvalidArgument,
    ));
    stage_cases.push((
        "dot-dot in the staging path",
        csi::NodeStageVolumeRequest {
            staging_target_path: format!("{}/../../etc", staging.display()),
            ..base.clone()
        },
        Code::InvalidArgument,
    ));
    stage_cases.push((
        "unsupported fs type",
        csi::NodeStageVolumeRequest {
            volume_capability: Some(mount_capability("ntfs", Mode::SingleNodeWriter)),
            ..base.clone()
        },
        Code::InvalidArgument,
    ));
    stage_cases.push((
        "no access mode",
        csi::NodeStageVolumeRequest {
            volume_capability: Some(csi::VolumeCapability {
                access_mode: None,
                ..good.clone()
            }),
            ..base.clone()
        },
        Code::InvalidArgument,
    ));
    stage_cases.push((
        "multi-node writer on a local filesystem",
        csi::NodeStageVolumeRequest {
            volume_capability: Some(mount_capability("ext4", Mode::MultiNodeMultiWriter)),
            ..base.clone()
        },
        Code::InvalidArgument,
    ));
    stage_cases.push((
        "unknown emulation",
        csi::NodeStageVolumeRequest {
            volume_context: [
                ("path".to_string(), backing.display().to_string()),
                ("snap-csi.io/emulation".to_string(), "scsi".to_string()),
            ]
            .into(),
            ..base.clone()
        },
        Code::InvalidArgument,
    ));
    for (what, request, code) in stage_cases {
        let status = node.node_stage_volume(request).await.unwrap_err();
        assert_eq!(status.code(), code, "{what}: {status:?}");
        assert!(
            !status.message().is_empty(),
            "{what}: a message says what is wrong"
        );
        assert_no_trace(&stack).await;
    }

    let publish = publish_request("pvc-x", &staging, &target, good.clone(), false);
    let publish_cases = [
        (
            "no volume id",
            csi::NodePublishVolumeRequest {
                volume_id: String::new(),
                ..publish.clone()
            },
            Code::InvalidArgument,
        ),
        (
            "no target path",
            csi::NodePublishVolumeRequest {
                target_path: String::new(),
                ..publish.clone()
            },
            Code::InvalidArgument,
        ),
        (
            "no capability",
            csi::NodePublishVolumeRequest {
                volume_capability: None,
                ..publish.clone()
            },
            Code::InvalidArgument,
        ),
        (
            "target outside kubelet's directory",
            csi::NodePublishVolumeRequest {
                target_path: outside.path().join("t").display().to_string(),
                ..publish.clone()
            },
            Code::InvalidArgument,
        ),
        (
            // REQUIRED fields are checked before the staging path's
            // FAILED_PRECONDITION (csi-sanity sends neither).
            "no capability and no staging path",
            csi::NodePublishVolumeRequest {
                volume_capability: None,
                staging_target_path: String::new(),
                ..publish.clone()
            },
            Code::InvalidArgument,
        ),
        (
            "no staging path with STAGE_UNSTAGE",
            csi::NodePublishVolumeRequest {
                staging_target_path: String::new(),
                ..publish.clone()
            },
            Code::FailedPrecondition,
        ),
        ("not staged", publish.clone(), Code::FailedPrecondition),
        (
            "block volume not staged",
            publish_request(
                "pvc-x",
                &staging,
                &target,
                block_capability(Mode::SingleNodeWriter),
                false,
            ),
            Code::FailedPrecondition,
        ),
    ];
    for (what, request, code) in publish_cases {
        let status = node.node_publish_volume(request).await.unwrap_err();
        assert_eq!(status.code(), code, "{what}: {status:?}");
        assert_no_trace(&stack).await;
    }
    assert!(!target.exists(), "a refused publish creates no target");

    let status = node
        .node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: String::new(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = node
        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: "pvc-x".into(),
            target_path: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: "pvc-x".into(),
            volume_path: stack.path("pods/nope").display().to_string(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        status.code(),
        Code::NotFound,
        "stats of a path that does not exist"
    );
    let status = node
        .node_expand_volume(csi::NodeExpandVolumeRequest {
            volume_id: String::new(),
            volume_path: target.display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_no_trace(&stack).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undoing_what_is_not_there_succeeds() {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: "never-staged".into(),
        staging_target_path: stack.path("staging/never").display().to_string(),
    })
    .await
    .unwrap();
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: "never-published".into(),
        target_path: stack.path("pods/never/volumes/v").display().to_string(),
    })
    .await
    .unwrap();
    assert_no_trace(&stack).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vendor_plugin_that_is_down_makes_stage_unavailable_within_the_deadline() {
    let mut stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let backing = stack.backing_file("vol.img", 64 << 20);
    let staging = stack.path("staging/pvc-u");
    std::fs::create_dir_all(&staging).unwrap();
    stack.stop_plugin().await;
    let mut request = tonic::Request::new(stage_request(
        "pvc-u",
        &staging,
        mount_capability("ext4", Mode::SingleNodeWriter),
        &backing,
    ));
    request.set_timeout(std::time::Duration::from_secs(3));
    let started = std::time::Instant::now();
    let status = node.node_stage_volume(request).await.unwrap_err();
    assert!(
        matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded),
        "{status:?}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert!(
        status.message().contains("plugin"),
        "the message names the plugin: {status:?}"
    );
    assert_no_trace(&stack).await;
}

/// Stats and expand find a volume by the path the CO names: a volume that is
/// not staged here, or not at that path, is NOT_FOUND, whatever the path
/// looks like (csi-sanity sends the relative "some/path"); only a missing
/// argument is INVALID_ARGUMENT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_not_at_the_path_given_is_not_found() {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let stats = |volume_id: &str, volume_path: &str| csi::NodeGetVolumeStatsRequest {
        volume_id: volume_id.into(),
        volume_path: volume_path.into(),
        staging_target_path: String::new(),
    };
    let expand = |volume_id: &str, volume_path: &str| csi::NodeExpandVolumeRequest {
        volume_id: volume_id.into(),
        volume_path: volume_path.into(),
        ..Default::default()
    };
    for path in ["some/path", "/nonexistent/elsewhere"] {
        let status = node
            .node_get_volume_stats(stats("never-staged", path))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "stats, {path}: {status:?}");
        let status = node
            .node_expand_volume(expand("never-staged", path))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "expand, {path}: {status:?}");
    }

    let backing = stack.backing_file("vol.img", 64 << 20);
    let staging = stack.path("staging/pvc-n");
    std::fs::create_dir_all(&staging).unwrap();
    let target = stack.path("pods/n/volumes/pvc-n");
    let capability = mount_capability("ext4", Mode::SingleNodeWriter);
    stage_and_publish(
        &mut node,
        "pvc-n",
        (&staging, &target),
        capability,
        &backing,
        false,
    )
    .await;

    let outside = tempfile::tempdir().unwrap();
    let not_there = [
        "some/path".to_string(),
        outside.path().display().to_string(),
        stack.path("pods/n/volumes/other").display().to_string(),
    ];
    for path in &not_there {
        let status = node
            .node_get_volume_stats(stats("pvc-n", path))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "stats, {path}: {status:?}");
        assert!(status.message().contains("pvc-n"), "{status:?}");
        let status = node
            .node_expand_volume(expand("pvc-n", path))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "expand, {path}: {status:?}");
    }
    let status = node
        .node_get_volume_stats(stats("pvc-n", ""))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let status = node
        .node_expand_volume(expand("pvc-n", ""))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    // Where the volume is, it is found.
    let target_path = target.display().to_string();
    node.node_get_volume_stats(stats("pvc-n", &target_path))
        .await
        .unwrap();

    common::node::unpublish(&mut node, "pvc-n", &target).await;
    common::node::unstage(&mut node, "pvc-n", &staging).await;
    assert_no_trace(&stack).await;
}

/// kubelet and the node sidecars may be built on CSI v1.11 (see
/// `common::csi_v1_11`): every enum in the node's replies is one it knows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_enum_in_the_nodes_replies_is_one_csi_v1_11_knows() {
    use common::csi_v1_11::assert_decodes;
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let mut identity = IdentityClient::new(common::node::connect(&stack.config.endpoint).await);
    let plugin = identity
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_decodes("csi.v1.GetPluginCapabilitiesResponse", &plugin);
    let capabilities = node
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_decodes("csi.v1.NodeGetCapabilitiesResponse", &capabilities);

    // Volume usage has a unit, for a filesystem (bytes, inodes) and a block volume.
    for (name, capability) in [
        ("pvc-fs", mount_capability("ext4", Mode::SingleNodeWriter)),
        ("pvc-blk", block_capability(Mode::SingleNodeWriter)),
    ] {
        let backing = stack.backing_file(&format!("{name}.img"), 64 << 20);
        let staging = stack.path(&format!("staging/{name}"));
        std::fs::create_dir_all(&staging).unwrap();
        let target = stack.path(&format!("pods/v/volumes/{name}"));
        stage_and_publish(
            &mut node,
            name,
            (&staging, &target),
            capability,
            &backing,
            false,
        )
        .await;
        let stats = node
            .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: name.into(),
                volume_path: target.display().to_string(),
                staging_target_path: staging.display().to_string(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(!stats.usage.is_empty(), "{name}: {stats:?}");
        assert_decodes("csi.v1.NodeGetVolumeStatsResponse", &stats);
        common::node::unpublish(&mut node, name, &target).await;
        common::node::unstage(&mut node, name, &staging).await;
    }
    assert_no_trace(&stack).await;
}
