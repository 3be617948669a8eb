//! A host with two DPUs (issue 24), as its user checks it, in both modes
//! (`SNAP_CSI_TEST_DPU=split`: an agent per DPU, each with its own
//! certificate and link). `common::dpus` gives the node a second DPU: a SNAP
//! emulator in PCI domain 0001 on the first's sysfs root, its own plugin, in
//! split mode its own agent; the node lists both in its `dpus`.
//!
//! - Volumes spread over both DPUs (NVMe and virtio-blk, filesystem and
//!   block): each on the DPU its record names and only there in SNAP's
//!   listings, its disk under that DPU's PCI domain, its data read back. A
//!   volume whose context names a DPU (`snap-csi.io/dpu`) goes there; one
//!   naming a DPU the node lacks is FAILED_PRECONDITION and nothing is made
//!   anywhere. NodeGetInfo counts both DPUs' functions and gives a topology
//!   key per DPU, valued with the node id, and the first under the legacy
//!   key. After the unstages neither DPU holds anything.
//! - One DPU dying, three ways: its SNAP stopped (and later started again,
//!   empty, as SPDK starts), its link gone (split mode: its agent stopped;
//!   co-located: its vendor plugin) and its SNAP hung (every request held,
//!   then answered). The other DPU's volumes keep reading and writing; the
//!   dead one's report abnormal naming it; Probe stays ready;
//!   `snap_csi_dpu_up` says which is down; NodeGetInfo counts the DPUs
//!   whose SNAP answers (a plugin's absence takes no function away). New
//!   volumes whose first choice is the dead DPU are staged on the live one,
//!   at once after the death (tried there first, or not: the node may not
//!   know yet; a hung DPU is left when the node learns it is down, well
//!   before half the call's deadline) and once the node knows (not tried
//!   there); the first one's
//!   pod moves (unpublish, publish) without a call refused as busy while the
//!   node waits to clear the dead DPU of what its stage may have left there.
//!   When the DPU is back its `dpu_up` and its volumes' condition recover,
//!   and it holds nothing of the new volumes: a hung SNAP, answering at last
//!   what the abandoned attach sent it, makes the volume's bdev late, which
//!   the node clears without a call from kubelet.
//!
//! The tests take turns: `snap_csi_dpu_up` lives in the process-wide
//! metrics registry, which every node here serves.

mod common;

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Duration;

use common::dpu::{DPU_NAME, HOST_NAME, split};
use common::dpus::{NAMES, SECOND_DPU_NAME, first_choice, index};
use common::node::{
    NodeStack, Tweaks, block_capability, mount_capability, publish_request, read_volume, scrape,
    stage_request, write_volume,
};
use common::plugin::device_name;
use common::timed;
use snap_csi::dpu::names::VolumeNames;
use snap_csi::node::config::EmulationSetting;
use snap_csi::node::fleet::DPU_KEY;
use snap_csi::node::records::Records;
use snap_csi::node::service::EMULATION_KEY;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::identity_client::IdentityClient;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use snap_csi::spdk::bdev::BdevGetBdevs;
use snap_csi::spdk::snap::{
    EmulationFunctionList, EmulationType, NvmeSubsystemList, VirtioBlkControllerList,
};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tonic::Code;

/// Sparse; enough for ext4.
const SIZE: u64 = 64 << 20;
/// What a call gets, as kubelet gives its calls two minutes.
const CALL: Duration = Duration::from_secs(60);
/// How long a new volume's stage may take while its first choice hangs:
/// the node leaves that DPU once its watch finds it down (a probe every 2 s,
/// answered within 3 s), long before the half of [`CALL`] it would otherwise
/// give a DPU that is not its last candidate.
const STAGE_PAST_A_HUNG_DPU: Duration = Duration::from_secs(15);
/// A call to a node one of whose DPUs may hang: it answers within its
/// deadline, without that DPU.
const SHORT_CALL: Duration = Duration::from_secs(5);
/// How long a condition may take to come: the node probes every 2 s, and
/// clears a passed-over DPU with retries 1, 2, 4, ... s apart.
const PATIENCE: Duration = Duration::from_secs(90);

/// The registry is process-wide: one node at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

/// A staged and published volume and what the pod wrote.
struct Volume {
    id: String,
    backing: PathBuf,
    staging: PathBuf,
    target: PathBuf,
    block: bool,
    data: Vec<u8>,
}

