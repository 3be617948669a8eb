//! SPDK's answers as gRPC statuses, in one place.
//!
//! The node retries UNAVAILABLE and DEADLINE_EXCEEDED with backoff and gives
//! up on anything else, so the choice says whether waiting can help:
//!
//! | SPDK's answer | status |
//! |---|---|
//! | socket missing, refused, or broken | UNAVAILABLE |
//! | no answer before the call's deadline | DEADLINE_EXCEEDED (SPDK may still do it) |
//! | -1 (SPDK not initialised yet) | UNAVAILABLE |
//! | -32601 (SPDK built without the method) | FAILED_PRECONDITION |
//! | attach -19 (nothing listens at the address) | UNAVAILABLE |
//! | attach -5 (target reachable, refuses the subsystem or this host) | FAILED_PRECONDITION |
//! | -22 (SPDK refused a value from the volume context) | INVALID_ARGUMENT |
//! | -2 (the AIO file does not exist) | FAILED_PRECONDITION |
//! | anything else | INTERNAL, with SPDK's code and message |
//!
//! -19 from attach is UNAVAILABLE and not FAILED_PRECONDITION because the
//! common cause is a target that is restarting or not reachable yet; a wrong
//! address in the context also lands here and is retried until the caller's
//! deadline, then reported with the address it tried. -5 is FAILED_PRECONDITION
//! and not NOT_FOUND because SPDK gives it both for a subsystem the target does
//! not have and for one that does not admit our host NQN, neither of which a
//! retry fixes, and NOT_FOUND means "no such device" in this API.
//!
//! The answers that mean success or absence to one method (-17, -114, -19
//! on a delete) are handled where that method is called, not here.

use snap_csi::jsonrpc::{RpcError, code};
use tonic::Status;

/// The status for a failed SPDK call; `what` says what we were doing.
pub fn spdk_status(what: &str, error: &RpcError) -> Status {
    let message = format!("{what}: {error}");
    match error {
        RpcError::Connect { .. } | RpcError::Disconnected { .. } => {
            Status::unavailable(format!("{what}: SPDK is unreachable: {error}"))
        }
        RpcError::Timeout { .. } => Status::deadline_exceeded(message),
        RpcError::Server { code, .. } => match *code {
            code::EPERM => Status::unavailable(format!("{message} (SPDK is still starting)")),
            code::METHOD_NOT_FOUND => Status::failed_precondition(format!(
                "{message} (this SPDK lacks the module the backend needs)"
            )),
            code::ENOENT => Status::failed_precondition(message),
            code::EINVAL => Status::invalid_argument(message),
            _ => Status::internal(message),
        },
        RpcError::InvalidReply { .. } | RpcError::InvalidParams { .. } => Status::internal(message),
    }
}

/// [`spdk_status`] for `bdev_nvme_attach_controller`, whose -19 and -5 say
/// what became of the connection to the target.
pub fn attach_status(what: &str, error: &RpcError) -> Status {
    match error.code() {
        Some(code::ENODEV) => Status::unavailable(format!(
            "{what}: nothing answers at the target address ({error})"
        )),
        Some(code::EIO) => Status::failed_precondition(format!(
            "{what}: the target refused the connection: it has no such subsystem, or the \
             subsystem does not admit this host ({error})"
        )),
        _ => spdk_status(what, error),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use tonic::Code;

    use super::*;

    fn server(code: i32) -> RpcError {
        RpcError::Server {
            method: "m".into(),
            code,
            message: "msg".into(),
        }
    }

    #[test]
    fn codes_say_whether_waiting_helps() {
        let connect = RpcError::Connect {
            socket: PathBuf::from("/nowhere"),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        let timeout = RpcError::Timeout {
            method: "m".into(),
            after: Duration::from_secs(1),
        };
        let cases = [
            (spdk_status("x", &connect), Code::Unavailable),
            (spdk_status("x", &timeout), Code::DeadlineExceeded),
            (spdk_status("x", &server(code::EPERM)), Code::Unavailable),
            (
                spdk_status("x", &server(code::METHOD_NOT_FOUND)),
                Code::FailedPrecondition,
            ),
            (
                spdk_status("x", &server(code::EINVAL)),
                Code::InvalidArgument,
            ),
            (
                spdk_status("x", &server(code::ENOENT)),
                Code::FailedPrecondition,
            ),
            (spdk_status("x", &server(-12)), Code::Internal),
            (attach_status("x", &server(code::ENODEV)), Code::Unavailable),
            (
                attach_status("x", &server(code::EIO)),
                Code::FailedPrecondition,
            ),
            (attach_status("x", &connect), Code::Unavailable),
        ];
        for (status, expected) in cases {
            assert_eq!(status.code(), expected, "{status:?}");
            assert!(status.message().starts_with("x: "), "{status:?}");
        }
    }
}
