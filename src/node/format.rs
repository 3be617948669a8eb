//! Filesystem types, probing a device for signatures, and mkfs on blank
//! devices only.
//!
//! A volume may reach us holding data: a filesystem from an earlier stage, or
//! a partition table someone put there on purpose. `mkfs` runs only when
//! blkid's low-level probe finds no signature at all, so a wrong guess can
//! never destroy data; everything else is refused, not overwritten. The one
//! exception is what our own mkfs left when it was cut short, which the
//! node's record tells (`records::VolumeRecord::formatting`).

use std::ffi::OsStr;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

use tokio::time::Instant;

use super::command;
use super::device::block_device_number;
use super::error::NodeError;

/// The filesystems we create and mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FsType {
    /// What an empty CSI `fs_type` means.
    #[default]
    Ext4,
    Xfs,
}

impl FsType {
    /// From a CSI `MountVolume.fs_type`: empty means the default (ext4);
    /// anything but ext4 and xfs is `InvalidArgument`.
    pub fn from_csi(fs_type: &str) -> Result<FsType, NodeError> {
        match fs_type {
            "" => Ok(FsType::default()),
            "ext4" => Ok(FsType::Ext4),
            "xfs" => Ok(FsType::Xfs),
            other => Err(NodeError::InvalidArgument(format!(
                "unsupported fs_type {other:?}: supported are \"ext4\" (the default) and \"xfs\""
            ))),
        }
    }

    /// The name the kernel, blkid and mkfs use.
    pub fn as_str(self) -> &'static str {
        match self {
            FsType::Ext4 => "ext4",
            FsType::Xfs => "xfs",
        }
    }
}

impl FromStr for FsType {
    type Err = NodeError;

    fn from_str(s: &str) -> Result<FsType, NodeError> {
        FsType::from_csi(s)
    }
}

impl fmt::Display for FsType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a device holds, as far as signatures tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// No signature: safe to format.
    Blank,
    /// A filesystem of this type (blkid's TYPE with USAGE=filesystem).
    Filesystem(String),
    /// A partition table of this type (`dos`, `gpt`, ...).
    PartitionTable(String),
    /// Another signature (swap, LVM, RAID, LUKS) or contradicting ones.
    Other(String),
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Probe::Blank => f.write_str("no signature"),
            Probe::Filesystem(fs) => write!(f, "an existing {fs} filesystem"),
            Probe::PartitionTable(pt) => write!(f, "a partition table ({pt})"),
            Probe::Other(what) => write!(f, "a signature of {what}"),
        }
    }
}

/// blkid's exit code for "nothing found".
const BLKID_NOTHING_FOUND: i32 = 2;
/// blkid's exit code for "more than one signature, contradicting".
const BLKID_AMBIVALENT: i32 = 4;

/// Probes the block device `device` with `blkid -p -o export` (low-level:
/// reads the device itself, no cache, partition tables included).
pub async fn probe(device: &Path, deadline: Instant) -> Result<Probe, NodeError> {
    // blkid also says "nothing found" for a path that does not exist.
    block_device_number(device)?;
    let args = [
        OsStr::new("-p"),
        OsStr::new("-o"),
        OsStr::new("export"),
        device.as_os_str(),
    ];
    let output = command::run_unchecked("blkid", &args, deadline).await?;
    let said = command::tool_output(&output);
    match output.status.code() {
        Some(0) => Ok(parse_export(&String::from_utf8_lossy(&output.stdout))),
        // It also exits 2 when it cannot open the device, but then says so;
        // and silently when every read fails (a function whose backing SNAP
        // lost mid-stage: found by the chaos soak, which then saw the next
        // stage format over data). Blank only if the device reads.
        Some(BLKID_NOTHING_FOUND) if output.stderr.iter().all(u8::is_ascii_whitespace) => {
            readable(device, deadline).await?;
            Ok(Probe::Blank)
        }
        Some(BLKID_AMBIVALENT) => Ok(Probe::Other(format!(
            "contradicting ({})",
            if said.is_empty() {
                "blkid found more than one"
            } else {
                &said
            }
        ))),
        _ => Err(NodeError::failed(
            format!("blkid -p {}", device.display()),
            format!("{}: {said}", output.status),
        )),
    }
}

/// Reads the first 128 KiB of `device` past the page cache, where every
/// signature we refuse or format over lies (xfs and ext4 superblocks, btrfs
/// at 64 KiB, partition tables): an error unless the device answers.
async fn readable(device: &Path, deadline: Instant) -> Result<(), NodeError> {
    let mut input = std::ffi::OsString::from("if=");
    input.push(device);
    let args = [
        input.as_os_str(),
        OsStr::new("of=/dev/null"),
        OsStr::new("bs=128K"),
        OsStr::new("count=1"),
        OsStr::new("iflag=direct"),
        OsStr::new("status=none"),
    ];
    command::run("dd", &args, deadline).await.map(drop)
}

