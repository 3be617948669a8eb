//! External tools and blocking syscalls under a deadline.
//!
//! Every tool runs with `kill_on_drop`, so a deadline that passes (or a
//! caller that gives up) kills it instead of leaving it running. A blocking
//! syscall cannot be interrupted: [`run_blocking`] stops waiting at the
//! deadline, but the syscall may still complete afterwards, which is why every
//! operation built on it is idempotent (a retry finds the finished work).

use std::ffi::OsStr;
use std::io;
use std::process::{Output, Stdio};

use tokio::time::Instant;

use super::error::NodeError;

/// gRPC carries a status message in HTTP/2 headers, whose total size peers
/// cap (16 KiB by default in tonic); a chatty tool must not push the status
/// past that, so its output is cut in the middle, keeping both ends.
const MAX_OUTPUT_IN_MESSAGE: usize = 3000;

/// Runs `program` with `args` until `deadline`; a non-zero exit is an error
/// carrying the tool's stderr (or stdout when stderr is empty).
pub async fn run(program: &str, args: &[&OsStr], deadline: Instant) -> Result<Output, NodeError> {
    let output = run_unchecked(program, args, deadline).await?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(NodeError::failed(
            command_line(program, args),
            exit_message(&output),
        ))
    }
}

/// Like [`run`], but any exit status is returned to the caller, for tools
/// whose exit code carries meaning (`blkid` 2 = nothing found, `e2fsck`'s
/// bit mask). Only failing to start, a signal and the deadline are errors.
pub async fn run_unchecked(
    program: &str,
    args: &[&OsStr],
    deadline: Instant,
) -> Result<Output, NodeError> {
    let started = std::time::Instant::now();
    let result = spawn_and_wait(program, args, deadline).await;
    let outcome = match &result {
        Ok(output) if output.status.success() => "ok",
        Ok(_) => "nonzero",
        Err(NodeError::Timeout { .. }) => "timeout",
        Err(_) => "error",
    };
    // Host time, not the node's own: see `metrics` (target `host`).
    crate::metrics::observe_outbound("host", program, outcome, started.elapsed());
    result
}

async fn spawn_and_wait(
    program: &str,
    args: &[&OsStr],
    deadline: Instant,
) -> Result<Output, NodeError> {
    let what = command_line(program, args);
    if Instant::now() >= deadline {
        return Err(NodeError::Timeout { what });
    }
    let child = tokio::process::Command::new(program)
        .args(args)
        // Tools must never wait for an answer on stdin, and their messages
        // must be the untranslated ones we document and match.
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("LC_ALL", "C")
        .kill_on_drop(true)
        .spawn()
        .map_err(|err| match err.kind() {
            io::ErrorKind::NotFound => NodeError::failed(
                what.clone(),
                format!("{program} is not installed (not found in PATH)"),
            ),
            _ => NodeError::failed(what.clone(), format!("cannot start {program}: {err}")),
        })?;
    tracing::debug!(command = %what, "running");
    // Dropping the wait future at the deadline drops the child, which kills it.
    let output = match tokio::time::timeout_at(deadline, child.wait_with_output()).await {
        Err(_) => return Err(NodeError::Timeout { what }),
        Ok(Err(err)) => return Err(NodeError::failed(what, err.to_string())),
        Ok(Ok(output)) => output,
    };
    match output.status.code() {
        None => Err(NodeError::failed(what, exit_message(&output))),
        // What a tool that never started looks like where spawn cannot say
        // so: glibc's posix_spawn under qemu-user (its vfork is a fork, so
        // the exec's error never reaches the parent) exits the child 127,
        // the shell's code for a command not found. A failure to start, as
        // NotFound above, for run_unchecked's callers too.
        Some(127) if output.stdout.is_empty() && output.stderr.is_empty() => {
            Err(NodeError::failed(
                what,
                format!("{program} is not installed or could not start (exit 127, no output)"),
            ))
        }
        Some(_) => Ok(output),
    }
}

/// Runs blocking work (syscalls that may hang on a sick device) on tokio's
/// blocking pool and stops waiting for it at `deadline`. The work itself
/// cannot be cancelled and may still finish later. `operation` names it in
/// the host metrics (the work's own time, not the trip to the pool).
pub async fn run_blocking<T, F>(
    operation: &'static str,
    what: &str,
    deadline: Instant,
    work: F,
) -> Result<T, NodeError>
where
    F: FnOnce() -> Result<T, NodeError> + Send + 'static,
    T: Send + 'static,
{
    if Instant::now() >= deadline {
        return Err(NodeError::Timeout { what: what.into() });
    }
    let timed = move || {
        let started = std::time::Instant::now();
        (work(), started.elapsed())
    };
    match tokio::time::timeout_at(deadline, tokio::task::spawn_blocking(timed)).await {
        Err(_) => Err(NodeError::Timeout { what: what.into() }),
        Ok(Err(join)) => Err(NodeError::failed(what, format!("the worker died: {join}"))),
        Ok(Ok((result, took))) => {
            // Recorded here, in the served call's task, not on the pool's thread.
            crate::metrics::observe_host(operation, &result, took);
            result
        }
    }
}

