//! Encryption on the DPU: a volume whose volume context says
//! `snap-csi.io/encryption: aes-xts` is exposed to the host through an SPDK
//! crypto vbdev over the plugin's bdev, so the host only ever sees
//! plaintext and the storage only ciphertext, and no host CPU cycle or host
//! file ever holds the key. The key comes in NodeStageVolume's secrets
//! (`encryption-key`: hex of the AES-XTS data key followed by the tweak key,
//! 2 × 128 or 2 × 256 bits) and goes to SPDK's keyring on the DPU only
//! (`accel_crypto_key_create`), under a name derived from the volume id, as
//! is the vbdev's (`bdev_crypto_create`). Detach deletes both.
//!
//! Round trips: the key is made beside CreateDevice (it does not need the
//! device), the vbdev right after it: an encrypted stage costs one dependent
//! round trip more than a plain one. A detach reads the vbdev and the key
//! beside SNAP's listings and, only for an encrypted volume, deletes the vbdev
//! before the plugin's device (a base deleted first would leave SPDK's crypto
//! module waiting to rebuild the vbdev on any later bdev of that name).
//!
//! A wrong key cannot be told from a right one: AES-XTS has no check value
//! and SPDK's crypto vbdev stores no header. A key that differs from the one
//! SPDK already holds for the volume (a Secret changed while the volume is
//! staged) is refused, never swapped under a running vbdev.

use std::collections::HashMap;

use tokio::time::Instant;

use super::endpoint::SnapEndpoint;
use super::error::DpuError;
use super::names::VolumeNames;
use crate::jsonrpc::{RpcError, code};
use crate::spdk::accel::{
    AES_XTS, AccelCryptoKeyCreate, AccelCryptoKeyDestroy, AccelCryptoKeysGet, BdevCryptoCreate,
    BdevCryptoDelete,
};
use crate::spdk::bdev::BdevGetBdevs;

/// Volume context (StorageClass parameter) that asks for encryption.
pub const ENCRYPTION: &str = "snap-csi.io/encryption";
/// Its one value today.
pub const AES_XTS_VALUE: &str = "aes-xts";
/// The NodeStageVolume secret holding the key.
pub const KEY_SECRET: &str = "encryption-key";

/// A volume's AES-XTS key as SPDK takes it (lower-case hex). `Debug` prints
/// nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct VolumeKey {
    key: String,
    key2: String,
}

impl std::fmt::Debug for VolumeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("VolumeKey(redacted)")
    }
}

/// The encryption the volume context asks for (its mode, known or not);
/// `None` for a plain volume. Also what a staged volume's record, which
/// keeps its context but never its secrets, tells.
pub fn asked(volume_context: &HashMap<String, String>) -> Option<&str> {
    let mode = volume_context.get(ENCRYPTION)?.trim();
    (!mode.is_empty() && mode != "none").then_some(mode)
}

/// The key the volume asks for: `None` for a plain volume; a clear refusal
/// (naming keys, never values) for an unknown mode, or a missing or malformed
/// key. Messages never quote the secret.
pub fn requested(
    volume_context: &HashMap<String, String>,
    secrets: &HashMap<String, String>,
) -> Result<Option<VolumeKey>, DpuError> {
    let mode = match asked(volume_context) {
        None => return Ok(None),
        Some(AES_XTS_VALUE) => AES_XTS_VALUE,
        Some(other) => {
            return Err(DpuError::InvalidArgument(format!(
                "volume context {ENCRYPTION}={other:?} is not a known encryption; use \
                 {AES_XTS_VALUE:?} or leave it out"
            )));
        }
    };
    let hex = secrets.get(KEY_SECRET).map(|k| k.trim()).ok_or_else(|| {
        DpuError::InvalidArgument(format!(
            "the volume asks for encryption ({ENCRYPTION}={mode}) but NodeStageVolume's secrets \
             hold no {KEY_SECRET:?}: name a Secret with it in the StorageClass's \
             csi.storage.k8s.io/node-stage-secret-name and -namespace"
        ))
    })?;
    let malformed = |why: &str| {
        DpuError::InvalidArgument(format!(
            "secret {KEY_SECRET:?} is not an AES-XTS key: {why} (expected 64 or 128 hex digits: \
             the data key then the tweak key, e.g. `openssl rand -hex 64`)"
        ))
    };
    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(malformed("it holds characters that are not hex digits"));
    }
    if hex.len() != 64 && hex.len() != 128 {
        return Err(malformed(&format!("it has {} hex digits", hex.len())));
    }
    let hex = hex.to_ascii_lowercase();
    let (key, key2) = hex.split_at(hex.len() / 2);
    if key == key2 {
        // SPDK refuses it too: XTS with equal halves is not secure.
        return Err(malformed("its two halves are equal"));
    }
    Ok(Some(VolumeKey {
        key: key.to_string(),
        key2: key2.to_string(),
    }))
}

