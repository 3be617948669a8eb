//! A filesystem share as the fs backend needs one: a btrfs on a loop file
//! with quotas enabled, unmounted when dropped (as root, with btrfs-progs).

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct BtrfsShare {
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

impl BtrfsShare {
    /// A share of `bytes` (btrfs needs ~110 MiB at least).
    pub fn new(bytes: u64) -> BtrfsShare {
        let scratch = tempfile::tempdir().unwrap();
        let image = scratch.path().join("share.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(bytes)
            .unwrap();
        let dir = scratch.path().join("share");
        std::fs::create_dir(&dir).unwrap();
        let (image, mounted) = (image.to_str().unwrap(), dir.to_str().unwrap());
        run("mkfs.btrfs", &["-q", image]);
        run("mount", &["-o", "loop", image, mounted]);
        run("btrfs", &["quota", "enable", mounted]);
        BtrfsShare {
            dir,
            _scratch: scratch,
        }
    }

    /// Every entry of the share but the snapshot directory and its records
    /// directory, which the controller keeps.
    pub fn leftovers(&self) -> Vec<String> {
        let mut out = vec![];
        let mut pending = vec![self.dir.clone()];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let name = path.strip_prefix(&self.dir).unwrap();
                if name == Path::new(".snapshots") || name == Path::new(".snapshots/records") {
                    pending.push(path);
                } else {
                    out.push(name.display().to_string());
                }
            }
        }
        out.sort();
        out
    }
}

impl Drop for BtrfsShare {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}
