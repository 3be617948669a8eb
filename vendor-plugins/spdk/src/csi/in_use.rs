//! DeleteVolume's check that no DPU still serves the volume to a host.
//!
//! The CSIDriver says `attachRequired: false`, so nothing in Kubernetes
//! keeps a PV from being deleted while a node still has it staged (its pod
//! gone, its unstage late or failing): the volume's data went while a DPU
//! served it. So, given the DPUs' vendor plugins (`--dpu-plugin
//! NODE_ID/NAME=PATH`, NAME the DPU's name as the node gives it on the host
//! whose node id is NODE_ID), the controller asks each,
//! at once, for every device it has (ListDevices, all pages, through the
//! node's own plugin client) before it deletes a volume, and refuses while
//! one lists a device of it. CSI's DeleteVolume table has the code for that:
//! FAILED_PRECONDITION, "in use by another resource"; external-provisioner
//! retries DeleteVolume whatever the code, so the volume goes once it is
//! unstaged everywhere.
//!
//! | the DPUs' plugins | DeleteVolume answers, deleting nothing |
//! |---|---|
//! | one lists a device of the volume | FAILED_PRECONDITION naming each DPU and device: unstage it on its host |
//! | one does not answer by the call's deadline (down, hung) | UNAVAILABLE: cannot tell whether the volume is in use |
//! | one cannot list devices (no LIST_DEVICES, or it answers UNIMPLEMENTED or FAILED_PRECONDITION) | FAILED_PRECONDITION: a configuration error, every `--dpu-plugin` must list its devices |
//! | one fails otherwise | INTERNAL, with its answer |
//!
//! A device found decides, whatever the others answered. A plugin that
//! restarts costs time, not a refusal: the client retries a call nobody
//! answered, and UNAVAILABLE, inside the deadline ([`PluginClient`]).
//!
//! Without `--dpu-plugin` nothing is checked, as before (the start line says
//! so): the deploy manifests' controller cannot reach the DPUs' plugin
//! sockets. The check narrows the window, it does not make deletion atomic
//! with staging: a stage that starts after the check is not seen (the node
//! stages without asking the controller), but Kubernetes starts none for a
//! PV it is deleting.

use std::path::PathBuf;

use futures::future::join_all;
use snap_csi::dpu::DpuError;
use snap_csi::dpu::plugin::{DEFAULT_SNAP_SOCKET_TEMPLATE, PluginClient};
use tokio::time::Instant;
use tonic::Status;

use super::CsiController;
use super::ids::parse_volume_id;

/// One DPU's vendor plugin, as `--dpu-plugin NODE_ID/NAME=PATH` gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DpuPlugin {
    /// `NODE_ID/NAME`, or the DPU's name alone where one host has DPUs:
    /// what an operator looks for.
    pub name: String,
    pub socket: PathBuf,
}

/// The clients of the configured DPUs' plugins.
#[derive(Debug, Default)]
pub(super) struct DpuPlugins {
    dpus: Vec<(String, PluginClient)>,
}

/// A device a DPU serves of a volume being deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Served {
    pub dpu: String,
    pub volume_id: String,
    pub device: String,
}

/// Why volumes are not deleted.
#[derive(Debug)]
pub(super) enum Refusal {
    /// DPUs serve devices of them.
    InUse(Vec<Served>),
    /// These DPUs' plugins did not list their devices (name, why), so
    /// whether the volumes are in use is not known.
    Unknown {
        volume_ids: Vec<String>,
        failures: Vec<(String, DpuError)>,
    },
}

