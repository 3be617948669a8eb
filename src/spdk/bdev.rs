//! Block devices: listing, statistics, and the AIO, malloc and null backends.

use serde::{Deserialize, Serialize};

use super::method;

/// `bdev_get_bdevs`: one bdev by name or alias (`-ENODEV` if absent), or all.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BdevGetBdevs {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Milliseconds to wait for the bdev to appear.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u32>,
}
method!(BdevGetBdevs => "bdev_get_bdevs", Vec<Bdev>);

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Bdev {
    pub name: String,
    #[serde(default)]
    pub aliases: Vec<String>,
    pub product_name: String,
    pub block_size: u32,
    pub num_blocks: u64,
    #[serde(default)]
    pub uuid: Option<String>,
    #[serde(default)]
    pub claimed: bool,
    #[serde(default)]
    pub claim_type: Option<String>,
    #[serde(default)]
    pub driver_specific: DriverSpecific,
}

/// The parts of a bdev's `driver_specific` object we read; other modules'
/// keys are ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct DriverSpecific {
    /// Present for lvol bdevs.
    #[serde(default)]
    pub lvol: Option<super::lvol::LvolDetails>,
    /// Present for crypto vbdevs.
    #[serde(default)]
    pub crypto: Option<CryptoDetails>,
    /// Present for AIO bdevs.
    #[serde(default)]
    pub aio: Option<AioDetails>,
}

/// A crypto vbdev's `driver_specific.crypto`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct CryptoDetails {
    pub base_bdev_name: String,
    pub key_name: String,
}

/// An AIO bdev's `driver_specific.aio` (the parts we read).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct AioDetails {
    /// The file or block device, as given to `bdev_aio_create`.
    pub filename: String,
}

impl Bdev {
    /// The size SPDK reports, refused when it does not fit in 64 bits: a
    /// wrapped product would pass for a small disk.
    pub fn size_bytes(&self) -> Result<u64, SizeOverflow> {
        self.num_blocks
            .checked_mul(u64::from(self.block_size))
            .ok_or_else(|| SizeOverflow {
                name: self.name.clone(),
                num_blocks: self.num_blocks,
                block_size: self.block_size,
            })
    }
}

/// A bdev whose blocks add up to more than 2^64 bytes: SPDK never answers
/// that, so the peer is broken or not SPDK.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bdev {name} reports {num_blocks} blocks of {block_size} bytes: more than 2^64 bytes")]
pub struct SizeOverflow {
    pub name: String,
    pub num_blocks: u64,
    pub block_size: u32,
}

/// `bdev_get_iostat`: I/O counters of one bdev or all.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BdevGetIostat {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}
method!(BdevGetIostat => "bdev_get_iostat", Iostat);

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Iostat {
    pub tick_rate: u64,
    pub ticks: u64,
    pub bdevs: Vec<BdevIostat>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BdevIostat {
    pub name: String,
    pub bytes_read: u64,
    pub num_read_ops: u64,
    pub bytes_written: u64,
    pub num_write_ops: u64,
    #[serde(default)]
    pub bytes_unmapped: u64,
    #[serde(default)]
    pub num_unmap_ops: u64,
    #[serde(default)]
    pub read_latency_ticks: u64,
    #[serde(default)]
    pub write_latency_ticks: u64,
}

/// `bdev_aio_create`: a bdev over a file or block device; returns its name.
/// `-EEXIST` if the name is taken, `-ENOENT` if the file is missing.
#[derive(Debug, Clone, Serialize)]
pub struct BdevAioCreate {
    pub name: String,
    pub filename: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readonly: Option<bool>,
}
method!(BdevAioCreate => "bdev_aio_create", String);

/// `bdev_aio_delete`: `-ENODEV` if absent.
#[derive(Debug, Clone, Serialize)]
pub struct BdevAioDelete {
    pub name: String,
}
method!(BdevAioDelete => "bdev_aio_delete", bool);

/// `bdev_aio_rescan`: re-reads the file's size after it grew.
#[derive(Debug, Clone, Serialize)]
pub struct BdevAioRescan {
    pub name: String,
}
method!(BdevAioRescan => "bdev_aio_rescan", bool);

/// `bdev_set_qos_limit`: rate limits of a bdev (by name or alias), applied
/// to its I/O from the reply on. A limit left `None` is kept as it is; 0
/// removes one. IOPS are rounded up to a multiple of 1000 and MiB/s capped
/// at 2^64 / 2^20 by SPDK, which only logs it. `-ENODEV` if the bdev is
/// absent, `-EINVAL` when no limit is given, -32602 "Failed to configure
/// rate limit: ..." when applying fails (`EAGAIN`: another change of this
/// bdev's limits is in progress).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BdevSetQosLimit {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rw_ios_per_sec: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rw_mbytes_per_sec: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub r_mbytes_per_sec: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub w_mbytes_per_sec: Option<u64>,
}
method!(BdevSetQosLimit => "bdev_set_qos_limit", bool);

/// `bdev_malloc_create`: a RAM bdev; returns its name.
#[derive(Debug, Clone, Serialize)]
pub struct BdevMallocCreate {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub num_blocks: u64,
    pub block_size: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}
method!(BdevMallocCreate => "bdev_malloc_create", String);

/// `bdev_malloc_delete`: `-ENODEV` if absent.
#[derive(Debug, Clone, Serialize)]
pub struct BdevMallocDelete {
    pub name: String,
}
method!(BdevMallocDelete => "bdev_malloc_delete", bool);

/// `bdev_null_create`: a bdev that discards writes; returns its name.
#[derive(Debug, Clone, Serialize)]
pub struct BdevNullCreate {
    pub name: String,
    pub num_blocks: u64,
    pub block_size: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}
method!(BdevNullCreate => "bdev_null_create", String);

/// `bdev_null_delete`: `-ENODEV` if absent.
#[derive(Debug, Clone, Serialize)]
pub struct BdevNullDelete {
    pub name: String,
}
method!(BdevNullDelete => "bdev_null_delete", bool);

#[cfg(test)]
mod tests {
    use super::*;

    fn bdev(num_blocks: u64, block_size: u32) -> Bdev {
        serde_json::from_value(serde_json::json!({
            "name": "Nvme0n1",
            "product_name": "NVMe disk",
            "num_blocks": num_blocks,
            "block_size": block_size,
        }))
        .unwrap()
    }

    #[test]
    fn a_size_past_u64_bytes_is_refused_not_wrapped() {
        assert_eq!(bdev(2048, 512).size_bytes(), Ok(1 << 20));
        assert_eq!(bdev(u64::MAX, 1).size_bytes(), Ok(u64::MAX));
        // 2^55 blocks of 512 bytes wraps to exactly 0.
        let error = bdev(1 << 55, 512).size_bytes().unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "bdev Nvme0n1 reports {} blocks of 512 bytes: more than 2^64 bytes",
                1u64 << 55
            )
        );
        assert!(bdev(u64::MAX, 4096).size_bytes().is_err());
    }

    #[test]
    fn qos_limits_not_given_stay_off_the_wire() {
        let set = BdevSetQosLimit {
            name: "lvs0/vol".into(),
            rw_ios_per_sec: Some(0),
            w_mbytes_per_sec: Some(20),
            ..Default::default()
        };
        // SPDK keeps a limit the request does not name, and reads 0 as "off".
        assert_eq!(
            serde_json::to_string(&set).unwrap(),
            r#"{"name":"lvs0/vol","rw_ios_per_sec":0,"w_mbytes_per_sec":20}"#
        );
    }
}
