//! A host with two DPUs: two emulators (the binary) share one sysfs root,
//! each in its own PCI domain (`--pci-domain`), the same BDFs in both. What
//! one exposes (an NVMe namespace, a virtio-blk disk, a virtio-fs device)
//! appears under its own `<domain>:<bdf>`, and nothing the other does, killed,
//! started again over what it left or stopped, touches it. Needs root.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::binary::{connect, spawn_with, terminate};
use common::{
    Client, HostMount, dev_node, free_vf, losetup_all, wait_for_disk, wait_for_nvme_disk,
};
use serde_json::json;

const MIB: u64 = 1 << 20;

/// One emulator's files: its state directory, socket, images and share.
struct Dpu {
    domain: &'static str,
    socket: PathBuf,
    state: PathBuf,
    nvme_img: PathBuf,
    vblk_img: PathBuf,
    share: PathBuf,
}

impl Dpu {
    fn new(dir: &Path, domain: &'static str) -> Self {
        let at = |name: &str| dir.join(format!("{domain}-{name}"));
        let dpu = Self {
            domain,
            socket: at("spdk.sock"),
            state: at("state"),
            nvme_img: at("nvme.img"),
            vblk_img: at("vblk.img"),
            share: at("share"),
        };
        for (img, what) in [(&dpu.nvme_img, "nvme"), (&dpu.vblk_img, "vblk")] {
            let f = std::fs::File::create(img).unwrap();
            f.set_len(16 * MIB).unwrap();
            std::os::unix::fs::FileExt::write_all_at(&f, dpu.pattern(what).as_bytes(), 4096)
                .unwrap();
        }
        std::fs::create_dir(&dpu.share).unwrap();
        std::fs::write(dpu.share.join("hello"), dpu.pattern("fs")).unwrap();
        dpu
    }

    fn pattern(&self, what: &str) -> String {
        format!("dpu {} {what}", self.domain)
    }

    fn tag(&self) -> String {
        format!("tag-{}", self.domain)
    }

    fn spawn(&self, sysfs: &Path) -> std::process::Child {
        let args = [
            "--sysfs-root",
            sysfs.to_str().unwrap(),
            "--pci-domain",
            self.domain,
        ];
        spawn_with(&self.socket, &self.state, &args)
    }

    /// Whether the loop devices over its images are attached.
    fn attached(&self) -> [bool; 2] {
        let all = losetup_all();
        [&self.nvme_img, &self.vblk_img].map(|img| all.contains(img.to_str().unwrap()))
    }
}

/// What the host sees of one DPU's volumes.
#[derive(Debug, PartialEq)]
struct Seen {
    nvme: PathBuf,
    vblk: PathBuf,
    fs_entry: PathBuf,
    /// Each directory's inode: one made again would have another.
    inodes: [u64; 3],
}

impl Seen {
    /// Now, and with each volume's bytes read through the host's view.
    fn now(&self, dpu: &Dpu) -> Self {
        for (dir, what) in [(&self.nvme, "nvme"), (&self.vblk, "vblk")] {
            let node = dev_node(&dir.join("dev"));
            let mut read = vec![0; dpu.pattern(what).len()];
            std::os::unix::fs::FileExt::read_exact_at(
                &std::fs::File::open(&node).unwrap(),
                &mut read,
                4096,
            )
            .unwrap();
            assert_eq!(read, dpu.pattern(what).as_bytes(), "{}", node.display());
        }
        let tag = std::fs::read_to_string(self.fs_entry.join("tag")).unwrap();
        assert_eq!(tag, format!("{}\n", dpu.tag()));
        let at = dpu.state.join("host-mount");
        let mount = HostMount::new(&dpu.state.join("host/virtiofs"), &dpu.tag(), &at);
        assert_eq!(
            std::fs::read_to_string(mount.join("hello")).unwrap(),
            dpu.pattern("fs")
        );
        Self {
            nvme: self.nvme.clone(),
            vblk: self.vblk.clone(),
            fs_entry: self.fs_entry.clone(),
            inodes: [&self.nvme, &self.vblk, &self.fs_entry]
                .map(|dir| std::fs::metadata(dir).unwrap().ino()),
        }
    }
}

