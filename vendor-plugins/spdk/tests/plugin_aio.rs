//! The plugin over real gRPC against the SNAP emulator, AIO backend (see
//! `common/plugin_scenarios.rs` for what each test checks).

mod common;

plugin_scenario_tests!(aio, Some(common::Source::Emulator));
