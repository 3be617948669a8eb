//! A volume's QoS limits: the four keys a StorageClass's `parameters` (then
//! the volume context) and a VolumeAttributesClass's `mutable_parameters`
//! carry, checked with SPDK's rules before anything is changed, and their
//! mapping 1:1 onto SPDK's `bdev_set_qos_limit`.
//!
//! | key | `bdev_set_qos_limit` | unit |
//! |---|---|---|
//! | `snap-csi.io/qos-rw-iops` | `rw_ios_per_sec` | I/Os per second, a multiple of 1000 |
//! | `snap-csi.io/qos-rw-mbytes-per-sec` | `rw_mbytes_per_sec` | MiB/s |
//! | `snap-csi.io/qos-r-mbytes-per-sec` | `r_mbytes_per_sec` | MiB/s |
//! | `snap-csi.io/qos-w-mbytes-per-sec` | `w_mbytes_per_sec` | MiB/s |
//!
//! Values are decimal digits only; 0 is "unlimited", SPDK's meaning. SPDK
//! itself rounds an IOPS limit up to a multiple of 1000
//! (`SPDK_BDEV_QOS_MIN_IOS_PER_SEC`) and caps MiB/s at 2^64 / 2^20
//! (`SPDK_BDEV_QOS_MAX_MBYTES_PER_SEC`), logging it only on the DPU: here
//! both are refused instead, so a volume never gets a limit other than the
//! one asked for. A key not given is left as it is (CSI: "SPs MUST NOT
//! modify volumes based on the absence of keys"), which is also what SPDK
//! does with a limit its request leaves out.
//!
//! Where the limits live and when they take effect is the backends'
//! business: the NVMe-oF backend sets them on the target's lvol at once
//! ([`crate::csi::nvmf`]); the AIO backend keeps them in a [`record_dir`]
//! record beside the volume's file, which the plugin's CreateDevice applies
//! to the bdev it makes ([`crate::service`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use snap_csi::json_dir::JsonDir;
use snap_csi::spdk::bdev::BdevSetQosLimit;
use tonic::Status;

pub const RW_IOPS_KEY: &str = "snap-csi.io/qos-rw-iops";
pub const RW_MBYTES_KEY: &str = "snap-csi.io/qos-rw-mbytes-per-sec";
pub const R_MBYTES_KEY: &str = "snap-csi.io/qos-r-mbytes-per-sec";
pub const W_MBYTES_KEY: &str = "snap-csi.io/qos-w-mbytes-per-sec";
/// Every QoS key, in the order of `bdev_set_qos_limit`'s params.
pub const KEYS: [&str; 4] = [RW_IOPS_KEY, RW_MBYTES_KEY, R_MBYTES_KEY, W_MBYTES_KEY];

/// `SPDK_BDEV_QOS_MIN_IOS_PER_SEC`: IOPS limits are multiples of this.
pub const MIN_IOS_PER_SEC: u64 = 1000;
/// `SPDK_BDEV_QOS_MAX_MBYTES_PER_SEC`: SPDK caps larger MiB/s limits.
pub const MAX_MBYTES_PER_SEC: u64 = u64::MAX / (1024 * 1024);

/// The AIO backend's QoS records: this directory beside a volume's file,
/// one [`snap_csi::json_dir::JsonDir`] record per volume id.
const RECORD_DIR: &str = "qos";

/// Limits by key; `None`: not given (left as it is), `Some(0)`: unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rw_ios_per_sec: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rw_mbytes_per_sec: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r_mbytes_per_sec: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub w_mbytes_per_sec: Option<u64>,
}

pub fn is_qos_key(key: &str) -> bool {
    KEYS.contains(&key)
}

