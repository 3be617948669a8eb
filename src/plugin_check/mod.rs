//! `snap-csi plugin-check`: checks a vendor plugin against the text of the
//! `nvidia.storage.plugins.v1` API (`storage-plugins-v1-api.txt`).
//!
//! It speaks to the plugin only through that API, as SNAP's node driver and
//! our node do, and judges each answer by the sentence of the text that
//! governs it. Every FAIL quotes that sentence: the reader is the vendor's
//! engineer, who has the API text, not our code.
//!
//! It really creates devices, from the operator's `--volume-context`, under
//! volume ids `plugin-check-<random>[-...]` (so a run never touches a real
//! volume and two runs never collide), and deletes every one it made in a
//! final phase that runs whatever failed before it.
//!
//! What it does not prove: behaviour under concurrent calls, a retry after a
//! call that timed out half-way (its idempotency checks repeat calls that
//! completed), and that the device is usable inside SNAP.
//!
//! Each kind of device the plugin advertises is checked: block devices
//! (CREATE_DELETE_BLOCK_DEVICE, volume_mode "Block") by the device checks,
//! filesystem devices (CREATE_DELETE_FS_DEVICE, volume_mode "Filesystem") by
//! `fs-device`; a plugin of one kind must refuse a CreateDevice of the other.

mod calls;
mod checker;
mod config;
mod device;
mod filesystem;
mod identity;
mod listing;
mod report;
mod show;
mod text;
mod unimplemented;

pub use checker::run;
pub use config::{CheckError, Config, PluginCheckArgs, parse_endpoint};
pub use report::{CheckResult, Report, Verdict, checks};

use std::process::ExitCode;

/// The subcommand: prints each result as it comes, then the summary; exits 1
/// when a check failed and 2 when the run could not start.
pub async fn run_cli(args: &PluginCheckArgs) -> ExitCode {
    let report = match args.resolve() {
        Ok(config) => run(&config, &mut |result| println!("{result}")).await,
        Err(e) => Err(e),
    };
    match report {
        Ok(report) => {
            println!("{}", report.summary());
            if report.failed() == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("plugin-check: {e}");
            ExitCode::from(2)
        }
    }
}
