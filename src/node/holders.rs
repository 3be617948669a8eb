//! Who keeps a mount busy, for the message of an unmount the kernel refused
//! with EBUSY: the processes whose working directory, root directory, open
//! files or mapped files (a program run from the volume, a library) lie in
//! it, and the mounts below it.
//!
//! Only what this process can see: the processes of its PID namespace, by
//! the paths of its mount namespace. A pod's own processes do not keep the
//! node's mount busy (their container holds a copy of it); those that do are
//! on the host side, such as a shell someone left in the directory, a backup
//! agent, or a `du`. A process's command line may carry secrets, so only
//! its name (`comm`) is reported.

use std::fs;
use std::path::{Path, PathBuf};

use super::mountinfo;

/// At most this many holders are named; the message says how many more.
const NAMED: usize = 8;

/// One thing that keeps the mount busy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// `None` for a mount below the mount point.
    pub pid: Option<u32>,
    /// The process's name, or the mount point below.
    pub name: String,
    /// How it holds the mount: "working directory", "open file PATH", ...
    pub how: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.pid {
            Some(pid) => write!(f, "pid {pid} ({}): {}", self.name, self.how),
            None => write!(f, "{}", self.how),
        }
    }
}

/// Everything /proc and the mount table show holding `mount_point`, one
/// entry per process (its first hold) and per mount below it.
pub fn find(mount_point: &Path) -> Vec<Holder> {
    let mut found: Vec<Holder> = mountinfo::read()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.mount_point != mount_point && m.mount_point.starts_with(mount_point))
        .map(|m| Holder {
            pid: None,
            name: m.mount_point.display().to_string(),
            how: format!(
                "{} is mounted below it ({})",
                m.mount_point.display(),
                m.fs_type
            ),
        })
        .collect();
    let Ok(processes) = fs::read_dir("/proc") else {
        return found;
    };
    let mut pids: Vec<u32> = processes
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    // A process may exit while we look: whatever is gone is skipped.
    found.extend(pids.into_iter().filter_map(|pid| {
        let how = holds(pid, mount_point)?;
        let name = fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        Some(Holder {
            pid: Some(pid),
            name: name.trim_end().to_string(),
            how,
        })
    }));
    found
}

/// How process `pid` holds `mount_point`, if it does.
fn holds(pid: u32, mount_point: &Path) -> Option<String> {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let inside = |path: &Path| path.starts_with(mount_point);
    let link = |name: &str| fs::read_link(proc.join(name)).ok().map(undeleted);
    if link("cwd").is_some_and(|p| inside(&p)) {
        return Some("working directory".into());
    }
    if link("root").is_some_and(|p| inside(&p)) {
        return Some("root directory".into());
    }
    if let Ok(fds) = fs::read_dir(proc.join("fd")) {
        for fd in fds.flatten() {
            if let Ok(path) = fs::read_link(fd.path()).map(undeleted)
                && inside(&path)
            {
                return Some(format!("open file {}", path.display()));
            }
        }
    }
    let maps = fs::read_to_string(proc.join("maps")).ok()?;
    maps.lines()
        .filter_map(mapped_path)
        .find(|path| inside(path))
        .map(|path| format!("mapped file {}", path.display()))
}

/// The file of a `/proc/PID/maps` line: the sixth field on, where the
/// kernel puts one (anonymous memory has none, `[heap]` is not a path).
fn mapped_path(line: &str) -> Option<PathBuf> {
    let path = line.splitn(6, ' ').nth(5)?.trim_start();
    path.starts_with('/')
        .then(|| undeleted(PathBuf::from(path)))
}

/// A deleted file still held open shows as `PATH (deleted)`; it holds the
/// mount all the same.
fn undeleted(path: PathBuf) -> PathBuf {
    match path.to_str().and_then(|p| p.strip_suffix(" (deleted)")) {
        Some(stripped) => PathBuf::from(stripped),
        None => path,
    }
}

