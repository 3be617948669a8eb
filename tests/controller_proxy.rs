//! The controller proxy over real gRPC: a CSI client plays the Kubernetes
//! sidecars, the proxy runs in-process (or as the binary, for its log), and a
//! scripted fake vendor CSI controller records what reaches it.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use common::csi_samples::*;
use common::pki::{Pki, Role, rotate};
use common::proxy::{
    CALL_TIMEOUT, Proxy, answered_within, assert_refused_alike, assert_unreachable,
    capabilities_through, check_roundtrip, plugin_info, proxied_vendor, proxy_process,
};
use common::vendor_controller::{Answer, FakeVendor, Services};
use common::{free_tcp_port, timed};
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::controller_client::ControllerClient;
use snap_csi::proto::csi::v1::group_controller_client::GroupControllerClient;
use snap_csi::proto::volumegroup as vg;
use snap_csi::proto::volumegroup::controller_client::ControllerClient as VolumeGroupClient;
use snap_csi::tls::TlsFiles;
use tonic::Code;

/// [`check_roundtrip`] through one client method.
macro_rules! roundtrip {
    ($vendor:expr, $client:expr, $method:ident, $name:literal, $request:expr, $response:expr) => {{
        let mut client = $client.clone();
        check_roundtrip(&$vendor, $name, $request, $response, |r| async move {
            client.$method(r).await
        })
        .await
    }};
}

#[tokio::test]
async fn every_controller_rpc_reaches_the_vendor_intact_and_its_answer_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let (vendor, proxy) = proxied_vendor(dir.path()).await;
    let c = &proxy.controller;

    roundtrip!(
        vendor,
        c,
        create_volume,
        "CreateVolume",
        csi::CreateVolumeRequest {
            name: "pvc-1".into(),
            capacity_range: Some(capacity()),
            volume_capabilities: vec![mount_capability(), block_capability()],
            parameters: parameters(),
            secrets: secrets(),
            volume_content_source: Some(from_snapshot("snap-1")),
            accessibility_requirements: Some(csi::TopologyRequirement {
                requisite: vec![topology("dpu-a"), topology("dpu-b")],
                preferred: vec![topology("dpu-b")],
            }),
            mutable_parameters: HashMap::from([("iops".to_string(), "5000".to_string())]),
        },
        csi::CreateVolumeResponse {
            volume: Some(volume("vol-1")),
        }
    );
    roundtrip!(
        vendor,
        c,
        delete_volume,
        "DeleteVolume",
        csi::DeleteVolumeRequest {
            volume_id: "vol-1".into(),
            secrets: secrets(),
        },
        csi::DeleteVolumeResponse {}
    );
    roundtrip!(
        vendor,
        c,
        controller_publish_volume,
        "ControllerPublishVolume",
        csi::ControllerPublishVolumeRequest {
            volume_id: "vol-1".into(),
            node_id: "node-1".into(),
            volume_capability: Some(mount_capability()),
            readonly: true,
            secrets: secrets(),
            volume_context: context(),
        },
        csi::ControllerPublishVolumeResponse {
            publish_context: HashMap::from([("lun".to_string(), "3".to_string())]),
        }
    );
    roundtrip!(
        vendor,
        c,
        controller_unpublish_volume,
        "ControllerUnpublishVolume",
        csi::ControllerUnpublishVolumeRequest {
            volume_id: "vol-1".into(),
            node_id: "node-1".into(),
            secrets: secrets(),
        },
        csi::ControllerUnpublishVolumeResponse {}
    );
    roundtrip!(
        vendor,
        c,
        validate_volume_capabilities,
        "ValidateVolumeCapabilities",
        csi::ValidateVolumeCapabilitiesRequest {
            volume_id: "vol-1".into(),
            volume_context: context(),
            volume_capabilities: vec![block_capability()],
            parameters: parameters(),
            secrets: secrets(),
            mutable_parameters: HashMap::from([("iops".to_string(), "5000".to_string())]),
        },
        csi::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                volume_context: context(),
                volume_capabilities: vec![block_capability()],
                parameters: parameters(),
                mutable_parameters: HashMap::from([("iops".to_string(), "5000".to_string())]),
            }),
            message: "confirmed".into(),
        }
    );
    roundtrip!(
        vendor,
        c,
        list_volumes,
        "ListVolumes",
        csi::ListVolumesRequest {
            max_entries: 2,
            starting_token: "page-2".into(),
        },
        csi::ListVolumesResponse {
            entries: vec![csi::list_volumes_response::Entry {
                volume: Some(volume("vol-3")),
                status: Some(csi::list_volumes_response::VolumeStatus {
                    published_node_ids: vec!["node-1".into(), "node-2".into()],
                    volume_condition: Some(condition()),
                }),
            }],
            next_token: "page-3".into(),
        }
    );
    roundtrip!(
        vendor,
        c,
        get_capacity,
        "GetCapacity",
        csi::GetCapacityRequest {
            volume_capabilities: vec![mount_capability()],
            parameters: parameters(),
            accessible_topology: Some(topology("dpu-a")),
        },
        csi::GetCapacityResponse {
            available_capacity: 1 << 40,
            maximum_volume_size: Some(1 << 38),
            minimum_volume_size: Some(1 << 20),
        }
    );
    roundtrip!(
        vendor,
        c,
        controller_get_capabilities,
        "ControllerGetCapabilities",
        csi::ControllerGetCapabilitiesRequest {},
        controller_capabilities()
    );
    roundtrip!(
        vendor,
        c,
        create_snapshot,
        "CreateSnapshot",
        csi::CreateSnapshotRequest {
            source_volume_id: "vol-1".into(),
            name: "snapshot-1".into(),
            secrets: secrets(),
            parameters: parameters(),
        },
        csi::CreateSnapshotResponse {
            snapshot: Some(snapshot("snap-1")),
        }
    );
    roundtrip!(
        vendor,
        c,
        delete_snapshot,
        "DeleteSnapshot",
        csi::DeleteSnapshotRequest {
            snapshot_id: "snap-1".into(),
            secrets: secrets(),
        },
        csi::DeleteSnapshotResponse {}
    );
    roundtrip!(
        vendor,
        c,
        list_snapshots,
        "ListSnapshots",
        csi::ListSnapshotsRequest {
            max_entries: 5,
            starting_token: "t1".into(),
            source_volume_id: "vol-1".into(),
            snapshot_id: "snap-1".into(),
            secrets: secrets(),
        },
        csi::ListSnapshotsResponse {
            entries: vec![csi::list_snapshots_response::Entry {
                snapshot: Some(snapshot("snap-1")),
            }],
            next_token: "t2".into(),
        }
    );
    roundtrip!(
        vendor,
        c,
        get_snapshot,
        "GetSnapshot",
        csi::GetSnapshotRequest {
            snapshot_id: "snap-1".into(),
            secrets: secrets(),
        },
        csi::GetSnapshotResponse {
            snapshot: Some(snapshot("snap-1")),
        }
    );
    roundtrip!(
        vendor,
        c,
        controller_expand_volume,
        "ControllerExpandVolume",
        csi::ControllerExpandVolumeRequest {
            volume_id: "vol-1".into(),
            capacity_range: Some(capacity()),
            secrets: secrets(),
            volume_capability: Some(mount_capability()),
        },
        csi::ControllerExpandVolumeResponse {
            capacity_bytes: 2 << 30,
            node_expansion_required: true,
        }
    );
    roundtrip!(
        vendor,
        c,
        controller_get_volume,
        "ControllerGetVolume",
        csi::ControllerGetVolumeRequest {
            volume_id: "vol-1".into(),
        },
        csi::ControllerGetVolumeResponse {
            volume: Some(volume("vol-1")),
            status: Some(csi::controller_get_volume_response::VolumeStatus {
                published_node_ids: vec!["node-1".into()],
                volume_condition: Some(condition()),
            }),
        }
    );
    roundtrip!(
        vendor,
        c,
        controller_modify_volume,
        "ControllerModifyVolume",
        csi::ControllerModifyVolumeRequest {
            volume_id: "vol-1".into(),
            secrets: secrets(),
            mutable_parameters: HashMap::from([("iops".to_string(), "9000".to_string())]),
        },
        csi::ControllerModifyVolumeResponse {}
    );
    proxy.stop().await;
}