/// The command as a human would type it, for messages.
fn command_line(program: &str, args: &[&OsStr]) -> String {
    let mut line = program.to_owned();
    for arg in args {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}

/// "exit status N: <output>" for a finished tool.
fn exit_message(output: &Output) -> String {
    let status = match (output.status.code(), signal_of(output)) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => output.status.to_string(),
    };
    let text = tool_output(output);
    if text.is_empty() {
        format!("{status} (no output)")
    } else {
        format!("{status}: {text}")
    }
}

fn signal_of(output: &Output) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    output.status.signal()
}

/// What the tool said: stderr, or stdout when stderr is empty (e2fsck reports
/// on stdout), trimmed and bounded for a gRPC status.
pub(crate) fn tool_output(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let text = if stderr.trim().is_empty() {
        String::from_utf8_lossy(&output.stdout)
    } else {
        stderr
    };
    bounded(text.trim())
}

fn bounded(text: &str) -> String {
    if text.len() <= MAX_OUTPUT_IN_MESSAGE {
        return text.to_owned();
    }
    let keep = MAX_OUTPUT_IN_MESSAGE / 2;
    let head_end = floor_char_boundary(text, keep);
    let tail_start = ceil_char_boundary(text, text.len() - keep);
    format!(
        "{} [... {} bytes omitted ...] {}",
        &text[..head_end],
        tail_start - head_end,
        &text[tail_start..]
    )
}

