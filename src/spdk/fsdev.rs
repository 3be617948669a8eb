//! SPDK's filesystem devices (fsdevs), which SNAP serves to hosts as
//! virtio-fs. Shapes and errors from SPDK v24.09 (`python/spdk/rpc/fsdev.py`,
//! `module/fsdev/aio/fsdev_aio_rpc.c`, `lib/fsdev/fsdev.c`), held to a real
//! `spdk_tgt` by the sample plugin's real-SPDK suite; and DOCA SNAP's NFS
//! fsdev, which SPDK v24.09 lacks, as NVIDIA's DPF storage plugin calls it
//! (`docs/virtio-fs.md`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::method;

/// `fsdev_aio_create`: an fsdev serving the directory tree at `root_path`;
/// returns its name. Every failure is -32603 with `strerror`'s words: "File
/// exists" when the name is taken, "No such file or directory" when the root
/// is missing. SPDK accepts any root it can open, a regular file too.
#[derive(Debug, Clone, Serialize)]
pub struct FsdevAioCreate {
    pub name: String,
    pub root_path: String,
}
method!(FsdevAioCreate => "fsdev_aio_create", String);

/// `fsdev_aio_delete`: `-ENODEV` ("No such device") if absent.
#[derive(Debug, Clone, Serialize)]
pub struct FsdevAioDelete {
    pub name: String,
}
method!(FsdevAioDelete => "fsdev_aio_delete", bool);

/// DOCA SNAP's `fsdev_nfs_create`: an fsdev serving the NFS export
/// `server:exportname` through SNAP's own user-space NFS client (no kernel
/// mount on the DPU). Parameters as DPF's storage plugin sends them.
#[derive(Debug, Clone, Serialize)]
pub struct FsdevNfsCreate {
    pub name: String,
    pub server: String,
    pub exportname: String,
}
method!(FsdevNfsCreate => "fsdev_nfs_create", String);

/// DOCA SNAP's `fsdev_nfs_delete`.
#[derive(Debug, Clone, Serialize)]
pub struct FsdevNfsDelete {
    pub name: String,
}
method!(FsdevNfsDelete => "fsdev_nfs_delete", bool);

/// `framework_get_config` of one subsystem: the calls that would make what
/// it holds now. SPDK v24.09 has no `fsdev_get_fsdevs`; for subsystem
/// `fsdev` this is its only listing (one `fsdev_aio_create` per aio fsdev).
#[derive(Debug, Clone, Serialize)]
pub struct FrameworkGetConfig {
    pub name: String,
}
method!(FrameworkGetConfig => "framework_get_config", Vec<ConfigCall>);

/// One call of a subsystem's configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ConfigCall {
    pub method: String,
    #[serde(default)]
    pub params: Value,
}

impl ConfigCall {
    /// The fsdev a call of the `fsdev` subsystem's configuration makes: its
    /// name and what it serves (an aio fsdev's root, an NFS fsdev's export).
    pub fn fsdev(&self) -> Option<(&str, &str)> {
        let serves = match self.method.as_str() {
            "fsdev_aio_create" => "root_path",
            "fsdev_nfs_create" => "exportname",
            _ => return None,
        };
        Some((
            self.params.get("name")?.as_str()?,
            self.params.get(serves)?.as_str()?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fsdev_subsystems_configuration_names_each_fsdev() {
        // As real SPDK v24.09 answers framework_get_config {"name": "fsdev"}.
        let answer = serde_json::json!([
            {"method": "fsdev_set_opts",
             "params": {"fsdev_io_pool_size": 65535, "fsdev_io_cache_size": 256}},
            {"method": "fsdev_aio_create",
             "params": {"name": "f0", "root_path": "/share/f0", "enable_xattr": false,
                        "enable_writeback_cache": true, "max_write": 131072}},
            {"method": "fsdev_nfs_create",
             "params": {"name": "f1", "server": "10.0.0.5", "exportname": "/export/f1"}}
        ]);
        let calls: Vec<ConfigCall> = serde_json::from_value(answer).unwrap();
        let fsdevs: Vec<_> = calls.iter().filter_map(ConfigCall::fsdev).collect();
        assert_eq!(fsdevs, [("f0", "/share/f0"), ("f1", "/export/f1")]);
    }
}