#[tokio::test]
async fn every_group_and_volume_group_rpc_reaches_the_vendor_intact_and_its_answer_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let (vendor, proxy) = proxied_vendor(dir.path()).await;
    let (g, v) = (&proxy.group, &proxy.volume_group);

    roundtrip!(
        vendor,
        g,
        group_controller_get_capabilities,
        "GroupControllerGetCapabilities",
        csi::GroupControllerGetCapabilitiesRequest {},
        group_capabilities()
    );
    roundtrip!(
        vendor,
        g,
        create_volume_group_snapshot,
        "CreateVolumeGroupSnapshot",
        csi::CreateVolumeGroupSnapshotRequest {
            name: "group-snapshot-1".into(),
            source_volume_ids: vec!["vol-1".into(), "vol-2".into()],
            secrets: secrets(),
            parameters: parameters(),
        },
        csi::CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(group_snapshot()),
        }
    );
    roundtrip!(
        vendor,
        g,
        delete_volume_group_snapshot,
        "DeleteVolumeGroupSnapshot",
        csi::DeleteVolumeGroupSnapshotRequest {
            group_snapshot_id: "gsnap-1".into(),
            snapshot_ids: vec!["snap-1".into(), "snap-2".into()],
            secrets: secrets(),
        },
        csi::DeleteVolumeGroupSnapshotResponse {}
    );
    roundtrip!(
        vendor,
        g,
        get_volume_group_snapshot,
        "GetVolumeGroupSnapshot",
        csi::GetVolumeGroupSnapshotRequest {
            group_snapshot_id: "gsnap-1".into(),
            snapshot_ids: vec!["snap-1".into(), "snap-2".into()],
            secrets: secrets(),
        },
        csi::GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(group_snapshot()),
        }
    );

    roundtrip!(
        vendor,
        v,
        create_volume_group,
        "CreateVolumeGroup",
        vg::CreateVolumeGroupRequest {
            name: "group-1".into(),
            parameters: parameters(),
            secrets: secrets(),
        },
        vg::CreateVolumeGroupResponse {
            volume_group: Some(volume_group()),
        }
    );
    roundtrip!(
        vendor,
        v,
        modify_volume_group_membership,
        "ModifyVolumeGroupMembership",
        vg::ModifyVolumeGroupMembershipRequest {
            volume_group_id: "group-1".into(),
            volume_ids: vec!["vol-1".into(), "vol-2".into()],
            secrets: secrets(),
        },
        vg::ModifyVolumeGroupMembershipResponse {
            volume_group: Some(volume_group()),
        }
    );
    roundtrip!(
        vendor,
        v,
        delete_volume_group,
        "DeleteVolumeGroup",
        vg::DeleteVolumeGroupRequest {
            volume_group_id: "group-1".into(),
            secrets: secrets(),
        },
        vg::DeleteVolumeGroupResponse {}
    );
    roundtrip!(
        vendor,
        v,
        list_volume_groups,
        "ListVolumeGroups",
        vg::ListVolumeGroupsRequest {
            max_entries: 10,
            starting_token: "g2".into(),
            secrets: secrets(),
        },
        vg::ListVolumeGroupsResponse {
            entries: vec![vg::list_volume_groups_response::Entry {
                volume_group: Some(volume_group()),
            }],
            next_token: "g3".into(),
        }
    );
    roundtrip!(
        vendor,
        v,
        controller_get_volume_group,
        "ControllerGetVolumeGroup",
        vg::ControllerGetVolumeGroupRequest {
            volume_group_id: "group-1".into(),
            secrets: secrets(),
        },
        vg::ControllerGetVolumeGroupResponse {
            volume_group: Some(volume_group()),
        }
    );
    proxy.stop().await;
}

