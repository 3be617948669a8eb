//! The sentences of the API text the checks stand on, quoted in FAILs.

pub const UNIMPLEMENTED: &str = "All the RPC methods that are not implemented by the plugin \
    MUST reply with the non-ok gRPC status code, 12 UNIMPLEMENTED.";
pub const PLUGIN_INFO: &str = "This method should return the name of the plugin (e.g., \
    example-vendor-plugin.example) and the version of the plugin (e.g., 1.0). On success, the \
    method should reply 0 OK in the gRPC status code.";
pub const PROBE: &str = "The plugin should verify its internal state and returns 0 OK if the \
    validation succeeds. If the plugin is still initializing, but is otherwise perfectly \
    healthy, it shall return 0 OK with the ready field set to False.";
pub const CAPABILITIES: &str = "This API allows the SNAP Node-Driver to check the supported \
    capabilities of the storage service provided by the plugin. (Return codes: 0 OK.)";
pub const SNAP_PROVIDER: &str = "If the plugin uses the default SNAP process (provided by \
    NVIDIA) then an empty string should be returned. Otherwise, a unique name represents the \
    SNAP process used by this plugin should be returned.";
pub const CREATE: &str = "Business logic required by the plugin: 1. Allocate a unique device \
    name to be used by SNAP [...] 4. Return the device name";
pub const CREATE_IDEMPOTENT: &str = "The operation must be idempotent. If the device \
    corresponding to the volume_id is already created and is identical to the specified \
    access_modes and volume_mode the plugin must reply 0 OK with the corresponding \
    CreateDeviceResponse message.";
pub const DELETE: &str = "Business logic required by the plugin: 1. Remove the device from \
    the SNAP process. (Return codes: 0 OK.)";
pub const DELETE_IDEMPOTENT: &str = "The operation must be idempotent. If the device \
    corresponding to the volume_id and the device_name does not exist, the plugin must reply \
    0 OK.";
pub const GET_DEVICE: &str = "A Storage vendor plugin must implement this API if it has \
    GET_DEVICE_STATS capability. The plugin shall return the information about the device \
    corresponding to the volume_id and the device_name.";
pub const GET_NOT_FOUND: &str = "If the device corresponding to the volume_id and the \
    device_name does not exist, the plugin must reply 5 NOT_FOUND.";
pub const LIST: &str = "A Storage vendor plugin must implement this API if it has \
    LIST_DEVICES capability. The plugin shall return the information about all the devices \
    that it knows about.";
pub const LIST_ABORTED: &str = "Return codes: [...] 10 ABORTED Indicates that starting_token \
    is not valid";
pub const CREATE_UNABLE: &str = "If the plugin is unable to complete the CreateDevice call \
    successfully, it MUST return a non-ok gRPC code in the gRPC status.";
pub const CAPABILITY_KINDS: &str = "StoragePluginGetCapabilities answers \
    CREATE_DELETE_BLOCK_DEVICE and/or CREATE_DELETE_FS_DEVICE; CreateDevice carries \
    volume_mode.";
