//! The DPU agent API (`snapcsi.dpu.v1`) to and from the attach layer's own
//! types, for both ends of the link: the node's [`super::remote::RemoteDpu`]
//! and the agent's service. One place, so that both ends read a message the
//! same way. A message that cannot be read is INVALID_ARGUMENT on the agent
//! (the node sent it) and INTERNAL on the node (the agent answered it).

use super::attach::{
    AttachRequest, Attachment, ExposedVolume, FunctionUse, Inventory, Placement, PoolUse,
    VolumeMode,
};
use super::emulation::Emulation;
use super::error::DpuError;
use crate::host::HostLocator;
use crate::proto::nvidia::storage::plugins::v1::AccessMode;
use crate::proto::snapcsi::dpu::v1 as api;
use crate::spdk::bdev::BdevIostat;
use crate::spdk::bdev::Iostat as IoStats;

impl From<Emulation> for api::Emulation {
    fn from(value: Emulation) -> Self {
        match value {
            Emulation::Nvme => api::Emulation::Nvme,
            Emulation::VirtioBlk => api::Emulation::VirtioBlk,
            Emulation::VirtioFs => api::Emulation::VirtioFs,
        }
    }
}

fn emulation(value: i32) -> Result<Emulation, String> {
    match api::Emulation::try_from(value) {
        Ok(api::Emulation::Nvme) => Ok(Emulation::Nvme),
        Ok(api::Emulation::VirtioBlk) => Ok(Emulation::VirtioBlk),
        Ok(api::Emulation::VirtioFs) => Ok(Emulation::VirtioFs),
        _ => Err(format!(
            "emulation {value} is not {}",
            Emulation::listed(Emulation::ALL, Emulation::label)
        )),
    }
}

impl From<&AttachRequest> for api::AttachRequest {
    fn from(request: &AttachRequest) -> Self {
        api::AttachRequest {
            volume_id: request.volume_id.clone(),
            access_modes: request.access_modes.iter().map(|m| *m as i32).collect(),
            volume_mode: match request.volume_mode {
                VolumeMode::Block => api::VolumeMode::Block,
                VolumeMode::Filesystem => api::VolumeMode::Filesystem,
            } as i32,
            publish_context: request.publish_context.clone(),
            volume_context: request.volume_context.clone(),
            storage_parameters: request.storage_parameters.clone(),
            emulation: api::Emulation::from(request.emulation) as i32,
            attached_before: request.attached_before,
            secrets: request.secrets.clone(),
            placement: match request.placement {
                Placement::Dedicated => api::Placement::Dedicated,
                Placement::Packed { .. } => api::Placement::Packed,
            } as i32,
            namespaces_per_controller: match request.placement {
                Placement::Dedicated => 0,
                Placement::Packed {
                    namespaces_per_controller,
                } => namespaces_per_controller,
            },
        }
    }
}

fn placement(value: i32, namespaces_per_controller: u32) -> Result<Placement, String> {
    match api::Placement::try_from(value) {
        Ok(api::Placement::Unspecified | api::Placement::Dedicated) => Ok(Placement::Dedicated),
        Ok(api::Placement::Packed) if namespaces_per_controller > 0 => Ok(Placement::Packed {
            namespaces_per_controller,
        }),
        Ok(api::Placement::Packed) => {
            Err("the packed placement needs namespaces_per_controller of at least 1".into())
        }
        Err(_) => Err(format!("placement {value} is not dedicated or packed")),
    }
}

impl TryFrom<api::AttachRequest> for AttachRequest {
    type Error = DpuError;

    fn try_from(request: api::AttachRequest) -> Result<Self, DpuError> {
        let access_modes = request
            .access_modes
            .iter()
            .map(|&m| {
                AccessMode::try_from(m)
                    .map_err(|_| DpuError::InvalidArgument(format!("unknown access mode {m}")))
            })
            .collect::<Result<_, _>>()?;
        let volume_mode = match api::VolumeMode::try_from(request.volume_mode) {
            Ok(api::VolumeMode::Block) => VolumeMode::Block,
            Ok(api::VolumeMode::Filesystem) => VolumeMode::Filesystem,
            _ => {
                return Err(DpuError::InvalidArgument(format!(
                    "volume mode {} is not block or filesystem",
                    request.volume_mode
                )));
            }
        };
        Ok(AttachRequest {
            volume_id: request.volume_id,
            access_modes,
            volume_mode,
            publish_context: request.publish_context,
            volume_context: request.volume_context,
            storage_parameters: request.storage_parameters,
            emulation: emulation(request.emulation).map_err(DpuError::InvalidArgument)?,
            placement: placement(request.placement, request.namespaces_per_controller)
                .map_err(DpuError::InvalidArgument)?,
            attached_before: request.attached_before,
            secrets: request.secrets,
        })
    }
}

