//! SNAP's virtio-fs as DPF drives it, on the wire and on the host: an fsdev
//! over a directory, the attach order (transport, manager, function,
//! device, modify, start, hotplug), the host's `fs/virtiofs/<n>` entry and
//! a real kernel FUSE mount serving the tree, two devices over one tree,
//! and hot-unplug taking it all away. Needs root and /dev/fuse.

mod common;

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use common::{HostMount, VirtioFsFixture};
use serde_json::{Value, json};

const ENODEV: i64 = -19;
const EEXIST: i64 = -17;
const EBUSY: i64 = -16;
const EINVAL: i64 = -22;
const DECODE: i64 = -32603;

type Fixture = VirtioFsFixture;

async fn fixture() -> Fixture {
    VirtioFsFixture::start().await
}

impl VirtioFsFixture {
    /// The host's `fs/virtiofs/<n>` whose tag is `tag`, if any.
    fn sysfs_entry(&self, tag: &str) -> Option<PathBuf> {
        let dir = self.emu.sysfs_root.join("fs/virtiofs");
        fs::read_dir(dir)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| fs::read_to_string(p.join("tag")).is_ok_and(|t| t == format!("{tag}\n")))
    }
}

/// `(source, fs type)` of the mount at `point`, from mountinfo.
fn mounted_at(point: &Path) -> Option<(String, String)> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if left.split(' ').nth(4)? != point.to_str()? {
            return None;
        }
        let mut right = right.split(' ');
        let fstype = right.next()?.to_owned();
        Some((right.next()?.to_owned(), fstype))
    })
}

/// Every mount point whose source is `tag`.
fn mounts_of_tag(tag: &str) -> Vec<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .filter(|line| line.split(" - ").nth(1).and_then(|r| r.split(' ').nth(1)) == Some(tag))
        .map(|line| PathBuf::from(line.split(' ').nth(4).unwrap()))
        .collect()
}

