//! These tests make real loop devices, so they need root (as CI has). Each
//! fixture detaches whatever is left over its own files when it drops, so a
//! failing test does not leak devices into the next one.

use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::process::Command;

use super::*;

const MIB: u64 = 1 << 20;
const BDF: &str = "26:00.1";
const UUID: &str = "0B1C2D3E-4F50-6172-8394-A5B6C7D8E9F0";

/// The calls the emulator always queues, made synchronously here so that a
/// test sees their outcome (the queued ones only log a failure).
impl HostSide {
    /// Makes `nvme<ctrl>n<ns>` with namespace id `nsid` appear under `bdf`.
    fn attach_nvme_namespace(
        &self,
        bdf: &str,
        ctrl: u32,
        ns: u32,
        nsid: u32,
        uuid: &str,
        backing: &Backing,
    ) -> anyhow::Result<HostDisk> {
        let (id, attrs) = nvme_disk(bdf, ctrl, ns, nsid, uuid)?;
        self.attach(&id, &attrs, &Source::Direct(backing.clone()))
    }

    /// Makes `virtio<virtio>/block/<disk>` with `serial` appear under `bdf`.
    fn attach_virtio_blk(
        &self,
        bdf: &str,
        virtio: u32,
        disk: &str,
        serial: &str,
        backing: &Backing,
    ) -> anyhow::Result<HostDisk> {
        let (id, attrs) = virtio_disk(bdf, virtio, disk, serial)?;
        self.attach(&id, &attrs, &Source::Direct(backing.clone()))
    }

    fn attach(&self, id: &DiskId, attrs: &DiskAttrs, source: &Source) -> anyhow::Result<HostDisk> {
        let _guard = self.queue.lock(id.bdf());
        self.attach_locked(id, attrs, source)
            .with_context(|| format!("attaching {}", self.tree.disk_dir(id).display()))
    }

    fn resize(&self, disk: &HostDisk, backing: &Backing) -> anyhow::Result<()> {
        self.resize_queued(&queued(disk), backing)
    }

    fn detach(&self, disk: &HostDisk) -> anyhow::Result<()> {
        self.detach_queued(&queued(disk))
    }
}

fn queued(disk: &HostDisk) -> DiskRef {
    DiskRef {
        sysfs_dir: disk.sysfs_dir.clone(),
    }
}

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("sysfs")
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn open(&self) -> HostSide {
        HostSide::open(
            &self.root(),
            (PciDomain::default(), NvmeNaming::default()),
            &self.state(),
        )
        .expect("open host side")
    }

    /// A host side with one PCI function, where most tests start.
    fn open_with(&self, bdf: &str, kind: FunctionKind) -> HostSide {
        let host = self.open();
        host.add_pci_function(bdf, kind).expect("add PCI function");
        host
    }

    fn file(&self, name: &str, len: u64) -> PathBuf {
        let path = self.dir.path().join(name);
        File::create(&path)
            .and_then(|f| f.set_len(len))
            .expect("create backing file");
        path
    }

    fn devices(&self) -> PathBuf {
        fs::canonicalize(self.root())
            .expect("root")
            .join("bus/pci/devices")
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let Ok(entries) = fs::read_dir(self.dir.path()) else {
            return;
        };
        for entry in entries.flatten() {
            for dev in loops_over(&entry.path()) {
                let _ = Command::new("losetup").arg("-d").arg(&dev).status();
            }
        }
    }
}

/// `losetup -j`: every loop device over `path`, whoever made it.
fn loops_over(path: &Path) -> Vec<String> {
    let out = Command::new("losetup")
        .arg("-j")
        .arg(path)
        .output()
        .expect("run losetup -j");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_once(':').map(|(dev, _)| dev.to_owned()))
        .collect()
}

/// Attaches the way someone else would, outside our records.
fn foreign_loop(path: &Path, offset: u64, size: u64) -> String {
    let out = Command::new("losetup")
        .args(["--find", "--show", "--offset", &offset.to_string()])
        .args(["--sizelimit", &size.to_string()])
        .arg(path)
        .output()
        .expect("run losetup");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn backing(path: &Path, offset: u64, size: u64) -> Backing {
    Backing {
        path: path.to_owned(),
        offset,
        size,
        read_only: false,
    }
}

fn device_size(dev: &Path) -> u64 {
    File::open(dev)
        .and_then(|mut f| f.seek(SeekFrom::End(0)))
        .expect("measure device")
}

/// The directory of the disk's `dev`: a multipath path's head
/// (`<root>/bus/pci/devices/F/nvme/nvme0/nvme0c0n1` -> `<root>/block/nvme0n1`).
fn dev_dir(sysfs_dir: &Path) -> PathBuf {
    let name = sysfs_dir.file_name().unwrap().to_str().unwrap();
    let head = name
        .strip_prefix("nvme")
        .and_then(|rest| rest.split_once('c'))
        .and_then(|(s, rest)| Some(format!("nvme{s}n{}", rest.split_once('n')?.1)));
    match head {
        Some(head) => sysfs_dir
            .ancestors()
            .nth(7)
            .unwrap()
            .join("block")
            .join(head),
        None => sysfs_dir.to_owned(),
    }
}

/// Checks `dev` against the kernel's own view of the loop device, both ways.
fn check_dev(disk: &HostDisk) {
    let name = loopdev::name_of(&disk.loop_device).unwrap();
    let kernel = read(&Path::new("/sys/block").join(&name).join("dev"));
    assert_eq!(read(&dev_dir(&disk.sysfs_dir).join("dev")), kernel);
    assert_eq!(format!("{}:{}\n", disk.major, disk.minor), kernel);
    let rdev = fs::metadata(&disk.loop_device).unwrap().rdev();
    assert_eq!(loopdev::split_dev(rdev), (disk.major, disk.minor));
}

/// Writes through the loop device and finds the bytes in the backing file at
/// the backing offset.
fn check_data_path(disk: &HostDisk, file: &Path, backing_offset: u64, size: u64) {
    let dev = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&disk.loop_device)
        .expect("open loop device");
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    for at in [0, size / 2, size - pattern.len() as u64] {
        dev.write_all_at(&pattern, at).expect("write through loop");
        dev.sync_all().expect("fsync loop");
        let mut back = vec![0; pattern.len()];
        File::open(file)
            .unwrap()
            .read_exact_at(&mut back, backing_offset + at)
            .expect("read backing file");
        assert_eq!(back, pattern, "bytes written at {at} on the disk");
    }
    assert!(
        dev.write_all_at(&pattern, size).is_err(),
        "a write past the disk's end must fail"
    );
    assert_eq!(device_size(&disk.loop_device), size);
}