/// Puts the volume's key in SPDK's keyring; the same key already there is
/// done, another one is refused.
pub(crate) async fn create_key(
    snap: &SnapEndpoint,
    names: &VolumeNames,
    key: &VolumeKey,
    deadline: Instant,
) -> Result<(), DpuError> {
    let create = AccelCryptoKeyCreate {
        cipher: AES_XTS.into(),
        key: key.key.clone(),
        key2: key.key2.clone(),
        name: names.crypto_key.clone(),
    };
    let what = format!("creating encryption key {}", names.crypto_key);
    match snap.call(&create, deadline).await {
        Ok(_) => Ok(()),
        // Every refusal is -32602 "failed to create DEK, rc N"; rc -17 is a
        // key of that name already in the keyring.
        Err(e) if is_dek_exists(&e) => {
            let listed = snap
                .call(
                    &AccelCryptoKeysGet {
                        key_name: names.crypto_key.clone(),
                    },
                    deadline,
                )
                .await
                .map_err(|e| error(snap, &what, e))?;
            let same = listed.iter().any(|k| {
                k.key.eq_ignore_ascii_case(&key.key)
                    && k.key2
                        .as_deref()
                        .is_some_and(|k2| k2.eq_ignore_ascii_case(&key.key2))
            });
            match same {
                true => Ok(()),
                false => Err(DpuError::FailedPrecondition(format!(
                    "SNAP at {}: the volume is attached with another encryption key ({} in \
                     SPDK's keyring differs from secret {KEY_SECRET:?}); unstage it before \
                     changing its key",
                    snap.socket().display(),
                    names.crypto_key
                ))),
            }
        }
        Err(e) => Err(error(snap, &what, e)),
    }
}

fn is_dek_exists(e: &RpcError) -> bool {
    e.code() == Some(code::INVALID_PARAMS) && e.to_string().ends_with("rc -17")
}

/// The bdev SNAP exposes, whichever way: the plugin's `device`, or for an
/// encrypted volume the crypto vbdev made over it (one round trip more).
pub(crate) async fn exposed_bdev(
    snap: &SnapEndpoint,
    names: &VolumeNames,
    device: &str,
    encrypted: bool,
    deadline: Instant,
) -> Result<String, DpuError> {
    if !encrypted {
        return Ok(device.to_string());
    }
    let vbdev = create_vbdev(snap, names, device, deadline).await?;
    crate::failpoint::step("attach:crypto-bdev");
    Ok(vbdev)
}

/// The crypto vbdev over the plugin's `device`, which SNAP then exposes.
async fn create_vbdev(
    snap: &SnapEndpoint,
    names: &VolumeNames,
    device: &str,
    deadline: Instant,
) -> Result<String, DpuError> {
    let create = BdevCryptoCreate {
        base_bdev_name: device.to_string(),
        name: names.crypto_bdev.clone(),
        key_name: names.crypto_key.clone(),
    };
    let what = format!("creating crypto bdev {} over {device}", names.crypto_bdev);
    match snap.call(&create, deadline).await {
        Ok(_) => Ok(names.crypto_bdev.clone()),
        Err(e) if e.is_exists() => Ok(names.crypto_bdev.clone()),
        Err(e) => Err(error(snap, &what, e)),
    }
}

/// What SPDK holds of the volume's encryption, read before a detach.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Found {
    /// The crypto vbdev exists, over this base (the plugin's device).
    pub base: Option<String>,
    /// The key is in the keyring.
    pub key: bool,
}

pub(crate) async fn find(
    snap: &SnapEndpoint,
    names: &VolumeNames,
    deadline: Instant,
) -> Result<Found, DpuError> {
    let vbdev = BdevGetBdevs {
        name: Some(names.crypto_bdev.clone()),
        timeout: None,
    };
    let key = AccelCryptoKeysGet {
        key_name: names.crypto_key.clone(),
    };
    let (vbdev, key) = tokio::join!(snap.call(&vbdev, deadline), snap.call(&key, deadline));
    let base = match vbdev {
        Ok(bdevs) => bdevs
            .into_iter()
            .find_map(|b| b.driver_specific.crypto.map(|c| c.base_bdev_name)),
        Err(e) if e.is_no_such_device() => None,
        Err(e) => return Err(error(snap, "looking for the volume's crypto bdev", e)),
    };
    let key = match key {
        Ok(keys) => !keys.is_empty(),
        Err(e) if e.code() == Some(code::INVALID_PARAMS) => false,
        Err(e) => return Err(error(snap, "looking for the volume's encryption key", e)),
    };
    Ok(Found { base, key })
}

