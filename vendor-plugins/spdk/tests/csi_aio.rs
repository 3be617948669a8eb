//! The CSI controller's AIO backend: volumes are sparse files in a pool
//! directory (over real gRPC; see `common/scenarios.rs` for what each checks).

mod common;

use common::csi::{Backends, Csi};

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

/// A pool only one DPU reaches (`--aio-dpu`): its volumes carry that DPU's
/// topology key, which the node reports for each of its DPUs, and name the
/// DPU in their context, where the node attaches them (tests/node_two_dpus.rs
/// holds the node to it). A CreateVolume whose requisite topologies lack the
/// DPU is RESOURCE_EXHAUSTED and makes nothing; GetCapacity has nothing for
/// another DPU's segment; the plugin advertises the topology it now reports.
#[tokio::test]
async fn a_pool_on_one_dpu_makes_volumes_only_for_that_dpu() {
    use common::csi::{MIB, assert_code, volume};
    use snap_csi::proto::csi::v1 as csi;
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

    let csi = Csi::start_with(
        common::csi::Backends {
            aio: true,
            nvmf: false,
            default: BACKEND,
        },
        &common::Source::Emulator,
        |config| config.aio.as_mut().unwrap().dpu = Some("bf3-b".into()),
    )
    .await;
    assert!(accessibility(&csi).await);
    // A host's segments, as its node reports them: a key per DPU, the first
    // DPU's name under the old key.
    let host = |dpus: &[&str]| csi::Topology {
        segments: dpus
            .iter()
            .map(|d| (format!("dpu.snap-csi.io/{d}"), "true".to_string()))
            .chain([("topology.snap-csi.io/dpu".to_string(), dpus[0].to_string())])
            .collect(),
    };
    let on = |hosts: Vec<csi::Topology>| {
        let mut request = volume("pvc-local", BACKEND, 4 * MIB, 0);
        request.accessibility_requirements = Some(csi::TopologyRequirement {
            preferred: hosts.clone(),
            requisite: hosts,
        });
        request
    };

    let refused = assert_code(
        csi.create(on(vec![host(&["bf3-a"]), host(&["bf3-c", "bf3-d"])]))
            .await,
        Code::ResourceExhausted,
        "hosts without the pool's DPU",
    );
    assert!(refused.message().contains("bf3-b"), "{}", refused.message());
    assert!(csi.leftovers().await.is_empty(), "a refusal made nothing");

    let wanted = vec![csi::Topology {
        segments: HashMap::from([("dpu.snap-csi.io/bf3-b".to_string(), "true".to_string())]),
    }];
    for _retry in 0..2 {
        let created = csi
            .create(on(vec![host(&["bf3-a", "bf3-b"])]))
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

    let capacity = |topology: csi::Topology| {
        let mut controller = csi.controller.clone();
        async move {
            let request = csi::GetCapacityRequest {
                parameters: HashMap::from([("backend".to_string(), BACKEND.to_string())]),
                accessible_topology: Some(topology),
                ..Default::default()
            };
            let response = controller.get_capacity(request).await.unwrap();
            response.into_inner().available_capacity
        }
    };
    assert_eq!(capacity(host(&["bf3-a"])).await, 0, "another DPU's segment");
    assert!(capacity(host(&["bf3-b"])).await > 0);

    for id in ["aio-pvc-local", "aio-pvc-anywhere"] {
        csi.delete(id).await.unwrap();
    }
    assert!(csi.leftovers().await.is_empty());
}
