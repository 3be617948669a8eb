//! Two paths to every remote volume on the emulator: the CSI controller's
//! target listening on two ports, volume contexts with every path, bad path
//! lists refused (see `common/multipath.rs`; the plugin's multipath devices
//! run against real SPDK in `real_spdk.rs`).

mod common;

multipath_scenario_tests!(csi, Some(common::Source::Emulator));
