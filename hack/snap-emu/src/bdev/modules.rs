//! The aio, malloc and null bdev modules (`bdev_{aio,malloc,null}_*`): aio
//! opens the named file or block device, malloc and null get a sparse file
//! of their own under `<state>/bdevs`.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use super::registry::{Bdev, BdevKind, Bdevs, io_error};
use crate::registry::{Answer, BdevModule, BdevUser, Cx, Family};
use crate::rpc::{EEXIST, EINVAL, ENODEV, ENOMEM, OnDecodeError, RpcError, RpcResult, decode};

const METHODS: &[&str] = &[
    "bdev_aio_create",
    "bdev_aio_delete",
    "bdev_aio_rescan",
    "bdev_malloc_create",
    "bdev_malloc_delete",
    "bdev_null_create",
    "bdev_null_delete",
];

#[derive(Debug)]
pub(crate) struct Modules {
    /// Where malloc and null bdevs keep their files.
    files_dir: PathBuf,
    /// SPDK's `malloc_disk_count`: only unnamed malloc bdevs advance it.
    malloc_count: u32,
}

impl Modules {
    pub(crate) fn new(files_dir: PathBuf) -> Self {
        Self {
            files_dir,
            malloc_count: 0,
        }
    }

    fn next_malloc_name(&mut self) -> String {
        let name = format!("Malloc{}", self.malloc_count);
        self.malloc_count += 1;
        name
    }

    fn bdev_aio_create(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        let p: AioCreateParams = decode(params, OnDecodeError::DecodeFailed)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(!p.readonly)
            .open(&p.filename)
            .map_err(|e| io_error(&e))?;
        let (size, detected) = probe(&mut file).map_err(|e| io_error(&e))?;
        drop(file);
        // A regular file has no block size to detect: SPDK wants one given.
        let (block_size, block_size_override) = match p.block_size {
            None | Some(0) if detected == 0 => return Err(RpcError::errno(EINVAL)),
            None | Some(0) => (detected, false),
            Some(bs) if bs < detected => return Err(RpcError::errno(EINVAL)),
            Some(bs) => (bs, true),
        };
        if block_size < 512 || !block_size.is_power_of_two() {
            return Err(RpcError::errno(EINVAL));
        }
        // An empty file makes a bdev of no blocks, as in SPDK.
        if !size.is_multiple_of(u64::from(block_size)) {
            return Err(RpcError::errno(EINVAL));
        }
        let num_blocks = size / u64::from(block_size);
        cx.bdevs.insert(Bdev {
            name: p.name.clone(),
            aliases: vec![],
            uuid: p.uuid.unwrap_or_else(Uuid::new_v4),
            product_name: "AIO disk",
            block_size,
            num_blocks,
            claim: None,
            io: Default::default(),
            kind: BdevKind::Aio {
                filename: PathBuf::from(&p.filename),
                readonly: p.readonly,
                block_size_override,
                fallocate: p.fallocate,
            },
        })?;
        Ok(json!(p.name))
    }

    fn bdev_aio_delete(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        self.delete_module_bdev(params, cx, |k| matches!(k, BdevKind::Aio { .. }))
    }

    fn bdev_aio_rescan(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        let p: NameParams = decode(params, OnDecodeError::DecodeFailed)?;
        let name = cx
            .bdevs
            .of_module(&p.name, |k| matches!(k, BdevKind::Aio { .. }))?;
        let bdev = cx.bdevs.get(&name).ok_or(RpcError::errno(ENODEV))?;
        let BdevKind::Aio { filename, .. } = &bdev.kind else {
            return Err(RpcError::errno(ENODEV));
        };
        let mut file = File::open(filename).map_err(|e| io_error(&e))?;
        let (size, _) = probe(&mut file).map_err(|e| io_error(&e))?;
        let num_blocks = size / u64::from(bdev.block_size);
        if num_blocks != bdev.num_blocks {
            if let Some(b) = cx.bdevs.get_mut(&name) {
                b.num_blocks = num_blocks;
            }
            cx.resized(self, &name);
        }
        Ok(json!(true))
    }

