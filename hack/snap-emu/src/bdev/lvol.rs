//! Logical volume stores and logical volumes (`bdev_lvol_*`).
//!
//! Lvols are files of their store: a store claims its base bdev and keeps its
//! lvols as sparse files under `<state>/lvstores/lvs-<uuid>/`, not inside the
//! base bdev's bytes. Cluster accounting follows the blobstore (4 MiB clusters
//! by default, metadata taking the first clusters), with a thin lvol's
//! allocated clusters estimated from the blocks its file really occupies. As
//! SPDK's, a store outlives its base bdev and the process: a base going
//! unloads its store, and a store is found again when its base appears again
//! (`lvol_disk`).
//!
//! Snapshots and clones (`bdev_lvol_snapshot`, `bdev_lvol_clone`,
//! `bdev_lvol_decouple_parent`) keep SPDK's visible rules: a snapshot is a
//! read-only lvol `<lvs>/<name>` and its origin becomes its thin clone; a
//! clone is a writable thin lvol backed by a snapshot; an lvol with more than
//! one clone cannot be deleted (-EPERM), and deleting a snapshot with one
//! clone hands its parent to that clone; decoupling makes the parent's parent
//! the new parent. The bytes, though, are copies, not shared clusters: a
//! snapshot's file is a (sparse) copy of its origin's at that moment and a
//! clone's file a copy of its snapshot's, so every lvol keeps reading its own
//! file and no I/O path needs to know about parents. Cluster accounting of a
//! clone counts only what its file holds beyond its parent's, which is close
//! to the blobstore's for the write-once patterns tests use, not exact.

use std::collections::HashSet;
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use super::lvol_disk::{self, base_file, lvol_file, store_dir};
use super::lvol_store::{
    BS_PAGE_SIZE, DEFAULT_CLUSTER_SIZE, Lvol, LvolStore, NAME_MAX, callback_error,
};
use super::registry::{Bdev, BdevKind, Bdevs, io_error};
use crate::registry::{Answer, BdevModule, BdevUser, Cx, Family};
use crate::rpc::{
    EEXIST, EINVAL, ENODEV, ENOSPC, EPERM, OnDecodeError, RpcError, RpcResult, decode, decode_opt,
};

