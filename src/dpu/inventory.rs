//! The [`Inventory`]: what every exposure's [`Census`] found, joined with
//! `emulation_function_list` into what each function carries. Every census
//! reads at once, sharing the function listing, so it takes one round trip.

use std::collections::HashMap;

use futures::FutureExt;
use futures::future::try_join_all;
use tokio::time::Instant;

use super::attach::{FunctionUse, Inventory};
use super::emulation::Emulation;
use super::endpoint::SnapEndpoint;
use super::error::DpuError;
use super::exposure::{Census, ControllerUse, Survey};
use super::exposures::Exposures;
use super::functions::FunctionListing;

pub(crate) async fn read(
    snap: &SnapEndpoint,
    exposures: &Exposures,
    deadline: Instant,
) -> Result<Inventory, DpuError> {
    let survey = Survey {
        snap,
        functions: snap.list_functions_fresh(deadline).boxed().shared(),
        began: Instant::now(),
        deadline,
    };
    let (functions, censuses) = tokio::join!(
        survey.functions(),
        try_join_all(exposures.all().map(|e| e.census(&survey))),
    );
    Ok(join(&*functions?, censuses?))
}

/// Each listed function with what its controller carries, then what each
/// census adds.
fn join(listing: &FunctionListing, censuses: Vec<Census>) -> Inventory {
    let uses: HashMap<(Emulation, &str), &ControllerUse> = censuses
        .iter()
        .flat_map(|c| &c.controllers)
        .map(|u| ((u.emulation, u.controller.as_str()), u))
        .collect();
    let functions = listing
        .iter()
        .map(|f| {
            let emulation = Emulation::from(f.emulation_type);
            let used = f.ctrl_id.as_deref().and_then(|c| uses.get(&(emulation, c)));
            FunctionUse {
                emulation,
                volume_key: used.and_then(|u| u.volume_key.clone()),
                pool: used.and_then(|u| u.pool.clone()),
                bdf: f.pci_bdf,
                controller: f.ctrl_id,
            }
        })
        .collect();
    let mut inventory = Inventory {
        functions,
        ..Inventory::default()
    };
    for census in censuses {
        inventory.functions.extend(census.functions);
        inventory.volumes.extend(census.volumes);
        inventory.pools.extend(census.pools);
    }
    inventory
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dpu::attach::ExposedVolume;
    use crate::dpu::names::VolumeNames;
    use crate::dpu::{nvme, packed, virtio};
    use crate::spdk::snap::{NvmeSubsystem, VirtioBlkController};

    /// What `read` joins, from the listings each census reads.
    fn inventory(
        functions: &FunctionListing,
        subsystems: &[NvmeSubsystem],
        controllers: &[VirtioBlkController],
    ) -> Inventory {
        join(
            functions,
            vec![
                nvme::census(functions, subsystems),
                packed::census(functions, subsystems),
                virtio::census(functions, controllers),
            ],
        )
    }

    fn from_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn functions_name_the_volume_they_carry_and_foreign_objects_are_not_ours() {
        let a = VolumeNames::new("pvc-a");
        let b = VolumeNames::new("pvc-b");
        let listing = FunctionListing {
            functions: from_json(serde_json::json!([
                {"emulation_type": "NVME", "pci_bdf": "26:00.2", "vhca_id": 2, "vuid": "n0",
                 "ctrl_id": "NVMeCtrl1", "vfs": [
                    {"pci_bdf": "26:00.3", "vhca_id": 3, "vuid": "n1", "ctrl_id": "NVMeCtrl2"},
                    {"pci_bdf": "26:00.4", "vhca_id": 4, "vuid": "n2"}]},
                {"emulation_type": "VBLK", "pci_bdf": "27:00.2", "vhca_id": 7, "vuid": "v0",
                 "ctrl_id": "VblkCtrl1"}
            ])),
            asked_at: Instant::now(),
        };
        let subsystems: Vec<NvmeSubsystem> = from_json(serde_json::json!([
            {"nqn": a.nqn, "controllers": [{"ctrl_id": "NVMeCtrl1", "vhca_id": 2}],
             "namespaces": [{"nsid": 1, "bdev": "dev-a"}]},
            {"nqn": "nqn.2016-06.io.spdk:someone-else",
             "controllers": [{"ctrl_id": "NVMeCtrl2", "vhca_id": 3}]}
        ]));
        let controllers: Vec<VirtioBlkController> = from_json(serde_json::json!([
            {"ctrl_id": "VblkCtrl1", "vhca_id": 7, "bdev": "dev-b", "vblk_id": b.serial}
        ]));

        let inventory = inventory(&listing, &subsystems, &controllers);
        let carried: Vec<(&str, Option<&str>)> = inventory
            .functions
            .iter()
            .map(|f| (f.bdf.as_str(), f.volume_key.as_deref()))
            .collect();
        assert_eq!(
            carried,
            [
                ("26:00.2", Some(a.nqn.as_str())),
                ("26:00.3", None),
                ("26:00.4", None),
                ("27:00.2", Some(b.serial.as_str())),
            ]
        );
        assert_eq!(
            inventory.functions[1].controller.as_deref(),
            Some("NVMeCtrl2")
        );
        assert_eq!(
            inventory.volumes,
            [
                ExposedVolume {
                    key: a.nqn.clone(),
                    emulation: Emulation::Nvme,
                    device_names: vec!["dev-a".into()],
                    bdf: Some("26:00.2".into()),
                },
                ExposedVolume {
                    key: b.serial.clone(),
                    emulation: Emulation::VirtioBlk,
                    device_names: vec!["dev-b".into()],
                    bdf: Some("27:00.2".into()),
                },
            ]
        );
        assert!(inventory.pools.is_empty());
    }

    #[test]
    fn a_pools_function_is_the_pools_and_its_namespaces_are_packed_volumes() {
        let (c, d) = (VolumeNames::new("pvc-c"), VolumeNames::new("pvc-d"));
        let pool = crate::dpu::names::pool_nqn(0);
        let listing = FunctionListing {
            functions: from_json(serde_json::json!([
                {"emulation_type": "NVME", "pci_bdf": "26:00.2", "vhca_id": 2, "vuid": "n0",
                 "ctrl_id": "NVMeCtrl1", "vfs": [
                    {"pci_bdf": "26:00.3", "vhca_id": 3, "vuid": "n1", "ctrl_id": "NVMeCtrl2"}]}
            ])),
            asked_at: Instant::now(),
        };
        let subsystems: Vec<NvmeSubsystem> = from_json(serde_json::json!([
            {"nqn": pool, "nn": 32, "mnan": 16,
             "controllers": [{"ctrl_id": "NVMeCtrl1", "vhca_id": 2}],
             "namespaces": [{"nsid": 1, "bdev": "dev-c", "uuid": c.namespace_uuid},
                            {"nsid": 2, "bdev": "dev-d", "uuid": d.namespace_uuid.to_uppercase()}]},
            {"nqn": crate::dpu::names::pool_nqn(1), "controllers": [], "namespaces": []}
        ]));

        let inventory = inventory(&listing, &subsystems, &[]);
        let uses: Vec<(Option<&str>, Option<&str>)> = inventory
            .functions
            .iter()
            .map(|f| (f.pool.as_deref(), f.volume_key.as_deref()))
            .collect();
        assert_eq!(uses, [(Some(pool.as_str()), None), (None, None)]);
        let keys: Vec<(&str, Option<&str>)> = inventory
            .volumes
            .iter()
            .map(|v| (v.key.as_str(), v.bdf.as_deref()))
            .collect();
        assert_eq!(
            keys,
            [
                (c.namespace_uuid.as_str(), Some("26:00.2")),
                (d.namespace_uuid.as_str(), Some("26:00.2")),
            ]
        );
        let pools: Vec<(u32, u32, Option<&str>)> = inventory
            .pools
            .iter()
            .map(|p| (p.namespaces, p.capacity, p.bdf.as_deref()))
            .collect();
        assert_eq!(pools, [(2, 16, Some("26:00.2")), (0, u32::MAX, None)]);
    }
}
