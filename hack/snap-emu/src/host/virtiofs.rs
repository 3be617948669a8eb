//! virtio-fs devices on the host: what a host's kernel (6.9+) shows of a
//! started, hot-plugged device, and the mount it serves.
//!
//! ```text
//! <sysfs root>/fs/virtiofs/<n>/tag       the tag and a newline
//! <sysfs root>/fs/virtiofs/<n>/device -> <sysfs root>/bus/pci/devices/<domain>:<bdf>/virtio<n>
//! <state dir>/virtiofs/<tag>             a kernel FUSE mount of the fsdev's tree
//! ```
//!
//! `<n>` is the host's virtio device index, one numbering for all its
//! DPUs: on a root shared with another emulator, a device takes the lowest
//! `<n>` neither has, and each emulator takes away only the entries that
//! link to its own domain's functions.
//!
//! The mount is `fuse.virtiofs` with the tag as its source (FUSE's
//! `subtype=virtiofs`), `allow_other` and
//! `default_permissions`, served by `datapath::passthrough`. Where a real
//! host runs `mount -t virtiofs <tag> <dir>`, a host here bind-mounts
//! `<state dir>/virtiofs/<tag>` onto `<dir>`.
//!
//! A device appears mount first, then its sysfs entry (what a host waits
//! for), and goes the other way round: its entry, then the mount, lazily,
//! while its filesystem answers ENOTCONN to whoever still has it mounted,
//! as a host's mount does once its device is gone. The FUSE session ends
//! with the last such mount, unmounting nothing itself ([`mount_fuse`]).

use std::collections::BTreeMap;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, bail};
use fuser::SessionACL;
use nix::mount::{MntFlags, MsFlags, umount2};

use super::tree::{Tree, remove_dir_if_empty};
use crate::datapath::fuse::unmount_stale;
use crate::datapath::passthrough::Passthrough;

/// Where the kernel lists virtio-fs devices, under the sysfs root.
const SYSFS_DIR: &str = "fs/virtiofs";
/// The virtio device id of a filesystem device (virtio spec 5.11).
const VIRTIO_ID_FS: u32 = 26;

/// One device the host sees.
#[derive(Debug)]
struct Shown {
    bdf: String,
    tag: String,
    mountpoint: PathBuf,
    gone: Arc<AtomicBool>,
    session: fuser::BackgroundSession,
}

/// The host's virtio-fs devices, by the `<n>` the kernel numbers them with.
#[derive(Debug)]
pub(super) struct VirtioFs {
    /// `<state dir>/virtiofs`, holding a mount per device's tag.
    mounts_dir: PathBuf,
    shown: BTreeMap<u32, Shown>,
}

impl VirtioFs {
    pub(super) fn new(mounts_dir: PathBuf) -> Self {
        Self {
            mounts_dir,
            shown: BTreeMap::new(),
        }
    }

    pub(super) fn mounts_dir(&self) -> &Path {
        &self.mounts_dir
    }

    /// Shows a device of the function at `bdf` serving `root` under `tag`;
    /// returns its `<n>`.
    pub(super) fn show(
        &mut self,
        tree: &Tree,
        bdf: &str,
        tag: &str,
        root: &Path,
    ) -> anyhow::Result<u32> {
        if self.shown.values().any(|s| s.tag == tag) {
            bail!("a virtio-fs device with tag {tag} is already on the host");
        }
        let mountpoint = self.mounts_dir.join(tag);
        fs::create_dir_all(&mountpoint)
            .with_context(|| format!("creating {}", mountpoint.display()))?;
        let gone = Arc::new(AtomicBool::new(false));
        let fs = Passthrough::new(root, Arc::clone(&gone))
            .with_context(|| format!("opening the fsdev's tree {}", root.display()))?;
        let session = mount_fuse(fs, &mountpoint, tag)
            .with_context(|| format!("mounting {tag} at {} (FUSE)", mountpoint.display()))?;
        let shown = Shown {
            bdf: bdf.to_owned(),
            tag: tag.to_owned(),
            mountpoint,
            gone,
            session,
        };
        let n = match self.claim(tree, bdf, tag) {
            Ok(n) => n,
            Err(e) => {
                take_down(shown);
                return Err(e);
            }
        };
        tracing::info!(n, bdf, tag, "virtio-fs device on the host");
        self.shown.insert(n, shown);
        Ok(n)
    }

    /// Installs the device's entries under the lowest `<n>` free on the host.
    fn claim(&self, tree: &Tree, bdf: &str, tag: &str) -> anyhow::Result<u32> {
        for n in (0..=u32::MAX).filter(|n| !self.shown.contains_key(n)) {
            if install(tree, n, bdf, tag)? {
                return Ok(n);
            }
        }
        bail!("every virtio device index is taken")
    }

