//! How a host here mounts an emulated virtio-fs device.
//!
//! virtio-fs is FUSE carried over virtqueues: on a real host, `mount -t
//! virtiofs TAG DIR` makes a FUSE connection whose requests the kernel puts
//! on the device's queues, and SNAP's FUSE server answers them. The SNAP
//! emulator has no virtqueues, so a host here makes the same mount with the
//! kernel's own FUSE client (`/dev/fuse`) and hands the connection to the
//! emulated device, which serves it. Each device on the host is a UNIX
//! socket named by its tag in the emulator's directory of them:
//!
//! ```text
//! <devices dir>/<tag>   the device; connecting to it is how a host reaches it
//! ```
//!
//! [`mount`] connects to the tag's socket (none, or nobody listening: the
//! host does not know the tag, ENOENT), mounts FUSE at the target (type
//! `fuse.virtiofs`, the tag as its source, `allow_other` and
//! `default_permissions`, which the kernel's virtio-fs client always sets),
//! passes the `/dev/fuse` descriptor over the socket (SCM_RIGHTS) and waits
//! until the device serves it. The target is then the only mount of that
//! filesystem on the host, as on a real one, where kubelet counts every
//! other mount of a staging path's filesystem as a reference that keeps it
//! from unstaging.
//!
//! The device's side is [`Listener`]: bound at the tag's path, it accepts a
//! [`Host`], takes its [`Host::connection`] and says [`Host::serving`] once
//! a FUSE session serves it. A device that goes closes its listener, and a
//! connection nobody serves any more (its server gone, killed or not) is
//! aborted by the kernel: every access then fails with ENOTCONN, as a real
//! host's mount does once its device is unplugged.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::mount::{MntFlags, MsFlags};
use nix::sys::stat::Mode;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// What the device answers once a FUSE session serves the connection.
const SERVING: u8 = b'y';
/// What the host sends with its descriptor.
const CONNECTION: u8 = b'c';

/// Mounts the emulated virtio-fs device `tag` (its socket in `devices`) at
/// `target` with `flags`, as `mount -t virtiofs TAG TARGET` does on a real
/// host; `timeout` bounds the wait for the device. ENOENT: no such device
/// on the host (yet, or any more).
pub fn mount(
    devices: &Path,
    tag: &str,
    target: &Path,
    flags: MsFlags,
    timeout: Duration,
) -> Result<(), Errno> {
    let device = match connect(&devices.join(tag)) {
        Ok(device) => device,
        // A socket left by an emulator that died is no device either.
        Err(Errno::ENOENT | Errno::ECONNREFUSED) => return Err(Errno::ENOENT),
        Err(e) => return Err(e),
    };
    let timeout = Some(timeout.max(Duration::from_millis(1)));
    device.set_read_timeout(timeout).map_err(io_errno)?;
    device.set_write_timeout(timeout).map_err(io_errno)?;
    let fuse = mount_fuse(tag, target, flags)?;
    // Our descriptor goes either way: the device holds its own copy.
    let handed = hand_off(device, fuse);
    if handed.is_err() {
        // Served by nobody, the mount only fails: it must not stay.
        let _ = nix::mount::umount2(target, MntFlags::MNT_DETACH);
    }
    handed
}

/// Mounts FUSE at `target` as the kernel's virtio-fs client mounts a
/// device with tag `source`, and answers the connection's `/dev/fuse`
/// descriptor, which its server reads requests from.
pub fn mount_fuse(source: &str, target: &Path, flags: MsFlags) -> Result<OwnedFd, Errno> {
    let fuse = nix::fcntl::open("/dev/fuse", OFlag::O_RDWR | OFlag::O_CLOEXEC, Mode::empty())?;
    let data = format!(
        "fd={},rootmode=40000,user_id={},group_id={},default_permissions,allow_other,\
         subtype=virtiofs",
        fuse.as_raw_fd(),
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    );
    nix::mount::mount(
        Some(source),
        target,
        Some("fuse"),
        flags,
        Some(data.as_str()),
    )?;
    Ok(fuse)
}

