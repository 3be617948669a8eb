//! AES-XTS over whole logical blocks, as SPDK's software accel module
//! (`accel_sw.c`, through ISA-L) applies it for a crypto vbdev: `key` the
//! data key, `key2` the tweak key, and the tweak of block `lba` SPDK's
//! `iv[0] = 0, iv[1] = lba` (eight zero bytes, then the LBA little-endian).

use aes::cipher::KeyInit;
use aes::{Aes128, Aes256};
use xts_mode::Xts128;

/// AES-XTS over whole logical blocks, as SPDK's software accel module does it.
pub(crate) enum Cipher {
    Xts128(Box<Xts128<Aes128>>),
    Xts256(Box<Xts128<Aes256>>),
}

impl std::fmt::Debug for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cipher(redacted)")
    }
}

/// SPDK's IV for a block: `uint64_t iv[2] = {0, lba}` in memory.
fn tweak(lba: u128) -> [u8; 16] {
    let mut t = [0u8; 16];
    // The index is an LBA, which SPDK keeps in 64 bits.
    t[8..].copy_from_slice(&(lba as u64).to_le_bytes());
    t
}

impl Cipher {
    /// `key` the data key, `key2` the tweak key, both 16 or 32 bytes.
    pub(crate) fn new(key: &[u8], key2: &[u8]) -> Option<Self> {
        match (key.len(), key2.len()) {
            (16, 16) => Some(Cipher::Xts128(Box::new(Xts128::new(
                Aes128::new_from_slice(key).ok()?,
                Aes128::new_from_slice(key2).ok()?,
            )))),
            (32, 32) => Some(Cipher::Xts256(Box::new(Xts128::new(
                Aes256::new_from_slice(key).ok()?,
                Aes256::new_from_slice(key2).ok()?,
            )))),
            _ => None,
        }
    }

    /// Encrypts `buf`, whole blocks of `block_size` starting at `first_lba`.
    pub(crate) fn encrypt(&self, first_lba: u64, block_size: u32, buf: &mut [u8]) {
        let (size, first) = (block_size as usize, u128::from(first_lba));
        match self {
            Cipher::Xts128(x) => x.encrypt_area(buf, size, first, tweak),
            Cipher::Xts256(x) => x.encrypt_area(buf, size, first, tweak),
        }
    }

    /// Decrypts `buf`, whole blocks of `block_size` starting at `first_lba`.
    pub(crate) fn decrypt(&self, first_lba: u64, block_size: u32, buf: &mut [u8]) {
        let (size, first) = (block_size as usize, u128::from(first_lba));
        match self {
            Cipher::Xts128(x) => x.decrypt_area(buf, size, first, tweak),
            Cipher::Xts256(x) => x.decrypt_area(buf, size, first, tweak),
        }
    }
}
