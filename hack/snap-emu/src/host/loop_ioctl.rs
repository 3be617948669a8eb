//! The two loop operations util-linux cannot do for us: LOOP_GET_STATUS64 and
//! LOOP_SET_STATUS64.
//!
//! `losetup` refuses `--sizelimit` on an attached device, and detach plus
//! reattach would pull the disk from under a host that has it open, so growing a
//! disk that is a byte range of a bigger file (an lvol) needs LOOP_SET_STATUS64.
//! The same round trip sets autoclear on kernels whose LOOP_CLR_FD still answers
//! EBUSY for an open device, and LOOP_GET_STATUS64 gives the backing inode, which
//! is what tells our loop device apart from someone else's over a file of the
//! same name.
//!
//! Soundness: the only unsafe code is two `ioctl(2)` calls. Each passes a file
//! descriptor borrowed from a `File` that outlives the call, and a pointer to a
//! live, aligned `LoopInfo64` whose layout is the kernel's `struct loop_info64`
//! (UAPI, fixed since Linux 2.6; the size is checked at compile time). The kernel
//! reads or writes exactly `size_of::<LoopInfo64>()` bytes through it and keeps
//! no reference after returning. Every bit pattern is a valid `LoopInfo64`
//! (integers and byte arrays only), so whatever the kernel writes is sound to read.
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

// glibc declares the request as `unsigned long`, musl as `int`.
#[cfg(not(target_env = "musl"))]
type Request = std::ffi::c_ulong;
#[cfg(target_env = "musl")]
type Request = c_int;

// <linux/loop.h>: plain numbers, not _IOW-encoded.
const LOOP_SET_STATUS64: Request = 0x4C04;
const LOOP_GET_STATUS64: Request = 0x4C05;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_NAME_SIZE: usize = 64;
const LO_KEY_SIZE: usize = 32;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; LO_NAME_SIZE],
    lo_crypt_name: [u8; LO_NAME_SIZE],
    lo_encrypt_key: [u8; LO_KEY_SIZE],
    lo_init: [u64; 2],
}

const _: () = assert!(std::mem::size_of::<LoopInfo64>() == 232);

const ZERO: LoopInfo64 = LoopInfo64 {
    lo_device: 0,
    lo_inode: 0,
    lo_rdevice: 0,
    lo_offset: 0,
    lo_sizelimit: 0,
    lo_number: 0,
    lo_encrypt_type: 0,
    lo_encrypt_key_size: 0,
    lo_flags: 0,
    lo_file_name: [0; LO_NAME_SIZE],
    lo_crypt_name: [0; LO_NAME_SIZE],
    lo_encrypt_key: [0; LO_KEY_SIZE],
    lo_init: [0; 2],
};

unsafe extern "C" {
    fn ioctl(fd: c_int, request: Request, ...) -> c_int;
}

/// What the kernel reports for a bound loop device.
#[derive(Debug, Clone, Copy)]
pub(super) struct Status(LoopInfo64);

impl Status {
    /// `st_dev` of the backing file, in the kernel's `new_encode_dev` form.
    pub(super) fn backing_dev(&self) -> u64 {
        self.0.lo_device
    }

    pub(super) fn backing_ino(&self) -> u64 {
        self.0.lo_inode
    }
}

fn get(dev: &File) -> io::Result<Status> {
    let mut info = ZERO;
    // SAFETY: see the module comment; `info` is a live, exclusively borrowed
    // loop_info64 that the kernel fills in.
    let rc = unsafe { ioctl(dev.as_raw_fd(), LOOP_GET_STATUS64, &raw mut info) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Status(info))
}

fn set(dev: &File, status: &Status) -> io::Result<()> {
    // SAFETY: see the module comment; the kernel only reads the loop_info64.
    let rc = unsafe { ioctl(dev.as_raw_fd(), LOOP_SET_STATUS64, &raw const status.0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads the status of the loop device open as `dev`.
pub(super) fn status(dev: &File) -> io::Result<Status> {
    get(dev)
}

/// Changes the size limit and lets the kernel recompute the capacity (it does
/// on any lo_offset/lo_sizelimit change, and tells the block layer, which emits
/// a RESIZE uevent as a real namespace change would). Everything else is read
/// back first and written unchanged, because LOOP_SET_STATUS64 replaces the
/// whole status.
pub(super) fn set_sizelimit(dev: &File, sizelimit: u64) -> io::Result<()> {
    let mut status = get(dev)?;
    status.0.lo_sizelimit = sizelimit;
    set(dev, &status)
}

/// Asks the kernel to detach the device when its last opener closes it.
pub(super) fn set_autoclear(dev: &File) -> io::Result<()> {
    let mut status = get(dev)?;
    status.0.lo_flags |= LO_FLAGS_AUTOCLEAR;
    set(dev, &status)
}
