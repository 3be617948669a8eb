//! One running copy of the whole stack: `hack/local-up.sh` as a child
//! process, its endpoints parsed from what it prints, and everything it
//! made removed again when it is stopped or dropped. Co-located, or split:
//! the node reaching a DPU agent in a network namespace of its own over
//! mutual TLS (`--mode split`); a host with one DPU, or two (`--dpus 2`).
//!
//! std's `Child` (not tokio's) so that `Drop` can stop the stack on any path
//! out of the program, an error or Ctrl-C included: a leaked stack leaves
//! loop devices and mounts behind.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How the stack is started.
#[derive(Debug, Clone, Default)]
pub struct StackOptions {
    /// The DPU emulator's RPC poller period (0: answer at once).
    pub poll_period_us: u64,
    /// NVMe PFs and VFs per PF of the DPU emulator; `None` keeps its default.
    pub nvme_functions: Option<(u32, u32)>,
    /// Split mode: the DPU attach layer behind a DPU agent.
    pub split: bool,
    /// local-up restarts every process that exits (`--supervise`), and says
    /// which process runs now in `pids/NAME` ([`Stack::pid`]).
    pub supervise: bool,
    /// The node's `--namespaces-per-controller` (packed placement); `None`
    /// keeps its default.
    pub namespaces_per_controller: Option<u32>,
    /// The DPU emulator's `--data-path` (`auto`, `fuse`, `direct`); `None`
    /// keeps its default.
    pub data_path: Option<&'static str>,
    /// A host with two DPUs (`--dpus 2`): [`Stack::dpus`] names both.
    pub two_dpus: bool,
    /// The host a QEMU guest (`--host vm`, split mode; its directory must
    /// be one the guest sees): [`Stack::guest`].
    pub guest_host: bool,
}

/// A stack that `hack/local-up.sh` started and printed READY for.
#[derive(Debug)]
pub struct Stack {
    pub name: String,
    pub dir: PathBuf,
    pub controller: String,
    pub node: String,
    pub kubelet: PathBuf,
    pub node_metrics: String,
    pub controller_metrics: String,
    pub plugin_metrics: String,
    /// With [`StackOptions::two_dpus`]: the second DPU's plugin's page.
    pub plugin_metrics_b: String,
    /// The host's DPUs, as the node's topology keys name them: `local-dpu`,
    /// then with [`StackOptions::two_dpus`] `local-dpu-b`.
    pub dpus: Vec<String>,
    /// Split mode only: the DPU agent's link, metrics and network namespace.
    pub split: Option<SplitLink>,
    /// Split mode with two DPUs: the second DPU's agent.
    pub split_b: Option<SplitLink>,
    /// With [`StackOptions::guest_host`]: the guest.
    pub guest: Option<GuestHost>,
    local_up: Option<Child>,
    /// Held so that local-up never writes into a closed pipe.
    _stdout: Option<ChildStdout>,
    stderr_path: PathBuf,
    /// A node the caller started in place of local-up's (the bench's restart
    /// test); it is not local-up's child, so it is stopped here, before the
    /// stack.
    replacement_node: Option<Child>,
}

/// What local-up printed about a split stack's link (one per DPU).
#[derive(Debug, Default)]
pub struct SplitLink {
    /// `https://ADDR:PORT`, as the node's `--dpu-endpoint` and the agent's `--listen`.
    pub endpoint: String,
    pub metrics: String,
    /// The agent's network namespace; the veth pair's ends carry its name.
    pub netns: String,
}

/// What local-up printed about a guest host (`--host vm`).
#[derive(Debug, Default)]
pub struct GuestHost {
    /// Its kernel's `uname -r`.
    pub kernel: String,
    /// Its end of the link to this machine.
    pub address: String,
    /// `snap-csi-guest exec`'s socket: commands in the guest.
    pub exec: PathBuf,
}

/// One DPU of the stack's host as local-up lays it out: the first, or with
/// `--dpus 2` the second, whose sockets and processes carry `-b`.
#[derive(Debug, Clone)]
pub struct DpuParts {
    /// As [`Stack::dpus`] names it (the node's records and topology keys).
    pub name: String,
    /// Its SNAP emulator's JSON-RPC socket.
    pub snap_socket: PathBuf,
    /// Its vendor plugin's plugins.v1 socket.
    pub plugin_socket: PathBuf,
    /// Its vendor plugin's Prometheus page.
    pub plugin_metrics: String,
    /// Its SNAP emulator's state directory (the host side's loop device
    /// records, the data path's FUSE mount below `host/`).
    pub snap_dir: PathBuf,
    suffix: &'static str,
}

