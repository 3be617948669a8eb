//! The host's tree, shaped as the kernel lays out sysfs under `sysfs_root`:
//!
//! ```text
//! <root>/bus/pci/devices/<domain>:<bdf>/{vendor,device,class}
//! <root>/bus/pci/devices/<domain>:<bdf>/nvme/nvme<C>/nvme<C>c<C>n<N>/{nsid,uuid,size}
//! <root>/block/nvme<C>n<N>/{nsid,uuid,size,dev}
//! <root>/bus/pci/devices/<domain>:<bdf>/virtio<N>/block/vd<x>/{serial,size,dev}
//! ```
//!
//! NVMe as with native multipath, the kernel's default: a path under the
//! controller and its subsystem's head under `block`; or, named
//! [`NvmeNaming::PerController`], the disk `nvme<C>/nvme<C>n<N>` itself
//! (`nvme_names`). A head comes before its path and goes after it.
//!
//! File contents are the kernel's, byte for byte: `size` is in 512-byte sectors
//! and `dev` holds the loop device's real `major:minor`, so a reader resolves the
//! device node exactly as it would on a real host. Like the kernel's, `serial`
//! is at most 20 bytes and has no trailing newline.
//!
//! Directories appear atomically (built under `<root>/.snap-emu-tmp-<domain>`,
//! then renamed into place), so a reader never sees a disk without its `dev`.
//! A disk's place in the tree ([`DiskId`]) is also its identity, and names
//! its crash record (`records`).
//!
//! Another emulator may share the root with another domain (a host with two
//! DPUs): everything here made, scanned or removed is in our domain, or in a
//! directory of its own (the temp directory); the shared parents
//! (`bus/pci/devices`) go only when empty, and a rename that finds one gone
//! makes it again.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, anyhow, bail};

use super::domain::PciDomain;
use super::loopdev::{self, LoopState};
use super::nvme_names::{HEADS_DIR, NvmeNames, NvmeNaming, number};
use super::queue::Queue;

const DEVICES: &str = "bus/pci/devices";
/// Followed by `-<domain>`.
const TMP_DIR: &str = ".snap-emu-tmp";
/// How often a rename into a shared parent is tried again after another
/// emulator removed the parent it found empty (once per start or stop).
const RENAME_TRIES: u32 = 3;
/// The unit of `size`.
pub(super) const SECTOR: u64 = 512;
/// VIRTIO_BLK_ID_BYTES: the kernel shows at most this much of the serial.
const VIRTIO_BLK_ID_BYTES: usize = 20;

/// One disk made visible to the host: a loop device plus its sysfs directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostDisk {
    /// `/dev/loopN`.
    pub loop_device: PathBuf,
    pub major: u32,
    pub minor: u32,
    /// The namespace or disk directory in the tree (`.../nvme0/nvme0n1`, `.../block/vda`).
    pub sysfs_dir: PathBuf,
}

/// A disk whose attach was queued: its place in the tree names it, since its
/// loop device may not exist yet (or ever, if the attach fails).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskRef {
    /// The namespace or disk directory it has (or will have) in the tree.
    pub sysfs_dir: PathBuf,
}

/// The tree under `sysfs_root`.
#[derive(Debug)]
pub(super) struct Tree {
    /// Canonical, so that the `sysfs_dir` of a `HostDisk` maps back to its disk.
    root: PathBuf,
    /// Our PCI domain, and how NVMe disks are named in it.
    names: NvmeNames,
    tmp_seq: AtomicU64,
}

impl Tree {
    /// Our `domain` of the tree at `sysfs_root` (made if missing), refusing
    /// the real system's.
    pub(super) fn open(
        sysfs_root: &Path,
        domain: PciDomain,
        naming: NvmeNaming,
    ) -> anyhow::Result<Self> {
        refuse_system_root(sysfs_root)?;
        fs::create_dir_all(sysfs_root)
            .with_context(|| format!("creating sysfs root {}", sysfs_root.display()))?;
        let root = fs::canonicalize(sysfs_root)
            .with_context(|| format!("resolving sysfs root {}", sysfs_root.display()))?;
        refuse_system_root(&root)?;
        Ok(Self {
            root,
            names: NvmeNames { domain, naming },
            tmp_seq: AtomicU64::new(0),
        })
    }

    pub(super) fn root(&self) -> &Path {
        &self.root
    }