async fn two_dpus() -> NodeStack {
    let tweaks = Tweaks {
        second_dpu: true,
        ..Tweaks::default()
    };
    NodeStack::start_with(EmulationSetting::Nvme, tweaks).await
}

/// Volume ids beginning with `prefix` whose first choice is DPU `dpu`.
fn ids_on(dpu: &str, prefix: &str, count: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|id| first_choice(id) == dpu)
        .take(count)
        .collect()
}

/// NodeStageVolume of `id` with `context` added to its volume context, under
/// `timeout`.
async fn stage(
    stack: &NodeStack,
    id: &str,
    block: bool,
    context: &[(&str, &str)],
    timeout: Duration,
) -> Result<Volume, tonic::Status> {
    let backing = stack.backing_file(&format!("{id}.img"), SIZE);
    let staging = stack.path(&format!("plugins/staging/{id}"));
    std::fs::create_dir_all(&staging).unwrap();
    let pod = stack.path(&format!("pods/{id}"));
    std::fs::create_dir_all(&pod).unwrap();
    let mut request = stage_request(id, &staging, capability(block), &backing);
    request
        .volume_context
        .extend(context.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    stack
        .client
        .clone()
        .node_stage_volume(timed(request, timeout))
        .await?;
    Ok(Volume {
        id: id.to_string(),
        backing,
        staging,
        target: pod.join("volume"),
        block,
        data: format!("{id} was here\n").into_bytes().repeat(100),
    })
}

fn capability(block: bool) -> csi::VolumeCapability {
    match block {
        true => block_capability(Mode::SingleNodeWriter),
        false => mount_capability("ext4", Mode::SingleNodeWriter),
    }
}

/// Publishes `volume` to its pod, which writes its data and reads it back.
async fn publish_and_write(stack: &NodeStack, volume: &Volume) {
    let request = publish_request(
        &volume.id,
        &volume.staging,
        &volume.target,
        capability(volume.block),
        false,
    );
    stack
        .client
        .clone()
        .node_publish_volume(timed(request, CALL))
        .await
        .unwrap_or_else(|e| panic!("publish {}: {e}", volume.id));
    write_volume(&volume.target, &volume.data);
    assert_reads_back(volume);
}

/// Stages and publishes; the stage must succeed.
async fn staged(stack: &NodeStack, id: &str, block: bool, context: &[(&str, &str)]) -> Volume {
    let volume = stage(stack, id, block, context, CALL)
        .await
        .unwrap_or_else(|e| panic!("stage {id}: {e}"));
    publish_and_write(stack, &volume).await;
    volume
}

fn assert_reads_back(volume: &Volume) {
    assert_eq!(
        read_volume(&volume.target, volume.data.len()),
        volume.data,
        "{}: the pod reads back what it wrote",
        volume.id
    );
}

/// The pod writes something new and reads it back.
fn assert_writes(volume: &mut Volume) {
    volume.data = format!("{} again\n", volume.id).into_bytes().repeat(150);
    write_volume(&volume.target, &volume.data);
    assert_reads_back(volume);
}

/// The DPU the node's record of `id` names.
fn recorded_dpu(stack: &NodeStack, id: &str) -> String {
    Records::open(stack.config.state_dir.join("volumes"))
        .unwrap()
        .load(id)
        .unwrap()
        .unwrap_or_else(|| panic!("{id} has no record"))
        .dpu
        .unwrap_or_else(|| panic!("{id}'s record names no DPU"))
}

/// What one DPU's SNAP holds of volume `id`: the plugin's bdev, and the
/// NVMe subsystem or virtio-blk controller exposing it.
async fn held(stack: &NodeStack, dpu: usize, id: &str) -> Vec<String> {
    let snap = stack.emulators()[dpu].client();
    let names = VolumeNames::new(id);
    let mut held = Vec::new();
    let bdev = device_name(id);
    let bdevs = snap.call(&BdevGetBdevs::default()).await.unwrap();
    if bdevs.iter().any(|b| b.name == bdev) {
        held.push(format!("bdev {bdev}"));
    }
    let subsystems = snap.call(&NvmeSubsystemList {}).await.unwrap();
    if subsystems.iter().any(|s| s.nqn == names.nqn) {
        held.push(format!("subsystem {}", names.nqn));
    }
    let controllers = snap.call(&VirtioBlkControllerList {}).await.unwrap();
    if controllers
        .iter()
        .any(|c| c.vblk_id.as_deref() == Some(names.serial.as_str()))
    {
        held.push(format!("virtio-blk controller {}", names.serial));
    }
    held
}

/// The PCI domain of the function whose disk the volume's pod uses, as
/// the host's sysfs tree shows it.
fn disk_domain(stack: &NodeStack, volume: &Volume) -> String {
    let (major, minor) = match volume.block {
        true => {
            let rdev = std::fs::metadata(&volume.target).unwrap().rdev();
            (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev))
        }
        false => {
            let mount = snap_csi::node::mountinfo::at(&volume.staging)
                .unwrap()
                .expect("the staging path is mounted");
            (u64::from(mount.major), u64::from(mount.minor))
        }
    };
    let (major, minor) = (major.try_into().unwrap(), minor.try_into().unwrap());
    let described = snap_csi::host::Sysfs::new(&stack.emulator.sysfs_root)
        .describe_device(major, minor)
        .unwrap()
        .unwrap_or_else(|| panic!("{}: no function shows disk {major}:{minor}", volume.id));
    // "<disk> of function <domain>:<bdf>, ..."
    let function = described.split(" of function ").nth(1).unwrap();
    function.split(':').next().unwrap().to_string()
}

