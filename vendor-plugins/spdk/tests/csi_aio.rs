//! The CSI controller's AIO backend: volumes are sparse files in a pool
//! directory (over real gRPC; see `common/scenarios.rs` for what each checks).

mod common;

use std::time::Duration;

use common::csi::{Backends, Csi};
use snap_csi::grpc::unix_channel;
use snap_csi::node::NodeConfig;
use snap_csi::node::dpus::DpuSetting;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::node_client::NodeClient;
use snap_csi_spdk_plugin::csi::HostDpu;

const BACKEND: &str = "aio";

async fn controller() -> Csi {
    Csi::start(Backends {
        aio: true,
        nvmf: false,
        default: "aio",
    })
    .await
}

scenario_tests!(Some(controller().await), BACKEND);

/// A CreateVolume interrupted while writing its file leaves only a hidden
/// temporary file, which the next attempt replaces and DeleteVolume removes;
/// lists never show it.
#[tokio::test]
async fn interrupted_creates_leave_only_temporary_files() {
    use common::csi::{MIB, volume};

    let csi = controller().await;
    std::fs::create_dir_all(&csi.pool).unwrap();
    let temp = csi.pool.join(".aio-pvc-t.img.tmp");
    std::fs::write(&temp, b"half a copy").unwrap();
    assert!(csi.list_all(0).await.is_empty());
    let created = csi
        .create(volume("pvc-t", BACKEND, 4 * MIB, 0))
        .await
        .unwrap();
    assert!(!temp.exists());
    assert_eq!(
        std::fs::metadata(&created.volume_context["path"])
            .unwrap()
            .len(),
        4 * MIB
    );
    csi.delete(&created.volume_id).await.unwrap();

    std::fs::write(&temp, b"given up").unwrap();
    csi.delete("aio-pvc-t").await.unwrap();
    assert!(!temp.exists());
    assert!(csi.leftovers().await.is_empty());
}

/// The AIO backend cannot pause its writer (SNAP's bdev_aio), so a group
/// snapshot taken while a member is written fails, copies removed, rather
/// than answer copies of different instants; with the writes stopped it is
/// made. The writer stands in for SNAP, writing the volume's file.
#[tokio::test]
async fn a_group_snapshot_of_volumes_being_written_fails_and_leaves_nothing() {
    use common::csi::{MIB, write_at};
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    let csi = controller().await;
    let a = csi
        .create(common::csi::volume("pvc-busy-a", BACKEND, 64 * MIB, 0))
        .await
        .unwrap();
    let b = csi
        .create(common::csi::volume("pvc-busy-b", BACKEND, 64 * MIB, 0))
        .await
        .unwrap();
    let volumes = [a.volume_id.as_str(), b.volume_id.as_str()];
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let writer = {
        let (stop, written) = (stop.clone(), written.clone());
        let path = std::path::PathBuf::from(&a.volume_context["path"]);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let n = written.fetch_add(1, Ordering::Relaxed);
                write_at(&path, (n % 64) * MIB, &n.to_le_bytes());
            }
        })
    };
    // Writes land in every attempt's window only if the writer is scheduled
    // then: a few attempts, each one made while it keeps writing.
    let mut refused = None;
    for attempt in 0..5 {
        let floor = written.load(Ordering::Relaxed) + 2;
        while written.load(Ordering::Relaxed) < floor {
            tokio::task::yield_now().await;
        }
        match csi
            .create_group_snapshot(&format!("gs-busy-{attempt}"), &volumes, HashMap::new())
            .await
        {
            Err(status) => {
                refused = Some(status);
                break;
            }
            Ok(group) => csi.delete_whole_group_snapshot(&group).await,
        }
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let status = refused.expect("a group snapshot copied while a member was written");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains(&a.volume_id), "{status:?}");
    assert!(
        csi.list_snapshots_all(Default::default()).await.is_empty(),
        "the refused group's copies are removed"
    );
    assert_eq!(csi.state_records("group-snapshots"), 0);

    let quiet = csi
        .create_group_snapshot("gs-quiet", &volumes, HashMap::new())
        .await
        .unwrap();
    assert!(quiet.ready_to_use);
    csi.delete_whole_group_snapshot(&quiet).await;
    for v in volumes {
        csi.delete(v).await.unwrap();
    }
    assert!(csi.leftovers().await.is_empty());
}

