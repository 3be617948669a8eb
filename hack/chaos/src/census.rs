//! The census at a quiet point (every volume deleted, no fault in flight):
//! everything a volume's life makes must be gone. Each thing found is one
//! leak, on each of the host's DPUs: SNAP's bdevs, NVMe subsystems and
//! controllers (but for the packed placement's pool, kept for the next
//! volume: only a namespace on it is a leak), virtio-blk controllers and
//! NVMe-oF initiator controllers, fsdevs and virtio-fs devices (a virtio-fs
//! function with no device is kept: a spare the next attach takes, see
//! `src/dpu/virtiofs.rs`), each path of a multipath one named; the plugin's
//! devices; then the NVMe-oF target's lvols and subsystems (with the
//! listeners each lacks); the vendor's volumes (CSI ListVolumes through the
//! proxy), its AIO files and its filesystem share's entries; the node's
//! records; mounts, loop devices and kubelet directories below the stack. On
//! a host with two DPUs it looks again for up to [`CLEARING_BUDGET`] while it
//! finds leaks: the node clears what a DPU it passed over may hold in the
//! background.
//!
//! Before it, while the round's last volumes still live ([`paths_settle`],
//! also after each path fault): every subsystem on the target listens on
//! every address again, and every path on each DPU's plugin's page is
//! connected. After a DPU-down fault, while volumes live
//! ([`misplaced_settle`]): no volume has objects on a DPU its record does
//! not name.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use snap_csi::dpu::names::POOL_NQN_PREFIX;
use snap_csi::json_dir::JsonDir;
use snap_csi::jsonrpc::RpcClient;
use snap_csi::node::records::VolumeRecord;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::nvidia::storage::plugins::v1 as plugins;
use snap_csi::spdk::bdev::BdevGetBdevs;
use snap_csi::spdk::fsdev::FrameworkGetConfig;
use snap_csi::spdk::nvme::BdevNvmeGetControllers;
use snap_csi::spdk::nvmf::{ListenAddress, NvmfGetSubsystems, NvmfSubsystem};
use snap_csi::spdk::snap::{
    NvmeController, NvmeControllerList, NvmeSubsystem, NvmeSubsystemList, VirtioBlkControllerList,
    VirtioFsDocaGetFunctions, VirtioFsGetDevices,
};
use snap_csi_harness::csi::{Clients, channel, volume_parents};
use snap_csi_harness::dpus::held;
use snap_csi_harness::prom::{Page, scrape};
use snap_csi_harness::stack::{DpuParts, Stack};

/// The target's own pool, which local-up makes and no volume owns.
const TARGET_POOL: &str = "pool0";
/// The plugin's gauge of a remote volume's path: 1 while SPDK has it connected.
const PATH_CONNECTED: &str = "snap_csi_plugin_nvmf_path_connected";
/// How long the node's background clearing of what a DPU it passed over
/// holds of a volume may take after the DPU's return: its detach is tried
/// 1, 3, 7, 15 and 31 s after the stage, so a DPU back within 31 s (a
/// DPU-down fault holds it some 20 s at most) is cleared within 16 s of it.
pub const CLEARING_BUDGET: Duration = Duration::from_secs(30);

/// What the census found: leaks, and what the packed placement keeps for
/// the next volume on purpose (empty pool controllers), one line each.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Found {
    pub leaks: Vec<String>,
    pub kept: Vec<String>,
}