#[test]
fn pci_function_files() {
    let fx = Fixture::new();
    let host = fx.open();
    host.add_pci_function(BDF, FunctionKind::Nvme).unwrap();
    host.add_pci_function("26:00.2", FunctionKind::VirtioBlk)
        .unwrap();
    let nvme = fx.devices().join("0000:26:00.1");
    assert_eq!(read(&nvme.join("vendor")), "0x15b3\n");
    assert_eq!(read(&nvme.join("device")), "0x6001\n");
    assert_eq!(read(&nvme.join("class")), "0x010802\n");
    let vblk = fx.devices().join("0000:26:00.2");
    assert_eq!(read(&vblk.join("vendor")), "0x1af4\n");
    assert_eq!(read(&vblk.join("device")), "0x1042\n");
    assert_eq!(read(&vblk.join("class")), "0x010000\n");

    // Idempotent, but a function does not change kind.
    host.add_pci_function(BDF, FunctionKind::Nvme).unwrap();
    let err = host
        .add_pci_function(BDF, FunctionKind::VirtioBlk)
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("already exists as a NVMe"),
        "{err:#}"
    );

    host.remove_pci_function(BDF).unwrap();
    host.remove_pci_function(BDF).unwrap();
    assert!(!nvme.exists());
    assert!(vblk.exists());
}

#[test]
fn nvme_whole_file() {
    let fx = Fixture::new();
    let file = fx.file("ns.img", 16 * MIB);
    let host = fx.open_with(BDF, FunctionKind::Nvme);
    let disk = host
        .attach_nvme_namespace(BDF, 0, 1, 1, UUID, &backing(&file, 0, 16 * MIB))
        .unwrap();

    let function = fx.devices().join("0000:26:00.1");
    assert_eq!(disk.sysfs_dir, function.join("nvme/nvme0/nvme0c0n1"));
    let head = fx.root().join("block/nvme0n1");
    assert_eq!(dev_dir(&disk.sysfs_dir), head);
    assert!(
        !disk.sysfs_dir.join("dev").exists(),
        "a path has no device node"
    );
    for name in ["nsid", "uuid", "size"] {
        assert_eq!(read(&head.join(name)), read(&disk.sysfs_dir.join(name)));
    }
    assert_eq!(read(&disk.sysfs_dir.join("nsid")), "1\n");
    assert_eq!(
        read(&disk.sysfs_dir.join("uuid")),
        "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0\n"
    );
    assert_eq!(read(&disk.sysfs_dir.join("size")), "32768\n");
    check_dev(&disk);
    check_data_path(&disk, &file, 0, 16 * MIB);
    assert_eq!(loops_over(&file), [disk.loop_device.display().to_string()]);

    host.detach(&disk).unwrap();
    assert!(loops_over(&file).is_empty());
    assert!(!function.join("nvme").exists());
    assert!(!head.exists(), "the head goes with its path");
    assert!(function.join("class").exists());
    // Detaching what is gone succeeds.
    host.detach(&disk).unwrap();
}

#[test]
fn without_native_multipath_the_controller_holds_the_disk() {
    let fx = Fixture::new();
    let file = fx.file("ns.img", 4 * MIB);
    let naming = (PciDomain::default(), NvmeNaming::PerController);
    let host = HostSide::open(&fx.root(), naming, &fx.state()).unwrap();
    host.add_pci_function(BDF, FunctionKind::Nvme).unwrap();
    let disk = host
        .attach_nvme_namespace(BDF, 2, 1, 5, UUID, &backing(&file, 0, 4 * MIB))
        .unwrap();
    assert_eq!(
        disk.sysfs_dir,
        fx.devices().join("0000:26:00.1/nvme/nvme2/nvme2n1")
    );
    check_dev(&disk);
    assert!(!fx.root().join("block").exists(), "no heads");
    host.detach(&disk).unwrap();
    assert!(!fx.devices().join("0000:26:00.1/nvme").exists());
}