fn hand_off(mut device: UnixStream, fuse: OwnedFd) -> Result<(), Errno> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut rights = SendAncillaryBuffer::new(&mut space);
    let fds = [fuse.as_fd()];
    rights.push(SendAncillaryMessage::ScmRights(&fds));
    let byte = [CONNECTION];
    rustix::net::sendmsg(
        &device,
        &[IoSlice::new(&byte)],
        &mut rights,
        SendFlags::NOSIGNAL,
    )
    .map_err(|e| Errno::from_raw(e.raw_os_error()))?;
    let mut answer = [0u8; 1];
    match device.read(&mut answer) {
        Ok(1) if answer[0] == SERVING => Ok(()),
        // Closed unanswered: the device went meanwhile.
        Ok(_) => Err(Errno::ENOENT),
        Err(e) => Err(io_errno(e)),
    }
}

/// An emulated device's socket, where hosts come to mount it.
#[derive(Debug)]
pub struct Listener {
    socket: UnixListener,
    path: PathBuf,
}

impl Listener {
    /// Listens at `path` (mode 0600: only root mounts); a file there
    /// already is an error.
    pub fn bind(path: &Path) -> std::io::Result<Listener> {
        let (dir, short) = short_path(path)?;
        let socket = UnixListener::bind(&short)?;
        drop(dir);
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        Ok(Listener {
            socket,
            path: path.to_owned(),
        })
    }

    /// The next host that comes; an error once [`Listener::close`]d.
    pub fn accept(&self) -> std::io::Result<Host> {
        let (stream, _) = self.socket.accept()?;
        Ok(Host(stream))
    }

    /// No host reaches the device from now on: the socket goes, and a
    /// thread waiting in [`Listener::accept`] returns an error.
    pub fn close(&self) {
        let _ = std::fs::remove_file(&self.path);
        // Wakes a thread blocked in accept(2), which then fails (EINVAL).
        let _ = rustix::net::shutdown(&self.socket, rustix::net::Shutdown::Both);
    }
}

/// A host that came to mount the device.
#[derive(Debug)]
pub struct Host(UnixStream);

impl Host {
    /// The `/dev/fuse` descriptor of the host's mount, sent within `timeout`.
    pub fn connection(&self, timeout: Duration) -> std::io::Result<OwnedFd> {
        self.0.set_read_timeout(Some(timeout))?;
        let mut byte = [0u8; 1];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut rights = RecvAncillaryBuffer::new(&mut space);
        rustix::net::recvmsg(
            &self.0,
            &mut [IoSliceMut::new(&mut byte)],
            &mut rights,
            RecvFlags::CMSG_CLOEXEC,
        )?;
        let received = rights.drain().find_map(|message| match message {
            RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
            _ => None,
        });
        received.ok_or_else(|| std::io::Error::other("the host sent no FUSE connection"))
    }

    /// Tells the host its mount is served.
    pub fn serving(mut self) -> std::io::Result<()> {
        self.0.write_all(&[SERVING])
    }
}

fn connect(path: &Path) -> Result<UnixStream, Errno> {
    let (dir, short) = short_path(path).map_err(io_errno)?;
    let connected = UnixStream::connect(&short).map_err(io_errno);
    drop(dir);
    connected
}

/// `path` named through its directory's descriptor, `/proc/self/fd/N/NAME`:
/// a socket's path must fit in 108 bytes, and a test's state directory
/// need not. Keep the descriptor until the path is used.
fn short_path(path: &Path) -> std::io::Result<(OwnedFd, PathBuf)> {
    let parent = path.parent().unwrap_or(Path::new("/"));
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other(format!("{} names no file", path.display())))?;
    let dir = nix::fcntl::open(
        parent,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let short = Path::new(&format!("/proc/self/fd/{}", dir.as_fd().as_raw_fd())).join(name);
    Ok((dir, short))
}

fn io_errno(e: std::io::Error) -> Errno {
    e.raw_os_error().map_or(Errno::EIO, Errno::from_raw)
}
