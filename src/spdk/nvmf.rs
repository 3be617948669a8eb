//! The NVMe-oF target: transports, subsystems, namespaces, listeners.

use serde::{Deserialize, Serialize};

use super::method;

/// `nvmf_create_transport`: a repeat answers -32603 "Transport type ... already exists".
#[derive(Debug, Clone, Serialize)]
pub struct NvmfCreateTransport {
    pub trtype: String,
}
method!(NvmfCreateTransport => "nvmf_create_transport", bool);

/// `nvmf_create_subsystem`: a repeat answers -32603 "Unable to create subsystem ...".
#[derive(Debug, Clone, Serialize)]
pub struct NvmfCreateSubsystem {
    pub nqn: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial_number: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_number: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_any_host: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_namespaces: Option<u32>,
}
method!(NvmfCreateSubsystem => "nvmf_create_subsystem", bool);

/// `nvmf_delete_subsystem`: a repeat answers -32602 "Invalid parameters".
#[derive(Debug, Clone, Serialize)]
pub struct NvmfDeleteSubsystem {
    pub nqn: String,
}
method!(NvmfDeleteSubsystem => "nvmf_delete_subsystem", bool);

/// `nvmf_subsystem_add_ns`: returns the NSID; adding the same bdev again
/// answers -32602.
#[derive(Debug, Clone, Serialize)]
pub struct NvmfSubsystemAddNs {
    pub nqn: String,
    pub namespace: NvmfNamespaceParams,
}
method!(NvmfSubsystemAddNs => "nvmf_subsystem_add_ns", u32);

#[derive(Debug, Clone, Serialize)]
pub struct NvmfNamespaceParams {
    pub bdev_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nsid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

/// `nvmf_subsystem_remove_ns`.
#[derive(Debug, Clone, Serialize)]
pub struct NvmfSubsystemRemoveNs {
    pub nqn: String,
    pub nsid: u32,
}
method!(NvmfSubsystemRemoveNs => "nvmf_subsystem_remove_ns", bool);

/// `nvmf_subsystem_pause`: the library's `spdk_nvmf_subsystem_pause` as an
/// RPC, which upstream SPDK v24.09 lacks (-32601 there; hack/spdk's patch adds
/// it). Answers once the I/O in flight to the namespace has drained; new I/O
/// and connects queue in the target until resume. Pausing a paused subsystem
/// succeeds; an unknown NQN answers -32602 "Invalid parameters". `nsid`
/// absent pauses every namespace (0 would pause none of them, only admin
/// commands).
#[derive(Debug, Clone, Serialize)]
pub struct NvmfSubsystemPause {
    pub nqn: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nsid: Option<u32>,
}
method!(NvmfSubsystemPause => "nvmf_subsystem_pause", bool);

/// `nvmf_subsystem_resume`: the queued I/O runs. Resuming an active
/// subsystem succeeds; an unknown NQN answers -32602.
#[derive(Debug, Clone, Serialize)]
pub struct NvmfSubsystemResume {
    pub nqn: String,
}
method!(NvmfSubsystemResume => "nvmf_subsystem_resume", bool);

/// `nvmf_subsystem_add_listener`: a repeat answers -32602.
#[derive(Debug, Clone, Serialize)]
pub struct NvmfSubsystemAddListener {
    pub nqn: String,
    pub listen_address: ListenAddress,
}
method!(NvmfSubsystemAddListener => "nvmf_subsystem_add_listener", bool);

/// `nvmf_subsystem_remove_listener`: SPDK drops the connections that came in
/// through it (the subsystem's, on that address); an absent one answers
/// -32602.
#[derive(Debug, Clone, Serialize)]
pub struct NvmfSubsystemRemoveListener {
    pub nqn: String,
    pub listen_address: ListenAddress,
}
method!(NvmfSubsystemRemoveListener => "nvmf_subsystem_remove_listener", bool);

/// A transport address. SPDK accepts any case on input and answers
/// `"TCP"`/`"IPv4"` in lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenAddress {
    pub trtype: String,
    pub adrfam: String,
    pub traddr: String,
    pub trsvcid: String,
}

/// `nvmf_get_subsystems`: one by NQN (`-ENODEV` if absent) or all.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NvmfGetSubsystems {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nqn: Option<String>,
}
method!(NvmfGetSubsystems => "nvmf_get_subsystems", Vec<NvmfSubsystem>);

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NvmfSubsystem {
    pub nqn: String,
    pub subtype: String,
    #[serde(default)]
    pub listen_addresses: Vec<ListenAddress>,
    #[serde(default)]
    pub allow_any_host: bool,
    #[serde(default)]
    pub serial_number: Option<String>,
    #[serde(default)]
    pub model_number: Option<String>,
    #[serde(default)]
    pub namespaces: Vec<NvmfNamespace>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NvmfNamespace {
    pub nsid: u32,
    pub bdev_name: String,
    #[serde(default)]
    pub uuid: Option<String>,
}