    /// Takes device `<n>` off the host.
    pub(super) fn hide(&mut self, tree: &Tree, n: u32) {
        let Some(shown) = self.shown.remove(&n) else {
            return;
        };
        if let Err(e) = remove_entry(tree, n, &shown.bdf) {
            tracing::warn!("removing virtio-fs device {n} from the tree: {e:#}");
        }
        take_down(shown);
        tracing::info!(n, "virtio-fs device left the host");
    }

    /// Every device off the host (shutdown).
    pub(super) fn hide_all(&mut self, tree: &Tree) {
        let all: Vec<u32> = self.shown.keys().copied().collect();
        for n in all {
            self.hide(tree, n);
        }
    }

    /// What an earlier run left: its entries in the tree (those linking to
    /// our domain's functions) and its mounts (dead once it died: ENOTCONN).
    pub(super) fn clean_up(&self, tree: &Tree) -> anyhow::Result<()> {
        let entries = tree.root().join(SYSFS_DIR);
        for entry in fs::read_dir(&entries).into_iter().flatten() {
            let entry = entry?.path();
            if fs::read_link(entry.join("device")).is_ok_and(|device| tree.is_ours(&device)) {
                remove_if_present(&entry)?;
            }
        }
        remove_dir_if_empty(&entries)?;
        let Ok(mounts) = fs::read_dir(&self.mounts_dir) else {
            return Ok(());
        };
        for mount in mounts {
            let path = mount?.path();
            unmount_stale(&path)?;
            let _ = fs::remove_dir(&path);
        }
        Ok(())
    }
}

/// Mounts `fs` at `mountpoint` as a host shows a virtio-fs mount (type
/// `fuse.virtiofs`, the tag as its source) and serves it in the background.
/// The mount is made here, not by fuser: a session fuser mounted unmounts
/// its mount point by path when it ends, and a device's session ends only
/// once the last host mount of it goes, by when the tag's path may hold the
/// mount of the device that replaced it (SNAP restarted, the volume
/// attached again), which it would take away.
fn mount_fuse(
    fs: Passthrough,
    mountpoint: &Path,
    tag: &str,
) -> anyhow::Result<fuser::BackgroundSession> {
    let dev = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .context("opening /dev/fuse")?;
    let root_mode = fs::metadata(mountpoint)?.permissions().mode();
    let data = format!(
        "fd={},rootmode={root_mode:o},user_id={},group_id={},default_permissions,\
         allow_other,subtype=virtiofs",
        dev.as_raw_fd(),
        nix::unistd::getuid(),
        nix::unistd::getgid(),
    );
    nix::mount::mount(
        Some(tag),
        mountpoint,
        Some("fuse"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )?;
    let mut config = fuser::Config::default();
    config.n_threads = Some(2);
    config.clone_fd = true;
    let served = fuser::Session::from_fd(fs, dev.into(), SessionACL::All, config)
        .and_then(fuser::Session::spawn);
    if served.is_err() {
        let _ = umount2(mountpoint, MntFlags::MNT_DETACH);
    }
    Ok(served?)
}

/// Its filesystem refuses from now on, its mount point goes, and its
/// session ends once no host has it mounted any more.
fn take_down(shown: Shown) {
    shown.gone.store(true, Ordering::SeqCst);
    if let Err(e) = umount2(&shown.mountpoint, MntFlags::MNT_DETACH) {
        tracing::warn!("unmounting {}: {e}", shown.mountpoint.display());
    }
    let _ = fs::remove_dir(&shown.mountpoint);
    let session = shown.session;
    let ended = std::thread::Builder::new()
        .name("virtiofs-end".into())
        .spawn(move || {
            if session.join().is_err() {
                tracing::warn!("a virtio-fs FUSE session ended with an error");
            }
        });
    if let Err(e) = ended {
        tracing::error!("cannot wait for a virtio-fs session's end: {e}");
    }
}

/// `virtio<n>` under the function, and `fs/virtiofs/<n>` naming it, each
/// appearing whole; `false`, and neither, if `<n>` is taken on the host.
fn install(tree: &Tree, n: u32, bdf: &str, tag: &str) -> anyhow::Result<bool> {
    let virtio = tree.function_dir(bdf).join(format!("virtio{n}"));
    tree.install_dir(
        &virtio,
        &[
            ("vendor", b"0x1af4\n".to_vec()),
            ("device", format!("0x{VIRTIO_ID_FS:04x}\n").into_bytes()),
        ],
    )?;
    let entry = tree.root().join(SYSFS_DIR).join(n.to_string());
    let tag = format!("{tag}\n").into_bytes();
    let claimed = tree.install_new(&entry, &[("tag", tag)], &[("device", &virtio)]);
    if !matches!(claimed, Ok(true)) {
        remove_if_present(&virtio)?;
    }
    claimed
}

fn remove_entry(tree: &Tree, n: u32, bdf: &str) -> anyhow::Result<()> {
    remove_if_present(&tree.root().join(SYSFS_DIR).join(n.to_string()))?;
    remove_if_present(&tree.function_dir(bdf).join(format!("virtio{n}")))
}

fn remove_if_present(path: &Path) -> anyhow::Result<()> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}
