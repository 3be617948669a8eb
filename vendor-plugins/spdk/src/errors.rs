//! Every failure's gRPC code, in one place: a [`Failure`] says what failed
//! and where, and `From<Failure> for Status` is the one map (the plugin
//! service's and the CSI controller's alike). DeleteVolume's refusals of a
//! volume a DPU serves are answers about the DPUs, not failures: they are
//! mapped beside their check ([`crate::csi::in_use`]).
//!
//! The node retries UNAVAILABLE and DEADLINE_EXCEEDED with backoff and gives
//! up on anything else, so the choice says whether waiting can help. Any
//! SPDK call (SNAP's or the NVMe-oF target's):
//!
//! | SPDK's answer | status |
//! |---|---|
//! | socket missing, refused, or broken | UNAVAILABLE |
//! | no answer before the call's deadline | DEADLINE_EXCEEDED (SPDK may still do it) |
//! | -1 (SPDK not initialised yet) | UNAVAILABLE |
//! | -32601 (SPDK built without the method) | FAILED_PRECONDITION |
//! | -22 (SPDK refused a value from the volume context) | INVALID_ARGUMENT |
//! | -2 (the AIO file does not exist) | FAILED_PRECONDITION |
//! | anything else | INTERNAL, with SPDK's code and message |
//!
//! and what some calls add before that table:
//!
//! | call | SPDK's answer | status |
//! |---|---|---|
//! | attach ([`Failure::Attach`]) | -19 (nothing listens at the address) | UNAVAILABLE |
//! | attach | -5 (target reachable, refuses the subsystem or this host) | FAILED_PRECONDITION |
//! | `bdev_set_qos_limit` ([`Failure::Qos`]) | -32602 "Resource temporarily unavailable" | UNAVAILABLE |
//! | the target's ([`Failure::Target`]) | -28 or "No space left on device" (lvstore full) | RESOURCE_EXHAUSTED |
//! | the target's | -32602 "Operation not permitted" (an lvol with more than one clone) | FAILED_PRECONDITION |
//! | `fsdev_aio_create` ([`Failure::Fsdev`]) | -32603 "No such file or directory" or "Permission denied" (the volume's directory) | FAILED_PRECONDITION |
//!
//! -19 from attach is UNAVAILABLE and not FAILED_PRECONDITION because the
//! common cause is a target that is restarting or not reachable yet; a wrong
//! address in the context also lands here and is retried until the caller's
//! deadline, then reported with the address it tried. -5 is FAILED_PRECONDITION
//! and not NOT_FOUND because SPDK gives it both for a subsystem the target does
//! not have and for one that does not admit our host NQN, neither of which a
//! retry fixes, and NOT_FOUND means "no such device" in this API. A QoS
//! change refused with EAGAIN (another change of the bdev's limits still
//! being applied) succeeds a moment later. A full lvstore may have room once
//! space is freed (the CO retries RESOURCE_EXHAUSTED); a refused delete of
//! a cloned lvol is CSI's "in use".
//!
//! Files ([`Failure::File`]): a full filesystem is RESOURCE_EXHAUSTED, a
//! deadline passed during a copy DEADLINE_EXCEEDED, anything else INTERNAL
//! with the path and the OS's words. Our own state records
//! ([`Failure::Record`]) are INTERNAL: they should never fail.
//!
//! The answers that mean success or absence to one step (-17, -114, -19 on
//! a delete or lookup, -32603 "File exists" from `fsdev_aio_create`) are
//! handled where that step is taken, with [`is_taken`], [`is_fsdev_taken`]
//! and [`is_absent`] saying which they are.

use std::io;
use std::path::{Path, PathBuf};

use snap_csi::jsonrpc::{RpcError, code};
use tonic::Status;

/// errno `ENOSPC`.
const ENOSPC: i32 = -28;
const NO_SPACE: &str = "No space left on device";
const NOT_PERMITTED: &str = "Operation not permitted";
const FILE_EXISTS: &str = "File exists";
const TRY_AGAIN: &str = "Resource temporarily unavailable";
const NO_SUCH_FILE: &str = "No such file or directory";
const PERMISSION_DENIED: &str = "Permission denied";

