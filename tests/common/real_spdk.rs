//! A real SPDK `spdk_tgt` for the suites that hold our code and the emulator
//! against the real thing: a container of the image `SNAP_CSI_SPDK_IMAGE`
//! names (the test command builds it with `hack/images.sh` and sets it), or
//! the binary `SNAP_CSI_SPDK_TGT` names (`hack/spdk/build.sh` builds one).
//! Without either its tests fail, naming the command that sets one up,
//! unless `SNAP_CSI_SKIP_REAL_SPDK=1` says to skip: then each suite says it
//! skipped, in one line, and its tests return. A suite that ran nothing is
//! never green by accident.
//!
//! Included by path by three test crates: the root crate's, the sample
//! plugin's and the emulator's. The emulator must not link `snap-csi`, so
//! this file uses only std, `tempfile` and `serde_json`.

#![allow(dead_code)]

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Names the `spdk_tgt` to run (a path).
pub const BINARY_ENV: &str = "SNAP_CSI_SPDK_TGT";
/// Names the image to run `spdk_tgt` from with podman (preferred when both are set).
pub const IMAGE_ENV: &str = "SNAP_CSI_SPDK_IMAGE";
/// `1`: run without real SPDK, its suites skipped (said in one line each).
pub const SKIP_ENV: &str = "SNAP_CSI_SKIP_REAL_SPDK";
/// The label of every container started here, so that one a killed test left
/// behind is found and removed.
const LABEL: &str = "snap-csi.test=real-spdk";

/// How long a starting `spdk_tgt` may take to answer `spdk_get_version`.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a stopping one may take after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// One test's exclusive use of real SPDK on this machine. Every `spdk_tgt`
/// polls its core at 100%, so the real-SPDK tests of every test binary and
/// checkout take turns (a file lock), each with at most a few instances on
/// their own cores.
pub struct Suite {
    runner: Runner,
    started: AtomicUsize,
    _turn: File,
}

