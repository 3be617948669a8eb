//! The SNAP objects of a volume are named after its volume id, so that every
//! attach, retry and detach (also after a crash, also from another process)
//! finds them in SNAP's own lists without any record of ours.
//!
//! One digest feeds all names: the UUID v5 of the volume id under a fixed
//! project namespace. It is the NVMe namespace UUID as is (the host verifies
//! it, so a reused function cannot hand us someone else's disk), and its hex
//! form names the subsystem and the virtio-blk serial. Changing anything here
//! orphans every volume attached by an earlier version: don't.

use uuid::Uuid;

/// The fixed namespace of all snap-csi name derivations (random, never change).
const PROJECT_NAMESPACE: Uuid = Uuid::from_u128(0x618430f4_1fd8_4a47_a838_47e3354acd37);

/// A dedicated volume gets its own subsystem with one namespace, as DPF does.
pub const NSID: u32 = 1;

/// Prefix of the pool subsystems that carry packed volumes, one namespace
/// each (`pool-<k>`, k = 0, 1, ...). A packed volume is found by its
/// namespace UUID, in whichever pool it is.
pub const POOL_NQN_PREFIX: &str = "nqn.2022-10.io.snap-csi:pool-";

/// Prefix of the subsystem NQNs we own; `nqn.<yyyy-mm>.<reversed domain>:`
/// is the NVMe-defined form, the domain is the project's.
pub const NQN_PREFIX: &str = "nqn.2022-10.io.snap-csi:vol-";

/// Prefixes of an encrypted volume's crypto vbdev and key in SPDK.
const CRYPTO_BDEV_PREFIX: &str = "snapcsi-crypt-";
const CRYPTO_KEY_PREFIX: &str = "snapcsi-key-";

/// A virtio-fs tag is at most 36 bytes (`struct virtio_fs_config`).
const TAG_MAX: usize = 36;
const TAG_PREFIX: &str = "sc-";
const _: () = assert!(TAG_PREFIX.len() + 32 <= TAG_MAX);
/// Prefix of a volume's virtio-fs device in SNAP.
const FS_DEVICE_PREFIX: &str = "snapcsi-fs-";

/// virtio-blk carries the serial in VIRTIO_BLK_ID_BYTES (20 bytes).
const SERIAL_MAX: usize = 20;
const SERIAL_PREFIX: &str = "sc-";

/// The names of one volume's SNAP objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeNames {
    /// Subsystem NQN: ASCII, far below NVMe's 223-byte limit.
    pub nqn: String,
    /// UUID of namespace [`NSID`], as the host's sysfs prints it.
    pub namespace_uuid: String,
    /// virtio-blk `vblk_id` and NVMe subsystem serial number (20 bytes).
    pub serial: String,
    /// virtio-fs tag the host mounts by (35 bytes: the digest's 32 hex).
    pub fs_tag: String,
    /// SNAP's virtio-fs device serving the volume's fsdev under the tag.
    pub fs_device: String,
    /// The crypto vbdev SNAP exposes instead of the plugin's bdev when the
    /// volume is encrypted on the DPU.
    pub crypto_bdev: String,
    /// The volume's key in SPDK's accel keyring.
    pub crypto_key: String,
}

impl VolumeNames {
    pub fn new(volume_id: &str) -> Self {
        let digest = Uuid::new_v5(&PROJECT_NAMESPACE, volume_id.as_bytes());
        let hex = digest.simple().to_string();
        let serial = format!(
            "{SERIAL_PREFIX}{}",
            &hex[..SERIAL_MAX - SERIAL_PREFIX.len()]
        );
        VolumeNames {
            crypto_bdev: format!("{CRYPTO_BDEV_PREFIX}{hex}"),
            crypto_key: format!("{CRYPTO_KEY_PREFIX}{hex}"),
            nqn: format!("{NQN_PREFIX}{hex}"),
            namespace_uuid: digest.hyphenated().to_string(),
            serial,
            fs_tag: format!("{TAG_PREFIX}{hex}"),
            fs_device: format!("{FS_DEVICE_PREFIX}{hex}"),
        }
    }
}

/// Whether a subsystem NQN is one this project derived from a volume id.
pub fn is_our_nqn(nqn: &str) -> bool {
    nqn.starts_with(NQN_PREFIX)
}

/// The NQN of pool `k`.
pub fn pool_nqn(k: u32) -> String {
    format!("{POOL_NQN_PREFIX}{k}")
}

/// `k` of a pool NQN; `None` for any other subsystem.
pub fn pool_index(nqn: &str) -> Option<u32> {
    let k = nqn.strip_prefix(POOL_NQN_PREFIX)?;
    // Only the canonical spelling: "pool-01" is not pool 1.
    k.parse().ok().filter(|n: &u32| n.to_string() == k)
}

