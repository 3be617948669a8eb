//! Logical volume stores and logical volumes (`bdev_lvol_*`).
//!
//! Lvols are files of their store: a store claims its base bdev and keeps its
//! lvols as sparse files under `<state>/bdevs/lvs-<uuid>/`, not inside the base
//! bdev's bytes. Cluster accounting follows the blobstore (4 MiB clusters by
//! default, metadata taking the first clusters), with a thin lvol's allocated
//! clusters estimated from the blocks its file really occupies. A store is
//! therefore not found again when its base bdev is re-created: a restarted
//! emulator starts empty, as documented.

use std::path::PathBuf;

use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::bdev::{Bdev, BdevKind};
use crate::rpc::{
    EEXIST, EINVAL, ENODEV, ENOSPC, EPERM, OnDecodeError, RpcError, RpcResult, decode, decode_opt,
};
use crate::state::Emulator;

const MIB: u64 = 1 << 20;
const BS_PAGE_SIZE: u64 = 4096;
const DEFAULT_CLUSTER_SIZE: u64 = 4 * MIB;
/// SPDK_LVS_NAME_MAX / SPDK_LVOL_NAME_MAX include the terminating NUL.
const NAME_MAX: usize = 63;

#[derive(Debug, Clone)]
pub(crate) struct Lvol {
    pub uuid: Uuid,
    pub name: String,
    pub thin: bool,
    pub num_clusters: u64,
    pub file: PathBuf,
}

#[derive(Debug, Clone)]
pub(crate) struct LvolStore {
    pub uuid: Uuid,
    pub name: String,
    /// Real name of the claimed base bdev.
    pub base_bdev: String,
    pub cluster_size: u64,
    /// The blobstore's io unit: the base bdev's block size.
    pub block_size: u32,
    pub total_data_clusters: u64,
    pub dir: PathBuf,
    pub lvols: Vec<Lvol>,
}

impl LvolStore {
    fn allocated_clusters(&self, lvol: &Lvol) -> u64 {
        if !lvol.thin {
            return lvol.num_clusters;
        }
        // A thin lvol owns the clusters it has written; the file's allocated
        // blocks are the closest thing we have to the blobstore's cluster map.
        let used = std::fs::metadata(&lvol.file)
            .map(|m| std::os::unix::fs::MetadataExt::blocks(&m).saturating_mul(512))
            .unwrap_or(0);
        used.div_ceil(self.cluster_size).min(lvol.num_clusters)
    }

    /// Clusters an lvol of `size_in_mib` takes: lvols grow in whole clusters.
    fn clusters_for(&self, size_in_mib: u64) -> Result<u64, RpcError> {
        let size = size_in_mib
            .checked_mul(MIB)
            .ok_or(RpcError::errno(EINVAL))?;
        Ok(size.div_ceil(self.cluster_size))
    }

    fn cluster_bytes(&self, clusters: u64) -> Result<u64, RpcError> {
        clusters
            .checked_mul(self.cluster_size)
            .ok_or(RpcError::errno(EINVAL))
    }

    pub fn free_clusters(&self) -> u64 {
        let used: u64 = self.lvols.iter().map(|l| self.allocated_clusters(l)).sum();
        self.total_data_clusters.saturating_sub(used)
    }

