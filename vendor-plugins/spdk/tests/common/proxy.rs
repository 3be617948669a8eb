//! `snap-csi controller` in front of the sample controller, as Kubernetes'
//! sidecars reach it.

use std::time::Duration;

use snap_csi::controller::ControllerConfig;
use snap_csi::grpc::unix_channel;
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::volumegroup as vg;
use tonic::transport::Channel;

use super::csi::Csi;
use super::{TIMEOUT, timed};

pub struct Proxy {
    pub controller: csi::controller_client::ControllerClient<Channel>,
    pub identity: csi::identity_client::IdentityClient<Channel>,
    pub group: csi::group_controller_client::GroupControllerClient<Channel>,
    pub groups: vg::controller_client::ControllerClient<Channel>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    _dir: tempfile::TempDir,
}

impl Proxy {
    pub async fn start(csi: &Csi) -> Proxy {
        Proxy::start_with(csi, |_| {}).await
    }

    /// A proxy with the settings `configure` makes over the defaults.
    pub async fn start_with(csi: &Csi, configure: impl FnOnce(&mut ControllerConfig)) -> Proxy {
        let dir = tempfile::tempdir().unwrap();
        let endpoint = dir.path().join("csi.sock");
        let mut config = ControllerConfig {
            endpoint: endpoint.clone(),
            vendor_endpoint: format!("unix://{}", csi.socket.display()),
            call_timeout: Duration::from_secs(30),
            ..Default::default()
        };
        configure(&mut config);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(snap_csi::controller::run(config, async move {
            let _ = stopped.await;
        }));
        for _ in 0..500 {
            if endpoint.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let channel = unix_channel(endpoint);
        Proxy {
            controller: csi::controller_client::ControllerClient::new(channel.clone()),
            identity: csi::identity_client::IdentityClient::new(channel.clone()),
            group: csi::group_controller_client::GroupControllerClient::new(channel.clone()),
            groups: vg::controller_client::ControllerClient::new(channel),
            stop: Some(stop),
            task,
            _dir: dir,
        }
    }

    pub async fn create(
        &self,
        request: csi::CreateVolumeRequest,
    ) -> Result<csi::Volume, tonic::Status> {
        let response = self
            .controller
            .clone()
            .create_volume(timed(request, TIMEOUT))
            .await?;
        Ok(response.into_inner().volume.unwrap())
    }

    /// Stops the proxy and checks that it shut down cleanly.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = self.task;
        drop((self.controller, self.identity, self.group, self.groups));
        tokio::time::timeout(TIMEOUT, task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}
