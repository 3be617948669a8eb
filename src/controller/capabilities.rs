//! The one change the proxy makes to a vendor's replies: capability values
//! that a client built on CSI v1.11 cannot decode are dropped, unless the
//! operator forwards them (`--forward-newer-capabilities`).
//!
//! Why: the Kubernetes sidecars users run today (external-provisioner v5.2.0,
//! and every sidecar built on the csi-lib-utils of its time) are compiled
//! against CSI v1.11, and their gRPC logging turns every reply into text,
//! which dereferences nil on an enum value the sidecar does not know, at any
//! log level: the sidecar panics at start and crash-loops. A vendor
//! controller newer than its sidecars (CSI 1.12 added GET_SNAPSHOT) would
//! crash them through us. A dropped capability only hides an RPC that such a
//! sidecar cannot call anyway.
//!
//! CSI numbers every enum densely from 0, so "known to v1.11" is "at most the
//! last value v1.11 defines"; that also drops values of any later version.

use tonic::Response;

use crate::proto::csi::v1 as csi;
use csi::controller_service_capability::rpc::Type as ControllerRpc;
use csi::group_controller_service_capability::rpc::Type as GroupRpc;
use csi::plugin_capability::service::Type as Service;
use csi::plugin_capability::volume_expansion::Type as Expansion;

/// The last value CSI v1.11 defines, per capability enum.
const LAST_SERVICE: Service = Service::SnapshotMetadataService;
const LAST_EXPANSION: Expansion = Expansion::Offline;
const LAST_CONTROLLER_RPC: ControllerRpc = ControllerRpc::ModifyVolume;
const LAST_GROUP_RPC: GroupRpc = GroupRpc::CreateDeleteGetVolumeGroupSnapshot;

/// Whether the proxy forwards capability values newer than CSI v1.11.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapabilityFilter {
    pub forward_newer: bool,
}

impl CapabilityFilter {
    /// The vendor's `response`, less what a CSI v1.11 client cannot decode
    /// unless newer values are forwarded; says in the log what it dropped.
    pub fn apply<R: CapabilityReply>(
        &self,
        method: &str,
        mut response: Response<R>,
    ) -> Response<R> {
        if !self.forward_newer {
            let dropped = response.get_mut().retain_csi_v1_11();
            if !dropped.is_empty() {
                tracing::info!(
                    method,
                    ?dropped,
                    "dropped capability values a CSI v1.11 client cannot decode \
                     (--forward-newer-capabilities forwards them)"
                );
            }
        }
        response
    }
}

/// A capability reply whose entries can be checked against CSI v1.11.
pub trait CapabilityReply {
    /// Keeps the entries CSI v1.11 defines; returns the values dropped.
    fn retain_csi_v1_11(&mut self) -> Vec<i32>;
}

/// Keeps the items whose value (given with its enum's last v1.11 value, or
/// `None` for an item without one) is known; returns the others' values.
fn retain<T>(items: &mut Vec<T>, value: impl Fn(&T) -> Option<(i32, i32)>) -> Vec<i32> {
    let mut dropped = Vec::new();
    items.retain(|item| match value(item) {
        Some((value, last)) if !(0..=last).contains(&value) => {
            dropped.push(value);
            false
        }
        _ => true,
    });
    dropped
}

impl CapabilityReply for csi::GetPluginCapabilitiesResponse {
    fn retain_csi_v1_11(&mut self) -> Vec<i32> {
        use csi::plugin_capability::Type;
        retain(&mut self.capabilities, |c| match &c.r#type {
            Some(Type::Service(s)) => Some((s.r#type, LAST_SERVICE as i32)),
            Some(Type::VolumeExpansion(e)) => Some((e.r#type, LAST_EXPANSION as i32)),
            None => None,
        })
    }
}

impl CapabilityReply for csi::ControllerGetCapabilitiesResponse {
    fn retain_csi_v1_11(&mut self) -> Vec<i32> {
        use csi::controller_service_capability::Type;
        retain(&mut self.capabilities, |c| {
            c.r#type
                .as_ref()
                .map(|Type::Rpc(rpc)| (rpc.r#type, LAST_CONTROLLER_RPC as i32))
        })
    }
}

impl CapabilityReply for csi::GroupControllerGetCapabilitiesResponse {
    fn retain_csi_v1_11(&mut self) -> Vec<i32> {
        use csi::group_controller_service_capability::Type;
        retain(&mut self.capabilities, |c| {
            c.r#type
                .as_ref()
                .map(|Type::Rpc(rpc)| (rpc.r#type, LAST_GROUP_RPC as i32))
        })
    }
}