/// A pool only one DPU reaches (`--aio-dpu` on the host `--aio-node` names):
/// its volumes carry that DPU's topology segment, which the node reports for
/// each of its DPUs, and name the DPU in their context, where the node
/// attaches them (tests/node_two_dpus.rs holds the node to it). A
/// CreateVolume whose requisite topologies lack the segment is
/// RESOURCE_EXHAUSTED and makes nothing; GetCapacity has nothing for another
/// DPU's segment; the plugin advertises the topology it now reports.
#[tokio::test]
async fn a_pool_on_one_dpu_makes_volumes_only_for_that_dpu() {
    use common::csi::{MIB, assert_code, volume};
    use snap_csi::node::dpus::dpu_segment;
    use std::collections::HashMap;
    use tonic::Code;

    let accessibility = |csi: &Csi| {
        let mut identity = csi.identity.clone();
        async move {
            let response = identity
                .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
                .await
                .unwrap();
            response.into_inner().capabilities.iter().any(|c| {
                matches!(&c.r#type, Some(csi::plugin_capability::Type::Service(s))
                    if s.r#type == csi::plugin_capability::service::Type::VolumeAccessibilityConstraints as i32)
            })
        }
    };
    assert!(
        !accessibility(&controller().await).await,
        "a pool every DPU reaches has no topology to advertise"
    );

    let csi = pool_on("bf3-b", "host-1").await;
    assert!(accessibility(&csi).await);
    let refused = assert_code(
        csi.create(on(
            "pvc-local",
            vec![
                host_segments("host-2", &["bf3-a"]).await,
                host_segments("host-3", &["bf3-c", "bf3-d"]).await,
            ],
        ))
        .await,
        Code::ResourceExhausted,
        "hosts without the pool's DPU",
    );
    assert!(refused.message().contains("bf3-b"), "{}", refused.message());
    assert!(csi.leftovers().await.is_empty(), "a refusal made nothing");

    let wanted = vec![csi::Topology {
        segments: HashMap::from([dpu_segment("bf3-b", "host-1")]),
    }];
    let host_1 = host_segments("host-1", &["bf3-a", "bf3-b"]).await;
    for _retry in 0..2 {
        let created = csi
            .create(on("pvc-local", vec![host_1.clone()]))
            .await
            .unwrap();
        assert_eq!(created.accessible_topology, wanted);
        assert_eq!(created.volume_context["snap-csi.io/dpu"], "bf3-b");
    }
    // Without requirements (a CO that sends none) it is made, as local.
    let free = csi
        .create(volume("pvc-anywhere", BACKEND, 4 * MIB, 0))
        .await
        .unwrap();
    assert_eq!(free.accessible_topology, wanted);
    let listed = csi.list(0, "").await.unwrap().entries;
    assert_eq!(listed.len(), 2);
    for entry in listed {
        assert_eq!(entry.volume.unwrap().accessible_topology, wanted);
    }

    let another_dpu = host_segments("host-2", &["bf3-a"]).await;
    assert_eq!(
        capacity(&csi, another_dpu).await,
        0,
        "another DPU's segment"
    );
    assert!(capacity(&csi, host_segments("host-1", &["bf3-b"]).await).await > 0);

    for id in ["aio-pvc-local", "aio-pvc-anywhere"] {
        csi.delete(id).await.unwrap();
    }
    assert!(csi.leftovers().await.is_empty());
}

/// Operators name DPUs alike on every host: `host-1` and `host-2` each have
/// a `bf3-a`, their segments from their own nodes' NodeGetInfo. A pool on
/// host-1's makes no volume for host-2 and has no capacity there; the
/// volumes it makes, Kubernetes uses on host-1 only.
#[tokio::test]
async fn a_pool_on_one_hosts_dpu_is_not_on_another_hosts_dpu_of_its_name() {
    use common::csi::assert_code;
    use tonic::Code;

    let host_1 = host_segments("host-1", &["bf3-a"]).await;
    let host_2 = host_segments("host-2", &["bf3-a"]).await;
    let csi = pool_on("bf3-a", "host-1").await;

    assert_code(
        csi.create(on("pvc-there", vec![host_2.clone()])).await,
        Code::ResourceExhausted,
        "host-2, whose DPU has the pool's DPU's name",
    );
    assert!(csi.leftovers().await.is_empty(), "a refusal made nothing");
    let created = csi
        .create(on("pvc-here", vec![host_1.clone()]))
        .await
        .unwrap();
    assert!(usable_on(&created.accessible_topology, &host_1));
    assert!(!usable_on(&created.accessible_topology, &host_2));
    assert_eq!(created.volume_context["snap-csi.io/dpu"], "bf3-a");
    assert_eq!(capacity(&csi, host_2).await, 0, "host-2's segments");
    assert!(capacity(&csi, host_1).await > 0);

    csi.delete(&created.volume_id).await.unwrap();
    assert!(csi.leftovers().await.is_empty());
}

/// The AIO controller with its pool on DPU `dpu` of host `node_id`.
async fn pool_on(dpu: &str, node_id: &str) -> Csi {
    let dpu = HostDpu {
        name: dpu.into(),
        node_id: node_id.into(),
    };
    Csi::start_with(
        Backends {
            aio: true,
            nvmf: false,
            default: BACKEND,
        },
        &common::Source::Emulator,
        |config| config.aio.as_mut().unwrap().dpu = Some(dpu),
    )
    .await
}

/// A host's segments as its node reports them: NodeGetInfo of a node
/// service with that node id and DPUs, which it does not reach (the volume
/// limit is given, and NodeGetInfo asks them nothing else).
async fn host_segments(node_id: &str, dpus: &[&str]) -> csi::Topology {
    let dir = tempfile::tempdir().unwrap();
    let config = NodeConfig {
        endpoint: dir.path().join("csi.sock"),
        node_id: node_id.into(),
        kubelet_dir: dir.path().join("kubelet"),
        state_dir: dir.path().join("state"),
        sysfs_root: dir.path().join("sys"),
        max_volumes_per_node: Some(1),
        dpus: (0..)
            .zip(dpus)
            .map(|(domain, name)| DpuSetting {
                name: name.to_string(),
                pci_domain: Some(format!("{domain}")),
                endpoint: None,
                plugin_socket: Some(dir.path().join(format!("{name}.sock"))),
                snap_socket_template: None,
            })
            .collect(),
        ..NodeConfig::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let node = tokio::spawn(snap_csi::node::run(config.clone(), async {
        let _ = stopped.await;
    }));
    let mut client = NodeClient::new(unix_channel(config.endpoint.clone()));
    let info = loop {
        match client.node_get_info(csi::NodeGetInfoRequest {}).await {
            Ok(info) => break info.into_inner(),
            Err(_) if !node.is_finished() => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(e) => panic!("node {node_id}: {e}; {:?}", node.await),
        }
    };
    let _ = stop.send(());
    node.await.unwrap().unwrap();
    assert_eq!(info.node_id, node_id);
    info.accessible_topology
        .expect("the node reports its topology")
}

/// A CreateVolume of an AIO volume that must be reachable from one of `hosts`.
fn on(name: &str, hosts: Vec<csi::Topology>) -> csi::CreateVolumeRequest {
    let mut request = common::csi::volume(name, BACKEND, 4 * common::csi::MIB, 0);
    request.accessibility_requirements = Some(csi::TopologyRequirement {
        preferred: hosts.clone(),
        requisite: hosts,
    });
    request
}

/// GetCapacity of the AIO backend for a segment.
async fn capacity(csi: &Csi, topology: csi::Topology) -> i64 {
    let request = csi::GetCapacityRequest {
        parameters: [("backend".to_string(), BACKEND.to_string())].into(),
        accessible_topology: Some(topology),
        ..Default::default()
    };
    let response = csi.controller.clone().get_capacity(request).await.unwrap();
    response.into_inner().available_capacity
}

/// Whether Kubernetes uses a volume of this accessible topology on a node
/// with these labels: the PV's node affinity has a term per segment, met
/// where the node has every key of it with its value.
fn usable_on(accessible: &[csi::Topology], node: &csi::Topology) -> bool {
    accessible.iter().any(|term| {
        term.segments
            .iter()
            .all(|(key, value)| node.segments.get(key) == Some(value))
    })
}
