//! Where a pod uses its volume: on this machine (the emulated host, whose
//! mounts are this machine's), or in a guest host (`hack/local-up.sh --host
//! vm`: a real kernel, whose mounts only its own processes see), where
//! kubelet's directories, the pod's writes and reads, and the look at the
//! kernel's device run through `snap-csi-guest exec`.

use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use snap_csi_harness::csi::Volume;
use snap_csi_harness::guest;

/// 1 MiB written past where mkfs or a partition table would go.
pub const OFFSET: u64 = 4 << 20;

#[derive(Debug, Clone)]
pub enum PodHost {
    Local,
    /// The guest's command socket (local-up's GUEST_EXEC); the guest sees
    /// its directory, where the pod's bytes are handed over.
    Guest(PathBuf),
}

impl PodHost {
    /// A guest's, given its command socket; else this machine's.
    pub fn of(guest_exec: Option<&PathBuf>) -> PodHost {
        guest_exec.map_or(PodHost::Local, |socket| PodHost::Guest(socket.clone()))
    }

    /// Kubelet's directories of `volume` where the node makes its mounts
    /// (this machine's are made with the volume).
    pub fn prepare(&self, volume: &Volume) -> anyhow::Result<()> {
        match self {
            PodHost::Local => Ok(()),
            PodHost::Guest(socket) => volume.make_dirs_in_guest(socket),
        }
    }

    /// Writes `data` at the volume's data path (a file in a filesystem, or
    /// [`OFFSET`] of a raw device), synced.
    pub fn write(&self, target: &Path, block: bool, data: &[u8]) -> anyhow::Result<()> {
        let path = data_path(target, block);
        match self {
            PodHost::Local => {
                let mut file = OpenOptions::new()
                    .write(true)
                    .create(!block)
                    .open(&path)
                    .with_context(|| path.display().to_string())?;
                if block {
                    file.seek(SeekFrom::Start(OFFSET))?;
                }
                file.write_all(data)?;
                file.sync_all()?;
                Ok(())
            }
            PodHost::Guest(_) => {
                let handed = self.handover(target)?;
                fs::write(&handed, data)?;
                let seek = if block { OFFSET } else { 0 };
                let written = self.sh(&format!(
                    "dd if={} of={} bs=1M seek={seek} oflag=seek_bytes conv=notrunc,fsync \
                     status=none",
                    handed.display(),
                    path.display()
                ));
                fs::remove_file(&handed)?;
                written.map(drop)
            }
        }
    }

    /// Reads `len` bytes back from where [`PodHost::write`] wrote.
    pub fn read(&self, target: &Path, block: bool, len: usize) -> anyhow::Result<Vec<u8>> {
        let path = data_path(target, block);
        match self {
            PodHost::Local => {
                let mut file = fs::File::open(&path).with_context(|| path.display().to_string())?;
                if block {
                    file.seek(SeekFrom::Start(OFFSET))?;
                }
                let mut data = vec![0; len];
                file.read_exact(&mut data)?;
                Ok(data)
            }
            PodHost::Guest(_) => {
                let skip = if block { OFFSET } else { 0 };
                // Past the guest's page cache, as the pod's next open would not be.
                let encoded = self.sh(&format!(
                    "dd if={} bs=1M skip={skip} count={len} iflag=skip_bytes,count_bytes,direct \
                     status=none | base64 -w0",
                    path.display()
                ))?;
                STANDARD
                    .decode(encoded.trim())
                    .context("the guest's base64")
            }
        }
    }

    /// Writes `text` to the file `name` in the published directory `dir`,
    /// synced, as a pod that hands data over would (write, fsync, close).
    pub fn write_file(&self, dir: &Path, name: &str, text: &str) -> anyhow::Result<()> {
        let path = dir.join(name);
        match self {
            PodHost::Local => {
                let mut file =
                    fs::File::create(&path).with_context(|| path.display().to_string())?;
                file.write_all(text.as_bytes())?;
                file.sync_all()?;
                Ok(())
            }
            PodHost::Guest(_) => self
                .sh(&format!(
                    "printf %s {} | base64 -d | dd of={} conv=fsync status=none",
                    STANDARD.encode(text),
                    path.display()
                ))
                .map(drop),
        }
    }

    /// The text of the file `name` in the published directory `dir`.
    pub fn read_file(&self, dir: &Path, name: &str) -> anyhow::Result<String> {
        let path = dir.join(name);
        match self {
            PodHost::Local => fs::read_to_string(&path).with_context(|| path.display().to_string()),
            PodHost::Guest(_) => {
                let encoded = self.sh(&format!("base64 -w0 {}", path.display()))?;
                let bytes = STANDARD
                    .decode(encoded.trim())
                    .context("the guest's base64")?;
                String::from_utf8(bytes).context("the file's text")
            }
        }
    }

    /// The names in the published directory `dir`, sorted.
    pub fn list(&self, dir: &Path) -> anyhow::Result<Vec<String>> {
        let mut names: Vec<String> = match self {
            PodHost::Local => fs::read_dir(dir)?
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect::<Result<_, _>>()?,
            PodHost::Guest(_) => self
                .sh(&format!("ls -A {}", dir.display()))?
                .lines()
                .map(str::to_owned)
                .collect(),
        };
        names.sort();
        Ok(names)
    }

    /// What the guest's kernel mounted at a published volume's target: its
    /// own device and filesystem (`None` on this machine, where the
    /// emulator's tree is the host).
    pub fn device(&self, target: &Path) -> anyhow::Result<Option<String>> {
        match self {
            PodHost::Local => Ok(None),
            PodHost::Guest(_) => {
                let shown = self.sh(&format!("findmnt -no SOURCE,FSTYPE {}", target.display()))?;
                Ok(Some(shown.split_whitespace().collect::<Vec<_>>().join(" ")))
            }
        }
    }

    fn sh(&self, script: &str) -> anyhow::Result<String> {
        let PodHost::Guest(socket) = self else {
            bail!("no guest to run {script:?} in");
        };
        guest::exec(socket, script)?.stdout_of(script)
    }

    /// A file of this machine the guest reads the pod's bytes from.
    fn handover(&self, target: &Path) -> anyhow::Result<PathBuf> {
        let PodHost::Guest(socket) = self else {
            bail!("no guest");
        };
        let dir = socket.parent().context("the socket has a directory")?;
        let name = target.to_string_lossy().replace('/', "_");
        Ok(dir.join(format!("pod-bytes{name}")))
    }
}

fn data_path(target: &Path, block: bool) -> PathBuf {
    if block {
        target.to_path_buf()
    } else {
        target.join("player.bin")
    }
}
