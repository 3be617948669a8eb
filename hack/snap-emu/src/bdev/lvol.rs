//! Logical volume stores and logical volumes (`bdev_lvol_*`).
//!
//! Lvols are files of their store: a store claims its base bdev and keeps its
//! lvols as sparse files under `<state>/bdevs/lvs-<uuid>/`, not inside the base
//! bdev's bytes. Cluster accounting follows the blobstore (4 MiB clusters by
//! default, metadata taking the first clusters), with a thin lvol's allocated
//! clusters estimated from the blocks its file really occupies. A store is
//! therefore not found again when its base bdev is re-created: a restarted
//! emulator starts empty, as documented.
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

use std::path::PathBuf;

use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use super::registry::{Bdev, BdevKind, Bdevs, io_error};
use crate::registry::{Answer, BdevModule, BdevUser, Cx, Family};
use crate::rpc::{
    EEXIST, EINVAL, ENODEV, ENOSPC, EPERM, OnDecodeError, RpcError, RpcResult, decode, decode_opt,
};

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
    /// The snapshot this lvol reads through (it is a clone of it).
    pub parent: Option<Uuid>,
    /// A snapshot.
    pub read_only: bool,
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
        // A clone's file starts as a copy of its parent's, whose clusters are
        // the parent's, not the clone's.
        let inherited = lvol
            .parent
            .and_then(|p| self.lvols.iter().find(|l| l.uuid == p))
            .map_or(0, |p| file_bytes(&p.file));
        let used = file_bytes(&lvol.file).saturating_sub(inherited);
        used.div_ceil(self.cluster_size).min(lvol.num_clusters)
    }

    fn clone_count(&self, uuid: Uuid) -> usize {
        self.lvols.iter().filter(|l| l.parent == Some(uuid)).count()
    }

    fn name_of(&self, uuid: Uuid) -> Option<&str> {
        self.lvols
            .iter()
            .find(|l| l.uuid == uuid)
            .map(|l| l.name.as_str())
    }

    /// `lvs_verify_lvol_name`, whose refusal reaches the caller through the
    /// operation's callback (-32602 with `strerror`'s text).
    fn verify_new_name(&self, name: Option<&str>) -> Result<String, RpcError> {
        match name {
            None | Some("") => Err(callback_error(EINVAL)),
            Some(n) if n.len() > NAME_MAX => Err(callback_error(EINVAL)),
            Some(n) if self.lvols.iter().any(|l| l.name == n) => Err(callback_error(EEXIST)),
            Some(n) => Ok(n.to_string()),
        }
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

/// Bytes a file really occupies.
fn file_bytes(path: &std::path::Path) -> u64 {
    std::fs::metadata(path)
        .map(|m| std::os::unix::fs::MetadataExt::blocks(&m).saturating_mul(512))
        .unwrap_or(0)
}

/// How the lvol RPCs' completion callbacks report a failure:
/// `SPDK_JSONRPC_ERROR_INVALID_PARAMS` with `strerror`'s text.
fn callback_error(errno: i32) -> RpcError {
    RpcError::invalid_params_msg(crate::rpc::strerror(errno))
}

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
    /// Where the stores keep their lvols' files.
    files_dir: PathBuf,
    stores: Vec<LvolStore>,
}

impl Lvols {
    pub(crate) fn new(files_dir: PathBuf) -> Self {
        Self {
            files_dir,
            stores: Vec::new(),
        }
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
        let dir = self.files_dir.join(format!("lvs-{uuid}"));
        std::fs::create_dir_all(&dir).map_err(|e| io_error(&e))?;
        let base_name = base.name.clone();
        if let Some(b) = cx.bdevs.get_mut(&base_name) {
            b.claim = Some("lvol");
        }
        self.stores.push(LvolStore {
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
        self.drop_store(uuid, cx.bdevs);
        Ok(json!(true))
    }

    /// Removes a store whose lvols are gone: its base is released and its
    /// files go.
    fn drop_store(&mut self, uuid: Uuid, bdevs: &mut Bdevs) {
        let Some(i) = self.stores.iter().position(|s| s.uuid == uuid) else {
            return;
        };
        let store = self.stores.remove(i);
        if let Some(b) = bdevs.get_mut(&store.base_bdev) {
            b.claim = None;
        }
        let _ = std::fs::remove_dir_all(&store.dir);
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
            io: Default::default(),
            kind: BdevKind::Lvol {
                lvs_uuid: store.uuid,
                base: store.base_bdev.clone(),
                file: file.clone(),
                read_only: false,
            },
        };
        cx.bdevs.insert_with_file(bdev, &file, bytes)?;
        self.stores[i].lvols.push(Lvol {
            uuid,
            name: p.lvol_name,
            thin: p.thin_provision,
            num_clusters,
            file,
            parent: None,
            read_only: false,
        });
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
        let store = &self.stores[si];
        let bytes = store.cluster_bytes(lvol.num_clusters)?;
        copy_sparse(source, &lvol.file).map_err(|e| {
            let _ = std::fs::remove_file(&lvol.file);
            io_error(&e)
        })?;
        let bdev = Bdev {
            name: lvol.uuid.to_string(),
            aliases: vec![format!("{}/{}", store.name, lvol.name)],
            uuid: lvol.uuid,
            product_name: "Logical Volume",
            block_size: store.block_size,
            num_blocks: bytes / u64::from(store.block_size),
            claim: None,
            io: Default::default(),
            kind: BdevKind::Lvol {
                lvs_uuid: store.uuid,
                base: store.base_bdev.clone(),
                file: lvol.file.clone(),
                read_only: lvol.read_only,
            },
        };
        if let Err(e) = bdevs.insert(bdev) {
            let _ = std::fs::remove_file(&lvol.file);
            return Err(e);
        }
        let uuid = lvol.uuid;
        self.stores[si].lvols.push(lvol);
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
            file: store.dir.join(format!("{uuid}.img")),
            parent: origin.parent,
            read_only: true,
        };
        let result = self.register_copy(cx.bdevs, si, snapshot, &origin.file)?;
        let origin = &mut self.stores[si].lvols[li];
        origin.parent = Some(uuid);
        origin.thin = true;
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
            file: store.dir.join(format!("{uuid}.img")),
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

    /// An lvol bdev is gone: it leaves its store, with its file.
    fn destruct(&mut self, bdev: &Bdev, _bdevs: &mut Bdevs) {
        let BdevKind::Lvol { lvs_uuid, .. } = bdev.kind else {
            return;
        };
        if let Some(store) = self.stores.iter_mut().find(|s| s.uuid == lvs_uuid)
            && let Some(i) = store.lvols.iter().position(|l| l.uuid == bdev.uuid)
        {
            let lvol = store.lvols.remove(i);
            let _ = std::fs::remove_file(&lvol.file);
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
    /// A store's base is going (its lvols went first): the store goes.
    fn release(&mut self, bdev: &Bdev, bdevs: &mut Bdevs) {
        let stores: Vec<Uuid> = self
            .stores
            .iter()
            .filter(|s| s.base_bdev == bdev.name)
            .map(|s| s.uuid)
            .collect();
        for uuid in stores {
            self.drop_store(uuid, bdevs);
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
