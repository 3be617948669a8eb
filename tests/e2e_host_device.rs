//! End to end on the emulator, as root with real loop devices: an AIO bdev is
//! exposed through an emulated NVMe controller (NVIDIA's attach order), found
//! on the "host" only through the sysfs tree, written through its block
//! device, torn down, exposed again through virtio-blk and read back.
//! Nothing may be left behind: no loop device, no tree.

mod common;

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use common::{Emulator, discovered, loop_devices_of, sparse_file};
use snap_csi::host::{Sysfs, normalize_bdf};
use snap_csi::jsonrpc::RpcClient;
use snap_csi::spdk::bdev::{BdevAioCreate, BdevAioDelete};
use snap_csi::spdk::snap::{
    EmulationFunction, EmulationFunctionList, EmulationType, NvmeControllerAttachNs,
    NvmeControllerCreate, NvmeControllerDestroy, NvmeControllerDetachNs, NvmeControllerList,
    NvmeControllerResume, NvmeNamespaceCreate, NvmeNamespaceDestroy, NvmeSubsystemCreate,
    NvmeSubsystemDestroy, NvmeSubsystemList, VirtioBlkControllerCreate, VirtioBlkControllerDestroy,
    VirtioBlkControllerList,
};

const SIZE: u64 = 64 << 20;
const OFFSET: u64 = 3 << 20;

/// The host address of a function of `kind` that has no controller.
async fn free_function(client: &RpcClient, kind: EmulationType) -> String {
    let functions: Vec<EmulationFunction> = client
        .call(&EmulationFunctionList { all: true })
        .await
        .unwrap();
    functions
        .iter()
        .filter(|pf| pf.emulation_type == kind)
        .flat_map(|pf| {
            std::iter::once((pf.pci_bdf.clone(), pf.ctrl_id.clone())).chain(
                pf.vfs
                    .iter()
                    .map(|vf| (vf.pci_bdf.clone(), vf.ctrl_id.clone())),
            )
        })
        .find(|(_, ctrl)| ctrl.is_none())
        .map(|(bdf, _)| bdf)
        .expect("a free function")
}

