//! A ReadWriteMany volume on two hosts: a filesystem device (virtio-fs)
//! that each host's node mounts through its own DPU's function, over the one
//! tree the plugin serves. What one host writes and closes the other reads;
//! one host leaves while the other keeps writing. Prints what each saw.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::bail;
use snap_csi_harness::csi::{Clients, Kind, Volume, parameters};

use crate::pod_host::PodHost;

/// The second host: its node's endpoint, kubelet directory, and where its
/// pods run.
pub struct OtherHost {
    pub node: String,
    pub kubelet: PathBuf,
    pub pod: PodHost,
}

/// What host `host` (on `pod`) finds in `name` in `dir`: it must be `text`.
fn read_back(pod: &PodHost, dir: &Path, name: &str, text: &str, host: &str) -> anyhow::Result<()> {
    let found = pod.read_file(dir, name)?;
    if found != text {
        bail!("{host} read {found:?} in {name}, not {text:?}");
    }
    Ok(())
}

/// The volume's life on both hosts; a line per event, as each host saw it.
/// `pinned`: the DPU of host A it must go to (host A has two DPUs).
pub async fn shared(
    clients: &mut Clients,
    (kubelet, pod_a): (&Path, &PodHost),
    other: &OtherHost,
    size_mib: i64,
    pinned: Option<&str>,
) -> anyhow::Result<Vec<String>> {
    let mut b = clients.with_node(&other.node).await?;
    let name = "player-shared-fs";
    let mut on_a = clients
        .create_with(
            kubelet,
            name,
            &Kind::Shared,
            size_mib,
            parameters("fs", "virtio-fs", None),
        )
        .await?;
    let on_b: Volume = on_a.on_host(&other.kubelet, name)?;
    // Host A's stage alone carries the pin (local-up's second DPU makes no
    // filesystem devices): host B's one DPU has another name, and a node
    // refuses a volume pinned to a DPU it lacks. Kubernetes hands every
    // node the same context; a host whose DPUs all serve virtio-fs needs no
    // pin.
    if let Some(dpu) = pinned {
        super::pin(&mut on_a, dpu);
    }
    let mut seen = vec![format!(
        "shared volume {} (ReadWriteMany, virtio-fs), on host A and host B, each through its own DPU",
        on_a.id
    )];
    let pod_b = &other.pod;
    for (host, node, volume, pod) in [
        ("A", &mut *clients, &on_a, pod_a),
        ("B", &mut b, &on_b, pod_b),
    ] {
        pod.prepare(volume)?;
        let started = Instant::now();
        node.stage(volume).await?;
        node.publish(volume).await?;
        seen.push(format!(
            "host {host}: staged and published in {:.1} ms",
            started.elapsed().as_secs_f64() * 1000.0
        ));
    }
    let from_a = "written on host A";
    pod_a.write_file(&on_a.target, "from-a.txt", from_a)?;
    read_back(pod_b, &on_b.target, "from-a.txt", from_a, "host B")?;
    seen.push(format!("host A wrote from-a.txt; host B read {from_a:?}"));
    let from_b = "written on host B";
    pod_b.write_file(&on_b.target, "from-b.txt", from_b)?;
    read_back(pod_a, &on_a.target, "from-b.txt", from_b, "host A")?;
    seen.push(format!("host B wrote from-b.txt; host A read {from_b:?}"));

    clients.unpublish(&on_a).await?;
    clients.unstage(&on_a).await?;
    let after = "host B writes on after host A left";
    pod_b.write_file(&on_b.target, "after-a.txt", after)?;
    read_back(pod_b, &on_b.target, "after-a.txt", after, "host B")?;
    let listed = pod_b.list(&on_b.target)?;
    seen.push(format!(
        "host A unstaged; host B kept writing and sees {}",
        listed.join(", ")
    ));
    b.unpublish(&on_b).await?;
    b.unstage(&on_b).await?;
    clients.delete(&on_a).await?;
    seen.push("host B unstaged; the volume is deleted".to_string());
    Ok(seen)
}
