//! SNAP emulation end to end: the function list, NVIDIA's NVMe attach order
//! and virtio-blk producing real loop devices under the sysfs tree, teardown,
//! hot-plug, and graceful shutdown. Needs root and loop devices.

mod common;

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use common::{Client, Emu, dev_node, free_vf, losetup_all, wait_for_disk, wait_for_nvme_disk};
use serde_json::{Value, json};
use snap_emu::{Config, FunctionLayout};

const MIB: u64 = 1 << 20;

fn devices(emu: &Emu) -> PathBuf {
    emu.sysfs_root.join("bus/pci/devices")
}

/// A file of `size` bytes with `pattern` written at `offset`.
fn image(path: &Path, size: u64, offset: u64, pattern: &[u8]) {
    let mut f = std::fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(pattern).unwrap();
    f.sync_all().unwrap();
}

fn read_at(dev: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut f = std::fs::File::open(dev).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    let mut buf = vec![0u8; len];
    f.read_exact(&mut buf).unwrap();
    buf
}

/// Writes through a host device, synced so the bytes reach the backing file.
fn write_at(dev: &Path, offset: u64, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new().write(true).open(dev).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(bytes).unwrap();
    f.sync_all().unwrap();
}

fn keys(v: &Value) -> Vec<&str> {
    v.as_object().unwrap().keys().map(String::as_str).collect()
}