    pub(super) fn tmp_dir(&self) -> PathBuf {
        self.root.join(format!("{TMP_DIR}-{}", self.names.domain))
    }

    pub(super) fn devices_dir(&self) -> PathBuf {
        self.root.join(DEVICES)
    }

    pub(super) fn function_dir(&self, bdf: &str) -> PathBuf {
        self.devices_dir()
            .join(format!("{}:{bdf}", self.names.domain))
    }

    /// Whether `path` is in one of our functions' directories (or is one).
    pub(super) fn is_ours(&self, path: &Path) -> bool {
        path.strip_prefix(self.devices_dir())
            .ok()
            .and_then(|rel| rel.components().next()?.as_os_str().to_str())
            .is_some_and(|function| domain_bdf(self.names.domain, function).is_some())
    }

    pub(super) fn disk_dir(&self, id: &DiskId) -> PathBuf {
        let mut dir = self.function_dir(id.bdf());
        dir.extend(id.rel_dirs(self.names));
        dir
    }

    /// The multipath head of an NVMe disk, where the naming has heads.
    fn head_dir(&self, id: &DiskId) -> Option<PathBuf> {
        let DiskId::Nvme { ctrl, ns, .. } = id else {
            return None;
        };
        let head = self.names.head(*ctrl, *ns)?;
        Some(self.root.join(HEADS_DIR).join(head))
    }

    /// Maps a disk's directory back to the disk it names, refusing one that is not
    /// under our tree.
    pub(super) fn disk_id(&self, sysfs_dir: &Path) -> anyhow::Result<DiskId> {
        sysfs_dir
            .strip_prefix(self.devices_dir())
            .ok()
            .and_then(|rel| DiskId::parse(rel, self.names))
            .ok_or_else(|| {
                anyhow!(
                    "{} is not a disk directory under {}",
                    sysfs_dir.display(),
                    self.devices_dir().display()
                )
            })
    }

    /// Creates `bus/pci/devices/<domain>:<bdf>` (with `vendor`, `device`,
    /// `class`) unless it is there; the caller holds the function.
    pub(super) fn add_function(&self, bdf: &str, kind: FunctionKind) -> anyhow::Result<()> {
        let dir = self.function_dir(bdf);
        match function_kind(&dir)? {
            Some(existing) if existing == kind => return Ok(()),
            Some(existing) => bail!(
                "PCI function {} already exists as a {} function, not {}",
                dir.display(),
                existing.name(),
                kind.name()
            ),
            None => {}
        }
        let (vendor, device, class) = kind.ids();
        let files = [
            ("vendor", format!("0x{vendor:04x}\n").into_bytes()),
            ("device", format!("0x{device:04x}\n").into_bytes()),
            ("class", format!("0x{class:06x}\n").into_bytes()),
        ];
        self.install_dir(&dir, &files)
            .with_context(|| format!("creating PCI function {}", dir.display()))
    }

    /// Checks that the function at `id` is there and of its kind.
    pub(super) fn check_function(&self, id: &DiskId) -> anyhow::Result<()> {
        let function = self.function_dir(id.bdf());
        match function_kind(&function)? {
            Some(kind) if kind == id.kind() => Ok(()),
            Some(kind) => bail!(
                "PCI function {} is a {} function",
                function.display(),
                kind.name()
            ),
            None => bail!(
                "PCI function {} does not exist (add_pci_function first)",
                function.display()
            ),
        }
    }

