//! Block-device lookup through sysfs, the way NVIDIA's node plugin does it and
//! the kernel lays it out:
//!
//! - NVMe: `<root>/bus/pci/devices/<BDF>/nvme/nvme*/nvme*n*` whose `nsid`
//!   matches, whose `uuid` matches when we know it (a reused function must not
//!   hand us someone else's namespace), and whose `size` is non-zero (zero
//!   means the namespace is not ready). With native multipath the controller
//!   lists path devices `nvmeXcYnZ`, which have no device node; the disk is
//!   the head `nvmeXnZ` under `<root>/block`.
//! - virtio-blk: `<root>/bus/pci/devices/<BDF>/virtio*/block/*` whose `serial`
//!   matches.
//! - virtio-fs (no block device): `<root>/fs/virtiofs/<n>/tag` names each
//!   device's tag, where the kernel has it (6.9+).
//!
//! The root is configurable so that the same code reads the SNAP emulator's
//! tree. The device node is resolved from the `dev` major:minor through the
//! machine's real `/sys/dev/block`, and checked against the node's rdev.

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// What went wrong while reading sysfs or resolving a device node.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("unexpected content {content:?} in {}", path.display())]
    Parse { path: PathBuf, content: String },
    /// The namespace at the volume's NSID shows no UUID to check it by.
    #[error(
        "{} has the volume's NSID but no UUID (the volume's is {expected}), and its \
         subsystem is shared, so no serial names the volume: the host cannot tell it \
         from another volume's namespace, so it is not used",
        namespace.display()
    )]
    NoUuid {
        namespace: PathBuf,
        expected: String,
    },
    #[error("no device node for block device {major}:{minor}")]
    NoDeviceNode { major: u32, minor: u32 },
    /// No kernel reports this: a corrupt or hostile tree must not wrap to a
    /// small size that then passes our size checks.
    #[error("{} says {sectors} sectors: more than 2^64 bytes", path.display())]
    SizeOverflow { path: PathBuf, sectors: u64 },
}

/// A block device found on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockDevice {
    /// Kernel name: `nvme0n1`, `vda`.
    pub name: String,
    /// The device node to open, e.g. `/dev/nvme0n1` (or `/dev/loop3` behind the emulator).
    pub node: PathBuf,
    pub major: u32,
    pub minor: u32,
    pub size_bytes: u64,
}

/// Reads a sysfs tree rooted at `root` (`/sys` on a real host).
#[derive(Debug, Clone)]
pub struct Sysfs {
    root: PathBuf,
    /// The machine's real sysfs, where `dev/block/M:m` names the device.
    kernel_sysfs: PathBuf,
    dev_dir: PathBuf,
}

impl Sysfs {
    /// A reader for the tree at `root`; device nodes resolve through the
    /// machine's `/sys` and `/dev`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Sysfs {
            root: root.into(),
            kernel_sysfs: PathBuf::from("/sys"),
            dev_dir: PathBuf::from("/dev"),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn function_dir(&self, bdf: &str) -> PathBuf {
        self.root.join("bus/pci/devices").join(normalize_bdf(bdf))
    }

    /// The namespace `nsid` under the NVMe function at `bdf`, if the host sees
    /// it with a non-zero size (and, when given, the expected UUID; where the
    /// kernel lists none, the controller's `serial`, when the subsystem is
    /// the volume's own and so names it).
    pub fn find_nvme_namespace(
        &self,
        bdf: &str,
        nsid: u32,
        uuid: Option<&str>,
        serial: Option<&str>,
    ) -> Result<Option<BlockDevice>, HostError> {
        for (namespace, disk) in self.nvme_namespaces(&self.function_dir(bdf))? {
            // A namespace that vanishes between the listing and these reads
            // is another's, detached meanwhile from the same (pool)
            // controller: not ours, and no reason to fail.
            let Some(found_nsid) = read_optional(&namespace.join("nsid"))? else {
                continue;
            };
            if found_nsid.trim().parse::<u32>().ok() != Some(nsid) {
                continue;
            }
            if let Some(expected) = uuid {
                let ours = match (read_optional(&namespace.join("uuid"))?, serial) {
                    (Some(found), _) => found.trim().eq_ignore_ascii_case(expected),
                    // The kernel lists no `uuid` for a namespace that reports
                    // neither a UUID nor an NGUID (and ignores QEMU's). A
                    // subsystem of the volume's own carries the volume's
                    // serial, which the host shows on its controller.
                    (None, Some(serial)) => {
                        let controller = namespace.parent().unwrap_or(&namespace);
                        read_optional(&controller.join("serial"))?
                            .is_some_and(|shown| shown.trim() == serial)
                    }
                    // A shared subsystem's namespace could be ours or a
                    // stranger's: say so rather than guess or wait.
                    (None, None) => {
                        return Err(HostError::NoUuid {
                            namespace,
                            expected: expected.to_owned(),
                        });
                    }
                };
                if !ours {
                    continue;
                }
            }
            return self.block_device(&disk);
        }
        Ok(None)
    }

