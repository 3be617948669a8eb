//! The node's host side on a real Linux kernel: Debian's own (bookworm-
//! backports) booted under QEMU as the host (`hack/guest/`), its PCI
//! functions hot-plugged through QMP as SNAP's are on a BlueField's host, and
//! the node's own lookup (`snap-csi find-device`, the code a stage runs) run
//! inside it. What a real kernel names and answers differently from the
//! emulator's tree is held here: NVMe paths under native multipath, a
//! namespace without a UUID, virtio-blk serials, a disk that grows online or
//! goes from under a mounted filesystem, virtio-fs tags and the kernel's
//! answer to an unknown one.
//!
//!
//! And split mode from a real host: the node runs inside the guest and
//! reaches its DPU agent on this machine over the guest's network link with
//! mutual TLS, as a BlueField host reaches its DPU; a node whose certificate
//! the agent's CA did not sign is refused. The node's start (its records, the
//! kernel's mount table and sysfs, the census it asks the agent for) runs on
//! the real kernel.
//!
//! What this does not prove: QEMU's devices stand in for SNAP's (the same
//! kernel drivers, not SNAP's firmware), and TCG's timing is not a host's.
//! Volumes staged through the node in the guest are `guest_node.rs`.

mod common;

use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use common::dpu::{Agent, GatedDpu, HOST_NAME, test_config};
use common::guest::{Guest, GuestSpec, Link};
use common::guest_node::{SNAP_CSI, STARTED, start_node, virtiofsd};
use common::pki::{Pki, Role};
use nix::errno::Errno;
use serde_json::json;
use snap_csi::dpu::HostLocator;
use snap_csi::tls::TlsFiles;

/// A hot-plugged function's disk on a loaded machine under TCG (measured:
/// 0.3-1.4 s idle).
const HOT_PLUG: Duration = Duration::from_secs(60);
const MIB: u64 = 1 << 20;

/// `snap-csi find-device` in the guest: (node, kernel name, size in bytes).
fn find_device(guest: &mut Guest, args: &str) -> (String, String, u64) {
    let out = guest
        .wait_until(&format!("{SNAP_CSI} find-device {args}"), HOT_PLUG)
        .unwrap_or_else(|e| panic!("{e:#}{}", guest.console_tail()));
    let fields: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(fields.len(), 4, "find-device printed {out:?}");
    (
        fields[0].to_owned(),
        fields[1].to_owned(),
        fields[3].parse().unwrap(),
    )
}