/// (Every value here is one CSI v1.11 defines; newer ones are the next test's.)
#[tokio::test]
async fn capabilities_are_exactly_the_vendors() {
    let dir = tempfile::tempdir().unwrap();
    let (vendor, proxy) = proxied_vendor(dir.path()).await;
    let ask_controller = || {
        let mut controller = proxy.controller.clone();
        async move {
            controller
                .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
                .await
                .unwrap()
                .into_inner()
        }
    };

    vendor.script(
        "GetPluginCapabilities",
        [Answer::reply(plugin_capabilities())],
    );
    vendor.script(
        "ControllerGetCapabilities",
        [Answer::reply(controller_capabilities())],
    );
    vendor.script(
        "GroupControllerGetCapabilities",
        [Answer::reply(group_capabilities())],
    );
    let plugin = proxy
        .identity
        .clone()
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let controller = ask_controller().await;
    let group = proxy
        .group
        .clone()
        .group_controller_get_capabilities(csi::GroupControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(plugin, plugin_capabilities());
    assert_eq!(controller, controller_capabilities());
    assert_eq!(group, group_capabilities());

    // A vendor that claims nothing gets nothing claimed for it.
    let none = ask_controller().await;
    assert!(none.capabilities.is_empty(), "{none:?}");
    proxy.stop().await;
}

/// Sidecars built on CSI v1.11 crash on an enum value they do not know, so
/// by default the proxy keeps exactly the capability values CSI v1.11
/// defines (read from v1.11's own descriptors); forwarding newer ones is the
/// operator's choice, and then the reply is the vendor's, exactly.
#[tokio::test]
async fn capabilities_newer_than_csi_v1_11_reach_sidecars_only_when_forwarded() {
    use common::csi_v1_11::{assert_decodes, enum_values, unknown_enum_values};
    use csi::plugin_capability::Type;
    let dir = tempfile::tempdir().unwrap();
    let (vendor, proxy) = proxied_vendor(dir.path()).await;
    let (plugin, controller, group) = capabilities_through(&vendor, &proxy).await;
    assert_decodes("csi.v1.GetPluginCapabilitiesResponse", &plugin);
    assert_decodes("csi.v1.ControllerGetCapabilitiesResponse", &controller);
    assert_decodes("csi.v1.GroupControllerGetCapabilitiesResponse", &group);
    let services: Vec<i32> = plugin
        .capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(Type::Service(s)) => Some(s.r#type),
            _ => None,
        })
        .collect();
    let expansions: Vec<i32> = plugin
        .capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(Type::VolumeExpansion(e)) => Some(e.r#type),
            _ => None,
        })
        .collect();
    let controller_rpcs: Vec<i32> = controller
        .capabilities
        .iter()
        .filter_map(|c| c.r#type.as_ref())
        .map(|csi::controller_service_capability::Type::Rpc(r)| r.r#type)
        .collect();
    let group_rpcs: Vec<i32> = group
        .capabilities
        .iter()
        .filter_map(|c| c.r#type.as_ref())
        .map(|csi::group_controller_service_capability::Type::Rpc(r)| r.r#type)
        .collect();
    assert_eq!(
        services,
        enum_values("csi.v1.PluginCapability.Service.Type")
    );
    assert_eq!(
        expansions,
        enum_values("csi.v1.PluginCapability.VolumeExpansion.Type")
    );
    assert_eq!(
        controller_rpcs,
        enum_values("csi.v1.ControllerServiceCapability.RPC.Type")
    );
    assert_eq!(
        group_rpcs,
        enum_values("csi.v1.GroupControllerServiceCapability.RPC.Type")
    );
    proxy.stop().await;

    let forwarding =
        Proxy::start_with(&vendor.endpoint, |c| c.forward_newer_capabilities = true).await;
    let forwarded = capabilities_through(&vendor, &forwarding).await;
    assert_eq!(forwarded, every_capability_value());
    let unknown = unknown_enum_values("csi.v1.ControllerGetCapabilitiesResponse", &forwarded.1);
    assert!(
        unknown.iter().any(|u| u.ends_with(".type = 15")),
        "the v1.11 check sees GET_SNAPSHOT: {unknown:?}"
    );
    forwarding.stop().await;
}

/// One driver name for the whole deployment: the node's unless configured,
/// never the vendor's, which no CSIDriver of ours carries.
#[tokio::test]
async fn plugin_info_is_the_vendors_under_our_driver_name() {
    let dir = tempfile::tempdir().unwrap();
    let vendor = FakeVendor::unix(dir.path(), Services::ALL).await;
    let info = csi::GetPluginInfoResponse {
        name: "csi.vendor.example".into(),
        vendor_version: "4.2.0".into(),
        manifest: HashMap::from([("commit".to_string(), "abc123".to_string())]),
    };
    vendor.script(
        "GetPluginInfo",
        [Answer::reply(info.clone()), Answer::reply(info.clone())],
    );

    let proxy = Proxy::start(&vendor.endpoint).await;
    let got = plugin_info(&proxy).await;
    assert_eq!(
        got,
        csi::GetPluginInfoResponse {
            name: "csi.snap-csi.io".into(),
            ..info.clone()
        }
    );
    proxy.stop().await;

    let renamed = Proxy::start_with(&vendor.endpoint, |c| {
        c.driver_name = "block.example.com".into();
    })
    .await;
    let got = plugin_info(&renamed).await;
    assert_eq!(
        got,
        csi::GetPluginInfoResponse {
            name: "block.example.com".into(),
            ..info
        }
    );
    renamed.stop().await;
}

#[tokio::test]
async fn probe_is_ready_only_when_the_vendor_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (vendor, proxy) = proxied_vendor(dir.path()).await;
    let probe = || {
        let mut identity = proxy.identity.clone();
        async move {
            identity
                .probe(timed(csi::ProbeRequest {}, Duration::from_secs(2)))
                .await
        }
    };

    for ready in [Some(true), Some(false), None] {
        vendor.script("Probe", [Answer::reply(csi::ProbeResponse { ready })]);
        let answer = answered_within(Duration::from_secs(2), probe()).await;
        assert_eq!(answer.unwrap().into_inner().ready, ready);
    }

    vendor.script(
        "Probe",
        [Answer::fail(
            Code::FailedPrecondition,
            "backend array offline",
        )],
    );
    let answer = answered_within(Duration::from_secs(2), probe()).await;
    let status = answer.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(status.message(), "backend array offline");

    let endpoint = vendor.endpoint.clone();
    drop(vendor);
    let answer = answered_within(Duration::from_secs(2), probe()).await;
    let status = answer.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains(&endpoint), "{status:?}");
    proxy.stop().await;
}

#[tokio::test]
async fn the_vendors_errors_come_back_with_its_code_and_message_untried_again() {
    let dir = tempfile::tempdir().unwrap();
    let (vendor, proxy) = proxied_vendor(dir.path()).await;
    let create = csi::CreateVolumeRequest {
        name: "pvc-1".into(),
        capacity_range: Some(capacity()),
        volume_capabilities: vec![mount_capability()],
        parameters: parameters(),
        secrets: secrets(),
        ..Default::default()
    };
    let cases = [
        (Code::AlreadyExists, "volume pvc-1 exists with another size"),
        (Code::NotFound, "snapshot snap-9 does not exist"),
        (Code::ResourceExhausted, "pool fast has 0 bytes free"),
        (Code::Aborted, "an operation on pvc-1 is in progress"),
        (Code::InvalidArgument, "unknown parameter \"colour\""),
        (Code::OutOfRange, "capacity over 16 TiB"),
        (Code::FailedPrecondition, "volume vol-1 is in use"),
        (Code::DeadlineExceeded, "the array took too long"),
        (Code::Internal, "lvol create failed: -28 (No space left)"),
        (Code::Unimplemented, ""),
    ];
    for (code, message) in cases {
        vendor.script("CreateVolume", [Answer::fail(code, message)]);
        let before = vendor
            .received::<csi::CreateVolumeRequest>("CreateVolume")
            .len();
        let answer = answered_within(
            CALL_TIMEOUT,
            proxy
                .controller
                .clone()
                .create_volume(timed(create.clone(), Duration::from_secs(5))),
        )
        .await;
        let status = answer.unwrap_err();
        assert_eq!(status.code(), code, "{status:?}");
        assert_eq!(status.message(), message, "{status:?}");
        let sent = vendor.received::<csi::CreateVolumeRequest>("CreateVolume");
        assert_eq!(sent.len(), before + 1, "{code:?} is an answer, not retried");
    }

    // Rich error details (google.rpc.Status) travel too.
    vendor.script(
        "DeleteSnapshot",
        [Answer::Fail {
            code: Code::FailedPrecondition,
            message: "snapshot has clones".into(),
            details: b"\x08\x09\x12\x05clone".to_vec(),
        }],
    );
    let status = proxy
        .controller
        .clone()
        .delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: "snap-1".into(),
            secrets: secrets(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(status.message(), "snapshot has clones");
    assert_eq!(status.details(), b"\x08\x09\x12\x05clone");
    proxy.stop().await;
}

#[tokio::test]
async fn unavailable_is_retried_until_the_vendor_answers() {
    let dir = tempfile::tempdir().unwrap();
    let (vendor, proxy) = proxied_vendor(dir.path()).await;
    let request = csi::CreateVolumeRequest {
        name: "pvc-1".into(),
        volume_capabilities: vec![block_capability()],
        parameters: parameters(),
        secrets: secrets(),
        ..Default::default()
    };
    let response = csi::CreateVolumeResponse {
        volume: Some(volume("vol-1")),
    };
    vendor.script(
        "CreateVolume",
        [
            Answer::fail(Code::Unavailable, "array controller failing over"),
            Answer::fail(Code::Unavailable, "array controller failing over"),
            Answer::reply(response.clone()),
        ],
    );
    let answer = answered_within(
        CALL_TIMEOUT,
        proxy
            .controller
            .clone()
            .create_volume(timed(request.clone(), Duration::from_secs(5))),
    )
    .await;
    assert_eq!(answer.unwrap().into_inner(), response);
    // Every attempt carried the whole request, secrets and all.
    assert_eq!(
        vendor.received::<csi::CreateVolumeRequest>("CreateVolume"),
        vec![request.clone(), request.clone(), request]
    );
    proxy.stop().await;
}

#[tokio::test]
async fn a_vendor_that_stays_unavailable_has_its_last_answer_returned_within_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let (vendor, proxy) = proxied_vendor(dir.path()).await;
    vendor.script(
        "DeleteVolume",
        (0..1000).map(|_| Answer::fail(Code::Unavailable, "array is rebooting")),
    );
    let deadline = Duration::from_millis(1500);
    let answer = answered_within(
        deadline,
        proxy.controller.clone().delete_volume(timed(
            csi::DeleteVolumeRequest {
                volume_id: "vol-1".into(),
                secrets: secrets(),
            },
            deadline,
        )),
    )
    .await;
    let status = answer.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "array is rebooting");
    let attempts = vendor
        .received::<csi::DeleteVolumeRequest>("DeleteVolume")
        .len();
    assert!(attempts >= 2, "not retried: {attempts} attempt");
    proxy.stop().await;
}

