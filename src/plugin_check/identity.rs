//! The plugin about itself: GetPluginInfo, Probe, its capabilities and its
//! SNAP provider.

use super::checker::{Advertised, Checker};
use super::report::checks;
use super::show::{capability_name, show};
use super::text;
use crate::grpc::call_until;
use crate::proto::nvidia::storage::plugins::v1 as api;
use api::storage_plugin_service_capability::rpc::Type as Capability;

impl Checker<'_> {
    pub(super) async fn plugin_info(&mut self) {
        let name = checks::PLUGIN_INFO;
        let mut c = self.identity.clone();
        let answer = call_until(
            "GetPluginInfo",
            self.deadline(),
            api::GetPluginInfoRequest {},
            |r| async move { c.get_plugin_info(r).await },
        )
        .await;
        match answer {
            Ok(info) if !info.name.is_empty() && !info.vendor_version.is_empty() => self.pass(
                name,
                format!(
                    "GetPluginInfo names the plugin {:?}, version {:?}",
                    info.name, info.vendor_version
                ),
            ),
            Ok(info) => self.fail(
                name,
                format!(
                    "expected a non-empty name and vendor_version, got name {:?} and \
                     vendor_version {:?}. The API text: {:?}",
                    info.name,
                    info.vendor_version,
                    text::PLUGIN_INFO
                ),
            ),
            Err(status) => self.fail(
                name,
                format!(
                    "expected 0 OK, GetPluginInfo answered {}. The API text: {:?}",
                    show(&status),
                    text::PLUGIN_INFO
                ),
            ),
        }
    }

    pub(super) async fn probe(&mut self) {
        let name = checks::PROBE;
        let mut c = self.identity.clone();
        let answer = call_until(
            "Probe",
            self.deadline(),
            api::ProbeRequest {},
            |r| async move { c.probe(r).await },
        )
        .await;
        match answer.map(|p| p.ready) {
            Ok(Some(true)) => self.pass(name, "Probe answers 0 OK, ready".to_string()),
            // The API copies CSI's ProbeResponse, where an unset `ready` means
            // ready; our node reads it so too.
            Ok(None) => self.pass(
                name,
                "Probe answers 0 OK with ready unset, which counts as ready (as in CSI's Probe)"
                    .to_string(),
            ),
            Ok(Some(false)) => self.fail(
                name,
                format!(
                    "the plugin is not ready: expected ready=true from a healthy plugin, \
                     Probe answered 0 OK with ready=false (still initializing), so checks \
                     below may fail for that reason alone. The API text: {:?}",
                    text::PROBE
                ),
            ),
            Err(status) => self.fail(
                name,
                format!(
                    "expected 0 OK, Probe answered {}. The API text: {:?}",
                    show(&status),
                    text::PROBE
                ),
            ),
        }
    }

    pub(super) async fn capabilities(&mut self) -> Option<Advertised> {
        let name = checks::CAPABILITIES;
        let mut c = self.storage.clone();
        let answer = call_until(
            "StoragePluginGetCapabilities",
            self.deadline(),
            api::StoragePluginGetCapabilitiesRequest {},
            |r| async move { c.storage_plugin_get_capabilities(r).await },
        )
        .await;
        match answer {
            Ok(response) => {
                let mut known = Vec::new();
                let mut unknown = Vec::new();
                for capability in &response.capabilities {
                    match capability.r#type {
                        Some(api::storage_plugin_service_capability::Type::Rpc(rpc)) => {
                            match Capability::try_from(rpc.r#type) {
                                Ok(Capability::Unspecified) | Err(_) => unknown.push(rpc.r#type),
                                Ok(known_type) => known.push(known_type),
                            }
                        }
                        None => unknown.push(0),
                    }
                }
                let mut detail = format!(
                    "StoragePluginGetCapabilities answers 0 OK advertising [{}]",
                    known
                        .iter()
                        .map(|c| capability_name(*c))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                if !unknown.is_empty() {
                    detail.push_str(&format!(
                        " (and entries of unknown or unspecified type {unknown:?}, ignored)"
                    ));
                }
                self.pass(name, detail);
                Some(Advertised(known))
            }
            Err(status) => {
                self.fail(
                    name,
                    format!(
                        "expected 0 OK, StoragePluginGetCapabilities answered {}; the checks \
                         that depend on capabilities are skipped. The API text: {:?}",
                        show(&status),
                        text::CAPABILITIES
                    ),
                );
                None
            }
        }
    }

    pub(super) async fn snap_provider(&mut self) {
        let name = checks::SNAP_PROVIDER;
        let mut c = self.storage.clone();
        let answer = call_until(
            "GetSNAPProvider",
            self.deadline(),
            api::GetSnapProviderRequest {},
            |r| async move { c.get_snap_provider(r).await },
        )
        .await;
        match answer {
            Ok(p) if p.provider_name.is_empty() => self.pass(
                name,
                "GetSNAPProvider answers 0 OK: the default SNAP provider".to_string(),
            ),
            Ok(p) => self.pass(
                name,
                format!(
                    "GetSNAPProvider answers 0 OK: SNAP provider {:?}",
                    p.provider_name
                ),
            ),
            Err(status) => self.fail(
                name,
                format!(
                    "expected 0 OK, GetSNAPProvider answered {}. The API text: {:?}",
                    show(&status),
                    text::SNAP_PROVIDER
                ),
            ),
        }
    }
}
