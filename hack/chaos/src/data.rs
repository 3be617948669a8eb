//! The known pattern each volume carries: seeded bytes at a seeded place, and
//! their checksum, written through the published path and read back after
//! every restage. A block volume holds it at an offset past where a
//! partition table would go; a filesystem in a file.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::rng::Rng;

/// Where a pattern was written and what it must read back as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    seed: u64,
    offset: u64,
    len: usize,
    checksum: u64,
}

/// What reading a pattern back found.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Intact,
    /// The bytes differ: how many, and the first that does.
    Differs {
        bytes: usize,
        first: usize,
    },
}

impl Pattern {
    /// A new pattern (64 KiB to 1 MiB; on a block device within its first
    /// 64 MiB, 4 KiB aligned).
    pub fn new(rng: &mut Rng, block: bool) -> Pattern {
        let len = usize::try_from(rng.range(16, 256) * 4096).unwrap_or(4096);
        let offset = if block {
            (4 << 20) + rng.range(0, 14_000) * 4096
        } else {
            rng.range(0, 256) * 4096
        };
        let seed = rng.next();
        let checksum = fnv1a(&bytes(seed, len));
        Pattern {
            seed,
            offset,
            len,
            checksum,
        }
    }

    /// Writes the pattern through `target` and flushes it to the device.
    pub fn write(&self, target: &Path, block: bool) -> anyhow::Result<()> {
        let path = data_path(target, block);
        let mut file = OpenOptions::new()
            .write(true)
            .create(!block)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("opening {} to write", path.display()))?;
        file.seek(SeekFrom::Start(self.offset))?;
        file.write_all(&bytes(self.seed, self.len))
            .with_context(|| format!("writing {}", path.display()))?;
        file.sync_all()
            .with_context(|| format!("fsync {}", path.display()))?;
        Ok(())
    }

    /// Reads the pattern back through `target` and compares it.
    pub fn verify(&self, target: &Path, block: bool) -> anyhow::Result<Verdict> {
        let path = data_path(target, block);
        let mut file =
            File::open(&path).with_context(|| format!("opening {} to read", path.display()))?;
        file.seek(SeekFrom::Start(self.offset))?;
        let mut back = vec![0; self.len];
        file.read_exact(&mut back)
            .with_context(|| format!("reading {}", path.display()))?;
        if fnv1a(&back) == self.checksum {
            return Ok(Verdict::Intact);
        }
        let expected = bytes(self.seed, self.len);
        let differing: Vec<usize> = (0..self.len).filter(|&i| back[i] != expected[i]).collect();
        Ok(Verdict::Differs {
            bytes: differing.len(),
            first: differing.first().copied().unwrap_or(0),
        })
    }

    pub fn describe(&self) -> String {
        format!(
            "{} bytes at {} (seed {:#x}, checksum {:#x})",
            self.len, self.offset, self.seed, self.checksum
        )
    }
}

fn data_path(target: &Path, block: bool) -> PathBuf {
    if block {
        target.to_path_buf()
    } else {
        target.join("chaos.bin")
    }
}

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut data = Vec::with_capacity(len + 8);
    while data.len() < len {
        data.extend_from_slice(&rng.next().to_le_bytes());
    }
    data.truncate(len);
    data
}

/// FNV-1a, 64 bits: enough to tell a changed byte, and needs no crate.
fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_reads_back_intact_and_a_flipped_byte_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = Rng::new(11);
        let pattern = Pattern::new(&mut rng, false);
        pattern.write(dir.path(), false).unwrap();
        assert_eq!(pattern.verify(dir.path(), false).unwrap(), Verdict::Intact);

        let path = dir.path().join("chaos.bin");
        let mut file = OpenOptions::new().write(true).open(&path).unwrap();
        file.seek(SeekFrom::Start(pattern.offset + 5)).unwrap();
        let flipped = !bytes(pattern.seed, 6)[5];
        file.write_all(&[flipped]).unwrap();
        assert_eq!(
            pattern.verify(dir.path(), false).unwrap(),
            Verdict::Differs { bytes: 1, first: 5 }
        );
    }
}
