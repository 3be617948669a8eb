//! The `snap-csi-spdk-plugin` binary: flags, logging, signals; the rest is the library.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use snap_csi_spdk_plugin::config::{Args, LogFormat, VERSION};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colour codes only for a person watching, not in collected logs.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(filter);
    match args.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    let config = match args.resolve() {
        Ok(config) => config,
        Err(e) => {
            tracing::error!("configuration: {e}");
            return ExitCode::from(2);
        }
    };
    // What a user reading the logs needs first: which build this is, and the
    // settings from flags, environment and defaults (the plugin and, with
    // --csi-socket, the CSI controller). They hold no secret; a setting that
    // ever does must redact it in Config's Debug.
    tracing::info!(version = VERSION, config = ?config, "starting");
    match snap_csi_spdk_plugin::run(&config, snap_csi::server::termination()).await {
        Ok(()) => {
            tracing::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}