#[tokio::test]
async fn a_vendor_that_is_down_gives_unavailable_naming_it_and_is_reconnected_when_back() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("unix://{}", dir.path().join("vendor.sock").display());
    // The proxy starts before its vendor, as it may in a pod.
    let proxy = Proxy::start(&endpoint).await;
    let delete = || {
        let mut controller = proxy.controller.clone();
        async move {
            controller
                .delete_volume(csi::DeleteVolumeRequest {
                    volume_id: "vol-1".into(),
                    secrets: secrets(),
                })
                .await
        }
    };
    assert_unreachable(&proxy, &endpoint).await;

    let vendor = FakeVendor::unix(dir.path(), Services::ALL).await;
    assert_eq!(vendor.endpoint, endpoint);
    delete().await.unwrap();

    drop(vendor);
    assert_unreachable(&proxy, &endpoint).await;

    // A vendor back on its socket is found again without restarting the proxy.
    let vendor = FakeVendor::unix(dir.path(), Services::ALL).await;
    delete().await.unwrap();
    assert_eq!(vendor.call_count(), 1);
    proxy.stop().await;
}

#[tokio::test]
async fn a_tcp_vendor_that_is_down_gives_unavailable_naming_it() {
    let endpoint = format!("http://127.0.0.1:{}", free_tcp_port());
    let proxy = Proxy::start(&endpoint).await;
    assert_unreachable(&proxy, &endpoint).await;
    proxy.stop().await;
}