/// Copies `from` to a new file `to`, leaving holes where `from` reads zeroes,
/// so that a copy of a thin lvol stays thin.
fn copy_sparse(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom, Write};
    const CHUNK: usize = 1 << 20;
    let mut src = std::fs::File::open(from)?;
    let len = src.metadata()?.len();
    let mut dst = std::fs::File::create(to)?;
    let mut buf = vec![0u8; CHUNK];
    let mut offset = 0u64;
    while offset < len {
        let want = usize::try_from((len - offset).min(CHUNK as u64)).unwrap_or(CHUNK);
        src.read_exact(&mut buf[..want])?;
        if buf[..want].iter().any(|&b| b != 0) {
            dst.seek(SeekFrom::Start(offset))?;
            dst.write_all(&buf[..want])?;
        }
        offset += want as u64;
    }
    dst.set_len(len)?;
    dst.sync_all()
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
struct SnapshotParams {
    lvol_name: String,
    snapshot_name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CloneParams {
    snapshot_name: String,
    clone_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResizeParams {
    name: String,
    size_in_mib: u64,
}

const METHODS: &[&str] = &[
    "bdev_lvol_clone",
    "bdev_lvol_create",
    "bdev_lvol_create_lvstore",
    "bdev_lvol_decouple_parent",
    "bdev_lvol_delete",
    "bdev_lvol_delete_lvstore",
    "bdev_lvol_get_lvols",
    "bdev_lvol_get_lvstores",
    "bdev_lvol_resize",
    "bdev_lvol_snapshot",
];

/// The lvol stores and their lvols.
#[derive(Debug)]
pub(crate) struct Lvols {
    /// Where the stores keep their metadata and lvols' files.
    stores_dir: PathBuf,
    stores: Vec<LvolStore>,
    /// The bases examined for a store already (by UUID): each once.
    examined: HashSet<Uuid>,
}

impl Lvols {
    pub(crate) fn new(stores_dir: PathBuf) -> Self {
        Self {
            stores_dir,
            stores: Vec::new(),
            examined: HashSet::new(),
        }
    }

    /// Writes store `i`'s metadata after a change, as the blobstore syncs
    /// its metadata before the operation's callback.
    fn save(&self, i: usize) -> Result<(), RpcError> {
        self.stores[i].save().map_err(|e| io_error(&e))
    }

    /// `vbdev_get_lvol_store_by_uuid_xor_name`: exactly one selector, else -EINVAL.
    fn lvs_index(&self, uuid: Option<&str>, name: Option<&str>) -> Result<usize, RpcError> {
        let found = match (uuid, name) {
            (Some(u), None) => self.stores.iter().position(|s| s.uuid.to_string() == u),
            (None, Some(n)) => self.stores.iter().position(|s| s.name == n),
            _ => return Err(RpcError::errno(EINVAL)),
        };
        found.ok_or(RpcError::errno(ENODEV))
    }

    fn bdev_lvol_create_lvstore(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        let p: CreateLvstoreParams = decode(params, OnDecodeError::DecodeFailed)?;
        check_clear_method(&p.clear_method)?;
        if p.lvs_name.is_empty() || p.lvs_name.len() > NAME_MAX {
            return Err(RpcError::errno(EINVAL));
        }
        // SPDK's order: the base bdev opened for writing (absent, or claimed
        // by another module), the cluster size against its blocks, the name;
        // then the blobstore's own checks, which answer through the callback.
        let base = cx.bdevs.get(&p.bdev_name).ok_or(RpcError::errno(ENODEV))?;
        if base.claim.is_some() || cx.writes(&base.name) {
            return Err(RpcError::errno(EPERM));
        }
        let cluster_size = p.cluster_sz.map_or(DEFAULT_CLUSTER_SIZE, u64::from);
        let block_size = base.block_size;
        if cluster_size < u64::from(block_size) {
            return Err(RpcError::errno(EINVAL));
        }
        if self.stores.iter().any(|s| s.name == p.lvs_name) {
            return Err(RpcError::errno(EEXIST));
        }
        if cluster_size < BS_PAGE_SIZE
            || !cluster_size.is_multiple_of(BS_PAGE_SIZE)
            || !cluster_size.is_multiple_of(u64::from(block_size))
        {
            return Err(callback_error(EINVAL));
        }
        let ratio = p.num_md_pages_per_cluster_ratio.map_or(100, u64::from);
        let num_clusters = base.size_bytes() / cluster_size;
        if num_clusters.saturating_mul(ratio) / 100 == 0 {
            // No metadata pages at all: the blobstore's options check fails.
            return Err(callback_error(EINVAL));
        }
        // A store whose metadata fills it is made, with no data clusters.
        let md = md_clusters(num_clusters, cluster_size, ratio.max(1));
        if num_clusters < md {
            return Err(callback_error(ENOSPC));
        }
        let uuid = Uuid::new_v4();
        let store = LvolStore {
            uuid,
            name: p.lvs_name,
            base_bdev: base.name.clone(),
            cluster_size,
            block_size,
            total_data_clusters: num_clusters - md,
            dir: store_dir(&self.stores_dir, uuid),
            lvols: vec![],
        };
        let made = std::fs::create_dir_all(&store.dir)
            .and_then(|()| store.save())
            .and_then(|()| {
                base_file(base).map_or(Ok(()), |f| lvol_disk::write_superblock(f, uuid))
            });
        if let Err(e) = made {
            let _ = std::fs::remove_dir_all(&store.dir);
            return Err(io_error(&e));
        }
        if let Some(b) = cx.bdevs.get_mut(&store.base_bdev) {
            b.claim = Some("lvol");
        }
        self.stores.push(store);
        Ok(json!(uuid.to_string()))
    }

    fn bdev_lvol_get_lvstores(&self, params: Option<Value>) -> RpcResult {
        if params.is_none() {
            return Ok(Value::Array(self.stores.iter().map(|s| s.json()).collect()));
        }
        let p: LvsSelector = decode(params, OnDecodeError::DecodeFailed)?;
        let i = self.lvs_index(p.uuid.as_deref(), p.lvs_name.as_deref())?;
        Ok(json!([self.stores[i].json()]))
    }

    fn bdev_lvol_delete_lvstore(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        let p: LvsSelector = decode(params, OnDecodeError::DecodeFailed)?;
        let i = self.lvs_index(p.uuid.as_deref(), p.lvs_name.as_deref())?;
        let uuid = self.stores[i].uuid;
        let lvols: Vec<String> = self.stores[i]
            .lvols
            .iter()
            .map(|l| l.uuid.to_string())
            .collect();
        for name in lvols {
            cx.unregister(self, &name);
        }
        if let Some(store) = self.unload(uuid, cx.bdevs) {
            // The blobstore's destroy zeroes its super block.
            if let Some(file) = cx.bdevs.get(&store.base_bdev).and_then(base_file) {
                lvol_disk::erase_superblock(file, uuid).map_err(|e| io_error(&e))?;
            }
            let _ = std::fs::remove_dir_all(&store.dir);
        }
        Ok(json!(true))
    }

    /// Takes a store whose lvols are unregistered out of memory and releases
    /// its base; what it keeps on disk stays.
    fn unload(&mut self, uuid: Uuid, bdevs: &mut Bdevs) -> Option<LvolStore> {
        let i = self.stores.iter().position(|s| s.uuid == uuid)?;
        let store = self.stores.remove(i);
        if let Some(b) = bdevs.get_mut(&store.base_bdev) {
            b.claim = None;
        }
        Some(store)
    }

    /// SPDK's examine of `base`: the store its superblock names is loaded,
    /// claims it, and registers its lvols.
    fn load_from(&mut self, base: &Bdev, bdevs: &mut Bdevs) {
        let Some(uuid) = base_file(base).and_then(lvol_disk::read_superblock) else {
            return;
        };
        let store = match LvolStore::load(&self.stores_dir, uuid, &base.name) {
            Ok(store) => store,
            Err(e) => {
                tracing::warn!(base = %base.name, "lvstore {uuid} not loaded: {e}");
                return;
            }
        };
        if self
            .stores
            .iter()
            .any(|s| s.uuid == uuid || s.name == store.name)
        {
            tracing::warn!(base = %base.name, "lvstore {} is loaded already", store.name);
            return;
        }
        for lvol in &store.lvols {
            let registered = store.bdev(lvol).and_then(|b| bdevs.insert(b));
            if let Err(e) = registered {
                tracing::warn!(lvol = %lvol.name, "lvol not registered: {}", e.message);
            }
        }
        if let Some(b) = bdevs.get_mut(&base.name) {
            b.claim = Some("lvol");
        }
        self.stores.push(store);
    }

    fn bdev_lvol_get_lvols(&self, params: Option<Value>) -> RpcResult {
        let p: GetLvolsParams = decode_opt(params, OnDecodeError::DecodeFailed)?;
        let stores: Vec<&LvolStore> = if p.lvs_uuid.is_none() && p.lvs_name.is_none() {
            self.stores.iter().collect()
        } else {
            let i = self.lvs_index(p.lvs_uuid.as_deref(), p.lvs_name.as_deref())?;
            vec![&self.stores[i]]
        };
        let mut out = vec![];
        for s in stores {
            for l in &s.lvols {
                out.push(json!({
                    "alias": format!("{}/{}", s.name, l.name),
                    "uuid": l.uuid.to_string(),
                    "name": l.name,
                    "is_thin_provisioned": l.thin,
                    "is_snapshot": l.read_only,
                    "is_clone": l.parent.is_some(),
                    "is_esnap_clone": false,
                    "is_degraded": false,
                    "lvs": {"name": s.name, "uuid": s.uuid.to_string()}
                }));
            }
        }
        Ok(Value::Array(out))
    }

    fn bdev_lvol_create(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        let p: CreateLvolParams = decode(params, OnDecodeError::DecodeFailed)?;
        let i = self.lvs_index(p.uuid.as_deref(), p.lvs_name.as_deref())?;
        check_clear_method(&p.clear_method)?;
        if p.lvol_name.is_empty() || p.lvol_name.len() > NAME_MAX {
            return Err(RpcError::errno(EINVAL));
        }
        let store = &self.stores[i];
        if store.lvols.iter().any(|l| l.name == p.lvol_name) {
            return Err(RpcError::errno(EEXIST));
        }
        let num_clusters = store.clusters_for(p.size_in_mib)?;
        if !p.thin_provision && num_clusters > store.free_clusters() {
            return Err(callback_error(ENOSPC));
        }
        let uuid = Uuid::new_v4();
        let lvol = Lvol {
            uuid,
            name: p.lvol_name,
            thin: p.thin_provision,
            num_clusters,
            file: lvol_file(&store.dir, uuid),
            parent: None,
            read_only: false,
        };
        let bytes = store.cluster_bytes(num_clusters)?;
        cx.bdevs
            .insert_with_file(store.bdev(&lvol)?, &lvol.file, bytes)?;
        self.stores[i].lvols.push(lvol);
        self.save(i)?;
        Ok(json!(uuid.to_string()))
    }

    /// Registers `lvol` of store `si` over `file`, a copy of `source`'s bytes.
    fn register_copy(
        &mut self,
        bdevs: &mut Bdevs,
        si: usize,
        lvol: Lvol,
        source: &std::path::Path,
    ) -> RpcResult {
        let bdev = self.stores[si].bdev(&lvol)?;
        copy_sparse(source, &lvol.file).map_err(|e| {
            let _ = std::fs::remove_file(&lvol.file);
            io_error(&e)
        })?;
        if let Err(e) = bdevs.insert(bdev) {
            let _ = std::fs::remove_file(&lvol.file);
            return Err(e);
        }
        let uuid = lvol.uuid;
        self.stores[si].lvols.push(lvol);
        self.save(si)?;
        Ok(json!(uuid.to_string()))
    }

    /// `bdev_lvol_snapshot`: the snapshot takes the origin's place under its
    /// parent and the origin becomes the snapshot's clone.
    fn bdev_lvol_snapshot(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        let p: SnapshotParams = decode(params, OnDecodeError::DecodeFailed)?;
        let (si, li) = self.lvol_bdev(cx.bdevs, &p.lvol_name)?;
        let store = &self.stores[si];
        let name = store.verify_new_name(Some(&p.snapshot_name))?;
        let origin = store.lvols[li].clone();
        if origin.read_only {
            return Err(callback_error(EINVAL));
        }
        let uuid = Uuid::new_v4();
        let snapshot = Lvol {
            uuid,
            name,
            thin: origin.thin,
            num_clusters: origin.num_clusters,
            file: lvol_file(&store.dir, uuid),
            parent: origin.parent,
            read_only: true,
        };
        let result = self.register_copy(cx.bdevs, si, snapshot, &origin.file)?;
        let origin = &mut self.stores[si].lvols[li];
        origin.parent = Some(uuid);
        origin.thin = true;
        self.save(si)?;
        Ok(result)
    }

    /// `bdev_lvol_clone`: a thin writable lvol over a snapshot.
    fn bdev_lvol_clone(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        let p: CloneParams = decode(params, OnDecodeError::DecodeFailed)?;
        let (si, li) = self.lvol_bdev(cx.bdevs, &p.snapshot_name)?;
        let store = &self.stores[si];
        let name = store.verify_new_name(p.clone_name.as_deref())?;
        let snapshot = store.lvols[li].clone();
        if !snapshot.read_only {
            // The blobstore clones only read-only blobs.
            return Err(callback_error(EINVAL));
        }
        let uuid = Uuid::new_v4();
        let clone = Lvol {
            uuid,
            name,
            thin: true,
            num_clusters: snapshot.num_clusters,
            file: lvol_file(&store.dir, uuid),
            parent: Some(snapshot.uuid),
            read_only: false,
        };
        self.register_copy(cx.bdevs, si, clone, &snapshot.file)
    }

    /// `bdev_lvol_decouple_parent`: the lvol's bytes are its own already, so
    /// only the parent changes, to the parent's parent.
    fn bdev_lvol_decouple_parent(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        let p: NameParams = decode(params, OnDecodeError::DecodeFailed)?;
        let (si, li) = self.lvol_bdev(cx.bdevs, &p.name)?;
        let store = &self.stores[si];
        let Some(parent) = store.lvols[li].parent else {
            return Err(callback_error(EINVAL));
        };
        let grandparent = store
            .lvols
            .iter()
            .find(|l| l.uuid == parent)
            .and_then(|l| l.parent);
        self.stores[si].lvols[li].parent = grandparent;
        self.save(si)?;
        Ok(json!(true))
    }

    fn lvol_bdev(&self, bdevs: &Bdevs, name: &str) -> Result<(usize, usize), RpcError> {
        let bdev = bdevs.get(name).ok_or(RpcError::errno(ENODEV))?;
        let BdevKind::Lvol { lvs_uuid, .. } = bdev.kind else {
            return Err(RpcError::errno(ENODEV));
        };
        let si = self
            .stores
            .iter()
            .position(|s| s.uuid == lvs_uuid)
            .ok_or(RpcError::errno(ENODEV))?;
        let li = self.stores[si]
            .lvols
            .iter()
            .position(|l| l.uuid == bdev.uuid)
            .ok_or(RpcError::errno(ENODEV))?;
        Ok((si, li))
    }

    /// `bdev_lvol_delete`: an lvol with more than one clone stays (-EPERM
    /// through the callback, which, unlike the other lvol callbacks, answers
    /// -32603); a snapshot with one clone hands it its parent.
    fn bdev_lvol_delete(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        let p: NameParams = decode(params, OnDecodeError::DecodeFailed)?;
        let (si, li) = self.lvol_bdev(cx.bdevs, &p.name)?;
        let store = &mut self.stores[si];
        let lvol = store.lvols[li].clone();
        if store.clone_count(lvol.uuid) > 1 {
            return Err(RpcError::internal(crate::rpc::strerror(EPERM)));
        }
        for l in store
            .lvols
            .iter_mut()
            .filter(|l| l.parent == Some(lvol.uuid))
        {
            l.parent = lvol.parent;
        }
        cx.unregister(self, &lvol.uuid.to_string());
        let _ = std::fs::remove_file(&lvol.file);
        self.save(si)?;
        Ok(json!(true))
    }

    fn bdev_lvol_resize(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        let p: ResizeParams = decode(params, OnDecodeError::DecodeFailed)?;
        let (si, li) = self.lvol_bdev(cx.bdevs, &p.name)?;
        let store = &self.stores[si];
        let lvol = &store.lvols[li];
        if lvol.read_only {
            // The blobstore resizes no read-only blob (a snapshot).
            return Err(callback_error(EPERM));
        }
        let num_clusters = store.clusters_for(p.size_in_mib)?;
        if !lvol.thin
            && num_clusters > lvol.num_clusters
            && num_clusters - lvol.num_clusters > store.free_clusters()
        {
            return Err(callback_error(ENOSPC));
        }
        let bytes = store.cluster_bytes(num_clusters)?;
        let num_blocks = bytes / u64::from(store.block_size);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&lvol.file)
            .and_then(|f| f.set_len(bytes))
            .map_err(|e| io_error(&e))?;
        let name = lvol.uuid.to_string();
        self.stores[si].lvols[li].num_clusters = num_clusters;
        self.save(si)?;
        if let Some(b) = cx.bdevs.get_mut(&name) {
            b.num_blocks = num_blocks;
        }
        cx.resized(self, &name);
        Ok(json!(true))
    }
}

impl Family for Lvols {
    fn methods(&self) -> Vec<&'static str> {
        METHODS.to_vec()
    }