impl DpuParts {
    /// local-up's name for this DPU's `snap`, `plugin` or `agent` (its pid
    /// file under `--supervise`, its log).
    pub fn process(&self, base: &str) -> String {
        format!("{base}{}", self.suffix)
    }
}

/// What stopping a stack found left behind (empty: nothing).
#[derive(Debug, Default)]
pub struct Leftovers(pub Vec<String>);

impl Stack {
    /// Starts local-up in `dir` (which must not exist yet) and waits for READY.
    pub async fn start(
        name: &str,
        local_up: &Path,
        profile: &str,
        dir: PathBuf,
        logs: &Path,
        options: &StackOptions,
    ) -> anyhow::Result<Stack> {
        let stderr_path = logs.join(format!("local-up-{name}.err"));
        let stderr = File::create(&stderr_path)?;
        let mut command = Command::new(local_up);
        command.args(["--no-build", "--profile", profile]);
        if options.guest_host {
            command.args(["--host", "vm"]);
        } else {
            command.arg("--allow-node-restart");
        }
        command
            .arg("--dir")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr);
        if let Some(n) = options.namespaces_per_controller {
            // local-up has no option for it; the node reads its environment.
            command.env("SNAP_CSI_NAMESPACES_PER_CONTROLLER", n.to_string());
        }
        if options.poll_period_us > 0 {
            command.args([
                "--snap-poll-period-us".to_string(),
                options.poll_period_us.to_string(),
            ]);
        }
        if options.split {
            command.args(["--mode", "split"]);
        }
        if options.supervise {
            command.arg("--supervise");
        }
        if options.two_dpus {
            command.args(["--dpus", "2"]);
        }
        if let Some(mode) = options.data_path {
            command.args(["--snap-data-path", mode]);
        }
        if let Some((pfs, vfs)) = options.nvme_functions {
            command.args([
                "--snap-nvme-pfs".to_string(),
                pfs.to_string(),
                "--snap-nvme-vfs-per-pf".to_string(),
                vfs.to_string(),
            ]);
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {}", local_up.display()))?;
        let stdout = child.stdout.take().context("local-up's stdout")?;
        let mut stack = Stack {
            name: name.to_string(),
            dir,
            controller: String::new(),
            node: String::new(),
            kubelet: PathBuf::new(),
            node_metrics: String::new(),
            controller_metrics: String::new(),
            plugin_metrics: String::new(),
            plugin_metrics_b: String::new(),
            dpus: Vec::new(),
            split: None,
            split_b: None,
            guest: None,
            local_up: Some(child),
            _stdout: None,
            stderr_path,
            replacement_node: None,
        };
        // A blocking read of the pipe; if local-up hangs, the timeout drops
        // the stack, which kills local-up, which closes the pipe.
        let reading = tokio::task::spawn_blocking(move || read_until_ready(stdout));
        let (lines, stdout) = match tokio::time::timeout(Duration::from_secs(300), reading).await {
            Ok(read) => read?.map_err(|e| stack.explain(e))?,
            Err(_) => return Err(stack.explain(anyhow::anyhow!("no READY within 300 s"))),
        };
        stack._stdout = Some(stdout);
        let printed = Printed::parse(&lines);
        stack.controller = printed.controller;
        stack.node = printed.node;
        stack.kubelet = printed.kubelet;
        stack.node_metrics = printed.node_metrics;
        stack.controller_metrics = printed.controller_metrics;
        stack.plugin_metrics = printed.plugin_metrics;
        stack.plugin_metrics_b = printed.plugin_metrics_b;
        stack.dpus = printed.dpus;
        let links = [printed.link, printed.link_b];
        let wanted = if options.two_dpus { 2 } else { 1 };
        if options.split && !links[..wanted].iter().all(SplitLink::is_printed) {
            return Err(stack.explain(anyhow::anyhow!(
                "local-up --mode split printed READY without each agent's endpoint, metrics and namespace"
            )));
        }
        if stack.dpus.len() != wanted {
            return Err(stack.explain(anyhow::anyhow!(
                "local-up printed DPUS={:?}, not {wanted} DPU names",
                stack.dpus.join(",")
            )));
        }
        if options.guest_host && printed.guest.exec.as_os_str().is_empty() {
            return Err(stack.explain(anyhow::anyhow!(
                "local-up --host vm printed READY without the guest's command socket"
            )));
        }
        stack.guest = options.guest_host.then_some(printed.guest);
        let [link, link_b] = links;
        stack.split = options.split.then_some(link);
        stack.split_b = (options.split && options.two_dpus).then_some(link_b);
        if stack.node.is_empty() || stack.controller.is_empty() || stack.node_metrics.is_empty() {
            return Err(stack.explain(anyhow::anyhow!(
                "local-up printed READY without all endpoints"
            )));
        }
        Ok(stack)
    }

