//! SPDK's accel framework keys and the crypto vbdev over them: the DPU side
//! of a volume encrypted on the DPU (`dpu::crypto`). Key material is in the
//! params of `accel_crypto_key_create` and in the answer of
//! `accel_crypto_keys_get`: their `Debug` prints it redacted.

use serde::{Deserialize, Serialize};

use super::method;

/// The only cipher SPDK's software module (and our use) takes.
pub const AES_XTS: &str = "AES_XTS";

/// `accel_crypto_key_create`: a named key in SPDK's keyring. A name in use is
/// `-32602 "failed to create DEK, rc -17"`.
#[derive(Clone, Serialize)]
pub struct AccelCryptoKeyCreate {
    pub cipher: String,
    /// Hex; for AES-XTS the data key.
    pub key: String,
    /// Hex; for AES-XTS the tweak key, as long as `key` and different.
    pub key2: String,
    pub name: String,
}
method!(AccelCryptoKeyCreate => "accel_crypto_key_create", bool);

impl std::fmt::Debug for AccelCryptoKeyCreate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccelCryptoKeyCreate")
            .field("cipher", &self.cipher)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// `accel_crypto_key_destroy`: an absent key is `-32602 "No key object found"`.
#[derive(Debug, Clone, Serialize)]
pub struct AccelCryptoKeyDestroy {
    pub key_name: String,
}
method!(AccelCryptoKeyDestroy => "accel_crypto_key_destroy", bool);

/// `accel_crypto_keys_get` for one key: an absent key is `-32602 "key was not found"`.
#[derive(Debug, Clone, Serialize)]
pub struct AccelCryptoKeysGet {
    pub key_name: String,
}
method!(AccelCryptoKeysGet => "accel_crypto_keys_get", Vec<CryptoKeyInfo>);

/// A key as SPDK lists it, material included.
#[derive(Clone, PartialEq, Eq, Deserialize)]
pub struct CryptoKeyInfo {
    pub name: String,
    pub cipher: String,
    pub key: String,
    #[serde(default)]
    pub key2: Option<String>,
}

impl std::fmt::Debug for CryptoKeyInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CryptoKeyInfo")
            .field("name", &self.name)
            .field("cipher", &self.cipher)
            .finish_non_exhaustive()
    }
}

/// `bdev_crypto_create` over a named key; returns the vbdev's name. A name
/// in use is `-17`, a base claimed by another module `-1`.
#[derive(Debug, Clone, Serialize)]
pub struct BdevCryptoCreate {
    pub base_bdev_name: String,
    pub name: String,
    pub key_name: String,
}
method!(BdevCryptoCreate => "bdev_crypto_create", String);

/// `bdev_crypto_delete`: an absent vbdev is `-19`.
#[derive(Debug, Clone, Serialize)]
pub struct BdevCryptoDelete {
    pub name: String,
}
method!(BdevCryptoDelete => "bdev_crypto_delete", bool);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_material_never_prints() {
        let create = AccelCryptoKeyCreate {
            cipher: AES_XTS.into(),
            key: "00112233445566778899aabbccddeeff".into(),
            key2: "ffeeddccbbaa99887766554433221100".into(),
            name: "k".into(),
        };
        let info = CryptoKeyInfo {
            name: "k".into(),
            cipher: AES_XTS.into(),
            key: create.key.clone(),
            key2: Some(create.key2.clone()),
        };
        for printed in [format!("{create:?}"), format!("{info:?}")] {
            assert!(
                !printed.contains("0011") && !printed.contains("ffee"),
                "{printed}"
            );
            assert!(printed.contains("\"k\""), "{printed}");
        }
        // On the wire it is all there, as SPDK needs it.
        let wire = serde_json::to_value(&create).unwrap();
        assert_eq!(wire["key2"], "ffeeddccbbaa99887766554433221100");
    }
}