    fn call(&mut self, method: &str, params: Option<Value>, cx: &mut Cx<'_>) -> Answer {
        match method {
            "bdev_lvol_create_lvstore" => self.bdev_lvol_create_lvstore(params, cx),
            "bdev_lvol_get_lvstores" => self.bdev_lvol_get_lvstores(params),
            "bdev_lvol_delete_lvstore" => self.bdev_lvol_delete_lvstore(params, cx),
            "bdev_lvol_get_lvols" => self.bdev_lvol_get_lvols(params),
            "bdev_lvol_create" => self.bdev_lvol_create(params, cx),
            "bdev_lvol_delete" => self.bdev_lvol_delete(params, cx),
            "bdev_lvol_resize" => self.bdev_lvol_resize(params, cx),
            "bdev_lvol_snapshot" => self.bdev_lvol_snapshot(params, cx),
            "bdev_lvol_clone" => self.bdev_lvol_clone(params, cx),
            "bdev_lvol_decouple_parent" => self.bdev_lvol_decouple_parent(params, cx),
            _ => Err(RpcError::method_not_found()),
        }
        .map(Into::into)
    }
}

impl BdevModule for Lvols {
    /// The lvols of the stores on `bdev`: they go before it does.
    fn built_on(&self, bdev: &Bdev, _bdevs: &Bdevs) -> Vec<String> {
        self.stores
            .iter()
            .filter(|s| s.base_bdev == bdev.name)
            .flat_map(|s| s.lvols.iter().map(|l| l.uuid.to_string()))
            .collect()
    }

