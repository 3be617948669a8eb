//! What a volume's `volume_context` says about where its bytes are, and
//! which kinds of device a plugin is configured to make.
//!
//! The CSI controller writes these keys when it creates the volume, so they
//! are fixed for the volume's life. Keys we do not know are ignored: the
//! context also carries other parties' settings (the node's emulation choice,
//! for one). The values are checked for shape only; SPDK has the last word on
//! whether a file or target is usable, and nothing is created before a
//! request passes these checks.

use std::collections::HashMap;
use std::path::PathBuf;

/// Chooses the backend: [`AIO`], [`NVMF`] or [`FS`].
pub const BACKEND_KEY: &str = "backend";
/// A file or block device on the DPU behind an SPDK AIO bdev.
pub const AIO: &str = "aio";
/// A remote NVMe-oF subsystem attached by SPDK's NVMe bdev module.
pub const NVMF: &str = "nvmf";
/// A directory tree in the DPU's share served by an SPDK aio fsdev, which
/// SNAP exposes to hosts as virtio-fs: a filesystem device.
pub const FS: &str = "fs";

/// AIO: the absolute path of the file or block device, as SNAP sees it.
/// FS: the absolute path of the volume's directory, inside the share.
pub const PATH_KEY: &str = "path";

/// NVMe-oF: the transport (`tcp`, `rdma`, `fc`).
pub const TRTYPE_KEY: &str = "trtype";
/// NVMe-oF: the target's address (an IP address for TCP and RDMA).
pub const TRADDR_KEY: &str = "traddr";
/// NVMe-oF: the target's service id (the port for TCP and RDMA).
pub const TRSVCID_KEY: &str = "trsvcid";
/// NVMe-oF: the address family (`ipv4`, `ipv6`, `ib`, `fc`).
pub const ADRFAM_KEY: &str = "adrfam";
/// NVMe-oF: the NQN of the volume's subsystem on the target.
pub const SUBNQN_KEY: &str = "subnqn";
/// NVMe-oF, optional: the host NQN SPDK connects as (the target may admit only it).
pub const HOSTNQN_KEY: &str = "hostnqn";
/// NVMe-oF, optional: more paths to the same subsystem beyond the first
/// (`traddr`, `trsvcid`), comma-separated, each `TRADDR:TRSVCID` (an IPv6
/// address in brackets, `[fd00::2]:4420`), sharing the first path's
/// `trtype`, `adrfam`, `subnqn` and `hostnqn`. With any, the device is one
/// multipath bdev over every path.
pub const EXTRA_PATHS_KEY: &str = "extra_paths";
/// The most paths a volume may have, the first included: each is an
/// `bdev_nvme_attach_controller` of its own.
pub const MAX_PATHS: usize = 8;

/// Every backend, as GetPluginInfo's manifest lists them.
pub const BACKENDS: [&str; 3] = [AIO, NVMF, FS];

/// SPDK's limits (`SPDK_NVMF_TRADDR_MAX_LEN`, `..._TRSVCID_MAX_LEN`, `..._NQN_MAX_LEN`).
const TRADDR_MAX: usize = 256;
const TRSVCID_MAX: usize = 32;
const NQN_MAX: usize = 223;
/// Linux's `PATH_MAX`, terminator excluded.
const PATH_MAX: usize = 4095;

/// Which kind of SPDK object a volume's device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Aio,
    Nvmf,
    Fs,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Aio, Kind::Nvmf, Kind::Fs];

    /// The value of [`BACKEND_KEY`] that selects this kind.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Aio => AIO,
            Kind::Nvmf => NVMF,
            Kind::Fs => FS,
        }
    }

    /// Whether its device is a block device (an SPDK bdev); else it is a
    /// filesystem device (an SPDK fsdev).
    pub fn is_block(self) -> bool {
        self != Kind::Fs
    }

    /// The plugin API's `volume_mode` of its devices.
    pub fn volume_mode(self) -> &'static str {
        if self.is_block() {
            VOLUME_MODE_BLOCK
        } else {
            VOLUME_MODE_FILESYSTEM
        }
    }
}

/// `volume_mode` of a block device (an SPDK bdev).
pub const VOLUME_MODE_BLOCK: &str = "Block";
/// `volume_mode` of a filesystem device (an SPDK fsdev).
pub const VOLUME_MODE_FILESYSTEM: &str = "Filesystem";