impl DpuPlugins {
    /// Nothing is connected until the first check. Must be called inside a
    /// Tokio runtime (each client's channel spawns its worker).
    pub fn new(plugins: &[DpuPlugin]) -> DpuPlugins {
        DpuPlugins {
            dpus: plugins
                .iter()
                // The controller needs no SNAP socket: the template is unused.
                .map(|p| {
                    let client = PluginClient::new(&p.socket, DEFAULT_SNAP_SOCKET_TEMPLATE);
                    (p.name.clone(), client)
                })
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.dpus.is_empty()
    }

    /// Ok when every DPU listed its devices and none is of `volume_ids`.
    pub async fn check_unused(
        &self,
        volume_ids: &[&str],
        deadline: Instant,
    ) -> Result<(), Refusal> {
        if volume_ids.is_empty() {
            return Ok(());
        }
        let listed = join_all(
            self.dpus
                .iter()
                .map(|(name, client)| async move { (name, client.list_devices(deadline).await) }),
        )
        .await;
        let mut served = vec![];
        let mut failures = vec![];
        for (dpu, answer) in listed {
            match answer {
                Ok(entries) => served.extend(
                    entries
                        .into_iter()
                        .filter(|e| volume_ids.contains(&e.volume_id.as_str()))
                        .map(|e| Served {
                            dpu: dpu.clone(),
                            volume_id: e.volume_id,
                            device: e.device_name,
                        }),
                ),
                Err(error) => failures.push((dpu.clone(), error)),
            }
        }
        if !served.is_empty() {
            return Err(Refusal::InUse(served));
        }
        if !failures.is_empty() {
            return Err(Refusal::Unknown {
                volume_ids: volume_ids.iter().map(|v| v.to_string()).collect(),
                failures,
            });
        }
        Ok(())
    }
}

impl CsiController {
    /// Refuses while a configured DPU serves a device of one of
    /// `volume_ids` (see the module's table). Only volumes that exist in
    /// their backend are looked for: a device left of a volume that is gone
    /// serves none of our data, and refusing would fail forever the
    /// DeleteVolume that CSI says succeeds for a volume that does not exist
    /// (a retry after a success, too).
    ///
    /// Callers check before they hold the volume's name: it keeps this
    /// controller's calls on the volume apart, and devices are made by nodes
    /// through the DPUs' plugins, which it does not stop, so holding it here
    /// would only turn away the volume's other calls (ABORTED) for as long as
    /// a slow DPU takes, up to the deadline.
    pub(super) async fn refuse_in_use(
        &self,
        volume_ids: &[&str],
        deadline: Instant,
    ) -> Result<(), Status> {
        let dpus = &self.inner.dpus;
        if dpus.is_empty() {
            return Ok(());
        }
        let mut existing = vec![];
        for &id in volume_ids {
            let Some(backend) = parse_volume_id(id).and_then(|(kind, _)| self.backend(kind)) else {
                continue;
            };
            if backend.find(id, deadline).await?.is_some() {
                existing.push(id);
            }
        }
        dpus.check_unused(&existing, deadline)
            .await
            .map_err(|refusal| {
                let status = Status::from(refusal);
                tracing::warn!(volume_ids = ?existing, "not deleted: {}", status.message());
                status
            })
    }
}

impl From<Refusal> for Status {
    fn from(refusal: Refusal) -> Status {
        match refusal {
            Refusal::InUse(served) => {
                let mut volumes: Vec<&str> = vec![];
                for s in &served {
                    if !volumes.contains(&s.volume_id.as_str()) {
                        volumes.push(&s.volume_id);
                    }
                }
                let each = volumes
                    .iter()
                    .map(|volume| {
                        let devices: Vec<String> = served
                            .iter()
                            .filter(|s| s.volume_id == *volume)
                            .map(|s| format!("DPU {} serves it as device {}", s.dpu, s.device))
                            .collect();
                        format!("volume {volume} is in use: {}", devices.join(", "))
                    })
                    .collect::<Vec<_>>()
                    .join("; ");
                Status::failed_precondition(format!(
                    "{each}. Unstage it on its host (NodeUnstageVolume removes the device), \
                     then delete it again"
                ))
            }
            Refusal::Unknown {
                volume_ids,
                failures,
            } => {
                let configuration = failures
                    .iter()
                    .any(|(_, e)| matches!(e, DpuError::FailedPrecondition(_)));
                let unreachable = failures
                    .iter()
                    .any(|(_, e)| matches!(e, DpuError::Unavailable(_)));
                let each = failures
                    .iter()
                    .map(|(dpu, e)| match e {
                        DpuError::Unavailable(m) => {
                            format!("DPU {dpu}'s plugin did not list its devices in time: {m}")
                        }
                        DpuError::FailedPrecondition(m) => {
                            format!("DPU {dpu}'s plugin cannot list its devices: {m}")
                        }
                        other => format!("DPU {dpu}'s plugin failed to list its devices: {other}"),
                    })
                    .collect::<Vec<_>>()
                    .join("; ");
                let message = format!(
                    "cannot tell whether volume {} is in use, so it is not deleted: {each}",
                    volume_ids.join(", ")
                );
                if configuration {
                    Status::failed_precondition(format!(
                        "{message}. A configuration error: every --dpu-plugin must be a plugin \
                         that lists its devices (LIST_DEVICES)"
                    ))
                } else if unreachable {
                    Status::unavailable(format!(
                        "{message}. Retry when every DPU's plugin answers (a DPU gone for good: \
                         remove its --dpu-plugin)"
                    ))
                } else {
                    Status::internal(message)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    fn unknown(failures: Vec<(&str, DpuError)>) -> Status {
        Refusal::Unknown {
            volume_ids: vec!["aio-pvc-1".into()],
            failures: failures
                .into_iter()
                .map(|(d, e)| (d.to_string(), e))
                .collect(),
        }
        .into()
    }

    #[test]
    fn a_device_names_its_dpu_and_says_what_to_do() {
        let served = |dpu: &str, device: &str| Served {
            dpu: dpu.into(),
            volume_id: "aio-pvc-1".into(),
            device: device.into(),
        };
        let status: Status =
            Refusal::InUse(vec![served("bf-a", "dev-a"), served("bf-b", "dev-b")]).into();
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(
            status.message(),
            "volume aio-pvc-1 is in use: DPU bf-a serves it as device dev-a, DPU bf-b serves \
             it as device dev-b. Unstage it on its host (NodeUnstageVolume removes the device), \
             then delete it again"
        );
    }

    #[test]
    fn a_plugin_that_cannot_list_is_a_configuration_error_and_a_silent_one_unavailable() {
        let lacks = DpuError::FailedPrecondition("lacks capability LIST_DEVICES".into());
        let silent = DpuError::Unavailable("no gRPC answer".into());
        let status = unknown(vec![("bf-a", lacks.clone())]);
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert!(status.message().contains("DPU bf-a's plugin cannot list"));
        assert!(status.message().contains("configuration error"));
        let status = unknown(vec![("bf-b", silent.clone())]);
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.message().starts_with(
            "cannot tell whether volume aio-pvc-1 is in use, so it is not deleted: DPU bf-b's"
        ));
        // A configuration error waits for a person, not for a retry.
        let status = unknown(vec![("bf-a", lacks), ("bf-b", silent)]);
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert!(status.message().contains("bf-a") && status.message().contains("bf-b"));
        let status = unknown(vec![("bf-a", DpuError::Internal("token".into()))]);
        assert_eq!(status.code(), Code::Internal);
    }
}
