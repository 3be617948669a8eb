//! A host with two DPUs for the node suites: beside a fixture's first DPU
//! (its SNAP emulator, test plugin and, in a split-mode run, agent), a second
//! one: a SNAP emulator in PCI domain 0001 on the first's sysfs root (a
//! second BlueField's functions appear on the same host in a domain of their
//! own), its own test plugin, and in split mode its own agent, whose
//! certificate names it, signed by the first's CA. The node lists both in its
//! config's `dpus`. `NodeStack` takes it with `Tweaks::second_dpu`, the crash
//! suites' `Stack` when `SNAP_CSI_TEST_DPUS=2`.
//!
//! The second offers fewer functions than the first (9 of each emulation
//! against 17), so that a sum over the DPUs is told from twice one of them.
//! The node has one `virtiofs_emulated_dir`, one emulator's directory of
//! virtio-fs devices (as with `hack/local-up.sh
//! --dpus 2`): a filesystem device goes to the first DPU ([`pinned_first`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use snap_csi::agent::AgentConfig;
use snap_csi::dpu::{DpuAttach, HostLocator};
use snap_csi::node::Fleet;
use snap_csi::node::dpus::DpuSetting;
use snap_csi::node::fleet::DPU_KEY;
use snap_csi::tls::TlsFiles;

use super::Emulator;
use super::dpu::{Agent, DPU_NAME, GatedDpu};
use super::pki::{Pki, Role};
use super::plugin::TestPlugin;
use super::shared::free_local_address;

/// How many DPUs the crash suites' stack has: 1 (the default) or 2.
pub const COUNT_ENV: &str = "SNAP_CSI_TEST_DPUS";
/// The second DPU's name: its topology key, and its agent certificate's name.
pub const SECOND_DPU_NAME: &str = "dpu-2";
/// Both DPUs, in the node's order (PCI domains 0000 and 0001).
pub const NAMES: [&str; 2] = [DPU_NAME, SECOND_DPU_NAME];
const PCI_DOMAINS: [&str; 2] = ["0000", "0001"];
/// The second DPU's functions per PF, after its one PF of each emulation.
const SECOND_VFS_PER_PF: u32 = 8;

/// Whether this run's crash-suite stack has two DPUs.
pub fn two() -> bool {
    match std::env::var(COUNT_ENV).as_deref() {
        Ok("2") => true,
        Ok("1") | Err(_) => false,
        Ok(other) => panic!("{COUNT_ENV}={other}: expected 1 or 2"),
    }
}

/// The DPU the node puts a new volume on while both serve
/// ([`Fleet::first_choice`] over [`NAMES`]).
pub fn first_choice(volume_id: &str) -> &'static str {
    let nothing =
        || -> Arc<dyn DpuAttach> { GatedDpu::new(HostLocator::VirtioFs { tag: String::new() }) };
    let fleet = Fleet::new(
        NAMES
            .iter()
            .enumerate()
            .map(|(domain, name)| (name.to_string(), domain as u16, nothing()))
            .collect(),
    );
    let chosen = fleet.first_choice(volume_id).to_string();
    NAMES.into_iter().find(|name| *name == chosen).unwrap()
}

/// The index in [`NAMES`] of DPU `name`.
pub fn index(name: &str) -> usize {
    NAMES
        .iter()
        .position(|n| *n == name)
        .unwrap_or_else(|| panic!("no DPU {name}"))
}

/// The volume context entry that pins a volume to the first DPU.
pub fn pinned_first() -> HashMap<String, String> {
    HashMap::from([(DPU_KEY.to_string(), DPU_NAME.to_string())])
}

/// The second DPU: its SNAP (which a test may stop and start again) and
/// plugin, and in a `NodeStack`'s split-mode run its agent.
pub struct SecondDpu {
    // Declared in the order they stop: the agent and plugin before SNAP.
    pub agent: Option<Agent>,
    pub plugin: Option<TestPlugin>,
    pub snap: Emulator,
    /// Its files, inside the first emulator's directory.
    pub root: PathBuf,
    pub plugin_socket: PathBuf,
}

impl SecondDpu {
    /// The second DPU's SNAP and plugin beside `first`, on its sysfs root.
    pub async fn start(first: &Emulator) -> SecondDpu {
        let root = first.root().join(SECOND_DPU_NAME);
        std::fs::create_dir_all(&root).unwrap();
        let config = snap_emu::Config::for_test(&root)
            .with_sysfs_root(&first.sysfs_root)
            .with_pci_domain(PCI_DOMAINS[1].parse().unwrap())
            .with_functions(snap_emu::FunctionLayout {
                nvme_pfs: 1,
                nvme_vfs_per_pf: SECOND_VFS_PER_PF,
                virtio_blk_pfs: 1,
                virtio_blk_vfs_per_pf: SECOND_VFS_PER_PF,
            });
        let snap = Emulator::start_with(config, &root).await;
        let plugin = super::plugin::start(&snap.socket, &root).await;
        SecondDpu {
            agent: None,
            plugin_socket: plugin.socket.clone(),
            plugin: Some(plugin),
            snap,
            root,
        }
    }