/// A host with two DPUs: each emulator's heads are named from its domain's
/// base, and its clean-up takes only its own.
#[test]
fn two_domains_name_their_heads_apart_and_clean_up_their_own() {
    let fx = Fixture::new();
    let file = fx.file("ns.img", 8 * MIB);
    let open = |domain: &str, state: &str| {
        let domain = (domain.parse().unwrap(), NvmeNaming::NativeMultipath);
        let host = HostSide::open(&fx.root(), domain, &fx.dir.path().join(state)).unwrap();
        host.add_pci_function(BDF, FunctionKind::Nvme).unwrap();
        host
    };
    let (first, second) = (open("0000", "a"), open("0001", "b"));
    let a = first
        .attach_nvme_namespace(BDF, 0, 1, 1, UUID, &backing(&file, 0, 4 * MIB))
        .unwrap();
    let b = second
        .attach_nvme_namespace(BDF, 0, 1, 1, UUID, &backing(&file, 4 * MIB, 4 * MIB))
        .unwrap();
    assert!(
        b.sysfs_dir
            .ends_with("0001:26:00.1/nvme/nvme65536/nvme65536c65536n1")
    );
    check_dev(&a);
    check_dev(&b);
    drop(second);
    first.shutdown().unwrap();
    let heads: Vec<_> = fs::read_dir(fx.root().join("block"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(heads, ["nvme65536n1"], "the other domain's head stays");
    open("0001", "b").shutdown().unwrap();
    assert!(!fx.root().join("block").exists());
    assert!(loops_over(&file).is_empty());
}

#[test]
fn nvme_byte_range() {
    let fx = Fixture::new();
    let file = fx.file("lvs.img", 16 * MIB);
    let host = fx.open_with(BDF, FunctionKind::Nvme);
    let disk = host
        .attach_nvme_namespace(BDF, 3, 2, 7, UUID, &backing(&file, 4 * MIB, 8 * MIB))
        .unwrap();
    assert!(disk.sysfs_dir.ends_with("nvme/nvme3/nvme3c3n2"));
    assert_eq!(read(&disk.sysfs_dir.join("nsid")), "7\n");
    assert_eq!(read(&disk.sysfs_dir.join("size")), "16384\n");
    check_dev(&disk);
    check_data_path(&disk, &file, 4 * MIB, 8 * MIB);

    // A second namespace of the same controller, over the next bytes.
    let second = host
        .attach_nvme_namespace(BDF, 3, 3, 8, UUID, &backing(&file, 12 * MIB, 4 * MIB))
        .unwrap();
    host.detach(&disk).unwrap();
    assert!(
        second.sysfs_dir.exists(),
        "the controller dir stays while it has namespaces"
    );
    host.detach(&second).unwrap();
    assert!(!fx.devices().join("0000:26:00.1/nvme").exists());
    assert!(loops_over(&file).is_empty());
}

#[test]
fn virtio_blk() {
    let fx = Fixture::new();
    let file = fx.file("vblk.img", 16 * MIB);
    let host = fx.open_with("3b:00.0", FunctionKind::VirtioBlk);
    let disk = host
        .attach_virtio_blk(
            "3b:00.0",
            2,
            "vdb",
            "vol-1234",
            &backing(&file, 4 * MIB, 8 * MIB),
        )
        .unwrap();
    let function = fx.devices().join("0000:3b:00.0");
    assert_eq!(disk.sysfs_dir, function.join("virtio2/block/vdb"));
    // As the kernel prints it: no newline.
    assert_eq!(read(&disk.sysfs_dir.join("serial")), "vol-1234");
    assert_eq!(read(&disk.sysfs_dir.join("size")), "16384\n");
    check_dev(&disk);
    check_data_path(&disk, &file, 4 * MIB, 8 * MIB);
    host.detach(&disk).unwrap();
    assert!(!function.join("virtio2").exists());
    assert!(function.exists());
    assert!(loops_over(&file).is_empty());

    // The device holds 20 bytes of serial; the host sees no more.
    let long = host
        .attach_virtio_blk(
            "3b:00.0",
            0,
            "vda",
            "0123456789abcdefghijKLMN",
            &backing(&file, 0, MIB),
        )
        .unwrap();
    assert_eq!(read(&long.sysfs_dir.join("serial")), "0123456789abcdefghij");
    host.detach(&long).unwrap();
}

#[test]
fn read_only() {
    let fx = Fixture::new();
    let file = fx.file("ro.img", 4 * MIB);
    let host = fx.open_with(BDF, FunctionKind::Nvme);
    let disk = host
        .attach_nvme_namespace(
            BDF,
            0,
            1,
            1,
            UUID,
            &Backing {
                read_only: true,
                ..backing(&file, 0, 4 * MIB)
            },
        )
        .unwrap();
    let name = loopdev::name_of(&disk.loop_device).unwrap();
    assert_eq!(read(&Path::new("/sys/block").join(name).join("ro")), "1\n");
    // Root may open it for writing; the write itself is refused.
    let dev = OpenOptions::new()
        .write(true)
        .open(&disk.loop_device)
        .unwrap();
    assert!(dev.write_all_at(b"x", 0).is_err());
    drop(dev);
    host.detach(&disk).unwrap();
    assert!(loops_over(&file).is_empty());
}

#[test]
fn block_device_backing() {
    let fx = Fixture::new();
    let file = fx.file("disk.img", 8 * MIB);
    // Someone else's block device, standing in for a real disk.
    let lower = foreign_loop(&file, 0, 8 * MIB);
    let host = fx.open_with(BDF, FunctionKind::Nvme);
    let disk = host
        .attach_nvme_namespace(
            BDF,
            0,
            1,
            1,
            UUID,
            &backing(Path::new(&lower), MIB, 2 * MIB),
        )
        .unwrap();
    assert_eq!(read(&disk.sysfs_dir.join("size")), "4096\n");
    check_data_path(&disk, &file, MIB, 2 * MIB);
    host.detach(&disk).unwrap();
    assert!(loops_over(Path::new(&lower)).is_empty());
    assert_eq!(loops_over(&file), [lower]);
}

#[test]
fn resize_grows_and_shrinks_in_place() {
    let fx = Fixture::new();
    let file = fx.file("lvs.img", 16 * MIB);
    let host = fx.open_with(BDF, FunctionKind::Nvme);
    let disk = host
        .attach_nvme_namespace(BDF, 0, 1, 1, UUID, &backing(&file, 4 * MIB, 4 * MIB))
        .unwrap();
    // The host keeps the disk open across the resize, as a mounted filesystem would.
    let held = File::open(&disk.loop_device).unwrap();

    host.resize(&disk, &backing(&file, 4 * MIB, 8 * MIB))
        .unwrap();
    assert_eq!(read(&disk.sysfs_dir.join("size")), "16384\n");
    let name = loopdev::name_of(&disk.loop_device).unwrap();
    assert_eq!(
        read(&Path::new("/sys/block").join(&name).join("size")),
        "16384\n"
    );
    check_data_path(&disk, &file, 4 * MIB, 8 * MIB);

    host.resize(&disk, &backing(&file, 4 * MIB, 2 * MIB))
        .unwrap();
    assert_eq!(read(&disk.sysfs_dir.join("size")), "4096\n");
    assert_eq!(device_size(&disk.loop_device), 2 * MIB);
    // Same size again: nothing to change, still fine.
    host.resize(&disk, &backing(&file, 4 * MIB, 2 * MIB))
        .unwrap();

    let err = host.resize(&disk, &backing(&file, 0, 2 * MIB)).unwrap_err();
    assert!(format!("{err:#}").contains("cannot move"), "{err:#}");
    let err = host
        .resize(&disk, &backing(&file, 4 * MIB, 14 * MIB))
        .unwrap_err();
    assert!(format!("{err:#}").contains("past its end"), "{err:#}");
    drop(held);
    host.detach(&disk).unwrap();
    assert!(loops_over(&file).is_empty());
}

#[test]
fn resize_after_the_file_grew() {
    let fx = Fixture::new();
    let file = fx.file("aio.img", 8 * MIB);
    let host = fx.open_with("3b:00.0", FunctionKind::VirtioBlk);
    let disk = host
        .attach_virtio_blk("3b:00.0", 0, "vda", "s", &backing(&file, 0, 8 * MIB))
        .unwrap();
    OpenOptions::new()
        .write(true)
        .open(&file)
        .and_then(|f| f.set_len(12 * MIB))
        .unwrap();
    host.resize(&disk, &backing(&file, 0, 12 * MIB)).unwrap();
    assert_eq!(read(&disk.sysfs_dir.join("size")), "24576\n");
    check_data_path(&disk, &file, 0, 12 * MIB);
    host.detach(&disk).unwrap();
}

#[test]
fn attach_is_idempotent_and_refuses_a_different_backing() {
    let fx = Fixture::new();
    let file = fx.file("ns.img", 8 * MIB);
    let host = fx.open_with(BDF, FunctionKind::Nvme);
    let b = backing(&file, 0, 4 * MIB);
    let first = host.attach_nvme_namespace(BDF, 0, 1, 1, UUID, &b).unwrap();
    let again = host.attach_nvme_namespace(BDF, 0, 1, 1, UUID, &b).unwrap();
    assert_eq!(first, again);
    assert_eq!(loops_over(&file).len(), 1);

    // A lost directory is put back by a retry.
    fs::remove_dir_all(&first.sysfs_dir).unwrap();
    let again = host.attach_nvme_namespace(BDF, 0, 1, 1, UUID, &b).unwrap();
    assert_eq!(first, again);
    assert_eq!(read(&first.sysfs_dir.join("size")), "8192\n");

    let err = host
        .attach_nvme_namespace(BDF, 0, 1, 1, UUID, &backing(&file, 4 * MIB, 4 * MIB))
        .unwrap_err();
    assert!(format!("{err:#}").contains("detach it first"), "{err:#}");
    assert_eq!(loops_over(&file).len(), 1);
    host.detach(&first).unwrap();
}

#[test]
fn bad_input_changes_nothing() {
    let fx = Fixture::new();
    let file = fx.file("ns.img", 4 * MIB);
    let host = fx.open();
    let b = backing(&file, 0, 4 * MIB);
    for bdf in [
        "0000:26:00.1",
        "26:00.8",
        "26:20.0",
        "26:0C.1",
        "2600.1",
        "",
    ] {
        assert!(
            host.add_pci_function(bdf, FunctionKind::Nvme).is_err(),
            "{bdf}"
        );
    }
    let err = host
        .attach_nvme_namespace(BDF, 0, 1, 1, UUID, &b)
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("add_pci_function first"),
        "{err:#}"
    );
    host.add_pci_function(BDF, FunctionKind::VirtioBlk).unwrap();
    let err = host
        .attach_nvme_namespace(BDF, 0, 1, 1, UUID, &b)
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("virtio-blk function"),
        "{err:#}"
    );
    for (disk, backing) in [
        ("vda", backing(&file, 0, 4 * MIB + 512)),
        ("vda", backing(&file, 3 * MIB, 2 * MIB)),
        ("vda", backing(&file, 0, 1000)),
        ("vda", backing(&file, u64::MAX - 511, 512)),
        ("vda", backing(&fx.dir.path().join("missing"), 0, 512)),
        ("vda", backing(fx.dir.path(), 0, 512)),
        ("../x", backing(&file, 0, 512)),
        ("VDA", backing(&file, 0, 512)),
    ] {
        let result = host.attach_virtio_blk(BDF, 0, disk, "s", &backing);
        assert!(result.is_err(), "{disk} {backing:?}");
    }
    assert!(
        host.attach_nvme_namespace("26:00.3", 0, 1, 0, UUID, &b)
            .is_err()
    );
    assert!(
        host.attach_nvme_namespace("26:00.3", 0, 1, 1, "not-a-uuid", &b)
            .is_err()
    );
    assert!(loops_over(&file).is_empty());
    assert!(!fx.devices().join("0000:26:00.1/virtio0").exists());
    assert!(host.records.list().unwrap().is_empty());
}