    /// Writes the disk's directory for the loop device `state` and returns the handle.
    pub(super) fn publish(
        &self,
        id: &DiskId,
        attrs: &DiskAttrs,
        state: &LoopState,
    ) -> anyhow::Result<HostDisk> {
        let size = format!("{}\n", state.sectors).into_bytes();
        let dev = format!("{}:{}\n", state.major, state.minor).into_bytes();
        let files = match attrs {
            DiskAttrs::Nvme { nsid, uuid } => vec![
                ("nsid", format!("{nsid}\n").into_bytes()),
                ("uuid", format!("{uuid}\n").into_bytes()),
                ("size", size),
                ("dev", dev),
            ],
            DiskAttrs::VirtioBlk { serial } => {
                vec![("serial", serial.clone()), ("size", size), ("dev", dev)]
            }
        };
        let dir = self.disk_dir(id);
        let head = self.head_dir(id);
        let mut path_files = files.clone();
        if head.is_some() {
            // A path is a hidden disk: no device node, so no `dev`.
            path_files.retain(|(name, _)| *name != "dev");
        }
        // Linux adds a namespace's path before its head (nvme_alloc_ns, then
        // nvme_mpath_set_live): whoever sees the head's `dev` finds the path.
        self.install_if_different(&dir, &path_files)?;
        if let Some(head) = head {
            // A head is the subsystem's, named after its controller's
            // instance, which SNAP gives one controller at a time.
            if !dir_holds(&head, &files) && !self.install_new(&head, &files, &[])? {
                remove_dir_all_if_present(&dir)?;
                bail!("{} is another disk's head", head.display());
            }
        }
        Ok(HostDisk {
            loop_device: loopdev::dev_path(&state.name),
            major: state.major,
            minor: state.minor,
            sysfs_dir: dir,
        })
    }

    fn install_if_different(&self, dir: &Path, files: &[(&str, Vec<u8>)]) -> anyhow::Result<()> {
        if dir_holds(dir, files) {
            return Ok(());
        }
        self.install_dir(dir, files)
            .with_context(|| format!("writing {}", dir.display()))
    }

    /// Shows a new size (in sectors) in the disk's `size`, and its head's.
    pub(super) fn set_size(&self, id: &DiskId, sectors: u64) -> anyhow::Result<()> {
        let size = format!("{sectors}\n");
        for dir in self.head_dir(id).into_iter().chain([self.disk_dir(id)]) {
            replace_file(&dir.join("size"), size.as_bytes())?;
        }
        Ok(())
    }

    /// Moves a disk's directory, and its head, to another place under its
    /// function.
    pub(super) fn move_disk(&self, from: &DiskId, to: &DiskId) -> anyhow::Result<()> {
        if let (Some(old), Some(new)) = (self.head_dir(from), self.head_dir(to)) {
            fs::rename(old, new)?;
        }
        let new_dir = self.disk_dir(to);
        if let Some(parent) = new_dir.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::rename(self.disk_dir(from), &new_dir)?;
        self.remove_disk_dirs(from)
    }

    /// Removes a function's directory, with the heads of the NVMe paths
    /// under it.
    pub(super) fn remove_function(&self, bdf: &str) -> anyhow::Result<()> {
        let dir = self.function_dir(bdf);
        for controller in subdirs(&dir.join("nvme"))? {
            for path in subdirs(&controller)? {
                if let Some(head) = self.disk_id(&path).ok().and_then(|id| self.head_dir(&id)) {
                    remove_dir_all_if_present(&head)?;
                }
            }
        }
        remove_dir_all_if_present(&dir)
    }

    /// Removes the heads in our domain's range under `block`, whichever
    /// naming made them, and `block` if that leaves it empty.
    fn remove_heads(&self) -> anyhow::Result<()> {
        let heads = self.root.join(HEADS_DIR);
        for head in subdirs(&heads)? {
            let name = head
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if self.names.is_our_head(name) {
                remove_dir_all_if_present(&head)?;
            }
        }
        remove_dir_if_empty(&heads)
    }

