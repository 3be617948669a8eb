//! The NVMe bdev module: attaching remote NVMe-oF controllers as bdevs.

use serde::{Deserialize, Serialize};

use super::method;

/// `bdev_nvme_attach_controller`: returns the bdev names (`<name>n1`, ...).
/// A repeat answers -114; nothing listening -19; unknown subsystem -5.
#[derive(Debug, Clone, Serialize)]
pub struct BdevNvmeAttachController {
    pub name: String,
    pub trtype: String,
    pub traddr: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adrfam: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trsvcid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subnqn: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostnqn: Option<String>,
    /// How long a lost controller is reconnected before SPDK deletes it
    /// (-1: for ever; SPDK's default 0: it is not reconnected).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ctrlr_loss_timeout_sec: Option<i32>,
    /// The pause between reconnect attempts; I/O waits meanwhile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reconnect_delay_sec: Option<u32>,
}
method!(BdevNvmeAttachController => "bdev_nvme_attach_controller", Vec<String>);

/// `bdev_nvme_detach_controller`: a repeat answers -19.
#[derive(Debug, Clone, Serialize)]
pub struct BdevNvmeDetachController {
    pub name: String,
}
method!(BdevNvmeDetachController => "bdev_nvme_detach_controller", bool);

/// `bdev_nvme_get_controllers`: one by name (an unknown name answers a
/// positive 22) or all.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BdevNvmeGetControllers {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}
method!(BdevNvmeGetControllers => "bdev_nvme_get_controllers", Vec<NvmeBdevController>);

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NvmeBdevController {
    pub name: String,
    pub ctrlrs: Vec<NvmeBdevPath>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NvmeBdevPath {
    pub state: String,
    pub trid: TransportId,
    #[serde(default)]
    pub cntlid: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TransportId {
    pub trtype: String,
    #[serde(default)]
    pub adrfam: Option<String>,
    pub traddr: String,
    #[serde(default)]
    pub trsvcid: Option<String>,
    #[serde(default)]
    pub subnqn: Option<String>,
}

/// `bdev_nvme_attach_controller` of one path of a multipath controller:
/// every path of a volume under the same name, each with
/// `multipath: "multipath"` (SPDK's default, "failover", keeps one path
/// connected at a time). Paths may be sent together: the first to connect
/// makes the controller and its bdev, the others join it. A repeat of the
/// controller's first path answers -114, of any other path -17; nothing
/// listening -19.
#[derive(Debug, Clone, Serialize)]
pub struct BdevNvmeAttachPath {
    #[serde(flatten)]
    pub controller: BdevNvmeAttachController,
    pub multipath: &'static str,
}
method!(BdevNvmeAttachPath => "bdev_nvme_attach_controller", Vec<String>);

/// [`BdevNvmeAttachPath::multipath`]: every path connected, one bdev over them.
pub const MULTIPATH: &str = "multipath";

/// `bdev_nvme_set_multipath_policy` of an NVMe bdev: `policy` is
/// `active_passive` (one current path, the next on its loss) or
/// `active_active` (with a `selector`, `round_robin` or `queue_depth`). An
/// unknown bdev answers -19.
#[derive(Debug, Clone, Serialize)]
pub struct BdevNvmeSetMultipathPolicy {
    pub name: String,
    pub policy: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rr_min_io: Option<u32>,
}
method!(BdevNvmeSetMultipathPolicy => "bdev_nvme_set_multipath_policy", bool);

/// `bdev_nvme_get_io_paths`: the I/O paths of every NVMe bdev (or of `name`)
/// as each SPDK thread's I/O channel has them. A bdev nobody holds open has
/// no channel, so no paths here: `bdev_nvme_get_controllers` lists the
/// paths themselves.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BdevNvmeGetIoPaths {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}
method!(BdevNvmeGetIoPaths => "bdev_nvme_get_io_paths", NvmeIoPaths);

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct NvmeIoPaths {
    #[serde(default)]
    pub poll_groups: Vec<NvmePollGroupPaths>,
}

/// One SPDK thread's channels.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NvmePollGroupPaths {
    #[serde(default)]
    pub thread: String,
    #[serde(default)]
    pub io_paths: Vec<NvmeIoPath>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NvmeIoPath {
    pub bdev_name: String,
    #[serde(default)]
    pub cntlid: u16,
    /// The path this thread sends I/O through now (active-passive: one).
    #[serde(default)]
    pub current: bool,
    /// Its queue pair is connected.
    #[serde(default)]
    pub connected: bool,
    /// Its namespace is accessible (ANA optimized or non-optimized).
    #[serde(default)]
    pub accessible: bool,
    pub transport: IoPathTransport,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct IoPathTransport {
    pub trtype: String,
    pub traddr: String,
    #[serde(default)]
    pub trsvcid: Option<String>,
    #[serde(default)]
    pub adrfam: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_the_controllers_params_and_the_mode() {
        let path = BdevNvmeAttachPath {
            controller: BdevNvmeAttachController {
                name: "c".into(),
                trtype: "tcp".into(),
                traddr: "10.0.0.2".into(),
                adrfam: Some("ipv4".into()),
                trsvcid: Some("4421".into()),
                subnqn: Some("nqn.2024-01.io.x:v".into()),
                hostnqn: None,
                ctrlr_loss_timeout_sec: Some(600),
                reconnect_delay_sec: Some(1),
            },
            multipath: MULTIPATH,
        };
        assert_eq!(
            serde_json::to_value(&path).unwrap(),
            serde_json::json!({
                "name": "c", "trtype": "tcp", "traddr": "10.0.0.2", "adrfam": "ipv4",
                "trsvcid": "4421", "subnqn": "nqn.2024-01.io.x:v",
                "ctrlr_loss_timeout_sec": 600, "reconnect_delay_sec": 1,
                "multipath": "multipath"
            })
        );
    }

    #[test]
    fn io_paths_decode_as_spdk_v24_09_writes_them() {
        let reply = serde_json::json!({"poll_groups": [{"thread": "nvmf_tgt_poll_group_000",
            "io_paths": [{"bdev_name": "cn1", "cntlid": 1, "current": true, "connected": true,
                "accessible": true, "transport": {"trtype": "TCP", "traddr": "127.0.0.1",
                "trsvcid": "4420", "adrfam": "IPv4"}}]}]});
        let paths: NvmeIoPaths = serde_json::from_value(reply).unwrap();
        let path = &paths.poll_groups[0].io_paths[0];
        assert!(path.current && path.connected);
        assert_eq!(path.transport.trsvcid.as_deref(), Some("4420"));
        let none: NvmeIoPaths = serde_json::from_value(serde_json::json!({})).unwrap();
        assert!(none.poll_groups.is_empty());
    }
}
