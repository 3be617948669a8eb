//! A guest host: Debian's own kernel under QEMU (`hack/guest/`), so that what
//! the node reads of a host (sysfs, block devices, virtio-fs tags, mounts) is
//! what a real kernel shows, and PCI functions arrive and leave by real
//! hot-plug (ACPI, on PCIe root ports), as SNAP's do on a BlueField's host.
//!
//! The guest's userland is this machine's root, read-only over 9p (with its
//! own `/tmp`, `/run`, `/var`, `/root`): every binary here runs there at the
//! same path, so a test runs `env!("CARGO_BIN_EXE_snap-csi")` in the guest
//! as it is. Commands go to the guest's agent (`hack/guest/agent.sh`) on a
//! virtio-serial port; devices come and go through QMP (crate
//! `qemu-hotplug`, which the emulator's guest host uses on a monitor of its
//! own, [`Guest::hotplug_monitor`]); a
//! [`Link`] is its network to this machine, where the DPU side listens.
//!
//! KVM is used where it boots the kernel; where it does not (a nested
//! `kvm-pvm`, or no `/dev/kvm`) the first boot says so on stderr, once, and
//! every guest of the process uses TCG (`SNAP_CSI_GUEST_ACCEL=tcg|kvm` forces
//! one).
//!
//! What a guest does not prove: SNAP's own emulation (QEMU's NVMe, virtio-blk
//! and vhost-user-fs devices stand in for SNAP's), the virtqueues of a
//! BlueField's PCIe, and its timing (TCG is slow and steady).

mod link;

use std::fs;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;

pub use link::Link;
use qemu_hotplug::Drive;
pub use qemu_hotplug::Qmp;

/// PCIe root ports a guest boots with, each an empty slot to hot-plug one
/// function into (`1..=PORTS`).
pub const PORTS: u8 = 8;
/// The NVMe subsystem every hot-plugged controller joins (SNAP's model: one
/// subsystem, a controller per function).
pub const SUBSYSTEM_NQN: &str = "nqn.2026-12.io.snap-csi:guest";
const SUBSYSTEM_SERIAL: &str = "snapcsi-guest";
const SUBSYSTEM_ID: &str = "snapcsi-subsys";
/// The second monitor's socket in the guest's directory.
const HOTPLUG_QMP: &str = "qmp-hotplug.sock";
/// Booting under TCG on a loaded two-core machine.
const BOOT_TIMEOUT: Duration = Duration::from_secs(180);
/// A command in the guest, unless the caller allows more.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// What a guest boots with.
#[derive(Debug, Clone)]
pub struct GuestSpec {
    pub hostname: String,
    /// `nvme_core.multipath`: native NVMe multipath (the kernel's default)
    /// or one disk per controller.
    pub native_multipath: bool,
    /// Files behind the namespaces of the NVMe subsystem, NSID 1, 2, ...:
    /// QEMU cannot hot-plug a namespace, so they exist from boot on a
    /// controller of their own (the subsystem's first, at 00:05.0), and every
    /// controller hot-plugged into the subsystem later carries them too.
    pub nvme_namespaces: Vec<PathBuf>,
    pub memory_mib: u32,
    /// A network link to this machine: `(tap, the guest's address)`, from
    /// [`Link`].
    pub link: Option<(String, std::net::Ipv4Addr)>,
    /// A directory of this machine the guest mounts read-write at
    /// [`DATA_DIR`] on every boot: what a host's own disk keeps across a
    /// reboot (the guest's root is read-only, its `/var` in memory).
    pub data: Option<PathBuf>,
}

/// Where a guest with [`GuestSpec::data`] mounts it.
pub const DATA_DIR: &str = "/var/lib/snap-csi";

impl GuestSpec {
    pub fn new(hostname: &str) -> Self {
        GuestSpec {
            hostname: hostname.to_owned(),
            native_multipath: true,
            nvme_namespaces: Vec::new(),
            memory_mib: 512,
            link: None,
            data: None,
        }
    }
}