/// A failure on its way to the caller; `what` says what we were doing.
#[derive(Debug)]
pub enum Failure {
    /// A call to SNAP's SPDK.
    Snap { what: String, error: RpcError },
    /// `bdev_nvme_attach_controller` on SNAP, whose -19 and -5 say what
    /// became of the connection to the target.
    Attach { what: String, error: RpcError },
    /// `bdev_set_qos_limit`, SNAP's or the target's; `what` says on what.
    Qos { what: String, error: RpcError },
    /// A call to the NVMe-oF target (lvstore, lvols, subsystems).
    Target { what: String, error: RpcError },
    /// `fsdev_aio_create` on SNAP, which answers every failure as -32603
    /// with `strerror`'s words.
    Fsdev { what: String, error: RpcError },
    /// A file of the AIO pool.
    File {
        what: String,
        path: PathBuf,
        error: io::Error,
    },
    /// One of our own state records.
    Record { what: String, error: io::Error },
}

impl Failure {
    pub fn snap(what: impl Into<String>, error: RpcError) -> Failure {
        Failure::Snap {
            what: what.into(),
            error,
        }
    }

    pub fn attach(what: impl Into<String>, error: RpcError) -> Failure {
        Failure::Attach {
            what: what.into(),
            error,
        }
    }

    pub fn qos(what: impl Into<String>, error: RpcError) -> Failure {
        Failure::Qos {
            what: what.into(),
            error,
        }
    }

    pub fn target(what: impl Into<String>, error: RpcError) -> Failure {
        Failure::Target {
            what: what.into(),
            error,
        }
    }

    pub fn fsdev(what: impl Into<String>, error: RpcError) -> Failure {
        Failure::Fsdev {
            what: what.into(),
            error,
        }
    }

    pub fn file(what: impl Into<String>, path: &Path, error: io::Error) -> Failure {
        Failure::File {
            what: what.into(),
            path: path.to_path_buf(),
            error,
        }
    }

    pub fn record(what: impl Into<String>, error: io::Error) -> Failure {
        Failure::Record {
            what: what.into(),
            error,
        }
    }
}

/// The map.
impl From<Failure> for Status {
    fn from(failure: Failure) -> Status {
        match failure {
            Failure::Snap { what, error } => spdk(&what, &error),
            Failure::Attach { what, error } => match error.code() {
                Some(code::ENODEV) => Status::unavailable(format!(
                    "{what}: nothing answers at the target address ({error})"
                )),
                Some(code::EIO) => Status::failed_precondition(format!(
                    "{what}: the target refused the connection: it has no such subsystem, or \
                     the subsystem does not admit this host ({error})"
                )),
                _ => spdk(&what, &error),
            },
            Failure::Qos { what, error } => {
                if is_server(&error, |c, m| {
                    c == code::INVALID_PARAMS && m.contains(TRY_AGAIN)
                }) {
                    return Status::unavailable(format!(
                        "setting the QoS limits of {what}: another change of them is in \
                         progress ({error})"
                    ));
                }
                spdk(&format!("setting the QoS limits of {what}"), &error)
            }
            Failure::Target { what, error } => {
                if is_server(&error, |c, m| c == ENOSPC || m == NO_SPACE) {
                    Status::resource_exhausted(format!("{what}: the lvstore is full ({error})"))
                } else if is_server(&error, |c, m| {
                    c == code::INVALID_PARAMS && m == NOT_PERMITTED
                }) {
                    Status::failed_precondition(format!(
                        "{what}: SPDK refuses while other lvols are cloned from it ({error})"
                    ))
                } else {
                    spdk(&what, &error)
                }
            }
            Failure::Fsdev { what, error } => {
                if is_server(&error, |c, m| {
                    c == code::INTERNAL_ERROR && (m == NO_SUCH_FILE || m == PERMISSION_DENIED)
                }) {
                    Status::failed_precondition(format!(
                        "{what}: SPDK cannot open the volume's directory: it was removed, or the \
                         share is not mounted where SNAP looks ({error})"
                    ))
                } else {
                    spdk(&what, &error)
                }
            }
            Failure::File { what, path, error } => {
                let message = format!("{what} {}: {error}", path.display());
                match error.kind() {
                    io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => {
                        Status::resource_exhausted(message)
                    }
                    io::ErrorKind::TimedOut => Status::deadline_exceeded(message),
                    _ => Status::internal(message),
                }
            }
            Failure::Record { what, error } => Status::internal(format!("{what}: {error}")),
        }
    }
}