    /// Removes the functions we made (in our domain, recognised by their ids)
    /// and the empty `bus/pci/devices` above them; anything else under the
    /// root, another domain's functions too, is left alone.
    pub(super) fn remove_functions(&self, queue: &Queue) -> anyhow::Result<()> {
        let devices = self.devices_dir();
        let entries = match fs::read_dir(&devices) {
            Ok(entries) => Some(entries),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("listing {}", devices.display())),
        };
        for entry in entries.into_iter().flatten() {
            let entry = entry.with_context(|| format!("listing {}", devices.display()))?;
            let name = entry.file_name();
            let Some(bdf) = name.to_str().and_then(|n| domain_bdf(self.names.domain, n)) else {
                continue;
            };
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let _guard = queue.lock(bdf);
            let path = entry.path();
            match function_kind(&path) {
                Ok(Some(_)) => remove_dir_all_if_present(&path)
                    .with_context(|| format!("removing {}", path.display()))?,
                Ok(None) => {}
                Err(e) => tracing::warn!("leaving {} alone: {e:#}", path.display()),
            }
        }
        self.remove_heads()?;
        for dir in [devices, self.root.join("bus/pci"), self.root.join("bus")] {
            remove_dir_if_empty(&dir)?;
        }
        remove_dir_all_if_present(&self.tmp_dir())
    }

    /// Removes the disk's directory and the parents it leaves empty, up to but
    /// not including the function's directory, then its head.
    pub(super) fn remove_disk_dirs(&self, id: &DiskId) -> anyhow::Result<()> {
        let mut dir = self.disk_dir(id);
        remove_dir_all_if_present(&dir).with_context(|| format!("removing {}", dir.display()))?;
        for _ in 1..id.rel_dirs(self.names).len() {
            dir.pop();
            remove_dir_if_empty(&dir)?;
        }
        self.head_dir(id)
            .map_or(Ok(()), |head| remove_dir_all_if_present(&head))
    }

    /// Puts a directory with exactly `files` at `dir`, replacing what is there,
    /// in one rename so that readers see all of it or none of it.
    pub(super) fn install_dir(&self, dir: &Path, files: &[(&str, Vec<u8>)]) -> anyhow::Result<()> {
        self.install(dir, files, &[])
    }

    /// [`install_dir`](Self::install_dir) with symlinks too: `links` are
    /// `(name, target)`.
    pub(super) fn install(
        &self,
        dir: &Path,
        files: &[(&str, Vec<u8>)],
        links: &[(&str, &Path)],
    ) -> anyhow::Result<()> {
        if !self.put(dir, files, links, true)? {
            bail!("{} appeared while it was being replaced", dir.display());
        }
        Ok(())
    }

    /// [`install`](Self::install) where nothing is: `false`, and nothing
    /// changed, if `dir` is there already (on a shared root, maybe another
    /// emulator's).
    pub(super) fn install_new(
        &self,
        dir: &Path,
        files: &[(&str, Vec<u8>)],
        links: &[(&str, &Path)],
    ) -> anyhow::Result<bool> {
        self.put(dir, files, links, false)
    }

    fn put(
        &self,
        dir: &Path,
        files: &[(&str, Vec<u8>)],
        links: &[(&str, &Path)],
        replace: bool,
    ) -> anyhow::Result<bool> {
        let tmp_root = self.tmp_dir();
        fs::create_dir_all(&tmp_root)
            .with_context(|| format!("creating {}", tmp_root.display()))?;
        let tmp = tmp_root.join(format!(
            "{}-{}",
            std::process::id(),
            self.tmp_seq.fetch_add(1, Ordering::Relaxed)
        ));
        let build = || -> io::Result<bool> {
            fs::create_dir(&tmp)?;
            for (name, contents) in files {
                fs::write(tmp.join(name), contents)?;
            }
            for (name, target) in links {
                std::os::unix::fs::symlink(target, tmp.join(name))?;
            }
            if replace {
                match fs::remove_dir_all(dir) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
            }
            rename_into(&tmp, dir)
        };
        match build() {
            Ok(true) => Ok(true),
            built => {
                let _ = fs::remove_dir_all(&tmp);
                built.map_err(|e| anyhow!(e))
            }
        }
    }
}

/// Renames `tmp` to `dir`, making its parent again if another emulator on
/// the root removed it, empty, meanwhile; `false` if a directory with
/// entries is at `dir`.
fn rename_into(tmp: &Path, dir: &Path) -> io::Result<bool> {
    let mut tries = 1;
    loop {
        if let Some(parent) = dir.parent() {
            fs::create_dir_all(parent)?;
        }
        match fs::rename(tmp, dir) {
            Ok(()) => return Ok(true),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::DirectoryNotEmpty | io::ErrorKind::AlreadyExists
                ) =>
            {
                return Ok(false);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound && tries < RENAME_TRIES => tries += 1,
            Err(e) => return Err(e),
        }
    }
}

/// Which kind of PCI function the host sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FunctionKind {
    Nvme,
    VirtioBlk,
    VirtioFs,
}