/// Fails with QEMU's own words if it has exited.
fn exited(qemu: &mut Child) -> anyhow::Result<()> {
    if let Some(status) = qemu.try_wait()? {
        let mut stderr = String::new();
        if let Some(mut pipe) = qemu.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
        }
        bail!("QEMU exited ({status}): {}", stderr.trim());
    }
    Ok(())
}

/// What a command run in the guest gave.
#[derive(Debug)]
pub struct Output {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// The agent's answer: `<status> <base64 stdout> <base64 stderr>`.
    pub fn parse(reply: &str) -> anyhow::Result<Output> {
        let mut fields = reply.trim_end_matches('\n').splitn(3, ' ');
        let status = fields
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| anyhow!("the guest answered {reply:?}"))?;
        let text = |field: Option<&str>| -> anyhow::Result<String> {
            let bytes = STANDARD.decode(field.unwrap_or_default())?;
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        };
        Ok(Output {
            status,
            stdout: text(fields.next())?,
            stderr: text(fields.next())?,
        })
    }

    /// The stdout of `script`, which gave this; an exit status other than 0
    /// is an error with both outputs.
    pub fn stdout_of(self, script: &str) -> anyhow::Result<String> {
        if self.status != 0 {
            bail!(
                "in the guest, {script:?} exited {}: {}{}",
                self.status,
                self.stdout,
                self.stderr
            );
        }
        Ok(self.stdout)
    }

    /// The agent's answer for this output: a line [`Output::parse`] reads.
    pub fn to_line(&self) -> String {
        format!(
            "{} {} {}\n",
            self.status,
            STANDARD.encode(&self.stdout),
            STANDARD.encode(&self.stderr)
        )
    }
}

/// A script as the agent reads it: one line.
pub fn script_line(script: &str) -> String {
    let mut line = STANDARD.encode(script);
    line.push('\n');
    line
}

/// Runs `script` in the guest that `snap-csi-guest boot` serves at
/// `socket` (its GUEST_EXEC).
pub fn exec(socket: &Path, script: &str) -> anyhow::Result<Output> {
    let mut stream = UnixStream::connect(socket)
        .with_context(|| format!("connecting to {} (is `boot` running?)", socket.display()))?;
    stream.write_all(script_line(script).as_bytes())?;
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply)?;
    Output::parse(&reply)
}

