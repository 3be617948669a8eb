//! Emulator configuration: the library's [`Config`] and the binary's flags.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::bail;

use crate::datapath::DataPathMode;
use crate::faults::Faults;
use crate::host::{GuestHostConfig, NvmeNaming, PciDomain};

/// How many emulated PCI functions the DPU offers the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FunctionLayout {
    pub nvme_pfs: u32,
    pub nvme_vfs_per_pf: u32,
    pub virtio_blk_pfs: u32,
    pub virtio_blk_vfs_per_pf: u32,
}

impl Default for FunctionLayout {
    /// One NVMe PF and one virtio-blk PF with 16 VFs each, like a typical BF3 setup.
    fn default() -> Self {
        Self {
            nvme_pfs: 1,
            nvme_vfs_per_pf: 16,
            virtio_blk_pfs: 1,
            virtio_blk_vfs_per_pf: 16,
        }
    }
}

/// Everything one emulator instance needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The JSON-RPC UNIX socket (SPDK's `-r`).
    pub socket: PathBuf,
    /// Backing files of bdevs and the host side's records; created if missing.
    pub state_dir: PathBuf,
    /// Root of the sysfs-shaped tree; `<state_dir>/sysfs` when `None`.
    pub sysfs_root: Option<PathBuf>,
    /// The host's PCI domain of this DPU's functions (`<domain>:<bdf>` in
    /// the tree); emulators sharing a root must each have their own.
    pub pci_domain: PciDomain,
    /// How the host names NVMe disks: with native multipath (its default)
    /// or one disk per controller.
    pub nvme_naming: NvmeNaming,
    /// `false` behaves as a plain `spdk_tgt`: no SNAP methods, no functions, no host side.
    pub snap: bool,
    /// SPDK's RPC poller period; `None` answers at once.
    pub poll_period: Option<Duration>,
    /// With a poll period: send each reply at the tick after the one that
    /// read its request, as real SPDK does (which also makes the poller's
    /// count of dependent round trips exact; see [`crate::poller::Rounds`]).
    pub reply_on_next_tick: bool,
    pub functions: FunctionLayout,
    /// Faults a test switches on while the emulator runs; none by default.
    pub faults: Faults,
    /// Which exposed bdevs reach the host through the FUSE data path.
    pub data_path: DataPathMode,
    /// A configuration in `save_config`'s format run before the socket
    /// serves anyone (`spdk_tgt --json`).
    pub json_config: Option<PathBuf>,
    /// Plug the functions into a QEMU guest instead of showing them in the
    /// tree: each PF is one of its root ports (no VFs).
    pub guest: Option<GuestHostConfig>,
}

/// PCI bus numbers start at 0x26 and each PF owns one bus (function 0 is the PF,
/// VFs follow), so the layout must fit into buses 0x26..=0xff.
pub(crate) const FIRST_BUS: u32 = 0x26;
pub(crate) const MAX_VFS_PER_PF: u32 = 255;
pub(crate) const MAX_PFS: u32 = 0xff - FIRST_BUS + 1;