/// Everything found left behind; `max_pools` is the most pool subsystems
/// the round's packed volumes can have needed at once on one DPU, `paths`
/// the target's listener addresses seen in the round.
pub async fn census(
    stack: &Stack,
    clients: &Clients,
    max_pools: usize,
    paths: &[ListenAddress],
) -> anyhow::Result<Found> {
    let mut left = Vec::new();
    let mut kept = Vec::new();
    for dpu in stack.dpu_parts() {
        let found = dpu_census(&dpu, max_pools).await?;
        let named = |lines: Vec<String>| lines.into_iter().map(|l| format!("{}: {l}", dpu.name));
        left.extend(named(found.leaks));
        kept.extend(named(found.kept));
    }

    let target = RpcClient::with_timeout(stack.target_socket(), Duration::from_secs(10));
    for bdev in target
        .call(&BdevGetBdevs::default())
        .await
        .context("target bdev_get_bdevs")?
    {
        if bdev.name != TARGET_POOL {
            left.push(format!("target bdev: {} {:?}", bdev.name, bdev.aliases));
        }
    }
    let subsystems = volume_subsystems(
        target
            .call(&NvmfGetSubsystems { nqn: None })
            .await
            .context("target nvmf_get_subsystems")?,
    );
    let mut paths = paths.to_vec();
    for subsystem in &subsystems {
        learn(&mut paths, &subsystem.listen_addresses);
    }
    for subsystem in &subsystems {
        let lacks = missing_listeners(std::slice::from_ref(subsystem), &paths);
        let lacks = if lacks.is_empty() {
            String::new()
        } else {
            format!(" ({})", lacks.join(", "))
        };
        left.push(format!("target subsystem: {}{lacks}", subsystem.nqn));
    }

    let volumes = clients
        .controller
        .clone()
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .context("ListVolumes")?
        .into_inner();
    for entry in volumes.entries {
        if let Some(volume) = entry.volume {
            left.push(format!("vendor volume: {}", volume.volume_id));
        }
    }

    // The pool's own directories (snapshots, their records) are no volume's.
    left.extend(
        files_below(&stack.dir.join("aio-pool"))?
            .into_iter()
            .map(|f| format!("vendor AIO file: {}", f.display())),
    );
    // The share's image and snapshot directories (and the snapshots'
    // records') are no volume's; what they hold is.
    left.extend(
        entries(&stack.dir.join("fs-share"))?
            .into_iter()
            .filter(|e| e != ".snapshots" && e != ".images")
            .chain(entries(&stack.dir.join("fs-share/.images"))?)
            .chain(
                entries(&stack.dir.join("fs-share/.snapshots"))?
                    .into_iter()
                    .filter(|e| e != "records"),
            )
            .chain(entries(&stack.dir.join("fs-share/.snapshots/records"))?)
            .map(|e| format!("vendor fs share entry: {e}")),
    );
    left.extend(
        entries(&stack.node_state_dir().join("volumes"))?
            .into_iter()
            .map(|e| format!("node record: {e}")),
    );
    left.extend(kubelet_leftovers(&stack.kubelet)?);

    let dir = stack.dir.display().to_string();
    // Each emulator's data path is its own FUSE mount, up while it serves a
    // volume that needs it and kept like its socket; what a volume would
    // leave on it is a loop device, counted below. The filesystem share is
    // local-up's, up for the stack's life.
    let own: Vec<String> = stack
        .dpu_parts()
        .iter()
        .map(|dpu| dpu.snap_dir.join("host/datapath"))
        .chain([stack.dir.join("fs-share")])
        .map(|path| path.display().to_string())
        .collect();
    let share_image = stack.dir.join("fs-share.img").display().to_string();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").context("mountinfo")?;
    left.extend(
        mounts
            .lines()
            .filter(|l| l.contains(&dir))
            .filter(|l| {
                !l.split(' ')
                    .nth(4)
                    .is_some_and(|at| own.iter().any(|o| o == at))
            })
            .map(|l| format!("mount: {l}")),
    );
    let loops = std::process::Command::new("losetup")
        .arg("-a")
        .output()
        .context("losetup -a")?;
    left.extend(
        String::from_utf8_lossy(&loops.stdout)
            .lines()
            .filter(|l| l.contains(&dir) && !l.contains(&share_image))
            .map(|l| format!("loop device: {l}")),
    );
    Ok(Found { leaks: left, kept })
}

