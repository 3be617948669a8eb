//! The controller proxy (`snap-csi controller`): CSI Identity, Controller
//! and GroupController and the VolumeGroup API's Controller toward
//! Kubernetes, each RPC forwarded to the vendor's CSI controller.
//!
//! The proxy adds no behaviour of its own to what the vendor decides: the
//! vendor's responses and statuses (code, message, details) come back
//! unchanged, and requests reach it field for field, secrets and parameters
//! included. Two exceptions, both so that one deployment works with the
//! sidecars users run: GetPluginInfo reports our driver name (the node's),
//! and capability replies lose the values a CSI v1.11 client cannot decode
//! unless configured otherwise (`capabilities`). What it adds is how a call is made: the caller's
//! deadline (a little short, capped by `call_timeout`) on every call,
//! UNAVAILABLE retried with backoff inside it, UNAVAILABLE naming the vendor
//! when it cannot be reached, and one log line per call that never shows a
//! request's contents. All four services are always served; for a service
//! the vendor lacks, its UNIMPLEMENTED is what the CO gets.
//!
//! - `config`: settings (defaults, config file, env, flags) and the link to
//!   the vendor ([`crate::grpc::Link`]): `https://` with mutual TLS, a UNIX
//!   socket, or plaintext on loopback only with an insecure flag, as the
//!   DPU link (the calls carry the StorageClass's secrets).
//! - `forward`: the one forwarding helper every RPC goes through.
//! - `subject`: which request field names the object of a call, for the log.
//! - `capabilities`: what a CSI v1.11 client can decode in a capability reply.
//! - `identity`, `controller`, `group`, `volume_group`: the four services, one
//!   forwarding call per RPC (Identity may rename the driver).

pub mod capabilities;
pub mod config;
#[expect(
    clippy::module_inception,
    reason = "the CSI Controller service of the controller proxy: both names are CSI's"
)]
pub mod controller;
pub mod forward;
pub mod group;
pub mod identity;
pub mod subject;
pub mod volume_group;

pub use config::{ControllerArgs, ControllerConfig};

use std::future::Future;
use std::sync::Arc;

use crate::grpc::LinkAddress;
use crate::proto::csi::v1::controller_client::ControllerClient;
use crate::proto::csi::v1::controller_server::ControllerServer;
use crate::proto::csi::v1::group_controller_client::GroupControllerClient;
use crate::proto::csi::v1::group_controller_server::GroupControllerServer;
use crate::proto::csi::v1::identity_client::IdentityClient;
use crate::proto::csi::v1::identity_server::IdentityServer;
use crate::proto::volumegroup::controller_client::ControllerClient as VolumeGroupClient;
use crate::proto::volumegroup::controller_server::ControllerServer as VolumeGroupServer;
use capabilities::CapabilityFilter;
use controller::ControllerProxy;
use forward::Forwarder;
use group::GroupControllerProxy;
use identity::IdentityProxy;
use volume_group::VolumeGroupProxy;

/// Serves the proxy on `config.endpoint` until `shutdown` completes; calls in
/// flight finish first. The vendor need not be up yet: it is connected on the
/// first call, and again after it restarts.
pub async fn run(
    config: ControllerConfig,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let vendor = Arc::new(config.vendor().map_err(anyhow::Error::msg)?);
    let timeout = config.call_timeout;
    let capabilities = CapabilityFilter {
        forward_newer: config.forward_newer_capabilities,
    };
    let listener = crate::server::bind(&config.endpoint)?;
    tracing::info!(
        endpoint = %config.endpoint.display(),
        vendor = %vendor.address(),
        call_timeout = ?config.call_timeout,
        driver_name = %config.driver_name,
        forward_newer_capabilities = config.forward_newer_capabilities,
        "controller proxy listening"
    );
    if matches!(vendor.address(), LinkAddress::Plaintext(_)) {
        tracing::warn!(vendor = %vendor.address(), "the vendor is reached in plaintext, without authentication");
    }
    let router = crate::server::builder()
        .add_service(IdentityServer::new(IdentityProxy::new(
            Forwarder::new(vendor.clone(), IdentityClient::new, timeout),
            config.driver_name.clone(),
            capabilities,
        )))
        .add_service(ControllerServer::new(ControllerProxy(
            Forwarder::new(vendor.clone(), ControllerClient::new, timeout),
            capabilities,
        )))
        .add_service(GroupControllerServer::new(GroupControllerProxy(
            Forwarder::new(vendor.clone(), GroupControllerClient::new, timeout),
            capabilities,
        )))
        .add_service(VolumeGroupServer::new(VolumeGroupProxy(Forwarder::new(
            vendor,
            VolumeGroupClient::new,
            timeout,
        ))));
    let metrics = crate::metrics::bind(config.metrics_address).await?;
    crate::server::serve(router, listener, &config.endpoint, metrics, shutdown).await?;
    Ok(())
}
