//! The DPU link authenticates both ways and refuses, in the handshake, every
//! peer it must: a node without a certificate, with one from another CA, an
//! expired one or one naming another host; an agent with a certificate from
//! another CA, an expired one or one naming another DPU. Each refusal ends
//! the call at once (no retries knocking again) with a message saying why,
//! and the node's Probe says not ready. Rotated certificate files take
//! effect without a restart, and a call in flight survives the rotation.
//! Plaintext is refused where it is not explicitly, loopback-only allowed.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::dpu::{Agent, DPU_NAME, GatedDpu, HOST_NAME, test_config};
use common::pki::{Pki, Role, rotate};
use common::shared::KillOnDrop;
use snap_csi::agent::AgentConfig;
use snap_csi::dpu::remote::RemoteDpu;
use snap_csi::dpu::{
    AttachRequest, DpuAttach, DpuError, Emulation, HostLocator, Placement, VolumeMode,
};
use snap_csi::tls::TlsFiles;
use tokio::time::Instant;

fn gated() -> Arc<GatedDpu> {
    GatedDpu::new(HostLocator::VirtioBlk {
        bdf: "27:00.2".into(),
        serial: "sc-0123456789abcdef0".into(),
    })
}

fn request(volume_id: &str) -> AttachRequest {
    AttachRequest {
        volume_id: volume_id.into(),
        access_modes: Vec::new(),
        volume_mode: VolumeMode::Block,
        publish_context: Default::default(),
        volume_context: Default::default(),
        storage_parameters: Default::default(),
        emulation: Emulation::VirtioBlk,
        placement: Placement::Dedicated,
        attached_before: false,
        secrets: Default::default(),
    }
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

/// An agent serving [`Gated`] with `config`'s certificates.
async fn agent(config: AgentConfig, node_tls: TlsFiles) -> Agent {
    Agent::launch(config, node_tls, Some(gated())).await
}

/// A probe from a node presenting `tls` and expecting `dpu_name`, which the
/// link must refuse at once, saying why.
async fn refused(agent: &Agent, tls: &TlsFiles, dpu_name: &str, why: &str) {
    let node = RemoteDpu::new(agent.address.clone(), dpu_name, tls).unwrap();
    let started = Instant::now();
    let error = node.probe(soon()).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(error, DpuError::Unavailable(_)), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains(why),
        "the refusal should say {why:?}: {message}"
    );
    assert!(
        message.contains(&agent.address.to_string()),
        "and name the agent: {message}"
    );
    assert!(
        took < Duration::from_secs(2),
        "a refusal ends the call, it is not retried until the deadline ({took:?})"
    );
}

#[tokio::test]
async fn the_agent_accepts_only_its_hosts_certificate_from_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (config, node_tls, ours) = test_config(dir.path());
    let agent = agent(config, node_tls.clone()).await;
    let theirs = Pki::new(&dir.path().join("other"), "other-ca");

    // The right certificate works: the refusals below are not the link's
    // only answer.
    let node = RemoteDpu::new(agent.address.clone(), DPU_NAME, &node_tls).unwrap();
    assert!(node.probe(soon()).await.unwrap());

    // In TLS 1.3 the client hears of its refusal as an alert from the agent.
    let refusal = "the agent refused this node's certificate";
    let mut other_ca = theirs.issue(Role::Node, HOST_NAME);
    other_ca.ca = node_tls.ca.clone();
    refused(&agent, &other_ca, DPU_NAME, refusal).await;
    let mut expired = ours.issue_expired(Role::Node, HOST_NAME);
    expired.ca = node_tls.ca.clone();
    refused(&agent, &expired, DPU_NAME, refusal).await;
    let mut other_host = ours.issue(Role::Node, "node-2");
    other_host.ca = node_tls.ca.clone();
    refused(&agent, &other_host, DPU_NAME, refusal).await;
}

#[tokio::test]
async fn a_node_without_a_certificate_is_refused_in_the_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let (config, node_tls, _) = test_config(dir.path());
    let agent = agent(config, node_tls.clone()).await;
    let snap_csi::grpc::LinkAddress::Tls(host_port) = &agent.address else {
        unreachable!()
    };
    let roots = node_tls.load().unwrap().roots;
    let anonymous = rustls::ClientConfig::builder_with_provider(snap_csi::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(host_port).await.unwrap();
    let name = snap_csi::tls::peer_name(DPU_NAME).unwrap();
    let mut stream = tokio_rustls::TlsConnector::from(Arc::new(anonymous))
        .connect(name, tcp)
        .await
        .expect("TLS 1.3: the client's side of the handshake completes");
    use tokio::io::AsyncReadExt;
    let error = stream.read(&mut [0u8; 64]).await.unwrap_err();
    assert!(
        error.to_string().contains("CertificateRequired"),
        "the agent demands a certificate: {error}"
    );
}