fn function_of(functions: &Value, vuid: &str) -> Value {
    functions[0]["Function List"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["vuid"] == json!(vuid))
        .cloned()
        .unwrap_or_else(|| panic!("{vuid} not in {functions}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wire_answers_as_dpf_reads_it_and_refuses_what_snap_refuses() {
    let mut fx = fixture().await;
    let c = &mut fx.client;
    let doca = json!({"transport_name": "DOCA"});
    assert_eq!(c.err("virtio_fs_transport_create", doca).await.0, EEXIST);
    let other = json!({"transport_name": "TCP"});
    assert_eq!(c.err("virtio_fs_transport_create", other).await.0, EINVAL);
    let transports = c.ok("virtio_fs_get_transports", json!(null)).await;
    assert_eq!(
        transports,
        json!([{"name": "DOCA", "state": "started", "managers": [{"name": "mlx5_0"}]}])
    );
    let again = json!({"manager": "mlx5_0"});
    assert_eq!(
        c.err("virtio_fs_doca_manager_create", again).await.0,
        EEXIST
    );
    let managers = c.ok("virtio_fs_doca_get_managers", json!(null)).await;
    assert_eq!(managers, json!([{"name": "mlx5_0"}]));
    let nope = json!({"manager": "mlx5_9"});
    assert_eq!(
        c.err("virtio_fs_doca_function_create", nope).await.0,
        ENODEV
    );

    let vuid = c
        .ok(
            "virtio_fs_doca_function_create",
            json!({"manager": "mlx5_0"}),
        )
        .await;
    let vuid = vuid.as_str().unwrap().to_owned();
    let functions = c.ok("virtio_fs_doca_get_functions", json!(null)).await;
    let f = function_of(&functions, &vuid);
    assert_eq!(f["hot pluggable"], json!(true));
    assert_eq!(functions[0]["manager"], json!("mlx5_0"));
    let address = f["pci_address"].as_str().unwrap().to_owned();
    assert!(address.starts_with("0000:"), "{address}");
    // Not an NVMe or virtio-blk function: the emulation list leaves it out.
    let listed = c.ok("emulation_function_list", json!({"all": true})).await;
    assert!(!listed.to_string().contains(&vuid), "{listed}");

    let device = |dev: &str, tag: &str, fsdev: &str| json!({"transport_name": "DOCA", "dev_name": dev, "tag": tag, "fsdev": fsdev});
    let refusals = [
        (device("d1", "t1", "nope"), ENODEV),
        (device("d1", &"x".repeat(37), "fs0"), EINVAL),
        (device("d1", "", "fs0"), EINVAL),
        (device("d1", "a/b", "fs0"), EINVAL),
        (
            json!({"transport_name": "X", "dev_name": "d1", "tag": "t", "fsdev": "fs0"}),
            ENODEV,
        ),
        (
            json!({"dev_name": "d1", "tag": "t1", "fsdev": "fs0"}),
            DECODE,
        ),
    ];
    for (params, code) in refusals {
        let got = c.err("virtio_fs_device_create", params.clone()).await.0;
        assert_eq!(got, code, "{params}");
    }
    assert_eq!(c.ok("virtio_fs_get_devices", json!(null)).await, json!([]));
    c.ok(
        "virtio_fs_device_create",
        device("d1", &"x".repeat(36), "fs0"),
    )
    .await;
    assert_eq!(
        c.err("virtio_fs_device_create", device("d1", "t2", "fs0"))
            .await
            .0,
        EEXIST
    );
    let same_tag = device("d2", &"x".repeat(36), "fs0");
    assert_eq!(c.err("virtio_fs_device_create", same_tag).await.0, EEXIST);
    let devices = c.ok("virtio_fs_get_devices", json!(null)).await;
    assert_eq!(
        devices,
        json!([{"name": "d1", "transport_name": "DOCA", "state": "stopped", "fsdev": "fs0",
            "tag": "x".repeat(36), "queue_size": 128, "num_request_queues": 1}])
    );

    // Hot-plug needs a bound function; a bound function cannot go.
    let plug = json!({"dev_name": "d1", "wait_for_done": true});
    assert_eq!(
        c.err("virtio_fs_doca_device_hotplug", plug.clone()).await.0,
        EINVAL
    );
    let bad_bind = json!({"dev_name": "d1", "manager": "mlx5_0", "vuid": "nope"});
    assert_eq!(
        c.err("virtio_fs_doca_device_modify", bad_bind).await.0,
        ENODEV
    );
    let bind = json!({"dev_name": "d1", "manager": "mlx5_0", "vuid": vuid});
    c.ok("virtio_fs_doca_device_modify", bind.clone()).await;
    c.ok("virtio_fs_doca_device_modify", bind).await;
    let destroy_fn = json!({"manager": "mlx5_0", "vuid": vuid});
    assert_eq!(
        c.err("virtio_fs_doca_function_destroy", destroy_fn.clone())
            .await
            .0,
        EBUSY
    );
    let d1 = json!({"dev_name": "d1"});
    c.ok("virtio_fs_device_start", d1.clone()).await;
    assert_eq!(c.err("virtio_fs_device_destroy", d1.clone()).await.0, EBUSY);
    c.ok("virtio_fs_doca_device_hotplug", plug.clone()).await;
    assert_eq!(
        c.err("virtio_fs_doca_device_hotplug", plug.clone()).await.0,
        EEXIST
    );
    let devices = c.ok("virtio_fs_get_devices", json!(null)).await;
    assert_eq!(devices[0]["state"], json!("running"));

    // Detach in DPF's order; each step once.
    c.ok("virtio_fs_doca_device_hotunplug", plug.clone()).await;
    assert_eq!(
        c.err("virtio_fs_doca_device_hotunplug", plug).await.0,
        ENODEV
    );
    c.ok("virtio_fs_device_stop", d1.clone()).await;
    c.ok("virtio_fs_device_destroy", d1.clone()).await;
    assert_eq!(
        c.err("virtio_fs_device_destroy", d1.clone()).await.0,
        ENODEV
    );
    assert_eq!(c.err("virtio_fs_device_start", d1).await.0, ENODEV);
    c.ok("virtio_fs_doca_function_destroy", destroy_fn.clone())
        .await;
    assert_eq!(
        c.err("virtio_fs_doca_function_destroy", destroy_fn).await.0,
        ENODEV
    );
    let functions = c.ok("virtio_fs_doca_get_functions", json!(null)).await;
    assert_eq!(
        functions,
        json!([{"manager": "mlx5_0", "Function List": []}])
    );
    fx.emu.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hot_plugged_devices_serve_one_tree_through_real_fuse_mounts() {
    let mut fx = fixture().await;
    let vuid_a = fx.attach("dev-a", "tag-a").await;
    fx.attach("dev-b", "tag-b").await;

    // The host's view: the tag in sysfs, linked to the function's device.
    let entry = fx.sysfs_entry("tag-a").expect("fs/virtiofs/<n> with tag-a");
    let functions = fx
        .client
        .ok("virtio_fs_doca_get_functions", json!(null))
        .await;
    let address = function_of(&functions, &vuid_a)["pci_address"].clone();
    let device = fs::canonicalize(entry.join("device")).unwrap();
    let function = device.parent().unwrap();
    assert_eq!(function.file_name().unwrap().to_str(), address.as_str());
    assert!(
        device
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("virtio")
    );
    // Two hosts, each mounting its device as a real host does.
    let hosts = fx.dir.path().join("hosts");
    let mount_a = HostMount::new(&fx.virtiofs_dir, "tag-a", &hosts.join("a"));
    let mount_b = HostMount::new(&fx.virtiofs_dir, "tag-b", &hosts.join("b"));
    let shown = mounted_at(&mount_a).unwrap_or_else(|| {
        let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
        panic!("{} is not mounted:\n{info}", mount_a.display())
    });
    assert_eq!(shown, ("tag-a".to_owned(), "fuse.virtiofs".to_owned()));
    assert_eq!(
        mounts_of_tag("tag-a"),
        [mount_a.to_path_buf()],
        "the host's mount is the device's only one"
    );

    // What one host writes and closes, the tree and the other host read.
    fs::create_dir(mount_a.join("dir")).unwrap();
    let mut f = fs::File::create(mount_a.join("dir/file")).unwrap();
    f.write_all(b"hello from a").unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(
        fs::read(fx.share.join("dir/file")).unwrap(),
        b"hello from a"
    );
    assert_eq!(fs::read(mount_b.join("dir/file")).unwrap(), b"hello from a");
    // And the other way, overwriting what the first one may have cached.
    fs::write(mount_b.join("dir/file"), b"b was here").unwrap();
    assert_eq!(fs::read(mount_a.join("dir/file")).unwrap(), b"b was here");

    // What a pod does to its files.
    fs::rename(mount_a.join("dir/file"), mount_a.join("dir/moved")).unwrap();
    std::os::unix::fs::symlink("moved", mount_a.join("dir/link")).unwrap();
    fs::hard_link(mount_a.join("dir/moved"), mount_a.join("dir/hard")).unwrap();
    assert_eq!(
        fs::read_link(mount_b.join("dir/link")).unwrap(),
        Path::new("moved")
    );
    assert_eq!(fs::read(mount_b.join("dir/link")).unwrap(), b"b was here");
    assert_eq!(fs::metadata(mount_b.join("dir/hard")).unwrap().nlink(), 2);
    fs::set_permissions(mount_a.join("dir/moved"), fs::Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::chown(mount_a.join("dir/moved"), Some(1000), Some(1000)).unwrap();
    let backing = fs::metadata(fx.share.join("dir/moved")).unwrap();
    assert_eq!(
        (backing.mode() & 0o777, backing.uid(), backing.gid()),
        (0o640, 1000, 1000)
    );
    fs::OpenOptions::new()
        .write(true)
        .open(mount_a.join("dir/moved"))
        .unwrap()
        .set_len(1)
        .unwrap();
    assert_eq!(fs::read(fx.share.join("dir/moved")).unwrap(), b"b");
    let mut names: Vec<String> = fs::read_dir(mount_b.join("dir"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["hard", "link", "moved"]);
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    let moved = fs::File::options()
        .write(true)
        .open(mount_a.join("dir/moved"))
        .unwrap();
    moved.set_modified(when).unwrap();
    assert_eq!(
        fs::metadata(fx.share.join("dir/moved"))
            .unwrap()
            .modified()
            .unwrap(),
        when
    );
    fs::create_dir(mount_b.join("empty")).unwrap();
    fs::remove_dir(mount_a.join("empty")).unwrap();
    assert!(!fx.share.join("empty").exists());
    fs::remove_file(mount_a.join("dir/hard")).unwrap();
    fs::remove_file(mount_a.join("dir/link")).unwrap();
    let over = nix::sys::statvfs::statvfs(&*mount_a).unwrap();
    let under = nix::sys::statvfs::statvfs(&fx.share).unwrap();
    assert_eq!(
        (over.blocks(), over.block_size()),
        (under.blocks(), under.block_size())
    );

    // A host with the device mounted and a file open: hot-unplug takes the
    // entry and the device, and the mount and the file refuse.
    let mut open = fs::File::open(mount_a.join("dir/moved")).unwrap();
    let plug = json!({"dev_name": "dev-a", "wait_for_done": true});
    fx.client.ok("virtio_fs_doca_device_hotunplug", plug).await;
    assert!(fx.sysfs_entry("tag-a").is_none(), "the tag left sysfs");
    let again = HostMount::try_new(&fx.virtiofs_dir, "tag-a", &hosts.join("again"));
    assert_eq!(
        again.unwrap_err(),
        nix::errno::Errno::ENOENT,
        "the device left the host"
    );
    let refused = fs::metadata(mount_a.join("dir/moved")).unwrap_err();
    assert_eq!(
        refused.raw_os_error(),
        Some(nix::libc::ENOTCONN),
        "{refused}"
    );
    let read = open.read(&mut [0; 4]).unwrap_err();
    assert_eq!(read.raw_os_error(), Some(nix::libc::ENOTCONN), "{read}");
    drop(open);
    drop(mount_a);
    // The other device still serves the tree.
    assert_eq!(fs::read(mount_b.join("dir/moved")).unwrap(), b"b");

    // Its function cannot go while the device is bound to it.
    let function = json!({"manager": "mlx5_0", "vuid": vuid_a});
    let busy = fx
        .client
        .err("virtio_fs_doca_function_destroy", function.clone())
        .await;
    assert_eq!(busy.0, EBUSY);
    fx.client
        .ok("virtio_fs_device_stop", json!({"dev_name": "dev-a"}))
        .await;
    fx.client
        .ok("virtio_fs_device_destroy", json!({"dev_name": "dev-a"}))
        .await;
    fx.client
        .ok("virtio_fs_doca_function_destroy", function)
        .await;

    // Deleting the fsdev takes the other device off the host.
    fx.client
        .ok("fsdev_aio_delete", json!({"name": "fs0"}))
        .await;
    assert!(fx.sysfs_entry("tag-b").is_none());
    let refused = fs::metadata(mount_b.join("dir")).unwrap_err();
    assert_eq!(
        refused.raw_os_error(),
        Some(nix::libc::ENOTCONN),
        "{refused}"
    );
    fx.emu.stop().await;
}
