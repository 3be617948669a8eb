//! Generated protocol types and gRPC stubs for every API we speak.
//!
//! - [`csi::v1`]: the Container Storage Interface v1.12 (Identity, Controller,
//!   GroupController, Node) toward kubelet and the Kubernetes sidecars.
//! - [`nvidia::storage::plugins::v1`]: the vendor plugin API on the DPU.
//! - [`volumegroup`]: the VolumeGroup API (alpha).
//! - [`snapcsi::dpu::v1`]: our own API between the node and the DPU agent
//!   (split mode).
//!
//! Messages that carry secrets (or mount flags) print only how many entries
//! they hold through `Debug`; see `build.rs`.

#![allow(missing_docs, clippy::all, missing_debug_implementations)]

pub mod csi {
    pub mod v1 {
        tonic::include_proto!("csi.v1");
    }
}

pub mod nvidia {
    pub mod storage {
        pub mod plugins {
            pub mod v1 {
                tonic::include_proto!("nvidia.storage.plugins.v1");
            }
        }
    }
}

pub mod volumegroup {
    tonic::include_proto!("volumegroup");
}

pub mod snapcsi {
    pub mod dpu {
        pub mod v1 {
            tonic::include_proto!("snapcsi.dpu.v1");
        }
    }
}

include!(concat!(env!("OUT_DIR"), "/redacted_debug.rs"));

/// Stands in for a sensitive field in `Debug` output: shows how many entries
/// it had, never their contents.
pub(crate) struct Redacted(pub(crate) usize);

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} redacted>", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::csi::v1::{
        NodeExpandVolumeRequest, NodeStageVolumeRequest, VolumeCapability,
        volume_capability::AccessType, volume_capability::MountVolume,
    };
    use super::volumegroup::CreateVolumeGroupRequest;

    #[test]
    fn debug_never_prints_secrets_or_mount_flags() {
        let request = NodeStageVolumeRequest {
            volume_id: "pvc-1".into(),
            staging_target_path: "/var/lib/kubelet/staging".into(),
            secrets: [("password".to_string(), "hunter2".to_string())].into(),
            volume_capability: Some(VolumeCapability {
                access_type: Some(AccessType::Mount(MountVolume {
                    fs_type: "ext4".into(),
                    mount_flags: vec!["ro,key=s3cret".into()],
                    volume_mount_group: String::new(),
                })),
                access_mode: None,
            }),
            ..Default::default()
        };
        let printed = format!("{request:?}");
        assert!(!printed.contains("hunter2"), "{printed}");
        assert!(!printed.contains("s3cret"), "{printed}");
        assert!(
            printed.contains("pvc-1"),
            "other fields still print: {printed}"
        );
        assert!(
            printed.contains("ext4"),
            "other fields still print: {printed}"
        );
        assert!(printed.contains("secrets: <1 redacted>"), "{printed}");

        let group = CreateVolumeGroupRequest {
            name: "g1".into(),
            secrets: [("token".to_string(), "abc-secret".to_string())].into(),
            ..Default::default()
        };
        let printed = format!("{group:?}");
        assert!(!printed.contains("abc-secret"), "{printed}");
        assert!(printed.contains("g1"), "{printed}");

        // Its secret option wraps onto a second line in the .proto.
        let expand = NodeExpandVolumeRequest {
            volume_id: "pvc-2".into(),
            secrets: [("key".to_string(), "expand-secret".to_string())].into(),
            ..Default::default()
        };
        let printed = format!("{expand:?}");
        assert!(!printed.contains("expand-secret"), "{printed}");
        assert!(printed.contains("pvc-2"), "{printed}");
    }
}
