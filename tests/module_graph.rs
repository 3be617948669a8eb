//! The driver's files import each other in layers: no file imports back up
//! into one that imports it, and there is no circle across files (the graph
//! and the rule: the `module-graph` crate). Run with `--nocapture` to see the
//! graph and its layers.

use std::path::Path;

/// From the bottom up; a file belongs to the first layer one of whose
/// prefixes names its module (`dpu` covers `dpu::nvme`).
const LAYERS: &[(&str, &[&str])] = &[
    (
        "primitives",
        &[
            "proto",
            "deadline",
            "failpoint",
            "retry",
            "settings",
            "csi_limits",
            "metrics",
            "guard",
            "json_dir",
        ],
    ),
    ("wire", &["jsonrpc", "spdk", "tls", "grpc", "server"]),
    ("the host's devices", &["host"]),
    ("the DPU attach layer", &["dpu"]),
    (
        "the services",
        &["agent", "node", "controller", "plugin_check"],
    ),
    ("the library", &[""]),
];

#[test]
fn files_import_downwards_only_and_in_no_circle() {
    module_graph::assert_layered(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), LAYERS);
}