/// Creates a controller and returns its name.
async fn create_ctrl(c: &mut Client, method: &str, params: Value) -> String {
    c.ok(method, params).await["ctrl_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// NVIDIA's attach order: a suspended NVMe controller on the function that
/// `selector` (`pci_bdf`, `vuid`, ...) names, the namespace, then resume.
/// Returns the controller's name.
async fn expose_namespace(c: &mut Client, nqn: &str, selector: (&str, &str), nsid: u32) -> String {
    let mut params = json!({"nqn": nqn, "suspended": true});
    params[selector.0] = json!(selector.1);
    let ctrl = create_ctrl(c, "nvme_controller_create", params).await;
    c.ok(
        "nvme_controller_attach_ns",
        json!({"ctrl_id": ctrl, "nsid": nsid}),
    )
    .await;
    c.ok("nvme_controller_resume", json!({"ctrl_id": ctrl}))
        .await;
    ctrl
}

/// A function's entry in the full function list.
async fn listed_function(c: &mut Client, vuid: &str) -> Value {
    let fns = c.ok("emulation_function_list", json!({"all": true})).await;
    fns.as_array()
        .unwrap()
        .iter()
        .find(|f| f["vuid"] == vuid)
        .cloned()
        .expect("the function is listed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_list_has_snap_shape_and_functions_exist_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let emu = Emu::start(Config::for_test(dir.path())).await;
    let mut c = emu.client().await;
    let fns = c.ok("emulation_function_list", json!({"all": true})).await;
    let pfs = fns.as_array().unwrap();
    assert_eq!(pfs.len(), 2);
    assert_eq!(
        keys(&pfs[0]),
        [
            "hotplugged",
            "emulation_type",
            "pf_index",
            "pci_bdf",
            "vhca_id",
            "vuid",
            "vfs"
        ]
    );
    assert_eq!(pfs[0]["emulation_type"], "NVME");
    assert_eq!(pfs[0]["pci_bdf"], "26:00.0");
    assert_eq!(pfs[0]["hotplugged"], false);
    assert_eq!(pfs[1]["emulation_type"], "VBLK");
    assert_eq!(pfs[1]["pci_bdf"], "27:00.0");
    let vfs = pfs[0]["vfs"].as_array().unwrap();
    assert_eq!(vfs.len(), 16);
    assert_eq!(
        keys(&vfs[0]),
        [
            "hotplugged",
            "emulation_type",
            "pf_index",
            "vf_index",
            "pci_bdf",
            "vhca_id",
            "vuid"
        ]
    );
    assert_eq!(vfs[0]["pci_bdf"], "26:00.1");
    assert_eq!(vfs[15]["pci_bdf"], "26:02.0");
    let mut all: Vec<&Value> = pfs.iter().collect();
    all.extend(pfs.iter().flat_map(|p| p["vfs"].as_array().unwrap()));
    let mut bdfs: Vec<&str> = all.iter().map(|f| f["pci_bdf"].as_str().unwrap()).collect();
    bdfs.sort_unstable();
    bdfs.dedup();
    assert_eq!(bdfs.len(), 34, "BDFs are distinct");
    for bdf in bdfs {
        assert!(
            devices(&emu).join(format!("0000:{bdf}")).is_dir(),
            "{bdf} on the host"
        );
    }
    // Without "all", only VFs carrying a controller are listed.
    let short = c.ok("emulation_function_list", json!({})).await;
    assert!(short[0]["vfs"].as_array().unwrap().is_empty());
    // --no-snap has no SNAP methods at all.
    let plain_dir = dir.path().join("plain");
    let plain = Emu::start(Config::for_test(&plain_dir).without_snap()).await;
    let mut p = plain.client().await;
    assert_eq!(
        p.call("emulation_function_list", None).await.unwrap_err(),
        (-32601, "Method not found".into())
    );
    plain.stop().await;
    emu.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvme_attach_order_produces_a_loop_device_and_teardown_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("nvme-vol.img");
    image(&img, 16 * MIB, 4096, b"snap-emu nvme bytes");
    let emu = Emu::start(Config::for_test(&dir.path().join("emu"))).await;
    let mut c = emu.client().await;
    c.ok(
        "bdev_aio_create",
        json!({"name": "vol", "filename": img, "block_size": 512}),
    )
    .await;
    let nqn = "nqn.2022-10.io.nvda.nvme:vol";
    let ns_uuid = "263826ad-19a3-4feb-bc25-4bc81ee7748e";
    c.ok("nvme_subsystem_create", json!({"nqn": nqn})).await;
    c.ok(
        "nvme_namespace_create",
        json!({"bdev_type": "spdk", "nqn": nqn, "nsid": 1, "uuid": ns_uuid, "bdev_name": "vol"}),
    )
    .await;
    // The namespace is open for writing: nvmf may not claim the bdev now.
    c.ok("nvmf_create_transport", json!({"trtype": "TCP"}))
        .await;
    c.ok(
        "nvmf_create_subsystem",
        json!({"nqn": "nqn.2016-06.io.spdk:x1"}),
    )
    .await;
    assert_eq!(
        c.err(
            "nvmf_subsystem_add_ns",
            json!({"nqn": "nqn.2016-06.io.spdk:x1", "namespace": {"bdev_name": "vol"}})
        )
        .await
        .0,
        -32602
    );
    let bdf = free_vf(&mut c, "NVME").await;
    let ctrl = create_ctrl(
        &mut c,
        "nvme_controller_create",
        json!({"nqn": nqn, "pci_bdf": bdf, "suspended": true}),
    )
    .await;
    assert_eq!(ctrl, "NVMeCtrl1");
    // The function is taken now.
    assert_eq!(
        c.err(
            "nvme_controller_create",
            json!({"nqn": nqn, "pci_bdf": bdf})
        )
        .await
        .0,
        -16
    );
    c.ok(
        "nvme_controller_attach_ns",
        json!({"ctrl_id": ctrl, "nsid": 1}),
    )
    .await;
    let fn_dir = devices(&emu).join(format!("0000:{bdf}"));
    assert!(
        !fn_dir.join("nvme").exists(),
        "suspended: nothing on the host yet"
    );
    c.ok("nvme_controller_resume", json!({"ctrl_id": ctrl}))
        .await;

    let (ns_dir, head) = wait_for_nvme_disk(&fn_dir).await;
    assert_eq!(
        std::fs::read_to_string(ns_dir.join("nsid")).unwrap().trim(),
        "1"
    );
    assert_eq!(
        std::fs::read_to_string(ns_dir.join("uuid")).unwrap().trim(),
        ns_uuid
    );
    assert_eq!(
        std::fs::read_to_string(ns_dir.join("size")).unwrap().trim(),
        (16 * MIB / 512).to_string()
    );
    assert!(!ns_dir.join("dev").exists(), "a path has no device node");
    let read = |dir: &Path, name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    assert_eq!(read(&head, "nsid"), read(&ns_dir, "nsid"));
    assert_eq!(read(&head, "size"), read(&ns_dir, "size"));
    let node = dev_node(&head.join("dev"));
    assert_eq!(read_at(&node, 4096, 19), b"snap-emu nvme bytes");
    assert!(losetup_all().contains(img.to_str().unwrap()));

    let subs = c.ok("nvme_subsystem_list", Value::Null).await;
    let s = &subs[0];
    assert_eq!(
        keys(s),
        ["nqn", "sn", "mn", "nn", "mnan", "controllers", "namespaces"]
    );
    assert_eq!(
        keys(&s["controllers"][0]),
        [
            "ctrl_id",
            "vhca_id",
            "nqn",
            "plugged",
            "state",
            "num_queues",
            "max_queues",
            "mdts",
            "namespaces"
        ]
    );
    assert_eq!(
        s["controllers"][0]["namespaces"][0],
        json!({"nsid": 1, "bdev": "vol", "uuid": ns_uuid})
    );
    assert_eq!(
        keys(&s["namespaces"][0]),
        [
            "nsid",
            "bdev",
            "uuid",
            "nqn",
            "ready",
            "max inflights per weight",
            "controllers"
        ]
    );
    assert_eq!(
        s["namespaces"][0]["controllers"],
        json!([{"ctrl_id": ctrl}])
    );
    let ctrls = c.ok("nvme_controller_list", Value::Null).await;
    assert_eq!(
        keys(&ctrls[0]),
        [
            "ctrl_id",
            "vhca_id",
            "nqn",
            "num_queues",
            "mdts",
            "namespaces"
        ]
    );
    let fns = c.ok("emulation_function_list", json!({"all": true})).await;
    let vf = fns[0]["vfs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["pci_bdf"] == bdf.as_str())
        .unwrap();
    assert_eq!(vf["ctrl_id"], ctrl.as_str());

    // A namespace attaches to one controller only.
    let bdf2 = free_vf(&mut c, "NVME").await;
    let ctrl2 = create_ctrl(
        &mut c,
        "nvme_controller_create",
        json!({"nqn": nqn, "pci_bdf": bdf2}),
    )
    .await;
    assert_eq!(
        c.err(
            "nvme_controller_attach_ns",
            json!({"ctrl_id": ctrl2, "nsid": 1})
        )
        .await
        .0,
        -16
    );
    c.ok(
        "nvme_controller_destroy",
        json!({"ctrl_id": ctrl2, "force": true}),
    )
    .await;

    // NVIDIA's teardown: the reverse order.
    c.ok(
        "nvme_controller_detach_ns",
        json!({"ctrl_id": ctrl, "nsid": 1}),
    )
    .await;
    assert!(!ns_dir.exists());
    assert!(!losetup_all().contains(img.to_str().unwrap()));
    c.ok(
        "nvme_controller_destroy",
        json!({"ctrl_id": ctrl, "force": true}),
    )
    .await;
    c.ok("nvme_namespace_destroy", json!({"nqn": nqn, "nsid": 1}))
        .await;
    c.ok("nvme_subsystem_destroy", json!({"nqn": nqn})).await;
    c.ok("bdev_aio_delete", json!({"name": "vol"})).await;
    assert_eq!(
        c.err("nvme_controller_destroy", json!({"ctrl_id": ctrl}))
            .await
            .0,
        -19
    );
    assert_eq!(c.ok("nvme_subsystem_list", Value::Null).await, json!([]));
    emu.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn virtio_blk_disk_appears_with_its_serial_and_goes_away() {
    let dir = tempfile::tempdir().unwrap();
    let emu = Emu::start(Config::for_test(&dir.path().join("emu"))).await;
    let mut c = emu.client().await;
    c.ok(
        "bdev_malloc_create",
        json!({"name": "m0", "num_blocks": 8192, "block_size": 512}),
    )
    .await;
    let bdf = free_vf(&mut c, "VBLK").await;
    let ctrl = create_ctrl(
        &mut c,
        "virtio_blk_controller_create",
        json!({"pci_bdf": bdf, "bdev": "m0", "vblk_id": "serial-0001"}),
    )
    .await;
    assert_eq!(ctrl, "VblkCtrl1");
    let disk = wait_for_disk(&devices(&emu).join(format!("0000:{bdf}/virtio0/block/vda"))).await;
    assert_eq!(
        std::fs::read_to_string(disk.join("serial")).unwrap(),
        "serial-0001"
    );
    let node = dev_node(&disk.join("dev"));
    // Bytes written through the host's disk land in the bdev's file.
    write_at(&node, 512, b"through virtio");
    assert_eq!(read_at(&node, 512, 14), b"through virtio");
    let list = c.ok("virtio_blk_controller_list", Value::Null).await;
    assert_eq!(list[0]["bdev"], "m0");
    assert_eq!(list[0]["vblk_id"], "serial-0001");
    // A second controller gets the next disk name.
    c.ok(
        "bdev_null_create",
        json!({"name": "n0", "num_blocks": 2048, "block_size": 512}),
    )
    .await;
    let bdf2 = free_vf(&mut c, "VBLK").await;
    c.ok(
        "virtio_blk_controller_create",
        json!({"pci_bdf": bdf2, "bdev": "n0"}),
    )
    .await;
    let disk2 = wait_for_disk(&devices(&emu).join(format!("0000:{bdf2}/virtio1/block/vdb"))).await;
    assert_eq!(std::fs::read_to_string(disk2.join("serial")).unwrap(), "n0");
    // Deleting a bdev under a controller is a hot remove: the disk goes.
    c.ok("bdev_null_delete", json!({"name": "n0"})).await;
    assert!(!disk2.exists());

    assert_eq!(
        c.err("virtio_blk_controller_destroy", json!({"ctrl": ctrl}))
            .await
            .0,
        -16
    );
    c.ok("virtio_blk_controller_bdev_detach", json!({"ctrl": ctrl}))
        .await;
    assert!(!disk.exists());
    c.ok(
        "virtio_blk_controller_bdev_attach",
        json!({"ctrl": ctrl, "bdev": "m0"}),
    )
    .await;
    // The lowest free names are reused.
    wait_for_disk(&disk).await;
    c.ok(
        "virtio_blk_controller_destroy",
        json!({"ctrl": ctrl, "force": true}),
    )
    .await;
    assert!(!disk.exists());
    emu.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hotplug_function_is_invisible_until_plugged() {
    let dir = tempfile::tempdir().unwrap();
    let emu = Emu::start(Config::for_test(&dir.path().join("emu"))).await;
    let mut c = emu.client().await;
    c.ok(
        "bdev_malloc_create",
        json!({"name": "m0", "num_blocks": 4096, "block_size": 4096}),
    )
    .await;
    let nqn = "nqn.2022-10.io.nvda.nvme:hp";
    c.ok("nvme_subsystem_create", json!({"nqn": nqn})).await;
    c.ok(
        "nvme_namespace_create",
        json!({"bdev_type": "spdk", "nqn": nqn, "nsid": 3, "bdev_name": "m0"}),
    )
    .await;
    let f = c.ok("nvme_function_create", Value::Null).await;
    assert_eq!(keys(&f), ["vuid", "vhca_id"]);
    let vuid = f["vuid"].as_str().unwrap().to_owned();
    let pf = listed_function(&mut c, &vuid).await;
    assert_eq!(pf["hotplugged"], true);
    assert_eq!(pf["pci_bdf"], "00:00.0");
    let ctrl = expose_namespace(&mut c, nqn, ("vuid", &vuid), 3).await;
    c.ok(
        "nvme_controller_hotplug",
        json!({"ctrl_id": ctrl, "wait_for_done": true}),
    )
    .await;
    let bdf = listed_function(&mut c, &vuid).await["pci_bdf"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(bdf, "28:00.0");
    // nvme<X>n<Y>: Y counts attachments, so NSID 3 is nvme0n1.
    let (ns_dir, _) = wait_for_nvme_disk(&devices(&emu).join(format!("0000:{bdf}"))).await;
    assert_eq!(
        std::fs::read_to_string(ns_dir.join("nsid")).unwrap().trim(),
        "3"
    );
    assert_eq!(
        c.err("nvme_function_destroy", json!({"vuid": vuid}))
            .await
            .0,
        -16
    );
    c.ok(
        "nvme_controller_hotunplug",
        json!({"ctrl_id": ctrl, "wait_for_done": true}),
    )
    .await;
    assert!(!devices(&emu).join(format!("0000:{bdf}")).exists());
    c.ok(
        "nvme_controller_destroy",
        json!({"ctrl_id": ctrl, "force": true}),
    )
    .await;
    c.ok("nvme_function_destroy", json!({"vuid": vuid})).await;
    assert_eq!(
        c.err("nvme_function_destroy", json!({"vuid": vuid}))
            .await
            .0,
        -19
    );
    emu.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_detaches_everything_and_removes_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("shutdown.img");
    image(&img, 8 * MIB, 0, b"x");
    let emu = Emu::start(Config::for_test(&dir.path().join("emu"))).await;
    let socket = emu.socket.clone();
    let sysfs = emu.sysfs_root.clone();
    let mut c = emu.client().await;
    c.ok(
        "bdev_aio_create",
        json!({"name": "a", "filename": img, "block_size": 512}),
    )
    .await;
    let bdf = free_vf(&mut c, "VBLK").await;
    c.ok(
        "virtio_blk_controller_create",
        json!({"pci_bdf": bdf, "bdev": "a"}),
    )
    .await;
    wait_for_disk(&sysfs.join(format!("bus/pci/devices/0000:{bdf}/virtio0/block/vda"))).await;
    assert!(losetup_all().contains(img.to_str().unwrap()));
    drop(c);
    emu.stop().await;
    assert!(!losetup_all().contains(img.to_str().unwrap()));
    assert!(!socket.exists());
    assert!(!sysfs.join(format!("bus/pci/devices/0000:{bdf}")).exists());
}

/// Lvstore `lvs` on bdev `pool` and its 8 MiB lvol `lvs/v`, whose UUID it answers.
async fn lvol_v(t: &mut Client) -> Value {
    t.ok(
        "bdev_lvol_create_lvstore",
        json!({"bdev_name": "pool", "lvs_name": "lvs"}),
    )
    .await;
    t.ok(
        "bdev_lvol_create",
        json!({"lvol_name": "v", "size_in_mib": 8, "lvs_name": "lvs"}),
    )
    .await
}

/// Exposes bdev `remoten1` (an NVMe-oF namespace) to the host as namespace
/// 1 of an NVMe controller on a free VF: the function and the host's device.
async fn expose_remote_namespace(d: &mut Client, dpu: &Emu) -> (String, PathBuf) {
    let snqn = "nqn.2022-10.io.nvda.nvme:remote";
    d.ok("nvme_subsystem_create", json!({"nqn": snqn})).await;
    d.ok(
        "nvme_namespace_create",
        json!({"bdev_type": "spdk", "nqn": snqn, "nsid": 1, "bdev_name": "remoten1"}),
    )
    .await;
    let bdf = free_vf(d, "NVME").await;
    expose_namespace(d, snqn, ("pci_bdf", &bdf), 1).await;
    let (_, head) = wait_for_nvme_disk(&devices(dpu).join(format!("0000:{bdf}"))).await;
    (bdf, dev_node(&head.join("dev")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvmf_attach_between_instances_reaches_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("pool.img");
    image(&pool, 64 * MIB, 0, b"");
    let (target, dpu) = Emu::start_target_and_dpu(dir.path()).await;
    let port = common::free_port().to_string();
    let mut t = target.client().await;
    t.ok(
        "bdev_aio_create",
        json!({"name": "pool", "filename": pool, "block_size": 4096}),
    )
    .await;
    let lvol = lvol_v(&mut t).await;
    let nqn = "nqn.2024-01.io.example:v";
    t.export_over_tcp("lvs/v", nqn, &port).await;

    let mut d = dpu.client().await;
    let names = d
        .ok(
            "bdev_nvme_attach_controller",
            json!({"name": "remote", "trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": port, "subnqn": nqn}),
        )
        .await;
    assert_eq!(names, json!(["remoten1"]));
    let b = d.ok("bdev_get_bdevs", json!({"name": "remoten1"})).await;
    assert_eq!(b[0]["block_size"], 4096);
    assert_eq!(b[0]["num_blocks"], 2048);
    // Expose the remote namespace to the host through SNAP.
    let (bdf, node) = expose_remote_namespace(&mut d, &dpu).await;
    write_at(&node, 8192, b"written on the host");
    // The target's lvol file holds what the host wrote.
    let lvs = t
        .ok("bdev_lvol_get_lvstores", json!({"lvs_name": "lvs"}))
        .await;
    let lvs_uuid = lvs[0]["uuid"].as_str().unwrap();
    let file = target.state_dir.join(format!(
        "lvstores/lvs-{lvs_uuid}/{}.img",
        lvol.as_str().unwrap()
    ));
    assert_eq!(read_at(&file, 8192, 19), b"written on the host");

    // The target sees the connection; detaching ends it.
    let ctrls = d
        .ok("bdev_nvme_get_controllers", json!({"name": "remote"}))
        .await;
    assert_eq!(ctrls[0]["ctrlrs"][0]["cntlid"], 1);
    d.ok("bdev_nvme_detach_controller", json!({"name": "remote"}))
        .await;
    assert!(
        !devices(&dpu).join(format!("0000:{bdf}/nvme")).exists(),
        "hot remove reached the host"
    );
    let subs = d.ok("nvme_subsystem_list", Value::Null).await;
    assert_eq!(subs[0]["namespaces"], json!([]));
    dpu.stop().await;
    target.stop().await;
}

/// A target restarted under a namespace the host is writing to: with a
/// reconnect policy (SPDK's `reconnect_delay_sec`, `ctrlr_loss_timeout_sec`
/// -1) the write is held while the target is down, for longer than a
/// reconnect delay, and lands once the restarted target (its pool made again
/// by `--json`, its lvstore found on it) exports the subsystem again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_rides_out_a_target_restart_with_a_reconnect_policy() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("pool.img");
    image(&pool, 64 * MIB, 0, b"");
    let saved = dir.path().join("target.json");
    let pool_bdev = json!({"name": "pool", "filename": pool, "block_size": 4096});
    let config = json!({"subsystems": [{"subsystem": "bdev", "config": [
        {"method": "bdev_aio_create", "params": pool_bdev}
    ]}]});
    std::fs::write(&saved, config.to_string()).unwrap();
    let (target, dpu) = Emu::start_target_and_dpu(dir.path()).await;
    target.stop().await;
    let mut target_config = Config::for_test(&dir.path().join("target")).without_snap();
    target_config.json_config = Some(saved);
    let target = Emu::start(target_config.clone()).await;
    let port = common::free_port().to_string();
    let nqn = "nqn.2024-01.io.example:v";
    let mut t = target.client().await;
    let lvol = lvol_v(&mut t).await;
    t.export_over_tcp("lvs/v", nqn, &port).await;
    let lvs = t.ok("bdev_lvol_get_lvstores", Value::Null).await;
    let file = target.state_dir.join(format!(
        "lvstores/lvs-{}/{}.img",
        lvs[0]["uuid"].as_str().unwrap(),
        lvol.as_str().unwrap()
    ));

    let mut d = dpu.client().await;
    d.ok(
        "bdev_nvme_attach_controller",
        json!({"name": "remote", "trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1",
               "trsvcid": port, "subnqn": nqn, "ctrlr_loss_timeout_sec": -1, "reconnect_delay_sec": 1}),
    )
    .await;
    let (_, node) = expose_remote_namespace(&mut d, &dpu).await;
    write_at(&node, 0, b"before the restart");

    drop(t);
    target.stop().await;
    let writing = std::thread::spawn(move || write_at(&node, 8192, b"while it was down"));
    // Down for longer than a reconnect delay: the write is held, not failed.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(!writing.is_finished(), "the write waits for the target");
    let target = Emu::start(target_config).await;
    let mut t = target.client().await;
    t.export_over_tcp("lvs/v", nqn, &port).await;
    writing
        .join()
        .expect("the write lands once the target is back");
    assert_eq!(read_at(&file, 0, 18), b"before the restart");
    assert_eq!(read_at(&file, 8192, 17), b"while it was down");
    drop((t, d));
    dpu.stop().await;
    target.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_keep_their_exact_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let layout = FunctionLayout {
        nvme_pfs: 1,
        nvme_vfs_per_pf: 2,
        virtio_blk_pfs: 1,
        virtio_blk_vfs_per_pf: 1,
    };
    let emu = Emu::start(Config::for_test(&dir.path().join("emu")).with_functions(layout)).await;
    let mut c = emu.client().await;
    c.ok(
        "bdev_malloc_create",
        json!({"name": "m0", "num_blocks": 2048, "block_size": 512}),
    )
    .await;
    c.ok(
        "bdev_malloc_create",
        json!({"name": "m1", "num_blocks": 2048, "block_size": 512}),
    )
    .await;
    for (nqn, bdev) in [
        ("nqn.2022-10.io.nvda.nvme:a", "m0"),
        ("nqn.2022-10.io.nvda.nvme:bé", "m1"),
    ] {
        c.ok(
            "nvme_subsystem_create",
            json!({"nqn": nqn, "sn": "SN\"1", "mn": "model"}),
        )
        .await;
        c.ok(
            "nvme_namespace_create",
            json!({"bdev_type": "spdk", "nqn": nqn, "nsid": 2,
                   "uuid": "263826ad-19a3-4feb-bc25-4bc81ee7748e", "bdev_name": bdev}),
        )
        .await;
    }
    let ctrl = create_ctrl(
        &mut c,
        "nvme_controller_create",
        json!({"nqn": "nqn.2022-10.io.nvda.nvme:a", "pci_bdf": "26:00.2", "suspended": true}),
    )
    .await;
    c.ok(
        "nvme_controller_attach_ns",
        json!({"ctrl_id": ctrl, "nsid": 2}),
    )
    .await;
    let suspended = c.call_raw("nvme_subsystem_list", json!({})).await;
    c.ok("nvme_controller_resume", json!({"ctrl_id": ctrl}))
        .await;
    let resumed = c.call_raw("nvme_subsystem_list", json!({})).await;
    let one = c
        .call_raw(
            "nvme_subsystem_list",
            json!({"nqn": "nqn.2022-10.io.nvda.nvme:a"}),
        )
        .await;
    let all = c
        .call_raw("emulation_function_list", json!({"all": true}))
        .await;
    let used = c.call_raw("emulation_function_list", json!({})).await;
    // Captured from the renderer built on serde_json::Value, which the direct
    // one replaced: SPDK's key order, escapes and optional keys, byte for byte.
    let expected = [
        (
            suspended,
            r#"{"jsonrpc":"2.0","id":9,"result":[{"nqn":"nqn.2022-10.io.nvda.nvme:a","sn":"SN\"1","mn":"model","nn":1024,"mnan":1024,"controllers":[{"ctrl_id":"NVMeCtrl1","vhca_id":5,"nqn":"nqn.2022-10.io.nvda.nvme:a","plugged":true,"state":"SUSPENDED","num_queues":16,"max_queues":32,"mdts":7,"namespaces":[{"nsid":2,"bdev":"m0","uuid":"263826ad-19a3-4feb-bc25-4bc81ee7748e"}]}],"namespaces":[{"nsid":2,"bdev":"m0","uuid":"263826ad-19a3-4feb-bc25-4bc81ee7748e","nqn":"nqn.2022-10.io.nvda.nvme:a","ready":"No","max inflights per weight":65535,"controllers":[{"ctrl_id":"NVMeCtrl1"}]}]},{"nqn":"nqn.2022-10.io.nvda.nvme:b\u00E9","sn":"SN\"1","mn":"model","nn":1024,"mnan":1024,"controllers":[],"namespaces":[{"nsid":2,"bdev":"m1","uuid":"263826ad-19a3-4feb-bc25-4bc81ee7748e","nqn":"nqn.2022-10.io.nvda.nvme:b\u00E9","ready":"No","max inflights per weight":65535,"controllers":[]}]}]}"#,
        ),
        (
            resumed,
            r#"{"jsonrpc":"2.0","id":11,"result":[{"nqn":"nqn.2022-10.io.nvda.nvme:a","sn":"SN\"1","mn":"model","nn":1024,"mnan":1024,"controllers":[{"ctrl_id":"NVMeCtrl1","vhca_id":5,"nqn":"nqn.2022-10.io.nvda.nvme:a","plugged":true,"state":"STARTED","num_queues":16,"max_queues":32,"mdts":7,"namespaces":[{"nsid":2,"bdev":"m0","uuid":"263826ad-19a3-4feb-bc25-4bc81ee7748e"}]}],"namespaces":[{"nsid":2,"bdev":"m0","uuid":"263826ad-19a3-4feb-bc25-4bc81ee7748e","nqn":"nqn.2022-10.io.nvda.nvme:a","ready":"Yes","max inflights per weight":65535,"controllers":[{"ctrl_id":"NVMeCtrl1"}]}]},{"nqn":"nqn.2022-10.io.nvda.nvme:b\u00E9","sn":"SN\"1","mn":"model","nn":1024,"mnan":1024,"controllers":[],"namespaces":[{"nsid":2,"bdev":"m1","uuid":"263826ad-19a3-4feb-bc25-4bc81ee7748e","nqn":"nqn.2022-10.io.nvda.nvme:b\u00E9","ready":"No","max inflights per weight":65535,"controllers":[]}]}]}"#,
        ),
        (
            one,
            r#"{"jsonrpc":"2.0","id":12,"result":[{"nqn":"nqn.2022-10.io.nvda.nvme:a","sn":"SN\"1","mn":"model","nn":1024,"mnan":1024,"controllers":[{"ctrl_id":"NVMeCtrl1","vhca_id":5,"nqn":"nqn.2022-10.io.nvda.nvme:a","plugged":true,"state":"STARTED","num_queues":16,"max_queues":32,"mdts":7,"namespaces":[{"nsid":2,"bdev":"m0","uuid":"263826ad-19a3-4feb-bc25-4bc81ee7748e"}]}],"namespaces":[{"nsid":2,"bdev":"m0","uuid":"263826ad-19a3-4feb-bc25-4bc81ee7748e","nqn":"nqn.2022-10.io.nvda.nvme:a","ready":"Yes","max inflights per weight":65535,"controllers":[{"ctrl_id":"NVMeCtrl1"}]}]}]}"#,
        ),
        (
            all,
            r#"{"jsonrpc":"2.0","id":13,"result":[{"hotplugged":false,"emulation_type":"NVME","pf_index":0,"pci_bdf":"26:00.0","vhca_id":2,"vuid":"MT2400XZ0EMUNVMES0D0F0","vfs":[{"hotplugged":false,"emulation_type":"NVME","pf_index":0,"vf_index":0,"pci_bdf":"26:00.1","vhca_id":4,"vuid":"MT2400XZ0EMUNVMES0D0F0VF1"},{"hotplugged":false,"emulation_type":"NVME","pf_index":0,"vf_index":1,"pci_bdf":"26:00.2","vhca_id":5,"vuid":"MT2400XZ0EMUNVMES0D0F0VF2","ctrl_id":"NVMeCtrl1"}]},{"hotplugged":false,"emulation_type":"VBLK","pf_index":0,"pci_bdf":"27:00.0","vhca_id":3,"vuid":"MT2400XZ0EMUVBLKS0D0F0","vfs":[{"hotplugged":false,"emulation_type":"VBLK","pf_index":0,"vf_index":0,"pci_bdf":"27:00.1","vhca_id":6,"vuid":"MT2400XZ0EMUVBLKS0D0F0VF1"}]}]}"#,
        ),
        (
            used,
            r#"{"jsonrpc":"2.0","id":14,"result":[{"hotplugged":false,"emulation_type":"NVME","pf_index":0,"pci_bdf":"26:00.0","vhca_id":2,"vuid":"MT2400XZ0EMUNVMES0D0F0","vfs":[{"hotplugged":false,"emulation_type":"NVME","pf_index":0,"vf_index":1,"pci_bdf":"26:00.2","vhca_id":5,"vuid":"MT2400XZ0EMUNVMES0D0F0VF2","ctrl_id":"NVMeCtrl1"}]},{"hotplugged":false,"emulation_type":"VBLK","pf_index":0,"pci_bdf":"27:00.0","vhca_id":3,"vuid":"MT2400XZ0EMUVBLKS0D0F0","vfs":[]}]}"#,
        ),
    ];
    for (got, want) in expected {
        assert_eq!(String::from_utf8(got).unwrap(), format!("{want}\n"));
    }
    emu.stop().await;
}
