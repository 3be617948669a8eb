//! What a CreateVolume (or GetCapacity, or ValidateVolumeCapabilities) may
//! ask for: parameters and volume capabilities.
//!
//! Parameters: `backend` (`aio`, `nvmf` or `fs`) chooses the storage;
//! `nvmf-multipath` (`true` or `false`) asks for every path to an NVMe-oF
//! volume in its context (each of the target's listeners: the plugin
//! attaches them all as one multipath device), and is refused for any other
//! backend or a controller whose target has one listener;
//! `snap-csi.io/emulation` (`nvme`, `virtio-blk` or `virtio-fs`) and
//! `snap-csi.io/placement` (`dedicated` or `packed`) and
//! `snap-csi.io/encryption` (`aes-xts` or `none`), all read by the node,
//! and the CO's own `csi.storage.k8s.io/*` metadata are copied into the
//! volume context; the QoS keys ([`crate::qos`]) are checked and set on the
//! volume (and copied into the context in canonical form). Any other key is
//! INVALID_ARGUMENT: a typo must not silently give a volume other than the
//! one asked for.
//!
//! A filesystem volume (backend `fs`, or emulation `virtio-fs` without a
//! backend) is a tree the DPU serves as virtio-fs: the block-only options
//! (placement, encryption other than `none`, QoS, a block emulation) are
//! INVALID_ARGUMENT naming the option, and `virtio-fs` on a block backend is
//! too.
//!
//! Capabilities of a block volume: block, or a mount with a filesystem the
//! node can make (ext4, xfs, or empty for ext4); single-node access modes
//! only. Every block volume is one SPDK bdev on one DPU at a time: an AIO
//! file lives on one DPU's filesystem, and although an NVMe-oF subsystem
//! admits any host, the node attaches it through SNAP as a plain NVMe disk
//! with no reservations or shared-disk coordination, so MULTI_NODE_* modes
//! are refused rather than promised. A filesystem volume: a mount whose
//! fs_type is `virtiofs` or empty, in every access mode (each host that
//! mounts it gets its own function serving the same tree).

use std::collections::HashMap;

use snap_csi::dpu::crypto::{AES_XTS_VALUE, ENCRYPTION};
use snap_csi::node::format::FsType;
use snap_csi::node::mount::VIRTIOFS;
use snap_csi::node::service::{EMULATION_KEY, PLACEMENT_KEY};
use snap_csi::proto::csi::v1 as csi;

use super::fs::VIRTIO_FS;
use crate::backend::Kind;
use crate::qos::{self, QosLimits};
use csi::volume_capability::AccessType;
use csi::volume_capability::access_mode::Mode;

/// The parameter choosing the backend.
pub const BACKEND_PARAM: &str = "backend";
/// The parameter asking for every path to an NVMe-oF volume.
pub const MULTIPATH_PARAM: &str = "nvmf-multipath";
/// The CO's metadata keys (`--extra-create-metadata`), passed through.
const CO_PREFIX: &str = "csi.storage.k8s.io/";
const EMULATIONS: [&str; 3] = ["nvme", "virtio-blk", VIRTIO_FS];
const PLACEMENTS: [&str; 2] = ["dedicated", "packed"];
const ENCRYPTIONS: [&str; 2] = [AES_XTS_VALUE, "none"];

/// Refuses every parameter but the CO's metadata: snapshots, volume groups
/// and group snapshots take none of their own.
pub fn only_co_metadata(
    what: &str,
    parameters: &HashMap<String, String>,
) -> Result<(), tonic::Status> {
    match parameters.keys().find(|k| !k.starts_with(CO_PREFIX)) {
        Some(key) => Err(tonic::Status::invalid_argument(format!(
            "unknown {what} parameter {key:?}; {what}s take none but the CO's {CO_PREFIX}* keys"
        ))),
        None => Ok(()),
    }
}

/// Parsed CreateVolume parameters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Params {
    /// The backend asked for, if any.
    pub backend: Option<Kind>,
    /// What goes into the volume context as given.
    pub passed: HashMap<String, String>,
    /// The QoS limits given.
    pub qos: QosLimits,
    /// Every path to the volume, not one ([`MULTIPATH_PARAM`]).
    pub multipath: bool,
}