impl From<Attachment> for api::AttachResponse {
    fn from(attachment: Attachment) -> Self {
        let kind = match attachment.locator {
            HostLocator::Nvme {
                bdf,
                nsid,
                uuid,
                serial,
            } => api::host_locator::Kind::Nvme(api::NvmeLocator {
                bdf,
                nsid,
                uuid: uuid.unwrap_or_default(),
                serial: serial.unwrap_or_default(),
            }),
            HostLocator::VirtioBlk { bdf, serial } => {
                api::host_locator::Kind::VirtioBlk(api::VirtioBlkLocator { bdf, serial })
            }
            HostLocator::VirtioFs { tag } => {
                api::host_locator::Kind::VirtioFs(api::VirtioFsLocator { tag })
            }
        };
        api::AttachResponse {
            device_name: attachment.device_name,
            locator: Some(api::HostLocator { kind: Some(kind) }),
        }
    }
}

impl TryFrom<api::AttachResponse> for Attachment {
    type Error = DpuError;

    fn try_from(response: api::AttachResponse) -> Result<Self, DpuError> {
        let locator = match response.locator.and_then(|l| l.kind) {
            Some(api::host_locator::Kind::Nvme(nvme)) => HostLocator::Nvme {
                bdf: nvme.bdf,
                nsid: nvme.nsid,
                uuid: Some(nvme.uuid).filter(|u| !u.is_empty()),
                serial: Some(nvme.serial).filter(|s| !s.is_empty()),
            },
            Some(api::host_locator::Kind::VirtioBlk(virtio)) => HostLocator::VirtioBlk {
                bdf: virtio.bdf,
                serial: virtio.serial,
            },
            Some(api::host_locator::Kind::VirtioFs(fs)) => HostLocator::VirtioFs { tag: fs.tag },
            None => {
                return Err(DpuError::Internal(
                    "the DPU agent answered an attach without a host locator".into(),
                ));
            }
        };
        Ok(Attachment {
            device_name: response.device_name,
            locator,
        })
    }
}

impl From<Inventory> for api::GetInventoryResponse {
    fn from(inventory: Inventory) -> Self {
        api::GetInventoryResponse {
            functions: inventory
                .functions
                .into_iter()
                .map(|f| api::EmulatedFunction {
                    emulation: api::Emulation::from(f.emulation) as i32,
                    bdf: f.bdf,
                    controller: f.controller.unwrap_or_default(),
                    volume_key: f.volume_key.unwrap_or_default(),
                    pool: f.pool.unwrap_or_default(),
                })
                .collect(),
            volumes: inventory
                .volumes
                .into_iter()
                .map(|v| api::ExposedVolume {
                    volume_key: v.key,
                    emulation: api::Emulation::from(v.emulation) as i32,
                    device_names: v.device_names,
                    bdf: v.bdf.unwrap_or_default(),
                })
                .collect(),
            pools: inventory
                .pools
                .into_iter()
                .map(|p| api::Pool {
                    nqn: p.nqn,
                    namespaces: p.namespaces,
                    capacity: p.capacity,
                    bdf: p.bdf.unwrap_or_default(),
                })
                .collect(),
        }
    }
}

impl TryFrom<api::GetInventoryResponse> for Inventory {
    type Error = DpuError;

