//! The CSI messages the controller proxy's tests send and script: every
//! field set, with distinctive secrets and parameters a log can be searched
//! for.

use std::collections::HashMap;

use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::volumegroup as vg;

use csi::volume_capability::access_mode::Mode;

/// What secrets and parameters hold in every request here: distinctive
/// strings, so that a log can be searched for them.
pub const SECRET: &str = "s3cr3t-hunter2-value";

pub const PARAMETER: &str = "param-value-7f3a";

pub fn secrets() -> HashMap<String, String> {
    HashMap::from([
        ("username".to_string(), "admin".to_string()),
        ("password".to_string(), SECRET.to_string()),
    ])
}

pub fn parameters() -> HashMap<String, String> {
    HashMap::from([
        ("backend".to_string(), "nvmf".to_string()),
        ("pool".to_string(), PARAMETER.to_string()),
    ])
}

pub fn context() -> HashMap<String, String> {
    HashMap::from([(
        "target".to_string(),
        "nqn.2024-01.io.example:pvc-1".to_string(),
    )])
}

pub fn topology(zone: &str) -> csi::Topology {
    csi::Topology {
        segments: HashMap::from([("topology.snap-csi.io/dpu".to_string(), zone.to_string())]),
    }
}

pub fn mount_capability() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume {
                fs_type: "xfs".into(),
                mount_flags: vec!["noatime".into(), "nodiscard".into()],
                volume_mount_group: "2000".into(),
            },
        )),
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: Mode::SingleNodeMultiWriter as i32,
        }),
    }
}

pub fn block_capability() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Block(
            csi::volume_capability::BlockVolume {},
        )),
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: Mode::MultiNodeReaderOnly as i32,
        }),
    }
}

pub fn capacity() -> csi::CapacityRange {
    csi::CapacityRange {
        required_bytes: 1 << 30,
        limit_bytes: 2 << 30,
    }
}

pub fn from_snapshot(id: &str) -> csi::VolumeContentSource {
    csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: id.into(),
            },
        )),
    }
}

pub fn volume(id: &str) -> csi::Volume {
    csi::Volume {
        capacity_bytes: 3 << 30,
        volume_id: id.into(),
        volume_context: context(),
        content_source: Some(from_snapshot("snap-1")),
        accessible_topology: vec![topology("dpu-a"), topology("dpu-b")],
    }
}

pub fn timestamp() -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: 1_700_000_000,
        nanos: 123_456_789,
    }
}

pub fn snapshot(id: &str) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: 3 << 30,
        snapshot_id: id.into(),
        source_volume_id: "vol-1".into(),
        creation_time: Some(timestamp()),
        ready_to_use: true,
        group_snapshot_id: "gsnap-1".into(),
    }
}

pub fn condition() -> csi::VolumeCondition {
    csi::VolumeCondition {
        abnormal: true,
        message: "one path down".into(),
    }
}

pub fn group_snapshot() -> csi::VolumeGroupSnapshot {
    csi::VolumeGroupSnapshot {
        group_snapshot_id: "gsnap-1".into(),
        snapshots: vec![snapshot("snap-1"), snapshot("snap-2")],
        creation_time: Some(timestamp()),
        ready_to_use: true,
    }
}

pub fn volume_group() -> vg::VolumeGroup {
    vg::VolumeGroup {
        volume_group_id: "group-1".into(),
        volume_group_context: context(),
        volumes: vec![vg::VgVolume {
            capacity_bytes: 1 << 30,
            volume_id: "vol-1".into(),
            volume_context: context(),
            content_source: Some(vg::VgVolumeContentSource {
                r#type: Some(vg::vg_volume_content_source::Type::Volume(
                    vg::vg_volume_content_source::VolumeSource {
                        volume_id: "vol-0".into(),
                    },
                )),
            }),
            accessible_topology: vec![vg::VgTopology {
                segments: HashMap::from([("zone".to_string(), "a".to_string())]),
            }],
        }],
    }
}

pub fn plugin_capabilities() -> csi::GetPluginCapabilitiesResponse {
    use csi::plugin_capability::{Service, Type, VolumeExpansion, service, volume_expansion};
    let service = |t: service::Type| csi::PluginCapability {
        r#type: Some(Type::Service(Service { r#type: t as i32 })),
    };
    csi::GetPluginCapabilitiesResponse {
        capabilities: vec![
            service(service::Type::ControllerService),
            service(service::Type::VolumeAccessibilityConstraints),
            service(service::Type::GroupControllerService),
            csi::PluginCapability {
                r#type: Some(Type::VolumeExpansion(VolumeExpansion {
                    r#type: volume_expansion::Type::Online as i32,
                })),
            },
        ],
    }
}

pub fn controller_capabilities() -> csi::ControllerGetCapabilitiesResponse {
    use csi::controller_service_capability::{Rpc, Type, rpc};
    csi::ControllerGetCapabilitiesResponse {
        capabilities: [
            rpc::Type::CreateDeleteVolume,
            rpc::Type::CreateDeleteSnapshot,
            rpc::Type::ListSnapshots,
            rpc::Type::CloneVolume,
            rpc::Type::ExpandVolume,
            rpc::Type::ListVolumes,
            rpc::Type::GetCapacity,
        ]
        .into_iter()
        .map(|t| csi::ControllerServiceCapability {
            r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
        })
        .collect(),
    }
}

pub fn group_capabilities() -> csi::GroupControllerGetCapabilitiesResponse {
    use csi::group_controller_service_capability::{Rpc, Type, rpc};
    csi::GroupControllerGetCapabilitiesResponse {
        capabilities: vec![csi::GroupControllerServiceCapability {
            r#type: Some(Type::Rpc(Rpc {
                r#type: rpc::Type::CreateDeleteGetVolumeGroupSnapshot as i32,
            })),
        }],
    }
}

/// Capability replies with every value from 0 to 20 of each capability enum:
/// CSI v1.11's, CSI 1.12's GET_SNAPSHOT (15), and values no CSI has yet.
pub fn every_capability_value() -> (
    csi::GetPluginCapabilitiesResponse,
    csi::ControllerGetCapabilitiesResponse,
    csi::GroupControllerGetCapabilitiesResponse,
) {
    use csi::plugin_capability::{Service, Type, VolumeExpansion};
    let values = 0..=20;
    let plugin = values
        .clone()
        .flat_map(|v| {
            [
                Type::Service(Service { r#type: v }),
                Type::VolumeExpansion(VolumeExpansion { r#type: v }),
            ]
        })
        .map(|t| csi::PluginCapability { r#type: Some(t) })
        .collect();
    let controller = values
        .clone()
        .map(|v| csi::ControllerServiceCapability {
            r#type: Some(csi::controller_service_capability::Type::Rpc(
                csi::controller_service_capability::Rpc { r#type: v },
            )),
        })
        .collect();
    let group = values
        .map(|v| csi::GroupControllerServiceCapability {
            r#type: Some(csi::group_controller_service_capability::Type::Rpc(
                csi::group_controller_service_capability::Rpc { r#type: v },
            )),
        })
        .collect();
    (
        csi::GetPluginCapabilitiesResponse {
            capabilities: plugin,
        },
        csi::ControllerGetCapabilitiesResponse {
            capabilities: controller,
        },
        csi::GroupControllerGetCapabilitiesResponse {
            capabilities: group,
        },
    )
}
