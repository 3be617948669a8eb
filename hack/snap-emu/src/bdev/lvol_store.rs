//! An lvol store and its lvols as the blobstore's metadata holds them
//! (saved by `lvol_disk`), and what follows from it: cluster accounting,
//! names, the bdev each lvol registers as, and `bdev_lvol_get_lvstores`'
//! entry. The methods that change stores are `lvol`'s.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use uuid::Uuid;

use super::lvol_disk::{self, lvol_file, store_dir};
use super::registry::{Bdev, BdevKind};
use crate::rpc::{EEXIST, EINVAL, RpcError};

const MIB: u64 = 1 << 20;
pub(super) const BS_PAGE_SIZE: u64 = 4096;
pub(super) const DEFAULT_CLUSTER_SIZE: u64 = 4 * MIB;
/// SPDK_LVS_NAME_MAX / SPDK_LVOL_NAME_MAX include the terminating NUL.
pub(super) const NAME_MAX: usize = 63;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Lvol {
    pub uuid: Uuid,
    pub name: String,
    pub thin: bool,
    pub num_clusters: u64,
    /// Kept with its store, named by its UUID.
    #[serde(skip)]
    pub file: PathBuf,
    /// The snapshot this lvol reads through (it is a clone of it).
    pub parent: Option<Uuid>,
    /// A snapshot.
    pub read_only: bool,
}

/// What `lvol_disk` saves of it is what the blobstore's metadata holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LvolStore {
    pub uuid: Uuid,
    pub name: String,
    /// Real name of the claimed base bdev.
    #[serde(skip)]
    pub base_bdev: String,
    pub cluster_size: u64,
    /// The blobstore's io unit: the base bdev's block size.
    pub block_size: u32,
    pub total_data_clusters: u64,
    #[serde(skip)]
    pub dir: PathBuf,
    pub lvols: Vec<Lvol>,
}

impl LvolStore {
    pub(super) fn allocated_clusters(&self, lvol: &Lvol) -> u64 {
        if !lvol.thin {
            return lvol.num_clusters;
        }
        // A thin lvol owns the clusters it has written; the file's allocated
        // blocks are the closest thing we have to the blobstore's cluster map.
        // A clone's file starts as a copy of its parent's, whose clusters are
        // the parent's, not the clone's.
        let inherited = lvol
            .parent
            .and_then(|p| self.lvols.iter().find(|l| l.uuid == p))
            .map_or(0, |p| file_bytes(&p.file));
        let used = file_bytes(&lvol.file).saturating_sub(inherited);
        used.div_ceil(self.cluster_size).min(lvol.num_clusters)
    }

    pub(super) fn clone_count(&self, uuid: Uuid) -> usize {
        self.lvols.iter().filter(|l| l.parent == Some(uuid)).count()
    }

    pub(super) fn name_of(&self, uuid: Uuid) -> Option<&str> {
        self.lvols
            .iter()
            .find(|l| l.uuid == uuid)
            .map(|l| l.name.as_str())
    }

    /// `lvs_verify_lvol_name`, whose refusal reaches the caller through the
    /// operation's callback (-32602 with `strerror`'s text).
    pub(super) fn verify_new_name(&self, name: Option<&str>) -> Result<String, RpcError> {
        match name {
            None | Some("") => Err(callback_error(EINVAL)),
            Some(n) if n.len() > NAME_MAX => Err(callback_error(EINVAL)),
            Some(n) if self.lvols.iter().any(|l| l.name == n) => Err(callback_error(EEXIST)),
            Some(n) => Ok(n.to_string()),
        }
    }

    /// Clusters an lvol of `size_in_mib` takes: lvols grow in whole clusters.
    pub(super) fn clusters_for(&self, size_in_mib: u64) -> Result<u64, RpcError> {
        let size = size_in_mib
            .checked_mul(MIB)
            .ok_or(RpcError::errno(EINVAL))?;
        Ok(size.div_ceil(self.cluster_size))
    }

    pub(super) fn cluster_bytes(&self, clusters: u64) -> Result<u64, RpcError> {
        clusters
            .checked_mul(self.cluster_size)
            .ok_or(RpcError::errno(EINVAL))
    }

    pub fn free_clusters(&self) -> u64 {
        let used: u64 = self.lvols.iter().map(|l| self.allocated_clusters(l)).sum();
        self.total_data_clusters.saturating_sub(used)
    }

    /// Store `uuid` as last saved, found on base `base`.
    pub(super) fn load(
        stores_dir: &std::path::Path,
        uuid: Uuid,
        base: &str,
    ) -> std::io::Result<Self> {
        let dir = store_dir(stores_dir, uuid);
        let mut store: LvolStore = lvol_disk::load(&dir)?;
        if store.uuid != uuid {
            return Err(std::io::Error::other(format!(
                "{} holds store {}",
                dir.display(),
                store.uuid
            )));
        }
        for lvol in &mut store.lvols {
            lvol.file = lvol_file(&dir, lvol.uuid);
        }
        store.dir = dir;
        store.base_bdev = base.to_owned();
        Ok(store)
    }

    pub(super) fn save(&self) -> std::io::Result<()> {
        lvol_disk::save(&self.dir, self)
    }

    /// The bdev `lvol` of this store registers as.
    pub(super) fn bdev(&self, lvol: &Lvol) -> Result<Bdev, RpcError> {
        let bytes = self.cluster_bytes(lvol.num_clusters)?;
        Ok(Bdev {
            name: lvol.uuid.to_string(),
            aliases: vec![format!("{}/{}", self.name, lvol.name)],
            uuid: lvol.uuid,
            product_name: "Logical Volume",
            block_size: self.block_size,
            num_blocks: bytes / u64::from(self.block_size),
            claim: None,
            io: Default::default(),
            kind: BdevKind::Lvol {
                lvs_uuid: self.uuid,
                base: self.base_bdev.clone(),
                file: lvol.file.clone(),
                read_only: lvol.read_only,
            },
        })
    }

    pub(super) fn json(&self) -> Value {
        json!({
            "uuid": self.uuid.to_string(),
            "name": self.name,
            "base_bdev": self.base_bdev,
            "total_data_clusters": self.total_data_clusters,
            "free_clusters": self.free_clusters(),
            "block_size": self.block_size,
            "cluster_size": self.cluster_size
        })
    }
}

/// Bytes a file really occupies.
fn file_bytes(path: &std::path::Path) -> u64 {
    std::fs::metadata(path)
        .map(|m| std::os::unix::fs::MetadataExt::blocks(&m).saturating_mul(512))
        .unwrap_or(0)
}

/// How the lvol RPCs' completion callbacks report a failure:
/// `SPDK_JSONRPC_ERROR_INVALID_PARAMS` with `strerror`'s text.
pub(super) fn callback_error(errno: i32) -> RpcError {
    RpcError::invalid_params_msg(crate::rpc::strerror(errno))
}
