//! A host with several DPUs seen from outside, as a user would check it:
//! which DPU the node's record puts a staged volume on, which one the node
//! puts a new volume on while all serve, what a DPU's SNAP and plugin hold
//! of a volume, and a DPU's process stopped (SIGSTOP) until dropped: a DPU
//! that stops answering without going away.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use snap_csi::dpu::DpuAttach;
use snap_csi::dpu::colocated::Colocated;
use snap_csi::dpu::names::VolumeNames;
use snap_csi::json_dir::JsonDir;
use snap_csi::node::Fleet;
use snap_csi::node::records::VolumeRecord;
use snap_csi::proto::nvidia::storage::plugins::v1 as plugins;
use tokio::time::Instant;

use crate::csi::channel;

/// The node's record of a staged volume (`None`: not staged), from its
/// state directory (`--state-dir`).
pub fn record(state_dir: &Path, volume_id: &str) -> anyhow::Result<Option<VolumeRecord>> {
    // Read as another process's: a temp file there is the node's write in flight.
    JsonDir::of_another(state_dir.join("volumes"))
        .load(volume_id)
        .with_context(|| format!("reading the node's record of {volume_id}"))
}

/// The DPU the node's record of the staged volume names (a record without
/// one is an older node's: the first of `dpus`), with the record.
pub fn recorded_on(
    state_dir: &Path,
    volume_id: &str,
    dpus: &[String],
) -> anyhow::Result<(String, VolumeRecord)> {
    let record = record(state_dir, volume_id)?
        .with_context(|| format!("the node has no record of staged volume {volume_id}"))?;
    let dpu = match &record.dpu {
        Some(dpu) => dpu.clone(),
        None => dpus.first().context("no DPU named")?.clone(),
    };
    Ok((dpu, record))
}

/// The DPU the node puts a new volume on while all of `dpus` (in the node's
/// order) serve: [`Fleet::first_choice`]. Inside a Tokio runtime (an
/// attach layer makes its lazy channel there).
pub fn first_choice(dpus: &[String], volume_id: &str) -> anyhow::Result<String> {
    let mut members = Vec::new();
    for (domain, name) in dpus.iter().enumerate() {
        // The choice reads the names alone: these attach layers are never
        // called (one connects only when first used).
        let unused: Arc<dyn DpuAttach> = Arc::new(Colocated::new("/nonexistent", ""));
        members.push((name.clone(), u16::try_from(domain)?, unused));
    }
    anyhow::ensure!(!members.is_empty(), "no DPU named");
    Ok(Fleet::new(members).first_choice(volume_id).to_string())
}

/// What the DPU whose plugin listens at `plugin_socket` (and whose SNAP at
/// `snap_socket`) holds of the volume, one line each: SNAP's exposures under
/// the names derived from its id, and the plugin's devices of it. Empty:
/// nothing.
pub async fn held(
    plugin_socket: &Path,
    snap_socket: &Path,
    volume_id: &str,
    deadline: Instant,
) -> anyhow::Result<Vec<String>> {
    let dpu = Colocated::new(plugin_socket, snap_socket.display().to_string());
    let inventory = dpu
        .inventory(deadline)
        .await
        .with_context(|| format!("the inventory of {}", snap_socket.display()))?;
    let names = VolumeNames::new(volume_id);
    let mut held: Vec<String> = inventory
        .volumes
        .iter()
        .filter(|v| names.keys().contains(&v.key.as_str()))
        .map(|v| format!("SNAP exposes it ({:?} {})", v.emulation, v.key))
        .collect();
    let mut plugin = plugins::storage_plugin_service_client::StoragePluginServiceClient::new(
        channel(&format!("unix://{}", plugin_socket.display())).await?,
    );
    let devices = plugin
        .list_devices(plugins::ListDevicesRequest::default())
        .await
        .with_context(|| format!("ListDevices of the plugin at {}", plugin_socket.display()))?
        .into_inner()
        .entries;
    held.extend(
        devices
            .iter()
            .filter(|d| d.volume_id == volume_id)
            .map(|d| format!("the plugin holds its device {}", d.device_name)),
    );
    Ok(held)
}

