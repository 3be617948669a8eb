//! Our replies as a client built on CSI v1.11 decodes them.
//!
//! The Kubernetes sidecars users run today are built on CSI v1.11, and their
//! gRPC logging (csi-lib-utils) turns every reply into text, which
//! dereferences nil on an enum value they do not know: the sidecar crashes.
//! So every enum value in a reply of ours must be one CSI v1.11 defines.
//! The descriptors are v1.11's own file (`tests/fixtures/csi-v1.11.0.proto`),
//! compiled by protoc here as the build compiles ours; a reply is encoded as
//! it goes on the wire and decoded against them.

#![allow(dead_code)]

use std::sync::OnceLock;

use prost_reflect::{DescriptorPool, DynamicMessage, FieldDescriptor, Kind, Value};

const PROTO_NAME: &str = "csi-v1.11.0.proto";
const PROTO: &str = include_str!("../fixtures/csi-v1.11.0.proto");

/// CSI v1.11's descriptors, compiled once per test binary.
fn pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(PROTO_NAME), PROTO).unwrap();
        let set = dir.path().join("csi.pb");
        let protoc = std::env::var("PROTOC").unwrap_or_else(|_| "protoc".into());
        let status = std::process::Command::new(&protoc)
            .arg("--include_imports")
            .arg(format!("--descriptor_set_out={}", set.display()))
            .arg("-I")
            .arg(dir.path())
            .arg(PROTO_NAME)
            .current_dir(dir.path())
            .status()
            .unwrap_or_else(|e| panic!("running {protoc} (hack/setup.sh installs it): {e}"));
        assert!(status.success(), "{protoc} failed on {PROTO_NAME}");
        DescriptorPool::decode(std::fs::read(&set).unwrap().as_slice()).unwrap()
    })
}

/// The enum values in `reply`, CSI message `name` (`csi.v1.NodeGetCapabilitiesResponse`),
/// that CSI v1.11 does not define, as `field.path = value`.
pub fn unknown_enum_values(name: &str, reply: &impl prost::Message) -> Vec<String> {
    let descriptor = pool()
        .get_message_by_name(name)
        .unwrap_or_else(|| panic!("CSI v1.11 has no message {name}"));
    let message = DynamicMessage::decode(descriptor, reply.encode_to_vec().as_slice())
        .unwrap_or_else(|e| panic!("a CSI v1.11 client cannot decode {name}: {e}"));
    let mut unknown = Vec::new();
    walk(&message, name, &mut unknown);
    unknown
}

/// Panics, naming each, if `reply` carries an enum value CSI v1.11 lacks.
pub fn assert_decodes(name: &str, reply: &impl prost::Message) {
    let unknown = unknown_enum_values(name, reply);
    assert!(
        unknown.is_empty(),
        "a client built on CSI v1.11 does not know these enum values: {unknown:?}"
    );
}

/// Every value CSI v1.11 defines for the enum `name`.
pub fn enum_values(name: &str) -> Vec<i32> {
    pool()
        .get_enum_by_name(name)
        .unwrap_or_else(|| panic!("CSI v1.11 has no enum {name}"))
        .values()
        .map(|v| v.number())
        .collect()
}

fn walk(message: &DynamicMessage, path: &str, unknown: &mut Vec<String>) {
    for (field, value) in message.fields() {
        check(&field, value, &format!("{path}.{}", field.name()), unknown);
    }
}

fn check(field: &FieldDescriptor, value: &Value, path: &str, unknown: &mut Vec<String>) {
    match value {
        Value::EnumNumber(number) => {
            if let Kind::Enum(kind) = field.kind()
                && kind.get_value(*number).is_none()
            {
                unknown.push(format!("{path} = {number}"));
            }
        }
        Value::Message(inner) => walk(inner, path, unknown),
        Value::List(items) => {
            for (i, item) in items.iter().enumerate() {
                check(field, item, &format!("{path}[{i}]"), unknown);
            }
        }
        Value::Map(entries) => {
            if let Kind::Message(entry) = field.kind() {
                let value_field = entry.map_entry_value_field();
                for (key, item) in entries {
                    check(&value_field, item, &format!("{path}[{key:?}]"), unknown);
                }
            }
        }
        _ => {}
    }
}
