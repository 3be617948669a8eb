//! The sample plugin passes `snap-csi plugin-check`, the conformance checker
//! vendors run on theirs, with the AIO backend on the emulator (see
//! `common/plugin_scenarios.rs`).

mod common;

plugin_scenario_tests!(check, Some(common::Source::Emulator));