/// Reads blkid's `KEY=value` lines.
fn parse_export(text: &str) -> Probe {
    let value = |key: &str| {
        text.lines()
            .filter_map(|line| line.split_once('='))
            .find(|(k, _)| *k == key)
            // export format escapes shell-special characters with a backslash
            .map(|(_, v)| v.replace('\\', ""))
            .filter(|v| !v.is_empty())
    };
    match (value("TYPE"), value("USAGE"), value("PTTYPE")) {
        (Some(fs), None, _) => Probe::Filesystem(fs),
        (Some(fs), Some(usage), _) if usage == "filesystem" => Probe::Filesystem(fs),
        (Some(kind), Some(usage), _) => Probe::Other(format!("{kind} ({usage})")),
        (None, _, Some(pt)) => Probe::PartitionTable(pt),
        // Only partition-entry facts (the device is a partition): no content.
        (None, _, None) => Probe::Blank,
    }
}

/// Whether `device` needs an `fs` filesystem made: `true` when it is blank,
/// `false` when it carries `fs` already (a retry, or a volume staged
/// before). Another filesystem, a partition table or any other signature is
/// `FailedPrecondition`, and the device is left untouched.
pub async fn needs_mkfs(device: &Path, fs: FsType, deadline: Instant) -> Result<bool, NodeError> {
    match probe(device, deadline).await? {
        Probe::Blank => Ok(true),
        Probe::Filesystem(found) if found == fs.as_str() => Ok(false),
        found => Err(NodeError::FailedPrecondition(format!(
            "{} carries {found}; refusing to format it as {fs}",
            device.display()
        ))),
    }
}

/// Makes an `fs` filesystem on `device`, which [`needs_mkfs`] found blank.
/// `over_ours`: the device holds what our own cut-short mkfs left, which
/// is overwritten; otherwise a signature that appeared since the probe
/// makes mkfs.xfs refuse instead of overwriting it.
pub async fn mkfs(
    device: &Path,
    fs: FsType,
    over_ours: bool,
    deadline: Instant,
) -> Result<(), NodeError> {
    let dev = device.as_os_str();
    match fs {
        // -m 0: a volume is all the pod's; blocks reserved for root help a
        // system disk, not this. Lazy init and no discard keep creation fast:
        // discarding a large remote namespace can take minutes, and a new
        // volume has nothing to give back. -F: a whole disk, not a partition.
        FsType::Ext4 => {
            let args = [
                "-F",
                "-q",
                "-m",
                "0",
                "-E",
                "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
            ];
            let args: Vec<&OsStr> = args.iter().map(OsStr::new).chain([dev]).collect();
            command::run("mkfs.ext4", &args, deadline).await?
        }
        FsType::Xfs => {
            let force = over_ours.then_some(OsStr::new("-f"));
            let args: Vec<&OsStr> = [OsStr::new("-q"), OsStr::new("-K")]
                .into_iter()
                .chain(force)
                .chain([dev])
                .collect();
            command::run("mkfs.xfs", &args, deadline).await?
        }
    };
    tracing::info!(device = %device.display(), %fs, "created filesystem");
    Ok(())
}

/// A stage's format step without the record around it, for tests:
/// `Ok(true)` when it formatted.
#[cfg(test)]
pub(crate) async fn format_if_blank(
    device: &Path,
    fs: FsType,
    deadline: Instant,
) -> Result<bool, NodeError> {
    let needed = needs_mkfs(device, fs, deadline).await?;
    if needed {
        mkfs(device, fs, false, deadline).await?;
    }
    Ok(needed)
}

#[cfg(test)]
mod tests {
    use super::super::command::testing::{Scratch, deadline, sh};
    use super::*;

    #[test]
    fn fs_type_from_csi() {
        assert_eq!(FsType::from_csi("").unwrap(), FsType::Ext4);
        assert_eq!("ext4".parse::<FsType>().unwrap(), FsType::Ext4);
        assert_eq!("xfs".parse::<FsType>().unwrap(), FsType::Xfs);
        for bad in ["ext3", "EXT4", " xfs", "btrfs", "ntfs\0"] {
            let err = FsType::from_csi(bad).unwrap_err();
            assert!(
                matches!(err, NodeError::InvalidArgument(_)),
                "{bad:?}: {err:?}"
            );
        }
        assert_eq!(FsType::Xfs.to_string(), "xfs");
        assert_eq!(
            FsType::from_csi(&FsType::Ext4.to_string()).unwrap(),
            FsType::Ext4
        );
    }

