//! A virtio-fs device in the guest: `vhost-user-fs-pci` with the device's
//! tag, served by virtiofsd over the fsdev's tree.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How long virtiofsd may take to listen.
const LISTENING: Duration = Duration::from_secs(10);

/// A virtiofsd serving one device.
#[derive(Debug)]
pub(super) struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Daemon {
    /// virtiofsd over `root`, listening on `socket` when this returns.
    pub(super) fn start(binary: &Path, socket: &Path, root: &Path) -> anyhow::Result<Self> {
        let _ = std::fs::remove_file(socket);
        let child = Command::new(binary)
            .arg(format!("--socket-path={}", socket.display()))
            .arg(format!("--shared-dir={}", root.display()))
            // Several hosts may share the tree (ReadWriteMany): no caching
            // of what another may change.
            .args(["--sandbox=none", "--cache=never", "--log-level=error"])
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut daemon = Self {
            child,
            socket: socket.to_owned(),
        };
        let deadline = Instant::now() + LISTENING;
        while !socket.exists() {
            if let Some(status) = daemon.child.try_wait()? {
                bail!("virtiofsd over {} exited: {status}", root.display());
            }
            if Instant::now() > deadline {
                bail!(
                    "virtiofsd over {} did not listen in {LISTENING:?}",
                    root.display()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(daemon)
    }
}

/// Stopped when dropped: the device goes with it.
impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}