/// What one DPU's SNAP and plugin hold with every volume gone (see the
/// module's comment).
async fn dpu_census(dpu: &DpuParts, max_pools: usize) -> anyhow::Result<Found> {
    let mut left = Vec::new();
    let snap = RpcClient::with_timeout(&dpu.snap_socket, Duration::from_secs(10));
    let named = |what: &str, names: Vec<String>| -> Vec<String> {
        names
            .into_iter()
            .map(|n| format!("SNAP {what}: {n}"))
            .collect()
    };
    left.extend(named(
        "bdev",
        snap.call(&BdevGetBdevs::default())
            .await
            .context("SNAP bdev_get_bdevs")?
            .into_iter()
            .map(|b| b.name)
            .collect(),
    ));
    let subsystems = snap
        .call(&NvmeSubsystemList {})
        .await
        .context("SNAP nvme_subsystem_list")?;
    let controllers = snap
        .call(&NvmeControllerList {})
        .await
        .context("SNAP nvme_controller_list")?;
    let nvme = judge_nvme(&subsystems, &controllers, max_pools);
    left.extend(nvme.leaks);
    let mut kept = nvme.kept;
    let fsdevs = snap
        .call(&FrameworkGetConfig {
            name: "fsdev".into(),
        })
        .await
        .context("SNAP framework_get_config fsdev")?;
    left.extend(named(
        "fsdev",
        fsdevs
            .iter()
            .filter_map(|c| c.fsdev().map(|(name, _)| name.to_string()))
            .collect(),
    ));
    let fs_devices = snap
        .call(&VirtioFsGetDevices {})
        .await
        .context("SNAP virtio_fs_get_devices")?;
    let fs_functions = snap
        .call(&VirtioFsDocaGetFunctions {})
        .await
        .context("SNAP virtio_fs_doca_get_functions")?;
    let functions = fs_functions
        .iter()
        .map(|m| m.functions.len())
        .sum::<usize>();
    if functions > fs_devices.len() {
        kept.push(format!(
            "SNAP virtio-fs functions with no device: {} (spares the next attach takes)",
            functions - fs_devices.len()
        ));
    }
    left.extend(named(
        "virtio-fs device",
        fs_devices.into_iter().map(|d| d.name).collect(),
    ));
    left.extend(named(
        "virtio-blk controller",
        snap.call(&VirtioBlkControllerList {})
            .await
            .context("SNAP virtio_blk_controller_list")?
            .into_iter()
            .map(|c| c.ctrl_id)
            .collect(),
    ));
    // A multipath controller is one name over its paths: each one named.
    left.extend(named(
        "NVMe-oF initiator controller",
        snap.call(&BdevNvmeGetControllers { name: None })
            .await
            .context("SNAP bdev_nvme_get_controllers")?
            .into_iter()
            .map(|c| {
                let paths: Vec<String> = c
                    .ctrlrs
                    .iter()
                    .map(|p| {
                        format!(
                            "{}:{} {}",
                            p.trid.traddr,
                            p.trid.trsvcid.as_deref().unwrap_or("-"),
                            p.state
                        )
                    })
                    .collect();
                format!("{} (paths: {})", c.name, paths.join(", "))
            })
            .collect(),
    ));
    for device in plugin_devices(dpu).await? {
        left.push(format!(
            "plugin device: {} (volume {})",
            device.device_name, device.volume_id
        ));
    }
    Ok(Found { leaks: left, kept })
}

/// The devices the DPU's plugin holds (its ListDevices).
async fn plugin_devices(
    dpu: &DpuParts,
) -> anyhow::Result<Vec<plugins::list_devices_response::Entry>> {
    let mut plugin = plugins::storage_plugin_service_client::StoragePluginServiceClient::new(
        channel(&format!("unix://{}", dpu.plugin_socket.display())).await?,
    );
    Ok(plugin
        .list_devices(plugins::ListDevicesRequest::default())
        .await
        .with_context(|| format!("the plugin's ListDevices on {}", dpu.name))?
        .into_inner()
        .entries)
}