#[tokio::test]
async fn a_silent_vendor_gives_unavailable_naming_it_before_the_callers_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let (vendor, proxy) = proxied_vendor(dir.path()).await;
    vendor.script("CreateVolume", [Answer::Silent]);
    assert_unreachable(&proxy, &vendor.endpoint).await;
    drop(vendor);
    drop(proxy);
}

#[tokio::test]
async fn the_vendor_gets_the_callers_deadline_a_little_short_and_capped() {
    let dir = tempfile::tempdir().unwrap();
    let (vendor, proxy) = proxied_vendor(dir.path()).await;
    let call = |timeout: Option<Duration>| {
        let mut controller = proxy.controller.clone();
        async move {
            let mut request = tonic::Request::new(csi::ListVolumesRequest::default());
            if let Some(timeout) = timeout {
                request.set_timeout(timeout);
            }
            controller.list_volumes(request).await.unwrap();
        }
    };
    call(Some(Duration::from_secs(5))).await;
    call(Some(Duration::from_secs(600))).await;
    call(None).await;
    let seen: Vec<Duration> = vendor
        .timeouts("ListVolumes")
        .into_iter()
        .map(|t| t.expect("every call to the vendor has a deadline"))
        .collect();
    assert!(
        seen[0] < Duration::from_secs(5) && seen[0] > Duration::from_secs(4),
        "caller's 5 s became {:?}",
        seen[0]
    );
    for capped in &seen[1..] {
        assert!(
            *capped <= CALL_TIMEOUT && *capped > CALL_TIMEOUT - Duration::from_secs(1),
            "capped by the call timeout: {capped:?}"
        );
    }
    proxy.stop().await;
}