fn floor_char_boundary(text: &str, mut index: usize) -> usize {
    while !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

fn ceil_char_boundary(text: &str, mut index: usize) -> usize {
    while !text.is_char_boundary(index) {
        index += 1;
    }
    index
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn soon(seconds: u64) -> Instant {
        Instant::now() + Duration::from_secs(seconds)
    }

    #[tokio::test]
    async fn run_returns_output_of_a_successful_tool() {
        let out = run("sh", &[OsStr::new("-c"), OsStr::new("echo hi")], soon(10))
            .await
            .unwrap();
        assert_eq!(out.stdout, b"hi\n");
    }

    #[tokio::test]
    async fn run_reports_exit_status_and_stderr() {
        let err = run(
            "sh",
            &[
                OsStr::new("-c"),
                OsStr::new("echo out; echo boom >&2; exit 3"),
            ],
            soon(10),
        )
        .await
        .unwrap_err();
        let NodeError::Failed { what, message } = err else {
            panic!("{err:?}");
        };
        assert_eq!(what, "sh -c echo out; echo boom >&2; exit 3");
        assert_eq!(message, "exit status 3: boom");
    }

    #[tokio::test]
    async fn run_falls_back_to_stdout_when_stderr_is_empty() {
        let err = run(
            "sh",
            &[OsStr::new("-c"), OsStr::new("echo said; exit 1")],
            soon(10),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().ends_with("exit status 1: said"), "{err}");
    }

    #[tokio::test]
    async fn run_unchecked_returns_non_zero_exits() {
        let out = run_unchecked("sh", &[OsStr::new("-c"), OsStr::new("exit 2")], soon(10))
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
    }

    #[tokio::test]
    async fn a_tool_that_could_not_start_says_so() {
        let err = run("sh", &[OsStr::new("-c"), OsStr::new("exit 127")], soon(10))
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("sh is not installed or could not start"),
            "{err}"
        );
        // A 127 with something said is the tool's own failure, shown as it is.
        let err = run(
            "sh",
            &[
                OsStr::new("-c"),
                OsStr::new("echo no such thing >&2; exit 127"),
            ],
            soon(10),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("no such thing"), "{err}");
        // And for the callers that read exit codes themselves.
        let err = run_unchecked("sh", &[OsStr::new("-c"), OsStr::new("exit 127")], soon(10))
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("sh is not installed or could not start"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_missing_tool_says_so() {
        let err = run("snap-csi-no-such-tool", &[], soon(10))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("not installed"), "{err}");
    }

    #[tokio::test]
    async fn the_deadline_kills_the_tool() {
        let marker = tempfile::NamedTempFile::new().unwrap();
        let script = format!("sleep 2; echo late > {}", marker.path().display());
        let started = std::time::Instant::now();
        let err = run(
            "sh",
            &[OsStr::new("-c"), OsStr::new(&script)],
            Instant::now() + Duration::from_millis(200),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, NodeError::Timeout { .. }), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
        // Killed, not merely abandoned: it never gets to write.
        std::thread::sleep(Duration::from_millis(2500));
        assert!(std::fs::read(marker.path()).unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_passed_deadline_runs_nothing() {
        let err = run("true", &[], Instant::now()).await.unwrap_err();
        assert!(matches!(err, NodeError::Timeout { .. }), "{err:?}");
        let err = run_blocking("test", "nothing", Instant::now(), || Ok(()))
            .await
            .unwrap_err();
        assert!(matches!(err, NodeError::Timeout { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn run_blocking_stops_waiting_at_the_deadline() {
        let err = run_blocking(
            "test",
            "a slow call",
            Instant::now() + Duration::from_millis(100),
            || {
                std::thread::sleep(Duration::from_millis(500));
                Ok(())
            },
        )
        .await
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "a slow call did not finish before the deadline"
        );
        assert_eq!(
            run_blocking("test", "a quick call", soon(10), || Ok(7)).await,
            Ok(7)
        );
    }

    #[test]
    fn long_output_is_cut_in_the_middle_on_char_boundaries() {
        let text = format!(
            "{}{}{}",
            "a".repeat(2000),
            "é".repeat(2000),
            "z".repeat(2000)
        );
        let cut = bounded(&text);
        assert!(cut.len() < MAX_OUTPUT_IN_MESSAGE + 100);
        assert!(cut.starts_with("aaaa") && cut.ends_with("zzzz"));
        assert!(cut.contains("bytes omitted"));
        assert_eq!(bounded("short"), "short");
    }
}

/// Loop devices and scratch directories for the node module's tests, torn
/// down (mounts first, then loop devices) even when a test panics. It lives
/// here because every module's tests use it and it is built on commands.
#[cfg(test)]
pub(crate) mod testing {
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::time::Duration;

    use tokio::time::Instant;

    pub(crate) fn deadline() -> Instant {
        Instant::now() + Duration::from_secs(120)
    }

    #[derive(Debug)]
    pub(crate) struct Scratch {
        dir: tempfile::TempDir,
        loops: Vec<PathBuf>,
    }

    impl Scratch {
        pub(crate) fn new() -> Scratch {
            let dir = tempfile::Builder::new()
                .prefix("snap-csi-node-")
                .tempdir()
                .expect("a scratch directory");
            Scratch {
                dir,
                loops: Vec::new(),
            }
        }

        pub(crate) fn path(&self, name: &str) -> PathBuf {
            self.dir.path().join(name)
        }

        pub(crate) fn root(&self) -> &Path {
            self.dir.path()
        }

        /// A loop device over a new sparse file `name` of `size` bytes.
        pub(crate) fn loop_device(&mut self, name: &str, size: u64) -> PathBuf {
            let backing = self.path(name);
            std::fs::File::create(&backing)
                .and_then(|f| f.set_len(size))
                .expect("a backing file");
            let out = Command::new("losetup")
                .args(["--find", "--show"])
                .arg(&backing)
                .output()
                .expect("losetup runs");
            assert!(
                out.status.success(),
                "losetup: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let device = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            self.loops.push(device.clone());
            device
        }

        /// Grows the file behind `device` and tells the loop driver.
        pub(crate) fn grow(&self, device: &Path, name: &str, size: u64) {
            std::fs::OpenOptions::new()
                .write(true)
                .open(self.path(name))
                .and_then(|f| f.set_len(size))
                .expect("the backing file grows");
            sh("losetup", &["-c".as_ref(), device.as_os_str()]);
        }

        /// Mount points under the scratch directory, deepest (last mounted) first.
        pub(crate) fn mounts(&self) -> Vec<PathBuf> {
            let mut mounts: Vec<PathBuf> = super::super::mountinfo::read()
                .expect("the mount table")
                .into_iter()
                .map(|m| m.mount_point)
                .filter(|p| p.starts_with(self.dir.path()))
                .collect();
            mounts.reverse();
            mounts
        }
    }

    pub(crate) fn sh(program: &str, args: &[&std::ffi::OsStr]) -> String {
        let out = Command::new(program).args(args).output().expect("runs");
        assert!(
            out.status.success(),
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            for mount in self.mounts() {
                let ok = Command::new("umount")
                    .arg(&mount)
                    .status()
                    .is_ok_and(|s| s.success());
                if !ok {
                    let _ = Command::new("umount").arg("-l").arg(&mount).status();
                }
            }
            for device in self.loops.drain(..) {
                // The kernel keeps BLKROSET's flag for the next user of the
                // loop device, who would then find it read-only.
                let _ = Command::new("blockdev")
                    .arg("--setrw")
                    .arg(&device)
                    .status();
                let _ = Command::new("losetup").arg("-d").arg(&device).status();
            }
        }
    }
}