/// Every volume the node has a record of, with the DPU that record names
/// (an older node's record names none: the first).
fn recorded_dpus(stack: &Stack, first: &str) -> anyhow::Result<Vec<(String, String)>> {
    // Read as another process's: a temp file there is the node's write in flight.
    let all: Vec<Result<VolumeRecord, _>> =
        JsonDir::of_another(stack.node_state_dir().join("volumes"))
            .all()
            .context("reading the node's records")?;
    Ok(all
        .into_iter()
        .flatten()
        .map(|r| {
            let dpu = r.dpu.unwrap_or_else(|| first.to_string());
            (r.volume_id, dpu)
        })
        .collect())
}

/// One line per volume object on a DPU the volume's record does not name:
/// an exposure in its SNAP (by the names derived from the volume id) or a
/// device of its plugin. The records are read before and after the DPUs,
/// and only a volume both reads place alike is judged, so that a volume
/// unstaged and staged elsewhere meanwhile is not taken for one misplaced.
pub async fn misplaced(stack: &Stack) -> anyhow::Result<Vec<String>> {
    let dpus = stack.dpu_parts();
    let first = &dpus[0].name;
    let before = recorded_dpus(stack, first)?;
    let mut found = Vec::new();
    for (volume_id, home) in &before {
        for dpu in dpus.iter().filter(|d| &d.name != home) {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            let held = held(&dpu.plugin_socket, &dpu.snap_socket, volume_id, deadline).await?;
            found.extend(held.into_iter().map(|what| {
                let line = format!(
                    "volume {volume_id}, recorded on {home}: on {}, {what}",
                    dpu.name
                );
                ((volume_id.clone(), home.clone()), line)
            }));
        }
    }
    let after = recorded_dpus(stack, first)?;
    Ok(found
        .into_iter()
        .filter(|(record, _)| after.contains(record))
        .map(|(_, line)| line)
        .collect())
}

