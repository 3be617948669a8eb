//! The emulator's files import each other in layers: no file imports back
//! up into one that imports it, and there is no circle across files (the
//! graph and the rule: the `module-graph` crate). Run with `--nocapture` to
//! see the graph and its layers.

use std::path::Path;

/// From the bottom up; a file belongs to the first layer one of whose
/// prefixes names its module (`snap` covers `snap::nvme`).
const LAYERS: &[(&str, &[&str])] = &[
    (
        "wire and primitives",
        &[
            "rpc",
            "framing",
            "faults",
            "snap_api",
            "datapath::cipher",
            "datapath::paths",
            "datapath::qos",
            "datapath::remote",
            "datapath::stats",
        ],
    ),
    ("the data path", &["datapath"]),
    ("the host side", &["host"]),
    ("configuration", &["config"]),
    (
        "the bdev layer and the families' seam",
        &["bdev::registry", "fsdev::registry", "registry"],
    ),
    ("the families", &["bdev", "fsdev", "nvmf", "snap"]),
    ("routing", &["dispatch"]),
    ("serving", &["poller", "server", "in_process"]),
    ("the library", &[""]),
];

#[test]
fn files_import_downwards_only_and_in_no_circle() {
    module_graph::assert_layered(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), LAYERS);
}