/// The one running process whose program (its `argv[0]`'s file name) is
/// `program` and whose arguments hold `args` in a row: a stack's process
/// found by what local-up printed of it (a socket, an address). A program of
/// another architecture runs under qemu-user (local-up --dpu-arch), whose
/// command line is the emulator's, then the program's: its program is the
/// first argument after the emulator's options that names it.
pub fn process(program: &str, args: &[&str]) -> anyhow::Result<Pid> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").context("listing /proc")? {
        let entry = entry?;
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        // A process gone meanwhile has no command line: not the one.
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if runs(&cmdline, program, args) {
            found.push(pid);
        }
    }
    match found[..] {
        [pid] => Ok(Pid::from_raw(pid)),
        [] => bail!("no {program} process runs with {args:?}"),
        _ => bail!("several {program} processes run with {args:?}: {found:?}"),
    }
}

/// Whether a command line (`/proc/PID/cmdline`: NUL-separated) runs
/// `program` with `args` in a row among its arguments; see [`process`].
fn runs(cmdline: &[u8], program: &str, args: &[&str]) -> bool {
    let argv: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let name =
        |arg: &[u8]| Path::new(OsStr::from_bytes(arg)).file_name() == Some(OsStr::new(program));
    let emulated = argv
        .first()
        .and_then(|a| Path::new(OsStr::from_bytes(a)).file_name())
        .is_some_and(|n| n.as_bytes().starts_with(b"qemu-"));
    let at = if emulated {
        argv.iter().position(|a| name(a))
    } else {
        argv.first().is_some_and(|a| name(a)).then_some(0)
    };
    let Some(rest) = at.map(|i| &argv[i + 1..]) else {
        return false;
    };
    // windows(0) panics; no arguments asked for is held by any process.
    args.is_empty()
        || rest.windows(args.len()).any(|w| {
            w.iter()
                .zip(args)
                .all(|(have, want)| *have == want.as_bytes())
        })
}

/// A process stopped (SIGSTOP) until this is dropped (SIGCONT), so that no
/// way out of the caller, an error included, leaves it stopped.
#[derive(Debug)]
pub struct Stopped(Pid);

impl Stopped {
    pub fn new(pid: Pid) -> anyhow::Result<Stopped> {
        kill(pid, Signal::SIGSTOP).with_context(|| format!("SIGSTOP to {pid}"))?;
        Ok(Stopped(pid))
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGCONT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_choice_is_the_nodes() {
        let two = ["bf3-a".to_string(), "bf3-b".to_string()];
        let on_a = (0..1000)
            .filter(|i| first_choice(&two, &format!("pvc-{i}")).unwrap() == "bf3-a")
            .count();
        assert!((430..=570).contains(&on_a), "{on_a} of 1000 on bf3-a");
        assert_eq!(first_choice(&two[..1], "pvc-0").unwrap(), "bf3-a");
        assert!(first_choice(&[], "pvc-0").is_err());
    }

    #[test]
    fn a_program_under_qemu_user_is_found_after_the_emulators_options() {
        let line = |argv: &[&str]| argv.iter().map(|a| format!("{a}\0")).collect::<String>();
        let agent = ["/t/snap-csi", "dpu-agent", "--listen", "https://a:1"];
        let emulated = [
            &[
                "/usr/bin/qemu-aarch64-static",
                "-L",
                "/usr/aarch64-linux-gnu",
            ][..],
            &agent,
        ]
        .concat();
        for argv in [&agent[..], &emulated] {
            let cmdline = line(argv);
            assert!(
                runs(cmdline.as_bytes(), "snap-csi", &["--listen", "https://a:1"]),
                "{argv:?}"
            );
            assert!(
                !runs(cmdline.as_bytes(), "snap-csi", &["--listen", "https://b:1"]),
                "{argv:?}"
            );
            assert!(!runs(cmdline.as_bytes(), "snap-emu", &[]), "{argv:?}");
        }
        // Not the emulator: a program is its argv[0], not an argument naming it.
        let editor = line(&["/usr/bin/vi", "/t/snap-csi", "--listen", "https://a:1"]);
        assert!(!runs(
            editor.as_bytes(),
            "snap-csi",
            &["--listen", "https://a:1"]
        ));
    }

    #[test]
    fn a_process_is_found_by_its_program_and_arguments() {
        let mut child = std::process::Command::new("sleep")
            .arg("3600.125")
            .spawn()
            .unwrap();
        // Until the child has exec'd, its command line is this test's.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let found = loop {
            match process("sleep", &["3600.125"]) {
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                found => break found,
            }
        };
        let none = process("sleep", &["3600.125", "more"]);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(found.unwrap().as_raw(), child.id() as i32);
        assert!(none.is_err());
    }
}
