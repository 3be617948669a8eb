//! CSI's size limits, checked before a request does anything.
//!
//! The spec ("Size Limits") bounds every string field to 128 bytes and every
//! map to 4 KiB unless a field says otherwise (paths override it: see
//! `node::paths`). tonic accepts any message up to 4 MiB, so without these
//! checks a 1 MiB volume id would travel on to the vendor plugin, SNAP's
//! names and our logs. A value past its limit was not made by a conforming
//! CO or SP, so it is INVALID_ARGUMENT, and the message gives its size
//! rather than echoing it.

use std::collections::HashMap;

use tonic::Status;

/// The general limit of a string field.
pub const MAX_STRING_BYTES: usize = 128;
/// The general limit of a `map<string, string>`, keys and values together.
pub const MAX_MAP_BYTES: usize = 4 << 10;

/// A REQUIRED identifier (volume, snapshot, group id or name): present and
/// within the string limit.
pub fn required_id<'a>(value: &'a str, what: &str) -> Result<&'a str, Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("{what} is required")));
    }
    within_string_limit(value, what)?;
    Ok(value)
}

/// An identifier within the string limit (empty passes: whether it is
/// required is the caller's question).
pub fn within_string_limit(value: &str, what: &str) -> Result<(), Status> {
    if value.len() > MAX_STRING_BYTES {
        return Err(Status::invalid_argument(format!(
            "{what} is {} bytes; CSI limits it to {MAX_STRING_BYTES}",
            value.len()
        )));
    }
    Ok(())
}

/// A map (a context, secrets) within the map limit.
pub fn within_map_limit(map: &HashMap<String, String>, what: &str) -> Result<(), Status> {
    let size: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_MAP_BYTES {
        return Err(Status::invalid_argument(format!(
            "{what} holds {size} bytes in {} entries; CSI limits a map to {MAX_MAP_BYTES}",
            map.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_the_specs_and_messages_give_sizes_not_values() {
        let at_limit = "v".repeat(MAX_STRING_BYTES);
        assert_eq!(required_id(&at_limit, "volume_id").unwrap(), at_limit);
        let huge = "v".repeat(1 << 20);
        let status = required_id(&huge, "volume_id").unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            status.message(),
            "volume_id is 1048576 bytes; CSI limits it to 128"
        );
        assert_eq!(
            required_id("", "volume_id").unwrap_err().message(),
            "volume_id is required"
        );

        let full: HashMap<_, _> = [("k".to_string(), "v".repeat(MAX_MAP_BYTES - 1))].into();
        within_map_limit(&full, "secrets").unwrap();
        let over: HashMap<_, _> = [("k".to_string(), "v".repeat(MAX_MAP_BYTES))].into();
        assert_eq!(
            within_map_limit(&over, "secrets").unwrap_err().message(),
            "secrets holds 4097 bytes in 1 entries; CSI limits a map to 4096"
        );
    }
}