/// SNAP's model of NVMe: one subsystem, a controller per function. With
/// native multipath the kernel names a controller's path after the
/// subsystem's instance (`nvme0c1n1` under controller `nvme1`) and the disk
/// is the subsystem's head; without, each controller has its own disk.
fn two_controllers_of_one_subsystem(native_multipath: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = GuestSpec::new(if native_multipath { "mp-on" } else { "mp-off" });
    spec.native_multipath = native_multipath;
    let namespace = dir.path().join("ns1.img");
    common::sparse_file(&namespace, 64 * MIB);
    // A second namespace on the same controllers, as a packed pool has: the
    // kernel numbers its disks by discovery (`n<N>` need not be the NSID),
    // the node finds each by its `nsid`.
    let second_namespace = dir.path().join("ns2.img");
    common::sparse_file(&second_namespace, 32 * MIB);
    spec.nvme_namespaces = vec![namespace, second_namespace];
    let mut guest = Guest::boot(&spec).unwrap();
    let first = guest.add_nvme("fn1", 1).unwrap();
    let second = guest.add_nvme("fn2", 2).unwrap();

    // QEMU's NVMe namespace cannot grow (it does not share the resize
    // permission of its drive): online expansion of NVMe is not shown on the
    // guest. SNAP's namespace resize and its notice to the host are not
    // QEMU's; the emulator's tree holds the node to it instead.
    let resize = guest.qmp().execute(
        "block_resize",
        json!({"node-name": "ns1", "size": 128 * MIB}),
    );
    assert!(
        resize.is_err(),
        "QEMU grew an NVMe namespace: hold the node's online expansion to it here"
    );

    let (node1, name1, size1) = find_device(&mut guest, &format!("--bdf {first} --nsid 1"));
    let (node2, name2, size2) = find_device(&mut guest, &format!("--bdf {second} --nsid 1"));
    assert_eq!((size1, size2), (64 * MIB, 64 * MIB));
    for bdf in [&first, &second] {
        let (node, _, size) = find_device(&mut guest, &format!("--bdf {bdf} --nsid 2"));
        assert_eq!(size, 32 * MIB, "NSID 2 of {bdf} is {node}");
        assert_ne!(node, node1);
    }
    let controller = |guest: &mut Guest, bdf: &str| {
        guest
            .sh(&format!("ls /sys/bus/pci/devices/{bdf}/nvme"))
            .unwrap()
            .trim()
            .to_owned()
    };
    let (ctrl1, ctrl2) = (
        controller(&mut guest, &first),
        controller(&mut guest, &second),
    );
    if native_multipath {
        assert_eq!(node1, node2, "both functions lead to the subsystem's head");
        assert_eq!(format!("/dev/{name1}"), node1);
        let paths = guest
            .sh(&format!("ls /sys/bus/pci/devices/{second}/nvme/{ctrl2}"))
            .unwrap();
        assert!(
            !paths.contains(&format!("{ctrl2}n1")),
            "the path is not named after the controller: {paths}"
        );
    } else {
        assert_ne!(node1, node2);
        // Each controller's own disk, numbered by discovery.
        let own = |name: &str, ctrl: &str| {
            name.strip_prefix(&format!("{ctrl}n"))
                .is_some_and(|n| n.parse::<u32>().is_ok())
        };
        assert!(
            own(&name1, &ctrl1) && own(&name2, &ctrl2),
            "{name1} {name2}"
        );
    }
    // One namespace: what one function writes, the other reads.
    guest
        .sh(&format!(
            "(printf snap-csi; head -c 4088 /dev/zero) | \
             dd of={node1} bs=4096 count=1 iflag=fullblock oflag=direct status=none && \
             [ \"$(dd if={node2} bs=4096 count=1 iflag=direct status=none | head -c 8)\" = snap-csi ]"
        ))
        .unwrap();

    // QEMU reports a UUID the kernel ignores (its NVMe is quirked as having
    // bogus identifiers): the namespace lists none, and a locator that
    // expects one is refused at once, not matched and not waited on.
    let refused = guest
        .run(&format!(
            "{SNAP_CSI} find-device --bdf {second} --nsid 1 --uuid 6aaea650-8ef7-5653-a05a-0aea9d997ec8"
        ))
        .unwrap();
    assert_ne!(refused.status, 0);
    assert!(
        refused.stderr.contains("no UUID"),
        "a namespace without a UUID: {refused:?}"
    );

    // The first function goes: its namespace with it; the other keeps it.
    guest.remove("fn1").unwrap();
    let gone = guest
        .run(&format!("{SNAP_CSI} find-device --bdf {first} --nsid 1"))
        .unwrap();
    assert_ne!(gone.status, 0, "{gone:?}");
    assert_eq!(
        find_device(&mut guest, &format!("--bdf {second} --nsid 1")).2,
        64 * MIB
    );
}

#[test]
fn two_nvme_controllers_of_one_subsystem_with_native_multipath() {
    two_controllers_of_one_subsystem(true);
}

#[test]
fn two_nvme_controllers_of_one_subsystem_without_native_multipath() {
    two_controllers_of_one_subsystem(false);
}

