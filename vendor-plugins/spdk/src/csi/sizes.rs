//! Capacity ranges: what a request asks, the size we make, and whether a
//! pool has room for it.
//!
//! A volume is a whole number of allocation units (1 MiB for AIO files, the
//! lvstore's cluster for lvols, which SPDK would round up to anyway), at
//! least `required_bytes` and the size of the volume's source, at most
//! `limit_bytes`. Without a range a volume gets 1 GiB, or its source's size.

use snap_csi::proto::csi::v1 as csi;
use snap_csi::spdk::bdev::Bdev;
use tonic::Status;

pub const MIB: u64 = 1 << 20;
/// A volume's size when the request gives none and has no source.
pub const DEFAULT_SIZE: u64 = 1 << 30;

/// A checked `CapacityRange`: 0 and `None` mean "not given".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Wanted {
    pub required: u64,
    pub limit: Option<u64>,
}

impl Wanted {
    pub fn from_range(range: Option<&csi::CapacityRange>) -> Result<Wanted, Status> {
        let Some(range) = range else {
            return Ok(Wanted::default());
        };
        let non_negative = |field: &str, v: i64| {
            u64::try_from(v).map_err(|_| {
                Status::invalid_argument(format!("capacity_range.{field} is negative ({v})"))
            })
        };
        let required = non_negative("required_bytes", range.required_bytes)?;
        let limit = non_negative("limit_bytes", range.limit_bytes)?;
        let limit = (limit > 0).then_some(limit);
        if let Some(limit) = limit
            && required > limit
        {
            return Err(Status::invalid_argument(format!(
                "capacity_range.limit_bytes ({limit}) is less than required_bytes ({required})"
            )));
        }
        Ok(Wanted { required, limit })
    }

    /// Whether a volume of `size` bytes satisfies the range.
    pub fn admits(&self, size: u64) -> bool {
        size >= self.required && self.limit.is_none_or(|l| size <= l)
    }

    /// The size to make: a multiple of `unit`, at least `floor` (a source's
    /// size), within the range.
    pub fn choose(&self, unit: u64, floor: u64) -> Result<u64, Status> {
        if let Some(limit) = self.limit
            && floor > limit
        {
            return Err(Status::out_of_range(format!(
                "the source holds {floor} bytes, more than capacity_range.limit_bytes ({limit})"
            )));
        }
        let base = if self.required > 0 {
            self.required
        } else if floor > 0 {
            floor
        } else {
            self.limit.map_or(DEFAULT_SIZE, |l| l.min(DEFAULT_SIZE))
        };
        let want = base.max(floor).max(1);
        let size = round_up(want, unit)
            .ok_or_else(|| Status::out_of_range(format!("{want} bytes is beyond any volume")))?;
        match self.limit {
            Some(limit) if size > limit => {
                let down = limit / unit * unit;
                if down >= want {
                    Ok(down)
                } else {
                    Err(Status::out_of_range(format!(
                        "volumes here are whole multiples of {unit} bytes and none lies \
                         between {want} and capacity_range.limit_bytes ({limit})"
                    )))
                }
            }
            _ => Ok(size),
        }
    }
}

pub fn round_up(bytes: u64, unit: u64) -> Option<u64> {
    bytes.div_ceil(unit).checked_mul(unit)
}

/// The smallest unit that is both a whole number of MiB and of `cluster`
/// bytes: `bdev_lvol_create` takes MiB and allocates clusters. A cluster
/// size the target reports with no such unit below 2^64 bytes is its error,
/// not a unit that wrapped to something small.
pub fn lvol_unit(cluster: u64) -> Result<u64, Status> {
    let gcd = |mut a: u64, mut b: u64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let cluster = cluster.max(1);
    (MIB / gcd(MIB, cluster))
        .checked_mul(cluster)
        .ok_or_else(|| {
            Status::internal(format!(
                "the target's lvstore reports clusters of {cluster} bytes: no whole number of \
             them is a whole number of MiB below 2^64 bytes"
            ))
        })
}

/// A bdev's size as the target reports it; a size past 2^64 bytes is the
/// target's error.
pub fn bdev_bytes(bdev: &Bdev) -> Result<u64, Status> {
    bdev.size_bytes()
        .map_err(|e| Status::internal(format!("the target's answer: {e}")))
}

/// How much a backend can hold and has free, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    pub total: u64,
    pub available: u64,
    /// Every volume is a whole number of these.
    pub unit: u64,
}

