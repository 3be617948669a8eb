//! PCI functions hot-plugged into a QEMU guest, the way SNAP's arrive on a
//! BlueField's host: each into a PCIe root port of its own (ACPI hot-plug,
//! which unplugs in a fraction of a second where native PCIe hot-plug waits
//! out its 5 s attention-button delay), through QEMU's machine protocol
//! ([`Qmp`]).
//!
//! Shared by the guest host that tests boot (`hack/harness/src/guest`) and
//! the emulator's guest host (`hack/snap-emu/src/host/guest/`), so both
//! name a device's backends the same way: device `<id>` owns block node
//! `<id>-drive` or character device `<id>-chr`, which [`remove`] drops with it.

mod qmp;

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

pub use qmp::{Qmp, Refused};

/// The bytes behind a block function: a raw window of a file.
#[derive(Debug, Clone, Copy)]
pub struct Drive<'a> {
    pub file: &'a Path,
    /// Where the window starts in `file`.
    pub offset: u64,
    /// The window's length; `None` is the rest of the file, which
    /// [`resize`] can then grow.
    pub size: Option<u64>,
    pub read_only: bool,
}

impl Drive<'_> {
    /// The whole of `file`, writable.
    pub fn whole(file: &Path) -> Drive<'_> {
        Drive {
            file,
            offset: 0,
            size: None,
            read_only: false,
        }
    }

    fn add(&self, qmp: &mut Qmp, id: &str) -> anyhow::Result<()> {
        let mut node = json!({"driver": "raw", "node-name": drive_node(id),
            "read-only": self.read_only,
            "file": {"driver": "file", "filename": self.file, "read-only": self.read_only}});
        if self.offset != 0 {
            node["offset"] = json!(self.offset);
        }
        if let Some(size) = self.size {
            node["size"] = json!(size);
        }
        qmp.execute("blockdev-add", node).map(drop)
    }
}

fn drive_node(id: &str) -> String {
    format!("{id}-drive")
}

fn chardev(id: &str) -> String {
    format!("{id}-chr")
}

/// Plugs `driver` with `properties` as device `id` into root port `port`.
fn plug(
    qmp: &mut Qmp,
    driver: &str,
    id: &str,
    port: &str,
    mut properties: Value,
) -> anyhow::Result<()> {
    properties["driver"] = json!(driver);
    properties["id"] = json!(id);
    properties["bus"] = json!(port);
    qmp.execute("device_add", properties).map(drop)
}

/// A block function over one drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disk {
    /// `virtio-blk-pci`: the host reads the serial back from
    /// `/sys/block/vdX/serial`.
    VirtioBlk,
    /// An NVMe controller of a subsystem of its own, whose one namespace
    /// (NSID 1) is the drive: QEMU cannot add a namespace to a live
    /// controller, so it comes with the controller. The host shows the
    /// serial as the controller's (`/sys/class/nvme/nvmeX/serial`).
    NvmeWithNamespace,
}

/// A `disk` function over `drive`, with `serial`, as device `id` into root
/// port `port`; the drive goes if the device does not come.
pub fn add_disk(
    qmp: &mut Qmp,
    disk: Disk,
    (id, port): (&str, &str),
    drive: &Drive<'_>,
    serial: &str,
) -> anyhow::Result<()> {
    let driver = match disk {
        Disk::VirtioBlk => "virtio-blk-pci",
        Disk::NvmeWithNamespace => "nvme",
    };
    drive.add(qmp, id)?;
    let plugged = plug(
        qmp,
        driver,
        id,
        port,
        json!({"drive": drive_node(id), "serial": serial}),
    );
    if plugged.is_err() {
        let _ = qmp.execute("blockdev-del", json!({"node-name": drive_node(id)}));
    }
    plugged
}

/// A virtio-fs function with `tag`, served by the vhost-user backend
/// (virtiofsd) listening on `socket`, into root port `port`.
pub fn add_virtio_fs(
    qmp: &mut Qmp,
    id: &str,
    port: &str,
    socket: &Path,
    tag: &str,
) -> anyhow::Result<()> {
    qmp.execute(
        "chardev-add",
        json!({"id": chardev(id), "backend": {"type": "socket", "data": {
            "addr": {"type": "unix", "data": {"path": socket}}, "server": false}}}),
    )?;
    let plugged = plug(
        qmp,
        "vhost-user-fs-pci",
        id,
        port,
        json!({"chardev": chardev(id), "tag": tag}),
    );
    if plugged.is_err() {
        let _ = qmp.execute("chardev-remove", json!({"id": chardev(id)}));
    }
    plugged
}

/// An NVMe controller of the subsystem `subsys` (a `nvme-subsys` device,
/// whose serial every controller must carry) into root port `port`.
pub fn add_nvme(
    qmp: &mut Qmp,
    id: &str,
    port: &str,
    subsys: &str,
    serial: &str,
) -> anyhow::Result<()> {
    plug(
        qmp,
        "nvme",
        id,
        port,
        json!({"subsys": subsys, "serial": serial}),
    )
}

/// Unplugs device `id`, waits until the guest has let it go (QEMU's
/// `DEVICE_DELETED`), then drops its backend. An absent device is gone.
pub fn remove(qmp: &mut Qmp, id: &str, timeout: Duration) -> anyhow::Result<()> {
    match qmp.execute("device_del", json!({"id": id})) {
        Ok(_) => qmp.wait_event("DEVICE_DELETED", "device", id, timeout)?,
        Err(e)
            if e.downcast_ref::<Refused>()
                .is_some_and(|r| r.class == "DeviceNotFound") => {}
        Err(e) => return Err(e),
    }
    // Whichever backend the device had (none for a controller of a
    // subsystem's namespaces).
    let _ = qmp.execute("blockdev-del", json!({"node-name": drive_node(id)}));
    let _ = qmp.execute("chardev-remove", json!({"id": chardev(id)}));
    Ok(())
}

/// Tells the guest that device `id`'s whole-file drive is now `size` bytes
/// (a capacity-change notice, as SNAP sends after its bdev grew).
pub fn resize(qmp: &mut Qmp, id: &str, size: u64) -> anyhow::Result<()> {
    qmp.execute(
        "block_resize",
        json!({"node-name": drive_node(id), "size": size}),
    )
    .map(drop)
}
