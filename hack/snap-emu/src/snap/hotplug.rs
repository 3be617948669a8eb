//! Hot-plug: PFs SNAP creates at run time (`*_function_create`), which the
//! host sees only once a controller on them is hot-plugged, and which leave
//! it when hot-unplugged. Every emulation's controllers plug the same way.

use serde_json::{Value, json};

use super::emulation::{Controllers, SnapCx};
use super::model::{Functions, host_kind};
use super::visible::Visible;
use crate::rpc::{
    EBUSY, EEXIST, EINVAL, ENODEV, OnDecodeError, RpcError, RpcResult, decode, decode_opt,
};
use crate::snap_api::{self as api, Emulation};

/// `*_function_create`: a hot-plug PF, not on the host yet.
pub(super) fn function_create(
    params: Option<Value>,
    e: Emulation,
    functions: &mut Functions,
) -> RpcResult {
    let _: api::FunctionCreateParams = decode_opt(params, OnDecodeError::DecodeFailed)?;
    let f = functions.create_hotplug(e)?;
    Ok(api::function_created_json(f.view()))
}

/// `*_function_destroy`: a hot-plug PF without a controller goes, from the
/// host too.
pub(super) fn function_destroy(
    params: Option<Value>,
    e: Emulation,
    cx: &mut SnapCx<'_, '_>,
) -> RpcResult {
    let p: api::FunctionDestroyParams = decode(params, OnDecodeError::DecodeFailed)?;
    let f = cx
        .functions
        .get(&p.vuid)
        .filter(|f| f.emulation == e)
        .ok_or(RpcError::errno(ENODEV))?;
    if !f.hotplugged {
        return Err(RpcError::errno(EINVAL));
    }
    if f.ctrl_id.is_some() {
        return Err(RpcError::errno(EBUSY));
    }
    if f.bdf.is_some() {
        unplug_function(cx.functions, cx.visible, &p.vuid)?;
    }
    cx.functions.remove(&p.vuid);
    Ok(json!(true))
}

/// `*_controller_hotplug`: the controller's function appears on the host,
/// and with it the disks of a controller that is not suspended.
pub(super) fn hotplug(c: &mut impl Controllers, ci: usize, cx: &mut SnapCx<'_, '_>) -> RpcResult {
    let vuid = c.vuid(ci).to_owned();
    plug_function(cx.functions, cx.visible, &vuid)?;
    c.reconcile(ci, cx)?;
    Ok(json!(true))
}

/// `*_controller_hotunplug`: the disks leave the host, then the function.
/// Checked before anything goes, so a refused unplug keeps the disks.
pub(super) fn hotunplug(c: &mut impl Controllers, ci: usize, cx: &mut SnapCx<'_, '_>) -> RpcResult {
    let vuid = c.vuid(ci).to_owned();
    let f = cx.functions.get(&vuid).ok_or(RpcError::errno(ENODEV))?;
    if !f.hotplugged {
        return Err(RpcError::errno(EINVAL));
    }
    if f.bdf.is_none() {
        return Err(RpcError::errno(ENODEV));
    }
    c.hide(ci, cx.visible);
    unplug_function(cx.functions, cx.visible, &vuid)?;
    Ok(json!(true))
}

/// Makes a hot-plugged PF visible to the host (it gets its address).
pub(super) fn plug_function(
    functions: &mut Functions,
    visible: &Visible,
    vuid: &str,
) -> Result<(), RpcError> {
    let f = functions.get(vuid).ok_or(RpcError::errno(ENODEV))?;
    if !f.hotplugged {
        return Err(RpcError::errno(EINVAL));
    }
    if f.bdf.is_some() {
        return Err(RpcError::errno(EEXIST));
    }
    let kind = host_kind(f.emulation);
    let bdf = functions.enumerate(vuid).ok_or(RpcError::errno(ENODEV))?;
    if let Err(e) = visible.add_function(&bdf, kind) {
        if let Some(f) = functions.get_mut(vuid) {
            f.bdf = None;
        }
        return Err(e);
    }
    Ok(())
}

/// Takes a hot-plugged PF away from the host (its disks must be gone).
pub(super) fn unplug_function(
    functions: &mut Functions,
    visible: &Visible,
    vuid: &str,
) -> Result<(), RpcError> {
    let f = functions.get_mut(vuid).ok_or(RpcError::errno(ENODEV))?;
    if !f.hotplugged {
        return Err(RpcError::errno(EINVAL));
    }
    let Some(bdf) = f.bdf.take() else {
        return Err(RpcError::errno(ENODEV));
    };
    visible.remove_function(&bdf);
    Ok(())
}
