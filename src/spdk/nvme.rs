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