/// The kinds of device a plugin makes, and so advertises and accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Devices {
    /// Block devices: AIO and NVMe-oF bdevs.
    pub block: bool,
    /// Filesystem devices, when set: every volume's directory must lie
    /// inside this share (absolute, as SNAP sees it), so that a volume
    /// context cannot hand a host any other directory of the DPU.
    pub fs_share: Option<PathBuf>,
    /// Filesystem devices served by SNAP's NFS fsdev from this NFS server,
    /// whose export the share is (its path on the server), rather than by
    /// SPDK's aio fsdev over the share as the DPU mounts it.
    pub fs_nfs_server: Option<String>,
}

impl Default for Devices {
    /// Block devices only, as before filesystem devices existed.
    fn default() -> Devices {
        Devices {
            block: true,
            fs_share: None,
            fs_nfs_server: None,
        }
    }
}

impl Devices {
    /// The backends these devices come from, in [`Kind::ALL`]'s order.
    pub fn kinds(&self) -> Vec<Kind> {
        Kind::ALL.into_iter().filter(|k| self.serves(*k)).collect()
    }

    pub fn serves(&self, kind: Kind) -> bool {
        if kind.is_block() {
            self.block
        } else {
            self.fs_share.is_some()
        }
    }
}

/// A volume's storage, from its context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    Aio { path: String },
    Nvmf(NvmfTarget),
    Fs { root: String },
}

/// Where a volume's NVMe-oF subsystem is, as `bdev_nvme_attach_controller` takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmfTarget {
    pub trtype: String,
    pub traddr: String,
    pub trsvcid: String,
    pub adrfam: String,
    pub subnqn: String,
    pub hostnqn: Option<String>,
    /// The paths beyond the first ([`EXTRA_PATHS_KEY`]); none: one path.
    pub extra_paths: Vec<NvmfPath>,
}

/// One network path to a subsystem: where a listener of it is reached.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NvmfPath {
    pub traddr: String,
    pub trsvcid: String,
}

impl std::fmt::Display for NvmfPath {
    /// `TRADDR:TRSVCID`, an address with a colon in brackets: as
    /// [`EXTRA_PATHS_KEY`] lists it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.traddr.contains(':') {
            write!(f, "[{}]:{}", self.traddr, self.trsvcid)
        } else {
            write!(f, "{}:{}", self.traddr, self.trsvcid)
        }
    }
}

impl Backend {
    /// The backend a volume context describes, or what is wrong with it.
    pub fn from_context(context: &HashMap<String, String>) -> Result<Backend, String> {
        let backend = context.get(BACKEND_KEY).map(String::as_str).unwrap_or("");
        match backend {
            AIO => {
                let path = required(context, AIO, PATH_KEY)?;
                check_path(path)?;
                Ok(Backend::Aio {
                    path: path.to_string(),
                })
            }
            NVMF => Ok(Backend::Nvmf(NvmfTarget::from_context(context)?)),
            FS => {
                let root = required(context, FS, PATH_KEY)?;
                check_path(root)?;
                Ok(Backend::Fs {
                    root: root.to_string(),
                })
            }
            "" => Err(format!(
                "volume_context[{BACKEND_KEY:?}] is required: one of {}",
                BACKENDS.join(", ")
            )),
            other => Err(format!(
                "volume_context[{BACKEND_KEY:?}] is {other:?}; this plugin knows {}",
                BACKENDS.join(", ")
            )),
        }
    }

    pub fn kind(&self) -> Kind {
        match self {
            Backend::Aio { .. } => Kind::Aio,
            Backend::Nvmf(_) => Kind::Nvmf,
            Backend::Fs { .. } => Kind::Fs,
        }
    }
}

