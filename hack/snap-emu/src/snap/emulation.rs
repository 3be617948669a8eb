//! The seam between SNAP and each emulation it offers (NVMe, virtio-blk):
//! an emulation answers its own methods over its own controllers
//! ([`Emulation`]), sharing with the others only SNAP's model (the
//! functions) and what the host can see ([`SnapCx`]). The steps every
//! emulation's controllers take alike (suspend, resume; hot-plug is
//! `super::hotplug`) are written once, over [`Controllers`].

use std::fmt;

use serde_json::{Value, json};

use super::model::Functions;
use super::visible::Visible;
use crate::bdev::registry::Bdevs;
use crate::host::DiskRef;
use crate::registry::{Answer, Cx};
use crate::rpc::{ENODEV, EPERM, RpcError, RpcResult};

/// What an emulation's call sees besides its own state.
pub(super) struct SnapCx<'a, 'b> {
    /// SNAP's functions, shared by every emulation.
    pub functions: &'a mut Functions,
    /// The host side.
    pub visible: &'a Visible,
    /// The SPDK side: the bdevs and the other families.
    pub spdk: &'a mut Cx<'b>,
}

/// One emulation: its controllers and the methods that act on them.
pub(super) trait Emulation: Send + fmt::Debug {
    /// The methods it answers, as `rpc_get_methods` lists them.
    fn methods(&self) -> &'static [&'static str];

    /// Emulator-only methods it answers, which no SNAP has.
    fn unlisted(&self) -> &'static [&'static str] {
        &[]
    }

    /// Methods that only read (see `crate::registry::Family::reads`).
    fn reads(&self) -> &'static [&'static str] {
        &[]
    }

    /// Answers one of its methods.
    fn call(&mut self, method: &str, params: Option<Value>, cx: &mut SnapCx<'_, '_>) -> Answer;

    /// Whether one of its controllers holds `bdev` open for writing.
    fn writes(&self, bdev: &str) -> bool;

    /// `bdev` is going (hot remove): its controllers let go of it, and its
    /// disks leave the host first.
    fn release(&mut self, bdev: &str, visible: &Visible);

    /// The host disks that show `bdev`, or are on their way there.
    fn disks_of(&self, bdev: &str) -> Vec<DiskRef>;

    /// `fsdev` is going (SPDK_FSDEV_EVENT_REMOVE): what serves it leaves the
    /// host.
    fn fsdev_removed(&mut self, _fsdev: &str, _visible: &Visible) {}
}

/// What the steps common to every emulation need of its controllers, by
/// index.
pub(super) trait Controllers {
    /// The function the controller is on.
    fn vuid(&self, ci: usize) -> &str;

    fn suspended(&mut self, ci: usize) -> &mut bool;

    /// Brings the host's view of the controller in line with its state.
    fn reconcile(&mut self, ci: usize, cx: &mut SnapCx<'_, '_>) -> Result<(), RpcError>;

    /// Takes every disk of the controller off the host.
    fn hide(&mut self, ci: usize, visible: &Visible);
}

/// `*_controller_resume`: what was held back while suspended reaches the
/// host; if it cannot, the controller stays as it was.
pub(super) fn resume(c: &mut impl Controllers, ci: usize, cx: &mut SnapCx<'_, '_>) -> RpcResult {
    let was = std::mem::replace(c.suspended(ci), false);
    if let Err(e) = c.reconcile(ci, cx) {
        *c.suspended(ci) = was;
        return Err(e);
    }
    Ok(json!(true))
}

/// `*_controller_suspend`: a suspended controller stops serving I/O; the
/// host keeps its disks.
pub(super) fn suspend(c: &mut impl Controllers, ci: usize) -> RpcResult {
    *c.suspended(ci) = true;
    Ok(json!(true))
}

/// SNAP opens a bdev for writing, which an `exclusive_write` claim forbids:
/// its real name, -ENODEV or -EPERM.
pub(super) fn open_for_write(bdevs: &Bdevs, name: &str) -> Result<String, RpcError> {
    let b = bdevs.get(name).ok_or(RpcError::errno(ENODEV))?;
    if b.claim.is_some() {
        return Err(RpcError::errno(EPERM));
    }
    Ok(b.name.clone())
}
