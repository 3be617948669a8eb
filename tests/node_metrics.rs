//! The node's Prometheus endpoint counts the calls it served and made. One
//! test in its own process, because the registry is process-wide.

mod common;

use common::node::{NodeStack, mount_capability, scrape, stage_request, unstage};
use snap_csi::node::config::EmulationSetting;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_the_calls_served_and_made() {
    let stack = NodeStack::start(EmulationSetting::Nvme).await;
    let mut node = stack.client.clone();
    let backing = stack.backing_file("vol.img", 64 << 20);
    let staging = stack.path("staging/pvc-m");
    std::fs::create_dir_all(&staging).unwrap();
    let request = stage_request(
        "pvc-m",
        &staging,
        mount_capability("ext4", Mode::SingleNodeWriter),
        &backing,
    );
    node.node_stage_volume(request.clone()).await.unwrap();
    node.node_stage_volume(request).await.unwrap();
    let address = stack.config.metrics_address.unwrap();
    let page = scrape(address).await;
    for expected in [
        r#"snap_csi_grpc_requests_total{method="Node/NodeStageVolume",code="Ok"} 2"#,
        r#"snap_csi_outbound_requests_total{target="plugin",method="CreateDevice",outcome="ok"} 2"#,
        r#"snap_csi_outbound_requests_total{target="snap",method="nvme_controller_resume",outcome="ok"} 1"#,
        r#"snap_csi_grpc_request_duration_seconds_count{method="Node/NodeStageVolume"} 2"#,
        // Host work: formatted once, mounted once; the retry finds it done.
        r#"snap_csi_outbound_requests_total{target="host",method="mkfs.ext4",outcome="ok"} 1"#,
        r#"snap_csi_outbound_requests_total{target="host",method="mount",outcome="ok"} 1"#,
        "snap_csi_volumes_staged 1",
        r#"snap_csi_grpc_request_own_seconds_count{method="Node/NodeStageVolume"} 2"#,
    ] {
        assert!(page.contains(expected), "{expected} missing from:\n{page}");
    }
    // The node's own share excludes its waits: a first stage spends most of
    // its time in SNAP, the plugin, mkfs and mount.
    let sum = |name: &str| -> f64 {
        let prefix = format!(r#"{name}_sum{{method="Node/NodeStageVolume"}} "#);
        let line = page.lines().find(|l| l.starts_with(&prefix)).unwrap();
        line[prefix.len()..].parse().unwrap()
    };
    let (total, own) = (
        sum("snap_csi_grpc_request_duration_seconds"),
        sum("snap_csi_grpc_request_own_seconds"),
    );
    assert!(own > 0.0 && own < total / 2.0, "own {own} s of {total} s");

    unstage(&mut node, "pvc-m", &staging).await;
    let refused = node
        .node_unstage_volume(snap_csi::proto::csi::v1::NodeUnstageVolumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    let page = scrape(address).await;
    for expected in [
        "snap_csi_volumes_staged 0",
        r#"snap_csi_grpc_requests_total{method="Node/NodeUnstageVolume",code="InvalidArgument"} 1"#,
        r#"snap_csi_outbound_request_duration_seconds_count{target="host",method="umount"}"#,
    ] {
        assert!(page.contains(expected), "{expected} missing from:\n{page}");
    }
}
