//! Loop devices: util-linux `losetup` run under a deadline, state read back from
//! sysfs, and the two ioctls `losetup` lacks.
//!
//! `losetup` rather than LOOP_CTL_GET_FREE + LOOP_CONFIGURE of our own: it
//! already handles the race for a free device (it retries EBUSY from a device
//! another process grabbed first) and old kernels without LOOP_CONFIGURE, and it
//! keeps unsafe code out of everything but resize.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};

use super::loop_ioctl;

/// util-linux retries an attach that lost the race for a free device up to 64
/// times, 200 ms apart, so a crowded machine can legitimately need ~13 s.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);
const TIMEOUT: Duration = Duration::from_secs(10);
const SYS_BLOCK: &str = "/sys/block";

/// Held while this process's `losetup --find` looks for a free device.
static FINDING: Mutex<()> = Mutex::new(());
/// Locked (flock) while any emulator on this machine runs `losetup --find`:
/// the two emulators of a host with two DPUs race for the same free device
/// as two threads of one would.
const MACHINE_LOCK: &str = "/run/lock/snap-emu-losetup.lock";

/// A bound loop device as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct LoopState {
    /// `loopN`.
    pub name: String,
    pub major: u32,
    pub minor: u32,
    /// As the kernel prints it: the path at attach time, with " (deleted)"
    /// appended once the file is unlinked.
    pub backing_file: OsString,
    pub offset: u64,
    pub sizelimit: u64,
    pub autoclear: bool,
    pub read_only: bool,
    /// Capacity in 512-byte sectors.
    pub sectors: u64,
}

pub(super) fn dev_path(name: &str) -> PathBuf {
    Path::new("/dev").join(name)
}

/// `/dev/loopN` -> `loopN`, refusing anything else so that a bad argument can
/// never make us run `losetup -d` on some other device.
pub(super) fn name_of(dev: &Path) -> anyhow::Result<String> {
    let name = dev
        .strip_prefix("/dev")
        .ok()
        .and_then(|rest| rest.to_str())
        .filter(|name| is_loop_name(name))
        .ok_or_else(|| anyhow!("{} is not a loop device (/dev/loopN)", dev.display()))?;
    Ok(name.to_owned())
}

fn is_loop_name(name: &str) -> bool {
    name.strip_prefix("loop")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The state of `loopN`, or `None` when it is unbound or does not exist.
pub(super) fn state(name: &str) -> anyhow::Result<Option<LoopState>> {
    let base = Path::new(SYS_BLOCK).join(name);
    // A device can be torn down between two reads; any attribute gone means
    // unbound. Mid-teardown the kernel answers ENXIO or ENODEV rather than
    // ENOENT, which attaches running in parallel (ours, or another
    // process's) meet whenever a detach overlaps their scan.
    let read = |rel: &str| -> anyhow::Result<Option<Vec<u8>>> {
        let path = base.join(rel);
        match fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    || matches!(e.raw_os_error(), Some(ENXIO | ENODEV)) =>
            {
                Ok(None)
            }
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    };
    let Some(mut backing) = read("loop/backing_file")? else {
        return Ok(None);
    };
    if backing.last() == Some(&b'\n') {
        backing.pop();
    }
    if backing.is_empty() {
        return Ok(None);
    }
    let (Some(dev), Some(offset), Some(sizelimit), Some(autoclear), Some(ro), Some(size)) = (
        read("dev")?,
        read("loop/offset")?,
        read("loop/sizelimit")?,
        read("loop/autoclear")?,
        read("ro")?,
        read("size")?,
    ) else {
        return Ok(None);
    };
    let (major, minor) = parse_dev(&dev).with_context(|| format!("{}/dev", base.display()))?;
    let num = |bytes: &[u8], what: &str| -> anyhow::Result<u64> {
        parse_num(bytes).with_context(|| format!("{}/{what}", base.display()))
    };
    Ok(Some(LoopState {
        name: name.to_owned(),
        major,
        minor,
        backing_file: OsString::from_vec(backing),
        offset: num(&offset, "loop/offset")?,
        sizelimit: num(&sizelimit, "loop/sizelimit")?,
        autoclear: num(&autoclear, "loop/autoclear")? != 0,
        read_only: num(&ro, "ro")? != 0,
        sectors: num(&size, "size")?,
    }))
}

/// Every bound loop device on the machine.
pub(super) fn all_bound() -> anyhow::Result<Vec<LoopState>> {
    let entries =
        fs::read_dir(SYS_BLOCK).with_context(|| format!("listing loop devices in {SYS_BLOCK}"))?;
    let mut bound = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {SYS_BLOCK}"))?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if is_loop_name(&name)
            && let Some(state) = state(&name)?
        {
            bound.push(state);
        }
    }
    Ok(bound)
}