impl NvmfTarget {
    fn from_context(context: &HashMap<String, String>) -> Result<NvmfTarget, String> {
        let get = |key| required(context, NVMF, key);
        let trtype = get(TRTYPE_KEY)?;
        one_of(TRTYPE_KEY, trtype, &["tcp", "rdma", "fc"])?;
        let adrfam = get(ADRFAM_KEY)?;
        one_of(ADRFAM_KEY, adrfam, &["ipv4", "ipv6", "ib", "fc"])?;
        let traddr = get(TRADDR_KEY)?;
        token(TRADDR_KEY, traddr, TRADDR_MAX)?;
        let trsvcid = get(TRSVCID_KEY)?;
        token(TRSVCID_KEY, trsvcid, TRSVCID_MAX)?;
        let subnqn = get(SUBNQN_KEY)?;
        nqn(SUBNQN_KEY, subnqn)?;
        let hostnqn = match context.get(HOSTNQN_KEY).filter(|v| !v.is_empty()) {
            Some(v) => {
                nqn(HOSTNQN_KEY, v)?;
                Some(v.clone())
            }
            None => None,
        };
        let first = NvmfPath {
            traddr: traddr.to_string(),
            trsvcid: trsvcid.to_string(),
        };
        let extra_paths = match context.get(EXTRA_PATHS_KEY).filter(|v| !v.is_empty()) {
            Some(list) => extra_paths(list, &first)?,
            None => vec![],
        };
        Ok(NvmfTarget {
            trtype: trtype.to_string(),
            traddr: first.traddr,
            trsvcid: first.trsvcid,
            adrfam: adrfam.to_string(),
            subnqn: subnqn.to_string(),
            hostnqn,
            extra_paths,
        })
    }

    /// Every path, the first ([`TRADDR_KEY`], [`TRSVCID_KEY`]) first.
    pub fn paths(&self) -> Vec<NvmfPath> {
        let first = NvmfPath {
            traddr: self.traddr.clone(),
            trsvcid: self.trsvcid.clone(),
        };
        std::iter::once(first)
            .chain(self.extra_paths.iter().cloned())
            .collect()
    }

    /// Whether the device is a multipath bdev (more than one path).
    pub fn is_multipath(&self) -> bool {
        !self.extra_paths.is_empty()
    }
}

/// The paths [`EXTRA_PATHS_KEY`] lists, each checked as the first path's
/// address is; none repeated, the first path not among them, at most
/// [`MAX_PATHS`] in all.
fn extra_paths(list: &str, first: &NvmfPath) -> Result<Vec<NvmfPath>, String> {
    let mut paths: Vec<NvmfPath> = Vec::new();
    for item in list.split(',') {
        if paths.len() + 1 >= MAX_PATHS {
            return Err(format!(
                "volume_context[{EXTRA_PATHS_KEY:?}] lists more than {} paths (at most \
                 {MAX_PATHS} with the first)",
                MAX_PATHS - 1
            ));
        }
        let path = parse_path(item).ok_or_else(|| {
            format!(
                "volume_context[{EXTRA_PATHS_KEY:?}] must be comma-separated TRADDR:TRSVCID \
                 items (an IPv6 address in brackets), got {item:?}"
            )
        })?;
        token(EXTRA_PATHS_KEY, &path.traddr, TRADDR_MAX)?;
        token(EXTRA_PATHS_KEY, &path.trsvcid, TRSVCID_MAX)?;
        if path == *first || paths.contains(&path) {
            return Err(format!(
                "volume_context[{EXTRA_PATHS_KEY:?}] repeats the path {path} (the first path is \
                 {first}): each path is a distinct listener"
            ));
        }
        paths.push(path);
    }
    Ok(paths)
}

/// `TRADDR:TRSVCID`, split at the last colon; brackets around the address
/// are dropped. Both parts must be there.
fn parse_path(item: &str) -> Option<NvmfPath> {
    let (traddr, trsvcid) = item.rsplit_once(':')?;
    let traddr = match traddr.strip_prefix('[') {
        Some(inner) => inner.strip_suffix(']')?,
        None => traddr,
    };
    if traddr.is_empty() || trsvcid.is_empty() || traddr.contains(['[', ']']) {
        return None;
    }
    Some(NvmfPath {
        traddr: traddr.to_string(),
        trsvcid: trsvcid.to_string(),
    })
}

fn required<'a>(
    context: &'a HashMap<String, String>,
    backend: &str,
    key: &str,
) -> Result<&'a str, String> {
    match context.get(key).map(String::as_str) {
        Some(value) if !value.is_empty() => Ok(value),
        _ => Err(format!(
            "volume_context[{key:?}] is required for backend {backend:?}"
        )),
    }
}