impl Params {
    pub fn parse(parameters: &HashMap<String, String>) -> Result<Params, String> {
        let mut params = Params::default();
        for (key, value) in parameters {
            let choices: Option<&[&str]> = match key.as_str() {
                EMULATION_KEY => Some(&EMULATIONS),
                PLACEMENT_KEY => Some(&PLACEMENTS),
                ENCRYPTION => Some(&ENCRYPTIONS),
                _ => None,
            };
            if key == BACKEND_PARAM {
                params.backend = Some(parse_backend(value)?);
            } else if key == MULTIPATH_PARAM {
                params.multipath = match value.as_str() {
                    "true" => true,
                    "false" => false,
                    _ => {
                        return Err(format!(
                            "parameter {MULTIPATH_PARAM:?} is {value:?}; expected \"true\" or \
                             \"false\""
                        ));
                    }
                };
            } else if qos::is_qos_key(key) {
                // Checked below, all together.
            } else if let Some(choices) = choices {
                if !choices.contains(&value.as_str()) {
                    return Err(format!(
                        "parameter {key:?} is {value:?}; expected one of {}",
                        choices.join(", ")
                    ));
                }
                params.passed.insert(key.clone(), value.clone());
            } else if key.starts_with(CO_PREFIX) {
                params.passed.insert(key.clone(), value.clone());
            } else {
                return Err(format!(
                    "unknown parameter {key:?}; this driver takes {BACKEND_PARAM:?}, \
                     {MULTIPATH_PARAM:?}, {EMULATION_KEY:?}, {PLACEMENT_KEY:?}, {ENCRYPTION:?}, \
                     {} and the CO's {CO_PREFIX}* keys",
                    qos::KEYS.join(", ")
                ));
            }
        }
        params.qos = QosLimits::from_map(parameters)?;
        Ok(params)
    }

    /// The backend of the volume: the one asked for, else the source's,
    /// else the filesystem backend for a virtio-fs emulation, else
    /// `default`; then whether the other options fit it.
    pub fn kind(&self, source: Option<Kind>, default: Kind) -> Result<Kind, String> {
        let emulation = self.passed.get(EMULATION_KEY).map(String::as_str);
        let kind = self
            .backend
            .or(source)
            .or((emulation == Some(VIRTIO_FS)).then_some(Kind::Fs))
            .unwrap_or(default);
        self.check_for(kind)?;
        Ok(kind)
    }

    /// Why these options cannot go with a `kind` volume, if they cannot.
    pub fn check_for(&self, kind: Kind) -> Result<(), String> {
        let emulation = self.passed.get(EMULATION_KEY).map(String::as_str);
        if self.multipath && kind != Kind::Nvmf {
            return Err(format!(
                "parameter {MULTIPATH_PARAM:?} is for NVMe-oF volumes (backend \"nvmf\"), not \
                 backend {:?}: a local volume has one path",
                kind.as_str()
            ));
        }
        if kind.is_block() {
            if emulation == Some(VIRTIO_FS) {
                return Err(format!(
                    "parameter {EMULATION_KEY:?} is {VIRTIO_FS:?}, which serves filesystem \
                     volumes: backend {:?} makes block volumes (use backend \"fs\")",
                    kind.as_str()
                ));
            }
            return Ok(());
        }
        let block_only = [
            emulation.filter(|e| *e != VIRTIO_FS).map(|_| EMULATION_KEY),
            self.passed.get(PLACEMENT_KEY).map(|_| PLACEMENT_KEY),
            self.passed
                .get(ENCRYPTION)
                .filter(|e| *e != "none")
                .map(|_| ENCRYPTION),
            (!self.qos.is_empty()).then_some("QoS limits (snap-csi.io/qos-*)"),
        ];
        match block_only.into_iter().flatten().next() {
            Some(option) => Err(format!(
                "{option} is for block volumes: a filesystem volume (backend \"fs\", served \
                 as virtio-fs) takes none"
            )),
            None => Ok(()),
        }
    }
}

pub fn parse_backend(value: &str) -> Result<Kind, String> {
    Kind::ALL
        .into_iter()
        .find(|k| k.as_str() == value)
        .ok_or_else(|| {
            format!("parameter {BACKEND_PARAM:?} is {value:?}; expected one of aio, nvmf, fs")
        })
}

/// Why these capabilities cannot all be served by a `kind` volume, if they
/// cannot.
pub fn check_capabilities(
    kind: Kind,
    capabilities: &[csi::VolumeCapability],
) -> Result<(), String> {
    if capabilities.is_empty() {
        return Err("volume_capabilities is required".into());
    }
    capabilities
        .iter()
        .try_for_each(|c| check_capability(kind, c))
}