    /// The NVMe namespaces under a function, each with the directory of its
    /// disk (the multipath head's, when the namespace is a path).
    fn nvme_namespaces(&self, function: &Path) -> Result<Vec<(PathBuf, PathBuf)>, HostError> {
        let mut found = Vec::new();
        for controller in subdirs(&function.join("nvme"))? {
            let controller_name = file_name(&controller);
            for namespace in subdirs(&controller)? {
                let name = file_name(&namespace);
                if !is_namespace_of(&controller_name, &name) {
                    continue;
                }
                let disk = match multipath_head(&name) {
                    Some(head) => self.root.join("block").join(head),
                    None => namespace.clone(),
                };
                found.push((namespace, disk));
            }
        }
        Ok(found)
    }

    /// The virtio-blk disks under a function.
    fn virtio_disks(function: &Path) -> Result<Vec<PathBuf>, HostError> {
        let mut found = Vec::new();
        for virtio in subdirs(function)? {
            if file_name(&virtio).starts_with("virtio") {
                found.extend(subdirs(&virtio.join("block"))?);
            }
        }
        Ok(found)
    }

    /// Which emulated function's disk has the device number `major:minor`
    /// now, described by its kernel name, function and identity (for a
    /// message saying what a mount sits on); `None` if no function shows it.
    pub fn describe_device(&self, major: u32, minor: u32) -> Result<Option<String>, HostError> {
        let is_it = |disk: &Path| -> Result<bool, HostError> {
            let dev = read_optional(&disk.join("dev"))?;
            Ok(dev.is_some_and(|dev| dev.trim() == format!("{major}:{minor}")))
        };
        for function in subdirs(&self.root.join("bus/pci/devices"))? {
            let bdf = file_name(&function);
            for (namespace, disk) in self.nvme_namespaces(&function)? {
                if is_it(&disk)? {
                    let nsid = read_trimmed(&namespace.join("nsid"))?;
                    let uuid = read_optional(&namespace.join("uuid"))?.unwrap_or_default();
                    return Ok(Some(format!(
                        "{} of function {bdf}, NSID {nsid}, UUID {}",
                        file_name(&disk),
                        uuid.trim()
                    )));
                }
            }
            for disk in Self::virtio_disks(&function)? {
                if is_it(&disk)? {
                    let serial = read_optional(&disk.join("serial"))?.unwrap_or_default();
                    return Ok(Some(format!(
                        "{} of function {bdf}, serial {:?}",
                        file_name(&disk),
                        serial.trim()
                    )));
                }
            }
        }
        Ok(None)
    }

    /// The virtio-blk disk under the function at `bdf` whose serial is `serial`.
    pub fn find_virtio_blk(
        &self,
        bdf: &str,
        serial: &str,
    ) -> Result<Option<BlockDevice>, HostError> {
        for disk in Self::virtio_disks(&self.function_dir(bdf))? {
            match read_optional(&disk.join("serial"))? {
                Some(found) if found.trim() == serial => return self.block_device(&disk),
                _ => continue,
            }
        }
        Ok(None)
    }

