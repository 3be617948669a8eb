//! The controller proxy for a test: in-process with a client of each
//! service it serves, or as the binary an operator starts; and the checks
//! its tests share.

use std::fmt::Debug;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

use snap_csi::controller::ControllerConfig;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::controller_client::ControllerClient;
use snap_csi::proto::csi::v1::group_controller_client::GroupControllerClient;
use snap_csi::proto::csi::v1::identity_client::IdentityClient;
use snap_csi::proto::volumegroup::controller_client::ControllerClient as VolumeGroupClient;
use tempfile::TempDir;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::csi_samples::{every_capability_value, secrets};
use super::shared::{DEADLINE_SLACK, timed};
use super::vendor_controller::{Answer, FakeVendor, Services};

/// The call timeout the proxies here are configured with.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The proxy in-process, with a client of each service it serves.
pub struct Proxy {
    pub identity: IdentityClient<Channel>,
    pub controller: ControllerClient<Channel>,
    pub group: GroupControllerClient<Channel>,
    pub volume_group: VolumeGroupClient<Channel>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
    _dir: TempDir,
}

impl Proxy {
    pub async fn start(vendor_endpoint: &str) -> Proxy {
        Proxy::start_with(vendor_endpoint, |_| {}).await
    }

    /// A proxy with the settings `configure` makes over the defaults.
    pub async fn start_with(
        vendor_endpoint: &str,
        configure: impl FnOnce(&mut ControllerConfig),
    ) -> Proxy {
        let dir = tempfile::tempdir().unwrap();
        let mut config = ControllerConfig {
            endpoint: dir.path().join("csi.sock"),
            vendor_endpoint: vendor_endpoint.into(),
            // The tests' TCP vendors listen on loopback.
            vendor_insecure_plaintext: vendor_endpoint.starts_with("http://"),
            call_timeout: CALL_TIMEOUT,
            ..Default::default()
        };
        configure(&mut config);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(snap_csi::controller::run(config.clone(), async move {
            let _ = stopped.await;
        }));
        let channel = super::node::connect(&config.endpoint).await;
        Proxy {
            identity: IdentityClient::new(channel.clone()),
            controller: ControllerClient::new(channel.clone()),
            group: GroupControllerClient::new(channel.clone()),
            volume_group: VolumeGroupClient::new(channel),
            stop: Some(stop),
            task: Some(task),
            _dir: dir,
        }
    }

    /// Stops the proxy and checks that it shut down cleanly.
    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap().unwrap();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// A fake vendor serving everything on a socket in `dir`, and a proxy to it.
pub async fn proxied_vendor(dir: &Path) -> (FakeVendor, Proxy) {
    let vendor = FakeVendor::unix(dir, Services::ALL).await;
    let proxy = Proxy::start(&vendor.endpoint).await;
    (vendor, proxy)
}

/// Waits for an answer the proxy must give by the caller's deadline
/// `limit`, give or take [`DEADLINE_SLACK`] for a loaded machine: a proxy
/// that ignored the deadline would answer only at its own [`CALL_TIMEOUT`],
/// later than that. (tonic 0.14's client enforces the deadline it sends and
/// answers CANCELLED "Timeout expired" when its timer wins, which fails the
/// callers' code checks; this bound only keeps a call without one, or a
/// stalled test, from hanging.)
pub async fn answered_within<T>(limit: Duration, call: impl Future<Output = T>) -> T {
    const { assert!(CALL_TIMEOUT.as_secs() > 2 + DEADLINE_SLACK.as_secs()) };
    tokio::time::timeout(limit + DEADLINE_SLACK, call)
        .await
        .unwrap_or_else(|_| panic!("no answer within {limit:?} and {DEADLINE_SLACK:?} more"))
}

/// Sends `request` through the proxy with `call` while the vendor is
/// scripted to answer `response`; both must arrive exactly as sent.
pub async fn check_roundtrip<Req, Resp, Fut>(
    vendor: &FakeVendor,
    method: &'static str,
    request: Req,
    response: Resp,
    call: impl FnOnce(tonic::Request<Req>) -> Fut,
) where
    Req: Clone + PartialEq + Debug + 'static,
    Resp: Clone + PartialEq + Debug + Send + 'static,
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    vendor.script(method, [Answer::reply(response.clone())]);
    let answer = answered_within(
        CALL_TIMEOUT,
        call(timed(request.clone(), Duration::from_secs(5))),
    )
    .await;
    let got = answer
        .unwrap_or_else(|s| panic!("{method}: {s:?}"))
        .into_inner();
    assert_eq!(got, response, "{method}: the response changed on the way");
    assert_eq!(
        vendor.received::<Req>(method),
        vec![request],
        "{method}: the request changed on the way (or was sent more than once)"
    );
}

