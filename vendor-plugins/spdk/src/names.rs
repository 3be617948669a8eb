//! The SPDK names of a volume's device: derived from the volume id and the
//! backend alone, and reversible.
//!
//! Derived, so that every call, also a retry after a plugin restart, finds
//! the device in SPDK's own list without any record of ours. Reversible, so
//! that ListDevices says whose each device is, again without a record.
//!
//! - AIO: the bdev `snapcsi-aio-<id>`; it is the device.
//! - NVMe-oF: the controller `snapcsi-nvmf-<id>`; SPDK names the bdev of its
//!   namespace 1 `snapcsi-nvmf-<id>n1`, and that bdev is the device.
//! - FS: the fsdev `snapcsi-fs-<id>`; it is the device.
//!
//! `<id>` is the volume id itself when it is made of `[A-Za-z0-9_-]` and does
//! not start with `_` (`pvc-0b9a...` stays readable); any other id is `_`
//! followed by the unpadded base64url of its bytes. Both forms use only
//! `[A-Za-z0-9_-]`, which SPDK, SNAP and shells take as they are; the leading
//! `_` tells them apart, and decoding re-encodes and compares, so each id has
//! exactly one name and each name at most one id. Volume ids are at most 128
//! bytes (CSI's limit on strings; [`check_volume_id`]), so a name is at most
//! 13 + 1 + 171 + 2 = 187 bytes.
//!
//! Changing anything here orphans every device made by an earlier version: don't.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::backend::Kind;

/// CSI's size limit for strings, which volume ids are.
pub const MAX_VOLUME_ID_BYTES: usize = 128;

/// Common to every name this plugin gives, and to nothing else it lists.
pub const PREFIX: &str = "snapcsi-";
const AIO_PREFIX: &str = "snapcsi-aio-";
const NVMF_PREFIX: &str = "snapcsi-nvmf-";
const FS_PREFIX: &str = "snapcsi-fs-";
/// The bdev of namespace 1 of an NVMe controller: `<controller>n1`.
const NAMESPACE_1: &str = "n1";
/// Marks the base64url form of an id.
const ENCODED: char = '_';

/// Why a volume id cannot name a device.
pub fn check_volume_id(volume_id: &str) -> Result<(), String> {
    if volume_id.is_empty() {
        return Err("volume_id is required".into());
    }
    if volume_id.len() > MAX_VOLUME_ID_BYTES {
        return Err(format!(
            "volume_id is {} bytes long; CSI allows at most {MAX_VOLUME_ID_BYTES}",
            volume_id.len()
        ));
    }
    Ok(())
}

/// The SPDK object CreateDevice makes and DeleteDevice removes: the AIO bdev,
/// or the NVMe controller. The volume id must pass [`check_volume_id`].
pub fn object_name(kind: Kind, volume_id: &str) -> String {
    let prefix = match kind {
        Kind::Aio => AIO_PREFIX,
        Kind::Nvmf => NVMF_PREFIX,
        Kind::Fs => FS_PREFIX,
    };
    format!("{prefix}{}", encode(volume_id))
}

/// The device (bdev) name CreateDevice answers.
pub fn device_name(kind: Kind, volume_id: &str) -> String {
    let object = object_name(kind, volume_id);
    match kind {
        Kind::Aio | Kind::Fs => object,
        Kind::Nvmf => object + NAMESPACE_1,
    }
}

/// Whose device `name` is, if it is one of ours.
pub fn parse_device_name(name: &str) -> Option<(Kind, String)> {
    let (kind, body) = if let Some(rest) = name.strip_prefix(AIO_PREFIX) {
        (Kind::Aio, rest)
    } else if let Some(rest) = name.strip_prefix(FS_PREFIX) {
        (Kind::Fs, rest)
    } else {
        let rest = name.strip_prefix(NVMF_PREFIX)?;
        (Kind::Nvmf, rest.strip_suffix(NAMESPACE_1)?)
    };
    let volume_id = decode(body)?;
    Some((kind, volume_id))
}

fn is_plain(volume_id: &str) -> bool {
    !volume_id.starts_with(ENCODED)
        && volume_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn encode(volume_id: &str) -> String {
    if is_plain(volume_id) {
        volume_id.to_string()
    } else {
        format!("{ENCODED}{}", URL_SAFE_NO_PAD.encode(volume_id))
    }
}

fn decode(body: &str) -> Option<String> {
    let volume_id = match body.strip_prefix(ENCODED) {
        Some(encoded) => String::from_utf8(URL_SAFE_NO_PAD.decode(encoded).ok()?).ok()?,
        None => body.to_string(),
    };
    let canonical = check_volume_id(&volume_id).is_ok() && encode(&volume_id) == body;
    canonical.then_some(volume_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_ids_stay_readable_and_never_change() {
        // Devices made by an earlier build are found only by these names.
        assert_eq!(
            device_name(Kind::Aio, "pvc-0b9a1e0e-1111"),
            "snapcsi-aio-pvc-0b9a1e0e-1111"
        );
        assert_eq!(object_name(Kind::Nvmf, "vol_1"), "snapcsi-nvmf-vol_1");
        assert_eq!(device_name(Kind::Nvmf, "vol_1"), "snapcsi-nvmf-vol_1n1");
        assert_eq!(device_name(Kind::Aio, "a/b"), "snapcsi-aio-_YS9i");
        assert_eq!(device_name(Kind::Aio, "_x"), "snapcsi-aio-_X3g");
        assert_eq!(device_name(Kind::Fs, "pvc-1"), "snapcsi-fs-pvc-1");
    }

    #[test]
    fn every_name_maps_back_to_its_volume() {
        let ids = [
            "pvc-1",
            "n1",
            "volumen1",
            "x_y-Z",
            "_leading",
            "a.b",
            "ünïcode/../\0",
            "sp ace",
            &"z".repeat(MAX_VOLUME_ID_BYTES),
            &"é".repeat(MAX_VOLUME_ID_BYTES / 2),
        ];
        for id in ids {
            for kind in Kind::ALL {
                let name = device_name(kind, id);
                assert!(name.len() <= 187, "{name}");
                assert!(
                    name.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                    "{name}"
                );
                assert!(name.starts_with(PREFIX));
                assert_eq!(
                    parse_device_name(&name),
                    Some((kind, id.to_string())),
                    "{name}"
                );
            }
        }
    }

    #[test]
    fn other_names_are_not_ours() {
        for name in [
            "Malloc0",
            "aio-pvc-1",
            "snapcsi-",
            "snapcsi-aio-",
            // A controller is not a device; nor is another namespace's bdev.
            "snapcsi-nvmf-pvc-1",
            "snapcsi-nvmf-pvc-1n2",
            "snapcsi-nvmf-n1",
            // Not canonical: a plain id in encoded form, padding, bad base64.
            "snapcsi-aio-_cHZjLTE",
            "snapcsi-aio-_YS9i==",
            "snapcsi-aio-_!!",
            "snapcsi-aio-a.b",
        ] {
            assert_eq!(parse_device_name(name), None, "{name}");
        }
    }

    #[test]
    fn volume_ids_are_checked() {
        assert!(check_volume_id("").unwrap_err().contains("required"));
        assert!(
            check_volume_id(&"x".repeat(129))
                .unwrap_err()
                .contains("128")
        );
        assert!(check_volume_id(&"x".repeat(128)).is_ok());
    }
}