    fn try_from(response: api::GetInventoryResponse) -> Result<Self, DpuError> {
        let unreadable = |e: String| DpuError::Internal(format!("the DPU agent's inventory: {e}"));
        let present = |s: String| Some(s).filter(|s| !s.is_empty());
        Ok(Inventory {
            functions: response
                .functions
                .into_iter()
                .map(|f| {
                    Ok(FunctionUse {
                        emulation: emulation(f.emulation).map_err(unreadable)?,
                        bdf: f.bdf,
                        controller: present(f.controller),
                        volume_key: present(f.volume_key),
                        pool: present(f.pool),
                    })
                })
                .collect::<Result<_, DpuError>>()?,
            volumes: response
                .volumes
                .into_iter()
                .map(|v| {
                    Ok(ExposedVolume {
                        key: v.volume_key,
                        emulation: emulation(v.emulation).map_err(unreadable)?,
                        device_names: v.device_names,
                        bdf: present(v.bdf),
                    })
                })
                .collect::<Result<_, DpuError>>()?,
            pools: response
                .pools
                .into_iter()
                .map(|p| PoolUse {
                    nqn: p.nqn,
                    namespaces: p.namespaces,
                    capacity: p.capacity,
                    bdf: present(p.bdf),
                })
                .collect(),
        })
    }
}

impl From<IoStats> for api::GetIoStatsResponse {
    fn from(stats: IoStats) -> Self {
        api::GetIoStatsResponse {
            tick_rate: stats.tick_rate,
            ticks: stats.ticks,
            bdevs: stats
                .bdevs
                .into_iter()
                .map(|b| api::BdevIoStats {
                    name: b.name,
                    bytes_read: b.bytes_read,
                    num_read_ops: b.num_read_ops,
                    bytes_written: b.bytes_written,
                    num_write_ops: b.num_write_ops,
                    bytes_unmapped: b.bytes_unmapped,
                    num_unmap_ops: b.num_unmap_ops,
                    read_latency_ticks: b.read_latency_ticks,
                    write_latency_ticks: b.write_latency_ticks,
                })
                .collect(),
        }
    }
}