    fn bdev_malloc_create(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        let p: MallocCreateParams = decode(params, OnDecodeError::DecodeFailed)?;
        check_data_only_format(p.num_blocks, p.block_size, p.md_size, p.dif_type)?;
        // The number is taken before the size is checked (in
        // `register_file_bdev`): a create that fails on its size uses one up.
        let name = match p.name {
            Some(n) => n,
            None => self.next_malloc_name(),
        };
        let uuid = p.uuid.unwrap_or_else(Uuid::new_v4);
        let file = self.file_of(uuid);
        register_file_bdev(
            cx.bdevs,
            Bdev {
                name,
                aliases: vec![],
                uuid,
                product_name: "Malloc disk",
                block_size: p.block_size,
                num_blocks: p.num_blocks,
                claim: None,
                io: Default::default(),
                kind: BdevKind::Malloc { file: file.clone() },
            },
            &file,
        )
    }

    fn bdev_malloc_delete(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        self.delete_module_bdev(params, cx, |k| matches!(k, BdevKind::Malloc { .. }))
    }

    fn bdev_null_create(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        let p: NullCreateParams = decode(params, OnDecodeError::DecodeFailed)?;
        check_data_only_format(p.num_blocks, p.block_size, p.md_size, p.dif_type)?;
        let uuid = p.uuid.unwrap_or_else(Uuid::new_v4);
        let file = self.file_of(uuid);
        register_file_bdev(
            cx.bdevs,
            Bdev {
                name: p.name,
                aliases: vec![],
                uuid,
                product_name: "Null disk",
                block_size: p.block_size,
                num_blocks: p.num_blocks,
                claim: None,
                io: Default::default(),
                kind: BdevKind::Null { file: file.clone() },
            },
            &file,
        )
    }

    fn bdev_null_delete(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        self.delete_module_bdev(params, cx, |k| matches!(k, BdevKind::Null { .. }))
    }

    /// A malloc or null bdev's file: named by its UUID.
    fn file_of(&self, uuid: Uuid) -> PathBuf {
        self.files_dir.join(format!("{uuid}.img"))
    }

    /// `bdev_{aio,malloc,null}_delete`: alike but for whose bdevs they delete.
    fn delete_module_bdev(
        &mut self,
        params: Option<Value>,
        cx: &mut Cx<'_>,
        is_mine: impl Fn(&BdevKind) -> bool,
    ) -> RpcResult {
        let p: NameParams = decode(params, OnDecodeError::DecodeFailed)?;
        let name = cx.bdevs.of_module(&p.name, is_mine)?;
        cx.unregister(self, &name);
        Ok(json!(true))
    }
}

impl Family for Modules {
    fn methods(&self) -> Vec<&'static str> {
        METHODS.to_vec()
    }

    fn call(&mut self, method: &str, params: Option<Value>, cx: &mut Cx<'_>) -> Answer {
        match method {
            "bdev_aio_create" => self.bdev_aio_create(params, cx),
            "bdev_aio_delete" => self.bdev_aio_delete(params, cx),
            "bdev_aio_rescan" => self.bdev_aio_rescan(params, cx),
            "bdev_malloc_create" => self.bdev_malloc_create(params, cx),
            "bdev_malloc_delete" => self.bdev_malloc_delete(params, cx),
            "bdev_null_create" => self.bdev_null_create(params, cx),
            "bdev_null_delete" => self.bdev_null_delete(params, cx),
            _ => Err(RpcError::method_not_found()),
        }
        .map(Into::into)
    }
}

/// Registers a malloc or null bdev over `file`, a sparse file of its own.
fn register_file_bdev(bdevs: &mut Bdevs, bdev: Bdev, file: &Path) -> RpcResult {
    let size = bdev
        .num_blocks
        .checked_mul(u64::from(bdev.block_size))
        .ok_or(RpcError::errno(ENOMEM))?;
    // Checked before the file is made: it is named by the UUID, and a
    // clash must not truncate the file of the bdev that holds that UUID.
    if bdevs.get(&bdev.name).is_some() || bdevs.get(&bdev.uuid_string()).is_some() {
        return Err(RpcError::errno(EEXIST));
    }
    let name = bdev.name.clone();
    bdevs.insert_with_file(bdev, file, size)?;
    Ok(json!(name))
}