#[test]
fn a_virtio_blk_disk_is_found_by_its_serial_grows_online_and_goes_from_under_a_mount() {
    let dir = tempfile::tempdir().unwrap();
    let mut guest = Guest::boot(&GuestSpec::new("virtio-blk")).unwrap();
    let (disk, other) = (dir.path().join("blk.img"), dir.path().join("other.img"));
    common::sparse_file(&disk, 48 * MIB);
    common::sparse_file(&other, 16 * MIB);
    // SNAP's serials are 20 bytes, virtio-blk's limit.
    let bdf = guest
        .add_virtio_blk("blk", 3, &disk, "sc-6aaea6508ef75653a")
        .unwrap();
    let other_bdf = guest
        .add_virtio_blk("other", 4, &other, "sc-0123456789abcdef0")
        .unwrap();
    let (node, name, size) = find_device(
        &mut guest,
        &format!("--bdf {bdf} --serial sc-6aaea6508ef75653a"),
    );
    assert_eq!(size, 48 * MIB);
    assert_eq!(node, format!("/dev/{name}"));
    let wrong = guest
        .run(&format!(
            "{SNAP_CSI} find-device --bdf {other_bdf} --serial sc-6aaea6508ef75653a"
        ))
        .unwrap();
    assert_ne!(wrong.status, 0, "another function's disk: {wrong:?}");

    // A disk grows online (SNAP's resize; here QEMU's block_resize): the
    // kernel takes the new capacity, and the node's lookup sees it.
    guest
        .qmp()
        .execute(
            "block_resize",
            json!({"node-name": "blk-drive", "size": 96 * MIB}),
        )
        .unwrap();
    guest
        .wait_until(
            &format!("[ $(cat /sys/block/{name}/size) -eq {} ]", 96 * MIB / 512),
            HOT_PLUG,
        )
        .unwrap();
    let (_, grown_name, grown) = find_device(
        &mut guest,
        &format!("--bdf {bdf} --serial sc-6aaea6508ef75653a"),
    );
    assert_eq!((grown_name.as_str(), grown), (name.as_str(), 96 * MIB));

    // The function goes under a mounted filesystem (a DPU that dropped it):
    // the kernel lets the disk go, the filesystem fails its I/O, and it
    // still unmounts, leaving nothing behind.
    guest
        .sh(&format!(
            "mkfs.ext4 -q {node} && mkdir -p /run/staged && mount {node} /run/staged && \
             echo kept >/run/staged/file && sync"
        ))
        .unwrap();
    guest.remove("blk").unwrap();
    let write = guest
        .run("echo more >/run/staged/more && sync -f /run/staged")
        .unwrap();
    assert_ne!(write.status, 0, "I/O to a removed disk: {write:?}");
    guest
        .sh("umount /run/staged && ! grep -q ' /run/staged ' /proc/self/mountinfo")
        .unwrap();
    let gone = guest
        .run(&format!(
            "{SNAP_CSI} find-device --bdf {bdf} --serial sc-6aaea6508ef75653a"
        ))
        .unwrap();
    assert_ne!(gone.status, 0, "{gone:?}");
}

/// virtiofsd serving `dir` on `socket`.
fn virtiofsd_on(socket: &Path, dir: &Path) -> Child {
    Command::new(virtiofsd())
        .arg(format!("--socket-path={}", socket.display()))
        .arg(format!("--shared-dir={}", dir.display()))
        .args(["--sandbox=none", "--cache=never", "--log-level=error"])
        .spawn()
        .unwrap()
}

/// The errno of mount(2) in the guest (0: mounted), without util-linux's
/// rewording.
fn mount_errno(guest: &mut Guest, tag: &str, target: &str, data: &str) -> i32 {
    let out = guest
        .sh(&format!(
            "mkdir -p {target} && python3 -c 'import ctypes; libc = ctypes.CDLL(None, use_errno=True); \
             r = libc.mount(b\"{tag}\", b\"{target}\", b\"virtiofs\", 0, b\"{data}\" or None); \
             print(0 if r == 0 else ctypes.get_errno())'"
        ))
        .unwrap();
    out.trim().parse().unwrap()
}

#[test]
fn virtio_fs_tags_and_the_kernels_answer_to_an_unknown_one() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    let socket = dir.path().join("virtiofsd.sock");
    let mut daemon = virtiofsd_on(&socket, &shared);
    let mut guest = Guest::boot(&GuestSpec::new("virtio-fs")).unwrap();

    // Debian's kernel has virtio-fs built in: the list exists from boot,
    // empty, so "absent" there means not there, not "cannot tell".
    let tag = "sc-6aaea6508ef75653a05a0aea9d997ec8";
    assert_eq!(guest.sh("ls -A /sys/fs/virtiofs").unwrap(), "");
    let unknown = guest
        .run(&format!("{SNAP_CSI} find-device --tag {tag}"))
        .unwrap();
    assert_eq!(unknown.status, 1, "{unknown:?}");
    // An unknown tag is EINVAL on 6.12, with options and without: what the
    // node's mount retries (src/node/mount/virtiofs.rs `tag_not_found`).
    assert_eq!(
        mount_errno(&mut guest, tag, "/run/t", "dax=never"),
        Errno::EINVAL as i32
    );
    assert_eq!(
        mount_errno(&mut guest, tag, "/run/t", ""),
        Errno::EINVAL as i32
    );

    wait_for_socket(&socket);
    guest.add_virtio_fs("fs", 5, &socket, tag).unwrap();
    guest
        .wait_until(&format!("{SNAP_CSI} find-device --tag {tag}"), HOT_PLUG)
        .unwrap();
    assert_eq!(mount_errno(&mut guest, tag, "/run/t", "dax=never"), 0);
    guest
        .sh("echo from-the-host >/run/t/written && sync && umount /run/t")
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(shared.join("written")).unwrap(),
        "from-the-host\n"
    );
    guest.remove("fs").unwrap();
    let gone = guest
        .run(&format!("{SNAP_CSI} find-device --tag {tag}"))
        .unwrap();
    assert_eq!(gone.status, 1, "{gone:?}");
    drop(guest);
    let _ = daemon.kill();
    let _ = daemon.wait();
}