fn check_capability(kind: Kind, capability: &csi::VolumeCapability) -> Result<(), String> {
    match &capability.access_type {
        Some(AccessType::Block(_)) if !kind.is_block() => {
            return Err(
                "a filesystem volume (backend \"fs\") is mounted, not used as a block device"
                    .into(),
            );
        }
        Some(AccessType::Block(_)) => {}
        Some(AccessType::Mount(mount)) if !kind.is_block() => {
            if !["", VIRTIOFS].contains(&mount.fs_type.as_str()) {
                return Err(format!(
                    "fs_type {:?}: a filesystem volume (backend \"fs\") is mounted as \
                     {VIRTIOFS:?} (or an empty fs_type)",
                    mount.fs_type
                ));
            }
        }
        Some(AccessType::Mount(mount)) => {
            FsType::from_csi(&mount.fs_type).map_err(|e| e.to_string())?;
        }
        None => return Err("volume_capability.access_type (block or mount) is required".into()),
    }
    let mode = capability
        .access_mode
        .as_ref()
        .map(|m| m.mode())
        .unwrap_or(Mode::Unknown);
    match mode {
        Mode::Unknown => Err("volume_capability.access_mode is required".into()),
        _ if !kind.is_block() => Ok(()),
        Mode::SingleNodeWriter
        | Mode::SingleNodeReaderOnly
        | Mode::SingleNodeSingleWriter
        | Mode::SingleNodeMultiWriter => Ok(()),
        other => Err(format!(
            "access mode {} is not supported on a block volume: it is attached to one node's \
             DPU at a time (filesystem volumes, backend \"fs\", take every mode)",
            other.as_str_name()
        )),
    }
}