#[test]
fn refuses_system_roots_and_a_second_owner() {
    let fx = Fixture::new();
    for root in ["/", "/sys", "/sys/bus", "/proc", "/dev"] {
        let err = HostSide::open(
            Path::new(root),
            (PciDomain::default(), NvmeNaming::default()),
            &fx.state(),
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("refusing"), "{root}: {err:#}");
    }
    let host = fx.open();
    let err = HostSide::open(
        &fx.root(),
        (PciDomain::default(), NvmeNaming::default()),
        &fx.state(),
    )
    .unwrap_err();
    assert!(format!("{err:#}").contains("locked"), "{err:#}");
    drop(host);
    fx.open();
}

#[test]
fn reopen_cleans_up_after_a_crash_and_only_that() {
    let fx = Fixture::new();
    let file = fx.file("lvs.img", 16 * MIB);
    let other = fx.file("other.img", 4 * MIB);
    // Someone else's devices: one over another file, one over the very bytes
    // our namespace will use.
    let elsewhere = foreign_loop(&other, 0, 4 * MIB);
    let same_bytes = foreign_loop(&file, 0, 4 * MIB);

    let host = fx.open();
    host.add_pci_function(BDF, FunctionKind::Nvme).unwrap();
    host.add_pci_function("26:00.2", FunctionKind::VirtioBlk)
        .unwrap();
    let nvme = host
        .attach_nvme_namespace(BDF, 0, 1, 1, UUID, &backing(&file, 0, 4 * MIB))
        .unwrap();
    let vblk = host
        .attach_virtio_blk("26:00.2", 0, "vda", "s", &backing(&file, 8 * MIB, 4 * MIB))
        .unwrap();
    assert_eq!(loops_over(&file).len(), 3);
    // As after SIGKILL: no clean-up runs, the flock goes with the process's files.
    drop(host);

    let host = fx.open();
    assert_eq!(loops_over(&file), std::slice::from_ref(&same_bytes));
    assert_eq!(loops_over(&other), std::slice::from_ref(&elsewhere));
    assert!(!nvme.sysfs_dir.exists() && !vblk.sysfs_dir.exists());
    assert!(!fx.root().join("bus").exists());
    assert!(
        !fx.root().join("block").exists(),
        "the crashed run's head went"
    );
    assert!(host.records.list().unwrap().is_empty());

    // A crash after the backing file was deleted still cleans up our device,
    // and still leaves someone else's over that file alone.
    host.add_pci_function(BDF, FunctionKind::Nvme).unwrap();
    let ours = host
        .attach_nvme_namespace(BDF, 0, 1, 1, UUID, &backing(&other, MIB, MIB))
        .unwrap();
    let ours = loopdev::name_of(&ours.loop_device).unwrap();
    drop(host);
    fs::remove_file(&other).unwrap();
    let host = fx.open();
    assert!(host.records.list().unwrap().is_empty());
    let deleted = |name: &str| {
        loopdev::state(name)
            .unwrap()
            .is_some_and(|s| s.backing_file.as_encoded_bytes().ends_with(b" (deleted)"))
    };
    assert!(!deleted(&ours), "our device over the deleted file is gone");
    assert!(deleted(elsewhere.trim_start_matches("/dev/")));
    let _ = Command::new("losetup").args(["-d", &elsewhere]).status();
}

