//! `snap-csi-guest`: a real Linux kernel as the BlueField host, for the
//! scripts (`hack/local-up.sh --host vm`), as the tests boot it
//! (`snap_csi_harness::guest`).
//!
//! `boot` boots the guest with a link to this machine, prints what the DPU
//! side needs (lines `KEY=value`, then `READY`) and stays in the
//! foreground until SIGINT or SIGTERM, which end QEMU and remove the link.
//! Meanwhile it relays commands to the guest's shell from `exec`, one at a
//! time, over a UNIX socket (the guest's agent has one port, held here).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Context;
use clap::{Parser, Subcommand};
use nix::sys::signal::{SigSet, Signal};
use snap_csi_harness::guest::{Guest, GuestSpec, Link, exec, script_of_line};

#[derive(Debug, Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Boot a guest host and serve until SIGINT or SIGTERM. Prints
    /// GUEST_KERNEL= (its `uname -r`), GUEST_ACCEL= (kvm or tcg: how QEMU
    /// runs it), GUEST_QMP= (the monitor to hot-plug
    /// through: snap-emu --guest-qmp), GUEST_PORTS= (its root ports as
    /// ID:BUS, comma-separated: snap-emu --guest-port), GUEST_ADDRESS= (the
    /// guest's end of the link), GUEST_LINK= (this machine's end: where a
    /// DPU agent listens for it), GUEST_EXEC= (the socket `exec` takes),
    /// then READY.
    Boot {
        /// Where the command socket goes (created if missing).
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value = "bf-host")]
        hostname: String,
        /// Boot with `nvme_core.multipath=N` (the kernel's default is Y).
        #[arg(long)]
        no_native_multipath: bool,
        #[arg(long, default_value_t = 512)]
        memory_mib: u32,
    },
    /// Run a shell script in the guest: its stdout and stderr here, its exit
    /// status as this command's.
    Exec {
        /// The GUEST_EXEC socket `boot` printed.
        #[arg(long)]
        socket: PathBuf,
        script: String,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Boot {
            dir,
            hostname,
            no_native_multipath,
            memory_mib,
        } => {
            let mut spec = GuestSpec::new(&hostname);
            spec.native_multipath = !no_native_multipath;
            spec.memory_mib = memory_mib;
            match boot(&spec, dir) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("snap-csi-guest: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Exec { socket, script } => match exec(&socket, &script) {
            Ok(output) => {
                print!("{}", output.stdout);
                eprint!("{}", output.stderr);
                ExitCode::from(u8::try_from(output.status).unwrap_or(1))
            }
            Err(e) => {
                eprintln!("snap-csi-guest: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

fn boot(spec: &GuestSpec, dir: PathBuf) -> anyhow::Result<()> {
    // Blocked before any thread starts, so every thread inherits the mask
    // and only `sigwait` below receives them.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGTERM);
    signals.thread_block()?;

    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let socket = dir.join("exec.sock");
    let _ = std::fs::remove_file(&socket);
    let listener =
        UnixListener::bind(&socket).with_context(|| format!("binding {}", socket.display()))?;

    let link = Link::new()?;
    let mut spec = spec.clone();
    spec.link = Some((link.tap.clone(), link.guest));
    let guest = Guest::boot(&spec)?;
    let (qmp, ports) = guest.hotplug_monitor(1);
    let ports: Vec<String> = ports
        .iter()
        .map(|(id, bus)| format!("{id}:{bus:02x}"))
        .collect();
    println!("GUEST_KERNEL={}", guest.release);
    println!("GUEST_ACCEL={}", guest.accel.name());
    println!("GUEST_QMP={}", qmp.display());
    println!("GUEST_PORTS={}", ports.join(","));
    println!("GUEST_ADDRESS={}", link.guest);
    println!("GUEST_LINK={}", link.host);
    println!("GUEST_EXEC={}", socket.display());
    println!("READY");
    std::io::stdout().flush()?;

    let guest = Arc::new(Mutex::new(Some(guest)));
    let serving = Arc::clone(&guest);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut guest = serving.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(guest) = guest.as_mut() else { return };
            if let Err(e) = relay(guest, stream) {
                eprintln!("snap-csi-guest: a command: {e:#}");
            }
        }
    });
    signals.wait()?;
    // QEMU ends with the guest, then the link goes.
    drop(guest.lock().unwrap_or_else(PoisonError::into_inner).take());
    drop(link);
    let _ = std::fs::remove_file(&socket);
    Ok(())
}

/// One command from `exec`: its script line in, the agent's answer out.
fn relay(guest: &mut Guest, stream: UnixStream) -> anyhow::Result<()> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let script = script_of_line(&line)?;
    let output = guest.run(&script)?;
    reader.get_mut().write_all(output.to_line().as_bytes())?;
    Ok(())
}
