//! Application-level SPDK methods.

use serde::{Deserialize, Serialize};

use super::method;

/// `spdk_get_version`: takes no params at all (SPDK rejects `{}`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct SpdkGetVersion {}
method!(SpdkGetVersion => "spdk_get_version", Version);

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Version {
    /// e.g. `"SPDK v24.09"`.
    pub version: String,
    pub fields: VersionFields,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct VersionFields {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
    pub suffix: String,
}

/// `rpc_get_methods`: the method names the server knows.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RpcGetMethods {
    /// Only the methods callable in the current state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current: Option<bool>,
}
method!(RpcGetMethods => "rpc_get_methods", Vec<String>);

/// `framework_wait_init`: returns once the application finished starting.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FrameworkWaitInit {}
method!(FrameworkWaitInit => "framework_wait_init", bool);