#[test]
fn reopen_cleans_up_a_device_attached_but_never_recorded() {
    let fx = Fixture::new();
    let file = fx.file("lvs.img", 16 * MIB);
    let before = foreign_loop(&file, 4 * MIB, 4 * MIB);
    let host = fx.open_with(BDF, FunctionKind::Nvme);

    // The state right after `losetup` attached but before we wrote its name down.
    let target = Target::of(&backing(&file, 4 * MIB, 4 * MIB), &host.datapath).unwrap();
    let id = DiskId::Nvme {
        bdf: BDF.to_owned(),
        ctrl: 0,
        ns: 1,
    };
    let record = target.intent(
        host.tree.disk_dir(&id),
        vec![before.trim_start_matches("/dev/").to_owned()],
    );
    host.records.store(&id.key(), &record).unwrap();
    let leaked = loopdev::attach(&target.path, target.offset, target.size, false, false).unwrap();
    assert_eq!(loops_over(&file).len(), 2);
    drop(host);

    fx.open();
    assert_eq!(loops_over(&file), [before]);
    assert!(
        loopdev::state(&leaked)
            .unwrap()
            .is_none_or(|s| s.backing_file.as_os_str() != target.path.as_os_str())
    );
}

#[test]
fn remove_function_and_shutdown_leave_nothing() {
    let fx = Fixture::new();
    let file = fx.file("lvs.img", 16 * MIB);
    let host = fx.open();
    host.add_pci_function(BDF, FunctionKind::Nvme).unwrap();
    host.add_pci_function("26:00.2", FunctionKind::VirtioBlk)
        .unwrap();
    host.attach_nvme_namespace(BDF, 0, 1, 1, UUID, &backing(&file, 0, 4 * MIB))
        .unwrap();
    host.attach_nvme_namespace(BDF, 0, 2, 2, UUID, &backing(&file, 4 * MIB, 4 * MIB))
        .unwrap();
    host.attach_virtio_blk("26:00.2", 0, "vda", "s", &backing(&file, 8 * MIB, 4 * MIB))
        .unwrap();
    assert_eq!(loops_over(&file).len(), 3);

    assert!(fx.root().join("block/nvme0n2").exists());
    host.remove_pci_function(BDF).unwrap();
    assert_eq!(loops_over(&file).len(), 1);
    assert!(!fx.devices().join("0000:26:00.1").exists());
    assert!(
        !fx.root().join("block/nvme0n1").exists() && !fx.root().join("block/nvme0n2").exists(),
        "the function's heads went with it"
    );

    // Not ours: shutdown leaves it.
    let stranger = fx.root().join("bus/pci/devices/0000:99:00.0");
    fs::create_dir_all(&stranger).unwrap();
    fs::write(stranger.join("vendor"), "0x8086\n").unwrap();

    host.shutdown().unwrap();
    assert!(loops_over(&file).is_empty());
    assert!(!fx.devices().join("0000:26:00.2").exists());
    assert!(stranger.join("vendor").exists());
    assert!(host.records.list().unwrap().is_empty());
    fs::remove_dir_all(fx.root().join("bus")).unwrap();
    host.shutdown().unwrap();
    assert!(!fx.root().join("bus").exists());
    assert!(!host.tree.tmp_dir().exists());
}