impl Room {
    /// OUT_OF_RANGE for a size no volume here can have, RESOURCE_EXHAUSTED
    /// for one that would fit once space is freed.
    pub fn check(&self, what: &str, size: u64) -> Result<(), Status> {
        if size > self.total {
            return Err(Status::out_of_range(format!(
                "{what} of {size} bytes is larger than the whole pool ({} bytes)",
                self.total
            )));
        }
        if size > self.available {
            return Err(Status::resource_exhausted(format!(
                "{what} of {size} bytes does not fit: the pool has {} bytes free",
                self.available
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    fn range(required: u64, limit: u64) -> Result<Wanted, Status> {
        signed_range(required as i64, limit as i64)
    }

    fn signed_range(required: i64, limit: i64) -> Result<Wanted, Status> {
        Wanted::from_range(Some(&csi::CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        }))
    }

    #[test]
    fn sizes_honour_the_range_and_the_unit() {
        let none = Wanted::from_range(None).unwrap();
        assert_eq!(none.choose(MIB, 0).unwrap(), DEFAULT_SIZE);
        assert_eq!(none.choose(MIB, 5 * MIB).unwrap(), 5 * MIB);
        assert_eq!(range(1, 0).unwrap().choose(MIB, 0).unwrap(), MIB);
        assert_eq!(
            range(10 * MIB, 10 * MIB).unwrap().choose(MIB, 0).unwrap(),
            10 * MIB
        );
        assert_eq!(
            range(5 * MIB, 0).unwrap().choose(4 * MIB, 0).unwrap(),
            8 * MIB
        );
        // Only a limit: the default, unless the limit is below it.
        assert_eq!(
            range(0, 64 * MIB).unwrap().choose(MIB, 0).unwrap(),
            64 * MIB
        );
        // Rounding up would pass the limit: round down, if that still holds.
        assert_eq!(
            range(5 * MIB, 7 * MIB)
                .unwrap()
                .choose(4 * MIB, 0)
                .unwrap_err()
                .code(),
            Code::OutOfRange
        );
        assert_eq!(
            range(MIB + 1, 3 * MIB).unwrap().choose(MIB, 0).unwrap(),
            2 * MIB
        );
        // A source is a floor.
        assert_eq!(
            range(MIB, 0).unwrap().choose(MIB, 16 * MIB).unwrap(),
            16 * MIB
        );
        assert_eq!(
            range(MIB, 8 * MIB)
                .unwrap()
                .choose(MIB, 16 * MIB)
                .unwrap_err()
                .code(),
            Code::OutOfRange
        );
    }

    #[test]
    fn malformed_ranges_are_invalid() {
        assert_eq!(
            signed_range(-1, 0).unwrap_err().code(),
            Code::InvalidArgument
        );
        assert_eq!(
            signed_range(0, -1).unwrap_err().code(),
            Code::InvalidArgument
        );
        let status = range(2 * MIB, MIB).unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains("limit_bytes"), "{status:?}");
    }

    #[test]
    fn existing_volumes_are_judged_by_the_range() {
        let w = range(10 * MIB, 20 * MIB).unwrap();
        assert!(w.admits(10 * MIB) && w.admits(20 * MIB));
        assert!(!w.admits(9 * MIB) && !w.admits(21 * MIB));
        assert!(Wanted::default().admits(1));
    }

    #[test]
    fn a_peers_sizes_that_overflow_are_errors() {
        // An odd cluster size needs 2^20 clusters per unit: 2^20 * (2^63 + 1)
        // wraps to 2^20 without the check.
        let status = lvol_unit((1 << 63) + 1).unwrap_err();
        assert_eq!(status.code(), Code::Internal);
        assert!(
            status
                .message()
                .contains(&format!("clusters of {} bytes", (1u64 << 63) + 1)),
            "{status:?}"
        );
        assert_eq!(lvol_unit(u64::MAX).unwrap_err().code(), Code::Internal);
        let bdev: Bdev = serde_json::from_value(serde_json::json!({
            "name": "lvs/pvc-x", "product_name": "Logical Volume",
            "num_blocks": 1u64 << 55, "block_size": 512,
        }))
        .unwrap();
        let status = bdev_bytes(&bdev).unwrap_err();
        assert_eq!(status.code(), Code::Internal);
        assert!(status.message().contains("lvs/pvc-x"), "{status:?}");
    }

    #[test]
    fn units_and_rooms() {
        assert_eq!(lvol_unit(4 * MIB).unwrap(), 4 * MIB);
        assert_eq!(lvol_unit(512 << 10).unwrap(), MIB);
        assert_eq!(lvol_unit(3 * MIB).unwrap(), 3 * MIB);
        let room = Room {
            total: 100,
            available: 10,
            unit: 1,
        };
        assert!(room.check("v", 10).is_ok());
        assert_eq!(
            room.check("v", 11).unwrap_err().code(),
            Code::ResourceExhausted
        );
        assert_eq!(room.check("v", 101).unwrap_err().code(), Code::OutOfRange);
    }
}