/// `(st_dev, st_ino)` of the file behind `loopN`.
pub(super) fn backing_identity(name: &str) -> io::Result<(u64, u64)> {
    let status = loop_ioctl::status(&File::open(dev_path(name))?)?;
    Ok((status.backing_dev(), status.backing_ino()))
}

/// `losetup --find --show`: attaches `file[offset..offset+sizelimit]` to a free
/// loop device and returns its name. With `direct_io` the loop device reads
/// and writes its file with O_DIRECT, asynchronously, so several requests
/// can be in flight at once (what the data path's files want).
///
/// On a timeout the device may or may not have been attached: the caller must
/// have recorded its intent so that it can look for it.
pub(super) fn attach(
    file: &Path,
    offset: u64,
    sizelimit: u64,
    read_only: bool,
    direct_io: bool,
) -> anyhow::Result<String> {
    let mut args: Vec<OsString> = vec![
        "--find".into(),
        "--show".into(),
        "--offset".into(),
        offset.to_string().into(),
        "--sizelimit".into(),
        sizelimit.to_string().into(),
    ];
    if read_only {
        args.push("--read-only".into());
    }
    if direct_io {
        args.push("--direct-io=on".into());
    }
    args.push(file.into());
    let mut attempt = 1;
    loop {
        let out = {
            // Two `losetup --find` at once pick the same free device, and the
            // loser sleeps 200 ms before it looks again: with dozens of
            // attaches in flight that is most of their time. One at a time,
            // they take a couple of milliseconds each; also across the
            // emulators of one machine (the lock goes with the file).
            let _turn = FINDING.lock().unwrap_or_else(PoisonError::into_inner);
            let _ = std::fs::create_dir_all(Path::new(MACHINE_LOCK).parent().expect("a directory"));
            let machine = std::fs::File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(MACHINE_LOCK)
                .with_context(|| format!("opening {MACHINE_LOCK}"))?;
            machine
                .lock()
                .with_context(|| format!("locking {MACHINE_LOCK}"))?;
            losetup(&args, ATTACH_TIMEOUT)?
        };
        if out.status.success() {
            let shown = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            let name = name_of(Path::new(&shown))
                .with_context(|| format!("losetup --show printed {shown:?}"))?;
            if !read_only {
                clear_read_only_flag(&name)?;
            }
            return Ok(name);
        }
        let err = stderr_of(&out);
        // losetup retries a lost race itself; this covers one that outlasts its retries.
        if attempt < 3 && is_transient(&err) {
            thread::sleep(Duration::from_millis(200 * attempt));
            attempt += 1;
            continue;
        }
        bail!("losetup {}: {err} ({})", display_args(&args), out.status);
    }
}

/// `blockdev --setrw`: a loop device keeps a read-only flag set on it (by a
/// host that made a read-only volume read-only) across detach and reuse, but
/// a newly plugged emulated disk starts writable.
fn clear_read_only_flag(name: &str) -> anyhow::Result<()> {
    let args: [OsString; 2] = ["--setrw".into(), dev_path(name).into()];
    let out = tool("blockdev", &args, TIMEOUT)?;
    if !out.status.success() {
        bail!(
            "blockdev --setrw {}: {}",
            dev_path(name).display(),
            stderr_of(&out)
        );
    }
    Ok(())
}

