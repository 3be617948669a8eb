//! What a stage or a publish asks for: its capability as a [`Usage`] and
//! an access mode, checked against CSI's rules and limits.

use std::collections::HashMap;

use tonic::Status;

use super::format::FsType;
use super::mount::VIRTIOFS;
use super::records::StagedAs;
use crate::csi_limits::{MAX_MAP_BYTES, within_map_limit, within_string_limit};
use crate::dpu::Emulation;
use crate::proto::csi::v1 as csi;
use crate::proto::csi::v1::volume_capability::access_mode::Mode;
use crate::proto::csi::v1::volume_capability::{AccessType, MountVolume};

/// How a volume is used, from its capability.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Usage {
    Block,
    Filesystem {
        fs: FsType,
        flags: Vec<String>,
    },
    /// A filesystem device's tree (virtio-fs), mounted by tag.
    Shared {
        flags: Vec<String>,
    },
}

pub(super) fn require<'a>(value: &'a str, what: &str) -> Result<&'a str, Status> {
    if value.is_empty() {
        Err(Status::invalid_argument(format!("{what} is required")))
    } else {
        Ok(value)
    }
}

/// The contexts and secrets a stage or publish carries, within CSI's limit.
pub(super) fn maps_within_limits(
    volume_context: &HashMap<String, String>,
    publish_context: &HashMap<String, String>,
    secrets: &HashMap<String, String>,
) -> Result<(), Status> {
    within_map_limit(volume_context, "volume_context")?;
    within_map_limit(publish_context, "publish_context")?;
    within_map_limit(secrets, "secrets")
}

pub(super) fn access_mode(capability: &csi::VolumeCapability) -> Result<Mode, Status> {
    let mode = capability
        .access_mode
        .as_ref()
        .ok_or_else(|| Status::invalid_argument("volume_capability.access_mode is required"))?
        .mode;
    // prost reads a number it does not know as UNKNOWN; say which it was.
    match Mode::try_from(mode) {
        Ok(Mode::Unknown) => Err(Status::invalid_argument(
            "volume_capability.access_mode.mode is required",
        )),
        Ok(mode) => Ok(mode),
        Err(_) => Err(Status::invalid_argument(format!(
            "volume_capability.access_mode.mode {mode} is not an access mode of CSI v1.12"
        ))),
    }
}

pub(super) fn is_read_only_mode(mode: Mode) -> bool {
    matches!(mode, Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly)
}

/// Validates the capability for a volume of `emulation` and says how the
/// volume will be used.
pub(super) fn usage(
    capability: Option<&csi::VolumeCapability>,
    emulation: Emulation,
) -> Result<(csi::VolumeCapability, Usage), Status> {
    let capability = capability
        .ok_or_else(|| Status::invalid_argument("volume_capability is required"))?
        .clone();
    let mode = access_mode(&capability)?;
    if emulation.serves_files() {
        let usage = shared_usage(&capability, emulation)?;
        return Ok((capability, usage));
    }
    let usage = match &capability.access_type {
        Some(AccessType::Block(_)) => Usage::Block,
        Some(AccessType::Mount(MountVolume {
            fs_type,
            mount_flags,
            volume_mount_group,
        })) => {
            if !volume_mount_group.is_empty() {
                return Err(Status::invalid_argument(
                    "volume_mount_group is not supported (no VOLUME_MOUNT_GROUP capability)",
                ));
            }
            // A local filesystem on a device that several nodes write is corruption.
            if matches!(
                mode,
                Mode::MultiNodeMultiWriter | Mode::MultiNodeSingleWriter
            ) {
                return Err(Status::invalid_argument(format!(
                    "access mode {} needs a shared filesystem; ext4 and xfs volumes are single-node",
                    mode.as_str_name()
                )));
            }
            within_string_limit(fs_type, "fs_type")?;
            let flags_size: usize = mount_flags.iter().map(String::len).sum();
            if flags_size > MAX_MAP_BYTES {
                return Err(Status::invalid_argument(format!(
                    "mount_flags hold {flags_size} bytes; CSI limits them to {MAX_MAP_BYTES}"
                )));
            }
            let fs =
                FsType::from_csi(fs_type).map_err(|e| Status::invalid_argument(e.to_string()))?;
            Usage::Filesystem {
                fs,
                flags: mount_flags.clone(),
            }
        }
        None => {
            return Err(Status::invalid_argument(
                "volume_capability needs an access type (block or mount)",
            ));
        }
    };
    Ok((capability, usage))
}

/// A filesystem device's capability: a mount, fs_type `virtiofs` or empty,
/// any access mode (every host gets its own function on the same tree).
fn shared_usage(capability: &csi::VolumeCapability, emulation: Emulation) -> Result<Usage, Status> {
    let Some(AccessType::Mount(MountVolume {
        fs_type,
        mount_flags,
        volume_mount_group,
    })) = &capability.access_type
    else {
        return Err(Status::invalid_argument(format!(
            "a {} volume is a filesystem device: it needs a mount capability, not a block one",
            emulation.label()
        )));
    };
    if !volume_mount_group.is_empty() {
        return Err(Status::invalid_argument(
            "volume_mount_group is not supported (no VOLUME_MOUNT_GROUP capability)",
        ));
    }
    within_string_limit(fs_type, "fs_type")?;
    if !fs_type.is_empty() && fs_type != VIRTIOFS {
        return Err(Status::invalid_argument(format!(
            "fs_type {fs_type:?}: a {} volume is the DPU's filesystem, mounted as {VIRTIOFS}; \
             give {VIRTIOFS} or nothing",
            emulation.label()
        )));
    }
    let flags_size: usize = mount_flags.iter().map(String::len).sum();
    if flags_size > MAX_MAP_BYTES {
        return Err(Status::invalid_argument(format!(
            "mount_flags hold {flags_size} bytes; CSI limits them to {MAX_MAP_BYTES}"
        )));
    }
    Ok(Usage::Shared {
        flags: mount_flags.clone(),
    })
}

/// How a capability uses the volume, as a record keeps it.
pub(super) fn staged_as(usage: &Usage, mode: Mode) -> StagedAs {
    let (fs_type, mount_flags) = match usage {
        Usage::Block => (None, Vec::new()),
        Usage::Filesystem { fs, flags } => (Some(fs.as_str().to_string()), flags.clone()),
        Usage::Shared { flags } => (Some(VIRTIOFS.to_string()), flags.clone()),
    };
    StagedAs {
        fs_type,
        mount_flags,
        access_mode: mode.as_str_name().to_string(),
    }
}