pub(crate) async fn delete_vbdev(
    snap: &SnapEndpoint,
    names: &VolumeNames,
    deadline: Instant,
) -> Result<(), DpuError> {
    let delete = BdevCryptoDelete {
        name: names.crypto_bdev.clone(),
    };
    let what = format!("deleting crypto bdev {}", names.crypto_bdev);
    snap.call_tolerating(&what, &delete, &[code::ENODEV], deadline)
        .await
}

/// Removes the key from SPDK's keyring; an absent key
/// (`-32602 "No key object found"`) is done.
pub(crate) async fn destroy_key(
    snap: &SnapEndpoint,
    names: &VolumeNames,
    deadline: Instant,
) -> Result<(), DpuError> {
    let destroy = AccelCryptoKeyDestroy {
        key_name: names.crypto_key.clone(),
    };
    let what = format!("destroying encryption key {}", names.crypto_key);
    snap.call_tolerating(&what, &destroy, &[code::INVALID_PARAMS], deadline)
        .await
}

/// A SNAP without SPDK's crypto methods cannot encrypt: say that, not "is
/// this a SNAP process?".
fn error(snap: &SnapEndpoint, what: &str, e: RpcError) -> DpuError {
    match e.is_method_not_found() {
        true => DpuError::FailedPrecondition(format!(
            "SNAP at {}: {what}: {e} (encryption needs SPDK's accel crypto and crypto vbdev \
             in SNAP)",
            snap.socket().display()
        )),
        false => snap.error(what, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "00112233445566778899aabbccddeeff\
                       ffeeddccbbaa99887766554433221100\
                       0123456789abcdef0123456789abcdef\
                       fedcba9876543210fedcba9876543210";

    fn ask(mode: Option<&str>, key: Option<&str>) -> Result<Option<VolumeKey>, DpuError> {
        let context = mode.map(|m| (ENCRYPTION.to_string(), m.to_string()));
        let secrets = key.map(|k| (KEY_SECRET.to_string(), k.to_string()));
        requested(
            &context.into_iter().collect(),
            &secrets.into_iter().collect(),
        )
    }

    #[test]
    fn plain_volumes_need_no_key() {
        assert_eq!(ask(None, None).unwrap(), None);
        assert_eq!(ask(Some("none"), Some("whatever")).unwrap(), None);
        let context = |mode: &str| -> HashMap<String, String> {
            [(ENCRYPTION.to_string(), mode.to_string())].into()
        };
        assert_eq!(asked(&HashMap::new()), None);
        assert_eq!(asked(&context(" none ")), None);
        assert_eq!(asked(&context("")), None);
        assert_eq!(asked(&context(" aes-xts")), Some("aes-xts"));
        assert_eq!(asked(&context("rot13")), Some("rot13"));
    }

    #[test]
    fn keys_split_into_data_and_tweak_halves() {
        let key = ask(Some("aes-xts"), Some(KEY)).unwrap().unwrap();
        assert_eq!(key.key, KEY[..64]);
        assert_eq!(key.key2, KEY[64..]);
        let short = ask(Some("aes-xts"), Some(&KEY[..64].to_uppercase()))
            .unwrap()
            .unwrap();
        assert_eq!(short.key, KEY[..32]);
        assert_eq!(short.key2, KEY[32..64]);
    }

    #[test]
    fn refusals_name_the_problem_never_the_key() {
        let same = format!("{}{}", &KEY[..32], &KEY[..32]);
        let cases = [
            (Some("aes-cbc"), Some(KEY), "not a known encryption"),
            (Some("aes-xts"), None, "hold no"),
            (Some("aes-xts"), Some(&KEY[..60]), "60 hex digits"),
            (Some("aes-xts"), Some("zz"), "not hex digits"),
            (Some("aes-xts"), Some(&same[..]), "halves are equal"),
        ];
        for (mode, key, why) in cases {
            let e = ask(mode, key).unwrap_err();
            assert!(matches!(e, DpuError::InvalidArgument(_)), "{e:?}");
            let text = e.to_string();
            assert!(text.contains(why), "{text}");
            assert!(
                !text.contains("0011223344") && !text.contains("0123456789abcdef"),
                "{text}"
            );
        }
        assert_eq!(
            format!("{:?}", ask(Some("aes-xts"), Some(KEY))),
            "Ok(Some(VolumeKey(redacted)))"
        );
    }
}
