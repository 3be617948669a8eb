//! How the results write what the plugin answered: codes and capabilities as
//! the API text spells them, one line each.

use tonic::{Code, Status};

use crate::proto::nvidia::storage::plugins::v1 as api;
use api::storage_plugin_service_capability::rpc::Type as Capability;

/// `LIST_DEVICES`, as the API text spells capabilities.
pub(super) fn capability_name(capability: Capability) -> &'static str {
    let name = capability.as_str_name();
    name.strip_prefix("TYPE_").unwrap_or(name)
}

/// A status as the API text writes codes (`5 NOT_FOUND`), with its message.
pub(super) fn show(status: &Status) -> String {
    let code = status.code();
    let name = match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    };
    if status.message().is_empty() {
        format!("{} {name}", code as i32)
    } else {
        format!("{} {name} ({:?})", code as i32, status.message())
    }
}

/// `1 page`, `2 pages`.
pub(super) fn counted(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// One result is one line, whatever a plugin puts in its messages.
pub(super) fn one_line(s: &str) -> String {
    s.split(['\n', '\r']).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_read_as_the_api_text_writes_them() {
        assert_eq!(show(&Status::not_found("")), "5 NOT_FOUND");
        assert_eq!(
            show(&Status::unimplemented("no")),
            "12 UNIMPLEMENTED (\"no\")"
        );
        assert_eq!(capability_name(Capability::ListDevices), "LIST_DEVICES");
    }
}