    #[test]
    fn parse_blkid_export() {
        let ext4 = "DEVNAME=/dev/loop0\nUUID=a5\nVERSION=1.0\nBLOCK_SIZE=1024\nTYPE=ext4\nUSAGE=filesystem\n";
        assert_eq!(parse_export(ext4), Probe::Filesystem("ext4".into()));
        assert_eq!(
            parse_export("DEVNAME=/dev/loop0\nPTUUID=105a\nPTTYPE=gpt\n"),
            Probe::PartitionTable("gpt".into())
        );
        assert_eq!(
            parse_export("DEVNAME=/dev/loop0\nUUID=54\nVERSION=1\nTYPE=swap\nUSAGE=other\n"),
            Probe::Other("swap (other)".into())
        );
        assert_eq!(
            parse_export("TYPE=LVM2_member\nUSAGE=raid\n"),
            Probe::Other("LVM2_member (raid)".into())
        );
        assert_eq!(parse_export("TYPE=xfs\n"), Probe::Filesystem("xfs".into()));
        assert_eq!(
            parse_export("LABEL=my\\ disk\nTYPE=ext4\nUSAGE=filesystem\n"),
            Probe::Filesystem("ext4".into())
        );
        assert_eq!(
            parse_export("DEVNAME=/dev/sda1\nPART_ENTRY_SCHEME=gpt\nPART_ENTRY_NUMBER=1\n"),
            Probe::Blank
        );
        assert_eq!(parse_export(""), Probe::Blank);
    }

    #[tokio::test]
    async fn probe_of_a_missing_device_is_not_found() {
        let err = probe(Path::new("/dev/nonexistent-snap-csi"), deadline())
            .await
            .unwrap_err();
        assert!(matches!(err, NodeError::NotFound(_)), "{err:?}");
    }

    #[tokio::test]
    async fn a_device_that_does_not_read_is_never_blank() {
        // Every read of /proc/self/mem at offset 0 fails, as every read of a
        // function SNAP lost does; blkid says nothing of such a device.
        let err = readable(Path::new("/proc/self/mem"), deadline())
            .await
            .unwrap_err();
        assert!(matches!(err, NodeError::Failed { .. }), "{err:?}");
    }

    fn uuid(device: &Path) -> String {
        let args = ["-p", "-s", "UUID", "-o", "value"].map(OsStr::new);
        let args: Vec<&OsStr> = args.into_iter().chain([device.as_os_str()]).collect();
        sh("blkid", &args)
    }

    fn wipe(device: &Path) {
        sh(
            "wipefs",
            &[OsStr::new("-a"), OsStr::new("-q"), device.as_os_str()],
        );
    }