    /// A disk directory's device, or `None` while its size is still zero.
    fn block_device(&self, disk: &Path) -> Result<Option<BlockDevice>, HostError> {
        // A disk not there yet is not ready, as one of size 0 is: a real
        // kernel lists a namespace's path before its multipath head's disk
        // (seen on Linux 6.12 while a controller is hot-plugged).
        let size_path = disk.join("size");
        let Some(size) = read_optional(&size_path)? else {
            return Ok(None);
        };
        let sectors = parse(&size_path, size.trim())?;
        if sectors == 0 {
            return Ok(None);
        }
        let dev_path = disk.join("dev");
        let Some(dev) = read_optional(&dev_path)? else {
            return Ok(None);
        };
        let dev = dev.trim().to_owned();
        let (major, minor) = dev
            .split_once(':')
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
            .ok_or_else(|| HostError::Parse {
                path: dev_path.clone(),
                content: dev.clone(),
            })?;
        // A disk whose node is not made yet (or is still the previous disk
        // of its name's) is not ready either: seen on 6.12 under load, a
        // virtio-blk disk plugged as vda just after the last vda went.
        let node = match self.device_node(major, minor) {
            Err(HostError::NoDeviceNode { .. }) => return Ok(None),
            node => node?,
        };
        Ok(Some(BlockDevice {
            name: file_name(disk),
            node,
            major,
            minor,
            size_bytes: sectors.checked_mul(512).ok_or(HostError::SizeOverflow {
                path: size_path,
                sectors,
            })?,
        }))
    }

    /// `/dev/<DEVNAME>` for `major:minor`, checked to be that block device.
    pub fn device_node(&self, major: u32, minor: u32) -> Result<PathBuf, HostError> {
        let uevent = self
            .kernel_sysfs
            .join(format!("dev/block/{major}:{minor}/uevent"));
        let content = match read_optional(&uevent)? {
            Some(content) => content,
            None => return Err(HostError::NoDeviceNode { major, minor }),
        };
        let name = content
            .lines()
            .find_map(|line| line.strip_prefix("DEVNAME="))
            .ok_or(HostError::NoDeviceNode { major, minor })?;
        let node = self.dev_dir.join(name);
        match fs::metadata(&node) {
            Ok(meta)
                if meta.file_type().is_block_device()
                    && nix::sys::stat::major(meta.rdev()) == u64::from(major)
                    && nix::sys::stat::minor(meta.rdev()) == u64::from(minor) =>
            {
                Ok(node)
            }
            _ => Err(HostError::NoDeviceNode { major, minor }),
        }
    }
}

/// `"26:00.1"` or `"0000:26:00.1"` -> `"0000:26:00.1"` (sysfs names carry the
/// PCI domain; SNAP reports addresses without it).
impl Sysfs {
    /// Whether the host shows a virtio-fs device with `tag`; `None` when the
    /// tree has no `fs/virtiofs`: then only a mount can tell. A 6.9+ kernel
    /// with virtio-fs built in (Debian's) has the directory from boot, empty
    /// until a device comes; where virtio-fs is a module it comes with the
    /// module; a kernel before 6.9 never has it.
    pub fn virtio_fs_tag_shown(&self, tag: &str) -> Result<Option<bool>, HostError> {
        let dir = self.root.join("fs/virtiofs");
        if !dir.is_dir() {
            return Ok(None);
        }
        for device in subdirs(&dir)? {
            if read_optional(&device.join("tag"))?.is_some_and(|t| t.trim_end() == tag) {
                return Ok(Some(true));
            }
        }
        Ok(Some(false))
    }
}

pub fn normalize_bdf(bdf: &str) -> String {
    let bdf = bdf.trim().to_ascii_lowercase();
    if bdf.matches(':').count() >= 2 {
        bdf
    } else {
        format!("0000:{bdf}")
    }
}

/// Whether `entry` under controller `nvme<C>` is one of its namespaces:
/// `nvme<C>n<N>`, or with native multipath the path `nvme<S>c<C>n<N>`, named
/// after the subsystem's instance `S` (a controller of a subsystem that has
/// several holds e.g. `nvme2c1n1` under `nvme1`: a real kernel's naming,
/// issue 33); `nvme<C>` itself, `ng<C>n<N>` and other entries do not.
fn is_namespace_of(controller: &str, entry: &str) -> bool {
    let number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let Some(ctrl) = controller.strip_prefix("nvme").filter(|c| number(c)) else {
        return false;
    };
    let Some((head, nsid)) = entry.strip_prefix("nvme").and_then(|e| e.rsplit_once('n')) else {
        return false;
    };
    number(nsid)
        && match head.split_once('c') {
            Some((subsystem, path)) => number(subsystem) && path == ctrl,
            None => head == ctrl,
        }
}

