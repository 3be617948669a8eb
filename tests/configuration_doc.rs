//! `docs/configuration.md` documents every flag and environment variable of
//! `snap-csi node`, `snap-csi dpu-agent` and `snap-csi controller`: read from
//! their `--help`, so a new setting without documentation fails here.

#[path = "common/help_doc.rs"]
mod help_doc;

use std::process::Command;

#[test]
fn every_node_and_controller_setting_is_documented() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/configuration.md"
    ))
    .unwrap();
    for (command, heading) in [
        ("node", "## `snap-csi node`"),
        ("dpu-agent", "## `snap-csi dpu-agent`"),
        ("controller", "## `snap-csi controller`"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_snap-csi"))
            .args([command, "--help"])
            .output()
            .unwrap();
        let help = String::from_utf8(output.stdout).unwrap();
        help_doc::assert_documented(&doc, heading, command, &help);
    }
}