impl Suite {
    /// This test's turn, waiting for other tests' to end; `None` (after one
    /// line on stderr per test binary) when neither variable is set and
    /// [`SKIP_ENV`] says to skip. Panics when neither is set otherwise.
    pub fn acquire() -> Option<Suite> {
        let runner = if let Some(image) = std::env::var_os(IMAGE_ENV) {
            Runner::Image(image.into_string().expect("an image name is UTF-8"))
        } else if let Some(binary) = std::env::var_os(BINARY_ENV) {
            let binary = PathBuf::from(binary);
            assert!(
                binary.is_file(),
                "{BINARY_ENV}={} is not a file",
                binary.display()
            );
            Runner::Binary(binary)
        } else {
            assert!(
                std::env::var_os(SKIP_ENV).is_some_and(|v| v == "1"),
                "real SPDK is not set up: set {IMAGE_ENV} (./hack/test.sh builds the image \
                 with ./hack/images.sh and sets it) or {BINARY_ENV}=<spdk_tgt> \
                 (tgt=$(hack/spdk/build.sh | tail -n1)), or {SKIP_ENV}=1 to skip these suites"
            );
            static SAID: Once = Once::new();
            SAID.call_once(|| {
                // Straight to the handle: libtest captures eprintln!, and a
                // skipped suite must be visible in a green run.
                let _ = writeln!(
                    std::io::stderr(),
                    "real-SPDK suite SKIPPED ({SKIP_ENV}=1): neither {IMAGE_ENV} nor {BINARY_ENV} is set (hack/test.sh sets one)"
                );
            });
            return None;
        };
        let turn = File::create(std::env::temp_dir().join("snap-csi-real-spdk.lock")).unwrap();
        turn.lock().unwrap();
        if let Runner::Image(_) = runner {
            // Ours, left by a test process that was killed: none runs now,
            // as this is the one turn.
            let _ = Command::new("podman")
                .args(["rm", "--force", "--filter"])
                .arg(format!("label={LABEL}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        Some(Suite {
            runner,
            started: AtomicUsize::new(0),
            _turn: turn,
        })
    }

    /// A fresh `spdk_tgt` on a socket in its own temporary directory, on the
    /// next core, answering when this returns.
    pub fn spdk_tgt(&self) -> SpdkTgt {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let core = self.started.fetch_add(1, Ordering::SeqCst) % cores;
        let dir = tempfile::tempdir().unwrap();
        let mut spdk = SpdkTgt {
            runner: self.runner.clone(),
            core,
            socket: dir.path().join("spdk.sock"),
            child: None,
            container: None,
            dir,
        };
        spdk.start();
        spdk
    }
}

/// How `spdk_tgt` is run.
#[derive(Clone)]
enum Runner {
    Binary(PathBuf),
    /// With podman, on the host's network (NVMe-oF listeners on loopback), the
    /// temporary directory bound at its own path (sockets and backing files
    /// have the same names inside and out), DPDK's shared memory its own.
    Image(String),
}

impl Runner {
    /// The command that runs `spdk_tgt`, and the container's name if any.
    fn command(&self) -> (Command, Option<String>) {
        match self {
            Runner::Binary(binary) => (Command::new(binary), None),
            Runner::Image(image) => {
                static STARTED: AtomicUsize = AtomicUsize::new(0);
                let name = format!(
                    "snap-csi-test-spdk-{}-{}",
                    std::process::id(),
                    STARTED.fetch_add(1, Ordering::SeqCst)
                );
                let tmp = std::env::temp_dir();
                let mut command = Command::new("podman");
                command
                    .args(["run", "--rm", "--network", "host", "--shm-size", "1g"])
                    .args(["--label", LABEL, "--name", &name, "--volume"])
                    .arg(format!("{0}:{0}", tmp.display()))
                    .arg(image);
                (command, Some(name))
            }
        }
    }
}

/// A running `spdk_tgt`; stopped (SIGTERM, then SIGKILL) and cleaned up when
/// dropped.
pub struct SpdkTgt {
    runner: Runner,
    core: usize,
    pub socket: PathBuf,
    child: Option<Child>,
    /// The running container's name.
    container: Option<String>,
    /// The socket, the process's log, and files tests put there.
    pub dir: tempfile::TempDir,
}

impl SpdkTgt {
    /// Where tests may put files (backing files for AIO bdevs, ...).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Starts the process (again, on the same socket after [`SpdkTgt::kill`])
    /// and waits until it answers.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "spdk_tgt is running already");
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log())
            .unwrap();
        // --no-huge -s 1024: no hugepages needed; --no-pci: the machine's own
        // PCI devices stay untouched; -m: a core of its own among this test's
        // instances. Without SPDK's core locks (/var/tmp/spdk_cpu_lock_*): an
        // SPDK outside the tests may hold that core, and sharing one costs
        // only speed.
        let (mut command, container) = self.runner.command();
        let child = command
            .args([
                "--no-huge",
                "-s",
                "1024",
                "--no-pci",
                "--disable-cpumask-locks",
            ])
            .arg("-m")
            .arg(format!("{:#x}", 1u64 << self.core))
            .arg("-r")
            .arg(&self.socket)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {:?}: {e}", command.get_program()));
        self.child = Some(child);
        self.container = container;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(version) = call(&self.socket, "spdk_get_version", None) {
                let version = version["version"].as_str().unwrap_or_default().to_string();
                assert!(version.starts_with("SPDK v"), "{version}");
                return;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                panic!("spdk_tgt exited with {status}:\n{}", self.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "spdk_tgt did not answer within {START_TIMEOUT:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, as a crash would, and waits for the process to be gone.
    pub fn kill(&mut self) {
        if let Some(child) = self.child.take() {
            self.reap(child);
        }
    }

    /// Kills `spdk_tgt` (a container's, not the podman client in front of
    /// it, which would leave the container running) and waits for it.
    fn reap(&mut self, mut child: Child) {
        if let Some(name) = self.container.take() {
            let _ = Command::new("podman")
                .args(["kill", "--signal", "KILL", &name])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = child.kill();
        let _ = child.wait();
        remove_runtime_files(child.id());
    }

    /// Asks SPDK to stop (its own SIGTERM) and waits; kills it if it does not.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let asked = call(
            &self.socket,
            "spdk_kill_instance",
            Some(json!({"sig_name": "SIGTERM"})),
        );
        let deadline = Instant::now() + STOP_TIMEOUT;
        while asked.is_ok() && Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.reap(child);
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("spdk_tgt.log")
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }
}

impl Drop for SpdkTgt {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What SPDK and DPDK leave outside the temporary directory when a process
/// does not exit cleanly: the trace buffer in /dev/shm and DPDK's runtime
/// directory, both named after the pid (no --shm-id is given).
fn remove_runtime_files(pid: u32) {
    let _ = std::fs::remove_file(format!("/dev/shm/spdk_tgt_trace.pid{pid}"));
    let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/spdk_pid{pid}"));
}

/// One JSON-RPC call on a fresh connection, for starting and stopping;
/// `Err` for anything but a result.
pub fn call(socket: &Path, method: &str, params: Option<Value>) -> std::io::Result<Value> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut request = json!({"jsonrpc": "2.0", "method": method, "id": 1});
    if let Some(params) = params {
        request["params"] = params;
    }
    stream.write_all(request.to_string().as_bytes())?;
    let mut buf = vec![];
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Ok(reply) = serde_json::from_slice::<Value>(&buf) {
            return match reply.get("result") {
                Some(result) => Ok(result.clone()),
                None => Err(std::io::Error::other(reply["error"].to_string())),
            };
        }
    }
}