/// Every field of a proto3 message reads: nothing to refuse.
impl From<api::GetIoStatsResponse> for IoStats {
    fn from(response: api::GetIoStatsResponse) -> Self {
        IoStats {
            tick_rate: response.tick_rate,
            ticks: response.ticks,
            bdevs: response
                .bdevs
                .into_iter()
                .map(|b| BdevIostat {
                    name: b.name,
                    bytes_read: b.bytes_read,
                    num_read_ops: b.num_read_ops,
                    bytes_written: b.bytes_written,
                    num_write_ops: b.num_write_ops,
                    bytes_unmapped: b.bytes_unmapped,
                    num_unmap_ops: b.num_unmap_ops,
                    read_latency_ticks: b.read_latency_ticks,
                    write_latency_ticks: b.write_latency_ticks,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attach_crosses_the_link_unchanged_both_ways() {
        let request = AttachRequest {
            volume_id: "pvc-1".into(),
            access_modes: vec![AccessMode::Rwo, AccessMode::Rox],
            volume_mode: VolumeMode::Block,
            publish_context: [("p".to_string(), "1".to_string())].into(),
            volume_context: [("v".to_string(), "2".to_string())].into(),
            storage_parameters: [("s".to_string(), "3".to_string())].into(),
            emulation: Emulation::VirtioBlk,
            placement: Placement::Dedicated,
            attached_before: true,
            secrets: [("key".to_string(), "k".to_string())].into(),
        };
        let sent = api::AttachRequest::from(&request);
        assert_eq!(AttachRequest::try_from(sent).unwrap(), request);
        let packed = AttachRequest {
            emulation: Emulation::Nvme,
            placement: Placement::Packed {
                namespaces_per_controller: 32,
            },
            ..request
        };
        let sent = api::AttachRequest::from(&packed);
        assert_eq!(AttachRequest::try_from(sent).unwrap(), packed);
        let shared = AttachRequest {
            emulation: Emulation::VirtioFs,
            volume_mode: VolumeMode::Filesystem,
            access_modes: vec![AccessMode::Rwx],
            placement: Placement::Dedicated,
            ..packed
        };
        let sent = api::AttachRequest::from(&shared);
        assert_eq!(AttachRequest::try_from(sent).unwrap(), shared);

        for locator in [
            HostLocator::Nvme {
                bdf: "26:00.2".into(),
                nsid: 1,
                uuid: Some("6aaea650-8ef7-5653-a05a-0aea9d997ec8".into()),
                serial: Some("sc-0123456789abcdef0".into()),
            },
            HostLocator::Nvme {
                bdf: "26:00.2".into(),
                nsid: 1,
                uuid: None,
                serial: None,
            },
            HostLocator::VirtioBlk {
                bdf: "27:00.2".into(),
                serial: "sc-0123456789abcdef0".into(),
            },
            HostLocator::VirtioFs {
                tag: "sc-6aaea6508ef75653a05a0aea9d997ec8".into(),
            },
        ] {
            let attachment = Attachment {
                device_name: "dev".into(),
                locator,
            };
            let answered = api::AttachResponse::from(attachment.clone());
            assert_eq!(Attachment::try_from(answered).unwrap(), attachment);
        }
    }

    #[test]
    fn unreadable_messages_are_refused_with_the_reason() {
        let request = api::AttachRequest {
            volume_id: "pvc-1".into(),
            volume_mode: api::VolumeMode::Block as i32,
            ..Default::default()
        };
        let error = AttachRequest::try_from(request).unwrap_err();
        assert!(
            matches!(&error, DpuError::InvalidArgument(m) if m.contains("emulation 0")),
            "{error:?}"
        );
        let packed_without_room = api::AttachRequest {
            volume_id: "pvc-1".into(),
            volume_mode: api::VolumeMode::Block as i32,
            emulation: api::Emulation::Nvme as i32,
            placement: api::Placement::Packed as i32,
            ..Default::default()
        };
        let error = AttachRequest::try_from(packed_without_room).unwrap_err();
        assert!(
            matches!(&error, DpuError::InvalidArgument(m) if m.contains("namespaces_per_controller")),
            "{error:?}"
        );
        let error = Attachment::try_from(api::AttachResponse::default()).unwrap_err();
        assert!(matches!(error, DpuError::Internal(_)), "{error:?}");
    }

    #[test]
    fn an_inventory_crosses_the_link_unchanged() {
        let inventory = Inventory {
            functions: vec![
                FunctionUse {
                    emulation: Emulation::Nvme,
                    bdf: "26:00.2".into(),
                    controller: Some("NVMeCtrl1".into()),
                    volume_key: Some("nqn.2022-10.io.snap-csi:vol-x".into()),
                    pool: None,
                },
                FunctionUse {
                    emulation: Emulation::Nvme,
                    bdf: "26:00.3".into(),
                    controller: Some("NVMeCtrl2".into()),
                    volume_key: None,
                    pool: Some("nqn.2022-10.io.snap-csi:pool-0".into()),
                },
                FunctionUse {
                    emulation: Emulation::VirtioBlk,
                    bdf: "27:00.2".into(),
                    controller: None,
                    volume_key: None,
                    pool: None,
                },
            ],
            volumes: vec![ExposedVolume {
                key: "nqn.2022-10.io.snap-csi:vol-x".into(),
                emulation: Emulation::Nvme,
                device_names: vec!["dev".into()],
                bdf: None,
            }],
            pools: vec![PoolUse {
                nqn: "nqn.2022-10.io.snap-csi:pool-0".into(),
                namespaces: 3,
                capacity: 32,
                bdf: Some("26:00.3".into()),
            }],
        };
        let answered = api::GetInventoryResponse::from(inventory.clone());
        assert_eq!(Inventory::try_from(answered).unwrap(), inventory);
    }

    #[test]
    fn io_stats_cross_the_link_unchanged() {
        let stats = IoStats {
            tick_rate: 2_300_000_000,
            ticks: 12_345_678_901,
            bdevs: vec![BdevIostat {
                name: "aio-pvc-1".into(),
                bytes_read: 1,
                num_read_ops: 2,
                bytes_written: 3,
                num_write_ops: 4,
                bytes_unmapped: 5,
                num_unmap_ops: 6,
                read_latency_ticks: 7,
                write_latency_ticks: u64::MAX,
            }],
        };
        let answered = api::GetIoStatsResponse::from(stats.clone());
        assert_eq!(IoStats::from(answered), stats);
    }

    #[test]
    fn secrets_never_print() {
        let request = api::AttachRequest {
            secrets: [("key".to_string(), "hunter2".to_string())].into(),
            ..Default::default()
        };
        let printed = format!("{request:?}");
        assert!(!printed.contains("hunter2"), "{printed}");
        let ours = AttachRequest::try_from(api::AttachRequest {
            emulation: api::Emulation::Nvme as i32,
            volume_mode: api::VolumeMode::Block as i32,
            ..request
        })
        .unwrap();
        let printed = format!("{ours:?}");
        assert!(
            !printed.contains("hunter2") && printed.contains("1 redacted"),
            "{printed}"
        );
    }
}
