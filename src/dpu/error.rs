//! Why an attach or detach failed, and the gRPC code each failure is
//! answered with: one place for the layer's codes, on either end of the
//! agent link.

/// Why an attach or detach failed, classified for the CSI status code.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DpuError {
    /// The vendor plugin or SNAP cannot be reached (or did not answer in time).
    #[error("{0}")]
    Unavailable(String),
    /// No free emulated function of the requested kind.
    #[error("{0}")]
    Exhausted(String),
    /// The vendor plugin rejected the request's arguments.
    #[error("{0}")]
    InvalidArgument(String),
    /// The request cannot be served in the current state (e.g. the plugin lacks a capability).
    #[error("{0}")]
    FailedPrecondition(String),
    /// Anything else; the message says what.
    #[error("{0}")]
    Internal(String),
}

impl DpuError {
    /// Classifies a status from a gRPC peer below us (the vendor plugin, or
    /// the DPU agent, which answers with [`Status::from`] of these): a peer
    /// that is unreachable, late or cancelled is Unavailable, as are statuses
    /// that say so; `message` says who answered what.
    pub(crate) fn from_code(code: tonic::Code, message: String) -> DpuError {
        use tonic::Code;
        match code {
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
                DpuError::Unavailable(message)
            }
            Code::InvalidArgument | Code::OutOfRange => DpuError::InvalidArgument(message),
            Code::FailedPrecondition | Code::Unimplemented => DpuError::FailedPrecondition(message),
            Code::ResourceExhausted => DpuError::Exhausted(message),
            _ => DpuError::Internal(message),
        }
    }
}

/// The CSI code of each failure: what the node answers kubelet, and what the
/// agent answers the node.
impl From<DpuError> for tonic::Status {
    fn from(error: DpuError) -> Self {
        match error {
            DpuError::Unavailable(m) => tonic::Status::unavailable(m),
            DpuError::Exhausted(m) => tonic::Status::resource_exhausted(m),
            DpuError::InvalidArgument(m) => tonic::Status::invalid_argument(m),
            DpuError::FailedPrecondition(m) => tonic::Status::failed_precondition(m),
            DpuError::Internal(m) => tonic::Status::internal(m),
        }
    }
}