/// Waits until [`misplaced`] finds nothing; how long that took, or what it
/// found last (or why it could not look) once `budget` has passed.
pub async fn misplaced_settle(stack: &Stack, budget: Duration) -> Result<Duration, Vec<String>> {
    let started = Instant::now();
    loop {
        let left = match misplaced(stack).await {
            Ok(left) if left.is_empty() => return Ok(started.elapsed()),
            Ok(left) => left,
            Err(error) => vec![format!("{error:#}")],
        };
        if started.elapsed() >= budget {
            return Err(left);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The census once every process answers: a process killed last may still
/// be starting, so it is asked again, once a second, up to 30 times. On a
/// host with two DPUs, leaks found are looked for again, once a second, for
/// up to [`CLEARING_BUDGET`] (the node's background clearing).
pub async fn when_quiet(
    stack: &Stack,
    clients: &Clients,
    (max_pools, paths): (usize, &[ListenAddress]),
    name: &str,
) -> anyhow::Result<Found> {
    let started = Instant::now();
    let clearing = if stack.dpus.len() > 1 {
        CLEARING_BUDGET
    } else {
        Duration::ZERO
    };
    let mut failed = 0;
    loop {
        match census(stack, clients, max_pools, paths).await {
            Ok(found) if found.leaks.is_empty() || started.elapsed() >= clearing => {
                return Ok(found);
            }
            Ok(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            Err(error) if failed < 29 => {
                failed += 1;
                eprintln!("chaos: {name}: census: {error:#}; asking again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(error) => return Err(error.context("the census")),
        }
    }
}

/// Adds the addresses of `found` not in `known` yet, keeping `known` in
/// order (so that a seed picks the same one).
pub fn learn(known: &mut Vec<ListenAddress>, found: &[ListenAddress]) {
    for address in found {
        if !known.contains(address) {
            known.push(address.clone());
        }
    }
    known.sort_by(|a, b| (&a.traddr, &a.trsvcid).cmp(&(&b.traddr, &b.trsvcid)));
}

/// The target's subsystems but its discovery subsystem: the volumes'.
fn volume_subsystems(all: Vec<NvmfSubsystem>) -> Vec<NvmfSubsystem> {
    all.into_iter()
        .filter(|s| s.subtype != "Discovery")
        .collect()
}

/// One line per subsystem and address of `paths` it does not listen on (the
/// controller exports every volume on each of the target's addresses).
fn missing_listeners(subsystems: &[NvmfSubsystem], paths: &[ListenAddress]) -> Vec<String> {
    let mut left = Vec::new();
    for subsystem in subsystems {
        for path in paths {
            if !subsystem.listen_addresses.contains(path) {
                left.push(format!(
                    "subsystem {} lacks listener {}:{}",
                    subsystem.nqn, path.traddr, path.trsvcid
                ));
            }
        }
    }
    left
}

/// One line per path on the plugin's page that SPDK does not have connected.
fn disconnected(page: &Page) -> Vec<String> {
    let mut left = Vec::new();
    for volume in page.by_label(PATH_CONNECTED, "volume_id", &[]).into_keys() {
        let want = [("volume_id", volume.as_str())];
        for (port, connected) in page.by_label(PATH_CONNECTED, "trsvcid", &want) {
            if connected < 1.0 {
                left.push(format!(
                    "volume {volume}: its path to port {port} is not connected"
                ));
            }
        }
    }
    left
}

/// What keeps a remote volume's paths from being whole now: a subsystem on
/// the target that does not listen on every address (those in `known`, and
/// any a subsystem listens on, learned into it), a path on a DPU's plugin's
/// page not connected. An error when the target or a page does not answer.
pub async fn paths_whole(
    stack: &Stack,
    known: &mut Vec<ListenAddress>,
) -> anyhow::Result<Vec<String>> {
    let target = RpcClient::with_timeout(stack.target_socket(), Duration::from_secs(10));
    let subsystems = volume_subsystems(
        target
            .call(&NvmfGetSubsystems { nqn: None })
            .await
            .context("target nvmf_get_subsystems")?,
    );
    for subsystem in &subsystems {
        learn(known, &subsystem.listen_addresses);
    }
    let mut left = missing_listeners(&subsystems, known);
    for dpu in stack.dpu_parts() {
        if dpu.plugin_metrics.is_empty() {
            continue;
        }
        let page = scrape(&dpu.plugin_metrics)
            .await
            .with_context(|| format!("the page of {}'s plugin", dpu.name))?;
        left.extend(disconnected(&page));
    }
    Ok(left)
}

/// Waits until [`paths_whole`] finds nothing wrong; what it found last (or
/// why it could not look) once `budget` has passed.
pub async fn paths_settle(
    stack: &Stack,
    known: &mut Vec<ListenAddress>,
    budget: Duration,
) -> Result<(), Vec<String>> {
    let started = std::time::Instant::now();
    loop {
        let left = match paths_whole(stack, known).await {
            Ok(left) if left.is_empty() => return Ok(()),
            Ok(left) => left,
            Err(error) => vec![format!("{error:#}")],
        };
        if started.elapsed() >= budget {
            return Err(left);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// SNAP's NVMe subsystems and controllers with every volume gone. A
/// dedicated volume's subsystem and controller are leaks. A pool subsystem
/// and its controllers are kept on purpose (the next packed volume attaches
/// to the live controller: no function taken, no hot-plug), but every
/// namespace still on one is a leak (its volume is gone), and so is every
/// pool beyond `max_pools`: a new pool is built only when every pool is
/// full, so no more can be needed than the most packed volumes at once fill.
fn judge_nvme(
    subsystems: &[NvmeSubsystem],
    controllers: &[NvmeController],
    max_pools: usize,
) -> Found {
    let mut found = Found::default();
    let pools = subsystems
        .iter()
        .filter(|s| s.nqn.starts_with(POOL_NQN_PREFIX))
        .count();
    if pools > max_pools {
        found.leaks.push(format!(
            "SNAP has {pools} pool subsystems; the volumes at once needed at most {max_pools}"
        ));
    }
    let pool =
        |nqn: &str| nqn.starts_with(POOL_NQN_PREFIX) && subsystems.iter().any(|s| s.nqn == nqn);
    for subsystem in subsystems {
        if !pool(&subsystem.nqn) {
            found.leaks.push(format!(
                "SNAP NVMe subsystem: {} ({} namespaces)",
                subsystem.nqn,
                subsystem.namespaces.len()
            ));
            continue;
        }
        found
            .kept
            .push(format!("SNAP pool subsystem {}", subsystem.nqn));
        for namespace in &subsystem.namespaces {
            found.leaks.push(format!(
                "SNAP namespace {} on pool subsystem {} (bdev {}, uuid {}): no volume is staged",
                namespace.nsid,
                subsystem.nqn,
                namespace.bdev,
                namespace.uuid.as_deref().unwrap_or("none")
            ));
        }
    }
    for controller in controllers {
        match controller.nqn.as_deref() {
            Some(nqn) if pool(nqn) => found.kept.push(format!(
                "SNAP pool controller {} on {nqn}",
                controller.ctrl_id
            )),
            nqn => found.leaks.push(format!(
                "SNAP NVMe controller: {} (subsystem {})",
                controller.ctrl_id,
                nqn.unwrap_or("none")
            )),
        }
    }
    found
}

/// Names in `dir` (none when it does not exist).
fn entries(dir: &Path) -> anyhow::Result<Vec<String>> {
    match std::fs::read_dir(dir) {
        Ok(read) => read
            .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("reading {}", dir.display())),
    }
}

/// Every file (not directory) below `dir`.
fn files_below(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for name in entries(dir)? {
        let path = dir.join(name);
        if path.is_dir() {
            files.extend(files_below(&path)?);
        } else {
            files.push(path);
        }
    }
    Ok(files)
}

/// Anything below the volumes' kubelet directories (the harness removes the
/// directories it made; the target is the node's to remove).
fn kubelet_leftovers(kubelet: &Path) -> anyhow::Result<Vec<String>> {
    let mut left = Vec::new();
    for dir in volume_parents(kubelet) {
        for name in entries(&dir)? {
            left.push(format!("kubelet directory: {}", dir.join(name).display()));
        }
    }
    Ok(left)
}

#[cfg(test)]
mod tests {
    use super::*;
    use snap_csi::spdk::snap::NvmeSubsystemNamespace;

    fn subsystem(nqn: &str, namespaces: &[&str]) -> NvmeSubsystem {
        NvmeSubsystem {
            nqn: nqn.into(),
            sn: None,
            mn: None,
            nn: None,
            mnan: None,
            controllers: Vec::new(),
            namespaces: namespaces
                .iter()
                .enumerate()
                .map(|(i, bdev)| NvmeSubsystemNamespace {
                    nsid: u32::try_from(i).unwrap() + 1,
                    bdev: bdev.to_string(),
                    uuid: None,
                    controllers: Vec::new(),
                })
                .collect(),
        }
    }

    fn controller(ctrl_id: &str, nqn: &str) -> NvmeController {
        NvmeController {
            ctrl_id: ctrl_id.into(),
            vhca_id: 0,
            nqn: Some(nqn.into()),
            state: None,
            namespaces: Vec::new(),
        }
    }

    const POOL: &str = "nqn.2022-10.io.snap-csi:pool-0";

    fn address(port: &str) -> ListenAddress {
        ListenAddress {
            trtype: "TCP".into(),
            adrfam: "IPv4".into(),
            traddr: "127.0.0.1".into(),
            trsvcid: port.into(),
        }
    }

    fn target_subsystem(nqn: &str, ports: &[&str]) -> NvmfSubsystem {
        NvmfSubsystem {
            nqn: nqn.into(),
            subtype: "NVMe".into(),
            listen_addresses: ports.iter().map(|p| address(p)).collect(),
            allow_any_host: true,
            serial_number: None,
            model_number: None,
            namespaces: Vec::new(),
        }
    }

    #[test]
    fn a_subsystem_lacking_one_of_the_targets_listeners_is_named() {
        let mut known = Vec::new();
        let subsystems = [
            target_subsystem("nqn.a", &["4421", "4420"]),
            target_subsystem("nqn.b", &["4420"]),
        ];
        for s in &subsystems {
            learn(&mut known, &s.listen_addresses);
        }
        assert_eq!(known, [address("4420"), address("4421")]);
        assert_eq!(
            missing_listeners(&subsystems, &known),
            ["subsystem nqn.b lacks listener 127.0.0.1:4421"]
        );
        assert!(missing_listeners(&subsystems[..1], &known).is_empty());
    }

    #[test]
    fn a_path_the_plugin_shows_disconnected_is_named() {
        let line = |volume: &str, port: &str, value: u8| {
            format!(
                "{PATH_CONNECTED}{{volume_id=\"{volume}\",controller=\"c\",traddr=\"127.0.0.1\",trsvcid=\"{port}\"}} {value}\n"
            )
        };
        let whole = snap_csi_harness::prom::parse(
            &[
                line("v1", "4420", 1),
                line("v1", "4421", 1),
                line("v2", "4420", 1),
            ]
            .concat(),
        );
        assert!(disconnected(&whole).is_empty());
        let broken =
            snap_csi_harness::prom::parse(&[line("v1", "4420", 1), line("v1", "4421", 0)].concat());
        assert_eq!(
            disconnected(&broken),
            ["volume v1: its path to port 4421 is not connected"]
        );
    }

    #[test]
    fn an_empty_pool_is_kept_and_a_namespace_on_it_is_a_leak() {
        let empty = judge_nvme(
            &[subsystem(POOL, &[])],
            &[controller("NvmeEmu0pf0", POOL)],
            1,
        );
        assert!(empty.leaks.is_empty(), "{:?}", empty.leaks);
        assert_eq!(empty.kept.len(), 2, "{:?}", empty.kept);

        let left = judge_nvme(
            &[subsystem(POOL, &["pvc-gone"])],
            &[controller("NvmeEmu0pf0", POOL)],
            1,
        );
        assert_eq!(left.leaks.len(), 1, "{:?}", left.leaks);
        assert!(left.leaks[0].contains("pvc-gone"), "{:?}", left.leaks);
    }

    #[test]
    fn a_dedicated_volumes_subsystem_and_controller_are_leaks() {
        let nqn = "nqn.2022-10.io.snap-csi:pvc-gone";
        let found = judge_nvme(&[subsystem(nqn, &[])], &[controller("NvmeEmu0pf1", nqn)], 1);
        assert_eq!(found.leaks.len(), 2, "{:?}", found.leaks);
        assert!(found.kept.is_empty(), "{:?}", found.kept);
        // A controller on a pool subsystem that is gone is no pool's.
        let orphan = judge_nvme(&[], &[controller("NvmeEmu0pf2", POOL)], 1);
        assert_eq!(orphan.leaks.len(), 1, "{:?}", orphan.leaks);
    }

    #[test]
    fn pools_beyond_what_the_volumes_needed_are_a_leak() {
        let pools = [
            subsystem(POOL, &[]),
            subsystem("nqn.2022-10.io.snap-csi:pool-1", &[]),
        ];
        assert!(judge_nvme(&pools, &[], 2).leaks.is_empty());
        let found = judge_nvme(&pools, &[], 1);
        assert_eq!(found.leaks.len(), 1, "{:?}", found.leaks);
        assert!(
            found.leaks[0].contains("2 pool subsystems"),
            "{:?}",
            found.leaks
        );
    }
}