/// SNAP resolves a relative path against its own working directory, which
/// nobody who wrote the context can know: only absolute, plain paths.
fn check_path(path: &str) -> Result<(), String> {
    let plain = path.starts_with('/')
        && path.len() <= PATH_MAX
        && !path.contains('\0')
        && path.split('/').all(|c| c != "." && c != "..");
    if plain {
        Ok(())
    } else {
        Err(format!(
            "volume_context[{PATH_KEY:?}] must be an absolute path without \".\" or \"..\" \
             components, got {path:?}"
        ))
    }
}

fn one_of(key: &str, value: &str, allowed: &[&str]) -> Result<(), String> {
    if allowed.iter().any(|a| a.eq_ignore_ascii_case(value)) {
        Ok(())
    } else {
        Err(format!(
            "volume_context[{key:?}] is {value:?}; expected one of {}",
            allowed.join(", ")
        ))
    }
}

/// A value SPDK copies into a fixed-size field: printable, no blanks.
fn token(key: &str, value: &str, max: usize) -> Result<(), String> {
    if value.len() <= max && value.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(format!(
            "volume_context[{key:?}] must be at most {max} printable ASCII characters without \
             blanks, got {value:?}"
        ))
    }
}

fn nqn(key: &str, value: &str) -> Result<(), String> {
    token(key, value, NQN_MAX)?;
    if value.starts_with("nqn.") {
        Ok(())
    } else {
        Err(format!(
            "volume_context[{key:?}] must be an NVMe qualified name (nqn.<yyyy-mm>.<domain>...), \
             got {value:?}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn nvmf_context() -> HashMap<String, String> {
        context(&[
            (BACKEND_KEY, NVMF),
            (TRTYPE_KEY, "tcp"),
            (TRADDR_KEY, "127.0.0.1"),
            (TRSVCID_KEY, "4420"),
            (ADRFAM_KEY, "ipv4"),
            (SUBNQN_KEY, "nqn.2024-01.io.example:pvc-1"),
        ])
    }

    #[test]
    fn fs_needs_an_absolute_plain_directory_path() {
        let ok = context(&[(BACKEND_KEY, FS), (PATH_KEY, "/share/pvc-1")]);
        let backend = Backend::from_context(&ok).unwrap();
        assert_eq!(
            backend,
            Backend::Fs {
                root: "/share/pvc-1".into()
            }
        );
        assert_eq!(backend.kind().volume_mode(), VOLUME_MODE_FILESYSTEM);
        for bad in ["", "pvc-1", "/share/../etc", "/share/./x"] {
            let error =
                Backend::from_context(&context(&[(BACKEND_KEY, FS), (PATH_KEY, bad)])).unwrap_err();
            assert!(error.contains("path"), "{bad:?}: {error}");
        }
    }

    #[test]
    fn devices_serve_the_kinds_configured() {
        assert_eq!(Devices::default().kinds(), [Kind::Aio, Kind::Nvmf]);
        let fs_only = Devices {
            block: false,
            fs_share: Some("/share".into()),
            fs_nfs_server: None,
        };
        assert_eq!(fs_only.kinds(), [Kind::Fs]);
        let both = Devices {
            block: true,
            ..fs_only
        };
        assert_eq!(both.kinds(), Kind::ALL);
    }

    #[test]
    fn aio_needs_an_absolute_plain_path() {
        let ok = context(&[(BACKEND_KEY, AIO), (PATH_KEY, "/var/lib/pool/vol.img")]);
        assert_eq!(
            Backend::from_context(&ok).unwrap(),
            Backend::Aio {
                path: "/var/lib/pool/vol.img".into()
            }
        );
        for bad in ["", "vol.img", "/pool/../etc/shadow", "/pool/./x", "/a\0b"] {
            let error = Backend::from_context(&context(&[(BACKEND_KEY, AIO), (PATH_KEY, bad)]))
                .unwrap_err();
            assert!(error.contains("path"), "{bad:?}: {error}");
        }
    }

    #[test]
    fn nvmf_needs_every_address_part() {
        let target = match Backend::from_context(&nvmf_context()).unwrap() {
            Backend::Nvmf(t) => t,
            other => panic!("{other:?}"),
        };
        assert_eq!(target.trsvcid, "4420");
        assert_eq!(target.hostnqn, None);
        for key in [TRTYPE_KEY, TRADDR_KEY, TRSVCID_KEY, ADRFAM_KEY, SUBNQN_KEY] {
            let mut c = nvmf_context();
            c.remove(key);
            let error = Backend::from_context(&c).unwrap_err();
            assert!(error.contains(key) && error.contains("required"), "{error}");
        }
        for (key, bad) in [
            (TRTYPE_KEY, "carrier-pigeon"),
            (ADRFAM_KEY, "ipx"),
            (TRADDR_KEY, "127.0.0.1 ; rm"),
            (SUBNQN_KEY, "pvc-1"),
            (HOSTNQN_KEY, "host 1"),
        ] {
            let mut c = nvmf_context();
            c.insert(key.into(), bad.into());
            let error = Backend::from_context(&c).unwrap_err();
            assert!(error.contains(key), "{key}: {error}");
        }
        let mut c = nvmf_context();
        c.insert(
            HOSTNQN_KEY.into(),
            "nqn.2014-08.org.nvmexpress:uuid:1".into(),
        );
        c.insert("snap-csi.io/emulation".into(), "nvme".into());
        assert!(matches!(
            Backend::from_context(&c).unwrap(),
            Backend::Nvmf(NvmfTarget {
                hostnqn: Some(_),
                ..
            })
        ));
    }

    fn nvmf_target(c: &HashMap<String, String>) -> Result<NvmfTarget, String> {
        match Backend::from_context(c)? {
            Backend::Nvmf(t) => Ok(t),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn extra_paths_are_listed_after_the_first_and_checked_like_it() {
        let one = nvmf_target(&nvmf_context()).unwrap();
        assert!(!one.is_multipath());
        assert_eq!(one.paths().len(), 1);
        let mut c = nvmf_context();
        c.insert(EXTRA_PATHS_KEY.into(), String::new());
        assert!(!nvmf_target(&c).unwrap().is_multipath(), "empty: one path");

        c.insert(
            EXTRA_PATHS_KEY.into(),
            "127.0.0.1:4421,[fd00::2]:4420,fd00::3:4420".into(),
        );
        let target = nvmf_target(&c).unwrap();
        assert!(target.is_multipath());
        let paths: Vec<String> = target.paths().iter().map(ToString::to_string).collect();
        assert_eq!(
            paths,
            [
                "127.0.0.1:4420",
                "127.0.0.1:4421",
                "[fd00::2]:4420",
                "[fd00::3]:4420"
            ]
        );
        assert_eq!(target.paths()[2].traddr, "fd00::2");

        let too_many = (1..MAX_PATHS as u16 + 1)
            .map(|n| format!("127.0.0.1:{}", 5000 + n))
            .collect::<Vec<_>>()
            .join(",");
        for (bad, says) in [
            ("127.0.0.1", "TRADDR:TRSVCID"),
            ("127.0.0.1:", "TRADDR:TRSVCID"),
            (":4421", "TRADDR:TRSVCID"),
            ("127.0.0.1:4421,", "TRADDR:TRSVCID"),
            ("[fd00::2:4420", "TRADDR:TRSVCID"),
            ("[[x]]:1", "TRADDR:TRSVCID"),
            ("127.0.0.1:4421 ", "printable"),
            ("10.0.0.1 :4421", "printable"),
            ("127.0.0.1:4420", "repeats"),
            ("127.0.0.1:4421,127.0.0.1:4421", "repeats"),
            (&too_many, "more than"),
        ] {
            c.insert(EXTRA_PATHS_KEY.into(), bad.to_string());
            let error = nvmf_target(&c).unwrap_err();
            assert!(
                error.contains(EXTRA_PATHS_KEY) && error.contains(says),
                "{bad:?}: {error}"
            );
        }
        let at_most: String = (1..MAX_PATHS as u16)
            .map(|n| format!("127.0.0.1:{}", 5000 + n))
            .collect::<Vec<_>>()
            .join(",");
        c.insert(EXTRA_PATHS_KEY.into(), at_most);
        assert_eq!(nvmf_target(&c).unwrap().paths().len(), MAX_PATHS);
    }

    #[test]
    fn unknown_or_missing_backends_are_named_in_the_error() {
        let error = Backend::from_context(&context(&[])).unwrap_err();
        assert!(
            error.contains("backend") && error.contains("required"),
            "{error}"
        );
        let error = Backend::from_context(&context(&[(BACKEND_KEY, "ceph")])).unwrap_err();
        assert!(
            error.contains("\"ceph\"") && error.contains("aio, nvmf"),
            "{error}"
        );
    }
}