    /// The DPU emulator's JSON-RPC socket (local-up's layout).
    pub fn snap_socket(&self) -> PathBuf {
        self.dir.join("snap.sock")
    }

    /// The NVMe-oF target emulator's JSON-RPC socket (local-up's layout).
    pub fn target_socket(&self) -> PathBuf {
        self.dir.join("target.sock")
    }

    /// The sample plugin's plugins.v1 socket (local-up's layout).
    pub fn plugin_socket(&self) -> PathBuf {
        self.dir.join("plugin.sock")
    }

    /// The node's state directory (its `--state-dir`: the volume records
    /// below `volumes/`; local-up's layout).
    pub fn node_state_dir(&self) -> PathBuf {
        self.dir.join("node-state")
    }

    /// The host's DPUs ([`Stack::dpus`]), in order, with their parts.
    pub fn dpu_parts(&self) -> Vec<DpuParts> {
        self.dpus
            .iter()
            .zip([("", &self.plugin_metrics), ("-b", &self.plugin_metrics_b)])
            .map(|(name, (suffix, plugin_metrics))| DpuParts {
                name: name.clone(),
                snap_socket: self.dir.join(format!("snap{suffix}.sock")),
                plugin_socket: self.dir.join(format!("plugin{suffix}.sock")),
                plugin_metrics: plugin_metrics.clone(),
                snap_dir: self.dir.join(format!("snap{suffix}")),
                suffix,
            })
            .collect()
    }

    /// The process that runs as local-up's `name` (`node`, `plugin`, `snap`,
    /// `agent`, ...) now; only with [`StackOptions::supervise`].
    pub fn pid(&self, name: &str) -> anyhow::Result<Pid> {
        read_pid(&self.dir, name)
    }

    /// The node's CSI socket path.
    pub fn node_socket(&self) -> PathBuf {
        PathBuf::from(self.node.trim_start_matches("unix://"))
    }

    /// The controller proxy's CSI socket path.
    pub fn controller_socket(&self) -> PathBuf {
        PathBuf::from(self.controller.trim_start_matches("unix://"))
    }

    /// Takes over a node the caller started; it is stopped before the stack.
    pub fn adopt_node(&mut self, child: Child) {
        if let Some(mut old) = self.replacement_node.replace(child) {
            stop_child(&mut old, Duration::from_secs(60));
        }
    }

    fn explain(&mut self, error: anyhow::Error) -> anyhow::Error {
        self.shutdown();
        let tail = std::fs::read_to_string(&self.stderr_path)
            .map(|s| {
                let lines: Vec<&str> = s.lines().collect();
                lines[lines.len().saturating_sub(30)..].join("\n")
            })
            .unwrap_or_default();
        error.context(format!("stack {}: local-up said:\n{tail}", self.name))
    }

    /// SIGTERM to the caller's own node, then to local-up, waiting for each.
    /// The processes' logs are copied beside local-up's stderr first: local-up
    /// removes its directory, and a failed run keeps the caller's.
    fn shutdown(&mut self) {
        if let Some(mut node) = self.replacement_node.take() {
            stop_child(&mut node, Duration::from_secs(60));
        }
        if let Some(mut child) = self.local_up.take() {
            self.copy_logs();
            stop_child(&mut child, Duration::from_secs(120));
        }
    }

