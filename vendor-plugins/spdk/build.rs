//! Sets `SNAP_CSI_VERSION`, the version and commit `--version` and the
//! start line name, so that the plugin in a container image says what it was built from
//! (the `build-info` crate).

fn main() {
    build_info::emit_version();
}
