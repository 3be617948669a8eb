//! What an lvol store keeps on disk, so that, like SPDK's blobstore, it is
//! found again when its base bdev appears again (SPDK's examine): after a
//! `bdev_aio_delete` and `bdev_aio_create` of the same file, or after the
//! emulator was killed and started again on the same state directory.
//!
//! - The base's first bytes hold a superblock naming the store
//!   ([`write_superblock`]), which `bdev_lvol_delete_lvstore` erases.
//! - The store's metadata (`store.json`, rewritten after every change) and
//!   its lvols' files live in `<state>/lvstores/lvs-<uuid>/`, which, unlike
//!   `<state>/bdevs`, neither a start nor a stop wipes.
//!
//! Only an aio bdev is examined: a malloc or null bdev starts zeroed, as
//! SPDK's does, so no store is ever found on one.

use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::registry::{Bdev, BdevKind};

/// A superblock is this, the store's UUID, and a newline.
const MAGIC: &[u8] = b"snap-emu lvstore ";
const SUPERBLOCK_LEN: usize = MAGIC.len() + 36 + 1;
const METADATA: &str = "store.json";

/// Where the stores keep their metadata and lvols.
pub(crate) fn stores_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("lvstores")
}

/// The file under a base whose bytes outlive the bdev (an aio bdev's).
pub(super) fn base_file(bdev: &Bdev) -> Option<&Path> {
    match &bdev.kind {
        BdevKind::Aio {
            filename,
            readonly: false,
            ..
        } => Some(filename),
        _ => None,
    }
}

pub(super) fn write_superblock(base: &Path, store: Uuid) -> io::Result<()> {
    let mut block = MAGIC.to_vec();
    block.extend_from_slice(store.hyphenated().to_string().as_bytes());
    block.push(b'\n');
    let file = std::fs::OpenOptions::new().write(true).open(base)?;
    file.write_all_at(&block, 0)?;
    file.sync_data()
}

/// Zeroes the superblock, if the base still carries this store's.
pub(super) fn erase_superblock(base: &Path, store: Uuid) -> io::Result<()> {
    if read_superblock(base) != Some(store) {
        return Ok(());
    }
    let file = std::fs::OpenOptions::new().write(true).open(base)?;
    file.write_all_at(&[0; SUPERBLOCK_LEN], 0)?;
    file.sync_data()
}

/// The store a base's superblock names, if it has one.
pub(super) fn read_superblock(base: &Path) -> Option<Uuid> {
    let mut block = [0u8; SUPERBLOCK_LEN];
    std::fs::File::open(base)
        .and_then(|mut f| f.read_exact(&mut block))
        .ok()?;
    let rest = block.strip_prefix(MAGIC)?.strip_suffix(b"\n")?;
    Uuid::try_parse_ascii(rest).ok()
}

/// Writes a store's metadata whole into its directory `dir`, through a
/// rename, so that a kill leaves the old or the new and never half of one.
pub(super) fn save(dir: &Path, metadata: &impl Serialize) -> io::Result<()> {
    let json = serde_json::to_vec_pretty(metadata).map_err(io::Error::other)?;
    let tmp = dir.join(format!("{METADATA}.tmp"));
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(&json)?;
    file.sync_data()?;
    std::fs::rename(&tmp, dir.join(METADATA))
}

/// A store's metadata as last saved in its directory `dir`.
pub(super) fn load<T: DeserializeOwned>(dir: &Path) -> io::Result<T> {
    serde_json::from_slice(&std::fs::read(dir.join(METADATA))?).map_err(io::Error::other)
}

pub(super) fn store_dir(stores_dir: &Path, uuid: Uuid) -> PathBuf {
    stores_dir.join(format!("lvs-{uuid}"))
}

pub(super) fn lvol_file(store_dir: &Path, uuid: Uuid) -> PathBuf {
    store_dir.join(format!("{uuid}.img"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_superblock_names_its_store_until_erased() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("pool.img");
        std::fs::write(&base, vec![0xa5; 8192]).unwrap();
        assert_eq!(read_superblock(&base), None);
        let store = Uuid::new_v4();
        write_superblock(&base, store).unwrap();
        assert_eq!(read_superblock(&base), Some(store));
        // Another store's erase leaves it.
        erase_superblock(&base, Uuid::new_v4()).unwrap();
        assert_eq!(read_superblock(&base), Some(store));
        erase_superblock(&base, store).unwrap();
        assert_eq!(read_superblock(&base), None);
        // Only the superblock's bytes changed.
        let bytes = std::fs::read(&base).unwrap();
        assert_eq!(bytes.len(), 8192);
        assert!(bytes[SUPERBLOCK_LEN..].iter().all(|&b| b == 0xa5));
    }
}
