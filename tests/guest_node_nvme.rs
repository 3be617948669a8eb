//! NVMe volumes staged and published by the node on a real Linux kernel
//! (`common::guest_node`): the emulator hot-plugs each dedicated volume's
//! NVMe controller, with its namespace, into the guest.
//!
//! What the real kernel shows here and our tree does not: QEMU's namespace
//! identifiers are ignored (the kernel's BOGUS_NID quirk), so the host lists
//! no `uuid`; the node finds the namespace by its function, NSID and the
//! controller's serial, which names the volume's own subsystem.
//!
//! What this does not prove: packed namespaces (QEMU cannot add a namespace
//! to a live controller: `hack/snap-emu/src/host/guest/mod.rs`), SNAP's own
//! controller, TCG's timing.

mod common;

use common::guest_node::{Disk, GuestNode, volume_matrix};
use common::node::assert_snap_holds_nothing;

#[tokio::test(flavor = "multi_thread")]
async fn dedicated_nvme_volumes_staged_by_the_node_on_a_real_kernel() {
    let mut host = GuestNode::start("nvme").await;
    volume_matrix(&mut host, Disk::Nvme).await;

    let left = host.sh("ls /sys/class/nvme").unwrap();
    assert_eq!(left.trim(), "", "the guest still has {left}");
    assert_snap_holds_nothing(&host.emulator).await;
}