/// The table every SPDK call shares.
fn spdk(what: &str, error: &RpcError) -> Status {
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

/// Whether SPDK answered with an error whose code and message `matches`.
fn is_server(error: &RpcError, matches: impl Fn(i32, &str) -> bool) -> bool {
    matches!(error, RpcError::Server { code, message, .. } if matches(*code, message))
}

/// An lvol name taken: -17 from a synchronous check, or the blobstore
/// callback's -32602 "File exists".
pub fn is_taken(error: &RpcError) -> bool {
    is_server(error, |c, m| {
        c == code::EEXIST || (c == code::INVALID_PARAMS && m == FILE_EXISTS)
    })
}

/// An fsdev name taken: `fsdev_aio_create`'s -32603 "File exists".
pub fn is_fsdev_taken(error: &RpcError) -> bool {
    is_server(error, |c, m| c == code::INTERNAL_ERROR && m == FILE_EXISTS)
}

/// The object is not there: -19 from lookups and deletes.
pub fn is_absent(error: &RpcError) -> bool {
    error.is_no_such_device()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tonic::Code;

    use super::*;

    fn server(code: i32, message: &str) -> RpcError {
        RpcError::Server {
            method: "m".into(),
            code,
            message: message.into(),
        }
    }

    fn connect() -> RpcError {
        RpcError::Connect {
            socket: PathBuf::from("/nowhere"),
            source: io::Error::from(io::ErrorKind::NotFound),
        }
    }

    #[test]
    fn codes_say_whether_waiting_helps() {
        let timeout = RpcError::Timeout {
            method: "m".into(),
            after: Duration::from_secs(1),
        };
        let cases = [
            (Failure::snap("x", connect()), Code::Unavailable),
            (Failure::snap("x", timeout), Code::DeadlineExceeded),
            (
                Failure::snap("x", server(code::EPERM, "msg")),
                Code::Unavailable,
            ),
            (
                Failure::snap("x", server(code::METHOD_NOT_FOUND, "msg")),
                Code::FailedPrecondition,
            ),
            (
                Failure::snap("x", server(code::EINVAL, "msg")),
                Code::InvalidArgument,
            ),
            (
                Failure::snap("x", server(code::ENOENT, "msg")),
                Code::FailedPrecondition,
            ),
            (Failure::snap("x", server(-12, "msg")), Code::Internal),
            (
                Failure::attach("x", server(code::ENODEV, "msg")),
                Code::Unavailable,
            ),
            (
                Failure::attach("x", server(code::EIO, "msg")),
                Code::FailedPrecondition,
            ),
            (Failure::attach("x", connect()), Code::Unavailable),
        ];
        for (failure, expected) in cases {
            let status = Status::from(failure);
            assert_eq!(status.code(), expected, "{status:?}");
            assert!(status.message().starts_with("x: "), "{status:?}");
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
            let status = Status::from(Failure::target("x", error));
            assert_eq!(status.code(), expected, "{status:?}");
            assert!(status.message().starts_with("x: "));
        }
        assert!(is_taken(&server(-17, FILE_EXISTS)));
        assert!(is_taken(&server(-32602, FILE_EXISTS)));
        assert!(!is_taken(&server(-32602, "Invalid parameters")));
        assert!(is_absent(&server(-19, "No such device")));
    }

    #[test]
    fn fsdev_answers_say_whose_fault() {
        let missing = server(code::INTERNAL_ERROR, NO_SUCH_FILE);
        let status = Status::from(Failure::fsdev("f", missing));
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
        assert!(status.message().contains("directory"), "{status:?}");
        let other = server(code::INTERNAL_ERROR, "Cannot allocate memory");
        assert_eq!(
            Status::from(Failure::fsdev("f", other)).code(),
            Code::Internal
        );
        assert!(is_fsdev_taken(&server(code::INTERNAL_ERROR, FILE_EXISTS)));
        assert!(!is_fsdev_taken(&server(code::INTERNAL_ERROR, NO_SUCH_FILE)));
    }

    #[test]
    fn a_busy_bdev_is_worth_retrying() {
        let busy = server(
            code::INVALID_PARAMS,
            "Failed to configure rate limit: Resource temporarily unavailable",
        );
        assert_eq!(
            Status::from(Failure::qos("v", busy)).code(),
            Code::Unavailable
        );
        let missing = server(code::METHOD_NOT_FOUND, "Method not found");
        let status = Status::from(Failure::qos("v", missing));
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert!(status.message().starts_with("setting the QoS limits of v"));
    }

    #[test]
    fn file_errors_say_which_file() {
        let full = io::Error::from(io::ErrorKind::StorageFull);
        let status = Status::from(Failure::file("copying", Path::new("/pool/a.img"), full));
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(status.message().contains("/pool/a.img"));
        let other = io::Error::from(io::ErrorKind::PermissionDenied);
        assert_eq!(
            Status::from(Failure::file("x", Path::new("/p"), other)).code(),
            Code::Internal
        );
    }
}
