//! Block devices (bdevs): the registry, their JSON, and the aio/malloc/null modules.
//!
//! Every bdev is real storage: aio opens the named file or block device, while
//! malloc and null get a sparse file of their own under `<state>/bdevs` (so a
//! "null" bdev keeps what is written to it, unlike SPDK's, which discards it;
//! that is the price of being able to expose it as a loop device). Each bdev
//! yields a [`Backing`] that the host side and NVMe-oF initiators reuse.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::datapath::qos::RateLimit;
use crate::datapath::volume::{Backing, BdevIo, Volume};
use crate::rpc::{
    EEXIST, EINVAL, ENODEV, ENOMEM, OnDecodeError, RpcError, RpcResult, decode, decode_opt,
};
use crate::state::Emulator;

/// The order SPDK v24.09 prints `supported_io_types` in (enum spdk_bdev_io_type).
pub(crate) const IO_TYPES: [&str; 20] = [
    "read",
    "write",
    "unmap",
    "flush",
    "reset",
    "nvme_admin",
    "nvme_io",
    "nvme_io_md",
    "write_zeroes",
    "zcopy",
    "get_zone_info",
    "zone_management",
    "zone_append",
    "compare",
    "compare_and_write",
    "abort",
    "seek_hole",
    "seek_data",
    "copy",
    "nvme_iov_md",
];

/// What an NVMe-oF initiator bdev knows about its remote namespace.
#[derive(Debug, Clone)]
pub(crate) struct NvmeNsInfo {
    pub ctrlr: String,
    pub nsid: u32,
    pub backing: Backing,
    /// Whether the remote controller advertises DSM (unmap) and Copy.
    pub unmap: bool,
    pub copy: bool,
}

