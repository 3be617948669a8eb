//! SPDK's filesystem devices (fsdevs), which SNAP serves to hosts as
//! virtio-fs. Shapes and errors from SPDK v24.09 (`python/spdk/rpc/fsdev.py`,
//! `module/fsdev/aio/fsdev_aio_rpc.c`, `lib/fsdev/fsdev.c`), held to a real
//! `spdk_tgt` by the sample plugin's real-SPDK suite.

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
    /// The fsdev an `fsdev_aio_create` of the `fsdev` subsystem's
    /// configuration makes: its name and root.
    pub fn aio_fsdev(&self) -> Option<(&str, &str)> {
        if self.method != "fsdev_aio_create" {
            return None;
        }
        Some((
            self.params.get("name")?.as_str()?,
            self.params.get("root_path")?.as_str()?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fsdev_subsystems_configuration_names_each_aio_fsdev() {
        // As real SPDK v24.09 answers framework_get_config {"name": "fsdev"}.
        let answer = serde_json::json!([
            {"method": "fsdev_set_opts",
             "params": {"fsdev_io_pool_size": 65535, "fsdev_io_cache_size": 256}},
            {"method": "fsdev_aio_create",
             "params": {"name": "f0", "root_path": "/share/f0", "enable_xattr": false,
                        "enable_writeback_cache": true, "max_write": 131072}}
        ]);
        let calls: Vec<ConfigCall> = serde_json::from_value(answer).unwrap();
        let fsdevs: Vec<_> = calls.iter().filter_map(ConfigCall::aio_fsdev).collect();
        assert_eq!(fsdevs, [("f0", "/share/f0")]);
    }
}