/// The host's PCI domain of each DPU's functions, in [`NAMES`]' order.
const DOMAINS: [&str; 2] = ["0000", "0001"];

/// Polls `check` until it holds, for up to [`PATIENCE`].
async fn wait_for<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + PATIENCE;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether the node's metrics page says DPU `dpu` is `up`.
async fn dpu_up_is(stack: &NodeStack, dpu: &str, up: bool) -> bool {
    let page = scrape(stack.config.metrics_address.unwrap()).await;
    let line = format!("snap_csi_dpu_up{{dpu=\"{dpu}\"}} {}", u8::from(up));
    page.lines().any(|l| l == line)
}

async fn wait_dpu_up(stack: &NodeStack, dpu: &str, up: bool) {
    wait_for(&format!("snap_csi_dpu_up of {dpu} {up}"), || {
        dpu_up_is(stack, dpu, up)
    })
    .await;
}

/// NodeGetVolumeStats' condition of the volume.
async fn condition(stack: &NodeStack, volume: &Volume) -> csi::VolumeCondition {
    let request = csi::NodeGetVolumeStatsRequest {
        volume_id: volume.id.clone(),
        volume_path: volume.target.display().to_string(),
        staging_target_path: volume.staging.display().to_string(),
    };
    stack
        .client
        .clone()
        .node_get_volume_stats(timed(request, SHORT_CALL))
        .await
        .unwrap_or_else(|e| panic!("stats of {}: {e}", volume.id))
        .into_inner()
        .volume_condition
        .expect("the node reports a volume condition")
}

/// NodeGetInfo, within [`SHORT_CALL`].
async fn info(stack: &NodeStack) -> csi::NodeGetInfoResponse {
    stack
        .client
        .clone()
        .node_get_info(timed(csi::NodeGetInfoRequest {}, SHORT_CALL))
        .await
        .unwrap()
        .into_inner()
}

/// The NVMe functions (PFs and VFs) SNAP lists on DPU `dpu`: the node's
/// default emulation, one volume each under the default placement.
async fn nvme_functions(stack: &NodeStack, dpu: usize) -> i64 {
    stack.emulators()[dpu]
        .client()
        .call(&EmulationFunctionList { all: true })
        .await
        .unwrap()
        .iter()
        .filter(|pf| pf.emulation_type == EmulationType::Nvme)
        .map(|pf| 1 + pf.vfs.len() as i64)
        .sum()
}

/// Whether Probe answers ready within [`SHORT_CALL`].
async fn probe_ready(stack: &NodeStack) -> bool {
    let mut identity = IdentityClient::new(common::node::connect(&stack.config.endpoint).await);
    identity
        .probe(timed(csi::ProbeRequest {}, SHORT_CALL))
        .await
        .expect("Probe answers in time")
        .into_inner()
        .ready
        == Some(true)
}