/// Whether a capability uses the volume as a raw block device (then the node
/// has no filesystem to grow after an expansion).
pub fn is_block(capability: Option<&csi::VolumeCapability>) -> bool {
    matches!(
        capability.and_then(|c| c.access_type.as_ref()),
        Some(AccessType::Block(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> Result<Params, String> {
        Params::parse(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    pub fn capability(access: AccessType, mode: Mode) -> csi::VolumeCapability {
        csi::VolumeCapability {
            access_type: Some(access),
            access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
        }
    }

    fn mount(fs: &str) -> AccessType {
        AccessType::Mount(csi::volume_capability::MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        })
    }

    #[test]
    fn parameters_choose_the_backend_and_pass_metadata_through() {
        assert_eq!(params(&[]).unwrap(), Params::default());
        let p = params(&[
            ("backend", "nvmf"),
            (EMULATION_KEY, "virtio-blk"),
            (PLACEMENT_KEY, "packed"),
            (ENCRYPTION, "aes-xts"),
            ("csi.storage.k8s.io/pvc/name", "data"),
        ])
        .unwrap();
        assert_eq!(p.backend, Some(Kind::Nvmf));
        assert_eq!(p.passed.len(), 4);
        assert!(
            params(&[(ENCRYPTION, "aes-cbc")])
                .unwrap_err()
                .contains("aes-xts, none")
        );
        let p = params(&[(qos::RW_IOPS_KEY, "3000"), (qos::W_MBYTES_KEY, "0")]).unwrap();
        assert_eq!(p.qos.rw_ios_per_sec, Some(3000));
        assert_eq!(p.qos.w_mbytes_per_sec, Some(0));
        assert!(p.passed.is_empty());
        assert!(
            params(&[(qos::R_MBYTES_KEY, "ten")])
                .unwrap_err()
                .contains(qos::R_MBYTES_KEY)
        );
        assert!(
            params(&[("backend", "ceph")])
                .unwrap_err()
                .contains("\"ceph\"")
        );
        assert!(
            params(&[("bakend", "aio")])
                .unwrap_err()
                .contains("\"bakend\"")
        );
        assert!(params(&[(EMULATION_KEY, "scsi")]).is_err());
        let p = params(&[("backend", "nvmf"), (MULTIPATH_PARAM, "true")]).unwrap();
        assert!(p.multipath && p.passed.is_empty());
        assert_eq!(p.kind(None, Kind::Aio), Ok(Kind::Nvmf));
        assert!(!params(&[(MULTIPATH_PARAM, "false")]).unwrap().multipath);
        for bad in ["yes", "True", "1", ""] {
            let error = params(&[(MULTIPATH_PARAM, bad)]).unwrap_err();
            assert!(
                error.contains(MULTIPATH_PARAM) && error.contains("\"true\" or \"false\""),
                "{bad:?}: {error}"
            );
        }
        for backend in ["aio", "fs"] {
            let error = params(&[("backend", backend), (MULTIPATH_PARAM, "true")])
                .unwrap()
                .kind(None, Kind::Aio)
                .unwrap_err();
            assert!(error.contains("NVMe-oF volumes"), "{backend}: {error}");
        }
        // Without a backend: the default's, refused when it is not nvmf.
        let p = params(&[(MULTIPATH_PARAM, "true")]).unwrap();
        assert_eq!(p.kind(None, Kind::Nvmf), Ok(Kind::Nvmf));
        assert!(p.kind(None, Kind::Aio).is_err());
        assert!(
            params(&[(PLACEMENT_KEY, "sparse")])
                .unwrap_err()
                .contains("dedicated, packed")
        );
    }

    #[test]
    fn single_node_block_and_known_filesystems_only() {
        let block = || AccessType::Block(Default::default());
        for ok in [
            capability(block(), Mode::SingleNodeWriter),
            capability(mount(""), Mode::SingleNodeReaderOnly),
            capability(mount("xfs"), Mode::SingleNodeMultiWriter),
            capability(mount("ext4"), Mode::SingleNodeSingleWriter),
        ] {
            check_capabilities(Kind::Aio, &[ok]).unwrap();
        }
        assert!(
            check_capabilities(Kind::Nvmf, &[])
                .unwrap_err()
                .contains("required")
        );
        let multi = capability(block(), Mode::MultiNodeMultiWriter);
        assert!(
            check_capabilities(
                Kind::Aio,
                &[capability(block(), Mode::SingleNodeWriter), multi]
            )
            .unwrap_err()
            .contains("MULTI_NODE_MULTI_WRITER")
        );
        assert!(
            check_capabilities(
                Kind::Aio,
                &[capability(mount("btrfs"), Mode::SingleNodeWriter)]
            )
            .is_err()
        );
        let no_access = csi::VolumeCapability {
            access_type: None,
            access_mode: None,
        };
        assert!(check_capabilities(Kind::Aio, &[no_access]).is_err());
        assert!(check_capabilities(Kind::Aio, &[capability(block(), Mode::Unknown)]).is_err());
        assert!(is_block(Some(&capability(block(), Mode::SingleNodeWriter))));
        assert!(!is_block(Some(&capability(
            mount(""),
            Mode::SingleNodeWriter
        ))));
        assert!(!is_block(None));
    }

    #[test]
    fn filesystem_volumes_take_virtiofs_mounts_in_every_mode_and_no_block_option() {
        for mode in [
            Mode::SingleNodeWriter,
            Mode::MultiNodeMultiWriter,
            Mode::MultiNodeReaderOnly,
            Mode::MultiNodeSingleWriter,
        ] {
            for fs in ["", "virtiofs"] {
                check_capabilities(Kind::Fs, &[capability(mount(fs), mode)]).unwrap();
            }
        }
        let block = AccessType::Block(Default::default());
        let refused = [
            capability(block, Mode::SingleNodeWriter),
            capability(mount("ext4"), Mode::SingleNodeWriter),
            capability(mount(""), Mode::Unknown),
        ];
        for capability in refused {
            assert!(check_capabilities(Kind::Fs, &[capability]).is_err());
        }

        let fs = Kind::Fs;
        assert_eq!(
            params(&[(EMULATION_KEY, VIRTIO_FS)])
                .unwrap()
                .kind(None, Kind::Aio),
            Ok(fs)
        );
        assert_eq!(
            params(&[("backend", "fs")]).unwrap().kind(None, Kind::Aio),
            Ok(fs)
        );
        assert_eq!(params(&[]).unwrap().kind(Some(fs), Kind::Aio), Ok(fs));
        let with_none = params(&[("backend", "fs"), (ENCRYPTION, "none")]).unwrap();
        assert_eq!(with_none.kind(None, Kind::Aio), Ok(fs));
        for (key, value, named) in [
            (PLACEMENT_KEY, "packed", PLACEMENT_KEY),
            (ENCRYPTION, "aes-xts", ENCRYPTION),
            (EMULATION_KEY, "nvme", EMULATION_KEY),
            (qos::RW_IOPS_KEY, "1000", "QoS"),
        ] {
            let error = params(&[("backend", "fs"), (key, value)])
                .unwrap()
                .kind(None, Kind::Aio)
                .unwrap_err();
            assert!(error.contains(named), "{key}: {error}");
        }
        let error = params(&[("backend", "aio"), (EMULATION_KEY, VIRTIO_FS)])
            .unwrap()
            .kind(None, Kind::Aio)
            .unwrap_err();
        assert!(
            error.contains("virtio-fs") && error.contains("\"aio\""),
            "{error}"
        );
    }
}