    fn json(&self) -> Value {
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

/// Clusters the blobstore keeps for its metadata: super block, the three masks
/// and one metadata page per cluster (num_md_pages_per_cluster_ratio = 100).
fn md_clusters(num_clusters: u64, cluster_size: u64, md_ratio: u64) -> u64 {
    let md_pages = num_clusters.saturating_mul(md_ratio) / 100;
    let mask_pages = |bits: u64| (8 + bits.div_ceil(8)).div_ceil(BS_PAGE_SIZE);
    let pages = 1 + 2 * mask_pages(md_pages) + mask_pages(num_clusters) + md_pages;
    pages.saturating_mul(BS_PAGE_SIZE).div_ceil(cluster_size)
}

fn check_clear_method(m: &Option<String>) -> Result<(), RpcError> {
    match m.as_deref() {
        None => Ok(()),
        Some(s) if ["none", "unmap", "write_zeroes"].contains(&s.to_ascii_lowercase().as_str()) => {
            Ok(())
        }
        Some(_) => Err(RpcError::new(-EINVAL, "Invalid clear_method parameter")),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // md_page_size is accepted; the metadata layout is only accounted.
struct CreateLvstoreParams {
    bdev_name: String,
    lvs_name: String,
    cluster_sz: Option<u32>,
    clear_method: Option<String>,
    num_md_pages_per_cluster_ratio: Option<u32>,
    md_page_size: Option<u32>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct LvsSelector {
    uuid: Option<String>,
    lvs_name: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct GetLvolsParams {
    lvs_uuid: Option<String>,
    lvs_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateLvolParams {
    lvol_name: String,
    size_in_mib: u64,
    #[serde(default)]
    thin_provision: bool,
    uuid: Option<String>,
    lvs_name: Option<String>,
    clear_method: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NameParams {
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResizeParams {
    name: String,
    size_in_mib: u64,
}

impl Emulator {
    /// `vbdev_get_lvol_store_by_uuid_xor_name`: exactly one selector, else -EINVAL.
    fn lvs_index(&self, uuid: Option<&str>, name: Option<&str>) -> Result<usize, RpcError> {
        let found = match (uuid, name) {
            (Some(u), None) => self.lvstores.iter().position(|s| s.uuid.to_string() == u),
            (None, Some(n)) => self.lvstores.iter().position(|s| s.name == n),
            _ => return Err(RpcError::errno(EINVAL)),
        };
        found.ok_or(RpcError::errno(ENODEV))
    }

    pub(crate) fn bdev_lvol_create_lvstore(&mut self, params: Option<Value>) -> RpcResult {
        let p: CreateLvstoreParams = decode(params, OnDecodeError::DecodeFailed)?;
        check_clear_method(&p.clear_method)?;
        if p.lvs_name.is_empty() || p.lvs_name.len() > NAME_MAX {
            return Err(RpcError::errno(EINVAL));
        }
        let base = self
            .bdevs
            .get(&p.bdev_name)
            .ok_or(RpcError::errno(ENODEV))?;
        if self.lvstores.iter().any(|s| s.name == p.lvs_name) {
            return Err(RpcError::errno(EEXIST));
        }
        if base.claim.is_some() || self.bdev_has_writers(&base.name) {
            return Err(RpcError::errno(EPERM));
        }
        let cluster_size = p.cluster_sz.map_or(DEFAULT_CLUSTER_SIZE, u64::from);
        let block_size = base.block_size;
        if cluster_size < BS_PAGE_SIZE
            || !cluster_size.is_multiple_of(BS_PAGE_SIZE)
            || !cluster_size.is_multiple_of(u64::from(block_size))
        {
            return Err(RpcError::errno(EINVAL));
        }
        let ratio = p.num_md_pages_per_cluster_ratio.map_or(100, u64::from);
        let num_clusters = base.size_bytes() / cluster_size;
        let md = md_clusters(num_clusters, cluster_size, ratio.max(1));
        if num_clusters <= md {
            return Err(RpcError::errno(ENOSPC));
        }
        let uuid = Uuid::new_v4();
        let dir = self.files_dir.join(format!("lvs-{uuid}"));
        std::fs::create_dir_all(&dir).map_err(|e| crate::bdev::io_error(&e))?;
        let base_name = base.name.clone();
        if let Some(b) = self.bdevs.get_mut(&base_name) {
            b.claim = Some("lvol");
        }
        self.lvstores.push(LvolStore {
            uuid,
            name: p.lvs_name,
            base_bdev: base_name,
            cluster_size,
            block_size,
            total_data_clusters: num_clusters - md,
            dir,
            lvols: vec![],
        });
        Ok(json!(uuid.to_string()))
    }

    pub(crate) fn bdev_lvol_get_lvstores(&self, params: Option<Value>) -> RpcResult {
        if params.is_none() {
            return Ok(Value::Array(
                self.lvstores.iter().map(|s| s.json()).collect(),
            ));
        }
        let p: LvsSelector = decode(params, OnDecodeError::DecodeFailed)?;
        let i = self.lvs_index(p.uuid.as_deref(), p.lvs_name.as_deref())?;
        Ok(json!([self.lvstores[i].json()]))
    }

    pub(crate) fn bdev_lvol_delete_lvstore(&mut self, params: Option<Value>) -> RpcResult {
        let p: LvsSelector = decode(params, OnDecodeError::DecodeFailed)?;
        let i = self.lvs_index(p.uuid.as_deref(), p.lvs_name.as_deref())?;
        let uuid = self.lvstores[i].uuid;
        self.destroy_lvstore(uuid);
        Ok(json!(true))
    }

    /// Unregisters every lvol of the store (with their consumers), releases the
    /// base bdev and removes the store's files.
    pub(crate) fn destroy_lvstore(&mut self, uuid: Uuid) {
        let Some(i) = self.lvstores.iter().position(|s| s.uuid == uuid) else {
            return;
        };
        let lvols: Vec<String> = self.lvstores[i]
            .lvols
            .iter()
            .map(|l| l.uuid.to_string())
            .collect();
        for name in lvols {
            self.unregister_bdev(&name);
        }
        let Some(i) = self.lvstores.iter().position(|s| s.uuid == uuid) else {
            return;
        };
        let store = self.lvstores.remove(i);
        if let Some(b) = self.bdevs.get_mut(&store.base_bdev) {
            b.claim = None;
        }
        let _ = std::fs::remove_dir_all(&store.dir);
    }

    pub(crate) fn bdev_lvol_get_lvols(&self, params: Option<Value>) -> RpcResult {
        let p: GetLvolsParams = decode_opt(params, OnDecodeError::DecodeFailed)?;
        let stores: Vec<&LvolStore> = if p.lvs_uuid.is_none() && p.lvs_name.is_none() {
            self.lvstores.iter().collect()
        } else {
            let i = self.lvs_index(p.lvs_uuid.as_deref(), p.lvs_name.as_deref())?;
            vec![&self.lvstores[i]]
        };
        let mut out = vec![];
        for s in stores {
            for l in &s.lvols {
                out.push(json!({
                    "alias": format!("{}/{}", s.name, l.name),
                    "uuid": l.uuid.to_string(),
                    "name": l.name,
                    "is_thin_provisioned": l.thin,
                    "is_snapshot": false,
                    "is_clone": false,
                    "is_esnap_clone": false,
                    "is_degraded": false,
                    "lvs": {"name": s.name, "uuid": s.uuid.to_string()}
                }));
            }
        }
        Ok(Value::Array(out))
    }

    pub(crate) fn bdev_lvol_create(&mut self, params: Option<Value>) -> RpcResult {
        let p: CreateLvolParams = decode(params, OnDecodeError::DecodeFailed)?;
        let i = self.lvs_index(p.uuid.as_deref(), p.lvs_name.as_deref())?;
        check_clear_method(&p.clear_method)?;
        if p.lvol_name.is_empty() || p.lvol_name.len() > NAME_MAX {
            return Err(RpcError::errno(EINVAL));
        }
        let store = &self.lvstores[i];
        if store.lvols.iter().any(|l| l.name == p.lvol_name) {
            return Err(RpcError::errno(EEXIST));
        }
        let num_clusters = store.clusters_for(p.size_in_mib)?;
        if !p.thin_provision && num_clusters > store.free_clusters() {
            return Err(RpcError::errno(ENOSPC));
        }
        let alias = format!("{}/{}", store.name, p.lvol_name);
        let uuid = Uuid::new_v4();
        let file = store.dir.join(format!("{uuid}.img"));
        let bytes = store.cluster_bytes(num_clusters)?;
        let bdev = Bdev {
            name: uuid.to_string(),
            aliases: vec![alias],
            uuid,
            product_name: "Logical Volume",
            block_size: store.block_size,
            num_blocks: bytes / u64::from(store.block_size),
            claim: None,
            kind: BdevKind::Lvol {
                lvs_uuid: store.uuid,
                file: file.clone(),
            },
        };
        self.register_with_file(bdev, &file, bytes)?;
        self.lvstores[i].lvols.push(Lvol {
            uuid,
            name: p.lvol_name,
            thin: p.thin_provision,
            num_clusters,
            file,
        });
        Ok(json!(uuid.to_string()))
    }

    fn lvol_bdev(&self, name: &str) -> Result<(usize, usize), RpcError> {
        let bdev = self.bdevs.get(name).ok_or(RpcError::errno(ENODEV))?;
        let BdevKind::Lvol { lvs_uuid, .. } = bdev.kind else {
            return Err(RpcError::errno(ENODEV));
        };
        let si = self
            .lvstores
            .iter()
            .position(|s| s.uuid == lvs_uuid)
            .ok_or(RpcError::errno(ENODEV))?;
        let li = self.lvstores[si]
            .lvols
            .iter()
            .position(|l| l.uuid == bdev.uuid)
            .ok_or(RpcError::errno(ENODEV))?;
        Ok((si, li))
    }

    pub(crate) fn bdev_lvol_delete(&mut self, params: Option<Value>) -> RpcResult {
        let p: NameParams = decode(params, OnDecodeError::DecodeFailed)?;
        let (si, li) = self.lvol_bdev(&p.name)?;
        let name = self.lvstores[si].lvols[li].uuid.to_string();
        self.unregister_bdev(&name);
        Ok(json!(true))
    }

    /// Called by `unregister_bdev` once the lvol bdev itself is gone.
    pub(crate) fn forget_lvol(&mut self, lvs_uuid: Uuid, lvol_uuid: Uuid) {
        if let Some(store) = self.lvstores.iter_mut().find(|s| s.uuid == lvs_uuid)
            && let Some(i) = store.lvols.iter().position(|l| l.uuid == lvol_uuid)
        {
            let lvol = store.lvols.remove(i);
            let _ = std::fs::remove_file(&lvol.file);
        }
    }

    pub(crate) fn bdev_lvol_resize(&mut self, params: Option<Value>) -> RpcResult {
        let p: ResizeParams = decode(params, OnDecodeError::DecodeFailed)?;
        let (si, li) = self.lvol_bdev(&p.name)?;
        let store = &self.lvstores[si];
        let lvol = &store.lvols[li];
        let num_clusters = store.clusters_for(p.size_in_mib)?;
        if !lvol.thin
            && num_clusters > lvol.num_clusters
            && num_clusters - lvol.num_clusters > store.free_clusters()
        {
            return Err(RpcError::errno(ENOSPC));
        }
        let bytes = store.cluster_bytes(num_clusters)?;
        let num_blocks = bytes / u64::from(store.block_size);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&lvol.file)
            .and_then(|f| f.set_len(bytes))
            .map_err(|e| crate::bdev::io_error(&e))?;
        let name = lvol.uuid.to_string();
        self.lvstores[si].lvols[li].num_clusters = num_clusters;
        if let Some(b) = self.bdevs.get_mut(&name) {
            b.num_blocks = num_blocks;
        }
        self.bdev_resized(&name);
        Ok(json!(true))
    }

    pub(crate) fn lvol_driver_specific(&self, bdev: &Bdev) -> Value {
        let BdevKind::Lvol { lvs_uuid, .. } = bdev.kind else {
            return json!({});
        };
        let Some(store) = self.lvstores.iter().find(|s| s.uuid == lvs_uuid) else {
            return json!({});
        };
        let Some(lvol) = store.lvols.iter().find(|l| l.uuid == bdev.uuid) else {
            return json!({});
        };
        json!({"lvol": {
            "lvol_store_uuid": store.uuid.to_string(),
            "base_bdev": store.base_bdev,
            "thin_provision": lvol.thin,
            "num_allocated_clusters": store.allocated_clusters(lvol),
            "snapshot": false,
            "clone": false,
            "esnap_clone": false
        }})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_takes_one_cluster_on_small_stores() {
        // 256 MiB / 4 MiB = 64 clusters; the metadata fits in the first cluster.
        assert_eq!(md_clusters(64, DEFAULT_CLUSTER_SIZE, 100), 1);
        // 1 TiB worth of 4 KiB clusters needs many metadata clusters.
        assert!(md_clusters(1 << 28, 4096, 100) > 1 << 27);
    }

    #[test]
    fn clear_methods_are_checked() {
        assert!(check_clear_method(&None).is_ok());
        assert!(check_clear_method(&Some("unmap".into())).is_ok());
        assert_eq!(
            check_clear_method(&Some("shred".into())).unwrap_err(),
            RpcError::new(-22, "Invalid clear_method parameter")
        );
    }
}
