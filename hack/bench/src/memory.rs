//! Section 5: the node's and the proxy's memory (peak RSS, VmHWM), in split
//! mode the DPU agent's, and how long a restarted node takes to answer
//! Probe ready with many volumes staged.
//!
//! local-up runs the node, the proxy and the agent; the bench finds them by
//! their command lines (the binary `snap-csi`, the subcommand, and
//! `--endpoint` naming this stack's socket, or the agent's `--listen`
//! naming its address), so no other process can be mistaken for them. The
//! restart replays the node's own command line.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStringExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::Serialize;
use snap_csi::proto::csi::v1::identity_client::IdentityClient;

use crate::csi::{channel, probe};
use crate::stack::Stack;

/// A process's memory, from /proc/<pid>/status.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Rss {
    /// Peak resident set (VmHWM), MiB.
    pub peak_mib: f64,
    /// Resident set now (VmRSS), MiB.
    pub now_mib: f64,
    /// Threads now (tokio's blocking pool grows with concurrent host work).
    pub threads: f64,
}

/// Everything section 5 reports, for one stack.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Memory {
    pub node_idle: Rss,
    pub proxy_idle: Rss,
    /// Split mode: the DPU agent.
    pub agent_idle: Option<Rss>,
    pub staged_volumes: usize,
    pub node_staged: Rss,
    pub proxy_staged: Rss,
    pub agent_staged: Option<Rss>,
    /// Node process start to Probe ready, with `staged_volumes` staged:
    /// one per restart (`--restarts`).
    pub restarts_ready_ms: Vec<f64>,
    /// The replacement node right after it was ready, and after teardown.
    pub node_restarted: Option<Rss>,
    pub node_restarted_after_teardown: Option<Rss>,
}

/// The command line of a process, or `None` if it is gone.
fn cmdline(pid: i32) -> Option<Vec<OsString>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| OsString::from_vec(a.to_vec()))
            .collect(),
    )
}

impl Memory {
    /// The stack's processes right after start.
    pub fn idle(stack: &Stack) -> anyhow::Result<Memory> {
        let (node, proxy, agent) = processes(stack)?;
        Ok(Memory {
            node_idle: node,
            proxy_idle: proxy,
            agent_idle: agent,
            ..Memory::default()
        })
    }

    /// The stack's processes with `volumes` staged.
    pub fn staged(&mut self, stack: &Stack, volumes: usize) -> anyhow::Result<()> {
        let (node, proxy, agent) = processes(stack)?;
        self.staged_volumes = volumes;
        self.node_staged = node;
        self.proxy_staged = proxy;
        self.agent_staged = agent;
        Ok(())
    }
}

/// The memory of the stack's node.
pub fn node(stack: &Stack) -> anyhow::Result<Rss> {
    rss(find("node", "--endpoint", stack.node_socket().as_os_str())?)
}

/// The memory of the stack's node, proxy and (split mode) agent.
fn processes(stack: &Stack) -> anyhow::Result<(Rss, Rss, Option<Rss>)> {
    let node = node(stack)?;
    let proxy = rss(find(
        "controller",
        "--endpoint",
        stack.controller_socket().as_os_str(),
    )?)?;
    let agent = match &stack.split {
        Some(link) => Some(rss(find(
            "dpu-agent",
            "--listen",
            OsStr::new(&link.endpoint),
        )?)?),
        None => None,
    };
    Ok((node, proxy, agent))
}

/// The `snap-csi <subcommand>` process started with `flag value` (its
/// socket, its listen address).
fn find(subcommand: &str, flag: &str, value: &OsStr) -> anyhow::Result<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let Ok(pid) = entry?.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Some(args) = cmdline(pid) else { continue };
        let binary = args
            .first()
            .and_then(|a| Path::new(a).file_name())
            .is_some_and(|name| name == "snap-csi");
        let serves = args.windows(2).any(|w| w[0] == flag && w[1] == value);
        if binary && args.get(1).is_some_and(|a| a == subcommand) && serves {
            found.push(pid);
        }
    }
    match found[..] {
        [pid] => Ok(pid),
        [] => bail!(
            "no snap-csi {subcommand} runs with {flag} {}",
            value.to_string_lossy()
        ),
        _ => bail!(
            "several snap-csi {subcommand} processes run with {flag} {}: {found:?}",
            value.to_string_lossy()
        ),
    }
}

/// VmHWM and VmRSS of `pid`.
pub fn rss(pid: i32) -> anyhow::Result<Rss> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let kib = |key: &str| -> anyhow::Result<f64> {
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .with_context(|| format!("no {key} in /proc/{pid}/status"))?;
        let value: f64 = line
            .split_whitespace()
            .next()
            .context("empty value")?
            .parse()?;
        Ok(value)
    };
    Ok(Rss {
        peak_mib: kib("VmHWM:")? / 1024.0,
        now_mib: kib("VmRSS:")? / 1024.0,
        threads: kib("Threads:")?,
    })
}

/// Whether `pid` has exited (gone, or a zombie its parent has yet to reap).
fn exited(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// Stops the stack's node (SIGTERM: a rolling update) and starts a new one
/// with the same command line, which the stack then owns. Returns the time
/// from the new process's start to its first Probe answering ready.
pub async fn restart_node(stack: &mut Stack, logs: &Path) -> anyhow::Result<(Duration, i32)> {
    let socket = stack.node_socket();
    let pid = find("node", "--endpoint", socket.as_os_str())?;
    let args = cmdline(pid).context("the node vanished")?;
    kill(Pid::from_raw(pid), Signal::SIGTERM)?;
    let stopping = Instant::now();
    while !exited(pid) || socket.exists() {
        if stopping.elapsed() > Duration::from_secs(60) {
            bail!("the node (pid {pid}) did not stop within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let log = std::fs::File::create(logs.join(format!("node-restarted-{}.log", stack.name)))?;
    let started = Instant::now();
    let child = Command::new(&args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting the replacement node")?;
    let new_pid = i32::try_from(child.id())?;
    stack.adopt_node(child);
    loop {
        if started.elapsed() > Duration::from_secs(60) {
            bail!("the restarted node was not ready within 60 s");
        }
        if socket.exists()
            && let Ok(channel) = channel(&stack.node).await
            && probe(&mut IdentityClient::new(channel))
                .await
                .unwrap_or(false)
        {
            return Ok((started.elapsed(), new_pid));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
