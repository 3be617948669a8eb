//! The DPUs one node reaches: a host with two BlueFields (or N) lists each
//! in the config file's `dpus`; a host with one may instead use the
//! single-DPU settings (`dpu_name`, `dpu_endpoint`, `plugin_socket`,
//! `snap_socket_template`), which are then its one entry.
//!
//! Each DPU has a name (its topology key `dpu.snap-csi.io/<name>`, valued
//! with the node id, and in split mode the name its agent's certificate
//! carries) and the host PCI domain its emulated functions appear in: SNAP
//! reports a function's address without a domain, and two DPUs' functions
//! differ only in it.

use std::path::PathBuf;

use serde::Deserialize;

use crate::grpc::LinkAddress;

/// The flag that allows a plaintext agent endpoint (loopback only).
pub const DPU_INSECURE_FLAG: &str = "--dpu-insecure-plaintext";

/// Each DPU's topology key is this prefix and its name ([`dpu_segment`]).
pub const DPU_TOPOLOGY_PREFIX: &str = "dpu.snap-csi.io/";

/// The topology segment of DPU `name` in the host of node `node_id`: what
/// the node reports for it, and a volume local to it has as its accessible
/// topology. Operators name DPUs alike on every host (`bf3-a`), so the name
/// alone would let a volume on one host's DPU be scheduled to any host with
/// a DPU of that name; the node id as the value makes it one host's.
/// Kubernetes copies it to a Node label, so both must be of a label's form
/// ([`is_label_name`]; the node checks its id with [`check_node_id`]).
pub fn dpu_segment(name: &str, node_id: &str) -> (String, String) {
    (format!("{DPU_TOPOLOGY_PREFIX}{name}"), node_id.to_string())
}

/// The node id values every DPU segment the node reports (a DPU whose name
/// is a label name has one), so it must then be a label value, or kubelet
/// could not copy the segment to the Node: refused at start, not reported.
pub fn check_node_id(node_id: &str, specs: &[DpuSpec]) -> Result<(), String> {
    match specs.iter().find(|s| is_label_name(&s.name)) {
        Some(dpu) if !is_label_name(node_id) => Err(format!(
            "node id {node_id:?} must be a Kubernetes label value (at most 63 letters, digits, \
             '-', '_' or '.', beginning and ending with a letter or digit): it is the value of \
             this host's topology segment {DPU_TOPOLOGY_PREFIX}{}, which tells its DPU from \
             other hosts' DPUs of that name; give --node-id (SNAP_CSI_NODE_ID, node_id in the \
             file) one that is",
            dpu.name
        )),
        _ => Ok(()),
    }
}

/// One entry of the config file's `dpus`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DpuSetting {
    pub name: String,
    /// Hex, 1 to 4 digits; `0000` when not given.
    #[serde(default)]
    pub pci_domain: Option<String>,
    /// Split mode: this DPU's agent (the node's `dpu_tls` files are used).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Co-located: this DPU's vendor plugin socket (default: `plugin_socket`).
    #[serde(default)]
    pub plugin_socket: Option<PathBuf>,
    /// Co-located: this DPU's SNAP socket template (default: `snap_socket_template`).
    #[serde(default)]
    pub snap_socket_template: Option<String>,
}

/// A DPU as the node reaches it, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DpuSpec {
    pub name: String,
    pub pci_domain: u16,
    pub reach: Reach,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// Split mode: the DPU agent.
    Agent(LinkAddress),
    /// Co-located: the plugin's and SNAP's sockets.
    Sockets {
        plugin_socket: PathBuf,
        snap_socket_template: String,
    },
}

/// The DPUs `dpus` lists, checked; a co-located one without sockets of
/// its own takes `default_sockets`.
pub fn specs(
    dpus: &[DpuSetting],
    default_sockets: &Reach,
    insecure_plaintext: bool,
) -> Result<Vec<DpuSpec>, String> {
    let mut specs: Vec<DpuSpec> = Vec::new();
    for dpu in dpus {
        let name = &dpu.name;
        if !is_label_name(name) {
            return Err(format!(
                "DPU name {name:?} must be 1 to 63 letters, digits, '-', '_' or '.', \
                 beginning and ending with a letter or digit (it names a topology key)"
            ));
        }
        let pci_domain = match &dpu.pci_domain {
            None => 0,
            Some(hex) => parse_domain(hex).ok_or_else(|| {
                format!("DPU {name}: pci_domain must be 1 to 4 hex digits, not {hex:?}")
            })?,
        };
        let reach = match (&dpu.endpoint, default_sockets) {
            (Some(_), _) if dpu.plugin_socket.is_some() || dpu.snap_socket_template.is_some() => {
                return Err(format!(
                    "DPU {name}: an endpoint (split mode) takes no sockets; the agent has them"
                ));
            }
            (Some(endpoint), _) => Reach::Agent(
                LinkAddress::parse(endpoint, insecure_plaintext, DPU_INSECURE_FLAG)
                    .map_err(|e| format!("DPU {name}: endpoint {e}"))?,
            ),
            (
                None,
                Reach::Sockets {
                    plugin_socket,
                    snap_socket_template,
                },
            ) => Reach::Sockets {
                plugin_socket: dpu.plugin_socket.as_ref().unwrap_or(plugin_socket).clone(),
                snap_socket_template: dpu
                    .snap_socket_template
                    .as_ref()
                    .unwrap_or(snap_socket_template)
                    .clone(),
            },
            (None, Reach::Agent(_)) => unreachable!("the default is the sockets"),
        };
        if let Some(twin) = specs
            .iter()
            .find(|s| s.name == *name || s.pci_domain == pci_domain || s.reach == reach)
        {
            return Err(format!(
                "DPUs {} and {name} must differ in name, PCI domain and how they are reached",
                twin.name
            ));
        }
        specs.push(DpuSpec {
            name: name.clone(),
            pci_domain,
            reach,
        });
    }
    Ok(specs)
}

fn parse_domain(hex: &str) -> Option<u16> {
    if hex.is_empty() || hex.len() > 4 {
        return None;
    }
    u16::from_str_radix(hex, 16).ok()
}

/// The name part of a Kubernetes label key; a label value, not empty, has
/// the same form.
pub fn is_label_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=63).contains(&bytes.len())
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_names() {
        assert!(is_label_name("bf3-a.rack_2"));
        assert!(!is_label_name(&"a".repeat(64)));
        assert!(!is_label_name("a/b"));
        assert!(!is_label_name("a-"));
    }
}
