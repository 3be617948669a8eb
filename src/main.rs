//! The `snap-csi` binary. Each subcommand is a thin shell over the library.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use snap_csi::host::Sysfs;
use snap_csi::jsonrpc::RpcClient;

/// `--version` and the start line: the crate's version and the commit it
/// was built from (build.rs), so that an image says what it runs.
const VERSION: &str = env!("SNAP_CSI_VERSION");

#[derive(Debug, Parser)]
#[command(
    name = "snap-csi",
    version = VERSION,
    // `snap-csi node --version` too: an image's command may name the service.
    propagate_version = true,
    about = "CSI driver for BlueField DPU storage (SNAP)"
)]
struct Cli {
    /// Log line format for the long-running services (filter: RUST_LOG, default info).
    #[arg(long, global = true, env = "SNAP_CSI_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// How log lines look: text for people, JSON for log collectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the CSI Identity and Node services (DPU attach co-located, or
    /// through the DPU agent with --dpu-endpoint).
    // Boxed: the node has the most flags by far, and parsing holds them once.
    Node(Box<snap_csi::node::NodeArgs>),
    /// Serve the DPU attach layer to one host over mutual TLS (on the DPU,
    /// beside SNAP and the vendor plugin: split mode).
    DpuAgent(snap_csi::agent::AgentArgs),
    /// Serve CSI Identity, Controller, GroupController and VolumeGroup by
    /// forwarding every call to the vendor's CSI controller.
    Controller(snap_csi::controller::ControllerArgs),
    /// Call one SPDK/SNAP JSON-RPC method and print its result, like SPDK's rpc.py.
    Rpc {
        /// The SPDK/SNAP RPC socket.
        #[arg(
            long,
            short = 's',
            env = "SNAP_RPC_SOCKET",
            default_value = "/var/tmp/spdk.sock"
        )]
        socket: PathBuf,
        /// Seconds to wait for the reply.
        #[arg(long, short = 't', default_value = "30", value_parser = snap_csi::settings::parse_seconds)]
        timeout: Duration,
        /// Method name, e.g. `bdev_get_bdevs`.
        method: String,
        /// Params as a JSON object, e.g. '{"name":"Malloc0"}'. Omit for none.
        params: Option<String>,
    },
    /// Find the block device an emulated PCI function carries and print its
    /// node, or whether the host shows a virtio-fs device's tag.
    FindDevice(FindDevice),
    /// Check a vendor plugin against the nvidia.storage.plugins.v1 API, call by call.
    PluginCheck(snap_csi::plugin_check::PluginCheckArgs),
}

#[derive(Debug, Args)]
struct FindDevice {
    /// sysfs root to search (the emulator's `--sysfs-root` off a DPU).
    #[arg(long, default_value = "/sys")]
    sysfs_root: PathBuf,
    /// Host PCI address of the function, with or without domain (`26:00.1`).
    #[arg(long, required_unless_present = "tag")]
    bdf: Option<String>,
    /// NVMe namespace id.
    #[arg(long, required_unless_present_any = ["serial", "tag"], conflicts_with = "tag")]
    nsid: Option<u32>,
    /// Expected NVMe namespace UUID.
    #[arg(long, requires = "nsid")]
    uuid: Option<String>,
    /// virtio-blk serial; with --nsid, the NVMe controller's serial that
    /// identifies a namespace the host lists no UUID for.
    #[arg(long, conflicts_with = "tag")]
    serial: Option<String>,
    /// virtio-fs tag: whether the host lists a device with it (Linux 6.9+).
    #[arg(long, conflicts_with = "bdf")]
    tag: Option<String>,
}

