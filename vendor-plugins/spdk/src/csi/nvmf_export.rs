//! How an NVMe-oF volume is reached: its subsystem `nqn.2024-01.io.snap-csi:<volume
//! id>` (namespace 1, a TCP listener at each `--nvmf-listen`), the QoS limits on
//! its lvol, and its record ([`VolumeRecord`]) in the controller's state
//! directory, which keeps what a restarted target forgets: the limits
//! (written before the target is asked) and whether a CreateVolume finished
//! exporting the volume. A restarted target keeps its lvols; [`Exports::lost`]
//! finds those once exported whose export is gone, and [`Exports::again`]
//! sets their recorded limits and exports them again.

use std::collections::HashMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use snap_csi::json_dir::JsonDir;
use snap_csi::jsonrpc::{RpcClient, code};
use snap_csi::spdk::bdev::Bdev;
use snap_csi::spdk::nvmf::{
    ListenAddress, NvmfCreateSubsystem, NvmfCreateTransport, NvmfGetSubsystems,
    NvmfNamespaceParams, NvmfSubsystem, NvmfSubsystemAddListener, NvmfSubsystemAddNs,
};
use tokio::time::Instant;
use tonic::Status;
use uuid::Uuid;

use super::aio::blocking;
use crate::errors::{Failure, is_absent};
use crate::qos::QosLimits;

/// Subsystem NQNs are this and the volume id.
pub const NQN_PREFIX: &str = "nqn.2024-01.io.snap-csi:";
/// Every subsystem has one namespace.
pub(super) const NSID: u32 = 1;
const MODEL: &str = "snap-csi SPDK lvol";
/// NVMe's serial number field.
const SERIAL_MAX: usize = 20;
/// The namespace of the target-side UUIDs and serials (random, never change).
const TARGET_NAMESPACE: Uuid = Uuid::from_u128(0x3def4779_5dcd_4f17_95fb_4bfb8de14084);

/// What the target forgets of a volume when it restarts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    #[serde(default)]
    pub qos: QosLimits,
    /// A CreateVolume finished exporting it.
    #[serde(default)]
    pub exported: bool,
}

pub fn nqn(volume_id: &str) -> String {
    format!("{NQN_PREFIX}{volume_id}")
}

fn digest(volume_id: &str) -> Uuid {
    Uuid::new_v5(&TARGET_NAMESPACE, volume_id.as_bytes())
}

fn serial(volume_id: &str) -> String {
    let hex = digest(volume_id).simple().to_string();
    format!("SC{}", &hex[..SERIAL_MAX - 2])
}

/// `<lvstore>/<name>`: how the target names an lvol.
pub(super) fn alias(lvstore: &str, name: &str) -> String {
    format!("{lvstore}/{name}")
}

/// A target's exports of the volumes of one lvstore.
#[derive(Debug)]
pub(super) struct Exports {
    rpc: RpcClient,
    lvstore: String,
    /// Every subsystem's listeners (at least one): each a path to its volume.
    listen: Vec<SocketAddr>,
    /// Each volume's [`VolumeRecord`], by volume id.
    records: JsonDir,
}

impl Exports {
    pub(super) fn new(
        rpc: RpcClient,
        lvstore: String,
        listen: Vec<SocketAddr>,
        records: JsonDir,
    ) -> Self {
        Exports {
            rpc,
            lvstore,
            listen,
            records,
        }
    }

    fn alias(&self, name: &str) -> String {
        alias(&self.lvstore, name)
    }

    /// Whether `subsystem` exports `bdev` as namespace 1 on every listener of ours.
    pub(super) fn complete(&self, subsystem: &NvmfSubsystem, bdev: &Bdev) -> bool {
        Self::has_namespace(subsystem, bdev)
            && self
                .listen_addresses()
                .iter()
                .all(|ours| Self::has_listener(subsystem, ours))
    }

