//! One place that turns the node's internal errors into CSI status codes
//! (the DPU layer's own are `From<DpuError> for Status`).

use tonic::Status;

use super::command::HostOpError;
pub fn host_status(error: HostOpError) -> Status {
    let message = error.to_string();
    match error {
        HostOpError::InvalidArgument(_) => Status::invalid_argument(message),
        HostOpError::FailedPrecondition(_) => Status::failed_precondition(message),
        HostOpError::NotFound(_) => Status::not_found(message),
        HostOpError::AlreadyExists(_) => Status::already_exists(message),
        HostOpError::Timeout { .. } => Status::deadline_exceeded(message),
        _ => Status::internal(message),
    }
}

pub fn io_status(what: &str, error: std::io::Error) -> Status {
    Status::internal(format!("{what}: {error}"))
}
