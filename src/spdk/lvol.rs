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