/// The holders for a message: the first few, and how many more there are.
pub fn describe(holders: &[Holder]) -> String {
    let mut text = holders
        .iter()
        .take(NAMED)
        .map(Holder::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    if holders.len() > NAMED {
        text.push_str(&format!("; and {} more", holders.len() - NAMED));
    }
    text
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};

    use super::super::command::testing::{Scratch, sh};
    use super::*;

    /// A child process, killed and reaped when dropped (also on a failure).
    struct KillOnDrop(std::process::Child);

    impl KillOnDrop {
        fn spawn(command: &mut Command) -> KillOnDrop {
            KillOnDrop(command.spawn().unwrap())
        }

        fn pid(&self) -> u32 {
            self.0.id()
        }
    }

    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// A tmpfs at `name` in `scratch`, with a file in it.
    fn tmpfs(scratch: &Scratch, name: &str) -> PathBuf {
        let mount_point = scratch.path(name);
        fs::create_dir(&mount_point).unwrap();
        sh(
            "mount",
            &[
                "-t".as_ref(),
                "tmpfs".as_ref(),
                "tmpfs".as_ref(),
                mount_point.as_os_str(),
            ],
        );
        fs::write(mount_point.join("file"), b"held").unwrap();
        mount_point
    }

    fn holder_of(holders: &[Holder], pid: u32) -> &Holder {
        holders
            .iter()
            .find(|h| h.pid == Some(pid))
            .unwrap_or_else(|| panic!("pid {pid} not among {holders:?}"))
    }

    #[test]
    fn finds_working_directories_open_and_mapped_files_and_mounts_below() {
        let scratch = Scratch::new();
        let mount_point = tmpfs(&scratch, "volume");
        // A neighbour whose name starts the same is not inside.
        let neighbour = tmpfs(&scratch, "volume2");

        let in_cwd = KillOnDrop::spawn(Command::new("sleep").arg("600").current_dir(&mount_point));
        let reading = KillOnDrop::spawn(
            Command::new("sleep")
                .arg("600")
                .stdin(fs::File::open(mount_point.join("file")).unwrap()),
        );
        // A program run from the volume maps its own file.
        let program = mount_point.join("from-volume");
        fs::copy("/bin/sleep", &program).unwrap();
        let mapped = KillOnDrop::spawn(Command::new(&program).arg("600"));
        let elsewhere = KillOnDrop::spawn(Command::new("sleep").arg("600").current_dir(&neighbour));
        let below = tmpfs(&scratch, "volume/below");

        let holders = find(&mount_point);
        assert_eq!(holder_of(&holders, in_cwd.pid()).how, "working directory");
        assert_eq!(holder_of(&holders, in_cwd.pid()).name, "sleep");
        assert_eq!(
            holder_of(&holders, reading.pid()).how,
            format!("open file {}", mount_point.join("file").display())
        );
        // (The name of a process is at most 15 bytes.)
        assert_eq!(holder_of(&holders, mapped.pid()).name, "from-volume");
        assert!(
            holder_of(&holders, mapped.pid())
                .how
                .contains("from-volume"),
            "{holders:?}"
        );
        assert!(
            holders.iter().all(|h| h.pid != Some(elsewhere.pid())),
            "{holders:?}"
        );
        assert!(
            holders
                .iter()
                .any(|h| h.pid.is_none() && h.how.contains(&*below.to_string_lossy())),
            "{holders:?}"
        );
        let message = describe(&holders);
        assert!(
            message.contains(&format!("pid {} (sleep): working directory", in_cwd.pid())),
            "{message}"
        );
        drop((in_cwd, reading, mapped, elsewhere));
        sh("umount", &[below.as_os_str()]);
        assert_eq!(find(&mount_point), Vec::new());
    }

    #[test]
    fn a_deleted_file_still_open_holds_the_mount() {
        let scratch = Scratch::new();
        let mount_point = tmpfs(&scratch, "volume");
        let file = fs::File::open(mount_point.join("file")).unwrap();
        let child = KillOnDrop::spawn(Command::new("sleep").arg("600").stdin(Stdio::from(file)));
        fs::remove_file(mount_point.join("file")).unwrap();
        let holders = find(&mount_point);
        assert!(
            holder_of(&holders, child.pid())
                .how
                .starts_with("open file "),
            "{holders:?}"
        );
    }

    #[test]
    fn maps_lines_give_their_paths() {
        let line = "7f1c2a000000-7f1c2a022000 r--p 00000000 07:00 12  /k/vol/lib.so (deleted)";
        assert_eq!(mapped_path(line), Some(PathBuf::from("/k/vol/lib.so")));
        assert_eq!(
            mapped_path("55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0  [heap]"),
            None
        );
        assert_eq!(
            mapped_path("7ffd5b1e2000-7ffd5b1e4000 r-xp 00000000 00:00 0"),
            None
        );
    }

    #[test]
    fn describe_names_the_first_few_and_counts_the_rest() {
        let holders: Vec<Holder> = (1..=10)
            .map(|pid| Holder {
                pid: Some(pid),
                name: "sh".into(),
                how: "working directory".into(),
            })
            .collect();
        let text = describe(&holders);
        assert!(
            text.starts_with("pid 1 (sh): working directory; pid 2"),
            "{text}"
        );
        assert!(text.ends_with("; and 2 more"), "{text}");
        assert!(!text.contains("pid 9 "), "{text}");
    }
}