/// The value of QoS key `key`, or why it is refused (naming the key).
pub fn parse_value(key: &str, value: &str) -> Result<u64, String> {
    let refused = |why: &str| format!("parameter {key:?} is {value:?}: {why}");
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(refused(
            "expected a whole number of digits only (0 for unlimited)",
        ));
    }
    let number: u64 = value
        .parse()
        .map_err(|_| refused("more than a 64-bit limit can hold"))?;
    if key == RW_IOPS_KEY {
        if !number.is_multiple_of(MIN_IOS_PER_SEC) {
            return Err(refused(&format!(
                "SPDK limits IOPS in steps of {MIN_IOS_PER_SEC} (SPDK_BDEV_QOS_MIN_IOS_PER_SEC): \
                 give 0 (unlimited) or a multiple of {MIN_IOS_PER_SEC}"
            )));
        }
    } else if number > MAX_MBYTES_PER_SEC {
        return Err(refused(&format!(
            "SPDK limits bandwidth to at most {MAX_MBYTES_PER_SEC} MiB/s"
        )));
    }
    Ok(number)
}

impl QosLimits {
    /// The QoS keys of `map`, checked; other keys are left to the caller.
    pub fn from_map(map: &HashMap<String, String>) -> Result<QosLimits, String> {
        let mut limits = QosLimits::default();
        // Sorted, so that a map with several bad values names the same one
        // every time.
        let mut keys: Vec<&String> = map.keys().filter(|k| is_qos_key(k)).collect();
        keys.sort();
        for key in keys {
            *limits.slot(key) = Some(parse_value(key, &map[key])?);
        }
        Ok(limits)
    }

    /// Mutable parameters: QoS keys only (any other is refused, named).
    pub fn from_mutable(map: &HashMap<String, String>) -> Result<QosLimits, String> {
        let mut unknown: Vec<&String> = map.keys().filter(|k| !is_qos_key(k)).collect();
        unknown.sort();
        if let Some(key) = unknown.first() {
            return Err(format!(
                "unknown mutable parameter {key:?}; volumes take {}",
                KEYS.join(", ")
            ));
        }
        QosLimits::from_map(map)
    }

    fn slot(&mut self, key: &str) -> &mut Option<u64> {
        match key {
            RW_IOPS_KEY => &mut self.rw_ios_per_sec,
            RW_MBYTES_KEY => &mut self.rw_mbytes_per_sec,
            R_MBYTES_KEY => &mut self.r_mbytes_per_sec,
            _ => &mut self.w_mbytes_per_sec,
        }
    }

    fn values(&self) -> [Option<u64>; 4] {
        [
            self.rw_ios_per_sec,
            self.rw_mbytes_per_sec,
            self.r_mbytes_per_sec,
            self.w_mbytes_per_sec,
        ]
    }

    /// Whether no limit is given.
    pub fn is_empty(&self) -> bool {
        self.values().iter().all(Option::is_none)
    }

    /// These limits with those `over` gives replacing them.
    pub fn overlaid(self, over: QosLimits) -> QosLimits {
        QosLimits {
            rw_ios_per_sec: over.rw_ios_per_sec.or(self.rw_ios_per_sec),
            rw_mbytes_per_sec: over.rw_mbytes_per_sec.or(self.rw_mbytes_per_sec),
            r_mbytes_per_sec: over.r_mbytes_per_sec.or(self.r_mbytes_per_sec),
            w_mbytes_per_sec: over.w_mbytes_per_sec.or(self.w_mbytes_per_sec),
        }
    }

    /// The limits given, as volume context entries (canonical decimal).
    pub fn context(&self) -> impl Iterator<Item = (String, String)> {
        KEYS.into_iter()
            .zip(self.values())
            .filter_map(|(key, value)| Some((key.to_string(), value?.to_string())))
    }

    /// The SPDK request setting these limits on bdev `name`.
    pub fn request(&self, name: &str) -> BdevSetQosLimit {
        BdevSetQosLimit {
            name: name.to_string(),
            rw_ios_per_sec: self.rw_ios_per_sec,
            rw_mbytes_per_sec: self.rw_mbytes_per_sec,
            r_mbytes_per_sec: self.r_mbytes_per_sec,
            w_mbytes_per_sec: self.w_mbytes_per_sec,
        }
    }
}

/// Where the AIO backend keeps the QoS record of the volume whose file is
/// `path`: `<directory of the file>/qos`, keyed by volume id. The
/// controller writes it (it made the file there); the plugin, beside SNAP,
/// reads it through the same path SNAP opens the file by.
pub fn record_dir(path: &Path) -> Option<PathBuf> {
    path.parent().map(records_in)
}