impl BdevModule for Modules {
    fn destruct(&mut self, bdev: &Bdev, _bdevs: &mut Bdevs) {
        if let BdevKind::Malloc { file } | BdevKind::Null { file } = &bdev.kind {
            let _ = std::fs::remove_file(file);
        }
    }

    fn dump(&self, bdev: &Bdev) -> Option<Value> {
        match &bdev.kind {
            BdevKind::Aio {
                filename,
                readonly,
                block_size_override,
                fallocate,
            } => Some(json!({"aio": {
                "filename": filename.to_string_lossy(),
                "block_size_override": block_size_override,
                "readonly": readonly,
                "fallocate": fallocate
            }})),
            BdevKind::Malloc { .. } | BdevKind::Null { .. } => Some(json!({})),
            _ => None,
        }
    }
}

impl BdevUser for Modules {}

/// The formats malloc and null bdevs are emulated in: a positive number of
/// whole 512-byte sectors per block, without metadata or DIF.
fn check_data_only_format(
    num_blocks: u64,
    block_size: u32,
    md_size: Option<u32>,
    dif_type: Option<u32>,
) -> Result<(), RpcError> {
    if num_blocks == 0
        || block_size == 0
        || !block_size.is_multiple_of(512)
        || md_size.unwrap_or(0) != 0
        || dif_type.unwrap_or(0) != 0
    {
        return Err(RpcError::errno(EINVAL));
    }
    Ok(())
}

/// Size in bytes and logical block size (0 for regular files) of a file or block device.
fn probe(file: &mut File) -> std::io::Result<(u64, u32)> {
    let meta = file.metadata()?;
    if !meta.file_type().is_block_device() {
        return Ok((meta.len(), 0));
    }
    let size = file.seek(SeekFrom::End(0))?;
    Ok((size, logical_block_size(meta.rdev())))
}

fn logical_block_size(rdev: u64) -> u32 {
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    let dev = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let mut candidates = vec![dev.join("queue/logical_block_size")];
    // A partition has no queue of its own; its disk is the parent directory.
    if let Ok(real) = dev.canonicalize()
        && let Some(parent) = real.parent()
    {
        candidates.push(parent.join("queue/logical_block_size"));
    }
    candidates
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok()?.trim().parse().ok())
        .unwrap_or(512)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AioCreateParams {
    name: String,
    filename: String,
    block_size: Option<u32>,
    #[serde(default)]
    readonly: bool,
    #[serde(default)]
    fallocate: bool,
    uuid: Option<Uuid>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NameParams {
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Metadata/DIF options are accepted and checked, but not emulated.
struct MallocCreateParams {
    name: Option<String>,
    uuid: Option<Uuid>,
    num_blocks: u64,
    block_size: u32,
    physical_block_size: Option<u32>,
    optimal_io_boundary: Option<u32>,
    md_size: Option<u32>,
    md_interleave: Option<bool>,
    dif_type: Option<u32>,
    dif_is_head_of_md: Option<bool>,
    dif_pi_format: Option<u32>,
    numa_id: Option<i32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Metadata/DIF options are accepted and checked, but not emulated.
struct NullCreateParams {
    name: String,
    uuid: Option<Uuid>,
    num_blocks: u64,
    block_size: u32,
    physical_block_size: Option<u32>,
    md_size: Option<u32>,
    dif_type: Option<u32>,
    dif_is_head_of_md: Option<bool>,
    dif_pi_format: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malloc_names_count_like_spdk() {
        let mut m = Modules::new(PathBuf::from("/nonexistent"));
        assert_eq!(m.next_malloc_name(), "Malloc0");
        assert_eq!(m.next_malloc_name(), "Malloc1");
    }
}
