//! The `snap-emu` binary as a child process, for the tests that kill it.

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::Client;

pub fn spawn(socket: &Path, state: &Path) -> Child {
    spawn_with(socket, state, &[])
}

pub fn spawn_with(socket: &Path, state: &Path, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_snap-emu"))
        .args(args)
        .arg("--socket")
        .arg(socket)
        .arg("--state-dir")
        .arg(state)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn snap-emu")
}

/// Waits until the emulator answers on its socket.
pub async fn connect(socket: &Path, child: &mut Child) -> Client {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(s) = tokio::net::UnixStream::connect(socket).await {
            drop(s);
            return Client::connect(socket).await;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("snap-emu exited early: {status}");
        }
        assert!(Instant::now() < deadline, "snap-emu did not come up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn wait_exit(child: &mut Child) -> ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        assert!(Instant::now() < deadline, "snap-emu did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGTERM: a graceful shutdown, which must succeed.
pub fn terminate(mut child: Child) {
    let pid = i32::try_from(child.id()).unwrap();
    kill(Pid::from_raw(pid), Signal::SIGTERM).expect("SIGTERM");
    assert!(wait_exit(&mut child).success());
}