impl FunctionKind {
    /// `(vendor, device, class)` as the host reads them from sysfs.
    fn ids(self) -> (u16, u16, u32) {
        match self {
            // BlueField emulated NVMe functions enumerate as Mellanox (0x15b3)
            // "NVMe SNAP Controller" 0x6001, class NVMe (0x010802).
            FunctionKind::Nvme => (0x15b3, 0x6001, 0x010802),
            // Linux's virtio-pci driver binds only vendor 0x1af4 (the virtio
            // spec reserves it for all virtio PCI devices), so an emulated
            // virtio-blk function presents 0x1af4 whoever built it: 0x1042 is
            // the modern virtio-blk device id, shown with class 0x010000 (SCSI
            // storage controller) as QEMU shows it.
            FunctionKind::VirtioBlk => (0x1af4, 0x1042, 0x010000),
            // 0x105a: the modern virtio-fs device id (0x1040 + 26), with
            // class 0x018000 (other mass storage), as QEMU shows it.
            FunctionKind::VirtioFs => (0x1af4, 0x105a, 0x018000),
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            FunctionKind::Nvme => "NVMe",
            FunctionKind::VirtioBlk => "virtio-blk",
            FunctionKind::VirtioFs => "virtio-fs",
        }
    }
}

/// Which kind of function we made at `dir`, `None` if there is none, an error
/// if something is there that we did not make.
fn function_kind(dir: &Path) -> anyhow::Result<Option<FunctionKind>> {
    let read = |name: &str| fs::read_to_string(dir.join(name));
    match (read("vendor"), read("device"), read("class")) {
        (Ok(vendor), Ok(device), Ok(class)) => {
            for kind in [
                FunctionKind::Nvme,
                FunctionKind::VirtioBlk,
                FunctionKind::VirtioFs,
            ] {
                let (v, d, c) = kind.ids();
                if vendor == format!("0x{v:04x}\n")
                    && device == format!("0x{d:04x}\n")
                    && class == format!("0x{c:06x}\n")
                {
                    return Ok(Some(kind));
                }
            }
            bail!(
                "{} holds vendor {} device {} class {}: not a function this emulator makes",
                dir.display(),
                vendor.trim(),
                device.trim(),
                class.trim()
            )
        }
        (Err(e), _, _) if e.kind() == io::ErrorKind::NotFound && !dir.exists() => Ok(None),
        _ => bail!(
            "{} exists but has no readable vendor/device/class: not a function this emulator made",
            dir.display()
        ),
    }
}

/// Checks an NVMe namespace's arguments and spells them as the kernel would.
pub(super) fn nvme_disk(
    bdf: &str,
    ctrl: u32,
    ns: u32,
    nsid: u32,
    uuid: &str,
) -> anyhow::Result<(DiskId, DiskAttrs)> {
    validate_bdf(bdf)?;
    if nsid == 0 || nsid == u32::MAX {
        bail!("invalid NVMe namespace id {nsid}: valid ids are 1..=0xfffffffe");
    }
    // The kernel prints the UUID with %pU: lowercase, hyphenated.
    let uuid = uuid::Uuid::parse_str(uuid)
        .with_context(|| format!("invalid namespace UUID {uuid:?}"))?
        .hyphenated()
        .to_string();
    let id = DiskId::Nvme {
        bdf: bdf.to_owned(),
        ctrl,
        ns,
    };
    Ok((id, DiskAttrs::Nvme { nsid, uuid }))
}

/// Checks a virtio-blk disk's arguments and cuts the serial as the device does.
pub(super) fn virtio_disk(
    bdf: &str,
    virtio: u32,
    disk: &str,
    serial: &str,
) -> anyhow::Result<(DiskId, DiskAttrs)> {
    validate_bdf(bdf)?;
    validate_disk_name(disk)?;
    // The device holds 20 bytes, NUL-padded; the kernel prints up to the
    // first NUL. A longer serial is cut here as the device would cut it.
    let serial = serial.as_bytes();
    let serial = serial.split(|&b| b == 0).next().unwrap_or_default();
    let serial = serial[..serial.len().min(VIRTIO_BLK_ID_BYTES)].to_vec();
    let id = DiskId::VirtioBlk {
        bdf: bdf.to_owned(),
        virtio,
        disk: disk.to_owned(),
    };
    Ok((id, DiskAttrs::VirtioBlk { serial }))
}

/// A disk's place in the tree, which is also its identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum DiskId {
    Nvme {
        bdf: String,
        ctrl: u32,
        ns: u32,
    },
    VirtioBlk {
        bdf: String,
        virtio: u32,
        disk: String,
    },
}

