//! DeleteVolume while a DPU still serves the volume (`--dpu-plugin`,
//! `src/csi/in_use.rs`): the controller asks the DPUs' plugins, each in
//! front of its own emulated SNAP, and refuses a volume one has a device of,
//! as a node's stage makes it (CreateDevice through the plugin API), until
//! that device is gone; a plugin it cannot ask refuses every existing volume.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::csi::{Backends, Csi, MIB, assert_code, capability, volume};
use common::share::Share;
use common::{Plugin, Source, Spdk, TIMEOUT, assert_kept_deadline, timed};
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::volumegroup as vg;
use snap_csi_spdk_plugin::backend::Devices;
use snap_csi_spdk_plugin::csi::{CsiConfig, DpuPlugin, FsConfig};
use tonic::Code;

/// A DPU: its SNAP and its plugin.
struct Dpu {
    name: &'static str,
    plugin: Plugin,
    _snap: Spdk,
}

impl Dpu {
    async fn start(name: &'static str, devices: Devices) -> Dpu {
        let snap = Spdk::snap().await;
        let plugin = Plugin::start_making(snap.socket(), devices).await;
        Dpu {
            name,
            plugin,
            _snap: snap,
        }
    }

    fn config(&self) -> DpuPlugin {
        DpuPlugin {
            name: self.name.into(),
            socket: self.plugin.socket.clone(),
        }
    }

    /// CreateDevice of `volume`, as the node's stage on this DPU makes it.
    async fn stage(&self, volume: &csi::Volume, mode: &str) -> String {
        let context = volume.volume_context.clone();
        let device = self
            .plugin
            .create_as(&volume.volume_id, mode, context)
            .await
            .unwrap();
        assert!(!device.is_empty());
        device
    }
}

fn aio() -> Backends {
    Backends {
        aio: true,
        nvmf: false,
        default: "aio",
    }
}

async fn controller(
    backends: Backends,
    plugins: Vec<DpuPlugin>,
    configure: impl FnOnce(&mut CsiConfig),
) -> Csi {
    Csi::start_with(backends, &Source::Emulator, |config| {
        config.dpu_plugins = plugins;
        configure(config);
    })
    .await
}

/// Asserts the refusal of a volume `dpu` serves as `device`, naming them.
fn assert_in_use(status: tonic::Status, volume_id: &str, dpu: &str, device: &str) {
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    let message = status.message();
    let served = format!("DPU {dpu} serves it as device {device}");
    for wanted in [volume_id, served.as_str(), "Unstage it on its host"] {
        assert!(message.contains(wanted), "{wanted:?} in {message}");
    }
}

#[tokio::test]
async fn a_staged_aio_volume_is_deleted_only_once_its_device_is_gone() {
    let dpu = Dpu::start("local-dpu", Devices::default()).await;
    let csi = controller(aio(), vec![dpu.config()], |_| {}).await;
    let created = csi
        .create(volume("pvc-staged", "aio", 8 * MIB, 0))
        .await
        .unwrap();
    let file = Path::new(&created.volume_context["path"]).to_path_buf();
    let device = dpu.stage(&created, "Block").await;

    for _retry in 0..2 {
        let refused = csi.delete(&created.volume_id).await.unwrap_err();
        assert_in_use(refused, &created.volume_id, "local-dpu", &device);
    }
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 8 * MIB);
    assert_eq!(
        csi.list_all(0).await,
        std::slice::from_ref(&created.volume_id)
    );

    // The node's unstage: DeleteDevice.
    dpu.plugin
        .delete(&created.volume_id, &device)
        .await
        .unwrap();
    csi.delete(&created.volume_id).await.unwrap();
    assert!(!file.exists());
    assert!(csi.list_all(0).await.is_empty());
    csi.delete(&created.volume_id).await.unwrap();
    assert!(csi.leftovers().await.is_empty());
}

#[tokio::test]
async fn a_staged_filesystem_volume_is_deleted_only_once_its_device_is_gone() {
    let share = Share::new(512 * MIB);
    let devices = Devices {
        block: false,
        fs_share: Some(share.dir.clone()),
        fs_nfs_server: None,
    };
    let dpu = Dpu::start("local-dpu", devices).await;
    let backends = Backends {
        aio: false,
        nvmf: false,
        default: "fs",
    };
    let csi = controller(backends, vec![dpu.config()], |config| {
        config.fs = Some(FsConfig {
            share: share.dir.clone(),
            capacity: None,
        });
    })
    .await;
    let shared = capability(
        csi::volume_capability::AccessType::Mount(Default::default()),
        csi::volume_capability::access_mode::Mode::MultiNodeMultiWriter,
    );
    let request = csi::CreateVolumeRequest {
        volume_capabilities: vec![shared],
        ..volume("pvc-fs-staged", "fs", 32 * MIB, 0)
    };
    let created = csi.create(request).await.unwrap();
    let dir = Path::new(&created.volume_context["path"]).to_path_buf();
    std::fs::write(dir.join("data"), b"still served").unwrap();
    let device = dpu.stage(&created, "Filesystem").await;

    let refused = csi.delete(&created.volume_id).await.unwrap_err();
    assert_in_use(refused, &created.volume_id, "local-dpu", &device);
    assert_eq!(std::fs::read(dir.join("data")).unwrap(), b"still served");
    assert_eq!(
        csi.list_all(0).await,
        std::slice::from_ref(&created.volume_id)
    );

    dpu.plugin
        .delete(&created.volume_id, &device)
        .await
        .unwrap();
    csi.delete(&created.volume_id).await.unwrap();
    assert!(!dir.exists());
    assert!(csi.list_all(0).await.is_empty());
    assert!(share.leftovers().is_empty(), "{:?}", share.leftovers());
}