    /// Of `volumes` (`(volume id, lvol)`), those once exported whose export
    /// (subsystem, namespace or any listener) the target lacks: a restarted
    /// target's, or one whose listener an operator removed.
    pub(super) async fn lost(
        &self,
        volumes: Vec<(String, Bdev)>,
        deadline: Instant,
    ) -> Result<Vec<String>, Status> {
        let everything = NvmfGetSubsystems { nqn: None };
        let subsystems = self
            .rpc
            .call_until(&everything, deadline)
            .await
            .map_err(|e| Failure::target("listing the target's subsystems", e))?;
        let exported: HashMap<&str, &NvmfSubsystem> =
            subsystems.iter().map(|s| (s.nqn.as_str(), s)).collect();
        let mut lost = Vec::new();
        for (volume_id, bdev) in volumes {
            let unexported = exported
                .get(nqn(&volume_id).as_str())
                .is_none_or(|s| !self.complete(s, &bdev));
            if unexported && self.record(&volume_id).await?.exported {
                lost.push(volume_id);
            }
        }
        Ok(lost)
    }

    /// Sets `volume_id`'s recorded QoS limits on `bdev`, its lvol, and
    /// exports it.
    pub(super) async fn again(
        &self,
        volume_id: &str,
        bdev: &Bdev,
        deadline: Instant,
    ) -> Result<(), Status> {
        let record = self.record(volume_id).await?;
        if !record.qos.is_empty() {
            self.limit(volume_id, &record.qos, deadline).await?;
        }
        self.export(volume_id, bdev, deadline).await
    }

    /// `volume_id`'s record; an empty one if it has none.
    pub(super) async fn record(&self, volume_id: &str) -> Result<VolumeRecord, Status> {
        let (records, volume_id) = (self.records.clone(), volume_id.to_string());
        blocking(move || {
            records
                .load(&volume_id)
                .map(Option::unwrap_or_default)
                .map_err(|e| Failure::record("reading the volume's record", e).into())
        })
        .await
    }

    /// Writes `volume_id`'s record; `None` removes it.
    pub(super) async fn keep_record(
        &self,
        volume_id: &str,
        record: Option<VolumeRecord>,
    ) -> Result<(), Status> {
        let (records, volume_id) = (self.records.clone(), volume_id.to_string());
        blocking(move || {
            match record {
                Some(record) => records.store(&volume_id, &record),
                None => records.remove(&volume_id),
            }
            .map_err(|e| Failure::record("writing the volume's record", e).into())
        })
        .await
    }

    /// `bdev_set_qos_limit` on the volume's lvol.
    pub(super) async fn limit(
        &self,
        volume_id: &str,
        limits: &QosLimits,
        deadline: Instant,
    ) -> Result<(), Status> {
        let lvol = self.alias(volume_id);
        match self.rpc.call_until(&limits.request(&lvol), deadline).await {
            Ok(_) => {
                tracing::info!(%volume_id, ?limits, "QoS limits set on the target's lvol");
                Ok(())
            }
            Err(e) if is_absent(&e) => Err(Status::not_found(format!(
                "volume {volume_id} has no lvol {lvol}"
            ))),
            Err(e) => Err(Failure::qos(&lvol, e).into()),
        }
    }

    /// Every listener of ours, as SPDK takes them; the first is a volume's
    /// first path.
    pub(super) fn listen_addresses(&self) -> Vec<ListenAddress> {
        self.listen
            .iter()
            .map(|listen| ListenAddress {
                trtype: "tcp".into(),
                adrfam: if listen.is_ipv4() { "ipv4" } else { "ipv6" }.into(),
                traddr: listen.ip().to_string(),
                trsvcid: listen.port().to_string(),
            })
            .collect()
    }

    /// The listeners beyond the first, as a volume context lists its extra
    /// paths (`ADDR:PORT`, an IPv6 address in brackets).
    pub(super) fn extra_listeners(&self) -> Vec<SocketAddr> {
        self.listen.iter().skip(1).copied().collect()
    }

    pub(super) async fn subsystem(
        &self,
        volume_id: &str,
        deadline: Instant,
    ) -> Result<Option<NvmfSubsystem>, Status> {
        let query = NvmfGetSubsystems {
            nqn: Some(nqn(volume_id)),
        };
        match self.rpc.call_until(&query, deadline).await {
            Ok(list) => Ok(list.into_iter().next()),
            Err(e) if is_absent(&e) => Ok(None),
            Err(e) => {
                Err(Failure::target(format!("looking up subsystem {}", nqn(volume_id)), e).into())
            }
        }
    }

    fn has_namespace(subsystem: &NvmfSubsystem, bdev: &Bdev) -> bool {
        subsystem.namespaces.iter().any(|n| {
            n.nsid == NSID && (n.bdev_name == bdev.name || bdev.aliases.contains(&n.bdev_name))
        })
    }