impl DiskId {
    pub(super) fn bdf(&self) -> &str {
        match self {
            DiskId::Nvme { bdf, .. } | DiskId::VirtioBlk { bdf, .. } => bdf,
        }
    }

    fn kind(&self) -> FunctionKind {
        match self {
            DiskId::Nvme { .. } => FunctionKind::Nvme,
            DiskId::VirtioBlk { .. } => FunctionKind::VirtioBlk,
        }
    }

    /// The record's file name: unambiguous because every part is validated
    /// (`n` and `_` cannot occur inside the numbers or the disk name). It has
    /// no domain: the records are the emulator's own, in its state directory,
    /// and a restart in another domain still releases them all.
    pub(super) fn key(&self) -> String {
        match self {
            DiskId::Nvme { bdf, ctrl, ns } => format!("{bdf}_nvme{ctrl}n{ns}"),
            DiskId::VirtioBlk { bdf, virtio, disk } => format!("{bdf}_virtio{virtio}_{disk}"),
        }
    }

    /// The prefix of the keys of every disk of the function at `bdf`.
    pub(super) fn key_prefix(bdf: &str) -> String {
        format!("{bdf}_")
    }

    /// Directories below the function's, outermost first; the last is the disk's.
    fn rel_dirs(&self, names: NvmeNames) -> Vec<String> {
        match self {
            DiskId::Nvme { ctrl, ns, .. } => {
                let [controller, namespace] = names.dirs(*ctrl, *ns);
                vec!["nvme".to_owned(), controller, namespace]
            }
            DiskId::VirtioBlk { virtio, disk, .. } => {
                vec![format!("virtio{virtio}"), "block".to_owned(), disk.clone()]
            }
        }
    }

    /// Parses a path relative to `bus/pci/devices`; only the exact spelling
    /// `rel_dirs` produces, in `names`' domain, is accepted.
    fn parse(rel: &Path, names: NvmeNames) -> Option<DiskId> {
        let parts: Vec<&str> = rel
            .components()
            .map(|c| c.as_os_str().to_str())
            .collect::<Option<_>>()?;
        let [function, a, b, c] = parts.as_slice() else {
            return None;
        };
        let bdf = domain_bdf(names.domain, function)?;
        let id = if *a == "nvme" {
            let (ctrl, ns) = names.parse(b, c)?;
            DiskId::Nvme {
                bdf: bdf.to_owned(),
                ctrl,
                ns,
            }
        } else {
            validate_disk_name(c).ok()?;
            DiskId::VirtioBlk {
                bdf: bdf.to_owned(),
                virtio: number(a.strip_prefix("virtio")?)?,
                disk: (*c).to_owned(),
            }
        };
        (id.rel_dirs(names) == [*a, *b, *c]).then_some(id)
    }
}

/// The PCI address part of a record key, for taking the function's lock.
pub(super) fn key_bdf(key: &str) -> Option<&str> {
    let bdf = key.split('_').next()?;
    validate_bdf(bdf).ok().map(|()| bdf)
}

/// The BDF of the directory `name` if it is a function's in `domain`
/// (`<domain>:<bdf>`, spelt as the kernel does).
fn domain_bdf(domain: PciDomain, name: &str) -> Option<&str> {
    let (prefix, bdf) = name.split_once(':')?;
    (prefix == domain.to_string() && validate_bdf(bdf).is_ok()).then_some(bdf)
}

#[derive(Debug)]
pub(super) enum DiskAttrs {
    Nvme { nsid: u32, uuid: String },
    VirtioBlk { serial: Vec<u8> },
}

impl DiskAttrs {
    /// What names the disk's volume to a reader: the namespace UUID or the serial.
    pub(super) fn identity(&self) -> String {
        match self {
            DiskAttrs::Nvme { uuid, .. } => uuid.clone(),
            DiskAttrs::VirtioBlk { serial } => String::from_utf8_lossy(serial).into_owned(),
        }
    }
}

/// `bus:device.function` without the domain, in the kernel's lowercase hex.
pub(super) fn validate_bdf(bdf: &str) -> anyhow::Result<()> {
    let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
    let ok = match bdf.as_bytes() {
        &[b0, b1, b':', d0, d1, b'.', f] => {
            hex(b0) && hex(b1) && hex(d0) && hex(d1) && d0 <= b'1' && (b'0'..=b'7').contains(&f)
        }
        _ => false,
    };
    if !ok {
        bail!(
            "invalid PCI address {bdf:?}: expected bus:device.function without the domain, \
             lowercase hex, device at most 1f, function at most 7 (e.g. \"26:00.1\")"
        );
    }
    Ok(())
}