fn pattern() -> Vec<u8> {
    (0..(1 << 20))
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

fn write_through(node: &Path, data: &[u8]) {
    let mut device = OpenOptions::new().write(true).open(node).unwrap();
    device.seek(SeekFrom::Start(OFFSET)).unwrap();
    device.write_all(data).unwrap();
    device.sync_all().unwrap();
}

fn read_through(node: &Path, len: usize) -> Vec<u8> {
    let mut device = OpenOptions::new().read(true).open(node).unwrap();
    device.seek(SeekFrom::Start(OFFSET)).unwrap();
    let mut data = vec![0; len];
    device.read_exact(&mut data).unwrap();
    data
}

#[tokio::test]
async fn a_volume_through_nvme_then_virtio_blk_keeps_its_data_and_leaves_nothing() {
    let emulator = Emulator::start().await;
    let client = emulator.client();
    let sysfs = Sysfs::new(&emulator.sysfs_root);
    let backing = emulator.root().join("vol1.img");
    sparse_file(&backing, SIZE);
    client
        .call(&BdevAioCreate {
            name: "aio-vol1".into(),
            filename: backing.display().to_string(),
            block_size: Some(512),
            readonly: None,
        })
        .await
        .unwrap();

    // NVMe, in NVIDIA's order: subsystem, namespace, controller suspended, attach, resume.
    let nqn = "nqn.2022-10.io.nvda.nvme:snap-csi-vol1".to_string();
    let uuid = "3f0f4a52-8c5e-4a43-9a43-5d1a8c1f0001".to_string();
    let bdf = free_function(&client, EmulationType::Nvme).await;
    client
        .call(&NvmeSubsystemCreate {
            nqn: nqn.clone(),
            mn: None,
            sn: None,
            nn: None,
            mnan: None,
        })
        .await
        .unwrap();
    client
        .call(&NvmeNamespaceCreate {
            bdev_type: "spdk".into(),
            nqn: nqn.clone(),
            nsid: 1,
            uuid: uuid.clone(),
            bdev_name: "aio-vol1".into(),
        })
        .await
        .unwrap();
    let ctrl_id = client
        .call(&NvmeControllerCreate {
            nqn: nqn.clone(),
            pci_bdf: Some(bdf.clone()),
            suspended: Some(true),
            ..Default::default()
        })
        .await
        .unwrap()
        .ctrl_id;
    client
        .call(&NvmeControllerAttachNs {
            ctrl_id: ctrl_id.clone(),
            nsid: 1,
        })
        .await
        .unwrap();
    assert_eq!(
        sysfs
            .find_nvme_namespace(&bdf, 1, Some(&uuid), None)
            .unwrap(),
        None,
        "a suspended controller is invisible to the host"
    );
    client
        .call(&NvmeControllerResume {
            ctrl_id: ctrl_id.clone(),
        })
        .await
        .unwrap();

    let listed = client.call(&NvmeControllerList {}).await.unwrap();
    let ours = listed.iter().find(|c| c.ctrl_id == ctrl_id).unwrap();
    assert_eq!(ours.namespaces[0].nsid, 1);
    let subsystems = client.call(&NvmeSubsystemList {}).await.unwrap();
    let subsystem = subsystems.iter().find(|s| s.nqn == nqn).unwrap();
    assert_eq!(subsystem.namespaces[0].bdev, "aio-vol1");

    let device = discovered("the namespace appears on the host once resumed", || {
        sysfs
            .find_nvme_namespace(&bdf, 1, Some(&uuid), None)
            .unwrap()
    })
    .await;
    assert_eq!(device.size_bytes, SIZE);
    assert!(
        device.node.to_string_lossy().starts_with("/dev/loop"),
        "{device:?}"
    );
    assert_eq!(loop_devices_of(&backing).len(), 1);
    let data = pattern();
    write_through(&device.node, &data);

    // Teardown in reverse; the host side goes with it.
    client
        .call(&NvmeControllerDetachNs {
            ctrl_id: ctrl_id.clone(),
            nsid: 1,
        })
        .await
        .unwrap();
    client
        .call(&NvmeControllerDestroy {
            ctrl_id: ctrl_id.clone(),
            force: Some(true),
        })
        .await
        .unwrap();
    client
        .call(&NvmeNamespaceDestroy {
            nqn: nqn.clone(),
            nsid: 1,
        })
        .await
        .unwrap();
    client
        .call(&NvmeSubsystemDestroy { nqn: nqn.clone() })
        .await
        .unwrap();
    assert_eq!(
        sysfs.find_nvme_namespace(&bdf, 1, None, None).unwrap(),
        None
    );
    assert!(
        loop_devices_of(&backing).is_empty(),
        "NVMe teardown detached the loop device"
    );
    let function_dir = emulator
        .sysfs_root
        .join("bus/pci/devices")
        .join(normalize_bdf(&bdf));
    assert!(
        !function_dir.join("nvme").exists(),
        "the controller left the host"
    );

    // The same bdev through virtio-blk: the data is still there.
    let serial = "snap-csi-vol1";
    let vblk_bdf = free_function(&client, EmulationType::VirtioBlk).await;
    let ctrl = client
        .call(&VirtioBlkControllerCreate {
            pci_bdf: Some(vblk_bdf.clone()),
            bdev: Some("aio-vol1".into()),
            vblk_id: Some(serial.into()),
            ..Default::default()
        })
        .await
        .unwrap()
        .ctrl_id;
    let listed = client.call(&VirtioBlkControllerList {}).await.unwrap();
    assert!(listed.iter().any(|c| c.ctrl_id == ctrl));
    let disk = discovered("the virtio-blk disk appears on the host", || {
        sysfs.find_virtio_blk(&vblk_bdf, serial).unwrap()
    })
    .await;
    assert_eq!(disk.size_bytes, SIZE);
    assert_eq!(read_through(&disk.node, data.len()), data);

    client
        .call(&VirtioBlkControllerDestroy {
            ctrl: ctrl.clone(),
            force: Some(true),
        })
        .await
        .unwrap();
    assert_eq!(sysfs.find_virtio_blk(&vblk_bdf, serial).unwrap(), None);
    client
        .call(&BdevAioDelete {
            name: "aio-vol1".into(),
        })
        .await
        .unwrap();
    let sysfs_root = emulator.sysfs_root.clone();
    emulator.stop().await;

    assert!(loop_devices_of(&backing).is_empty(), "no loop device left");
    let leftovers: Vec<_> = walk(&sysfs_root);
    assert!(leftovers.is_empty(), "no tree left: {leftovers:?}");
}

/// Every file still under `root` (an absent root is empty).
fn walk(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out
}
