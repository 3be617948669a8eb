//! SPDK's bdev layer as every family sees it: the registry of bdevs
//! ([`Bdevs`]), what each bdev is ([`Bdev`], [`BdevKind`]), where its bytes
//! are and which bdevs its I/O passes ([`Bdevs::backing_of`],
//! [`Bdevs::volume`]), and the part of `bdev_get_bdevs` common to all.
//!
//! Every bdev is real storage: aio opens the named file or block device,
//! while malloc and null get a sparse file of their own under `<state>/bdevs`
//! (so a "null" bdev keeps what is written to it, unlike SPDK's, which
//! discards it; that is the price of being able to expose it as a loop
//! device), and lvols are files of their store.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::datapath::qos::RateLimit;
use crate::datapath::volume::{Backing, BdevIo, Volume};
use crate::rpc::{EEXIST, ENODEV, ENOMEM, RpcError};

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
        /// The bdev under its store, which its I/O reaches.
        base: String,
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

    pub fn uuid_string(&self) -> String {
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
}

impl Bdevs {
    /// Where a bdev's bytes are.
    pub fn backing_of(&self, bdev: &Bdev) -> Backing {
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
            BdevKind::Crypto { base, .. } => match self.get(base) {
                Some(base) => self.backing_of(base),
                None => file(&PathBuf::new()),
            },
        }
    }

    /// The bdev whose backing holds `bdev`'s bytes: a crypto vbdev's base
    /// (down to one that is not a crypto vbdev), any other bdev itself.
    pub fn bytes_of<'a>(&'a self, bdev: &'a Bdev) -> &'a Bdev {
        match &bdev.kind {
            BdevKind::Crypto { base, .. } => self.get(base).map_or(bdev, |b| self.bytes_of(b)),
            _ => bdev,
        }
    }

    /// The bdev and every bdev its I/O passes through, top first.
    pub fn io_layers(&self, bdev: &Bdev) -> Vec<Arc<BdevIo>> {
        let mut layers = vec![Arc::clone(&bdev.io)];
        let under = match &bdev.kind {
            // An lvol's blobstore writes to the bdev under its store.
            BdevKind::Lvol { base, .. } | BdevKind::Crypto { base, .. } => self.get(base),
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

    /// What the data path serves for `bdev`, as far as the bdev layer knows:
    /// its bytes and the bdevs its I/O passes. Its module adds the rest (see
    /// `crate::registry::BdevModule::io_path`).
    pub fn volume(&self, bdev: &Bdev) -> Volume {
        Volume {
            backing: self.backing_of(bdev),
            block_size: bdev.block_size,
            layers: self.io_layers(bdev),
            cipher: None,
            remote: None,
        }
    }

    /// One element of `bdev_get_bdevs`, in `rpc_dump_bdev_info` order, with
    /// the module's `driver_specific`.
    pub fn json(&self, bdev: &Bdev, driver_specific: Value) -> Value {
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
        if let Some(domains) = self.memory_domains(bdev, &driver_specific) {
            o.insert("memory_domains".into(), domains);
        }
        o.insert("driver_specific".into(), driver_specific);
        Value::Object(o)
    }

    fn memory_domains(&self, bdev: &Bdev, driver_specific: &Value) -> Option<Value> {
        match &bdev.kind {
            // An lvol reports the domains of the bdev under its store.
            BdevKind::Lvol { base, .. } => memory_domains_of(&self.get(base)?.kind),
            // A TCP controller's one domain for each path (each namespace
            // its module lists), as `bdev_nvme_get_memory_domains` gathers.
            BdevKind::Nvme(_) => {
                let paths = driver_specific["nvme"].as_array().map_or(0, Vec::len);
                let system = json!({"dma_device_id": "system", "dma_device_type": 1});
                (paths > 0).then(|| json!(vec![system; paths]))
            }
            kind => memory_domains_of(kind),
        }
    }

    /// Registers a bdev over a new sparse file of `size` bytes at `file`; the
    /// file is removed again if the registration fails.
    pub fn insert_with_file(&mut self, bdev: Bdev, file: &Path, size: u64) -> Result<(), RpcError> {
        create_sparse(file, size)?;
        self.insert(bdev).inspect_err(|_| {
            let _ = std::fs::remove_file(file);
        })
    }

    /// Resolves a name for a module's delete: another module's bdev is -ENODEV,
    /// as `spdk_bdev_unregister_by_name` with the wrong module answers.
    pub fn of_module(
        &self,
        name: &str,
        is_mine: impl Fn(&BdevKind) -> bool,
    ) -> Result<String, RpcError> {
        match self.get(name) {
            Some(b) if is_mine(&b.kind) => Ok(b.name.clone()),
            _ => Err(RpcError::errno(ENODEV)),
        }
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

fn memory_domains_of(kind: &BdevKind) -> Option<Value> {
    match kind {
        BdevKind::Malloc { .. } => Some(json!([
            {"dma_device_id": "system", "dma_device_type": 1},
            {"dma_device_id": "SPDK_ACCEL_DMA_DEVICE", "dma_device_type": 2}
        ])),
        _ => None,
    }
}

/// Our files (malloc, null, lvol) live here; wiped at start and stop.
pub(crate) fn files_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("bdevs")
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
    fn io_errors_keep_the_strerror_text() {
        let e = std::fs::File::open("/nonexistent/file").unwrap_err();
        assert_eq!(io_error(&e), RpcError::new(-2, "No such file or directory"));
    }
}