/// Makes `call` as kubelet does: again after a pause while the volume is
/// busy (ABORTED: the node is still clearing a DPU a stage passed over, under
/// the volume's hold), for up to [`PATIENCE`]; any other failure fails.
async fn as_kubelet<F, Fut>(what: &str, mut call: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), tonic::Status>>,
{
    let (started, mut busy) = (Instant::now(), 0);
    loop {
        match call().await {
            Ok(()) => break,
            Err(e) if e.code() == Code::Aborted && started.elapsed() < PATIENCE => busy += 1,
            Err(e) => panic!("{what}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if busy > 0 {
        println!(
            "{what}: busy {busy} times, done after {:?}",
            started.elapsed()
        );
    }
}

/// Unpublishes and unstages each volume; then neither DPU holds anything,
/// and no loop device, mount or record is left.
async fn unstage_all(stack: &NodeStack, volumes: &[Volume]) {
    for volume in volumes {
        let (id, target, staging) = (&volume.id, &volume.target, &volume.staging);
        as_kubelet(&format!("unpublish {id}"), || {
            let mut node = stack.client.clone();
            let request = csi::NodeUnpublishVolumeRequest {
                volume_id: id.clone(),
                target_path: target.display().to_string(),
            };
            async move {
                node.node_unpublish_volume(timed(request, CALL))
                    .await
                    .map(drop)
            }
        })
        .await;
        as_kubelet(&format!("unstage {id}"), || {
            let mut node = stack.client.clone();
            let request = csi::NodeUnstageVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: staging.display().to_string(),
            };
            async move {
                node.node_unstage_volume(timed(request, CALL))
                    .await
                    .map(drop)
            }
        })
        .await;
    }
    // A disk a stopped SNAP left mounted goes with its last user's close.
    let root = stack.emulator.root().to_path_buf();
    wait_for("the loop devices released", || {
        let root = root.clone();
        async move { common::shared::loop_devices_under(&root).is_empty() }
    })
    .await;
    for volume in volumes {
        stack.assert_nothing_left(&volume.backing).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_spread_over_both_dpus_each_in_its_own_pci_domain() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let stack = two_dpus().await;
    let mut volumes = Vec::new();
    let mut on = [0; 2];
    for i in 0..6 {
        let id = format!("pvc-{i}");
        let emulation = ["nvme", "virtio-blk"][i % 2];
        let volume = staged(&stack, &id, i % 3 == 0, &[(EMULATION_KEY, emulation)]).await;
        let dpu = recorded_dpu(&stack, &id);
        assert_eq!(dpu, first_choice(&id), "{id}: placed by its id's hash");
        let (here, there) = (index(&dpu), 1 - index(&dpu));
        on[here] += 1;
        let what = held(&stack, here, &id).await;
        assert_eq!(what.len(), 2, "{id} ({emulation}) on {dpu}: {what:?}");
        let elsewhere = held(&stack, there, &id).await;
        assert!(
            elsewhere.is_empty(),
            "{id} also on {}: {elsewhere:?}",
            NAMES[there]
        );
        assert_eq!(disk_domain(&stack, &volume), DOMAINS[here], "{id} on {dpu}");
        volumes.push(volume);
    }
    assert!(on.iter().all(|n| *n > 0), "volumes per DPU: {on:?}");
    for volume in &volumes {
        assert_reads_back(volume);
    }

    // A volume only the second DPU can serve, though its hash says the first.
    let id = &ids_on(DPU_NAME, "pvc-pinned", 1)[0];
    let pinned = staged(&stack, id, false, &[(DPU_KEY, SECOND_DPU_NAME)]).await;
    assert_eq!(recorded_dpu(&stack, id), SECOND_DPU_NAME);
    assert_eq!(held(&stack, 1, id).await.len(), 2);
    assert!(held(&stack, 0, id).await.is_empty());
    assert_eq!(disk_domain(&stack, &pinned), DOMAINS[1]);
    volumes.push(pinned);

    // One only a DPU this node lacks can serve: refused, nothing made.
    let refused = stage(&stack, "pvc-elsewhere", false, &[(DPU_KEY, "dpu-9")], CALL)
        .await
        .err()
        .expect("a volume of a DPU the node lacks is refused");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("dpu-9"), "{}", refused.message());
    let second = stack.second.as_ref().unwrap();
    for plugin in [
        stack.plugin.as_ref().unwrap(),
        second.plugin.as_ref().unwrap(),
    ] {
        let calls = plugin.calls();
        assert!(
            !calls.iter().any(|c| c.contains("pvc-elsewhere")),
            "{calls:?}"
        );
    }
    for dpu in 0..2 {
        assert!(held(&stack, dpu, "pvc-elsewhere").await.is_empty());
    }
    assert_eq!(stack.records(), volumes.len(), "no record of it");
    assert!(common::node::mounts_under(&stack.path("plugins/staging/pvc-elsewhere")).is_empty());

    // NodeGetInfo: both DPUs' functions, a topology key each, valued with
    // the node id (another host's DPUs may have these names).
    let functions = [
        nvme_functions(&stack, 0).await,
        nvme_functions(&stack, 1).await,
    ];
    assert_ne!(functions[0], functions[1], "the sum is told from twice one");
    let info = info(&stack).await;
    assert_eq!(info.max_volumes_per_node, functions[0] + functions[1]);
    assert_eq!(
        info.accessible_topology.unwrap().segments,
        HashMap::from([
            ("topology.snap-csi.io/dpu".to_string(), DPU_NAME.to_string()),
            (format!("dpu.snap-csi.io/{DPU_NAME}"), HOST_NAME.to_string()),
            (
                format!("dpu.snap-csi.io/{SECOND_DPU_NAME}"),
                HOST_NAME.to_string()
            ),
        ])
    );

    unstage_all(&stack, &volumes).await;
}

/// The device calls the second DPU's plugin received (none while it is
/// stopped).
fn second_plugin_calls(stack: &NodeStack) -> Vec<String> {
    let second = stack.second.as_ref().unwrap();
    second
        .plugin
        .as_ref()
        .map(|p| p.calls())
        .unwrap_or_default()
}

/// How the second DPU dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Death {
    /// Its SNAP stops; it comes back empty.
    Snap,
    /// The node's way to it goes: its agent in split mode, its vendor
    /// plugin co-located.
    Link,
    /// Its SNAP holds every request; then answers them all.
    Hang,
}