    fn has_listener(subsystem: &NvmfSubsystem, ours: &ListenAddress) -> bool {
        subsystem.listen_addresses.iter().any(|a| {
            a.trtype.eq_ignore_ascii_case(&ours.trtype)
                && a.adrfam.eq_ignore_ascii_case(&ours.adrfam)
                && a.traddr == ours.traddr
                && a.trsvcid == ours.trsvcid
        })
    }

    /// Exports the volume's lvol: subsystem, namespace 1, every listener;
    /// each step only if the subsystem lacks it.
    pub(super) async fn export(
        &self,
        volume_id: &str,
        bdev: &Bdev,
        deadline: Instant,
    ) -> Result<(), Status> {
        let nqn = nqn(volume_id);
        let mut subsystem = self.subsystem(volume_id, deadline).await?;
        if subsystem.is_none() {
            let create = NvmfCreateSubsystem {
                nqn: nqn.clone(),
                serial_number: Some(serial(volume_id)),
                model_number: Some(MODEL.into()),
                allow_any_host: Some(true),
                max_namespaces: Some(NSID),
            };
            match self.rpc.call_until(&create, deadline).await {
                Ok(_) => {}
                // "Unable to create subsystem": taken, or refused; look.
                Err(e) if e.code() == Some(code::INTERNAL_ERROR) => {
                    if self.subsystem(volume_id, deadline).await?.is_none() {
                        return Err(Failure::target(format!("creating subsystem {nqn}"), e).into());
                    }
                }
                Err(e) => {
                    return Err(Failure::target(format!("creating subsystem {nqn}"), e).into());
                }
            }
            subsystem = self.subsystem(volume_id, deadline).await?;
        }
        let subsystem = subsystem.ok_or_else(|| {
            Status::aborted(format!("subsystem {nqn} vanished while being set up"))
        })?;
        if !Self::has_namespace(&subsystem, bdev) {
            let add = NvmfSubsystemAddNs {
                nqn: nqn.clone(),
                namespace: NvmfNamespaceParams {
                    bdev_name: self.alias(volume_id),
                    nsid: Some(NSID),
                    uuid: Some(digest(volume_id).hyphenated().to_string()),
                },
            };
            if let Err(e) = self.rpc.call_until(&add, deadline).await {
                // -32602 is also SPDK's answer to a namespace already there.
                let there = e.code() == Some(code::INVALID_PARAMS)
                    && self
                        .subsystem(volume_id, deadline)
                        .await?
                        .is_some_and(|s| Self::has_namespace(&s, bdev));
                if !there {
                    return Err(Failure::target(
                        format!("adding {} to {nqn}", self.alias(volume_id)),
                        e,
                    )
                    .into());
                }
            }
        }
        let missing: Vec<ListenAddress> = self
            .listen_addresses()
            .into_iter()
            .filter(|ours| !Self::has_listener(&subsystem, ours))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let transport = NvmfCreateTransport {
            trtype: "TCP".into(),
        };
        match self.rpc.call_until(&transport, deadline).await {
            Ok(_) => {}
            // "Transport type 'TCP' already exists".
            Err(e) if e.code() == Some(code::INTERNAL_ERROR) => {}
            Err(e) => return Err(Failure::target("creating the TCP transport", e).into()),
        }
        for listen_address in missing {
            let what = format!(
                "adding listener {}:{} to {nqn}",
                listen_address.traddr, listen_address.trsvcid
            );
            let add = NvmfSubsystemAddListener {
                nqn: nqn.clone(),
                listen_address,
            };
            if let Err(e) = self.rpc.call_until(&add, deadline).await {
                let there = e.code() == Some(code::INVALID_PARAMS)
                    && self
                        .subsystem(volume_id, deadline)
                        .await?
                        .is_some_and(|s| Self::has_listener(&s, &add.listen_address));
                if !there {
                    return Err(Failure::target(what, e).into());
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_names_fit_spdks_fields_and_never_change() {
        let id = "nvmf-pvc-0b9a1e0e-1111-4c7e-9f00-000000000001";
        assert_eq!(
            nqn(id),
            "nqn.2024-01.io.snap-csi:nvmf-pvc-0b9a1e0e-1111-4c7e-9f00-000000000001"
        );
        let serial = serial(id);
        assert_eq!(serial.len(), SERIAL_MAX);
        assert!(serial.starts_with("SC"));
        assert_ne!(serial, super::serial("nvmf-other"));
    }
}
