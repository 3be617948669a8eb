//! QEMU's machine protocol (QMP) on a UNIX socket: one command at a time,
//! each answered by `return` or `error`; the events that arrive meanwhile are
//! kept for [`Qmp::wait_event`] (a `device_del` is done when the guest lets
//! the device go, which QEMU says by `DEVICE_DELETED`).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use serde_json::{Value, json};

/// QEMU's `error` answer to a command.
#[derive(Debug)]
pub struct Refused {
    /// `GenericError`, `DeviceNotFound`, ...
    pub class: String,
    pub desc: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.desc, self.class)
    }
}

impl std::error::Error for Refused {}

#[derive(Debug)]
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    events: Vec<Value>,
}

impl Qmp {
    /// Connects, reads QEMU's greeting and leaves capabilities negotiation.
    pub fn connect(socket: &Path, timeout: Duration) -> anyhow::Result<Self> {
        let stream = UnixStream::connect(socket)
            .with_context(|| format!("connecting to QMP at {}", socket.display()))?;
        stream.set_read_timeout(Some(timeout))?;
        let mut qmp = Qmp {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
            events: Vec::new(),
        };
        let greeting = qmp.read()?;
        if greeting.get("QMP").is_none() {
            bail!("QMP greeted with {greeting}");
        }
        qmp.execute("qmp_capabilities", json!({}))?;
        Ok(qmp)
    }

    /// Runs `command` with `arguments` and returns its `return`; QEMU's
    /// `error` is a [`Refused`] in an error naming the command.
    pub fn execute(&mut self, command: &str, arguments: Value) -> anyhow::Result<Value> {
        let mut line = serde_json::to_vec(&json!({"execute": command, "arguments": arguments}))?;
        line.push(b'\n');
        self.writer.write_all(&line)?;
        loop {
            let reply = self.read()?;
            if reply.get("event").is_some() {
                self.events.push(reply);
            } else if let Some(value) = reply.get("return") {
                return Ok(value.clone());
            } else {
                let error = reply.get("error").unwrap_or(&reply);
                let text = |key: &str| error[key].as_str().unwrap_or_default().to_owned();
                return Err(Refused {
                    class: text("class"),
                    desc: text("desc"),
                })
                .with_context(|| format!("QMP {command} {arguments}"));
            }
        }
    }

    /// Waits until QEMU reports `event` whose data has `key` = `value`.
    pub fn wait_event(
        &mut self,
        event: &str,
        key: &str,
        value: &str,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let matches = |e: &Value| e["event"] == event && e["data"][key] == value;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(at) = self.events.iter().position(matches) {
                self.events.remove(at);
                return Ok(());
            }
            let left = deadline
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    anyhow!("QEMU did not report {event} for {key}={value} in {timeout:?}")
                })?;
            self.reader.get_ref().set_read_timeout(Some(left))?;
            let next = self.read();
            self.reader.get_ref().set_read_timeout(Some(timeout))?;
            self.events.push(next?);
        }
    }

    fn read(&mut self) -> anyhow::Result<Value> {
        let mut line = String::new();
        if self.reader.read_line(&mut line).context("reading QMP")? == 0 {
            bail!("QEMU closed its QMP socket");
        }
        serde_json::from_str(&line).with_context(|| format!("QMP sent {line:?}"))
    }
}