    /// SNAP's socket template (the test plugin's provider has no name).
    pub fn snap_template(&self) -> String {
        self.snap.socket.display().to_string()
    }

    /// Its agent's certificate, from the CA of the first's.
    pub fn agent_tls(pki: &Pki) -> TlsFiles {
        pki.issue(Role::Agent, SECOND_DPU_NAME)
    }

    /// Stops its vendor plugin (its pod died); the node gets UNAVAILABLE.
    pub async fn stop_plugin(&mut self) {
        if let Some(plugin) = self.plugin.take() {
            plugin.stop().await;
        }
    }

    /// Its vendor plugin back on its socket.
    pub async fn start_plugin(&mut self) {
        assert!(self.plugin.is_none(), "the plugin is running");
        self.plugin = Some(super::plugin::start(&self.snap.socket, &self.root).await);
    }

    /// Stops its agent (in-process: as if killed); returns what starts its
    /// successor ([`SecondDpu::start_agent`]).
    pub fn stop_agent(&mut self) -> (AgentConfig, TlsFiles) {
        let agent = self
            .agent
            .take()
            .expect("a split-mode NodeStack's second agent");
        (agent.config.clone(), agent.node_tls.clone())
    }

    /// Starts a stopped agent's successor on its address and certificate.
    pub async fn start_agent(&mut self, (config, node_tls): (AgentConfig, TlsFiles)) {
        assert!(self.agent.is_none(), "the agent is running");
        self.agent = Some(Agent::launch(config, node_tls, None).await);
    }
}

/// Split mode in-process: the first DPU's agent over `first` (its plugin's
/// socket and SNAP's template) and the second's, their certificates made
/// under `dir` by one CA, which the node's certificate also comes from.
pub async fn agents(first: (&Path, &str), second: &SecondDpu, dir: &Path) -> (Agent, Agent) {
    let (mut config, node_tls, pki) = super::dpu::test_config(dir);
    config.plugin_socket = first.0.to_path_buf();
    config.snap_socket_template = first.1.to_string();
    let second_config = AgentConfig {
        listen: format!("https://{}", free_local_address()),
        tls: SecondDpu::agent_tls(&pki),
        plugin_socket: second.plugin_socket.clone(),
        snap_socket_template: second.snap_template(),
        ..config.clone()
    };
    (
        Agent::launch(config, node_tls.clone(), None).await,
        Agent::launch(second_config, node_tls, None).await,
    )
}

/// How the node reaches one DPU.
pub enum Reach {
    /// Split mode: its agent's endpoint.
    Agent(String),
    /// Co-located: its plugin's socket and SNAP's socket template.
    Sockets(PathBuf, String),
}

/// The node's `dpus`: the first DPU and the second, each in its domain.
pub fn settings(reach: [Reach; 2]) -> Vec<DpuSetting> {
    reach
        .into_iter()
        .zip(NAMES.iter().zip(PCI_DOMAINS))
        .map(|(reach, (name, domain))| {
            let (endpoint, plugin_socket, snap_socket_template) = match reach {
                Reach::Agent(endpoint) => (Some(endpoint), None, None),
                Reach::Sockets(plugin, snap) => (None, Some(plugin), Some(snap)),
            };
            DpuSetting {
                name: name.to_string(),
                pci_domain: Some(domain.to_string()),
                endpoint,
                plugin_socket,
                snap_socket_template,
            }
        })
        .collect()
}

/// Writes `settings` to `path` as a node config file's `[[dpus]]` tables
/// (`dpus` is a file-only setting).
pub fn write_config(settings: &[DpuSetting], path: &Path) {
    // A JSON string is a TOML basic string.
    let quoted = |s: &str| serde_json::to_string(s).unwrap();
    let mut file = String::new();
    for dpu in settings {
        file += "[[dpus]]\n";
        file += &format!("name = {}\n", quoted(&dpu.name));
        if let Some(domain) = &dpu.pci_domain {
            file += &format!("pci_domain = {}\n", quoted(domain));
        }
        if let Some(endpoint) = &dpu.endpoint {
            file += &format!("endpoint = {}\n", quoted(endpoint));
        }
        if let Some(socket) = &dpu.plugin_socket {
            file += &format!(
                "plugin_socket = {}\n",
                quoted(&socket.display().to_string())
            );
        }
        if let Some(template) = &dpu.snap_socket_template {
            file += &format!("snap_socket_template = {}\n", quoted(template));
        }
    }
    std::fs::write(path, file).unwrap();
}
