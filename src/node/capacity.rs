//! NodeGetInfo's `max_volumes_per_node`: the one number a scheduler has for
//! this node, so it must never promise more than the node can stage.
//!
//! CSI has one number per node, not one per StorageClass, so it counts the
//! capacity of the node's default emulation under the node's default
//! placement: dedicated, one volume per function of that emulation; packed
//! (NVMe), the NVMe functions times the namespaces a pool controller
//! carries, which SNAP bounds (a pool's `nn`/`mnan` as SNAP lists it; the
//! host's NVMe driver sets no lower limit). A cluster whose volumes all use
//! the default is therefore never over-committed. Counting every function of
//! both emulations (as this once did) promised a node with 17 NVMe and 17
//! virtio-blk functions 34 NVMe volumes. A node that mixes emulations or
//! placements needs `--max-volumes-per-node`, which overrides the count.
//!
//! virtio-fs functions do not exist until a stage hot-plugs one, so there
//! is nothing to count: the bound is the BlueField's emulated PCIe switch,
//! which hot-plugs at most `PCI_SWITCH_EMULATION_NUM_PORT - 1` = 31 PFs
//! (DOCA SNAP's firmware configuration; one port is the static PFs'). That
//! is the most a node can stage; hot-plugged NVMe functions share those
//! ports, so a node mixing them needs the flag too.

use super::config::{NodeConfig, PlacementSetting};
use crate::dpu::Inventory;

/// The most PFs a BlueField hot-plugs (its emulated switch's ports less one).
const HOT_PLUGGED_FUNCTIONS: i64 = 31;

/// The limit to report for `config` on the DPU `inventory` describes.
pub(super) fn max_volumes(config: &NodeConfig, inventory: &Inventory) -> i64 {
    if config.emulation.function_kind().is_none() {
        return HOT_PLUGGED_FUNCTIONS;
    }
    let functions = inventory
        .functions
        .iter()
        .filter(|f| f.emulation == config.emulation)
        .count() as u64;
    let per_function = match config.placement {
        PlacementSetting::Packed if config.emulation.packs() => inventory
            .pools
            .iter()
            .map(|p| p.capacity)
            .fold(config.namespaces_per_controller, u32::min),
        _ => 1,
    };
    i64::try_from(functions.saturating_mul(u64::from(per_function))).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dpu::{Emulation, FunctionUse, PoolUse};

    fn inventory(nvme: usize, virtio: usize, pools: &[u32]) -> Inventory {
        let function = |emulation, i| FunctionUse {
            emulation,
            bdf: format!("26:00.{i}"),
            controller: None,
            volume_key: None,
            pool: None,
        };
        Inventory {
            functions: (0..nvme)
                .map(|i| function(Emulation::Nvme, i))
                .chain((0..virtio).map(|i| function(Emulation::VirtioBlk, i)))
                .collect(),
            volumes: vec![],
            pools: pools
                .iter()
                .enumerate()
                .map(|(k, capacity)| PoolUse {
                    nqn: format!("nqn.2022-10.io.snap-csi:pool-{k}"),
                    namespaces: 0,
                    capacity: *capacity,
                    bdf: None,
                })
                .collect(),
        }
    }

    #[test]
    fn counts_the_default_emulation_under_the_default_placement() {
        let mut config = NodeConfig::default();
        // The node that over-committed: 17 NVMe and 17 virtio-blk functions.
        let seen = inventory(17, 17, &[]);
        assert_eq!(max_volumes(&config, &seen), 17);
        config.emulation = Emulation::VirtioBlk;
        assert_eq!(max_volumes(&config, &seen), 17);
        config.placement = PlacementSetting::Packed;
        assert_eq!(
            max_volumes(&config, &seen),
            17,
            "virtio-blk is never packed"
        );

        config.emulation = Emulation::Nvme;
        config.namespaces_per_controller = 32;
        assert_eq!(max_volumes(&config, &seen), 17 * 32);
        assert_eq!(
            max_volumes(&config, &inventory(17, 17, &[1024, 16])),
            17 * 16,
            "a pool SNAP lets carry fewer bounds the count"
        );

        config.emulation = Emulation::VirtioFs;
        config.placement = PlacementSetting::Dedicated;
        assert_eq!(
            max_volumes(&config, &seen),
            31,
            "virtio-fs: the hot-plug ports, whatever functions exist now"
        );
    }
}