impl Config {
    pub fn new(socket: impl Into<PathBuf>, state_dir: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            state_dir: state_dir.into(),
            sysfs_root: None,
            pci_domain: PciDomain::default(),
            nvme_naming: NvmeNaming::default(),
            snap: true,
            poll_period: None,
            reply_on_next_tick: false,
            functions: FunctionLayout::default(),
            faults: Faults::default(),
            data_path: DataPathMode::default(),
            json_config: None,
            guest: None,
        }
    }

    /// A SNAP-enabled instance living entirely under `dir` (`spdk.sock`, `state/`).
    pub fn for_test(dir: &Path) -> Self {
        Self::new(dir.join("spdk.sock"), dir.join("state"))
    }

    /// Plain `spdk_tgt` behaviour, e.g. for a remote NVMe-oF target.
    pub fn without_snap(mut self) -> Self {
        self.snap = false;
        self
    }

    pub fn with_poll_period(mut self, period: Duration) -> Self {
        self.poll_period = (!period.is_zero()).then_some(period);
        self
    }

    /// A poller with `period` that sends each reply at the next tick and
    /// counts dependent round trips exactly (see [`crate::poller::Rounds`]).
    pub fn counting_round_trips(mut self, period: Duration) -> Self {
        self = self.with_poll_period(period);
        self.reply_on_next_tick = true;
        self
    }

    pub fn with_functions(mut self, functions: FunctionLayout) -> Self {
        self.functions = functions;
        self
    }

    /// Shares `faults` with the test that holds the other handle.
    pub fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    pub fn with_data_path(mut self, mode: DataPathMode) -> Self {
        self.data_path = mode;
        self
    }

    pub fn with_sysfs_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.sysfs_root = Some(root.into());
        self
    }

    pub fn with_pci_domain(mut self, domain: PciDomain) -> Self {
        self.pci_domain = domain;
        self
    }

    pub fn with_nvme_naming(mut self, naming: NvmeNaming) -> Self {
        self.nvme_naming = naming;
        self
    }

    /// What the host side names its functions and NVMe disks by.
    pub(crate) fn host_names(&self) -> (PciDomain, NvmeNaming) {
        (self.pci_domain, self.nvme_naming)
    }

    pub fn with_guest_host(mut self, guest: GuestHostConfig) -> Self {
        self.guest = Some(guest);
        self
    }

    /// The buses PFs take, in order: a guest's root ports, or the tree's
    /// from [`FIRST_BUS`] on.
    pub(crate) fn buses(&self) -> Vec<u32> {
        match &self.guest {
            Some(guest) => guest.buses(),
            None => (FIRST_BUS..FIRST_BUS + MAX_PFS).collect(),
        }
    }

    pub fn effective_sysfs_root(&self) -> PathBuf {
        self.sysfs_root
            .clone()
            .unwrap_or_else(|| self.state_dir.join("sysfs"))
    }

    /// Where the host's virtio-fs devices are, a socket per tag
    /// (`<state_dir>/host/virtiofs`): a host here mounts one with
    /// `fuse_handoff::mount(<it>, tag, ...)` where a real one mounts `-t
    /// virtiofs <tag>`.
    pub fn effective_virtiofs_dir(&self) -> PathBuf {
        self.host_dir().join(crate::host::VIRTIOFS_DIR)
    }

    /// The host side's own state (its records, its mounts).
    pub(crate) fn host_dir(&self) -> PathBuf {
        self.state_dir.join("host")
    }

    pub(crate) fn validate(&self) -> anyhow::Result<()> {
        if self.reply_on_next_tick && self.poll_period.is_none() {
            bail!("replies on the next tick need a poll period");
        }
        let f = &self.functions;
        if f.nvme_vfs_per_pf > MAX_VFS_PER_PF || f.virtio_blk_vfs_per_pf > MAX_VFS_PER_PF {
            bail!("at most {MAX_VFS_PER_PF} VFs per PF fit on one PCI bus");
        }
        if self.guest.is_some() {
            if f.nvme_vfs_per_pf + f.virtio_blk_vfs_per_pf > 0 {
                bail!("a guest host has no VFs: each function is a root port");
            }
            if f.nvme_pfs + f.virtio_blk_pfs > self.buses().len() as u32 {
                bail!("a guest host needs a root port per static PF");
            }
        // Leave half of the buses for hot-plugged PFs.
        } else if f.nvme_pfs + f.virtio_blk_pfs > MAX_PFS / 2 {
            bail!("at most {} static PFs are supported", MAX_PFS / 2);
        }
        Ok(())
    }
}

/// Command line of the `snap-emu` binary.
#[derive(Debug, clap::Parser)]
#[command(
    name = "snap-emu",
    about = "SPDK v24.09 / SNAP-4 wire-compatible JSON-RPC emulator backed by files and loop devices"
)]
pub struct Cli {
    /// JSON-RPC UNIX socket to listen on.
    #[arg(long, default_value = "/var/tmp/spdk.sock")]
    pub socket: PathBuf,
    /// Directory for backing files and host-side records (created if missing).
    #[arg(long, default_value = "/var/lib/snap-emu")]
    pub state_dir: PathBuf,
    /// Root of the emulated sysfs tree (default: STATE_DIR/sysfs).
    #[arg(long)]
    pub sysfs_root: Option<PathBuf>,
    /// The host's PCI domain of the emulated functions (1 to 4 hex digits):
    /// the emulators of a host's two DPUs share one --sysfs-root with a
    /// domain each (0000, 0001).
    #[arg(long, value_name = "HEX", default_value = "0000")]
    pub pci_domain: PciDomain,
    /// Name NVMe disks as a host with `nvme_core.multipath=N` does
    /// (`nvme<C>n<N>` under the controller), not with native multipath
    /// (a path `nvme<S>c<C>n<N>` under the controller, the disk its head
    /// `block/nvme<S>n<N>`).
    #[arg(long)]
    pub no_native_multipath: bool,
    /// Behave as a plain spdk_tgt (no SNAP methods, no emulated functions).
    #[arg(long)]
    pub no_snap: bool,
    /// Serve RPCs from a poller with this period in microseconds, like SPDK (0 = at once).
    #[arg(long, default_value_t = 0)]
    pub poll_period_us: u64,
    /// Number of static NVMe PFs.
    #[arg(long, default_value_t = 1)]
    pub nvme_pfs: u32,
    /// Number of VFs under each NVMe PF.
    #[arg(long, default_value_t = 16)]
    pub nvme_vfs_per_pf: u32,
    /// Number of static virtio-blk PFs.
    #[arg(long, default_value_t = 1)]
    pub virtio_blk_pfs: u32,
    /// Number of VFs under each virtio-blk PF.
    #[arg(long, default_value_t = 16)]
    pub virtio_blk_vfs_per_pf: u32,
    /// Which exposed bdevs the host reaches through the emulator's FUSE data
    /// path (needed to enforce QoS limits, encrypt and count real I/O): auto
    /// = crypto bdevs, those with rate limits (on them or a bdev under them)
    /// when exposed, and NVMe-oF namespaces (their I/O goes to the target).
    #[arg(long, value_enum, default_value_t = DataPathMode::Auto)]
    pub data_path: DataPathMode,
    /// A JSON configuration (`save_config`'s format: subsystems, each a list
    /// of method calls) made before the socket serves, as `spdk_tgt --json`
    /// does: what a restarted target must have again, such as its pool.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Host the functions in a QEMU guest instead of the sysfs tree: the
    /// guest's QMP monitor to hot-plug through (`snap-csi-guest boot` prints
    /// it as GUEST_QMP).
    #[arg(long, value_name = "SOCKET", requires_all = ["guest_port", "virtiofsd"])]
    pub guest_qmp: Option<PathBuf>,
    /// A root port of the guest a PF takes, as QEMU's id and the bus the
    /// guest gave it (`rp1:01`), in the order of the PFs (NVMe first); one
    /// per PF, no VFs.
    #[arg(long, value_name = "ID:BUS", value_parser = guest_port, requires = "guest_qmp")]
    pub guest_port: Vec<(String, u8)>,
    /// virtiofsd, which serves a guest's virtio-fs devices
    /// (hack/guest/virtiofsd.sh builds it).
    #[arg(long, value_name = "PATH", requires = "guest_qmp")]
    pub virtiofsd: Option<PathBuf>,
}

