//! JSON-RPC errors and parameter decoding with SPDK's conventions.
//!
//! SPDK answers a failed `spdk_json_decode_object` with one of two errors,
//! chosen per method (`-32603 "spdk_json_decode_object failed"` for most bdev
//! methods, `-32602 "Invalid parameters"` for the `nvmf_*` family), and a
//! failed operation with a negative errno and `strerror` text. Its decoders
//! reject unknown keys and a params value that is not an object, so every
//! params struct here is `deny_unknown_fields` and [`decode`] refuses arrays
//! (serde would otherwise happily map a positional array onto a struct).

use serde::de::DeserializeOwned;
use serde_json::Value;

pub(crate) const EPERM: i32 = 1;
pub(crate) const ENOENT: i32 = 2;
pub(crate) const EIO: i32 = 5;
pub(crate) const ENXIO: i32 = 6;
pub(crate) const ENOMEM: i32 = 12;
pub(crate) const EBUSY: i32 = 16;
pub(crate) const EEXIST: i32 = 17;
pub(crate) const ENODEV: i32 = 19;
pub(crate) const EINVAL: i32 = 22;
pub(crate) const ENOSPC: i32 = 28;
pub(crate) const ETIMEDOUT: i32 = 110;
pub(crate) const EALREADY: i32 = 114;

/// glibc's `strerror` text, which SPDK copies into its error messages.
pub(crate) fn strerror(errno: i32) -> &'static str {
    match errno {
        EPERM => "Operation not permitted",
        ENOENT => "No such file or directory",
        EIO => "Input/output error",
        ENXIO => "No such device or address",
        ENOMEM => "Cannot allocate memory",
        EBUSY => "Device or resource busy",
        EEXIST => "File exists",
        ENODEV => "No such device",
        EINVAL => "Invalid argument",
        ENOSPC => "No space left on device",
        ETIMEDOUT => "Connection timed out",
        EALREADY => "Operation already in progress",
        _ => "Unknown error",
    }
}

/// A JSON-RPC error object as SPDK writes it: `{"code":N,"message":"..."}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    pub code: i32,
    pub message: String,
}

impl RpcError {
    pub(crate) fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// `spdk_jsonrpc_send_error_response(request, -errno, spdk_strerror(errno))`.
    pub(crate) fn errno(errno: i32) -> Self {
        Self::new(-errno, strerror(errno))
    }

    pub(crate) fn decode_failed() -> Self {
        Self::new(-32603, "spdk_json_decode_object failed")
    }

    pub(crate) fn invalid_params() -> Self {
        Self::new(-32602, "Invalid parameters")
    }

    pub(crate) fn invalid_params_msg(message: impl Into<String>) -> Self {
        Self::new(-32602, message)
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(-32603, message)
    }

    pub(crate) fn method_not_found() -> Self {
        Self::new(-32601, "Method not found")
    }

    pub(crate) fn invalid_request() -> Self {
        Self::new(-32600, "Invalid request")
    }
}

pub(crate) type RpcResult = Result<Value, RpcError>;

/// A result already serialised as SPDK would (see `framing::to_json`).
pub(crate) type Rendered = Result<String, RpcError>;

/// Which error a method sends when its parameters do not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnDecodeError {
    /// `-32603 "spdk_json_decode_object failed"` (bdev, lvol, bdev_nvme, SNAP).
    DecodeFailed,
    /// `-32602 "Invalid parameters"` (nvmf, rpc_get_methods).
    InvalidParams,
}

impl OnDecodeError {
    fn error(self) -> RpcError {
        match self {
            Self::DecodeFailed => RpcError::decode_failed(),
            Self::InvalidParams => RpcError::invalid_params(),
        }
    }
}

/// Decodes required params; absent params fail like `spdk_json_decode_object(NULL, ...)`.
pub(crate) fn decode<T: DeserializeOwned>(
    params: Option<Value>,
    on_err: OnDecodeError,
) -> Result<T, RpcError> {
    match params {
        Some(v @ Value::Object(_)) => serde_json::from_value(v).map_err(|_| on_err.error()),
        _ => Err(on_err.error()),
    }
}

/// Decodes optional params: SPDK skips decoding when params are absent.
pub(crate) fn decode_opt<T: DeserializeOwned + Default>(
    params: Option<Value>,
    on_err: OnDecodeError,
) -> Result<T, RpcError> {
    match params {
        None => Ok(T::default()),
        p => decode(p, on_err),
    }
}

/// For methods that take no parameters at all.
pub(crate) fn no_params(params: &Option<Value>, method: &str) -> Result<(), RpcError> {
    match params {
        None => Ok(()),
        Some(_) => Err(RpcError::invalid_params_msg(format!(
            "{method} method requires no parameters"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct P {
        name: String,
        #[serde(default)]
        size: Option<u32>,
    }

    #[test]
    fn positional_array_is_rejected() {
        let e = decode::<P>(Some(json!(["x"])), OnDecodeError::DecodeFailed).unwrap_err();
        assert_eq!(e, RpcError::decode_failed());
    }

    #[test]
    fn unknown_key_wrong_type_and_missing_are_rejected() {
        for p in [
            json!({"name":"a","x":1}),
            json!({"name":1}),
            json!({"size":1}),
        ] {
            assert!(decode::<P>(Some(p), OnDecodeError::InvalidParams).is_err());
        }
        assert!(decode::<P>(None, OnDecodeError::InvalidParams).is_err());
        let ok: P = decode(
            Some(json!({"name":"a","size":3})),
            OnDecodeError::DecodeFailed,
        )
        .unwrap();
        assert_eq!((ok.name.as_str(), ok.size), ("a", Some(3)));
    }

    #[test]
    fn errno_messages_match_glibc() {
        assert_eq!(
            RpcError::errno(ENODEV),
            RpcError::new(-19, "No such device")
        );
        assert_eq!(RpcError::errno(EEXIST).message, "File exists");
    }
}