/// virtiofsd listens once it made its socket.
fn wait_for_socket(socket: &Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !socket.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "virtiofsd made no socket"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The node's metrics page in the guest.
fn metrics_in_guest(port: u16) -> String {
    format!(
        "python3 -c \"import urllib.request; \
         print(urllib.request.urlopen('http://127.0.0.1:{port}/metrics').read().decode())\""
    )
}

/// Whether the page has `name{...}` with every label in `labels` above zero.
fn counted(page: &str, name: &str, labels: &[&str]) -> bool {
    page.lines().any(|line| {
        line.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with('{'))
            && labels.iter().all(|l| line.contains(l))
            && line
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(|v| v > 0.0)
    })
}

async fn agent_counted(labels: &[&str]) {
    let deadline = tokio::time::Instant::now() + STARTED;
    loop {
        if counted(
            &snap_csi::metrics::render().await,
            "snap_csi_tls_handshakes_total",
            labels,
        ) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the agent never counted a handshake {labels:?}:\n{}",
            snap_csi::metrics::render().await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_node_in_the_guest_reaches_its_dpu_agent_over_mutual_tls_and_a_stranger_is_refused() {
    // The guest reads the certificates over its shared root: not under /tmp,
    // which is its own.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let link = Link::new().unwrap();
    let (mut config, node_tls, _) = test_config(dir.path());
    let port = common::free_tcp_port();
    config.listen = format!("https://{}:{port}", link.host);
    let locator = HostLocator::VirtioBlk {
        bdf: "01:00.0".into(),
        serial: "unused".into(),
    };
    let agent = Agent::launch(config, node_tls.clone(), Some(GatedDpu::new(locator) as _)).await;
    let endpoint = format!("https://{}:{port}", link.host);

    let mut spec = GuestSpec::new("bf-host");
    spec.link = Some((link.tap.clone(), link.guest));
    let mut guest = tokio::task::block_in_place(|| Guest::boot(&spec)).unwrap();

    tokio::task::block_in_place(|| {
        start_node(&mut guest, "node", (&endpoint, &node_tls), 9101, ("", None))
    });
    tokio::task::block_in_place(|| {
        let script = format!(
            "{} | grep '^snap_csi_tls_handshakes_total{{' | grep 'role=\"client\"' | grep 'outcome=\"ok\"'",
            metrics_in_guest(9101)
        );
        guest.wait_until(&script, STARTED).unwrap_or_else(|e| {
            panic!(
                "{e:#}\n{}",
                guest.sh("cat /run/node/log").unwrap_or_default()
            )
        });
    });
    agent_counted(&["role=\"server\"", "outcome=\"ok\""]).await;

    // A node with a certificate from another CA (it trusts the agent's):
    // the agent refuses it at the handshake.
    let stranger =
        Pki::new(&dir.path().join("stranger"), "stranger-ca").issue(Role::Node, HOST_NAME);
    let stranger = TlsFiles {
        ca: node_tls.ca.clone(),
        ..stranger
    };
    tokio::task::block_in_place(|| {
        start_node(
            &mut guest,
            "stranger",
            (&endpoint, &stranger),
            9102,
            ("", None),
        )
    });
    agent_counted(&["role=\"server\"", "outcome=\"refused\""]).await;
    drop(guest);
    drop(agent);
}