#[tokio::test]
async fn services_the_vendor_lacks_answer_as_the_vendor_does() {
    let dir = tempfile::tempdir().unwrap();
    let vendor = FakeVendor::unix(dir.path(), Services::BASIC).await;
    let proxy = Proxy::start(&vendor.endpoint).await;
    let direct = common::node::connect(
        vendor
            .endpoint
            .strip_prefix("unix://")
            .map(Path::new)
            .unwrap(),
    )
    .await;

    let ours = proxy
        .group
        .clone()
        .group_controller_get_capabilities(csi::GroupControllerGetCapabilitiesRequest {})
        .await
        .unwrap_err();
    let theirs = GroupControllerClient::new(direct.clone())
        .group_controller_get_capabilities(csi::GroupControllerGetCapabilitiesRequest {})
        .await
        .unwrap_err();
    assert_refused_alike(&ours, &theirs);

    let request = vg::CreateVolumeGroupRequest {
        name: "group-1".into(),
        parameters: parameters(),
        secrets: secrets(),
    };
    let ours = proxy
        .volume_group
        .clone()
        .create_volume_group(request.clone())
        .await
        .unwrap_err();
    let theirs = VolumeGroupClient::new(direct)
        .create_volume_group(request)
        .await
        .unwrap_err();
    assert_refused_alike(&ours, &theirs);
    assert_eq!(vendor.call_count(), 0);
    proxy.stop().await;
}

