//! Logical volumes and their stores.

use serde::{Deserialize, Serialize};

use super::method;

/// `bdev_lvol_create_lvstore`: returns the store's UUID.
#[derive(Debug, Clone, Serialize)]
pub struct BdevLvolCreateLvstore {
    pub bdev_name: String,
    pub lvs_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_sz: Option<u32>,
}
method!(BdevLvolCreateLvstore => "bdev_lvol_create_lvstore", String);

/// `bdev_lvol_get_lvstores`: all stores when both fields are `None` (then no
/// params are sent: real SPDK answers `{}` with -22).
#[derive(Debug, Clone, Default, Serialize)]
pub struct BdevLvolGetLvstores {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lvs_name: Option<String>,
}
method!(BdevLvolGetLvstores => "bdev_lvol_get_lvstores", Vec<Lvstore>);

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Lvstore {
    pub uuid: String,
    pub name: String,
    pub base_bdev: String,
    pub total_data_clusters: u64,
    pub free_clusters: u64,
    pub block_size: u32,
    pub cluster_size: u64,
}

/// `bdev_lvol_create`: returns the lvol's UUID, which is also its bdev name;
/// `<lvs_name>/<lvol_name>` is an alias. `-EEXIST` if the name is taken.
#[derive(Debug, Clone, Serialize)]
pub struct BdevLvolCreate {
    pub lvol_name: String,
    pub size_in_mib: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lvs_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thin_provision: Option<bool>,
}
method!(BdevLvolCreate => "bdev_lvol_create", String);

/// `bdev_lvol_delete`: by UUID or alias; `-ENODEV` if absent.
#[derive(Debug, Clone, Serialize)]
pub struct BdevLvolDelete {
    pub name: String,
}
method!(BdevLvolDelete => "bdev_lvol_delete", bool);

/// `bdev_lvol_resize`.
#[derive(Debug, Clone, Serialize)]
pub struct BdevLvolResize {
    pub name: String,
    pub size_in_mib: u64,
}
method!(BdevLvolResize => "bdev_lvol_resize", bool);

/// `bdev_lvol_snapshot`: a read-only lvol `<lvs>/<snapshot_name>` that takes
/// over the origin's clusters; the origin becomes its (thin) clone. Returns
/// the snapshot's UUID. An unknown origin is -19; what the blobstore refuses
/// afterwards (a taken name, a read-only origin) comes back as -32602 with
/// `strerror`'s text ("File exists", "Invalid argument").
#[derive(Debug, Clone, Serialize)]
pub struct BdevLvolSnapshot {
    /// The origin: its UUID or `<lvs>/<name>` alias.
    pub lvol_name: String,
    pub snapshot_name: String,
}
method!(BdevLvolSnapshot => "bdev_lvol_snapshot", String);

/// `bdev_lvol_clone`: a writable thin lvol `<lvs>/<clone_name>` backed by a
/// snapshot; returns its UUID. Errors as for [`BdevLvolSnapshot`]; cloning a
/// writable lvol is -32602 "Invalid argument".
#[derive(Debug, Clone, Serialize)]
pub struct BdevLvolClone {
    pub snapshot_name: String,
    pub clone_name: String,
}
method!(BdevLvolClone => "bdev_lvol_clone", String);

/// `bdev_lvol_decouple_parent`: copies the clusters the lvol reads from its
/// parent snapshot into the lvol (thin where the parent is thin); its parent
/// becomes the parent's parent. An lvol without a parent is -32602.
#[derive(Debug, Clone, Serialize)]
pub struct BdevLvolDecoupleParent {
    pub name: String,
}
method!(BdevLvolDecoupleParent => "bdev_lvol_decouple_parent", bool);

/// `driver_specific.lvol` of an lvol bdev in `bdev_get_bdevs`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct LvolDetails {
    pub lvol_store_uuid: String,
    #[serde(default)]
    pub base_bdev: Option<String>,
    #[serde(default)]
    pub thin_provision: bool,
    #[serde(default)]
    pub num_allocated_clusters: Option<u64>,
    /// Read-only, made by `bdev_lvol_snapshot`.
    #[serde(default)]
    pub snapshot: bool,
    /// Backed by a snapshot.
    #[serde(default)]
    pub clone: bool,
    /// A clone's parent snapshot (its lvol name, without the store).
    #[serde(default)]
    pub base_snapshot: Option<String>,
    /// A snapshot's clones (lvol names), when it has any.
    #[serde(default)]
    pub clones: Vec<String>,
}