    /// An lvol bdev is gone: it leaves its store in memory. Its file and
    /// its metadata go only when `bdev_lvol_delete` deletes it; a base
    /// going only unloads its store. A base gone may come back.
    fn destruct(&mut self, bdev: &Bdev, _bdevs: &mut Bdevs) {
        self.examined.remove(&bdev.uuid);
        let BdevKind::Lvol { lvs_uuid, .. } = bdev.kind else {
            return;
        };
        if let Some(store) = self.stores.iter_mut().find(|s| s.uuid == lvs_uuid)
            && let Some(i) = store.lvols.iter().position(|l| l.uuid == bdev.uuid)
        {
            store.lvols.remove(i);
        }
    }

    /// Every aio bdev not examined yet, unclaimed, is looked at for a store.
    fn examine(&mut self, bdevs: &mut Bdevs) {
        let fresh: Vec<Bdev> = bdevs
            .iter()
            .filter(|b| base_file(b).is_some() && !self.examined.contains(&b.uuid))
            .cloned()
            .collect();
        for base in fresh {
            self.examined.insert(base.uuid);
            if base.claim.is_none() {
                self.load_from(&base, bdevs);
            }
        }
    }

    fn dump(&self, bdev: &Bdev) -> Option<Value> {
        let BdevKind::Lvol { lvs_uuid, .. } = bdev.kind else {
            return None;
        };
        let Some(store) = self.stores.iter().find(|s| s.uuid == lvs_uuid) else {
            return Some(json!({}));
        };
        let Some(lvol) = store.lvols.iter().find(|l| l.uuid == bdev.uuid) else {
            return Some(json!({}));
        };
        let mut o = serde_json::Map::new();
        o.insert("lvol_store_uuid".into(), json!(store.uuid.to_string()));
        o.insert("base_bdev".into(), json!(store.base_bdev));
        o.insert("thin_provision".into(), json!(lvol.thin));
        o.insert(
            "num_allocated_clusters".into(),
            json!(store.allocated_clusters(lvol)),
        );
        o.insert("snapshot".into(), json!(lvol.read_only));
        o.insert("clone".into(), json!(lvol.parent.is_some()));
        if let Some(parent) = lvol.parent.and_then(|p| store.name_of(p)) {
            o.insert("base_snapshot".into(), json!(parent));
        }
        let clones: Vec<&str> = store
            .lvols
            .iter()
            .filter(|l| l.parent == Some(lvol.uuid))
            .map(|l| l.name.as_str())
            .collect();
        if lvol.read_only && !clones.is_empty() {
            o.insert("clones".into(), json!(clones));
        }
        o.insert("esnap_clone".into(), json!(false));
        Some(json!({ "lvol": o }))
    }
}

impl BdevUser for Lvols {
    /// A store's base is going (its lvols went first): the store is
    /// unloaded, and found again when the base comes back.
    fn release(&mut self, bdev: &Bdev, bdevs: &mut Bdevs) {
        let stores: Vec<Uuid> = self
            .stores
            .iter()
            .filter(|s| s.base_bdev == bdev.name)
            .map(|s| s.uuid)
            .collect();
        for uuid in stores {
            self.unload(uuid, bdevs);
        }
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