fn guest_port(text: &str) -> Result<(String, u8), String> {
    let (id, bus) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?} is not ID:BUS"))?;
    let bus = u8::from_str_radix(bus, 16).map_err(|_| format!("{bus:?} is not a hex bus"))?;
    Ok((id.to_owned(), bus))
}

impl Cli {
    pub fn into_config(self) -> Config {
        let mut c = Config::new(self.socket, self.state_dir)
            .with_poll_period(Duration::from_micros(self.poll_period_us))
            .with_functions(FunctionLayout {
                nvme_pfs: self.nvme_pfs,
                nvme_vfs_per_pf: self.nvme_vfs_per_pf,
                virtio_blk_pfs: self.virtio_blk_pfs,
                virtio_blk_vfs_per_pf: self.virtio_blk_vfs_per_pf,
            });
        c.sysfs_root = self.sysfs_root;
        c.pci_domain = self.pci_domain;
        if self.no_native_multipath {
            c.nvme_naming = NvmeNaming::PerController;
        }
        c.data_path = self.data_path;
        c.json_config = self.json;
        if let (Some(qmp), Some(virtiofsd)) = (self.guest_qmp, self.virtiofsd) {
            c = c.with_guest_host(GuestHostConfig {
                qmp,
                ports: self.guest_port,
                virtiofsd,
            });
        }
        if self.no_snap {
            c = c.without_snap();
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{Cli, NvmeNaming};

    fn domain(args: &[&str]) -> Result<String, String> {
        let argv = ["snap-emu"].iter().chain(args);
        Cli::try_parse_from(argv)
            .map(|cli| cli.into_config().pci_domain.to_string())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn guest_host_flags() {
        let parse = |args: &[&str]| {
            let argv = ["snap-emu"].iter().chain(args);
            Cli::try_parse_from(argv).map(|cli| cli.into_config().guest)
        };
        assert!(parse(&[]).unwrap().is_none());
        let guest = parse(&[
            "--guest-qmp=/q.sock",
            "--guest-port=rp1:01",
            "--guest-port=rp2:0a",
            "--virtiofsd=/v",
        ])
        .unwrap()
        .expect("a guest host");
        assert_eq!(guest.ports, [("rp1".into(), 1), ("rp2".into(), 10)]);
        assert_eq!(guest.buses(), [1, 10]);
        for bad in [
            &["--guest-qmp=/q.sock", "--virtiofsd=/v"][..],
            &["--guest-port=rp1:01"],
            &["--guest-qmp=/q.sock", "--guest-port=rp1", "--virtiofsd=/v"],
            &[
                "--guest-qmp=/q.sock",
                "--guest-port=rp1:zz",
                "--virtiofsd=/v",
            ],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn native_multipath_is_the_default_naming() {
        let naming = |args: &[&str]| {
            let argv = ["snap-emu"].iter().chain(args);
            Cli::try_parse_from(argv).unwrap().into_config().nvme_naming
        };
        assert_eq!(naming(&[]), NvmeNaming::NativeMultipath);
        assert_eq!(
            naming(&["--no-native-multipath"]),
            NvmeNaming::PerController
        );
    }

    #[test]
    fn pci_domain_flag() {
        assert_eq!(domain(&[]).unwrap(), "0000");
        for (given, stored) in [
            ("1", "0001"),
            ("0001", "0001"),
            ("aB", "00ab"),
            ("ffff", "ffff"),
        ] {
            assert_eq!(domain(&["--pci-domain", given]).unwrap(), stored, "{given}");
        }
        for bad in ["", "10000", "0x1", "g", "-1", " 1"] {
            let err = domain(&[&format!("--pci-domain={bad}")]).unwrap_err();
            assert!(err.contains("invalid PCI domain"), "{bad}: {err}");
        }
    }
}