#[test]
fn parallel_functions() {
    let fx = Fixture::new();
    let host = fx.open();
    let files: Vec<PathBuf> = (0..6)
        .map(|i| fx.file(&format!("f{i}.img"), 4 * MIB))
        .collect();
    thread::scope(|scope| {
        for (i, file) in files.iter().enumerate() {
            let host = &host;
            scope.spawn(move || {
                let bdf = format!("4{i}:00.0");
                for round in 0..3 {
                    host.add_pci_function(&bdf, FunctionKind::Nvme).unwrap();
                    let disk = host
                        .attach_nvme_namespace(
                            &bdf,
                            i as u32,
                            1,
                            1,
                            UUID,
                            &backing(file, 0, 4 * MIB),
                        )
                        .unwrap();
                    check_dev(&disk);
                    check_data_path(&disk, file, 0, 4 * MIB);
                    host.detach(&disk).unwrap();
                    assert!(loops_over(file).is_empty(), "{bdf} round {round}");
                    host.remove_pci_function(&bdf).unwrap();
                }
            });
        }
    });
    assert!(host.records.list().unwrap().is_empty());
}

#[test]
fn intent_clean_up_spares_devices_other_records_claim() {
    let fx = Fixture::new();
    let file = fx.file("lvs.img", 8 * MIB);
    let host = fx.open();
    host.add_pci_function(BDF, FunctionKind::Nvme).unwrap();
    host.add_pci_function("26:00.2", FunctionKind::Nvme)
        .unwrap();
    let b = backing(&file, 0, 4 * MIB);
    let claimed = host.attach_nvme_namespace(BDF, 0, 1, 1, UUID, &b).unwrap();

    // Another function's attach of the same bytes died with its outcome unknown.
    let target = Target::of(&b, &host.datapath).unwrap();
    let id = DiskId::Nvme {
        bdf: "26:00.2".to_owned(),
        ctrl: 0,
        ns: 1,
    };
    let intent = target.intent(host.tree.disk_dir(&id), Vec::new());
    host.records.store(&id.key(), &intent).unwrap();
    let leaked = loopdev::attach(&target.path, 0, 4 * MIB, false, false).unwrap();
    host.release(&id.key(), &intent).unwrap();

    assert_eq!(
        loops_over(&file),
        [claimed.loop_device.display().to_string()],
        "{leaked} goes, the claimed device stays"
    );
    host.detach(&claimed).unwrap();
    assert!(loops_over(&file).is_empty());
}

#[test]
fn host_side_can_be_shared_across_tasks() {
    fn shareable<T: Send + Sync + 'static>() {}
    shareable::<HostSide>();
    shareable::<HostDisk>();
}

/// Waits for a queued attach, as a host's consumer polls sysfs.
fn discovered(disk: &DiskRef) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !dev_dir(&disk.sysfs_dir).join("dev").exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            disk.sysfs_dir.display()
        );
        thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn queued_attach_appears_later_and_a_detach_waits_for_it() {
    let fx = Fixture::new();
    let file = fx.file("q.img", 8 * MIB);
    let host = Arc::new(fx.open_with(BDF, FunctionKind::Nvme));
    // Detached before the thread may even have started: the detach waits for
    // the attach, so no disk appears afterwards.
    for round in 0..5 {
        let disk = host
            .attach_nvme_namespace_in_background(BDF, 0, 1, 1, UUID, backing(&file, 0, 4 * MIB))
            .unwrap();
        host.detach_queued(&disk).unwrap();
        assert!(!disk.sysfs_dir.exists(), "round {round}");
        assert!(loops_over(&file).is_empty(), "round {round}");
    }
    let disk = host
        .attach_nvme_namespace_in_background(BDF, 0, 1, 1, UUID, backing(&file, 0, 4 * MIB))
        .unwrap();
    discovered(&disk);
    assert_eq!(read(&disk.sysfs_dir.join("nsid")), "1\n");
    let device = host
        .loop_device_of(&disk)
        .expect("a loop device once discovered");
    assert_eq!(loops_over(&file), [device.to_str().unwrap()]);
    host.resize_queued(&disk, &backing(&file, 0, 8 * MIB))
        .unwrap();
    assert_eq!(device_size(&device), 8 * MIB);
    host.detach_queued(&disk).unwrap();
    assert!(loops_over(&file).is_empty());
    assert!(host.loop_device_of(&disk).is_none());
}