/// Exposes an NVMe namespace, a virtio-blk disk and a virtio-fs device on
/// `dpu` and waits for the host to see them under its domain.
async fn expose(c: &mut Client, dpu: &Dpu, sysfs: &Path) -> Seen {
    for (name, img) in [("n", &dpu.nvme_img), ("v", &dpu.vblk_img)] {
        c.ok(
            "bdev_aio_create",
            json!({"name": name, "filename": img, "block_size": 512}),
        )
        .await;
    }
    let nqn = "nqn.2022-10.io.nvda.nvme:two";
    c.ok("nvme_subsystem_create", json!({"nqn": nqn})).await;
    c.ok(
        "nvme_namespace_create",
        json!({"bdev_type": "spdk", "nqn": nqn, "nsid": 1, "bdev_name": "n"}),
    )
    .await;
    let nvme_bdf = free_vf(c, "NVME").await;
    let ctrl = c
        .ok(
            "nvme_controller_create",
            json!({"nqn": nqn, "pci_bdf": nvme_bdf, "suspended": true}),
        )
        .await["ctrl_id"]
        .clone();
    c.ok(
        "nvme_controller_attach_ns",
        json!({"ctrl_id": ctrl, "nsid": 1}),
    )
    .await;
    c.ok("nvme_controller_resume", json!({"ctrl_id": ctrl}))
        .await;
    let vblk_bdf = free_vf(c, "VBLK").await;
    c.ok(
        "virtio_blk_controller_create",
        json!({"pci_bdf": vblk_bdf, "bdev": "v"}),
    )
    .await;

    common::virtio_fs_ready(c, &dpu.share).await;
    common::virtio_fs_attach(c, "d", &dpu.tag()).await;

    let function = |bdf: &str| sysfs.join(format!("bus/pci/devices/{}:{bdf}", dpu.domain));
    let (_, nvme) = wait_for_nvme_disk(&function(&nvme_bdf)).await;
    let vblk = wait_for_disk(&function(&vblk_bdf).join("virtio0/block/vda")).await;
    let fs_entry = virtiofs_entry(sysfs, &dpu.tag()).expect("the virtio-fs device's entry");
    let device = std::fs::read_link(fs_entry.join("device")).unwrap();
    assert!(
        device.starts_with(sysfs.canonicalize().unwrap().join("bus/pci/devices"))
            && device
                .parent()
                .and_then(|f| f.file_name()?.to_str())
                .is_some_and(|f| f.starts_with(&format!("{}:", dpu.domain))),
        "{}",
        device.display()
    );
    Seen {
        nvme,
        vblk,
        fs_entry,
        inodes: [0; 3],
    }
    .now(dpu)
}

/// The host's `fs/virtiofs/<n>` whose tag is `tag`.
fn virtiofs_entry(sysfs: &Path, tag: &str) -> Option<PathBuf> {
    let want = format!("{tag}\n");
    std::fs::read_dir(sysfs.join("fs/virtiofs"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|entry| std::fs::read_to_string(entry.join("tag")).is_ok_and(|t| t == want))
}

/// The function directories in `domain`.
fn functions_in(sysfs: &Path, domain: &str) -> usize {
    std::fs::read_dir(sysfs.join("bus/pci/devices"))
        .map(|dir| {
            dir.flatten()
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("{domain}:"))
                })
                .count()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_emulators_share_a_sysfs_root_in_their_own_pci_domains() {
    let dir = tempfile::tempdir().unwrap();
    let sysfs = dir.path().join("sysfs");
    let (a, b) = (Dpu::new(dir.path(), "0000"), Dpu::new(dir.path(), "0001"));

    let mut a_proc = a.spawn(&sysfs);
    let mut ca = connect(&a.socket, &mut a_proc).await;
    let mut b_proc = b.spawn(&sysfs);
    let mut cb = connect(&b.socket, &mut b_proc).await;
    let functions = functions_in(&sysfs, "0001");
    assert!(functions > 0);
    assert_eq!(functions_in(&sysfs, "0000"), functions);
    let a_seen = expose(&mut ca, &a, &sysfs).await;
    let b_seen = expose(&mut cb, &b, &sysfs).await;
    // SNAP names the same BDFs on both DPUs; the host tells them apart by
    // domain, and numbers NVMe controllers, and so their disks, once.
    let a_vblk = a_seen.vblk.to_str().unwrap().replace("/0000:", "/0001:");
    assert_eq!(Path::new(&a_vblk), b_seen.vblk);
    assert_ne!(a_seen.nvme, b_seen.nvme, "one NVMe numbering on the host");
    assert_ne!(
        a_seen.fs_entry, b_seen.fs_entry,
        "one virtio numbering on the host"
    );

    drop(cb);
    b_proc.kill().expect("SIGKILL");
    b_proc.wait().expect("reap");
    assert_eq!(
        b.attached(),
        [true, true],
        "SIGKILL leaves its loop devices"
    );
    assert_eq!(a_seen.now(&a), a_seen);

    // Started again, it cleans up what it left, and only that.
    let mut b_proc = b.spawn(&sysfs);
    let cb = connect(&b.socket, &mut b_proc).await;
    assert_eq!(b.attached(), [false, false], "the restart detached them");
    assert!(!b_seen.nvme.exists() && !b_seen.vblk.exists());
    assert_eq!(virtiofs_entry(&sysfs, &b.tag()), None);
    assert_eq!(
        functions_in(&sysfs, "0001"),
        functions,
        "its static ones made again"
    );
    assert_eq!(a.attached(), [true, true]);
    assert_eq!(a_seen.now(&a), a_seen);

    drop(cb);
    terminate(b_proc);
    assert_eq!(functions_in(&sysfs, "0001"), 0);
    assert_eq!(a_seen.now(&a), a_seen);

    drop(ca);
    terminate(a_proc);
    assert_eq!(a.attached(), [false, false]);
    assert!(
        !sysfs.join("bus").exists(),
        "the last one out removes the tree"
    );
    assert_eq!(virtiofs_entry(&sysfs, &a.tag()), None);
    for domain in ["0000", "0001"] {
        assert!(!sysfs.join(format!(".snap-emu-tmp-{domain}")).exists());
    }
}

#[test]
fn a_bad_pci_domain_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("spdk.sock");
    let out = Command::new(env!("CARGO_BIN_EXE_snap-emu"))
        .args(["--pci-domain", "10000", "--socket"])
        .arg(&socket)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .output()
        .expect("run snap-emu");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("invalid PCI domain \"10000\""), "{stderr}");
    assert!(!socket.exists() && !dir.path().join("state").exists());
}
