//! The NVMe-oF backend: the DPU's SNAP emulator attaches, over real TCP, to a
//! second emulator playing the remote SPDK target that exports the volume
//! (see `common/plugin_scenarios.rs`).

mod common;

plugin_scenario_tests!(nvmf, Some(common::Source::Emulator));