/// `nvme0c1n2` -> `nvme0n2`; `None` for a non-multipath name.
fn multipath_head(name: &str) -> Option<String> {
    let rest = name.strip_prefix("nvme")?;
    let (subsystem, rest) = rest.split_once('c')?;
    let (_path, namespace) = rest.split_once('n')?;
    Some(format!("nvme{subsystem}n{namespace}"))
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Subdirectories of `dir`, sorted; none when `dir` does not exist.
fn subdirs(dir: &Path) -> Result<Vec<PathBuf>, HostError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(HostError::Read {
                path: dir.to_path_buf(),
                source,
            });
        }
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    Ok(dirs)
}

fn read_optional(path: &Path) -> Result<Option<String>, HostError> {
    match fs::read_to_string(path) {
        Ok(content) => Ok(Some(content)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(HostError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn read_trimmed(path: &Path) -> Result<String, HostError> {
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|source| HostError::Read {
            path: path.to_path_buf(),
            source,
        })
}

fn parse(path: &Path, content: &str) -> Result<u64, HostError> {
    content.parse().map_err(|_| HostError::Parse {
        path: path.to_path_buf(),
        content: content.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bdf_gets_a_domain_once() {
        assert_eq!(normalize_bdf("26:00.1"), "0000:26:00.1");
        assert_eq!(normalize_bdf("0000:26:00.1"), "0000:26:00.1");
        assert_eq!(normalize_bdf("AF:00.7"), "0000:af:00.7");
    }

    #[test]
    fn multipath_path_maps_to_its_head() {
        assert_eq!(multipath_head("nvme0c1n2").as_deref(), Some("nvme0n2"));
        assert_eq!(multipath_head("nvme0n2"), None);
        assert!(is_namespace_of("nvme0", "nvme0n1"));
        // Paths are named after the subsystem's instance, then the
        // controller's (the guest suite's kernel, tests/guest_host.rs).
        assert!(is_namespace_of("nvme1", "nvme2c1n1"));
        assert!(is_namespace_of("nvme0", "nvme0c0n12"));
        assert!(!is_namespace_of("nvme2", "nvme2c1n1"));
        assert!(!is_namespace_of("nvme1", "nvme10n1"));
        assert!(!is_namespace_of("nvme1", "nvme2c10n1"));
        for other in ["device", "nvme1", "ng1n1", "nvme1n", "nvme1c1", "nvme1nx"] {
            assert!(!is_namespace_of("nvme1", other), "{other}");
        }
    }

    /// A tree shaped like the kernel's, pointing at a block device this machine
    /// really has (the first loop device, or any), so node resolution is real.
    fn any_block_device() -> Option<(u32, u32)> {
        let entries = fs::read_dir("/sys/dev/block").ok()?;
        entries.filter_map(Result::ok).find_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let (a, b) = name.split_once(':')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
    }

    fn write(path: &Path, content: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }

    #[test]
    fn finds_nvme_namespace_by_nsid_and_uuid_and_skips_not_ready() {
        let (major, minor) = any_block_device().expect("this machine has a block device");
        let root = tempfile::tempdir().unwrap();
        let ctrl = root.path().join("bus/pci/devices/0000:26:00.2/nvme/nvme3");
        // nsid 7 shows as nvme3n1: the kernel's name is not the nsid.
        write(&ctrl.join("nvme3n1/nsid"), "7\n");
        write(
            &ctrl.join("nvme3n1/uuid"),
            "0b0a0c3e-0000-4000-8000-000000000001\n",
        );
        write(&ctrl.join("nvme3n1/size"), "2048\n");
        write(&ctrl.join("nvme3n1/dev"), &format!("{major}:{minor}\n"));
        write(&ctrl.join("nvme3n2/nsid"), "8\n");
        write(
            &ctrl.join("nvme3n2/uuid"),
            "0b0a0c3e-0000-4000-8000-000000000002\n",
        );
        write(&ctrl.join("nvme3n2/size"), "0\n");
        write(&ctrl.join("nvme3n2/dev"), &format!("{major}:{minor}\n"));
        let sysfs = Sysfs::new(root.path());

        let found = sysfs
            .find_nvme_namespace(
                "26:00.2",
                7,
                Some("0B0A0C3E-0000-4000-8000-000000000001"),
                None,
            )
            .unwrap()
            .expect("namespace 7");
        assert_eq!(found.name, "nvme3n1");
        assert_eq!(found.size_bytes, 2048 * 512);
        assert_eq!((found.major, found.minor), (major, minor));
        assert!(found.node.starts_with("/dev"));

        let wrong_uuid = sysfs
            .find_nvme_namespace(
                "26:00.2",
                7,
                Some("0b0a0c3e-0000-4000-8000-00000000ffff"),
                None,
            )
            .unwrap();
        assert_eq!(wrong_uuid, None, "a reused function must not match");
        assert_eq!(
            sysfs.find_nvme_namespace("26:00.2", 8, None, None).unwrap(),
            None,
            "size 0 is not ready"
        );
        assert_eq!(
            sysfs.find_nvme_namespace("26:00.3", 7, None, None).unwrap(),
            None
        );
        assert_eq!(
            sysfs.describe_device(major, minor).unwrap().as_deref(),
            Some(
                "nvme3n1 of function 0000:26:00.2, NSID 7, UUID 0b0a0c3e-0000-4000-8000-000000000001"
            ),
            "the first disk with that number, named with its identity"
        );
        assert_eq!(sysfs.describe_device(major, minor + 1000).unwrap(), None);
    }

    #[test]
    fn a_namespace_without_a_uuid_is_found_by_its_controllers_serial_or_refused() {
        let (major, minor) = any_block_device().expect("this machine has a block device");
        let root = tempfile::tempdir().unwrap();
        // As the guest's kernel lists QEMU's namespaces: no `uuid`.
        let ns = root
            .path()
            .join("bus/pci/devices/0000:01:00.0/nvme/nvme1/nvme0c1n1");
        write(&ns.join("nsid"), "1\n");
        write(&ns.join("size"), "2048\n");
        let head = root.path().join("block/nvme0n1");
        write(&head.join("size"), "2048\n");
        write(&head.join("dev"), &format!("{major}:{minor}\n"));
        let sysfs = Sysfs::new(root.path());
        let uuid = Some("0b0a0c3e-0000-4000-8000-000000000001");

        // A shared subsystem's namespace: nothing names the volume.
        let refused = sysfs
            .find_nvme_namespace("01:00.0", 1, uuid, None)
            .unwrap_err();
        assert!(
            matches!(&refused, HostError::NoUuid { namespace, .. } if *namespace == ns),
            "{refused}"
        );
        // The volume's own subsystem: its controller shows the volume's
        // serial, or it is another volume's function.
        let own = |serial| sysfs.find_nvme_namespace("01:00.0", 1, uuid, Some(serial));
        assert_eq!(
            own("sc-0123456789abcdef0").unwrap(),
            None,
            "no serial shown"
        );
        write(
            &ns.parent().unwrap().join("serial"),
            "sc-0123456789abcdef0\n",
        );
        let found = own("sc-0123456789abcdef0").unwrap();
        assert_eq!(found.map(|d| d.name).as_deref(), Some("nvme0n1"));
        assert_eq!(own("sc-fedcba9876543210f").unwrap(), None);

        let found = sysfs.find_nvme_namespace("01:00.0", 1, None, None).unwrap();
        assert_eq!(found.map(|d| d.name).as_deref(), Some("nvme0n1"));
    }

    #[test]
    fn a_disk_without_its_device_node_yet_is_not_ready() {
        let root = tempfile::tempdir().unwrap();
        let disk = root
            .path()
            .join("bus/pci/devices/0000:27:00.0/virtio3/block/vda");
        write(&disk.join("serial"), "sn-1\n");
        write(&disk.join("size"), "2048\n");
        // No machine has a block device at this number: no node for it.
        write(&disk.join("dev"), "4095:1048575\n");
        let sysfs = Sysfs::new(root.path());
        assert_eq!(sysfs.find_virtio_blk("27:00.0", "sn-1").unwrap(), None);
    }

    #[test]
    fn a_namespace_whose_head_is_not_registered_yet_is_not_ready() {
        let (major, minor) = any_block_device().expect("this machine has a block device");
        let root = tempfile::tempdir().unwrap();
        // A controller hot-plugged under native multipath: its path is
        // listed before the head's disk exists.
        let ns = root
            .path()
            .join("bus/pci/devices/0000:01:00.0/nvme/nvme0/nvme0c0n1");
        write(&ns.join("nsid"), "1\n");
        let sysfs = Sysfs::new(root.path());
        assert_eq!(
            sysfs.find_nvme_namespace("01:00.0", 1, None, None).unwrap(),
            None
        );
        let head = root.path().join("block/nvme0n1");
        write(&head.join("size"), "2048\n");
        assert_eq!(
            sysfs.find_nvme_namespace("01:00.0", 1, None, None).unwrap(),
            None
        );
        write(&head.join("dev"), &format!("{major}:{minor}\n"));
        let found = sysfs.find_nvme_namespace("01:00.0", 1, None, None).unwrap();
        assert_eq!(found.map(|d| d.name).as_deref(), Some("nvme0n1"));
    }

    #[test]
    fn a_namespace_detached_during_the_lookup_is_skipped() {
        let (major, minor) = any_block_device().expect("this machine has a block device");
        let root = tempfile::tempdir().unwrap();
        let ctrl = root.path().join("bus/pci/devices/0000:26:00.3/nvme/nvme3");
        // Another volume's namespace on the same pool controller, listed but
        // gone by the time its attributes are read (its files removed first).
        fs::create_dir_all(ctrl.join("nvme3n1")).unwrap();
        write(&ctrl.join("nvme3n2/nsid"), "2\n");
        write(&ctrl.join("nvme3n2/size"), "8\n");
        write(&ctrl.join("nvme3n2/dev"), &format!("{major}:{minor}\n"));
        let found = Sysfs::new(root.path())
            .find_nvme_namespace("26:00.3", 2, None, None)
            .unwrap()
            .expect("namespace 2");
        assert_eq!(found.name, "nvme3n2");
    }

    #[test]
    fn finds_virtio_blk_by_serial() {
        let (major, minor) = any_block_device().expect("this machine has a block device");
        let root = tempfile::tempdir().unwrap();
        let func = root.path().join("bus/pci/devices/0000:36:00.1");
        write(&func.join("virtio4/block/vdb/serial"), "other\n");
        write(&func.join("virtio4/block/vdb/size"), "8\n");
        write(
            &func.join("virtio4/block/vdb/dev"),
            &format!("{major}:{minor}\n"),
        );
        write(&func.join("virtio5/block/vdc/serial"), "pvc-42\n");
        write(&func.join("virtio5/block/vdc/size"), "16\n");
        write(
            &func.join("virtio5/block/vdc/dev"),
            &format!("{major}:{minor}\n"),
        );
        let sysfs = Sysfs::new(root.path());
        let found = sysfs.find_virtio_blk("36:00.1", "pvc-42").unwrap().unwrap();
        assert_eq!(found.name, "vdc");
        assert_eq!(found.size_bytes, 16 * 512);
        assert_eq!(sysfs.find_virtio_blk("36:00.1", "pvc-43").unwrap(), None);
        assert_eq!(
            sysfs.describe_device(major, minor).unwrap().as_deref(),
            Some("vdb of function 0000:36:00.1, serial \"other\"")
        );
    }

    #[test]
    fn finds_a_virtio_fs_device_by_tag_where_the_kernel_lists_tags() {
        let root = tempfile::tempdir().unwrap();
        let sysfs = Sysfs::new(root.path());
        assert_eq!(sysfs.virtio_fs_tag_shown("sc-1").unwrap(), None);
        write(&root.path().join("fs/virtiofs/0/tag"), "sc-0\n");
        assert_eq!(sysfs.virtio_fs_tag_shown("sc-1").unwrap(), Some(false));
        write(&root.path().join("fs/virtiofs/1/tag"), "sc-1\n");
        assert_eq!(sysfs.virtio_fs_tag_shown("sc-1").unwrap(), Some(true));
        assert_eq!(sysfs.virtio_fs_tag_shown("sc-").unwrap(), Some(false));
    }

    #[test]
    fn a_size_past_u64_bytes_is_an_error_not_a_wrapped_size() {
        let (major, minor) = any_block_device().expect("this machine has a block device");
        let root = tempfile::tempdir().unwrap();
        let disk = root
            .path()
            .join("bus/pci/devices/0000:36:00.1/virtio5/block/vdc");
        write(&disk.join("serial"), "pvc-42\n");
        // 2^55 sectors of 512 bytes is 2^64 bytes: wraps to 0.
        write(&disk.join("size"), &format!("{}\n", 1u64 << 55));
        write(&disk.join("dev"), &format!("{major}:{minor}\n"));
        let error = Sysfs::new(root.path())
            .find_virtio_blk("36:00.1", "pvc-42")
            .unwrap_err();
        assert!(
            matches!(&error, HostError::SizeOverflow { sectors, .. } if *sectors == 1 << 55),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(
            message.contains("vdc/size") && message.contains("2^64"),
            "{message}"
        );
    }
}