#[test]
fn failed_queued_attach_leaves_nothing() {
    let fx = Fixture::new();
    let file = fx.file("short.img", MIB);
    let host = Arc::new(fx.open_with("26:00.2", FunctionKind::VirtioBlk));
    // Past the end of the file: refused in the background.
    let disk = host
        .attach_virtio_blk_in_background("26:00.2", 0, "vda", "s", backing(&file, 0, 4 * MIB))
        .unwrap();
    // A call after it in the function's line runs once the attach is over.
    host.add_pci_function("26:00.2", FunctionKind::VirtioBlk)
        .unwrap();
    assert!(!disk.sysfs_dir.exists());
    assert!(!fx.devices().join("0000:26:00.2/virtio0").exists());
    assert!(loops_over(&file).is_empty());
    assert!(host.records.list().unwrap().is_empty());
    assert!(host.resize_queued(&disk, &backing(&file, 0, MIB)).is_err());
    host.detach_queued(&disk).unwrap();
    // Bad arguments are refused before anything is queued.
    assert!(
        host.attach_virtio_blk_in_background("26:00.2", 0, "VDA", "s", backing(&file, 0, MIB))
            .is_err()
    );
}

#[test]
fn shutdown_waits_for_queued_attaches() {
    let fx = Fixture::new();
    let file = fx.file("many.img", 8 * MIB);
    let host = Arc::new(fx.open());
    for i in 0..4u64 {
        let bdf = format!("5{i}:00.0");
        host.add_pci_function(&bdf, FunctionKind::Nvme).unwrap();
        host.attach_nvme_namespace_in_background(
            &bdf,
            i as u32,
            1,
            1,
            UUID,
            backing(&file, i * 2 * MIB, 2 * MIB),
        )
        .unwrap();
    }
    host.shutdown().unwrap();
    assert!(loops_over(&file).is_empty());
    assert!(host.records.list().unwrap().is_empty());
    assert!(!fx.root().join("bus").exists());
    // The jobs let go of the host side: the last reference is ours.
    assert_eq!(Arc::strong_count(&host), 1);
}

#[test]
fn a_renamed_disk_keeps_its_device_and_identity_and_detaches_cleanly() {
    let fx = Fixture::new();
    let file = fx.file("r.img", 4 * MIB);
    let host = Arc::new(fx.open_with(BDF, FunctionKind::Nvme));
    let disk = host
        .attach_nvme_namespace_in_background(BDF, 0, 1, 7, UUID, backing(&file, 0, 4 * MIB))
        .unwrap();
    let renamed = host.rename_nvme_queued(&disk, 1).unwrap();
    assert_eq!(
        renamed.sysfs_dir,
        fx.devices().join("0000:26:00.1/nvme/nvme1/nvme1c1n1")
    );
    assert!(dev_dir(&renamed.sysfs_dir).join("dev").exists());
    assert!(
        !fx.root().join("block/nvme0n1").exists(),
        "the old head went"
    );
    assert!(!fx.devices().join("0000:26:00.1/nvme/nvme0").exists());
    assert_eq!(read(&renamed.sysfs_dir.join("nsid")), "7\n");
    assert_eq!(
        read(&renamed.sysfs_dir.join("uuid")),
        format!("{}\n", UUID.to_ascii_lowercase())
    );
    let device = host.loop_device_of(&renamed).expect("the same loop device");
    assert_eq!(loops_over(&file), [device.to_str().unwrap()]);
    assert!(host.loop_device_of(&disk).is_none(), "the old name is gone");
    assert!(
        host.rename_nvme_queued(&disk, 2).is_err(),
        "nothing is at the old name"
    );
    host.detach_queued(&renamed).unwrap();
    assert!(loops_over(&file).is_empty());
    assert!(host.records.list().unwrap().is_empty());
    assert!(!fx.devices().join("0000:26:00.1/nvme").exists());
}

/// A volume served through the data path, with nothing between it and
/// its bytes.
fn plain_volume(backing: Backing) -> Arc<crate::datapath::volume::Volume> {
    Arc::new(crate::datapath::volume::Volume {
        backing,
        block_size: 512,
        layers: Vec::new(),
        cipher: None,
        remote: None,
    })
}

/// `stat` of `path` from a thread of its own (nothing is killed here, so
/// asking the mount is safe): canonical path, dev, ino, size.
fn stat_elsewhere(path: &Path) -> (PathBuf, u64, u64, u64) {
    let path = path.to_owned();
    thread::spawn(move || {
        let meta = fs::metadata(&path).unwrap();
        (
            fs::canonicalize(&path).unwrap(),
            meta.dev(),
            meta.ino(),
            meta.len(),
        )
    })
    .join()
    .unwrap()
}