/// A block device name as the kernel would make it (`vda`, `vdab`): it becomes
/// a directory name and part of a record's file name.
pub(super) fn validate_disk_name(disk: &str) -> anyhow::Result<()> {
    let ok = disk.len() < 32
        && disk.starts_with(|c: char| c.is_ascii_lowercase())
        && disk
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !ok {
        bail!("invalid disk name {disk:?}: expected lowercase letters and digits, like \"vda\"");
    }
    Ok(())
}

/// Refuses a root whose tree would land in, or be deleted from, the real system.
fn refuse_system_root(root: &Path) -> anyhow::Result<()> {
    if root == Path::new("/")
        || ["/sys", "/proc", "/dev"]
            .iter()
            .any(|p| root.starts_with(p))
    {
        bail!(
            "refusing {} as the emulated sysfs root: the emulator creates and deletes \
             bus/pci/devices/<domain>:* there; use a directory of its own",
            root.display()
        );
    }
    Ok(())
}

/// Whether `dir` already holds `files` with exactly these contents.
fn dir_holds(dir: &Path, files: &[(&str, Vec<u8>)]) -> bool {
    files
        .iter()
        .all(|(name, contents)| fs::read(dir.join(name)).is_ok_and(|have| have == *contents))
}

/// Rewrites one file so that a reader sees the old or the new contents, never a mix.
fn replace_file(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| anyhow!("{} has no file name", path.display()))?;
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    fs::write(&tmp, contents)
        .and_then(|()| fs::rename(&tmp, path))
        .inspect_err(|_| {
            let _ = fs::remove_file(&tmp);
        })
        .with_context(|| format!("writing {}", path.display()))
}

/// The directories in `dir`, none if it is missing.
fn subdirs(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            found.push(entry.path());
        }
    }
    Ok(found)
}

pub(super) fn remove_dir_all_if_present(dir: &Path) -> anyhow::Result<()> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", dir.display()))
        }
        _ => Ok(()),
    }
}

pub(super) fn remove_dir_if_empty(dir: &Path) -> anyhow::Result<()> {
    match fs::remove_dir(dir) {
        Err(e)
            if !matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::DirectoryNotEmpty
            ) =>
        {
            Err(e).with_context(|| format!("removing {}", dir.display()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_ids_round_trip() {
        for id in [
            DiskId::Nvme {
                bdf: "26:00.1".into(),
                ctrl: 11,
                ns: 1,
            },
            DiskId::Nvme {
                bdf: "26:00.1".into(),
                ctrl: 1,
                ns: 11,
            },
            DiskId::VirtioBlk {
                bdf: "ff:1f.7".into(),
                virtio: 3,
                disk: "vdab".into(),
            },
        ] {
            for naming in [NvmeNaming::NativeMultipath, NvmeNaming::PerController] {
                let names = NvmeNames {
                    domain: "1f".parse().unwrap(),
                    naming,
                };
                let mut rel = PathBuf::from(format!("001f:{}", id.bdf()));
                rel.extend(id.rel_dirs(names));
                assert_eq!(DiskId::parse(&rel, names), Some(id.clone()));
                let elsewhere = NvmeNames {
                    domain: PciDomain::default(),
                    naming,
                };
                assert_eq!(DiskId::parse(&rel, elsewhere), None);
            }
            assert_eq!(key_bdf(&id.key()), Some(id.bdf()));
        }
        for bad in [
            "0000:26:00.1/nvme/nvme0/nvme1n1",
            "0000:26:00.1/nvme/nvme00/nvme00n1",
            "0000:26:00.1/nvme/nvme0/nvme0n+1",
            "0000:26:00.1/virtio0/disk/vda",
            "0000:26:00.1/virtio0/block/../x",
            "26:00.1/virtio0/block/vda",
            "0000:26:00.1/virtio0/block",
            "0:26:00.1/virtio0/block/vda",
        ] {
            let names = NvmeNames {
                domain: PciDomain::default(),
                naming: NvmeNaming::PerController,
            };
            assert_eq!(DiskId::parse(Path::new(bad), names), None, "{bad}");
        }
    }
}