/// The QoS records of the volume files in directory `dir`.
pub fn records_in(dir: &Path) -> PathBuf {
    dir.join(RECORD_DIR)
}

/// The limits in a volume context (CreateVolume's), refused as the
/// controller would refuse them.
pub fn context_limits(
    volume_id: &str,
    context: &HashMap<String, String>,
) -> Result<QosLimits, Status> {
    QosLimits::from_map(context)
        .map_err(|e| Status::invalid_argument(format!("volume {volume_id}: {e}")))
}

/// The limits the plugin sets on the AIO bdev of `volume_id` over `path`:
/// `given` (the context's) overlaid with the AIO backend's record when the
/// plugin sees it (ModifyVolume's changes). A record directory the plugin
/// cannot see (SNAP's filesystem not shared with it, or a file the
/// controller did not make) leaves `given`.
pub fn with_record(given: QosLimits, volume_id: &str, path: &str) -> Result<QosLimits, Status> {
    let Some(dir) = record_dir(Path::new(path)) else {
        return Ok(given);
    };
    let recorded = recorded(&dir, volume_id).map_err(|e| {
        Status::internal(format!(
            "reading the QoS record of volume {volume_id} in {}: {e}",
            dir.display()
        ))
    })?;
    Ok(recorded.map_or(given, |r| given.overlaid(r)))
}