    fn partition(device: &Path, label: &str) {
        use std::io::Write;
        let mut child = std::process::Command::new("sfdisk")
            .args(["-q", "--no-reread"])
            .arg(device)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("sfdisk (package fdisk) runs");
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "label: {label}\n,").unwrap();
        drop(stdin);
        assert!(child.wait().unwrap().success());
    }

    /// Whether xfs_repair finds `device`'s xfs sound (read-only check).
    fn xfs_sound(device: &Path) -> bool {
        std::process::Command::new("xfs_repair")
            .arg("-n")
            .arg(device)
            .output()
            .expect("xfs_repair (package xfsprogs) runs")
            .status
            .success()
    }

    #[tokio::test]
    async fn a_cut_short_xfs_is_made_again_only_when_it_is_ours() {
        let mut scratch = Scratch::new();
        let device = scratch.loop_device("disk.img", 320 << 20);
        mkfs(&device, FsType::Xfs, false, deadline()).await.unwrap();
        // What a mkfs.xfs killed mid-write leaves: its primary superblock,
        // then nothing where the allocation group headers should be.
        {
            use std::io::{Seek, SeekFrom, Write};
            let mut disk = std::fs::OpenOptions::new()
                .write(true)
                .open(&device)
                .unwrap();
            disk.seek(SeekFrom::Start(512)).unwrap();
            disk.write_all(&vec![0u8; 64 << 10]).unwrap();
            disk.sync_all().unwrap();
        }
        assert!(!xfs_sound(&device), "the headers were not cut away");
        let half = uuid(&device);
        // blkid still calls it xfs: the probe alone cannot tell.
        assert!(!needs_mkfs(&device, FsType::Xfs, deadline()).await.unwrap());
        // Without the record's word, mkfs.xfs will not overwrite it.
        let err = mkfs(&device, FsType::Xfs, false, deadline())
            .await
            .unwrap_err();
        assert!(matches!(err, NodeError::Failed { .. }), "{err:?}");
        mkfs(&device, FsType::Xfs, true, deadline()).await.unwrap();
        assert!(xfs_sound(&device));
        assert_ne!(uuid(&device), half);
    }

    #[tokio::test]
    async fn probe_and_format_ext4_only_when_blank_and_idempotently() {
        let mut scratch = Scratch::new();
        let device = scratch.loop_device("disk.img", 64 << 20);
        assert_eq!(probe(&device, deadline()).await.unwrap(), Probe::Blank);

        assert!(
            format_if_blank(&device, FsType::Ext4, deadline())
                .await
                .unwrap()
        );
        assert_eq!(
            probe(&device, deadline()).await.unwrap(),
            Probe::Filesystem("ext4".into())
        );
        let made = uuid(&device);
        // Again: nothing to do, the same filesystem stays.
        assert!(
            !format_if_blank(&device, FsType::Ext4, deadline())
                .await
                .unwrap()
        );
        assert_eq!(uuid(&device), made);

        let err = format_if_blank(&device, FsType::Xfs, deadline())
            .await
            .unwrap_err();
        let NodeError::FailedPrecondition(message) = &err else {
            panic!("{err:?}");
        };
        assert!(
            message.contains("carries an existing ext4 filesystem; refusing to format it as xfs"),
            "{message}"
        );
        assert_eq!(uuid(&device), made);
    }

    #[tokio::test]
    async fn probe_and_format_xfs_only_when_blank_and_idempotently() {
        let mut scratch = Scratch::new();
        let device = scratch.loop_device("disk.img", 320 << 20);
        assert!(
            format_if_blank(&device, FsType::Xfs, deadline())
                .await
                .unwrap()
        );
        assert_eq!(
            probe(&device, deadline()).await.unwrap(),
            Probe::Filesystem("xfs".into())
        );
        let made = uuid(&device);
        assert!(
            !format_if_blank(&device, FsType::Xfs, deadline())
                .await
                .unwrap()
        );
        let err = format_if_blank(&device, FsType::Ext4, deadline())
            .await
            .unwrap_err();
        assert!(matches!(err, NodeError::FailedPrecondition(_)), "{err:?}");
        assert_eq!(uuid(&device), made);
    }

    #[tokio::test]
    async fn never_formats_over_a_partition_table_or_other_signature() {
        let mut scratch = Scratch::new();
        let device = scratch.loop_device("disk.img", 64 << 20);
        for label in ["gpt", "dos"] {
            wipe(&device);
            partition(&device, label);
            assert_eq!(
                probe(&device, deadline()).await.unwrap(),
                Probe::PartitionTable(label.into())
            );
            for fs in [FsType::Ext4, FsType::Xfs] {
                let err = format_if_blank(&device, fs, deadline()).await.unwrap_err();
                assert!(
                    matches!(&err, NodeError::FailedPrecondition(m) if m.contains(&format!("a partition table ({label})"))),
                    "{err:?}"
                );
            }
            assert_eq!(
                probe(&device, deadline()).await.unwrap(),
                Probe::PartitionTable(label.into())
            );
        }

        wipe(&device);
        sh("mkswap", &[device.as_os_str()]);
        assert_eq!(
            probe(&device, deadline()).await.unwrap(),
            Probe::Other("swap (other)".into())
        );
        let err = format_if_blank(&device, FsType::Ext4, deadline())
            .await
            .unwrap_err();
        assert!(matches!(err, NodeError::FailedPrecondition(_)), "{err:?}");
        assert_eq!(
            probe(&device, deadline()).await.unwrap(),
            Probe::Other("swap (other)".into())
        );
    }

    #[tokio::test]
    async fn mkfs_failure_carries_the_tools_message() {
        let mut scratch = Scratch::new();
        // Too small for xfs: mkfs.xfs says why, and so do we.
        let device = scratch.loop_device("disk.img", 16 << 20);
        let err = format_if_blank(&device, FsType::Xfs, deadline())
            .await
            .unwrap_err();
        let NodeError::Failed { what, message } = &err else {
            panic!("{err:?}");
        };
        assert!(what.starts_with("mkfs.xfs -q -K /dev/loop"), "{what}");
        assert!(message.starts_with("exit status 1: "), "{message}");
        assert!(message.len() > "exit status 1: ".len() + 10, "{message}");
    }
}