/// One `losetup --detach`. The caller decides what a failure means, because a
/// device that vanished meanwhile is success for it.
pub(super) fn detach(name: &str) -> anyhow::Result<Result<(), String>> {
    let out = losetup(&["--detach".into(), dev_path(name).into()], TIMEOUT)?;
    Ok(if out.status.success() {
        Ok(())
    } else {
        Err(format!("{} ({})", stderr_of(&out), out.status))
    })
}

/// `losetup --set-capacity`: re-reads the backing size, within the size limit.
pub(super) fn set_capacity(name: &str) -> anyhow::Result<()> {
    let args: [OsString; 2] = ["--set-capacity".into(), dev_path(name).into()];
    let out = losetup(&args, TIMEOUT)?;
    if !out.status.success() {
        bail!(
            "losetup {}: {} ({})",
            display_args(&args),
            stderr_of(&out),
            out.status
        );
    }
    Ok(())
}

/// Changes the size limit of an attached device in place (see `loop_ioctl`).
pub(super) fn set_sizelimit(name: &str, sizelimit: u64) -> anyhow::Result<()> {
    with_retry(name, "set size limit", |dev| {
        loop_ioctl::set_sizelimit(dev, sizelimit)
    })
}

/// Makes the device detach itself when its last opener closes it.
pub(super) fn set_autoclear(name: &str) -> anyhow::Result<()> {
    with_retry(name, "set autoclear", loop_ioctl::set_autoclear)
}

/// Runs a status ioctl, retrying the EAGAIN/EBUSY that older kernels return
/// while the page cache of the device is being dropped.
fn with_retry(name: &str, what: &str, op: impl Fn(&File) -> io::Result<()>) -> anyhow::Result<()> {
    let path = dev_path(name);
    let dev = File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let deadline = Instant::now() + TIMEOUT;
    let mut nap = Duration::from_millis(10);
    loop {
        match op(&dev) {
            Ok(()) => return Ok(()),
            Err(e)
                if matches!(e.raw_os_error(), Some(EAGAIN | EBUSY))
                    && Instant::now() + nap < deadline =>
            {
                thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(200));
            }
            Err(e) => {
                return Err(e).with_context(|| format!("{}: {what}", path.display()));
            }
        }
    }
}

