//! virtio-fs devices on the host: what a host's kernel (6.9+) shows of a
//! started, hot-plugged device, and how a host mounts it.
//!
//! ```text
//! <sysfs root>/fs/virtiofs/<n>/tag       the tag and a newline
//! <sysfs root>/fs/virtiofs/<n>/device -> <sysfs root>/bus/pci/devices/<domain>:<bdf>/virtio<n>
//! <state dir>/virtiofs/<tag>             the device: a UNIX socket (crate fuse-handoff)
//! ```
//!
//! `fs/virtiofs` itself is there from the host side's start, empty or not,
//! as a kernel with virtiofs built in has it from boot (seen on 6.12 in
//! `tests/guest_host.rs`): its absence means a kernel without the list.
//!
//! `<n>` is the host's virtio device index, one numbering for all its
//! DPUs: on a root shared with another emulator, a device takes the lowest
//! `<n>` neither has, and each emulator takes away only the entries that
//! link to its own domain's functions.
//!
//! Where a real host runs `mount -t virtiofs <tag> <dir>`, a host here runs
//! `fuse_handoff::mount`: it mounts FUSE at `<dir>` itself (`fuse.virtiofs`,
//! the tag as its source, `allow_other`, `default_permissions`) and hands
//! the connection to the device's socket, where a passthrough server
//! (`datapath::passthrough`) serves the fsdev's tree on it until the host
//! unmounts. The emulator mounts nothing of its own, so a host's mount is
//! the only one of that filesystem, as on a real host.
//!
//! A device appears socket first, then its sysfs entry (what a host waits
//! for), and goes the other way round: its entry, then its socket, while
//! every connection it serves answers ENOTCONN to whoever still has it
//! mounted, as a host's mount does once its device is gone. A connection
//! whose server died (the emulator killed) is aborted by the kernel: the
//! same ENOTCONN.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use fuse_handoff::Listener;

use super::tree::{Tree, remove_dir_if_empty};
use crate::datapath::passthrough::{self, Passthrough};

/// Where the kernel lists virtio-fs devices, under the sysfs root.
const SYSFS_DIR: &str = "fs/virtiofs";
/// The virtio device id of a filesystem device (virtio spec 5.11).
const VIRTIO_ID_FS: u32 = 26;
/// How long a host that came to mount a device has to send its connection.
const HANDOFF_TIMEOUT: Duration = Duration::from_secs(10);

/// One device the host sees.
#[derive(Debug)]
struct Shown {
    bdf: String,
    tag: String,
    gone: Arc<AtomicBool>,
    listener: Arc<Listener>,
}

/// The host's virtio-fs devices, by the `<n>` the kernel numbers them with.
#[derive(Debug)]
pub(super) struct VirtioFs {
    /// `<state dir>/virtiofs`, holding a socket per device's tag.
    devices_dir: PathBuf,
    shown: BTreeMap<u32, Shown>,
}

impl VirtioFs {
    pub(super) fn new(devices_dir: PathBuf) -> Self {
        Self {
            devices_dir,
            shown: BTreeMap::new(),
        }
    }

    pub(super) fn devices_dir(&self) -> &Path {
        &self.devices_dir
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
        // The tree must open now: a device over nothing is refused here,
        // not at a host's mount.
        drop(
            Passthrough::new(root, Arc::new(AtomicBool::new(false)))
                .with_context(|| format!("opening the fsdev's tree {}", root.display()))?,
        );
        fs::create_dir_all(&self.devices_dir)
            .with_context(|| format!("creating {}", self.devices_dir.display()))?;
        let socket = self.devices_dir.join(tag);
        let listener = Listener::bind(&socket)
            .with_context(|| format!("listening for hosts at {}", socket.display()))?;
        let shown = Shown {
            bdf: bdf.to_owned(),
            tag: tag.to_owned(),
            gone: Arc::new(AtomicBool::new(false)),
            listener: Arc::new(listener),
        };
        let served = serve_hosts(&shown, root);
        let n = match served.and_then(|()| self.claim(tree, bdf, tag)) {
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

    /// Every device off the host, and the list with the tree when no
    /// other emulator's device is in it (shutdown).
    pub(super) fn hide_all(&mut self, tree: &Tree) -> anyhow::Result<()> {
        let all: Vec<u32> = self.shown.keys().copied().collect();
        for n in all {
            self.hide(tree, n);
        }
        let entries = tree.root().join(SYSFS_DIR);
        remove_dir_if_empty(&entries)?;
        remove_dir_if_empty(entries.parent().unwrap_or(&entries))
    }

    /// What an earlier run left: its entries in the tree (those linking to
    /// our domain's functions) and its devices' sockets. Its hosts' mounts
    /// died with it (ENOTCONN) and are theirs to take away. The list stays,
    /// as the kernel's does.
    pub(super) fn clean_up(&self, tree: &Tree) -> anyhow::Result<()> {
        let entries = tree.root().join(SYSFS_DIR);
        for entry in fs::read_dir(&entries).into_iter().flatten() {
            let entry = entry?.path();
            if fs::read_link(entry.join("device")).is_ok_and(|device| tree.is_ours(&device)) {
                remove_if_present(&entry)?;
            }
        }
        fs::create_dir_all(&entries).with_context(|| format!("creating {}", entries.display()))?;
        for socket in fs::read_dir(&self.devices_dir).into_iter().flatten() {
            let socket = socket?.path();
            fs::remove_file(&socket).with_context(|| format!("removing {}", socket.display()))?;
        }
        Ok(())
    }
}

/// Serves every host that comes to mount the device, each on a thread of
/// its own, until the device is taken down.
fn serve_hosts(shown: &Shown, root: &Path) -> anyhow::Result<()> {
    let (listener, gone, root) = (
        Arc::clone(&shown.listener),
        Arc::clone(&shown.gone),
        root.to_owned(),
    );
    std::thread::Builder::new()
        .name(format!("virtiofs-{}", shown.tag))
        .spawn(move || {
            while let Ok(host) = listener.accept() {
                let (gone, root) = (Arc::clone(&gone), root.clone());
                let spawned = std::thread::Builder::new()
                    .name("virtiofs-mount".into())
                    .spawn(move || {
                        if let Err(e) = serve_host(host, &root, gone) {
                            tracing::warn!("a host's virtio-fs mount is not served: {e:#}");
                        }
                    });
                if let Err(e) = spawned {
                    tracing::error!("cannot serve a host's virtio-fs mount: {e}");
                }
            }
        })
        .context("starting the device's listener")?;
    Ok(())
}

/// Serves the tree on the connection `host` sends, then tells it so.
fn serve_host(host: fuse_handoff::Host, root: &Path, gone: Arc<AtomicBool>) -> anyhow::Result<()> {
    let fuse = host
        .connection(HANDOFF_TIMEOUT)
        .context("receiving the host's FUSE connection")?;
    if gone.load(Ordering::SeqCst) {
        // Unanswered, the host sees no such device.
        return Ok(());
    }
    let fs = Passthrough::new(root, gone)
        .with_context(|| format!("opening the fsdev's tree {}", root.display()))?;
    passthrough::serve(fs, fuse).context("serving the host's FUSE connection")?;
    host.serving().context("answering the host")
}

/// No host reaches the device from now on, and every mount of it answers
/// ENOTCONN until its host unmounts it (which ends its session).
fn take_down(shown: Shown) {
    shown.gone.store(true, Ordering::SeqCst);
    shown.listener.close();
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