    /// Best effort: a log that cannot be copied is not worth failing a stop.
    fn copy_logs(&self) {
        let Some(beside) = self.stderr_path.parent() else {
            return;
        };
        let to = beside.join(format!("logs-{}", self.name));
        let Ok(entries) = std::fs::read_dir(self.dir.join("logs")) else {
            return;
        };
        if std::fs::create_dir_all(&to).is_err() {
            return;
        }
        for entry in entries.flatten() {
            let _ = std::fs::copy(entry.path(), to.join(entry.file_name()));
        }
    }

    /// Stops the stack and says what, if anything, it left behind: loop
    /// devices on its files, mounts below its directory, the directory, and
    /// in split mode its network namespace and veth pair.
    pub fn stop(mut self) -> Leftovers {
        self.shutdown();
        // Below the directory: `stack-c` must not match a twin's `stack-c-split`.
        let dir = format!("{}/", self.dir.display());
        let mut left = Vec::new();
        match Command::new("losetup").arg("-a").output() {
            Ok(out) => left.extend(
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter(|l| l.contains(&dir))
                    .map(|l| format!("loop device: {l}")),
            ),
            Err(e) => left.push(format!("cannot run losetup -a: {e}")),
        }
        match std::fs::read_to_string("/proc/self/mountinfo") {
            Ok(table) => left.extend(
                table
                    .lines()
                    .filter(|l| l.contains(&dir))
                    .map(|l| format!("mount: {l}")),
            ),
            Err(e) => left.push(format!("cannot read the mount table: {e}")),
        }
        if self.dir.exists() {
            left.push(format!("directory: {}", self.dir.display()));
        }
        if let Some(guest) = &self.guest {
            // The guest's tap holds this machine's end of its /30.
            match Command::new("ip")
                .args(["-4", "-o", "addr", "show", "to"])
                .arg(format!("{}/30", guest.address))
                .output()
            {
                Ok(out) => left.extend(
                    String::from_utf8_lossy(&out.stdout)
                        .lines()
                        .map(|l| format!("the guest's link: {l}")),
                ),
                Err(e) => left.push(format!("cannot run ip addr: {e}")),
            }
        }
        for link in self.split.iter().chain(&self.split_b) {
            // The pair's ends are named after the namespace.
            for (what, command) in [
                ("network namespace", &["netns", "list"][..]),
                ("link", &["-o", "link", "show"][..]),
            ] {
                match Command::new("ip").args(command).output() {
                    Ok(out) => left.extend(
                        String::from_utf8_lossy(&out.stdout)
                            .lines()
                            .filter(|l| l.contains(&link.netns))
                            .map(|l| format!("{what}: {l}")),
                    ),
                    Err(e) => left.push(format!("cannot run ip {}: {e}", command.join(" "))),
                }
            }
        }
        Leftovers(left)
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl SplitLink {
    fn is_printed(&self) -> bool {
        [&self.endpoint, &self.metrics, &self.netns]
            .iter()
            .all(|v| !v.is_empty())
    }
}

/// What local-up printed before READY (`KEY=VALUE` lines; other lines and
/// keys are ignored).
#[derive(Debug, Default)]
struct Printed {
    controller: String,
    node: String,
    kubelet: PathBuf,
    node_metrics: String,
    controller_metrics: String,
    plugin_metrics: String,
    plugin_metrics_b: String,
    dpus: Vec<String>,
    link: SplitLink,
    link_b: SplitLink,
    guest: GuestHost,
}

impl Printed {
    fn parse(lines: &[String]) -> Printed {
        let mut printed = Printed::default();
        for line in lines {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let value = value.to_string();
            match key {
                "CSI_CONTROLLER_ENDPOINT" => printed.controller = value,
                "CSI_NODE_ENDPOINT" => printed.node = value,
                "KUBELET_DIR" => printed.kubelet = value.into(),
                "NODE_METRICS" => printed.node_metrics = value,
                "CONTROLLER_METRICS" => printed.controller_metrics = value,
                "PLUGIN_METRICS" => printed.plugin_metrics = value,
                "PLUGIN_METRICS_B" => printed.plugin_metrics_b = value,
                "DPUS" => {
                    printed.dpus = value
                        .split(',')
                        .filter(|name| !name.is_empty())
                        .map(str::to_string)
                        .collect();
                }
                "DPU_AGENT_ENDPOINT" => printed.link.endpoint = value,
                "AGENT_METRICS" => printed.link.metrics = value,
                "DPU_NETNS" => printed.link.netns = value,
                "DPU_AGENT_ENDPOINT_B" => printed.link_b.endpoint = value,
                "AGENT_METRICS_B" => printed.link_b.metrics = value,
                "DPU_NETNS_B" => printed.link_b.netns = value,
                "GUEST_KERNEL" => printed.guest.kernel = value,
                "GUEST_ADDRESS" => printed.guest.address = value,
                "GUEST_EXEC" => printed.guest.exec = value.into(),
                _ => {}
            }
        }
        printed
    }
}

/// The pid local-up `--supervise` keeps for `name` in the stack at `dir`.
pub fn read_pid(dir: &Path, name: &str) -> anyhow::Result<Pid> {
    let path = dir.join("pids").join(name);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let pid = text
        .trim()
        .parse()
        .with_context(|| format!("{}: not a pid: {text:?}", path.display()))?;
    Ok(Pid::from_raw(pid))
}

fn read_until_ready(stdout: ChildStdout) -> anyhow::Result<(Vec<String>, ChildStdout)> {
    let mut reader = BufReader::new(stdout);
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            bail!("local-up exited before READY");
        }
        let line = line.trim_end().to_string();
        if line == "READY" {
            return Ok((lines, reader.into_inner()));
        }
        lines.push(line);
    }
}

