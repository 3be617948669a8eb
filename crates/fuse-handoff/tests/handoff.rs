//! The handoff as a host and a device see it, with the kernel's own FUSE
//! client (needs root and /dev/fuse): no device is ENOENT and leaves no
//! mount; a device that takes the connection serves it, under a path longer
//! than a socket address holds; a connection whose server is gone answers
//! ENOTCONN.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fuse_handoff::{Listener, mount};
use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags, umount2};

const WAIT: Duration = Duration::from_secs(10);

/// `(fs type, source)` of the mount at `point`, if any.
fn mounted_at(point: &Path) -> Option<(String, String)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        (left.split(' ').nth(4)? == point.to_str()?).then(|| {
            let mut right = right.split(' ');
            (right.next().unwrap().into(), right.next().unwrap().into())
        })
    })
}

fn target(dir: &Path) -> PathBuf {
    let target = dir.join("target");
    std::fs::create_dir_all(&target).unwrap();
    target
}

#[test]
fn no_device_or_a_dead_ones_socket_is_enoent_and_mounts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let target = target(dir.path());
    assert_eq!(
        mount(dir.path(), "absent", &target, MsFlags::empty(), WAIT),
        Err(Errno::ENOENT)
    );
    drop(Listener::bind(&dir.path().join("dead")).unwrap());
    assert!(dir.path().join("dead").exists(), "a dead device's socket");
    assert_eq!(
        mount(dir.path(), "dead", &target, MsFlags::empty(), WAIT),
        Err(Errno::ENOENT)
    );
    assert_eq!(mounted_at(&target), None);
}

#[test]
fn a_device_that_goes_unanswered_leaves_no_mount() {
    let dir = tempfile::tempdir().unwrap();
    let target = target(dir.path());
    let device = Listener::bind(&dir.path().join("tag")).unwrap();
    let refusing = std::thread::spawn(move || {
        let host = device.accept().unwrap();
        drop(host.connection(WAIT).unwrap());
        device.close();
    });
    assert_eq!(
        mount(dir.path(), "tag", &target, MsFlags::empty(), WAIT),
        Err(Errno::ENOENT)
    );
    refusing.join().unwrap();
    assert_eq!(mounted_at(&target), None);
    assert!(!dir.path().join("tag").exists(), "close removes the socket");
}

#[test]
fn a_served_mount_is_fuse_virtiofs_by_tag_and_dies_with_its_server() {
    let dir = tempfile::tempdir().unwrap();
    // Deeper than a socket address (108 bytes) reaches.
    let devices = dir.path().join("d".repeat(60)).join("e".repeat(60));
    std::fs::create_dir_all(&devices).unwrap();
    let target = target(dir.path());
    let device = Listener::bind(&devices.join("tag-1")).unwrap();
    let serving = std::thread::spawn(move || {
        let host = device.accept().unwrap();
        let connection = host.connection(WAIT).unwrap();
        host.serving().unwrap();
        connection
    });
    mount(&devices, "tag-1", &target, MsFlags::MS_RDONLY, WAIT).unwrap();
    let connection = serving.join().unwrap();
    assert_eq!(
        mounted_at(&target),
        Some(("fuse.virtiofs".into(), "tag-1".into()))
    );
    // Its only server gone, the kernel aborts the connection.
    drop(connection);
    let dead = std::fs::metadata(target.join("x")).unwrap_err();
    assert_eq!(dead.raw_os_error(), Some(Errno::ENOTCONN as i32), "{dead}");
    umount2(&target, MntFlags::MNT_DETACH).unwrap();
}
