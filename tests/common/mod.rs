//! Starts the real SNAP emulator in-process for a test, on its own socket,
//! state directory and sysfs root.
//!
//! The emulator is `snap_emu::InProcess`: on its own thread and runtime, so
//! that dropping the handle (also when a test panics) stops it and waits for
//! it to detach its loop devices before the directory holding its records is
//! removed.

#![allow(dead_code)]

pub mod attach;
pub mod broken_plugin;
pub mod crash;
pub mod csi_samples;
pub mod csi_v1_11;
pub mod dpu;
pub mod dpus;
#[path = "../../hack/harness/src/guest/mod.rs"]
pub mod guest;
pub mod guest_node;
// kubelet's rules and the kills at random instants, shared with the chaos
// soak (`hack/harness`).
#[path = "../../hack/harness/src/kills.rs"]
pub mod kills;
#[path = "../../hack/harness/src/kubelet.rs"]
pub mod kubelet;
#[path = "../../hack/harness/src/kubelet_fs.rs"]
pub mod kubelet_fs;
pub mod node;
pub mod pki;
pub mod plugin;
pub mod proxy;
pub mod real_spdk;
pub mod shared;
pub mod vendor_controller;
pub mod virtio_fs;

// Each test crate uses some of them, as with `dead_code` above.
#[allow(unused_imports)]
pub use shared::{
    ROUND_TRIP_PERIOD, assert_kept_deadline, discovered, free_tcp_port, loop_devices_of,
    round_trips, sparse_file, timed,
};

use std::path::{Path, PathBuf};

use snap_csi::jsonrpc::RpcClient;

pub struct Emulator {
    running: Option<snap_emu::InProcess>,
    /// What it was started with, for a restart.
    config: snap_emu::Config,
    root: PathBuf,
    pub socket: PathBuf,
    pub sysfs_root: PathBuf,
    /// Its host's virtio-fs devices, a socket per tag: a host here mounts
    /// one with `fuse_handoff::mount(<virtiofs_dir>, tag, ...)` where a real
    /// one mounts `-t virtiofs <tag>`.
    pub virtiofs_dir: PathBuf,
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
        let running = snap_emu::InProcess::start(config.clone()).await.unwrap();
        Emulator {
            config,
            faults,
            socket: running.socket().to_path_buf(),
            sysfs_root: running.sysfs_root().to_path_buf(),
            virtiofs_dir: running.virtiofs_dir().to_path_buf(),
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

    /// The dependent round trips its poller has counted (see
    /// `snap_emu::Rounds`; 0 without a poll period).
    pub fn rounds(&self) -> u64 {
        self.running.as_ref().map_or(0, snap_emu::InProcess::rounds)
    }

    /// Has the host name every exposed controller's disks anew (the
    /// emulator-only `*_controller_emu_rename`): the same devices and
    /// identities under new kernel names, as after a reconnect or a reboot.
    pub async fn rename_host_disks(&self) {
        use snap_csi::spdk::snap::{NvmeControllerList, VirtioBlkControllerList};
        let snap = self.client();
        let nvme = snap.call(&NvmeControllerList {}).await.unwrap();
        let virtio = snap.call(&VirtioBlkControllerList {}).await.unwrap();
        let renames = nvme
            .into_iter()
            .map(|c| {
                (
                    "nvme_controller_emu_rename",
                    serde_json::json!({"ctrl_id": c.ctrl_id}),
                )
            })
            .chain(virtio.into_iter().filter(|c| c.bdev.is_some()).map(|c| {
                (
                    "virtio_blk_controller_emu_rename",
                    serde_json::json!({"ctrl": c.ctrl_id}),
                )
            }));
        for (method, params) in renames {
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
            snap.call_raw(method, Some(&params), deadline)
                .await
                .unwrap_or_else(|e| panic!("{method} {params}: {e}"));
        }
    }

    /// SNAP crashed and started again: it comes back empty, as SPDK does,
    /// on the same socket, and the host has lost every disk it exposed (a
    /// restarted emulator detaches what the killed one left; stopping it
    /// does that at once). A loop device still in use (mounted) stays until
    /// its last user lets go, as the kernel keeps it, but the host's tree
    /// no longer shows it on any function.
    pub async fn restart_empty(&mut self) {
        let running = self
            .running
            .as_mut()
            .expect("the emulator runs until stopped");
        running.restart(self.config.clone()).await.unwrap();
    }

    /// SNAP dies and stays down until [`Emulator::start_again`]: its socket
    /// is gone, and the host loses every disk it exposed (a disk still
    /// mounted keeps its loop device until the mount goes, as the kernel
    /// keeps it, but no function shows it).
    pub fn stop_for_now(&mut self) {
        if let Some(running) = self.running.take() {
            running.stop().expect("the emulator shuts down cleanly");
        }
    }

    /// SNAP back after [`Emulator::stop_for_now`]: empty, as SPDK starts, on
    /// the same socket and sysfs root.
    pub async fn start_again(&mut self) {
        assert!(self.running.is_none(), "the emulator is running");
        // The stopped one's state-directory lock goes with its last
        // descriptor, which a child forked just then holds until it execs.
        let patience = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        let running = loop {
            match snap_emu::InProcess::start(self.config.clone()).await {
                Ok(running) => break running,
                Err(e) if tokio::time::Instant::now() < patience => {
                    eprintln!("starting the emulator again: {e:#}; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                Err(e) => panic!("the emulator does not start again: {e:#}"),
            }
        };
        self.running = Some(running);
    }

    /// Stops the emulator gracefully and checks that it shut down cleanly
    /// (dropping it stops it too, reporting a failure on stderr).
    pub async fn stop(mut self) {
        if let Some(running) = self.running.take() {
            running.stop().expect("the emulator shuts down cleanly");
        }
    }
}
