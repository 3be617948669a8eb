//! The DPU attach layer as its suites drive it: the SNAP emulator, the test
//! vendor plugin and the attach layer (co-located, or through a real DPU
//! agent in a split-mode run), with helpers that look at SNAP and the host.
//! `tests/dpu_attach.rs` (both emulations, dedicated) and
//! `tests/dpu_packed.rs` (the packed placement) share it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use snap_csi::dpu::names::VolumeNames;
use snap_csi::dpu::plugin::AccessMode;
use snap_csi::dpu::{
    AttachRequest, Attachment, DpuAttach, Emulation, HostLocator, Placement, VolumeMode,
};
use snap_csi::host::Sysfs;
use snap_csi::jsonrpc::RpcClient;
use snap_csi::proto::nvidia::storage::plugins::v1::storage_plugin_service_capability::rpc::Type as Capability;
use snap_csi::spdk::bdev::BdevGetBdevs;
use snap_csi::spdk::snap::{
    EmulationFunction, EmulationFunctionList, NvmeSubsystemList, VirtioBlkControllerList,
};
use snap_emu::Config;
use tokio::time::Instant;

use super::dpu::{Agent, TestDpu};
use super::plugin::{self, TestPlugin};
use super::{Emulator, loop_devices_of, round_trips, sparse_file};

pub const SIZE: u64 = 16 << 20;

pub struct Stack {
    pub dpu: Arc<dyn DpuAttach>,
    pub agent: Option<Agent>,
    pub emulator: Emulator,
    pub plugin: TestPlugin,
    pub snap: RpcClient,
    pub sysfs: Sysfs,
}

impl Stack {
    pub async fn start() -> Stack {
        let emulator = Emulator::start().await;
        Stack::on(emulator).await
    }

    pub async fn start_with(dir: &Path, config: impl FnOnce(Config) -> Config) -> Stack {
        let emulator = Emulator::start_with(config(Config::for_test(dir)), dir).await;
        Stack::on(emulator).await
    }

    pub async fn on(emulator: Emulator) -> Stack {
        Stack::on_with(emulator, &plugin::CAPABILITIES).await
    }

    pub async fn with_capabilities(capabilities: &[Capability]) -> Stack {
        Stack::on_with(Emulator::start().await, capabilities).await
    }

    pub async fn on_with(emulator: Emulator, capabilities: &[Capability]) -> Stack {
        let plugin = plugin::start_with(&emulator.socket, emulator.root(), capabilities).await;
        // The template names the emulator's socket outright, as tests must.
        let TestDpu { attach, agent } = TestDpu::start(
            &plugin.socket,
            &emulator.socket.display().to_string(),
            emulator.root(),
        )
        .await;
        Stack {
            snap: emulator.client(),
            sysfs: Sysfs::new(&emulator.sysfs_root),
            emulator,
            plugin,
            dpu: attach,
            agent,
        }
    }

    /// Another attach layer (with its own agent in a split-mode run) over
    /// `plugin_socket` and the SNAP at `snap_template`.
    pub async fn layer(&self, plugin_socket: &Path, snap_template: &Path) -> TestDpu {
        let dir = self.emulator.root().join("another");
        TestDpu::start(plugin_socket, &snap_template.display().to_string(), &dir).await
    }

    /// A request for a fresh backing file named after the volume.
    pub fn request(&self, volume_id: &str, emulation: Emulation) -> AttachRequest {
        let backing = self.backing(volume_id);
        if !backing.exists() {
            sparse_file(&backing, SIZE);
        }
        AttachRequest {
            volume_id: volume_id.to_string(),
            access_modes: vec![AccessMode::Rwo],
            volume_mode: VolumeMode::Filesystem,
            publish_context: HashMap::new(),
            volume_context: [(plugin::PATH_KEY.to_string(), backing.display().to_string())].into(),
            storage_parameters: HashMap::new(),
            emulation,
            placement: Placement::Dedicated,
            attached_before: false,
            secrets: HashMap::new(),
        }
    }

    pub fn backing(&self, volume_id: &str) -> PathBuf {
        self.emulator.root().join(format!("{volume_id}.img"))
    }

    /// The host's block device for a locator, if it sees one.
    pub fn host_device(&self, locator: &HostLocator) -> Option<snap_csi::host::BlockDevice> {
        locator.find(&self.sysfs).unwrap()
    }