#[tokio::test]
async fn a_tcp_vendor_works_like_a_unix_one() {
    let vendor = FakeVendor::tcp(Services::ALL).await;
    assert!(vendor.endpoint.starts_with("http://127.0.0.1:"));
    let proxy = Proxy::start(&vendor.endpoint).await;

    roundtrip!(
        vendor,
        proxy.controller,
        create_volume,
        "CreateVolume",
        csi::CreateVolumeRequest {
            name: "pvc-tcp".into(),
            capacity_range: Some(capacity()),
            volume_capabilities: vec![mount_capability()],
            parameters: parameters(),
            secrets: secrets(),
            ..Default::default()
        },
        csi::CreateVolumeResponse {
            volume: Some(volume("vol-tcp")),
        }
    );
    vendor.script(
        "DeleteVolume",
        [
            Answer::fail(Code::Unavailable, "busy"),
            Answer::fail(Code::NotFound, "volume vol-x does not exist"),
        ],
    );
    let status = proxy
        .controller
        .clone()
        .delete_volume(timed(
            csi::DeleteVolumeRequest {
                volume_id: "vol-x".into(),
                secrets: secrets(),
            },
            Duration::from_secs(5),
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    assert_eq!(status.message(), "volume vol-x does not exist");
    assert_eq!(
        vendor
            .received::<csi::DeleteVolumeRequest>("DeleteVolume")
            .len(),
        2
    );
    proxy.stop().await;
}

#[tokio::test]
async fn secrets_and_parameters_never_reach_the_log_even_at_debug() {
    let dir = tempfile::tempdir().unwrap();
    let vendor = FakeVendor::unix(dir.path(), Services::ALL).await;
    let endpoint = dir.path().join("csi.sock");
    let log_path = dir.path().join("controller.log");
    let mut child = proxy_process(&endpoint, &vendor.endpoint, &log_path)
        .args(["--call-timeout", "10"])
        .env("RUST_LOG", "debug")
        .spawn()
        .unwrap();
    let channel = common::node::connect(&endpoint).await;
    let mut controller = ControllerClient::new(channel.clone());
    let mut volume_group = VolumeGroupClient::new(channel);

    // Success, the vendor's error, a retry and a group call, each with secrets.
    vendor.script(
        "CreateVolume",
        [
            Answer::fail(Code::Unavailable, "warming up"),
            Answer::reply(csi::CreateVolumeResponse {
                volume: Some(volume("vol-logged")),
            }),
        ],
    );
    vendor.script(
        "DeleteVolume",
        [Answer::fail(Code::FailedPrecondition, "volume is in use")],
    );
    controller
        .create_volume(timed(
            csi::CreateVolumeRequest {
                name: "pvc-logged".into(),
                volume_capabilities: vec![mount_capability()],
                parameters: parameters(),
                secrets: secrets(),
                mutable_parameters: parameters(),
                ..Default::default()
            },
            Duration::from_secs(5),
        ))
        .await
        .unwrap();
    controller
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: "vol-logged".into(),
            secrets: secrets(),
        })
        .await
        .unwrap_err();
    controller
        .controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: "vol-logged".into(),
            node_id: "node-1".into(),
            volume_capability: Some(mount_capability()),
            secrets: secrets(),
            volume_context: parameters(),
            ..Default::default()
        })
        .await
        .unwrap();
    volume_group
        .create_volume_group(vg::CreateVolumeGroupRequest {
            name: "group-logged".into(),
            parameters: parameters(),
            secrets: secrets(),
        })
        .await
        .unwrap();

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(
        status.success(),
        "the proxy exits cleanly on SIGTERM: {status}"
    );
    assert!(!endpoint.exists(), "the proxy removes its socket");

    let log = std::fs::read_to_string(&log_path).unwrap();
    for method in [
        "CreateVolume",
        "DeleteVolume",
        "ControllerPublishVolume",
        "CreateVolumeGroup",
    ] {
        assert!(log.contains(method), "{method} is not in the log:\n{log}");
    }
    assert!(
        log.contains("pvc-logged"),
        "the volume name is logged:\n{log}"
    );
    assert!(
        log.contains("volume is in use"),
        "the vendor's error is logged:\n{log}"
    );
    assert!(!log.contains(SECRET), "a secret reached the log:\n{log}");
    assert!(
        !log.contains(PARAMETER),
        "a parameter reached the log:\n{log}"
    );
}

/// A vendor socket whose path has a space (no valid URI: a review feared the
/// proxy would panic at start on it) is served like any other, by the binary
/// as an operator starts it.
#[tokio::test]
async fn a_vendor_socket_path_with_a_space_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let spaced = dir.path().join("vendor dir");
    std::fs::create_dir(&spaced).unwrap();
    let vendor = FakeVendor::unix(&spaced, Services::ALL).await;
    assert!(vendor.endpoint.contains(' '), "{}", vendor.endpoint);
    let endpoint = dir.path().join("csi.sock");
    let log_path = dir.path().join("controller.log");
    let child = proxy_process(&endpoint, &vendor.endpoint, &log_path)
        .spawn()
        .unwrap();
    let mut child = common::shared::KillOnDrop(child);
    let channel = common::node::connect(&endpoint).await;
    ControllerClient::new(channel)
        .list_volumes(timed(
            csi::ListVolumesRequest::default(),
            Duration::from_secs(5),
        ))
        .await
        .unwrap();
    assert_eq!(vendor.call_count(), 1);
    assert_eq!(child.0.try_wait().unwrap(), None, "the proxy still runs");
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(!log.contains("panicked"), "{log}");
}

#[tokio::test]
async fn an_id_or_name_past_csis_limit_is_refused_before_the_vendor_hears_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let (vendor, proxy) = proxied_vendor(dir.path()).await;
    let huge = "v".repeat(1 << 20);
    let mut controller = proxy.controller.clone();
    let create = controller
        .create_volume(csi::CreateVolumeRequest {
            name: huge.clone(),
            volume_capabilities: vec![mount_capability()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    let delete = controller
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: "v".repeat(129),
            secrets: secrets(),
        })
        .await
        .unwrap_err();
    let publish = controller
        .controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: huge.clone(),
            node_id: "node-1".into(),
            volume_capability: Some(mount_capability()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    let snapshot = controller
        .delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: huge,
            secrets: secrets(),
        })
        .await
        .unwrap_err();
    for (status, message) in [
        (create, "name is 1048576 bytes; CSI limits it to 128"),
        (delete, "volume_id is 129 bytes; CSI limits it to 128"),
        (publish, "volume_id is 1048576 bytes; CSI limits it to 128"),
        (
            snapshot,
            "snapshot_id is 1048576 bytes; CSI limits it to 128",
        ),
    ] {
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert_eq!(status.message(), message);
    }
    assert_eq!(vendor.call_count(), 0, "the vendor was called");

    // At the limit, the call goes through.
    vendor.script(
        "DeleteVolume",
        [Answer::reply(csi::DeleteVolumeResponse {})],
    );
    controller
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: "v".repeat(128),
            secrets: secrets(),
        })
        .await
        .unwrap();
    proxy.stop().await;
}

