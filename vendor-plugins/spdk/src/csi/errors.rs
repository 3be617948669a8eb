//! How the controller's failures become CSI statuses, in one place.
//!
//! SPDK answers go through the plugin's own table ([`crate::errors`]:
//! unreachable is UNAVAILABLE, no reply DEADLINE_EXCEEDED, ...) with two
//! additions the controller needs: a full lvstore is RESOURCE_EXHAUSTED (the
//! CO may retry once space is freed), and the blobstore's "Operation not
//! permitted" on a delete (an lvol with more than one clone) is
//! FAILED_PRECONDITION ("in use", CSI's code for it). Answers that mean
//! "exists" or "absent" to one step are handled by that step, with
//! [`is_taken`] and [`is_absent`] saying which they are.
//!
//! Files: a full filesystem is RESOURCE_EXHAUSTED, a deadline passed during a
//! copy DEADLINE_EXCEEDED, anything else INTERNAL with the path and the OS's
//! words. State records are INTERNAL: they are ours and should never fail.

use std::io;
use std::path::Path;

use snap_csi::jsonrpc::{RpcError, code};
use tonic::Status;

/// errno `ENOSPC`.
const ENOSPC: i32 = -28;
const NO_SPACE: &str = "No space left on device";
const NOT_PERMITTED: &str = "Operation not permitted";
const FILE_EXISTS: &str = "File exists";

/// The status of a failed SPDK call; `what` says what we were doing.
pub fn spdk(what: &str, error: &RpcError) -> Status {
    if let RpcError::Server { code, message, .. } = error {
        if *code == ENOSPC || message == NO_SPACE {
            return Status::resource_exhausted(format!("{what}: the lvstore is full ({error})"));
        }
        if *code == code::INVALID_PARAMS && message == NOT_PERMITTED {
            return Status::failed_precondition(format!(
                "{what}: SPDK refuses while other lvols are cloned from it ({error})"
            ));
        }
    }
    crate::errors::spdk_status(what, error)
}

/// An lvol name taken: -17 from a synchronous check, or the blobstore
/// callback's -32602 "File exists".
pub fn is_taken(error: &RpcError) -> bool {
    match error {
        RpcError::Server { code, message, .. } => {
            *code == code::EEXIST || (*code == code::INVALID_PARAMS && message == FILE_EXISTS)
        }
        _ => false,
    }
}

/// The object is not there: -19 from lookups and deletes.
pub fn is_absent(error: &RpcError) -> bool {
    error.is_no_such_device()
}

/// The status of a failed file operation on `path`.
pub fn io(what: &str, path: &Path, error: &io::Error) -> Status {
    let message = format!("{what} {}: {error}", path.display());
    match error.kind() {
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => {
            Status::resource_exhausted(message)
        }
        io::ErrorKind::TimedOut => Status::deadline_exceeded(message),
        _ => Status::internal(message),
    }
}

/// The status of a failed read or write of our own state records.
pub fn record(what: &str, error: &io::Error) -> Status {
    Status::internal(format!("{what}: {error}"))
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    fn server(code: i32, message: &str) -> RpcError {
        RpcError::Server {
            method: "m".into(),
            code,
            message: message.into(),
        }
    }

    #[test]
    fn the_controllers_spdk_answers_map_to_csi_codes() {
        let cases = [
            (server(-28, NO_SPACE), Code::ResourceExhausted),
            (server(-32602, NO_SPACE), Code::ResourceExhausted),
            (server(-32602, NOT_PERMITTED), Code::FailedPrecondition),
            (server(-32602, "Invalid argument"), Code::Internal),
            (server(-32601, "Method not found"), Code::FailedPrecondition),
        ];
        for (error, expected) in cases {
            let status = spdk("x", &error);
            assert_eq!(status.code(), expected, "{status:?}");
            assert!(status.message().starts_with("x: "));
        }
        assert!(is_taken(&server(-17, FILE_EXISTS)));
        assert!(is_taken(&server(-32602, FILE_EXISTS)));
        assert!(!is_taken(&server(-32602, "Invalid parameters")));
        assert!(is_absent(&server(-19, "No such device")));
    }

    #[test]
    fn file_errors_say_which_file() {
        let full = io::Error::from(io::ErrorKind::StorageFull);
        let status = io("copying", Path::new("/pool/a.img"), &full);
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(status.message().contains("/pool/a.img"));
        let other = io::Error::from(io::ErrorKind::PermissionDenied);
        assert_eq!(io("x", Path::new("/p"), &other).code(), Code::Internal);
    }
}
