//! `bdev_get_bdevs` (which, given a timeout, waits for its bdev to appear)
//! and `bdev_wait_for_examine`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};

use crate::registry::{Answer, BdevModule, BdevUser, Cx, Family, Reply, Shared};
use crate::rpc::{ENODEV, ETIMEDOUT, OnDecodeError, RpcError, RpcResult, decode_opt};

/// How often `bdev_get_bdevs` with a timeout looks again for its bdev.
const WAIT_STEP: Duration = Duration::from_millis(10);

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct GetBdevsParams {
    name: Option<String>,
    #[serde(default)]
    #[allow(dead_code)] // Read before decoding, to wait with.
    timeout: Option<u64>,
}

#[derive(Debug, Default)]
pub(crate) struct Info;

impl Info {
    /// `bdev_get_bdevs` with `name` and `timeout` waits for the bdev to
    /// appear; one that does not appear in time is `-ETIMEDOUT`, not `-ENODEV`.
    fn bdev_get_bdevs(&self, params: Option<Value>, cx: &Cx<'_>) -> Answer {
        let timeout = params
            .as_ref()
            .and_then(|p| p.get("timeout"))
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let now = Instant::now();
        let deadline = now
            .checked_add(Duration::from_millis(timeout))
            .unwrap_or(now);
        match get_bdevs(params.clone(), cx) {
            Err(e) if e.code == -ENODEV && timeout > 0 => {
                let shared = cx.shared().upgrade().ok_or(RpcError::errno(ETIMEDOUT))?;
                Ok(Reply::Later(Box::pin(wait(shared, params, deadline))))
            }
            r => r.map(Into::into),
        }
    }
}

/// Looks again for the bdev every [`WAIT_STEP`] until `deadline`.
async fn wait(shared: Arc<Shared>, params: Option<Value>, deadline: Instant) -> RpcResult {
    loop {
        if Instant::now() >= deadline {
            return Err(RpcError::errno(ETIMEDOUT));
        }
        tokio::time::sleep(WAIT_STEP).await;
        let mut state = shared.state.lock().await;
        let (_, cx) = state
            .family::<Info>()
            .expect("bdev_get_bdevs is answered by Info");
        match get_bdevs(params.clone(), &cx) {
            Err(e) if e.code == -ENODEV => {}
            r => return r,
        }
    }
}

fn get_bdevs(params: Option<Value>, cx: &Cx<'_>) -> RpcResult {
    let p: GetBdevsParams = decode_opt(params, OnDecodeError::DecodeFailed)?;
    let json = |b| cx.bdevs.json(b, cx.driver_specific(b));
    match p.name {
        Some(name) => {
            let bdev = cx.bdevs.get(&name).ok_or(RpcError::errno(ENODEV))?;
            Ok(json!([json(bdev)]))
        }
        None => Ok(Value::Array(cx.bdevs.iter().map(json).collect())),
    }
}

impl Family for Info {
    fn methods(&self) -> Vec<&'static str> {
        vec!["bdev_get_bdevs", "bdev_wait_for_examine"]
    }

    /// Cheap, and answered on the RPC task before the families did.
    fn reads(&self) -> Vec<&'static str> {
        vec!["bdev_get_bdevs", "bdev_wait_for_examine"]
    }

    fn call(&mut self, method: &str, params: Option<Value>, cx: &mut Cx<'_>) -> Answer {
        match method {
            "bdev_get_bdevs" => self.bdev_get_bdevs(params, cx),
            // The emulator examines as a call ends: nothing is left to wait for.
            "bdev_wait_for_examine" => {
                if params.is_some() {
                    return Err(RpcError::invalid_params_msg(format!(
                        "{method} requires no parameters"
                    )));
                }
                Ok(json!(true).into())
            }
            _ => Err(RpcError::method_not_found()),
        }
    }
}

impl BdevModule for Info {}
impl BdevUser for Info {}