async fn one_dpu_dies(death: Death) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut stack = two_dpus().await;
    let mut first = Vec::new();
    for id in ids_on(DPU_NAME, "pvc-first", 2) {
        first.push(staged(&stack, &id, false, &[]).await);
    }
    let mut second = Vec::new();
    for id in ids_on(SECOND_DPU_NAME, "pvc-second", 2) {
        second.push(staged(&stack, &id, false, &[]).await);
    }
    for volume in &second {
        assert_eq!(recorded_dpu(&stack, &volume.id), SECOND_DPU_NAME);
    }
    wait_dpu_up(&stack, SECOND_DPU_NAME, true).await;
    let functions = [
        nvme_functions(&stack, 0).await,
        nvme_functions(&stack, 1).await,
    ];

    // The second DPU dies.
    let dpu = stack.second.as_mut().unwrap();
    let stopped_agent = match death {
        Death::Snap => {
            dpu.snap.stop_for_now();
            None
        }
        Death::Link if split() => Some(dpu.stop_agent()),
        Death::Link => {
            dpu.stop_plugin().await;
            None
        }
        Death::Hang => {
            dpu.snap.faults.hold();
            None
        }
    };
    // A new volume whose first choice is the dead DPU, at once: the node
    // may not know yet, and then passes it over when it does not answer.
    let ids = ids_on(SECOND_DPU_NAME, "pvc-new", 2);
    let started = Instant::now();
    let volume = stage(&stack, &ids[0], false, &[], CALL)
        .await
        .unwrap_or_else(|e| panic!("{death:?}: a new volume goes to the DPU that serves: {e}"));
    let took = started.elapsed();
    println!("{death:?}: the first new volume staged in {took:?}");
    assert!(
        took < STAGE_PAST_A_HUNG_DPU,
        "{death:?}: the stage waited {took:?} on the dead DPU"
    );
    publish_and_write(&stack, &volume).await;
    assert_eq!(recorded_dpu(&stack, &volume.id), DPU_NAME, "{death:?}");
    assert_eq!(disk_domain(&stack, &volume), DOMAINS[0]);
    if death == Death::Hang {
        let calls = second_plugin_calls(&stack);
        assert!(
            calls.contains(&format!("CreateDevice {}", volume.id)),
            "the hung DPU was tried first: {calls:?}"
        );
    }
    let mut new = vec![volume];

    wait_dpu_up(&stack, SECOND_DPU_NAME, false).await;
    assert!(dpu_up_is(&stack, DPU_NAME, true).await);
    // Known down: the next goes straight to the first DPU.
    let volume = stage(&stack, &ids[1], false, &[], CALL)
        .await
        .unwrap_or_else(|e| panic!("{death:?}: a new volume once the node knows: {e}"));
    publish_and_write(&stack, &volume).await;
    assert_eq!(recorded_dpu(&stack, &volume.id), DPU_NAME);
    let calls = second_plugin_calls(&stack);
    assert!(
        !calls.contains(&format!("CreateDevice {}", volume.id)),
        "{death:?}: a DPU known down was tried: {calls:?}"
    );
    new.push(volume);

    assert!(probe_ready(&stack).await, "{death:?}: one DPU serves");
    // Its pod moves: kubelet's calls for it are not refused (busy) while
    // the node waits to clear the DPU the stage passed over.
    let moved = &new[0];
    let request = csi::NodeUnpublishVolumeRequest {
        volume_id: moved.id.clone(),
        target_path: moved.target.display().to_string(),
    };
    let mut node = stack.client.clone();
    node.node_unpublish_volume(timed(request, CALL))
        .await
        .unwrap_or_else(|e| panic!("{death:?}: unpublish {}: {e}", moved.id));
    let request = publish_request(
        &moved.id,
        &moved.staging,
        &moved.target,
        capability(false),
        false,
    );
    node.node_publish_volume(timed(request, CALL))
        .await
        .unwrap_or_else(|e| panic!("{death:?}: publish {} again: {e}", moved.id));
    assert_reads_back(moved);
    for volume in first.iter_mut().chain(&mut new) {
        assert_writes(volume);
        let healthy = condition(&stack, volume).await;
        assert!(!healthy.abnormal, "{}: {healthy:?}", volume.id);
    }
    let conditions = futures::future::join_all(second.iter().map(|v| condition(&stack, v))).await;
    for (volume, condition) in second.iter().zip(conditions) {
        assert!(
            condition.abnormal,
            "{death:?}: {}: {condition:?}",
            volume.id
        );
        assert!(
            condition
                .message
                .contains(&format!("DPU {SECOND_DPU_NAME} ")),
            "{death:?}: the message names the DPU: {}",
            condition.message
        );
    }
    // The functions of the DPUs whose SNAP answers: a co-located DPU
    // without its plugin still has them (the plugin's pod restarts).
    let answering = match (death, split()) {
        (Death::Link, false) => functions[0] + functions[1],
        _ => functions[0],
    };
    assert_eq!(
        info(&stack).await.max_volumes_per_node,
        answering,
        "{death:?}: the DPUs that answer"
    );

    // The DPU comes back.
    let dpu = stack.second.as_mut().unwrap();
    match death {
        Death::Snap => dpu.snap.start_again().await,
        Death::Link => match stopped_agent {
            Some(agent) => dpu.start_agent(agent).await,
            None => dpu.start_plugin().await,
        },
        Death::Hang => {
            // SNAP now answers what the abandoned attach sent it: the DPU
            // makes the first of the volume late. The plugin's gate holds
            // the node's clearing at DeleteDevice meanwhile, so that it shows.
            let gate = dpu.plugin.as_ref().unwrap().gate.clone();
            let closed = gate.close().await;
            dpu.snap.faults.release();
            let late = format!("bdev {}", device_name(&new[0].id));
            wait_for("the hung DPU makes what it was sent late", || async {
                held(&stack, 1, &new[0].id).await.contains(&late)
            })
            .await;
            drop(closed);
        }
    }
    wait_dpu_up(&stack, SECOND_DPU_NAME, true).await;
    for volume in &second {
        wait_for(
            &format!("{death:?}: {} healthy again", volume.id),
            || async { !condition(&stack, volume).await.abnormal },
        )
        .await;
        assert_reads_back(volume);
    }
    for volume in &new {
        wait_for(
            &format!(
                "{death:?}: nothing of {} on the DPU it passed over",
                volume.id
            ),
            || async { held(&stack, 1, &volume.id).await.is_empty() },
        )
        .await;
        assert_eq!(held(&stack, 0, &volume.id).await.len(), 2);
    }
    for volume in &first {
        assert_reads_back(volume);
    }
    assert_eq!(
        info(&stack).await.max_volumes_per_node,
        functions[0] + functions[1]
    );

    let all: Vec<Volume> = first.into_iter().chain(second).chain(new).collect();
    unstage_all(&stack, &all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_snap_on_one_dpu_leaves_the_other_serving() {
    one_dpu_dies(Death::Snap).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_link_to_one_dpu_leaves_the_other_serving() {
    one_dpu_dies(Death::Link).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_snap_on_one_dpu_is_passed_over_and_what_it_made_late_is_cleared() {
    one_dpu_dies(Death::Hang).await;
}