/// Whether a virtio-blk serial is one this project derived from a volume id.
pub fn is_our_serial(serial: &str) -> bool {
    serial.len() == SERIAL_MAX
        && serial
            .strip_prefix(SERIAL_PREFIX)
            .is_some_and(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

impl VolumeNames {
    /// Every key under which the census (`ExposedVolume::key`) may show the
    /// volume, one per way SNAP exposes it.
    pub fn keys(&self) -> [&str; 4] {
        [&self.nqn, &self.serial, &self.namespace_uuid, &self.fs_tag]
    }
}

/// Whether a virtio-fs tag is one this project derived from a volume id.
pub fn is_our_tag(tag: &str) -> bool {
    tag.len() == TAG_PREFIX.len() + 32
        && tag
            .strip_prefix(TAG_PREFIX)
            .is_some_and(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_valid_and_distinct() {
        let a = VolumeNames::new("pvc-0b9a1e0e-1111-4c7e-9f00-000000000001");
        assert_eq!(
            a,
            VolumeNames::new("pvc-0b9a1e0e-1111-4c7e-9f00-000000000001")
        );
        let b = VolumeNames::new("pvc-0b9a1e0e-1111-4c7e-9f00-000000000002");
        assert_ne!(a.nqn, b.nqn);
        assert_ne!(a.serial, b.serial);
        assert_ne!(a.namespace_uuid, b.namespace_uuid);

        assert!(a.nqn.starts_with(NQN_PREFIX));
        assert_eq!(a.nqn.len(), NQN_PREFIX.len() + 32);
        assert!(a.nqn.is_ascii() && a.nqn.len() <= 223);
        assert_eq!(a.serial.len(), SERIAL_MAX);
        assert!(a.serial.starts_with(SERIAL_PREFIX));
        assert!(Uuid::parse_str(&a.namespace_uuid).is_ok());
        assert!(is_our_nqn(&a.nqn) && is_our_serial(&a.serial));
        assert!(!is_our_nqn("nqn.2016-06.io.spdk:cnode1"));
        assert!(!is_our_serial("sc-not-hex-at-all-xx") && !is_our_serial("sc-0"));
    }

    #[test]
    fn pool_names_round_trip_and_are_not_volume_names() {
        assert_eq!(pool_nqn(0), "nqn.2022-10.io.snap-csi:pool-0");
        assert_eq!(pool_index(&pool_nqn(17)), Some(17));
        assert_eq!(pool_index("nqn.2022-10.io.snap-csi:pool-01"), None);
        assert_eq!(pool_index("nqn.2022-10.io.snap-csi:pool-"), None);
        assert_eq!(pool_index(&VolumeNames::new("v").nqn), None);
        assert!(!is_our_nqn(&pool_nqn(0)));
    }

    #[test]
    fn derivation_never_changes() {
        // Volumes attached by an earlier build are found only by these names.
        let names = VolumeNames::new("vol-1");
        assert_eq!(names.namespace_uuid, "6aaea650-8ef7-5653-a05a-0aea9d997ec8");
        assert_eq!(
            names.nqn,
            "nqn.2022-10.io.snap-csi:vol-6aaea6508ef75653a05a0aea9d997ec8"
        );
        assert_eq!(names.serial, "sc-6aaea6508ef75653a");
        assert_eq!(
            names.crypto_bdev,
            "snapcsi-crypt-6aaea6508ef75653a05a0aea9d997ec8"
        );
        assert_eq!(
            names.crypto_key,
            "snapcsi-key-6aaea6508ef75653a05a0aea9d997ec8"
        );
        assert_eq!(names.fs_tag, "sc-6aaea6508ef75653a05a0aea9d997ec8");
        assert_eq!(
            names.fs_device,
            "snapcsi-fs-6aaea6508ef75653a05a0aea9d997ec8"
        );
    }

    #[test]
    fn tags_fit_virtio_fs_and_are_recognised() {
        let names = VolumeNames::new(&"y".repeat(10_000));
        assert!(names.fs_tag.len() <= TAG_MAX && names.fs_tag.is_ascii());
        assert!(is_our_tag(&names.fs_tag));
        assert!(!is_our_tag(&names.serial) && !is_our_tag("myfs"));
        assert!(names.keys().contains(&names.fs_tag.as_str()));
    }

    #[test]
    fn long_and_odd_volume_ids_still_give_bounded_names() {
        let id = "x".repeat(4096) + "/../é\0";
        let names = VolumeNames::new(&id);
        assert_eq!(names.serial.len(), SERIAL_MAX);
        assert_eq!(names.nqn.len(), NQN_PREFIX.len() + 32);
    }
}