fn main() -> ExitCode {
    limit_malloc_arenas();
    match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime.block_on(run()),
        Err(e) => {
            eprintln!("starting the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// glibc gives each thread that allocates an arena of its own (up to eight
/// per core), and what one arena frees no other reuses: with tokio's workers
/// and its blocking pool, a node serving 256 volumes kept 2 MiB (co-located)
/// to 5 MiB (split) more resident than two arenas do, for no speed (issue
/// 21's bench). Set before any thread starts.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn limit_malloc_arenas() {
    // SAFETY: mallopt only sets one of glibc's malloc tunables, and no other
    // thread exists yet to allocate meanwhile.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn limit_malloc_arenas() {}

async fn run() -> ExitCode {
    let cli = Cli::parse();
    let format = cli.log_format;
    match cli.command {
        Command::Node(args) => {
            service(format, "node service", args.resolve(), snap_csi::node::run).await
        }
        Command::DpuAgent(args) => {
            service(format, "DPU agent", args.resolve(), snap_csi::agent::run).await
        }
        Command::Controller(args) => {
            service(
                format,
                "controller proxy",
                args.resolve(),
                snap_csi::controller::run,
            )
            .await
        }
        Command::Rpc {
            socket,
            timeout,
            method,
            params,
        } => rpc(socket, timeout, &method, params.as_deref()).await,
        Command::FindDevice(args) => find_device(&args),
        Command::PluginCheck(args) => snap_csi::plugin_check::run_cli(&args).await,
    }
}

/// Logs to stderr at `RUST_LOG`'s levels, `info` by default.
fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colour codes only for a person watching, not in a collected log.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        );
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
}

/// Runs a long-lived service (`node`, `dpu-agent`, `controller`) until SIGTERM or SIGINT,
/// with the exit codes of both: 2 for bad settings, 1 for a failure. It
/// starts by logging one line with the build and every setting in force.
async fn service<C, E, Fut>(
    format: LogFormat,
    what: &str,
    config: Result<C, E>,
    run: impl FnOnce(C, Pin<Box<dyn Future<Output = ()> + Send>>) -> Fut,
) -> ExitCode
where
    C: std::fmt::Debug,
    E: std::fmt::Display,
    Fut: Future<Output = anyhow::Result<()>>,
{
    init_logging(format);
    let config = match config {
        Ok(config) => config,
        Err(e) => {
            eprintln!("configuration: {e}");
            return ExitCode::from(2);
        }
    };
    // What a user reading the logs needs first: which build this is, and the
    // settings after defaults, config file, environment and flags. They hold
    // no secret (TLS keys are named by path); a config that ever does must
    // redact it in its Debug.
    tracing::info!(version = VERSION, config = ?config, "starting {what}");
    match run(config, Box::pin(snap_csi::server::termination())).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{what} failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn find_device(args: &FindDevice) -> ExitCode {
    let sysfs = Sysfs::new(&args.sysfs_root);
    let bdf = args.bdf.as_deref().unwrap_or_default();
    let found = match (&args.serial, args.nsid, &args.tag) {
        (_, _, Some(tag)) => return find_tag(&sysfs, tag),
        (serial, Some(nsid), None) => {
            sysfs.find_nvme_namespace(bdf, nsid, args.uuid.as_deref(), serial.as_deref())
        }
        (Some(serial), None, None) => sysfs.find_virtio_blk(bdf, serial),
        (None, None, None) => {
            eprintln!("give --nsid (NVMe), --serial (virtio-blk) or --tag (virtio-fs)");
            return ExitCode::from(2);
        }
    };
    match found {
        Ok(Some(device)) => {
            println!(
                "{} {} {}:{} {}",
                device.node.display(),
                device.name,
                device.major,
                device.minor,
                device.size_bytes
            );
            ExitCode::SUCCESS
        }
        Ok(None) => {
            eprintln!("no ready device under {bdf} for that function");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// Prints whether the host lists a virtio-fs device with `tag`: exit 0 when
/// it does, 1 when it does not, 3 when it keeps no list (only a mount tells).
fn find_tag(sysfs: &Sysfs, tag: &str) -> ExitCode {
    match sysfs.virtio_fs_tag_shown(tag) {
        Ok(Some(true)) => {
            println!("virtio-fs tag {tag} is shown");
            ExitCode::SUCCESS
        }
        Ok(Some(false)) => {
            eprintln!("the host shows no virtio-fs device with tag {tag}");
            ExitCode::FAILURE
        }
        Ok(None) => {
            eprintln!(
                "the host lists no virtio-fs tags (no {}/fs/virtiofs): only a mount can tell",
                sysfs.root().display()
            );
            ExitCode::from(3)
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn rpc(socket: PathBuf, timeout: Duration, method: &str, params: Option<&str>) -> ExitCode {
    let params: Option<serde_json::Value> = match params.map(serde_json::from_str).transpose() {
        Ok(params) => params,
        Err(e) => {
            eprintln!("params are not valid JSON: {e}");
            return ExitCode::from(2);
        }
    };
    let client = RpcClient::new(socket);
    let deadline = tokio::time::Instant::now() + timeout;
    match client.call_raw(method, params.as_ref(), deadline).await {
        Ok(result) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&result).unwrap_or_else(|_| result.to_string())
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