    /// Waits for the host to discover the disk, as the node does.
    pub async fn discovered(&self, locator: &HostLocator) -> snap_csi::host::BlockDevice {
        super::discovered(&format!("the host seeing {locator:?}"), || {
            self.host_device(locator)
        })
        .await
    }

    /// A request for an NVMe volume packed onto pools of `per_controller`.
    pub fn packed_request(&self, volume_id: &str, per_controller: u32) -> AttachRequest {
        AttachRequest {
            placement: Placement::Packed {
                namespaces_per_controller: per_controller,
            },
            ..self.request(volume_id, Emulation::Nvme)
        }
    }

    /// The dependent SNAP round trips (as the emulator counts them with
    /// `counting_round_trips`) of a volume's life: [attach, the same attach
    /// retried by a caller that knows it attached, detach]. The retry gives
    /// the same attachment and the detach leaves nothing.
    pub async fn round_trips_of_a_life(&self, request: &AttachRequest) -> [u64; 3] {
        let rounds = || self.emulator.rounds();
        let (first, attach) = round_trips(rounds, self.dpu.attach(request, deadline())).await;
        let first = first.unwrap();
        let retry = AttachRequest {
            attached_before: true,
            ..request.clone()
        };
        let (again, retried) = round_trips(rounds, self.dpu.attach(&retry, deadline())).await;
        assert_eq!(again.unwrap(), first);
        let volume_id = &request.volume_id;
        let detach = self
            .dpu
            .detach(volume_id, Some(&first.device_name), deadline());
        let (detached, detach) = round_trips(rounds, detach).await;
        detached.unwrap();
        self.assert_gone(volume_id).await;
        [attach, retried, detach]
    }

    /// Attaches every request at once; each must succeed.
    pub async fn attach_all_at_once(&self, requests: &[AttachRequest]) -> Vec<Attachment> {
        let attached =
            futures::future::join_all(requests.iter().map(|r| self.dpu.attach(r, deadline())))
                .await;
        attached.into_iter().map(Result::unwrap).collect()
    }

    /// Detaches every volume at once; afterwards nothing of any is left.
    pub async fn detach_all_at_once(&self, ids: &[String]) {
        let detached =
            futures::future::join_all(ids.iter().map(|id| self.dpu.detach(id, None, deadline())))
                .await;
        for result in detached {
            result.unwrap();
        }
        for id in ids {
            self.assert_gone(id).await;
        }
    }

    pub async fn attach(&self, volume_id: &str, emulation: Emulation) -> Attachment {
        let request = self.request(volume_id, emulation);
        self.dpu.attach(&request, deadline()).await.unwrap()
    }

    /// Asserts SNAP, the bdevs and the host hold nothing of the volume.
    pub async fn assert_gone(&self, volume_id: &str) {
        let names = VolumeNames::new(volume_id);
        let subsystems = self.snap.call(&NvmeSubsystemList {}).await.unwrap();
        assert!(
            subsystems.iter().all(|s| s.nqn != names.nqn),
            "subsystem of {volume_id} left: {subsystems:?}"
        );
        let virtio = self.snap.call(&VirtioBlkControllerList {}).await.unwrap();
        assert!(
            virtio
                .iter()
                .all(|c| c.vblk_id.as_deref() != Some(&names.serial)),
            "virtio-blk controller of {volume_id} left: {virtio:?}"
        );
        let bdevs = self.snap.call(&BdevGetBdevs::default()).await.unwrap();
        let device = plugin::device_name(volume_id);
        assert!(bdevs.iter().all(|b| b.name != device), "bdev {device} left");
        assert!(
            loop_devices_of(&self.backing(volume_id)).is_empty(),
            "loop device of {volume_id} left"
        );
    }
}

pub fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

pub async fn functions(snap: &RpcClient) -> Vec<EmulationFunction> {
    snap.call(&EmulationFunctionList { all: true })
        .await
        .unwrap()
}

pub async fn function_count(stack: &Stack) -> usize {
    stack
        .dpu
        .inventory(deadline())
        .await
        .unwrap()
        .functions
        .len()
}

pub fn nvme_bdf(locator: &HostLocator) -> &str {
    match locator {
        HostLocator::Nvme { bdf, .. } => bdf,
        other => panic!("not NVMe: {other:?}"),
    }
}
