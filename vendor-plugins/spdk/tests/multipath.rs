//! Two paths to every remote volume on the emulator: the CSI controller's
//! target listening on two ports, volume contexts with every path, bad path
//! lists refused, and the plugin's multipath devices failing over under the
//! emulated host's I/O, when a listener goes and when a path goes silent
//! (as root: the host's disk is a loop device, the silent cut an nftables
//! table; see `common/multipath.rs`, which `real_spdk.rs` runs against real
//! SPDK).

mod common;

multipath_scenario_tests!(csi, Some(common::Source::Emulator));
multipath_scenario_tests!(plugin, Some(common::Source::Emulator));
multipath_scenario_tests!(silent, Some(common::Source::Emulator));
