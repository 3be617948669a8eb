//! The JSON-RPC 2.0 envelopes as SPDK speaks them.
//!
//! Our own few serde structs rather than `jsonrpsee-types`: its `Response<T>`
//! needs `T: Clone`, which [`super::Method::Output`] does not promise, so a
//! reply would have to go through a `RawValue` copy and a second parse.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

use super::error::RpcError;

#[derive(Serialize)]
struct Request<'a> {
    jsonrpc: &'static str,
    method: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    params: Option<&'a RawValue>,
    id: u64,
}

/// Appends one request to `out`.
pub(super) fn encode_request(
    out: &mut Vec<u8>,
    id: u64,
    method: &str,
    params: Option<&RawValue>,
) -> serde_json::Result<()> {
    let request = Request {
        jsonrpc: "2.0",
        method,
        params,
        id,
    };
    serde_json::to_writer(out, &request)
}

/// The id of a reply: only what the connection needs to route it, read by
/// the framer in the same pass that finds where the reply ends.
#[derive(Deserialize)]
pub(super) struct Routing {
    #[serde(default)]
    id: serde_json::Value,
}

/// The id of the call `frame` answers, or why it answers none of ours.
pub(super) fn reply_id(routing: Routing, frame: &[u8]) -> Result<u64, String> {
    // serde would also read a struct from an array; a reply is an object.
    if frame.first() != Some(&b'{') {
        return Err(format!("not a JSON-RPC reply: {}", excerpt(frame)));
    }
    routing.id.as_u64().ok_or_else(|| {
        format!(
            "a reply with id {} answers no request: {}",
            routing.id,
            excerpt(frame)
        )
    })
}

fn excerpt(frame: &[u8]) -> String {
    const MAX: usize = 200;
    let text = String::from_utf8_lossy(&frame[..frame.len().min(MAX)]);
    if frame.len() > MAX {
        format!("{text}...")
    } else {
        text.into_owned()
    }
}

#[derive(Deserialize)]
#[serde(bound = "R: DeserializeOwned")]
struct Reply<R> {
    // `default` plus `present` tells an absent result from `"result": null`,
    // which is a valid result for some outputs.
    #[serde(default, deserialize_with = "present")]
    result: Option<R>,
    error: Option<ErrorObject>,
}

#[derive(Deserialize)]
struct ErrorObject {
    code: i32,
    message: String,
}

fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// The result of `method` in `frame`, or the server's error, kept exactly.
pub(super) fn decode_reply<R: DeserializeOwned>(method: &str, frame: &[u8]) -> Result<R, RpcError> {
    let invalid = |reason: String| RpcError::InvalidReply {
        method: method.to_string(),
        reason,
    };
    let reply: Reply<R> =
        serde_json::from_slice(frame).map_err(|e| invalid(format!("{e}: {}", excerpt(frame))))?;
    match reply {
        Reply {
            error: Some(error), ..
        } => Err(RpcError::Server {
            method: method.to_string(),
            code: error.code,
            message: error.message,
        }),
        Reply {
            result: Some(result),
            ..
        } => Ok(result),
        Reply { .. } => Err(invalid(format!(
            "neither result nor error: {}",
            excerpt(frame)
        ))),
    }
}
