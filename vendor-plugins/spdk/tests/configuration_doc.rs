//! `docs/configuration.md` documents every flag and environment variable of
//! `snap-csi-spdk-plugin`: read from its `--help`, so a new setting without
//! documentation fails here.

#[path = "../../../tests/common/help_doc.rs"]
mod help_doc;

use std::process::Command;

#[test]
fn every_plugin_setting_is_documented() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/configuration.md"
    ))
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_snap-csi-spdk-plugin"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(output.stdout).unwrap();
    help_doc::assert_documented(
        &doc,
        "## `snap-csi-spdk-plugin`",
        "snap-csi-spdk-plugin",
        &help,
    );
}