#[test]
fn a_data_path_file_is_described_as_stat_and_a_loop_device_see_it() {
    let fx = Fixture::new();
    let file = fx.file("lvs.img", 8 * MIB);
    let host = fx.open_with(BDF, FunctionKind::Nvme);
    let (id, attrs) = nvme_disk(BDF, 0, 1, 1, UUID).unwrap();
    let source = Source::DataPath(plain_volume(backing(&file, MIB, 4 * MIB)));
    let disk = host.attach(&id, &attrs, &source).unwrap();
    let record = host.records.load(&id.key()).unwrap().unwrap();
    let name = record.loop_device.clone().unwrap();

    let described = |size| {
        let served = Backing {
            path: record.backing_path.clone(),
            offset: 0,
            size,
            read_only: false,
        };
        Target::of(&served, &host.datapath).unwrap()
    };
    let target = described(4 * MIB);
    let (path, dev, ino, len) = stat_elsewhere(&record.backing_path);
    assert_eq!(
        (&target.path, target.dev, target.ino),
        (&path, dev, ino),
        "what stat says"
    );
    assert_eq!(len, 4 * MIB);
    assert!(target.is_record(&record));
    let state = live_state(&record, &host.datapath)
        .unwrap()
        .expect("the record owns its device");
    assert!(target.owns(&state));
    assert!(loopdev::backing_is(&state.backing_file, &target.path));
    let (lo_dev, lo_ino) = loopdev::backing_identity(&name).unwrap();
    assert_eq!(
        (loopdev::split_dev(lo_dev), lo_ino),
        (loopdev::split_dev(dev), ino),
        "what the loop device shows"
    );
    check_data_path(&disk, &file, MIB, 4 * MIB);

    // Nothing the emulator checks a data path disk by asks its mount (what
    // a stat, even LOOP_GET_STATUS64 of the loop device, would).
    let asked = || {
        host.datapath
            .asked
            .load(std::sync::atomic::Ordering::SeqCst)
    };
    let before = asked();
    let _ = stat_elsewhere(&record.backing_path);
    loopdev::backing_identity(&name).unwrap();
    assert!(
        asked() > before,
        "the count sees a stat and LOOP_GET_STATUS64"
    );
    let quiet = |what: &str, check: &dyn Fn()| {
        // Least of three tries, after the kernel's attributes (TTL 0) went
        // stale: a stat by someone else in between is not ours (`losetup
        // -j` of another file, as other tests run, stats every loop
        // device's file).
        let least = (0..3)
            .map(|_| {
                thread::sleep(Duration::from_millis(20));
                let before = asked();
                check();
                asked() - before
            })
            .min();
        assert_eq!(least, Some(0), "{what} asked the mount");
    };
    quiet("Target::of", &|| {
        described(4 * MIB);
    });
    quiet("live_state", &|| {
        assert!(live_state(&record, &host.datapath).unwrap().is_some());
    });
    quiet("Target::owns", &|| assert!(target.owns(&state)));

    // A resize: the file serves the new size, and says so without a stat.
    host.resize(&disk, &backing(&file, MIB, 6 * MIB)).unwrap();
    let grown = described(6 * MIB);
    assert_eq!(
        stat_elsewhere(&record.backing_path),
        (path, dev, ino, 6 * MIB)
    );
    assert!(grown.is_record(&record));
    check_data_path(&disk, &file, MIB, 6 * MIB);

    host.detach(&disk).unwrap();
    assert!(loops_over(&file).is_empty());
}

/// A tmpfs mounted over the data path's mount point for as long as it lives.
struct Covered(PathBuf);

impl Drop for Covered {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[test]
fn a_data_path_file_is_described_without_a_call_on_its_path() {
    let fx = Fixture::new();
    let file = fx.file("lvs.img", 4 * MIB);
    let host = fx.open();
    let served = host
        .datapath
        .add(plain_volume(backing(&file, 0, 4 * MIB)))
        .unwrap();
    let before = Target::of(&served, &host.datapath).unwrap();
    let stat = stat_elsewhere(&served.path);
    assert_eq!(
        (&before.path, before.dev, before.ino),
        (&stat.0, stat.1, stat.2)
    );

    // Every call on the path now reaches the tmpfs, where no such file is
    // (as a call would reach dead session threads after a SIGKILL): the
    // description must come all the same, and the same.
    let mountpoint = fx.state().join(DATAPATH_DIR);
    nix::mount::mount(
        Some("tmpfs"),
        &mountpoint,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    let covered = Covered(mountpoint);
    assert!(fs::metadata(&served.path).is_err(), "the path is covered");
    let target = Target::of(&served, &host.datapath).unwrap();
    assert_eq!(
        (target.path, target.dev, target.ino),
        (before.path, before.dev, before.ino)
    );
    drop(covered);

    // On the mount, but not a file of ours: refused, not looked up.
    let stranger = fx.state().join(DATAPATH_DIR).join("d999");
    assert!(host.datapath.served_file(&stranger).unwrap().is_err());
    assert!(Target::of(&backing(&stranger, 0, MIB), &host.datapath).is_err());
    assert!(
        host.datapath.served_file(&file).is_none(),
        "not on the mount"
    );
    host.datapath.remove(&served.path);
}

#[test]
fn kernel_stat_lines_parse() {
    let s =
        BlockStat::parse("     73        0     74 5   2  0  16  3  0  12  8  1  0  8  2  0  0\n");
    assert_eq!(s.read_ios, 73);
    assert_eq!(s.read_sectors, 74);
    assert_eq!(s.read_ms, 5);
    assert_eq!(s.write_ios, 2);
    assert_eq!(s.write_sectors, 16);
    assert_eq!(s.discard_ios, 1);
    assert_eq!(s.discard_sectors, 8);
    assert_eq!(BlockStat::parse(""), BlockStat::default());
}

#[test]
fn the_virtiofs_list_is_there_from_the_start_and_goes_with_the_tree() {
    let fx = Fixture::new();
    let host = fx.open();
    let list = fx.root().join("fs/virtiofs");
    let entries = fs::read_dir(&list).expect("fs/virtiofs from the start");
    assert_eq!(entries.count(), 0);
    host.shutdown().unwrap();
    assert!(!fx.root().join("fs").exists());
    drop(host);
    // A restart finds it again, as after a host's boot.
    let _host = fx.open();
    assert!(list.is_dir());
}