/// The script of a [`script_line`].
pub fn script_of_line(line: &str) -> anyhow::Result<String> {
    let bytes = STANDARD.decode(line.trim_end_matches('\n'))?;
    String::from_utf8(bytes).context("a script that is not UTF-8")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    /// QEMU's name for it (`-accel`).
    pub fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// A booted guest; dropping it ends QEMU.
#[derive(Debug)]
pub struct Guest {
    qemu: Child,
    dir: tempfile::TempDir,
    agent: BufReader<UnixStream>,
    qmp: Qmp,
    /// The guest kernel's release (`uname -r`).
    pub release: String,
    /// How QEMU runs it.
    pub accel: Accel,
    /// Each root port's secondary bus, as the guest's firmware numbered it.
    buses: Vec<u8>,
    /// Whether [`GuestSpec::data`] is mounted on each boot.
    data: bool,
}

impl Guest {
    /// Boots a guest and waits until its agent answers.
    pub fn boot(spec: &GuestSpec) -> anyhow::Result<Guest> {
        // The first boot decides for every guest of the process; the others
        // wait for it rather than probe KVM each.
        static ACCEL: Mutex<Option<Accel>> = Mutex::new(None);
        image()?;
        let mut decided = ACCEL.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(accel) = *decided {
            drop(decided);
            return Self::boot_with(spec, accel);
        }
        let kvm_usable = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .is_ok();
        let (accel, guest) = match std::env::var("SNAP_CSI_GUEST_ACCEL").as_deref() {
            Ok("tcg") => (Accel::Tcg, Self::boot_with(spec, Accel::Tcg)?),
            Ok("kvm") => (Accel::Kvm, Self::boot_with(spec, Accel::Kvm)?),
            Ok(other) => bail!("SNAP_CSI_GUEST_ACCEL={other}: give tcg or kvm"),
            Err(_) if !kvm_usable => {
                note("no usable /dev/kvm: guests boot with TCG (slower, same kernel)");
                (Accel::Tcg, Self::boot_with(spec, Accel::Tcg)?)
            }
            Err(_) => match Self::boot_with_timeout(spec, Accel::Kvm, Duration::from_secs(30)) {
                Ok(guest) => (Accel::Kvm, guest),
                Err(e) => {
                    note(&format!(
                        "KVM did not boot the guest ({}): guests boot with TCG (slower, same kernel)",
                        first_line(&format!("{e:#}"))
                    ));
                    (Accel::Tcg, Self::boot_with(spec, Accel::Tcg)?)
                }
            },
        };
        *decided = Some(accel);
        Ok(guest)
    }

    fn boot_with(spec: &GuestSpec, accel: Accel) -> anyhow::Result<Guest> {
        Self::boot_with_timeout(spec, accel, BOOT_TIMEOUT)
    }

    fn boot_with_timeout(
        spec: &GuestSpec,
        accel: Accel,
        timeout: Duration,
    ) -> anyhow::Result<Guest> {
        let image = image()?;
        let dir = tempfile::Builder::new()
            .prefix("snap-csi-guest-")
            .tempdir()?;
        let agent_socket = dir.path().join("agent.sock");
        let qmp_socket = dir.path().join("qmp.sock");
        let console = dir.path().join("console.log");

        let mut command = Command::new("qemu-system-x86_64");
        let mut append = format!(
            "console=ttyS0 panic=-1 snapcsi.hostname={} nvme_core.multipath={}",
            spec.hostname,
            if spec.native_multipath { "Y" } else { "N" }
        );
        if let Some((_, address)) = &spec.link {
            append.push_str(&format!(" snapcsi.ip={address}/30"));
        }
        if accel == Accel::Tcg {
            // TCG's clock is steady enough; don't spend boot on calibration.
            append.push_str(" tsc=reliable");
        }
        let memory = spec.memory_mib;
        command
            .args([
                "-machine",
                "q35",
                "-nodefaults",
                "-display",
                "none",
                "-no-reboot",
            ])
            .args(["-accel", accel.name()])
            .args(["-smp", "1", "-m", &format!("{memory}M")])
            // vhost-user devices (virtio-fs) map the guest's memory: shared.
            .args([
                "-object",
                &format!("memory-backend-memfd,id=mem,size={memory}M,share=on"),
                "-numa",
                "node,memdev=mem",
            ])
            .arg("-kernel")
            .arg(image.join("vmlinuz"))
            .arg("-initrd")
            .arg(image.join("initrd"))
            .args(["-append", &append])
            .args([
                "-fsdev",
                "local,id=hostroot,path=/,readonly=on,security_model=none",
                "-device",
                "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
                "-device",
                "virtio-serial-pci",
                "-chardev",
                &format!(
                    "socket,id=agent,path={},server=on,wait=off",
                    agent_socket.display()
                ),
                "-device",
                "virtserialport,chardev=agent,name=snapcsi.agent",
                "-qmp",
                &format!("unix:{},server=on,wait=off", qmp_socket.display()),
                "-qmp",
                &format!(
                    "unix:{},server=on,wait=off",
                    dir.path().join(HOTPLUG_QMP).display()
                ),
                "-serial",
                &format!("file:{}", console.display()),
            ]);
        for port in 1..=PORTS {
            command.args([
                "-device",
                &format!(
                    "pcie-root-port,id={},bus=pcie.0,chassis={port},addr={:#x}",
                    port_id(port),
                    0x10 + port
                ),
            ]);
        }
        command.args([
            "-device",
            &format!("nvme-subsys,id={SUBSYSTEM_ID},nqn={SUBSYSTEM_NQN}"),
        ]);
        if !spec.nvme_namespaces.is_empty() {
            command.args([
                "-device",
                &format!("nvme,id=nvme-boot,serial={SUBSYSTEM_SERIAL},subsys={SUBSYSTEM_ID},bus=pcie.0,addr=0x5"),
            ]);
        }
        for (i, file) in spec.nvme_namespaces.iter().enumerate() {
            let nsid = i + 1;
            command.args([
                "-blockdev",
                &format!(
                    "driver=raw,node-name=ns{nsid},file.driver=file,file.filename={}",
                    file.display()
                ),
                "-device",
                &format!("nvme-ns,drive=ns{nsid},nsid={nsid},bus=nvme-boot,shared=on"),
            ]);
        }
        if let Some(data) = &spec.data {
            command.args([
                "-fsdev",
                &format!("local,id=data,path={},security_model=none", data.display()),
                "-device",
                "virtio-9p-pci,fsdev=data,mount_tag=snapcsi.data",
            ]);
        }
        if let Some((tap, _)) = &spec.link {
            command.args([
                "-netdev",
                &format!("tap,id=link,ifname={tap},script=no,downscript=no"),
                "-device",
                "virtio-net-pci,netdev=link",
            ]);
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let qemu = command
            .spawn()
            .context("starting qemu-system-x86_64 (hack/setup.sh installs it)")?;
        let mut guest = Guest::attach(qemu, dir, accel, timeout)
            .with_context(|| format!("booting the guest {} with {accel:?}", spec.hostname))?;
        guest.data = spec.data.is_some();
        guest.mount_data()?;
        guest.buses = (1..=PORTS)
            .map(|port| guest.port_bus(port))
            .collect::<anyhow::Result<_>>()?;
        Ok(guest)
    }

    /// Connects to a starting QEMU's sockets and waits for the agent.
    fn attach(
        mut qemu: Child,
        dir: tempfile::TempDir,
        accel: Accel,
        timeout: Duration,
    ) -> anyhow::Result<Guest> {
        let deadline = Instant::now() + timeout;
        let connect = |qemu: &mut Child, path: &Path| -> anyhow::Result<UnixStream> {
            loop {
                exited(qemu)?;
                match UnixStream::connect(path) {
                    Ok(stream) => return Ok(stream),
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => return Err(e).context(format!("connecting to {}", path.display())),
                }
            }
        };
        let agent = connect(&mut qemu, &dir.path().join("agent.sock"))?;
        connect(&mut qemu, &dir.path().join("qmp.sock"))?;
        let qmp = Qmp::connect(&dir.path().join("qmp.sock"), COMMAND_TIMEOUT);
        let mut guest = Guest {
            agent: BufReader::new(agent),
            qmp: qmp?,
            qemu,
            dir,
            release: String::new(),
            accel,
            buses: Vec::new(),
            data: false,
        };
        guest.await_agent(deadline)?;
        Ok(guest)
    }

    /// Waits until the agent of a booting kernel answers, until `deadline`.
    fn await_agent(&mut self, deadline: Instant) -> anyhow::Result<()> {
        // The agent reads its port once the kernel booted: the first
        // command waits in the port until then. Meanwhile QEMU may stop the
        // machine (KVM that cannot run this kernel: "internal-error").
        self.send("uname -r")?;
        let mut reply = String::new();
        let answered = loop {
            self.agent
                .get_mut()
                .set_read_timeout(Some(Duration::from_millis(500)))?;
            match self.agent.read_line(&mut reply) {
                Ok(_) if reply.ends_with('\n') => break Output::parse(&reply)?,
                Ok(0) => bail!("QEMU closed the agent's port"),
                Ok(_) => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(e).context("reading the guest's agent"),
            }
            exited(&mut self.qemu)?;
            let status = self.qmp.execute("query-status", json!({}))?;
            let state = status["status"].as_str().unwrap_or_default();
            if matches!(state, "internal-error" | "guest-panicked" | "shutdown") {
                bail!("the machine stopped ({state}){}", self.console_tail());
            }
            if Instant::now() > deadline {
                bail!(
                    "the guest's agent did not answer in time{}",
                    self.console_tail()
                );
            }
        };
        if answered.status != 0 {
            bail!("the guest's first command failed: {answered:?}");
        }
        self.release = answered.stdout.trim().to_owned();
        Ok(())
    }

    /// Reboots the guest as a host reboots: a reset, after which its kernel
    /// and everything in its memory start over, while the functions plugged
    /// into it stay (as a BlueField's functions stay across its host's
    /// reboot) and [`GuestSpec::data`] keeps what was written there.
    pub fn reboot(&mut self) -> anyhow::Result<()> {
        // Booted with -no-reboot, a reset would stop QEMU instead.
        self.qmp.execute("set-action", json!({"reboot": "reset"}))?;
        self.qmp.execute("system_reset", json!({}))?;
        // Only then is the old kernel gone and a command the new one's.
        self.qmp
            .wait_event("RESET", "reason", "host-qmp-system-reset", BOOT_TIMEOUT)?;
        self.await_agent(Instant::now() + BOOT_TIMEOUT)
            .context("rebooting the guest")?;
        self.mount_data()
    }

    fn mount_data(&mut self) -> anyhow::Result<()> {
        if self.data {
            self.sh(&format!(
                "mkdir -p {DATA_DIR} && \
                 mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 snapcsi.data {DATA_DIR}"
            ))?;
        }
        Ok(())
    }

    /// Runs `script` with the guest's `/bin/sh`.
    pub fn run(&mut self, script: &str) -> anyhow::Result<Output> {
        self.run_for(script, COMMAND_TIMEOUT)
    }

    fn run_for(&mut self, script: &str, timeout: Duration) -> anyhow::Result<Output> {
        self.send(script)?;
        self.agent.get_mut().set_read_timeout(Some(timeout))?;
        let mut reply = String::new();
        self.agent
            .read_line(&mut reply)
            .with_context(|| format!("the guest did not answer {script:?} in {timeout:?}"))?;
        Output::parse(&reply)
    }

    fn send(&mut self, script: &str) -> anyhow::Result<()> {
        self.agent
            .get_mut()
            .write_all(script_line(script).as_bytes())?;
        Ok(())
    }

    /// Runs `script` and returns its stdout; an exit status other than 0 is
    /// an error with both outputs.
    pub fn sh(&mut self, script: &str) -> anyhow::Result<String> {
        self.run(script)?.stdout_of(script)
    }

    /// Runs `script` until it exits 0 (a kernel finishing a hot-plug), at
    /// most `timeout`; the guest's sysfs is what the node polls as well.
    pub fn wait_until(&mut self, script: &str, timeout: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let out = self.run(script)?;
            if out.status == 0 {
                return Ok(out.stdout);
            }
            if Instant::now() > deadline {
                bail!(
                    "in the guest, {script:?} still exits {} after {timeout:?}: {}{}",
                    out.status,
                    out.stdout,
                    out.stderr
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn qmp(&mut self) -> &mut Qmp {
        &mut self.qmp
    }

    /// The address a function hot-plugged into root port `port` gets.
    pub fn bdf(&self, port: u8) -> String {
        format!("0000:{:02x}:00.0", self.buses[usize::from(port - 1)])
    }

    fn port_bus(&mut self, port: u8) -> anyhow::Result<u8> {
        let dir = format!("/sys/bus/pci/devices/0000:00:{:02x}.0/pci_bus", 0x10 + port);
        let name = self.sh(&format!("ls {dir}"))?;
        let bus = name
            .trim()
            .rsplit(':')
            .next()
            .and_then(|b| u8::from_str_radix(b, 16).ok())
            .ok_or_else(|| anyhow!("root port {port}: {dir} lists {name:?}"))?;
        Ok(bus)
    }

    /// Hot-plugs an NVMe controller of the subsystem into `port` (it carries
    /// the subsystem's namespaces); returns its address.
    pub fn add_nvme(&mut self, id: &str, port: u8) -> anyhow::Result<String> {
        qemu_hotplug::add_nvme(
            &mut self.qmp,
            id,
            &port_id(port),
            SUBSYSTEM_ID,
            SUBSYSTEM_SERIAL,
        )?;
        Ok(self.bdf(port))
    }

    /// Hot-plugs a virtio-blk disk over `file` with `serial` into `port`.
    pub fn add_virtio_blk(
        &mut self,
        id: &str,
        port: u8,
        file: &Path,
        serial: &str,
    ) -> anyhow::Result<String> {
        qemu_hotplug::add_disk(
            &mut self.qmp,
            qemu_hotplug::Disk::VirtioBlk,
            (id, &port_id(port)),
            &Drive::whole(file),
            serial,
        )?;
        Ok(self.bdf(port))
    }

    /// Hot-plugs a virtio-fs device with `tag`, served by the vhost-user
    /// backend (virtiofsd) listening on `socket`, into `port`.
    pub fn add_virtio_fs(
        &mut self,
        id: &str,
        port: u8,
        socket: &Path,
        tag: &str,
    ) -> anyhow::Result<String> {
        qemu_hotplug::add_virtio_fs(&mut self.qmp, id, &port_id(port), socket, tag)?;
        Ok(self.bdf(port))
    }

    /// Unplugs device `id` and waits until the guest let it go, then drops
    /// what QEMU held for it.
    pub fn remove(&mut self, id: &str) -> anyhow::Result<()> {
        qemu_hotplug::remove(&mut self.qmp, id, COMMAND_TIMEOUT)
    }

    /// A second QMP monitor, for whoever hot-plugs into this guest beside
    /// the test (the emulator's guest host), and every root port from
    /// `first_port` on as it names them: (port id, the bus the guest gave it).
    pub fn hotplug_monitor(&self, first_port: u8) -> (PathBuf, Vec<(String, u8)>) {
        let ports = (first_port..=PORTS)
            .map(|port| (port_id(port), self.buses[usize::from(port - 1)]))
            .collect();
        (self.dir.path().join(HOTPLUG_QMP), ports)
    }

    /// The end of the guest's console, for a failure's message (nothing
    /// when the kernel wrote nothing).
    pub fn console_tail(&self) -> String {
        let text = fs::read_to_string(self.dir.path().join("console.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        match lines.len() {
            0 => String::new(),
            n => format!(" (console:\n{})", lines[n.saturating_sub(30)..].join("\n")),
        }
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.qemu.kill();
        let _ = self.qemu.wait();
    }
}

/// The guest's kernel and initramfs, built (or found cached) by
/// `hack/guest/build.sh` once per process.
fn image() -> anyhow::Result<&'static Path> {
    static IMAGE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = IMAGE.get_or_init(|| {
        // This module is the harness's and, by path, tests' of other crates.
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .map(|dir| dir.join("hack/guest/build.sh"))
            .find(|script| script.exists())
            .ok_or_else(|| "hack/guest/build.sh is not above this crate".to_owned())?;
        let out = Command::new(&script)
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("running {}: {e}", script.display()))?;
        if !out.status.success() {
            return Err(format!("{} failed ({})", script.display(), out.status));
        }
        Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    });
    built.as_deref().map_err(|e| anyhow!("{e}"))
}

/// Root port `port`'s QEMU id.
fn port_id(port: u8) -> String {
    format!("rp{port}")
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

/// One line on stderr that a test's output capture does not swallow.
fn note(line: &str) {
    let _ = writeln!(std::io::stderr(), "guest: {line}");
}