/// Two DPUs, the device on the second only: the refusal names that one.
/// A volume group with the volume is not deleted either, nor its other
/// member.
#[tokio::test]
async fn the_dpu_that_serves_the_volume_is_named_among_several() {
    let a = Dpu::start("local-dpu", Devices::default()).await;
    let b = Dpu::start("local-dpu-b", Devices::default()).await;
    let csi = controller(aio(), vec![a.config(), b.config()], |_| {}).await;
    let staged = csi
        .create(volume("pvc-on-b", "aio", 4 * MIB, 0))
        .await
        .unwrap();
    let idle = csi
        .create(volume("pvc-idle", "aio", 4 * MIB, 0))
        .await
        .unwrap();
    let device = b.stage(&staged, "Block").await;

    let refused = csi.delete(&staged.volume_id).await.unwrap_err();
    assert!(
        !refused.message().contains("DPU local-dpu serves"),
        "{refused:?}"
    );
    assert_in_use(refused, &staged.volume_id, "local-dpu-b", &device);

    let mut groups = csi.groups.clone();
    let group = groups
        .create_volume_group(timed(
            vg::CreateVolumeGroupRequest {
                name: "group-in-use".into(),
                ..Default::default()
            },
            TIMEOUT,
        ))
        .await
        .unwrap()
        .into_inner()
        .volume_group
        .unwrap();
    let members = vec![idle.volume_id.clone(), staged.volume_id.clone()];
    groups
        .modify_volume_group_membership(timed(
            vg::ModifyVolumeGroupMembershipRequest {
                volume_group_id: group.volume_group_id.clone(),
                volume_ids: members.clone(),
                secrets: HashMap::new(),
            },
            TIMEOUT,
        ))
        .await
        .unwrap();
    let delete_group = || {
        let mut groups = groups.clone();
        let request = vg::DeleteVolumeGroupRequest {
            volume_group_id: group.volume_group_id.clone(),
            secrets: HashMap::new(),
        };
        async move { groups.delete_volume_group(timed(request, TIMEOUT)).await }
    };
    let refused = assert_code(
        delete_group().await,
        Code::FailedPrecondition,
        "a member served",
    );
    assert!(
        refused.message().contains(&group.volume_group_id),
        "{refused:?}"
    );
    assert_in_use(refused, &staged.volume_id, "local-dpu-b", &device);
    let mut listed = csi.list_all(0).await;
    listed.sort();
    assert_eq!(listed, members, "neither member deleted");
    assert_eq!(csi.state_records("volume-groups"), 1);

    b.plugin.delete(&staged.volume_id, &device).await.unwrap();
    delete_group().await.unwrap();
    assert!(csi.list_all(0).await.is_empty());
    assert_eq!(csi.state_records("volume-groups"), 0);
    assert!(csi.leftovers().await.is_empty());
}

/// A DPU whose plugin is down (its socket gone): no existing volume is
/// deleted, UNAVAILABLE naming that DPU, by the call's deadline; a volume
/// that does not exist still deletes, nothing asked.
#[tokio::test]
async fn a_dpu_that_does_not_answer_keeps_every_volume() {
    let a = Dpu::start("local-dpu", Devices::default()).await;
    let gone = Dpu::start("local-dpu-gone", Devices::default()).await;
    let csi = controller(aio(), vec![a.config(), gone.config()], |_| {}).await;
    let Dpu { plugin, _snap, .. } = gone;
    plugin.stop().await;
    let created = csi
        .create(volume("pvc-unknown", "aio", 4 * MIB, 0))
        .await
        .unwrap();

    let timeout = Duration::from_secs(2);
    let started = Instant::now();
    let request = csi::DeleteVolumeRequest {
        volume_id: created.volume_id.clone(),
        secrets: HashMap::new(),
    };
    let refused = csi
        .controller
        .clone()
        .delete_volume(timed(request, timeout))
        .await;
    assert_kept_deadline("DeleteVolume", started, timeout);
    let refused = assert_code(refused, Code::Unavailable, "a DPU's plugin down");
    for wanted in [
        "cannot tell whether volume aio-pvc-unknown is in use",
        "DPU local-dpu-gone's plugin did not list its devices in time",
    ] {
        assert!(
            refused.message().contains(wanted),
            "{wanted:?} in {refused:?}"
        );
    }
    assert!(Path::new(&created.volume_context["path"]).exists());
    assert_eq!(
        csi.list_all(0).await,
        std::slice::from_ref(&created.volume_id)
    );

    csi.delete("aio-pvc-never-made").await.unwrap();
}
