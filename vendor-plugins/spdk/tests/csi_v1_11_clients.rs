//! The sidecars users run today are built on CSI v1.11 and crash on an enum
//! value they do not know (their gRPC logging turns every reply into text).
//! Every reply of the sample controller that carries a CSI enum must decode
//! under v1.11's descriptors, directly and through `snap-csi controller`;
//! CSI 1.12's GET_SNAPSHOT appears only when the operator turns it on.
//! (The plugins.v1 service has no CSI enums and no sidecar calls it: the
//! node, built from the same proto, is its only client.)

mod common;

use common::csi::{Backends, Csi, MIB, block, capability, mount, volume};
use common::csi_v1_11::{assert_decodes, unknown_enum_values};
use common::group_snapshots::member_ids;
use common::proxy::Proxy;
use common::{TIMEOUT, timed};
use snap_csi::proto::csi::v1 as csi;
use tonic::Code;
use tonic::transport::Channel;

use csi::controller_client::ControllerClient;
use csi::controller_service_capability::rpc::Type as Capability;
use csi::group_controller_client::GroupControllerClient;
use csi::group_controller_service_capability::rpc::Type as GroupCapability;
use csi::identity_client::IdentityClient;
use csi::volume_capability::access_mode::Mode;

async fn controller_capabilities(
    controller: &ControllerClient<Channel>,
) -> csi::ControllerGetCapabilitiesResponse {
    controller
        .clone()
        .controller_get_capabilities(timed(csi::ControllerGetCapabilitiesRequest {}, TIMEOUT))
        .await
        .unwrap()
        .into_inner()
}

fn lists_get_snapshot(reply: &csi::ControllerGetCapabilitiesResponse) -> bool {
    reply.capabilities.iter().any(|c| {
        matches!(&c.r#type,
            Some(csi::controller_service_capability::Type::Rpc(r))
                if r.r#type == Capability::GetSnapshot as i32)
    })
}

/// Each enum-bearing reply of one endpoint, checked against CSI v1.11.
async fn assert_every_reply_decodes(
    identity: &IdentityClient<Channel>,
    controller: &ControllerClient<Channel>,
    volume_id: &str,
) {
    let plugin = identity
        .clone()
        .get_plugin_capabilities(timed(csi::GetPluginCapabilitiesRequest {}, TIMEOUT))
        .await
        .unwrap()
        .into_inner();
    assert_decodes("csi.v1.GetPluginCapabilitiesResponse", &plugin);
    assert_decodes(
        "csi.v1.ControllerGetCapabilitiesResponse",
        &controller_capabilities(controller).await,
    );
    // Access modes come back in the confirmation.
    let modes = [
        Mode::SingleNodeWriter,
        Mode::SingleNodeReaderOnly,
        Mode::SingleNodeSingleWriter,
        Mode::SingleNodeMultiWriter,
    ];
    let capabilities = modes
        .into_iter()
        .map(|m| capability(mount().access_type.unwrap(), m))
        .chain([block()])
        .collect();
    let validated = controller
        .clone()
        .validate_volume_capabilities(timed(
            csi::ValidateVolumeCapabilitiesRequest {
                volume_id: volume_id.into(),
                volume_capabilities: capabilities,
                ..Default::default()
            },
            TIMEOUT,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(validated.confirmed.is_some(), "{validated:?}");
    assert_decodes("csi.v1.ValidateVolumeCapabilitiesResponse", &validated);
}

#[tokio::test]
async fn every_reply_decodes_for_a_csi_v1_11_sidecar_directly_and_through_the_proxy() {
    let csi = Csi::start(Backends::BOTH).await;
    let created = csi
        .create(volume("pvc-v1-11", "aio", 16 * MIB, 0))
        .await
        .unwrap();
    assert_every_reply_decodes(&csi.identity, &csi.controller, &created.volume_id).await;
    assert!(!lists_get_snapshot(
        &controller_capabilities(&csi.controller).await
    ));

    let proxy = Proxy::start(&csi).await;
    assert_every_reply_decodes(&proxy.identity, &proxy.controller, &created.volume_id).await;
    // The GroupController: its capability is one v1.11 knows, passed as it
    // is, and a group snapshot made through the proxy is the sample's.
    let group_capabilities = async |client: &GroupControllerClient<Channel>| {
        client
            .clone()
            .group_controller_get_capabilities(timed(
                csi::GroupControllerGetCapabilitiesRequest {},
                TIMEOUT,
            ))
            .await
            .unwrap()
            .into_inner()
    };
    let direct = group_capabilities(&csi.group_snapshots).await;
    assert_decodes("csi.v1.GroupControllerGetCapabilitiesResponse", &direct);
    assert_eq!(group_capabilities(&proxy.group).await, direct);
    assert_eq!(
        direct.capabilities[0].r#type,
        Some(csi::group_controller_service_capability::Type::Rpc(
            csi::group_controller_service_capability::Rpc {
                r#type: GroupCapability::CreateDeleteGetVolumeGroupSnapshot as i32
            }
        ))
    );
    let made = proxy
        .group
        .clone()
        .create_volume_group_snapshot(timed(
            csi::CreateVolumeGroupSnapshotRequest {
                name: "gs-v1-11".into(),
                source_volume_ids: vec![created.volume_id.clone()],
                ..Default::default()
            },
            TIMEOUT,
        ))
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert_decodes("csi.v1.VolumeGroupSnapshot", &made);
    let got = csi
        .get_group_snapshot(&made.group_snapshot_id, &member_ids(&made))
        .await
        .unwrap();
    assert_eq!(got, made);
    proxy
        .group
        .clone()
        .delete_volume_group_snapshot(timed(
            csi::DeleteVolumeGroupSnapshotRequest {
                group_snapshot_id: made.group_snapshot_id.clone(),
                snapshot_ids: member_ids(&made).iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            },
            TIMEOUT,
        ))
        .await
        .unwrap();
    assert_eq!(
        csi.get_group_snapshot(&made.group_snapshot_id, &[])
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    proxy.stop().await;
    csi.delete(&created.volume_id).await.unwrap();
}

/// With `--advertise-get-snapshot` the sample lists GET_SNAPSHOT, which the
/// v1.11 check flags; the proxy drops it unless it forwards newer values too.
#[tokio::test]
async fn get_snapshot_is_advertised_only_when_turned_on_at_each_hop() {
    let csi = Csi::start_with(Backends::BOTH, &common::Source::Emulator, |c| {
        c.advertise_get_snapshot = true
    })
    .await;
    let direct = controller_capabilities(&csi.controller).await;
    assert!(lists_get_snapshot(&direct));
    let unknown = unknown_enum_values("csi.v1.ControllerGetCapabilitiesResponse", &direct);
    assert_eq!(unknown.len(), 1, "{unknown:?}");
    assert!(unknown[0].ends_with(".type = 15"), "{unknown:?}");

    let proxy = Proxy::start(&csi).await;
    let filtered = controller_capabilities(&proxy.controller).await;
    assert_decodes("csi.v1.ControllerGetCapabilitiesResponse", &filtered);
    assert!(!lists_get_snapshot(&filtered));
    assert_eq!(filtered.capabilities.len(), direct.capabilities.len() - 1);
    proxy.stop().await;

    let forwarding = Proxy::start_with(&csi, |c| c.forward_newer_capabilities = true).await;
    assert_eq!(
        controller_capabilities(&forwarding.controller).await,
        direct
    );
    forwarding.stop().await;
}