/// The three capability replies through `proxy`, each answered by `vendor`
/// with [`every_capability_value`].
pub async fn capabilities_through(
    vendor: &FakeVendor,
    proxy: &Proxy,
) -> (
    csi::GetPluginCapabilitiesResponse,
    csi::ControllerGetCapabilitiesResponse,
    csi::GroupControllerGetCapabilitiesResponse,
) {
    let (plugin, controller, group) = every_capability_value();
    vendor.script("GetPluginCapabilities", [Answer::reply(plugin)]);
    vendor.script("ControllerGetCapabilities", [Answer::reply(controller)]);
    vendor.script("GroupControllerGetCapabilities", [Answer::reply(group)]);
    let plugin = proxy
        .identity
        .clone()
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await;
    let controller = proxy
        .controller
        .clone()
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await;
    let group = proxy
        .group
        .clone()
        .group_controller_get_capabilities(csi::GroupControllerGetCapabilitiesRequest {})
        .await;
    (
        plugin.unwrap().into_inner(),
        controller.unwrap().into_inner(),
        group.unwrap().into_inner(),
    )
}

pub async fn plugin_info(proxy: &Proxy) -> csi::GetPluginInfoResponse {
    proxy
        .identity
        .clone()
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// The proxy's answer when its vendor at `endpoint` does not answer: UNAVAILABLE
/// naming the endpoint, before the caller's deadline.
pub async fn assert_unreachable(proxy: &Proxy, endpoint: &str) {
    let deadline = Duration::from_millis(1500);
    let answer = answered_within(
        deadline,
        proxy.controller.clone().create_volume(timed(
            csi::CreateVolumeRequest {
                name: "pvc-1".into(),
                secrets: secrets(),
                ..Default::default()
            },
            deadline,
        )),
    )
    .await;
    let status = answer.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains(endpoint),
        "the message names the vendor endpoint {endpoint}: {status:?}"
    );
}

/// The proxy's refusal of a service the vendor lacks (`ours`) is the
/// vendor's own (`theirs`): UNIMPLEMENTED, with the vendor's message.
pub fn assert_refused_alike(ours: &Status, theirs: &Status) {
    assert_eq!(ours.code(), Code::Unimplemented, "{ours:?}");
    assert_eq!(
        (ours.code(), ours.message()),
        (theirs.code(), theirs.message())
    );
}

/// The `snap-csi controller` binary as an operator starts it, serving
/// `endpoint` for the vendor at `vendor_endpoint`, logging to `log`.
pub fn proxy_process(endpoint: &Path, vendor_endpoint: &str, log: &Path) -> std::process::Command {
    use std::process::Stdio;
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_snap-csi"));
    command
        .arg("controller")
        .arg("--endpoint")
        .arg(endpoint)
        .arg("--vendor-endpoint")
        .arg(vendor_endpoint)
        .env_remove("SNAP_CSI_CONFIG")
        .env_remove("SNAP_CSI_VENDOR_INSECURE_PLAINTEXT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    command
}
