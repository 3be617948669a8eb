//! Starts the real SNAP emulator in-process for a test, on its own socket,
//! state directory and sysfs root, and stops it (detaching every loop device)
//! when dropped.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use snap_csi::jsonrpc::RpcClient;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct Emulator {
    root: PathBuf,
    _owned: Option<tempfile::TempDir>,
    pub socket: PathBuf,
    pub sysfs_root: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl Emulator {
    /// An emulator in a fresh temporary directory.
    pub async fn start() -> Emulator {
        let dir = tempfile::tempdir().unwrap();
        let mut emulator = Emulator::start_in(dir.path()).await;
        emulator._owned = Some(dir);
        emulator
    }

    /// An emulator whose socket, state and sysfs tree live under `root`, so a
    /// second one started there later takes its place.
    pub async fn start_in(root: &Path) -> Emulator {
        let config = snap_emu::Config::for_test(root);
        let socket = config.socket.clone();
        let sysfs_root = config.effective_sysfs_root();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(snap_emu::run(config, async move {
            let _ = stopped.await;
        }));
        wait_for_socket(&socket).await;
        Emulator {
            root: root.to_path_buf(),
            _owned: None,
            socket,
            sysfs_root,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Where the test may put its own files (backing files, ...).
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn client(&self) -> RpcClient {
        RpcClient::new(&self.socket)
    }

    /// Stops the emulator gracefully and waits until it has cleaned up.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
    }
}

async fn wait_for_socket(socket: &Path) {
    for _ in 0..500 {
        if tokio::net::UnixStream::connect(socket).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("emulator did not listen on {}", socket.display());
}

/// Loop devices currently backed by `file` (`losetup -j`).
pub fn loop_devices_of(file: &Path) -> Vec<String> {
    let out = std::process::Command::new("losetup")
        .arg("-j")
        .arg(file)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// A sparse file of `size` bytes.
pub fn sparse_file(path: &Path, size: u64) {
    let file = std::fs::File::create(path).unwrap();
    file.set_len(size).unwrap();
}