/// The DNS names of the two ends of a TLS link to the vendor.
const VENDOR_NAME: &str = "csi.vendor.test";
const PROXY_NAME: &str = "controller-proxy.test";

/// The proxy's TLS files at fixed paths (as a mounted Secret), holding
/// `cert`'s certificate and key and trusting `ca`.
fn proxy_files(dir: &Path, cert: &TlsFiles, ca: &Path) -> TlsFiles {
    std::fs::create_dir_all(dir).unwrap();
    let files = TlsFiles {
        cert: dir.join("proxy.crt"),
        key: dir.join("proxy.key"),
        ca: dir.join("proxy-ca.crt"),
    };
    let source = TlsFiles {
        ca: ca.to_path_buf(),
        ..cert.clone()
    };
    rotate(&source, &files);
    files
}

/// Secrets cross the link to the vendor, so across a network it is mutual
/// TLS, as the DPU link is: a vendor that does not accept the proxy's
/// certificate, or whose own certificate names another host, hears nothing
/// and the caller gets UNAVAILABLE naming it; new files (a renewed
/// certificate) take effect without a restart.
#[tokio::test]
async fn the_vendor_over_mutual_tls_hears_only_a_proxy_it_trusts_and_files_are_followed() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"), "vendor-ca");
    let stranger = Pki::new(&dir.path().join("stranger"), "stranger-ca");
    let vendor = FakeVendor::tls(
        Services::ALL,
        pki.issue(Role::Agent, VENDOR_NAME),
        PROXY_NAME,
    )
    .await;
    let start = |vendor_name: &'static str, files: TlsFiles| {
        Proxy::start_with(&vendor.endpoint, move |c| {
            c.vendor_name = vendor_name.into();
            c.vendor_tls = files;
        })
    };

    // A server certificate that names another host: the proxy refuses it.
    let trusted = proxy_files(
        &dir.path().join("trusted"),
        &pki.issue(Role::Node, PROXY_NAME),
        &pki.ca_file(),
    );
    let misnamed = start("another.vendor.test", trusted.clone()).await;
    assert_unreachable(&misnamed, &vendor.endpoint).await;
    misnamed.stop().await;

    // A client certificate from a CA the vendor does not trust: the vendor
    // refuses it.
    let files = proxy_files(
        &dir.path().join("rotated"),
        &stranger.issue(Role::Node, PROXY_NAME),
        &pki.ca_file(),
    );
    let proxy = start(VENDOR_NAME, files.clone()).await;
    assert_unreachable(&proxy, &vendor.endpoint).await;
    assert_eq!(vendor.call_count(), 0, "the vendor heard a refused proxy");

    // Renewed by the vendor's CA: the next connection uses the new files.
    rotate(&trusted, &files);
    let request = csi::CreateVolumeRequest {
        name: "pvc-tls".into(),
        secrets: secrets(),
        ..Default::default()
    };
    let mut controller = proxy.controller.clone();
    let renewed = async {
        loop {
            let call = controller.create_volume(timed(request.clone(), Duration::from_secs(5)));
            match call.await {
                Ok(_) => return,
                Err(status) => assert_eq!(status.code(), Code::Unavailable, "{status:?}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), renewed)
        .await
        .expect("the proxy never moved to its renewed certificate");
    assert_eq!(
        vendor.received::<csi::CreateVolumeRequest>("CreateVolume"),
        vec![request],
        "the request, secrets and all, reached the vendor once, over TLS"
    );
    proxy.stop().await;
}

/// Plaintext over a network is refused when the proxy starts, even with the
/// flag that allows it on loopback.
#[tokio::test]
async fn a_plaintext_vendor_endpoint_off_loopback_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("controller.log");
    for (endpoint, insecure, refusal) in [
        ("http://192.0.2.7:5000", true, "non-loopback"),
        ("http://192.0.2.7:5000", false, "https://"),
        (
            "http://127.0.0.1:5000",
            false,
            "--vendor-insecure-plaintext",
        ),
    ] {
        let mut command = proxy_process(&dir.path().join("csi.sock"), endpoint, &log_path);
        if insecure {
            command.arg("--vendor-insecure-plaintext");
        }
        let status = command.status().unwrap();
        let log = std::fs::read_to_string(&log_path).unwrap();
        assert!(!status.success(), "{endpoint}: the proxy started");
        assert!(log.contains(refusal), "{endpoint}: {log}");
        assert!(
            !dir.path().join("csi.sock").exists(),
            "{endpoint}: it listened"
        );
    }
}
