//! The [`Inventory`]: SNAP's three listings (functions, NVMe subsystems,
//! virtio-blk controllers) joined into what each function carries, which of
//! our volumes SNAP exposes (a packed one by its namespace UUID, in whichever
//! pool it is) and the pools, with every exposure's own [`Census`] (an
//! emulation with functions and listings of its own, virtio-fs). Read
//! together, in one round trip.

use std::collections::HashMap;

use tokio::time::Instant;

use futures::future::try_join_all;

use super::endpoint::SnapEndpoint;
use super::exposure::{Census, Exposures};
use super::functions::FunctionListing;
use super::names::{is_our_nqn, is_our_serial};
use super::{DpuError, Emulation, ExposedVolume, FunctionUse, Inventory, PoolUse, packed, virtio};
use crate::spdk::snap::{
    EmulationType, NvmeSubsystem, NvmeSubsystemList, VirtioBlkController, VirtioBlkControllerList,
};

pub(crate) async fn read(
    snap: &SnapEndpoint,
    exposures: &Exposures,
    deadline: Instant,
) -> Result<Inventory, DpuError> {
    let (functions, subsystems, controllers, censuses) = tokio::join!(
        snap.list_functions_fresh(deadline),
        snap.call(&NvmeSubsystemList {}, deadline),
        snap.call(&VirtioBlkControllerList {}, deadline),
        try_join_all(exposures.all().map(|e| e.census(snap, deadline))),
    );
    let subsystems = subsystems.map_err(|e| snap.error("listing NVMe subsystems", e))?;
    let controllers = controllers.map_err(|e| snap.error("listing virtio-blk controllers", e))?;
    let mut inventory = join(&*functions?, &subsystems, &controllers);
    for Census {
        functions,
        volumes,
        pools,
    } in censuses?
    {
        inventory.functions.extend(functions);
        inventory.volumes.extend(volumes);
        inventory.pools.extend(pools);
    }
    Ok(inventory)
}

fn join(
    listing: &FunctionListing,
    subsystems: &[NvmeSubsystem],
    controllers: &[VirtioBlkController],
) -> Inventory {
    // Controller id -> the key of our volume it serves.
    let mut ours: HashMap<(EmulationType, &str), &str> = HashMap::new();
    // Controller id -> the pool it serves.
    let mut pool_of: HashMap<&str, &str> = HashMap::new();
    for subsystem in subsystems {
        let into = if is_our_nqn(&subsystem.nqn) {
            &mut ours
        } else if packed::pool_capacity(subsystem).is_some() {
            for controller in &subsystem.controllers {
                pool_of.insert(controller.ctrl_id.as_str(), &subsystem.nqn);
            }
            continue;
        } else {
            continue;
        };
        for controller in &subsystem.controllers {
            into.insert(
                (EmulationType::Nvme, controller.ctrl_id.as_str()),
                &subsystem.nqn,
            );
        }
    }
    for controller in controllers {
        if let Some(serial) = controller.vblk_id.as_deref().filter(|s| is_our_serial(s)) {
            ours.insert(
                (EmulationType::VirtioBlk, controller.ctrl_id.as_str()),
                serial,
            );
        }
    }

    let functions = listing
        .iter()
        .map(|f| FunctionUse {
            emulation: Emulation::from(f.emulation_type),
            volume_key: f
                .ctrl_id
                .as_deref()
                .and_then(|c| ours.get(&(f.emulation_type, c)))
                .map(|key| key.to_string()),
            pool: f
                .ctrl_id
                .as_deref()
                .filter(|_| f.emulation_type == EmulationType::Nvme)
                .and_then(|c| pool_of.get(c))
                .map(|nqn| nqn.to_string()),
            bdf: f.pci_bdf,
            controller: f.ctrl_id,
        })
        .collect();
    let first_bdf = |s: &NvmeSubsystem| {
        s.controllers
            .first()
            .and_then(|c| listing.bdf_of(Emulation::Nvme, &c.ctrl_id, c.vhca_id))
    };
    let pooled: Vec<(&NvmeSubsystem, u32)> = subsystems
        .iter()
        .filter_map(|s| Some((s, packed::pool_capacity(s)?)))
        .collect();
    let pools = pooled
        .iter()
        .map(|(s, capacity)| PoolUse {
            nqn: s.nqn.clone(),
            namespaces: u32::try_from(s.namespaces.len()).unwrap_or(u32::MAX),
            capacity: *capacity,
            bdf: first_bdf(s),
        })
        .collect();
    // A packed volume is the namespace carrying its UUID; namespaces
    // without one are not ours.
    let packed_volumes = pooled.iter().flat_map(|(s, _)| {
        s.namespaces.iter().filter_map(|n| {
            Some(ExposedVolume {
                key: n.uuid.clone()?.to_ascii_lowercase(),
                emulation: Emulation::Nvme,
                device_names: vec![n.bdev.clone()],
                bdf: first_bdf(s),
            })
        })
    });

    let nvme = subsystems
        .iter()
        .filter(|s| is_our_nqn(&s.nqn))
        .map(|s| ExposedVolume {
            key: s.nqn.clone(),
            emulation: Emulation::Nvme,
            device_names: s.namespaces.iter().map(|n| n.bdev.clone()).collect(),
            bdf: first_bdf(s),
        });
    let virtio_blk = controllers.iter().filter_map(|c| {
        let serial = c.vblk_id.as_deref().filter(|s| is_our_serial(s))?;
        Some(ExposedVolume {
            key: serial.to_string(),
            emulation: Emulation::VirtioBlk,
            device_names: virtio::bdev_of(c).map(str::to_string).into_iter().collect(),
            bdf: c
                .pci_bdf
                .clone()
                .or_else(|| listing.bdf_of(Emulation::VirtioBlk, &c.ctrl_id, c.vhca_id)),
        })
    });
    Inventory {
        functions,
        volumes: nvme.chain(packed_volumes).chain(virtio_blk).collect(),
        pools,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dpu::names::VolumeNames;

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

        let inventory = join(&listing, &subsystems, &controllers);
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

        let inventory = join(&listing, &subsystems, &[]);
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