/// SIGTERM, then wait up to `grace`, then SIGKILL: the processes a program
/// started must not outlive it.
pub fn stop_child(child: &mut Child, grace: Duration) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
    let started = Instant::now();
    while started.elapsed() < grace {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    eprintln!(
        "process {} did not stop within {grace:?}; killing it",
        child.id()
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_string).collect()
    }

    #[test]
    fn one_dpu_colocated() {
        let printed = Printed::parse(&lines(
            "CSI_CONTROLLER_ENDPOINT=unix:///s/controller.sock\n\
             CSI_NODE_ENDPOINT=unix:///s/node.sock\n\
             KUBELET_DIR=/s/kubelet\n\
             NODE_METRICS=http://127.0.0.1:22977/metrics\n\
             NVMF_TARGET_SOCKET=/s/target.sock\n\
             DPUS=local-dpu",
        ));
        assert_eq!(printed.node, "unix:///s/node.sock");
        assert_eq!(printed.kubelet, PathBuf::from("/s/kubelet"));
        assert_eq!(printed.dpus, ["local-dpu"]);
        assert!(!printed.link.is_printed() && !printed.link_b.is_printed());
    }

    /// As local-up --dpus 2 --mode split prints it (values abridged).
    #[test]
    fn two_dpus_split() {
        let printed = Printed::parse(&lines(
            "CSI_NODE_ENDPOINT=unix:///s/node.sock\n\
             DPU_AGENT_ENDPOINT=https://198.18.223.2:9830\n\
             AGENT_METRICS=http://198.18.223.2:9831/metrics\n\
             DPU_NETNS=snapcsi-53320a\n\
             DPU_VETH=snapcsi-53320ah\n\
             DPUS=local-dpu,local-dpu-b\n\
             SNAP_SOCKET_B=/s/snap-b.sock\n\
             PLUGIN_SOCKET_B=/s/plugin-b.sock\n\
             PLUGIN_METRICS_B=http://127.0.0.1:23001/metrics\n\
             DPU_AGENT_ENDPOINT_B=https://198.18.212.2:9830\n\
             AGENT_METRICS_B=http://198.18.212.2:9831/metrics\n\
             DPU_NETNS_B=snapcsi-459b9d\n\
             DPU_VETH_B=snapcsi-459b9dh",
        ));
        assert_eq!(printed.dpus, ["local-dpu", "local-dpu-b"]);
        assert_eq!(printed.plugin_metrics_b, "http://127.0.0.1:23001/metrics");
        assert_eq!(printed.link.endpoint, "https://198.18.223.2:9830");
        assert_eq!(printed.link.netns, "snapcsi-53320a");
        assert_eq!(printed.link_b.endpoint, "https://198.18.212.2:9830");
        assert_eq!(printed.link_b.metrics, "http://198.18.212.2:9831/metrics");
        assert_eq!(printed.link_b.netns, "snapcsi-459b9d");
        assert!(printed.link.is_printed() && printed.link_b.is_printed());
    }
}
