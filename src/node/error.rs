//! The node's error, and the one place that decides its CSI code.
//!
//! Host operations (tools, mounts, sysfs) and the node's own state (its
//! records) fail with a [`NodeError`]; the variant is what picks the code,
//! the message is meant for the CO's user. The other areas' errors have
//! their mapping beside them: [`crate::dpu::DpuError`] in `dpu`, a busy
//! volume in [`crate::guard`], a stage's and a publish's decisions about
//! a staged volume in `recovery`.

use std::io;

use tonic::Status;

/// What went wrong on the host or in the node's own state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    /// The request itself is wrong (a path, an fs type, a mount option).
    #[error("{0}")]
    InvalidArgument(String),
    /// The volume is not in a state the operation can work on, e.g. the
    /// device carries another filesystem or a partition table, or its
    /// filesystem has errors that preening could not fix.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The device or path does not exist.
    #[error("{0}")]
    NotFound(String),
    /// Something else is already mounted at the target, or the same thing with
    /// an incompatible read-only setting.
    #[error("{0}")]
    AlreadyExists(String),
    /// The deadline passed; the work may still complete in the background.
    #[error("{what} did not finish before the deadline")]
    Timeout { what: String },
    /// Anything else: a tool's non-zero exit (with its output), an I/O error.
    #[error("{what} failed: {message}")]
    Failed { what: String, message: String },
    /// The node's own state (its records, a path it removes) failed it.
    #[error("{what}: {message}")]
    State { what: String, message: String },
}

impl NodeError {
    pub(crate) fn failed(what: impl Into<String>, message: impl Into<String>) -> Self {
        NodeError::Failed {
            what: what.into(),
            message: message.into(),
        }
    }

    /// The generic mapping of an I/O error (or an errno, through
    /// `io::Error::from`): a missing file is `NotFound`, the rest `Failed`.
    /// Callers that know better (EINVAL from mount(2)) map those first.
    pub(crate) fn io(what: impl Into<String>, err: &io::Error) -> Self {
        let what = what.into();
        match err.kind() {
            io::ErrorKind::NotFound => NodeError::NotFound(format!("{what}: {err}")),
            _ => NodeError::failed(what, err.to_string()),
        }
    }

    pub(crate) fn errno(what: impl Into<String>, errno: nix::errno::Errno) -> Self {
        NodeError::io(what, &io::Error::from(errno))
    }

    /// The node's own state failed `what`: whatever the error, the node is
    /// at fault, not the request.
    pub(crate) fn state(what: impl Into<String>, err: io::Error) -> Self {
        NodeError::State {
            what: what.into(),
            message: err.to_string(),
        }
    }
}

impl From<NodeError> for Status {
    fn from(error: NodeError) -> Self {
        let message = error.to_string();
        match error {
            NodeError::InvalidArgument(_) => Status::invalid_argument(message),
            NodeError::FailedPrecondition(_) => Status::failed_precondition(message),
            NodeError::NotFound(_) => Status::not_found(message),
            NodeError::AlreadyExists(_) => Status::already_exists(message),
            NodeError::Timeout { .. } => Status::deadline_exceeded(message),
            NodeError::Failed { .. } | NodeError::State { .. } => Status::internal(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_map_missing_to_not_found() {
        let missing = io::Error::from(io::ErrorKind::NotFound);
        assert!(matches!(
            NodeError::io("stat /x", &missing),
            NodeError::NotFound(_)
        ));
        let other = NodeError::errno("mount /x", nix::errno::Errno::EIO);
        assert!(matches!(other, NodeError::Failed { .. }), "{other:?}");
    }

    #[test]
    fn the_node_s_own_state_is_internal_whatever_the_error() {
        let missing = io::Error::from(io::ErrorKind::NotFound);
        let status = Status::from(NodeError::state("reading the volume record", missing));
        assert_eq!(status.code(), tonic::Code::Internal);
        assert!(
            status.message().starts_with("reading the volume record: "),
            "{status:?}"
        );
    }
}
