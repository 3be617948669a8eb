//! Starts the real SNAP emulator in-process for a test, on its own socket,
//! state directory and sysfs root.
//!
//! The emulator runs on its own thread and runtime, so that dropping the
//! handle (also when a test panics) can stop it and wait for it to detach its
//! loop devices, whatever runtime the test itself uses, and before the
//! temporary directory holding its records is removed.

#![allow(dead_code)]

pub mod node;
pub mod plugin;

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use snap_csi::jsonrpc::RpcClient;
use tokio::sync::oneshot;

pub struct Emulator {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<anyhow::Result<()>>>,
    root: PathBuf,
    pub socket: PathBuf,
    pub sysfs_root: PathBuf,
    // Declared last: removed only after the emulator has stopped.
    _owned: Option<tempfile::TempDir>,
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
        Emulator::start_with(snap_emu::Config::for_test(root), root).await
    }

    /// An emulator with a given configuration; `root` is where tests put files.
    pub async fn start_with(config: snap_emu::Config, root: &Path) -> Emulator {
        let socket = config.socket.clone();
        let sysfs_root = config.effective_sysfs_root();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            runtime.block_on(snap_emu::run(config, async move {
                let _ = stopped.await;
            }))
        });
        wait_for_socket(&socket).await;
        Emulator {
            stop: Some(stop),
            thread: Some(thread),
            root: root.to_path_buf(),
            socket,
            sysfs_root,
            _owned: None,
        }
    }

    /// Where the test may put its own files (backing files, ...).
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn client(&self) -> RpcClient {
        RpcClient::new(&self.socket)
    }

    /// Stops the emulator gracefully and checks that it shut down cleanly.
    pub async fn stop(mut self) {
        let result = self.shutdown();
        result.expect("the emulator shuts down cleanly");
    }

    fn shutdown(&mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.thread.take() {
            Some(thread) => thread
                .join()
                .map_err(|_| anyhow::anyhow!("emulator thread panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            eprintln!("emulator shutdown: {e:#}");
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