/// `losetup --version`, to fail at start-up rather than on the first attach.
pub(super) fn version() -> anyhow::Result<String> {
    let out = losetup(&["--version".into()], TIMEOUT)?;
    if !out.status.success() {
        bail!("losetup --version: {} ({})", stderr_of(&out), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Marks an error after which we cannot know what `losetup` did.
#[derive(Debug)]
pub(super) struct TimedOut;

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("timed out")
    }
}

impl std::error::Error for TimedOut {}

const ENXIO: i32 = 6;
const ENODEV: i32 = 19;
const EAGAIN: i32 = 11;
const EBUSY: i32 = 16;

fn is_transient(stderr: &str) -> bool {
    stderr.contains("Device or resource busy")
        || stderr.contains("Resource temporarily unavailable")
}

fn stderr_of(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    if text.is_empty() {
        "no error message".to_owned()
    } else {
        text
    }
}

fn display_args(args: &[OsString]) -> String {
    args.iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `losetup args`, killing it if it outlives `timeout`. Errs only when it
/// could not be run or did not finish; a non-zero exit is for the caller.
fn losetup(args: &[OsString], timeout: Duration) -> anyhow::Result<Output> {
    tool("losetup", args, timeout)
}

/// Runs a util-linux tool with a bounded wait.
fn tool(program: &str, args: &[OsString], timeout: Duration) -> anyhow::Result<Output> {
    let mut child = Command::new(program)
        .args(args)
        // Messages are matched on (is_transient), so keep them untranslated.
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                anyhow!("{program} not found in PATH (it is part of util-linux)")
            } else {
                anyhow!(e).context(format!("running {program} {}", display_args(args)))
            }
        })?;
    // Drain both pipes while waiting, so a chatty child can never block on a
    // full pipe. The drains also tell us when the child is done: the tools we
    // run close their output only by exiting, so both pipes reaching end of
    // file is the moment to reap it. Waiting on that, rather than polling
    // `try_wait` with naps, keeps a 2 ms `losetup` at 2 ms.
    let (done_tx, done_rx) = mpsc::channel();
    let stdout = drain(child.stdout.take(), done_tx.clone());
    let stderr = drain(child.stderr.take(), done_tx);
    let deadline = Instant::now() + timeout;
    let mut open_pipes = 2;
    while open_pipes > 0 {
        match done_rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            // A drain thread that died also stops sending: treat it as closed.
            Ok(()) | Err(RecvTimeoutError::Disconnected) => open_pipes -= 1,
            Err(RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(anyhow!(TimedOut)).with_context(|| {
                    format!(
                        "{program} {} did not finish within {timeout:?}; killed it",
                        display_args(args)
                    )
                });
            }
        }
    }
    let status = child
        .wait()
        .with_context(|| format!("waiting for {program} {}", display_args(args)))?;
    Ok(Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

fn drain(
    pipe: Option<impl Read + Send + 'static>,
    done: mpsc::Sender<()>,
) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut buf);
        }
        let _ = done.send(());
        buf
    })
}

fn parse_num(bytes: &[u8]) -> anyhow::Result<u64> {
    let text = std::str::from_utf8(bytes)?.trim();
    text.parse()
        .with_context(|| format!("{text:?} is not a number"))
}

/// Parses sysfs `dev` ("major:minor\n").
pub(super) fn parse_dev(bytes: &[u8]) -> anyhow::Result<(u32, u32)> {
    let text = std::str::from_utf8(bytes)?.trim();
    let (major, minor) = text
        .split_once(':')
        .ok_or_else(|| anyhow!("{text:?} is not major:minor"))?;
    Ok((
        major
            .parse()
            .with_context(|| format!("major in {text:?}"))?,
        minor
            .parse()
            .with_context(|| format!("minor in {text:?}"))?,
    ))
}

/// Splits a `dev_t` the way glibc's `major()`/`minor()` do: major in bits 8..20
/// and 32..44, minor in bits 0..8 and 20..32. The kernel's `new_encode_dev`
/// (what LOOP_GET_STATUS64 reports) and glibc's `makedev` (what `stat` reports
/// through std) agree on this split, so comparing the halves compares devices.
pub(super) fn split_dev(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & 0xffff_f000);
    let minor = (dev & 0xff) | ((dev >> 12) & 0xffff_ff00);
    // The masks keep both halves within 32 bits, so the casts are exact.
    (major as u32, minor as u32)
}

/// Whether sysfs `backing_file` names `path`, including after it was unlinked.
pub(super) fn backing_is(backing_file: &OsStr, path: &Path) -> bool {
    let shown = backing_file.as_encoded_bytes();
    let want = path.as_os_str().as_encoded_bytes();
    shown == want
        || shown
            .strip_prefix(want)
            .is_some_and(|rest| rest == b" (deleted)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_t_split() {
        // glibc makedev(259, 1048577) and makedev(7, 3).
        let make = |major: u64, minor: u64| {
            ((major & 0xfff) << 8)
                | ((major & !0xfff) << 32)
                | (minor & 0xff)
                | ((minor & !0xff) << 12)
        };
        assert_eq!(split_dev(make(259, 1_048_577)), (259, 1_048_577));
        assert_eq!(split_dev(make(7, 3)), (7, 3));
        assert_eq!(split_dev(make(4095, 255)), (4095, 255));
        assert_eq!(split_dev(make(4096, 256)), (4096, 256));
    }
}