#[derive(Debug, Clone)]
pub(crate) enum BdevKind {
    Aio {
        filename: PathBuf,
        readonly: bool,
        block_size_override: bool,
        fallocate: bool,
    },
    Malloc {
        file: PathBuf,
    },
    Null {
        file: PathBuf,
    },
    Lvol {
        lvs_uuid: Uuid,
        file: PathBuf,
        /// A snapshot: SPDK refuses writes to it.
        read_only: bool,
    },
    Nvme(NvmeNsInfo),
    /// A crypto vbdev: the blocks of `base`, encrypted with the accel key `key_name`.
    Crypto {
        base: String,
        key_name: String,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct Bdev {
    pub name: String,
    /// Aliases other than the UUID, which SPDK adds on registration itself.
    pub aliases: Vec<String>,
    pub uuid: Uuid,
    pub product_name: &'static str,
    pub block_size: u32,
    pub num_blocks: u64,
    /// The module holding an `exclusive_write` claim, if any.
    pub claim: Option<&'static str>,
    pub kind: BdevKind,
    /// Rate limits and data path counters, shared with the data path.
    pub io: Arc<BdevIo>,
}

impl Bdev {
    pub fn size_bytes(&self) -> u64 {
        self.num_blocks.saturating_mul(u64::from(self.block_size))
    }

    fn uuid_string(&self) -> String {
        self.uuid.to_string()
    }

    /// Name, aliases and UUID: everything `spdk_bdev_get_by_name` matches.
    fn answers_to(&self, name: &str) -> bool {
        self.name == name || self.aliases.iter().any(|a| a == name) || self.uuid_string() == name
    }

    /// The aliases SPDK lists: the UUID first unless it already is the name.
    fn listed_aliases(&self) -> Vec<String> {
        let uuid = self.uuid_string();
        let mut out = Vec::with_capacity(self.aliases.len() + 1);
        if uuid != self.name {
            out.push(uuid);
        }
        out.extend(self.aliases.iter().cloned());
        out
    }

    fn io_type_supported(&self, io: &str) -> bool {
        let writable = !matches!(
            self.kind,
            BdevKind::Aio { readonly: true, .. }
                | BdevKind::Lvol {
                    read_only: true,
                    ..
                }
        );
        // The bdev layer emulates write_zeroes for any writable bdev.
        if io == "write_zeroes" {
            return writable;
        }
        match &self.kind {
            BdevKind::Malloc { .. } => matches!(
                io,
                "read" | "write" | "unmap" | "flush" | "reset" | "zcopy" | "abort" | "copy"
            ),
            BdevKind::Null { .. } => matches!(io, "read" | "write" | "reset" | "abort"),
            BdevKind::Aio { fallocate, .. } => match io {
                "read" | "flush" | "reset" => true,
                "write" => writable,
                "unmap" => *fallocate && writable,
                _ => false,
            },
            BdevKind::Lvol { .. } => match io {
                "read" | "reset" | "seek_hole" | "seek_data" => true,
                "write" | "unmap" => writable,
                _ => false,
            },
            BdevKind::Nvme(info) => match io {
                "read" | "write" | "flush" | "reset" | "nvme_admin" | "nvme_io" | "compare"
                | "compare_and_write" | "abort" => true,
                "unmap" => info.unmap,
                "copy" => info.copy,
                _ => false,
            },
            // vbdev_crypto_io_type_supported passes these to the base; the
            // emulator's crypto bdevs sit on writable bdevs with them all.
            BdevKind::Crypto { .. } => {
                matches!(io, "read" | "write" | "unmap" | "flush" | "reset")
            }
        }
    }
}

/// All bdevs in registration order, which is the order SPDK lists them in.
#[derive(Debug, Default)]
pub(crate) struct Bdevs {
    list: Vec<Bdev>,
    /// SPDK's `malloc_disk_count`: only unnamed malloc bdevs advance it.
    malloc_count: u32,
}

impl Bdevs {
    pub fn get(&self, name: &str) -> Option<&Bdev> {
        self.list.iter().find(|b| b.answers_to(name))
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut Bdev> {
        self.list.iter_mut().find(|b| b.answers_to(name))
    }

    pub fn iter(&self) -> impl Iterator<Item = &Bdev> {
        self.list.iter()
    }

    /// Registers a bdev; any clash of name, alias or UUID is -EEXIST, as in `bdev_name_add`.
    pub fn insert(&mut self, bdev: Bdev) -> Result<(), RpcError> {
        let mut names = vec![bdev.name.clone(), bdev.uuid_string()];
        names.extend(bdev.aliases.iter().cloned());
        if names.iter().any(|n| self.get(n).is_some()) {
            return Err(RpcError::errno(EEXIST));
        }
        self.list.push(bdev);
        Ok(())
    }

    /// Removes by real name.
    pub fn remove(&mut self, name: &str) -> Option<Bdev> {
        let pos = self.list.iter().position(|b| b.name == name)?;
        Some(self.list.remove(pos))
    }

    fn next_malloc_name(&mut self) -> String {
        let name = format!("Malloc{}", self.malloc_count);
        self.malloc_count += 1;
        name
    }
}

/// `assigned_rate_limits` as `spdk_bdev_get_qos_rate_limits` shows them:
/// IOPS as set, bandwidth in whole MiB/s, 0 where there is no limit.
fn assigned_rate_limits(bdev: &Bdev) -> Value {
    let limits = bdev.io.qos.limits();
    let map: serde_json::Map<String, Value> = RateLimit::ALL
        .iter()
        .zip(limits)
        .map(|(kind, limit)| {
            let shown = if kind.is_iops() { limit } else { limit >> 20 };
            (kind.rpc_name().to_owned(), json!(shown))
        })
        .collect();
    Value::Object(map)
}

/// Turns an I/O error into SPDK's `-errno, strerror(errno)` reply.
pub(crate) fn io_error(e: &std::io::Error) -> RpcError {
    let errno = e.raw_os_error().unwrap_or(crate::rpc::EIO);
    let text = e.to_string();
    let message = match text.find(" (os error") {
        Some(i) => text[..i].to_owned(),
        None => text,
    };
    RpcError::new(-errno, message)
}

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

/// Creates (or truncates) a sparse file of `size` bytes.
fn create_sparse(path: &Path, size: u64) -> Result<(), RpcError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|_| RpcError::errno(ENOMEM))?;
    }
    let f = File::create(path).map_err(|_| RpcError::errno(ENOMEM))?;
    f.set_len(size).map_err(|_| {
        let _ = std::fs::remove_file(path);
        RpcError::errno(ENOMEM)
    })
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

fn memory_domains_of(kind: &BdevKind) -> Option<Value> {
    match kind {
        BdevKind::Malloc { .. } => Some(json!([
            {"dma_device_id": "system", "dma_device_type": 1},
            {"dma_device_id": "SPDK_ACCEL_DMA_DEVICE", "dma_device_type": 2}
        ])),
        _ => None,
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct GetBdevsParams {
    name: Option<String>,
    #[serde(default)]
    #[allow(dead_code)] // Waiting is done by the dispatcher, which reads it separately.
    timeout: Option<u64>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct GetIostatParams {
    name: Option<String>,
    #[serde(default)]
    per_channel: bool,
    #[serde(default)]
    reset_mode: Option<String>,
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

/// Our files (malloc, null, lvol) live here; wiped at start and stop.
pub(crate) fn files_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("bdevs")
}

impl Emulator {
    /// Where a bdev's bytes are.
    pub(crate) fn backing_of(&self, bdev: &Bdev) -> Backing {
        let size = bdev.size_bytes();
        let file = |path: &PathBuf| Backing {
            path: path.clone(),
            offset: 0,
            size,
            read_only: false,
        };
        match &bdev.kind {
            BdevKind::Aio {
                filename, readonly, ..
            } => Backing {
                path: filename.clone(),
                offset: 0,
                size,
                read_only: *readonly,
            },
            BdevKind::Malloc { file: f } | BdevKind::Null { file: f } => file(f),
            BdevKind::Lvol {
                file: f, read_only, ..
            } => Backing {
                read_only: *read_only,
                ..file(f)
            },
            BdevKind::Nvme(info) => Backing {
                size: size.min(info.backing.size),
                ..info.backing.clone()
            },
            // The ciphertext lives in the base's bytes; only a data path that
            // applies the cipher may expose it (see `crate::datapath`).
            BdevKind::Crypto { base, .. } => match self.bdevs.get(base) {
                Some(base) => self.backing_of(base),
                None => file(&PathBuf::new()),
            },
        }
    }

    /// One element of `bdev_get_bdevs`, in `rpc_dump_bdev_info` order.
    pub(crate) fn bdev_json(&self, bdev: &Bdev) -> Value {
        let mut o = serde_json::Map::new();
        o.insert("name".into(), json!(bdev.name));
        o.insert("aliases".into(), json!(bdev.listed_aliases()));
        o.insert("product_name".into(), json!(bdev.product_name));
        o.insert("block_size".into(), json!(bdev.block_size));
        o.insert("num_blocks".into(), json!(bdev.num_blocks));
        o.insert("uuid".into(), json!(bdev.uuid_string()));
        if matches!(bdev.kind, BdevKind::Nvme(_)) {
            // A fabrics controller has no NUMA affinity: SPDK_ENV_NUMA_ID_ANY.
            o.insert("numa_id".into(), json!(-1));
        }
        o.insert("assigned_rate_limits".into(), assigned_rate_limits(bdev));
        o.insert("claimed".into(), json!(bdev.claim.is_some()));
        if bdev.claim.is_some() {
            o.insert("claim_type".into(), json!("exclusive_write"));
        }
        o.insert("zoned".into(), json!(false));
        let io: serde_json::Map<String, Value> = IO_TYPES
            .iter()
            .map(|t| ((*t).to_owned(), json!(bdev.io_type_supported(t))))
            .collect();
        o.insert("supported_io_types".into(), Value::Object(io));
        if let Some(domains) = self.memory_domains(bdev) {
            o.insert("memory_domains".into(), domains);
        }
        o.insert("driver_specific".into(), self.driver_specific(bdev));
        Value::Object(o)
    }

    fn memory_domains(&self, bdev: &Bdev) -> Option<Value> {
        match &bdev.kind {
            // An lvol reports the domains of the bdev under its store.
            BdevKind::Lvol { lvs_uuid, .. } => {
                let lvs = self.lvstores.iter().find(|s| s.uuid == *lvs_uuid)?;
                memory_domains_of(&self.bdevs.get(&lvs.base_bdev)?.kind)
            }
            kind => memory_domains_of(kind),
        }
    }

    fn driver_specific(&self, bdev: &Bdev) -> Value {
        match &bdev.kind {
            BdevKind::Aio {
                filename,
                readonly,
                block_size_override,
                fallocate,
            } => json!({"aio": {
                "filename": filename.to_string_lossy(),
                "block_size_override": block_size_override,
                "readonly": readonly,
                "fallocate": fallocate
            }}),
            BdevKind::Malloc { .. } | BdevKind::Null { .. } => json!({}),
            BdevKind::Lvol { .. } => self.lvol_driver_specific(bdev),
            BdevKind::Nvme(_) => self.nvme_driver_specific(bdev),
            BdevKind::Crypto { .. } => self.crypto_driver_specific(bdev),
        }
    }

    pub(crate) fn bdev_get_bdevs(&self, params: Option<Value>) -> RpcResult {
        let p: GetBdevsParams = decode_opt(params, OnDecodeError::DecodeFailed)?;
        match p.name {
            Some(name) => {
                let bdev = self.bdevs.get(&name).ok_or(RpcError::errno(ENODEV))?;
                Ok(json!([self.bdev_json(bdev)]))
            }
            None => Ok(Value::Array(
                self.bdevs.iter().map(|b| self.bdev_json(b)).collect(),
            )),
        }
    }

    pub(crate) fn bdev_get_iostat(&self, params: Option<Value>) -> RpcResult {
        let p: GetIostatParams = decode_opt(params, OnDecodeError::DecodeFailed)?;
        if let Some(mode) = &p.reset_mode
            && !matches!(mode.as_str(), "all" | "maxmin" | "error" | "none")
        {
            return Err(RpcError::decode_failed());
        }
        let tick_rate = crate::datapath::stats::TICK_RATE;
        let ticks = self.ticks();
        if p.per_channel {
            let name = p.name.ok_or(RpcError::errno(EINVAL))?;
            let bdev = self.bdevs.get(&name).ok_or(RpcError::errno(ENODEV))?;
            // SPDK lists the threads holding an I/O channel to the bdev: none
            // while no module uses it; one (the emulator has one thread) once
            // something does.
            let mut channels = vec![];
            if bdev.claim.is_some() || self.bdev_has_writers(&bdev.name) {
                let mut ch = serde_json::Map::new();
                ch.insert("thread_id".into(), json!(1));
                self.io_stat_into(bdev, &mut ch);
                channels.push(Value::Object(ch));
            }
            return Ok(json!({
                "tick_rate": tick_rate,
                "ticks": ticks,
                "name": bdev.name,
                "channels": channels
            }));
        }
        let selected: Vec<&Bdev> = match &p.name {
            Some(name) => vec![self.bdevs.get(name).ok_or(RpcError::errno(ENODEV))?],
            None => self.bdevs.iter().collect(),
        };
        let bdevs: Vec<Value> = selected
            .into_iter()
            .map(|b| {
                let mut o = serde_json::Map::new();
                o.insert("name".into(), json!(b.name));
                self.io_stat_into(b, &mut o);
                if matches!(b.kind, BdevKind::Nvme(_)) {
                    // bdev_nvme has dump_device_stat_json; it is empty without error stats.
                    o.insert("driver_specific".into(), json!({}));
                }
                Value::Object(o)
            })
            .collect();
        Ok(json!({"tick_rate": tick_rate, "ticks": ticks, "bdevs": bdevs}))
    }

    /// `spdk_bdev_dump_io_stat_json`: what the data path served through the
    /// bdev (as the exposed bdev or one under it), plus the kernel's
    /// counters of the loop devices exposing it directly (which know no
    /// latency extremes). Zeros while nothing exposes it.
    fn io_stat_into(&self, bdev: &Bdev, o: &mut serde_json::Map<String, Value>) {
        let s = self.host_io_stat(&bdev.name);
        let d = bdev.io.stats.snapshot();
        let ms_to_ticks = |ms: u64| ms.saturating_mul(crate::datapath::stats::TICK_RATE / 1000);
        let fields: [(&str, u64); 20] = [
            (
                "bytes_read",
                s.read_sectors.saturating_mul(512) + d.read.bytes,
            ),
            ("num_read_ops", s.read_ios + d.read.ops),
            (
                "bytes_written",
                s.write_sectors.saturating_mul(512) + d.write.bytes,
            ),
            ("num_write_ops", s.write_ios + d.write.ops),
            (
                "bytes_unmapped",
                s.discard_sectors.saturating_mul(512) + d.unmap.bytes,
            ),
            ("num_unmap_ops", s.discard_ios + d.unmap.ops),
            ("bytes_copied", 0),
            ("num_copy_ops", 0),
            ("read_latency_ticks", ms_to_ticks(s.read_ms) + d.read.ticks),
            ("max_read_latency_ticks", d.read.max_ticks),
            ("min_read_latency_ticks", d.read.min_ticks),
            (
                "write_latency_ticks",
                ms_to_ticks(s.write_ms) + d.write.ticks,
            ),
            ("max_write_latency_ticks", d.write.max_ticks),
            ("min_write_latency_ticks", d.write.min_ticks),
            (
                "unmap_latency_ticks",
                ms_to_ticks(s.discard_ms) + d.unmap.ticks,
            ),
            ("max_unmap_latency_ticks", d.unmap.max_ticks),
            ("min_unmap_latency_ticks", d.unmap.min_ticks),
            ("copy_latency_ticks", 0),
            ("max_copy_latency_ticks", 0),
            ("min_copy_latency_ticks", 0),
        ];
        for (k, v) in fields {
            o.insert(k.into(), json!(v));
        }
        o.insert("io_error".into(), json!({}));
    }

    pub(crate) fn bdev_aio_create(&mut self, params: Option<Value>) -> RpcResult {
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
        self.bdevs.insert(Bdev {
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

    pub(crate) fn bdev_aio_delete(&mut self, params: Option<Value>) -> RpcResult {
        self.delete_module_bdev(params, |k| matches!(k, BdevKind::Aio { .. }))
    }

    pub(crate) fn bdev_aio_rescan(&mut self, params: Option<Value>) -> RpcResult {
        let p: NameParams = decode(params, OnDecodeError::DecodeFailed)?;
        let name = self.module_bdev(&p.name, |k| matches!(k, BdevKind::Aio { .. }))?;
        let bdev = self.bdevs.get(&name).ok_or(RpcError::errno(ENODEV))?;
        let BdevKind::Aio { filename, .. } = &bdev.kind else {
            return Err(RpcError::errno(ENODEV));
        };
        let mut file = File::open(filename).map_err(|e| io_error(&e))?;
        let (size, _) = probe(&mut file).map_err(|e| io_error(&e))?;
        let num_blocks = size / u64::from(bdev.block_size);
        if num_blocks != bdev.num_blocks {
            if let Some(b) = self.bdevs.get_mut(&name) {
                b.num_blocks = num_blocks;
            }
            self.bdev_resized(&name);
        }
        Ok(json!(true))
    }

    pub(crate) fn bdev_malloc_create(&mut self, params: Option<Value>) -> RpcResult {
        let p: MallocCreateParams = decode(params, OnDecodeError::DecodeFailed)?;
        check_data_only_format(p.num_blocks, p.block_size, p.md_size, p.dif_type)?;
        // The number is taken before the size is checked (in
        // `register_file_bdev`): a create that fails on its size uses one up.
        let name = match p.name {
            Some(n) => n,
            None => self.bdevs.next_malloc_name(),
        };
        self.register_file_bdev(
            name,
            p.uuid.unwrap_or_else(Uuid::new_v4),
            "Malloc disk",
            p.block_size,
            p.num_blocks,
            |file| BdevKind::Malloc { file },
        )
    }

    pub(crate) fn bdev_malloc_delete(&mut self, params: Option<Value>) -> RpcResult {
        self.delete_module_bdev(params, |k| matches!(k, BdevKind::Malloc { .. }))
    }

    pub(crate) fn bdev_null_create(&mut self, params: Option<Value>) -> RpcResult {
        let p: NullCreateParams = decode(params, OnDecodeError::DecodeFailed)?;
        check_data_only_format(p.num_blocks, p.block_size, p.md_size, p.dif_type)?;
        self.register_file_bdev(
            p.name,
            p.uuid.unwrap_or_else(Uuid::new_v4),
            "Null disk",
            p.block_size,
            p.num_blocks,
            |file| BdevKind::Null { file },
        )
    }

    pub(crate) fn bdev_null_delete(&mut self, params: Option<Value>) -> RpcResult {
        self.delete_module_bdev(params, |k| matches!(k, BdevKind::Null { .. }))
    }

    /// Registers a malloc or null bdev over a sparse file of its own.
    fn register_file_bdev(
        &mut self,
        name: String,
        uuid: Uuid,
        product_name: &'static str,
        block_size: u32,
        num_blocks: u64,
        kind: impl FnOnce(PathBuf) -> BdevKind,
    ) -> RpcResult {
        let size = num_blocks
            .checked_mul(u64::from(block_size))
            .ok_or(RpcError::errno(ENOMEM))?;
        // Checked before the file is made: it is named by the UUID, and a
        // clash must not truncate the file of the bdev that holds that UUID.
        if self.bdevs.get(&name).is_some() || self.bdevs.get(&uuid.to_string()).is_some() {
            return Err(RpcError::errno(EEXIST));
        }
        let file = self.files_dir.join(format!("{uuid}.img"));
        let bdev = Bdev {
            name: name.clone(),
            aliases: vec![],
            uuid,
            product_name,
            block_size,
            num_blocks,
            claim: None,
            io: Default::default(),
            kind: kind(file.clone()),
        };
        self.register_with_file(bdev, &file, size)?;
        Ok(json!(name))
    }

    /// Registers a bdev over a new sparse file of `size` bytes at `file`; the
    /// file is removed again if the registration fails.
    pub(crate) fn register_with_file(
        &mut self,
        bdev: Bdev,
        file: &Path,
        size: u64,
    ) -> Result<(), RpcError> {
        create_sparse(file, size)?;
        self.bdevs.insert(bdev).inspect_err(|_| {
            let _ = std::fs::remove_file(file);
        })
    }

    /// `bdev_{aio,malloc,null}_delete`: alike but for whose bdevs they delete.
    fn delete_module_bdev(
        &mut self,
        params: Option<Value>,
        is_mine: impl Fn(&BdevKind) -> bool,
    ) -> RpcResult {
        let p: NameParams = decode(params, OnDecodeError::DecodeFailed)?;
        let name = self.module_bdev(&p.name, is_mine)?;
        self.unregister_bdev(&name);
        Ok(json!(true))
    }

    /// Resolves a name for a module's delete: another module's bdev is -ENODEV,
    /// as `spdk_bdev_unregister_by_name` with the wrong module answers.
    pub(crate) fn module_bdev(
        &self,
        name: &str,
        is_mine: impl Fn(&BdevKind) -> bool,
    ) -> Result<String, RpcError> {
        match self.bdevs.get(name) {
            Some(b) if is_mine(&b.kind) => Ok(b.name.clone()),
            _ => Err(RpcError::errno(ENODEV)),
        }
    }
}

impl Emulator {
    /// The bdev and every bdev its I/O passes through, top first.
    pub(crate) fn io_layers(&self, bdev: &Bdev) -> Vec<Arc<BdevIo>> {
        let mut layers = vec![Arc::clone(&bdev.io)];
        let under = match &bdev.kind {
            // An lvol's blobstore writes to the bdev under its store.
            BdevKind::Lvol { lvs_uuid, .. } => self
                .lvstores
                .iter()
                .find(|s| s.uuid == *lvs_uuid)
                .and_then(|s| self.bdevs.get(&s.base_bdev)),
            BdevKind::Crypto { base, .. } => self.bdevs.get(base),
            BdevKind::Aio { .. }
            | BdevKind::Malloc { .. }
            | BdevKind::Null { .. }
            | BdevKind::Nvme(_) => None,
        };
        if let Some(base) = under {
            layers.extend(self.io_layers(base));
        }
        layers
    }

    /// What the data path serves for `bdev`: its bytes, layers, cipher,
    /// and for an NVMe-oF namespace its target. A crypto bdev whose key
    /// is gone is -ENODEV.
    pub(crate) fn volume_of(&self, bdev: &Bdev) -> Result<Volume, RpcError> {
        let cipher = match &bdev.kind {
            BdevKind::Crypto { key_name, .. } => Some(
                self.crypto
                    .cipher(key_name)
                    .ok_or(RpcError::errno(ENODEV))?,
            ),
            _ => None,
        };
        Ok(Volume {
            backing: self.backing_of(bdev),
            block_size: bdev.block_size,
            layers: self.io_layers(bdev),
            cipher,
            remote: self.nvme_remote(bdev).map(Arc::new),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bdev(name: &str, aliases: &[&str]) -> Bdev {
        Bdev {
            name: name.into(),
            aliases: aliases.iter().map(|s| s.to_string()).collect(),
            uuid: Uuid::new_v4(),
            product_name: "Malloc disk",
            block_size: 512,
            num_blocks: 8,
            claim: None,
            io: Default::default(),
            kind: BdevKind::Malloc {
                file: PathBuf::from("/nonexistent"),
            },
        }
    }

    #[test]
    fn names_aliases_and_uuids_share_one_namespace() {
        let mut b = Bdevs::default();
        let first = bdev("a", &["lvs/x"]);
        let uuid = first.uuid.to_string();
        b.insert(first).unwrap();
        assert!(b.get("lvs/x").is_some());
        assert!(b.get(&uuid).is_some());
        assert_eq!(b.insert(bdev("lvs/x", &[])).unwrap_err().code, -17);
        assert_eq!(b.insert(bdev("b", &["a"])).unwrap_err().code, -17);
        assert!(b.insert(bdev("b", &[])).is_ok());
        assert_eq!(b.remove("a").map(|x| x.name), Some("a".into()));
    }

    #[test]
    fn uuid_alias_is_listed_unless_it_is_the_name() {
        let b = bdev("a", &[]);
        assert_eq!(b.listed_aliases(), vec![b.uuid.to_string()]);
        let mut l = bdev("x", &["lvs/l"]);
        l.name = l.uuid.to_string();
        assert_eq!(l.listed_aliases(), vec!["lvs/l".to_string()]);
    }

    #[test]
    fn malloc_names_count_like_spdk() {
        let mut b = Bdevs::default();
        assert_eq!(b.next_malloc_name(), "Malloc0");
        assert_eq!(b.next_malloc_name(), "Malloc1");
    }

    #[test]
    fn io_errors_keep_the_strerror_text() {
        let e = std::fs::File::open("/nonexistent/file").unwrap_err();
        assert_eq!(io_error(&e), RpcError::new(-2, "No such file or directory"));
    }
}