/// The record of `volume_id` in record directory `dir`; none when the
/// directory is not there (it is never created here).
pub fn recorded(dir: &Path, volume_id: &str) -> std::io::Result<Option<QosLimits>> {
    if !dir.is_dir() {
        return Ok(None);
    }
    // The controller's directory: its temp files are its writes in flight.
    JsonDir::of_another(dir).load(volume_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_four_keys_map_onto_bdev_set_qos_limit() {
        let limits = QosLimits::from_map(&map(&[
            (RW_IOPS_KEY, "20000"),
            (RW_MBYTES_KEY, "0"),
            (R_MBYTES_KEY, "100"),
            (W_MBYTES_KEY, "007"),
            ("backend", "aio"),
        ]))
        .unwrap();
        assert_eq!(
            limits.request("b"),
            BdevSetQosLimit {
                name: "b".into(),
                rw_ios_per_sec: Some(20000),
                rw_mbytes_per_sec: Some(0),
                r_mbytes_per_sec: Some(100),
                w_mbytes_per_sec: Some(7),
            }
        );
        // Canonical in the volume context: "007" is 7 to SPDK, and says so.
        let context: HashMap<String, String> = limits.context().collect();
        assert_eq!(context.len(), 4);
        assert_eq!(context[W_MBYTES_KEY], "7");
        assert!(
            QosLimits::from_map(&map(&[("backend", "aio")]))
                .unwrap()
                .is_empty()
        );
        let edges = QosLimits::from_map(&map(&[
            (RW_IOPS_KEY, &(u64::MAX / 1000 * 1000).to_string()),
            (RW_MBYTES_KEY, &MAX_MBYTES_PER_SEC.to_string()),
            (R_MBYTES_KEY, "1"),
        ]))
        .unwrap();
        assert_eq!(edges.rw_mbytes_per_sec, Some(MAX_MBYTES_PER_SEC));
        assert_eq!(edges.w_mbytes_per_sec, None);
    }

    #[test]
    fn every_refusal_names_its_key() {
        let over_u64 = "18446744073709551616";
        let over_spdk = (MAX_MBYTES_PER_SEC + 1).to_string();
        let cases: Vec<(&str, &str, &str)> = vec![
            (RW_IOPS_KEY, "-1000", "digits only"),
            (RW_IOPS_KEY, "+1000", "digits only"),
            (RW_IOPS_KEY, "1000.0", "digits only"),
            (RW_IOPS_KEY, "1e3", "digits only"),
            (RW_IOPS_KEY, "", "digits only"),
            (RW_IOPS_KEY, " 1000", "digits only"),
            (RW_IOPS_KEY, "fast", "digits only"),
            (RW_IOPS_KEY, "1", "multiple of 1000"),
            (RW_IOPS_KEY, "999", "multiple of 1000"),
            (RW_IOPS_KEY, "1500", "multiple of 1000"),
            (RW_IOPS_KEY, over_u64, "64-bit"),
            (RW_MBYTES_KEY, "-5", "digits only"),
            (RW_MBYTES_KEY, "1.5", "digits only"),
            (R_MBYTES_KEY, "0x10", "digits only"),
            (W_MBYTES_KEY, "100M", "digits only"),
            (W_MBYTES_KEY, over_u64, "64-bit"),
            (R_MBYTES_KEY, &over_spdk, "at most"),
        ];
        for (key, value, why) in cases {
            let error = QosLimits::from_map(&map(&[(key, value)])).unwrap_err();
            assert!(
                error.contains(&format!("{key:?}")) && error.contains(why),
                "{key}={value:?}: {error}"
            );
            assert!(QosLimits::from_mutable(&map(&[(key, value)])).is_err());
        }
    }

    #[test]
    fn mutable_parameters_are_qos_keys_only() {
        let error = QosLimits::from_mutable(&map(&[
            (RW_IOPS_KEY, "1000"),
            ("XXX_FakeKey", "XXX_FakeValue"),
        ]))
        .unwrap_err();
        assert!(error.contains("\"XXX_FakeKey\""), "{error}");
        assert!(
            error.contains(RW_IOPS_KEY),
            "the error lists the keys: {error}"
        );
        let limits = QosLimits::from_mutable(&map(&[(W_MBYTES_KEY, "50")])).unwrap();
        assert_eq!(limits.w_mbytes_per_sec, Some(50));
        assert!(QosLimits::from_mutable(&HashMap::new()).unwrap().is_empty());
    }

    #[test]
    fn overlaying_keeps_what_the_newer_limits_leave_out() {
        let old = QosLimits {
            rw_ios_per_sec: Some(1000),
            w_mbytes_per_sec: Some(10),
            ..Default::default()
        };
        let new = QosLimits {
            rw_ios_per_sec: Some(0),
            r_mbytes_per_sec: Some(5),
            ..Default::default()
        };
        assert_eq!(
            old.overlaid(new),
            QosLimits {
                rw_ios_per_sec: Some(0),
                rw_mbytes_per_sec: None,
                r_mbytes_per_sec: Some(5),
                w_mbytes_per_sec: Some(10),
            }
        );
    }

    #[test]
    fn the_record_beside_the_file_overlays_the_context() {
        let pool = tempfile::tempdir().unwrap();
        let file = pool.path().join("aio-v.img").display().to_string();
        let given = QosLimits {
            rw_ios_per_sec: Some(2000),
            w_mbytes_per_sec: Some(10),
            ..Default::default()
        };
        // No record directory: the context's, and none is made.
        assert_eq!(with_record(given, "aio-v", &file).unwrap(), given);
        assert!(!records_in(pool.path()).exists());
        let records = JsonDir::open(records_in(pool.path())).unwrap();
        assert_eq!(with_record(given, "aio-v", &file).unwrap(), given);
        let modified = QosLimits {
            rw_ios_per_sec: Some(0),
            ..Default::default()
        };
        records.store("aio-v", &modified).unwrap();
        // The controller's next write, in flight while the plugin reads: the
        // read leaves it to be renamed into place.
        let in_flight = records.dir().join("61696f2d76.tmp");
        std::fs::write(&in_flight, b"{").unwrap();
        assert_eq!(
            with_record(given, "aio-v", &file).unwrap(),
            given.overlaid(modified)
        );
        assert!(in_flight.exists(), "a read removed the controller's write");
        let context = HashMap::from([(RW_IOPS_KEY.to_string(), "7".to_string())]);
        let status = context_limits("aio-v", &context).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains(RW_IOPS_KEY), "{status:?}");
    }

    #[test]
    fn records_live_beside_the_volume_files() {
        assert_eq!(
            record_dir(Path::new("/pool/aio-pvc-1.img")),
            Some(PathBuf::from("/pool/qos"))
        );
    }
}
