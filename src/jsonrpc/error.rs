//! Errors of a JSON-RPC call to SPDK/SNAP, typed so that callers can make
//! idempotency decisions without parsing strings.

use std::path::PathBuf;
use std::time::Duration;

/// Error codes SPDK and SNAP answer with. Method errors are negative errno
/// values (a few SPDK methods answer a positive one); the rest are JSON-RPC's.
pub mod code {
    /// `-EPERM`: SPDK's generic failure (e.g. a method called in the wrong state).
    pub const EPERM: i32 = -1;
    /// `-ENOENT`: a file named in the params does not exist.
    pub const ENOENT: i32 = -2;
    /// `-EIO`: e.g. an NVMe-oF target reachable but without the subsystem.
    pub const EIO: i32 = -5;
    /// `-EBUSY`: the object is in use.
    pub const EBUSY: i32 = -16;
    /// `-EEXIST`: a create found the object already there.
    pub const EEXIST: i32 = -17;
    /// `-ENODEV`: no such bdev, controller or subsystem.
    pub const ENODEV: i32 = -19;
    /// `-EINVAL`.
    pub const EINVAL: i32 = -22;
    /// `-ENOSPC`: a subsystem holds as many namespaces as it may.
    pub const ENOSPC: i32 = -28;
    /// `-EALREADY`: `bdev_nvme_attach_controller` of a name already attached.
    pub const EALREADY: i32 = -114;
    /// `bdev_nvme_get_controllers` of an unknown name answers a positive `EINVAL`.
    pub const EINVAL_POSITIVE: i32 = 22;
    /// JSON-RPC: the request was not a valid request object.
    pub const INVALID_REQUEST: i32 = -32600;
    /// JSON-RPC: the method does not exist (e.g. a SNAP method on plain SPDK).
    pub const METHOD_NOT_FOUND: i32 = -32601;
    /// JSON-RPC: SPDK also uses this for "object absent" on some deletes.
    pub const INVALID_PARAMS: i32 = -32602;
    /// JSON-RPC: SPDK uses this for params that fail to decode and for many
    /// method failures ("Unable to create subsystem ...").
    pub const INTERNAL_ERROR: i32 = -32603;
}

/// What went wrong with one call.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// The server answered with an error object; `code` and `message` are SPDK's.
    #[error("{method}: SPDK error {code}: {message}")]
    Server {
        method: String,
        code: i32,
        message: String,
    },
    /// No reply before the call's deadline. The server may still carry it out.
    #[error("{method}: no reply within {after:?}")]
    Timeout { method: String, after: Duration },
    /// The socket could not be opened (SNAP/SPDK not running or not reachable).
    #[error("cannot connect to {}: {source}", socket.display())]
    Connect {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The connection broke or closed while the call was in flight; the next
    /// call reconnects. The server may or may not have carried the call out.
    #[error("{method}: connection to the server lost: {reason}")]
    Disconnected { method: String, reason: String },
    /// The reply was not what the method returns (or not valid JSON-RPC).
    #[error("{method}: invalid reply: {reason}")]
    InvalidReply { method: String, reason: String },
    /// The request could not be encoded (a bug in the caller's params type).
    #[error("{method}: cannot encode params: {reason}")]
    InvalidParams { method: String, reason: String },
}

impl RpcError {
    /// The server's error code, when the server answered with one.
    pub fn code(&self) -> Option<i32> {
        match self {
            RpcError::Server { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The server said the object does not exist (`-ENODEV`).
    pub fn is_no_such_device(&self) -> bool {
        self.code() == Some(code::ENODEV)
    }

    /// The server said the object already exists (`-EEXIST`).
    pub fn is_exists(&self) -> bool {
        self.code() == Some(code::EEXIST)
    }

    /// `bdev_nvme_attach_controller` found the controller already attached.
    pub fn is_already_attached(&self) -> bool {
        self.code() == Some(code::EALREADY)
    }

    /// The server does not know the method (e.g. plain SPDK asked a SNAP method).
    pub fn is_method_not_found(&self) -> bool {
        self.code() == Some(code::METHOD_NOT_FOUND)
    }

    /// Worth retrying with backoff: the server was not reached or did not answer.
    /// A server error is an answer and is not retried here; callers decide.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            RpcError::Timeout { .. } | RpcError::Connect { .. } | RpcError::Disconnected { .. }
        )
    }
}
