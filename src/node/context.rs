//! What the CO's volume and publish contexts say to the node: the keys a
//! StorageClass sets (the emulation and placement), the PV and PVC the
//! provisioner names, and DPF's attachment handed over by its controller.

use std::collections::HashMap;

use tonic::Status;

use super::config::{NodeConfig, PlacementSetting};
use crate::dpu::{Emulation, HostLocator};

/// Volume context key choosing the emulation ([`Emulation::name`]).
pub const EMULATION_KEY: &str = "snap-csi.io/emulation";
/// Volume context key choosing the placement (`dedicated` or `packed`).
pub const PLACEMENT_KEY: &str = "snap-csi.io/placement";
/// DPF's controller-side attach hands the node the function and namespace.
pub const DPF_PCI_ADDRESS_KEY: &str = "nv-pciDeviceAddress";
pub const DPF_NVME_NSID_KEY: &str = "nv-nvmeNsID";
/// The topology key naming the DPU that serves this node.
pub const TOPOLOGY_KEY: &str = "topology.snap-csi.io/dpu";
/// What external-provisioner's `--extra-create-metadata` adds to the
/// parameters, which the vendor's controller copies into the volume
/// context, each with the label the per-volume metrics give it.
pub(super) const METADATA_LABELS: [(&str, &str); 3] = [
    ("csi.storage.k8s.io/pv/name", "pv"),
    ("csi.storage.k8s.io/pvc/name", "pvc"),
    ("csi.storage.k8s.io/pvc/namespace", "pvc_namespace"),
];

/// The emulation and placement a stage asks for, or the node's defaults;
/// INVALID_ARGUMENT for a value or a combination SNAP cannot serve.
pub(super) fn emulation_and_placement(
    volume_context: &HashMap<String, String>,
    config: &NodeConfig,
) -> Result<(Emulation, PlacementSetting), Status> {
    let emulation = match volume_context.get(EMULATION_KEY) {
        Some(value) => Emulation::parse(value).ok_or_else(|| {
            let names = Emulation::listed(Emulation::ALL, Emulation::name);
            Status::invalid_argument(format!("{EMULATION_KEY} must be {names}, not {value:?}"))
        })?,
        None => config.emulation,
    };
    let placement = match volume_context.get(PLACEMENT_KEY) {
        Some(value) => PlacementSetting::parse(value).ok_or_else(|| {
            Status::invalid_argument(format!(
                "{PLACEMENT_KEY} must be dedicated or packed, not {value:?}"
            ))
        })?,
        // The node's default is for emulations that pack; the others have
        // only one.
        None if !emulation.packs() => PlacementSetting::Dedicated,
        None => config.placement,
    };
    if placement == PlacementSetting::Packed && !emulation.packs() {
        return Err(Status::invalid_argument(format!(
            "{PLACEMENT_KEY} packed needs {}: a {} function carries one disk \
             (set {EMULATION_KEY}: {}, or {PLACEMENT_KEY}: dedicated)",
            Emulation::listed(Emulation::packing(), Emulation::label),
            emulation.label(),
            Emulation::listed(Emulation::packing(), Emulation::name),
        )));
    }
    Ok((emulation, placement))
}

/// DPF's attachment from the publish context, if it carries one.
pub(super) fn dpf_locator(
    context: &HashMap<String, String>,
) -> Result<Option<HostLocator>, String> {
    let Some(bdf) = context.get(DPF_PCI_ADDRESS_KEY) else {
        return Ok(None);
    };
    let nsid = context
        .get(DPF_NVME_NSID_KEY)
        .ok_or_else(|| format!("{DPF_PCI_ADDRESS_KEY} given without {DPF_NVME_NSID_KEY}"))?;
    let nsid = nsid
        .parse()
        .map_err(|_| format!("{DPF_NVME_NSID_KEY} {nsid:?} is not a namespace id"))?;
    Ok(Some(HostLocator::Nvme {
        bdf: bdf.clone(),
        nsid,
        uuid: None,
        serial: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dpf_context_gives_a_locator_or_a_clear_error() {
        let mut context = HashMap::new();
        assert_eq!(dpf_locator(&context), Ok(None));
        context.insert(DPF_PCI_ADDRESS_KEY.to_string(), "26:00.3".to_string());
        assert!(
            dpf_locator(&context)
                .unwrap_err()
                .contains(DPF_NVME_NSID_KEY)
        );
        context.insert(DPF_NVME_NSID_KEY.to_string(), "2".to_string());
        assert_eq!(
            dpf_locator(&context),
            Ok(Some(HostLocator::Nvme {
                bdf: "26:00.3".into(),
                nsid: 2,
                uuid: None,
                serial: None,
            }))
        );
    }
}