#[tokio::test]
async fn the_node_accepts_only_its_dpus_certificate_from_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (good, node_tls, ours) = test_config(dir.path());
    let theirs = Pki::new(&dir.path().join("other"), "other-ca");
    let cases = [
        (theirs.issue(Role::Agent, DPU_NAME), "UnknownIssuer"),
        (ours.issue_expired(Role::Agent, DPU_NAME), "expired"),
        (ours.issue(Role::Agent, "dpu-2"), "not valid for name"),
    ];
    for (tls, why) in cases {
        let config = AgentConfig {
            listen: format!("https://{}", common::shared::free_local_address()),
            tls: TlsFiles {
                ca: good.tls.ca.clone(),
                ..tls
            },
            ..good.clone()
        };
        let agent = agent(config, node_tls.clone()).await;
        refused(&agent, &node_tls, DPU_NAME, why).await;
    }
}

#[tokio::test]
async fn plaintext_is_refused_unless_explicitly_allowed_on_loopback() {
    let error = snap_csi::agent::AgentArgs {
        listen: Some("http://127.0.0.1:9830".into()),
        host_name: Some(HOST_NAME.into()),
        ..Default::default()
    }
    .resolve()
    .unwrap_err();
    assert!(
        error.to_string().contains("--insecure-plaintext"),
        "{error}"
    );

    // Allowed on loopback, it works; a TLS node cannot talk to it by mistake.
    let dir = tempfile::tempdir().unwrap();
    let (config, node_tls, _) = test_config(dir.path());
    let plain = AgentConfig {
        listen: format!("http://{}", common::shared::free_local_address()),
        insecure_plaintext: true,
        ..config
    };
    let address = plain.address().unwrap();
    let _agent = agent(plain, node_tls.clone()).await;
    let node = RemoteDpu::new(address.clone(), DPU_NAME, &node_tls).unwrap();
    assert!(node.probe(soon()).await.unwrap());
    let snap_csi::grpc::LinkAddress::Plaintext(socket) = address else {
        unreachable!()
    };
    let tls_to_plain = snap_csi::grpc::LinkAddress::Tls(socket.to_string());
    let node = RemoteDpu::new(tls_to_plain, DPU_NAME, &node_tls).unwrap();
    assert!(node.probe(soon()).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_files_take_effect_without_a_restart_and_a_call_in_flight_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let (config, node_tls, _) = test_config(dir.path());
    let gated = gated();
    let agent = Agent::launch(config.clone(), node_tls.clone(), Some(gated.clone())).await;
    let node = Arc::new(RemoteDpu::new(agent.address.clone(), DPU_NAME, &node_tls).unwrap());
    assert!(node.probe(soon()).await.unwrap());

    // A call in flight on the connection of the old certificates.
    let in_flight = {
        let node = node.clone();
        tokio::spawn(async move {
            node.attach(&request("pvc-1"), Instant::now() + Duration::from_secs(20))
                .await
        })
    };
    gated.started(1).await;

    // cert-manager renews both ends under a new CA (the worst case): the
    // files change in place, nothing restarts. Keep a copy of the node's
    // old files to show the agent dropped its old trust.
    std::fs::create_dir_all(dir.path().join("old")).unwrap();
    let old_node = TlsFiles {
        cert: dir.path().join("old/node.crt"),
        key: dir.path().join("old/node.key"),
        ca: dir.path().join("old/node-ca.crt"),
    };
    rotate(&node_tls, &old_node);
    let renewed = Pki::new(&dir.path().join("renewed"), "renewed-ca");
    rotate(&renewed.issue(Role::Agent, DPU_NAME), &config.tls);
    rotate(&renewed.issue(Role::Node, HOST_NAME), &node_tls);
    // Each end looks at its files again before a new connection, at most
    // once a second; the node's calls drive both (the node's new connection
    // is the agent's next handshake). Until both took up their new files,
    // the node's probe may answer on its old connection or fail a handshake.
    let deadline = Instant::now() + Duration::from_secs(30);
    while reloads(&node_tls.cert).await == 0 || reloads(&config.tls.cert).await == 0 {
        assert!(
            Instant::now() < deadline,
            "the rotated files were not taken up"
        );
        let _ = node.probe(soon()).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    assert!(
        node.probe(soon()).await.unwrap(),
        "the node reconnected with its new files to the agent's new certificate"
    );
    let stale = RemoteDpu::new(agent.address.clone(), DPU_NAME, &old_node).unwrap();
    assert!(
        stale.probe(soon()).await.is_err(),
        "the agent no longer trusts the old CA"
    );

    gated.gate.add_permits(1);
    let attached = in_flight
        .await
        .unwrap()
        .expect("the call in flight finishes");
    assert_eq!(attached.device_name, "gated");
}

/// How many times the TLS files whose certificate is `cert` were reloaded
/// (this process's `snap_csi_tls_reloads_total`, outcome ok).
async fn reloads(cert: &std::path::Path) -> u64 {
    let series = format!(
        "snap_csi_tls_reloads_total{{cert=\"{}\",outcome=\"ok\"}} ",
        cert.display()
    );
    snap_csi::metrics::render()
        .await
        .lines()
        .find_map(|line| line.strip_prefix(&series))
        .map_or(0, |count| count.parse().unwrap())
}

/// Runs `snap-csi ARGS...`, its log (stderr) going to `log`.
fn spawn(args: &[String], log: &std::path::Path) -> KillOnDrop {
    let log = std::fs::File::create(log).unwrap();
    KillOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_snap-csi"))
            .args(args)
            .env("RUST_LOG", "info")
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_node_is_not_ready_and_both_sides_log_why() {
    use snap_csi::proto::csi::v1 as csi;
    let dir = tempfile::tempdir().unwrap();
    let (config, _, pki) = test_config(dir.path());
    // A node whose certificate names another host than the agent serves.
    let stranger = pki.issue(Role::Node, "node-2");
    let agent_log = dir.path().join("agent.log");
    let node_log = dir.path().join("node.log");
    let _agent = spawn(
        &[
            "dpu-agent".into(),
            format!("--listen={}", config.listen),
            format!("--host-name={HOST_NAME}"),
            format!("--tls-cert={}", config.tls.cert.display()),
            format!("--tls-key={}", config.tls.key.display()),
            format!("--tls-ca={}", config.tls.ca.display()),
        ],
        &agent_log,
    );
    let endpoint = dir.path().join("csi.sock");
    let kubelet = dir.path().join("kubelet");
    let _node = spawn(
        &[
            "node".into(),
            format!("--endpoint={}", endpoint.display()),
            "--node-id=node-2".into(),
            format!("--kubelet-dir={}", kubelet.display()),
            format!("--state-dir={}", dir.path().join("state").display()),
            format!("--dpu-endpoint={}", config.listen),
            format!("--dpu-name={DPU_NAME}"),
            format!("--dpu-tls-cert={}", stranger.cert.display()),
            format!("--dpu-tls-key={}", stranger.key.display()),
            format!("--dpu-tls-ca={}", stranger.ca.display()),
        ],
        &node_log,
    );
    let channel = common::node::connect(&endpoint).await;
    let mut identity = csi::identity_client::IdentityClient::new(channel.clone());
    let probe = identity
        .probe(common::timed(csi::ProbeRequest {}, Duration::from_secs(5)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(false), "a refused link is not ready");

    std::fs::create_dir_all(kubelet.join("staging")).unwrap();
    let mut node = csi::node_client::NodeClient::new(channel);
    let stage = common::node::stage_request(
        "pvc-1",
        &kubelet.join("staging/pvc-1"),
        common::node::block_capability(csi::volume_capability::access_mode::Mode::SingleNodeWriter),
        &dir.path().join("unused.img"),
    );
    let status = node
        .node_stage_volume(common::timed(stage, Duration::from_secs(5)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("refused this node's certificate"),
        "{status:?}"
    );

    let agent_says = std::fs::read_to_string(&agent_log).unwrap();
    let refusals: Vec<&str> = agent_says
        .lines()
        .filter(|l| l.contains("refused a node's connection"))
        .collect();
    assert!(
        !refusals.is_empty(),
        "the agent logs the refusal:\n{agent_says}"
    );
    for line in refusals {
        assert!(
            line.contains("not valid for name") && line.contains(HOST_NAME),
            "the agent's line says why: {line}"
        );
    }
    let node_says = std::fs::read_to_string(&node_log).unwrap();
    let down: Vec<&str> = node_says
        .lines()
        .filter(|l| l.contains("does not answer"))
        .collect();
    assert_eq!(down.len(), 1, "one line on the node's side:\n{node_says}");
    assert!(
        down[0].contains("refused this node's certificate"),
        "{}",
        down[0]
    );
}
