//! Starts the real SNAP emulator in-process for a test, on its own socket,
//! state directory and sysfs root.
//!
//! The emulator is `snap_emu::InProcess`: on its own thread and runtime, so
//! that dropping the handle (also when a test panics) stops it and waits for
//! it to detach its loop devices before the directory holding its records is
//! removed.

#![allow(dead_code)]

pub mod broken_plugin;
pub mod csi_v1_11;
pub mod dpu;
pub mod node;
pub mod pki;
pub mod plugin;
pub mod real_spdk;
pub mod shared;
pub mod vendor_controller;

// Each test crate uses some of them, as with `dead_code` above.
#[allow(unused_imports)]
pub use shared::{discovered, free_tcp_port, loop_devices_of, sparse_file, timed};

use std::path::{Path, PathBuf};

use snap_csi::jsonrpc::RpcClient;

pub struct Emulator {
    running: Option<snap_emu::InProcess>,
    root: PathBuf,
    pub socket: PathBuf,
    pub sysfs_root: PathBuf,
    /// Faults the test switches on while it runs (`snap_emu::faults`).
    pub faults: snap_emu::Faults,
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
        let faults = config.faults.clone();
        let running = snap_emu::InProcess::start(config).await.unwrap();
        Emulator {
            faults,
            socket: running.socket().to_path_buf(),
            sysfs_root: running.sysfs_root().to_path_buf(),
            running: Some(running),
            root: root.to_path_buf(),
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

    /// Stops the emulator gracefully and checks that it shut down cleanly
    /// (dropping it stops it too, reporting a failure on stderr).
    pub async fn stop(mut self) {
        if let Some(running) = self.running.take() {
            running.stop().expect("the emulator shuts down cleanly");
        }
    }
}
