//! A filesystem share as the fs backend needs one: a btrfs (reflinks) on a
//! loop file, unmounted when dropped with every volume mounted in it (as
//! root, with btrfs-progs and e2fsprogs).

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Share {
    pub dir: PathBuf,
    _scratch: tempfile::TempDir,
}

fn run(program: &str, args: &[&str]) {
    let output = Command::new(program).args(args).output().unwrap();
    assert!(
        output.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The directories the controller keeps in the share.
const KEPT: [&str; 3] = [".images", ".snapshots", ".snapshots/records"];

impl Share {
    /// A btrfs share of `bytes` (btrfs needs ~110 MiB at least).
    pub fn new(bytes: u64) -> Share {
        Share::of("btrfs", bytes)
    }

    /// A share on a filesystem without reflinks, which cannot serve.
    pub fn ext4(bytes: u64) -> Share {
        Share::of("ext4", bytes)
    }

    fn of(fs_type: &str, bytes: u64) -> Share {
        let scratch = tempfile::tempdir().unwrap();
        let image = scratch.path().join("share.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(bytes)
            .unwrap();
        let dir = scratch.path().join("share");
        std::fs::create_dir(&dir).unwrap();
        let (image, mounted) = (image.to_str().unwrap(), dir.to_str().unwrap());
        match fs_type {
            "btrfs" => run("mkfs.btrfs", &["-q", image]),
            _ => run("mkfs.ext4", &["-q", "-F", image]),
        }
        run("mount", &["-o", "loop", image, mounted]);
        Share {
            dir,
            _scratch: scratch,
        }
    }

    /// Every entry of the share but the directories the controller keeps.
    pub fn leftovers(&self) -> Vec<String> {
        let mut out = vec![];
        let mut pending = vec![self.dir.clone()];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let name = path.strip_prefix(&self.dir).unwrap();
                if KEPT.iter().any(|k| name == Path::new(k)) {
                    pending.push(path);
                } else {
                    out.push(name.display().to_string());
                }
            }
        }
        out.sort();
        out
    }

    /// The mount points inside the share (volumes' images), deepest first.
    pub fn mounts(&self) -> Vec<PathBuf> {
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mut out: Vec<PathBuf> = table
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(PathBuf::from)
            .filter(|p| p.starts_with(&self.dir) && *p != self.dir)
            .collect();
        out.sort();
        out.reverse();
        out
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        // What a failed test left: its volumes thawed and unmounted (their
        // loop devices go with them), then the share.
        for mount in self.mounts() {
            let _ = Command::new("fsfreeze").arg("-u").arg(&mount).output();
            let _ = Command::new("umount").arg(&mount).output();
        }
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}
