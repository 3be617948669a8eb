//! The target's parameters, decoded as SPDK decodes them (`nvmf_rpc.c`:
//! unknown keys refused, most failures `-32602 "Invalid parameters"`), and
//! the checks SPDK makes of NQNs, serial and model numbers and identifiers.

use serde::Deserialize;
use uuid::Uuid;

use super::wire::adrfam_name;
use crate::rpc::RpcError;

const NQN_MAX: usize = 223;
const UUID_NQN_PREFIX: &str = "nqn.2014-08.org.nvmexpress:uuid:";

/// `nvmf_nqn_is_valid`: length, then either the UUID form or `nqn.yyyy-mm.<domain>`.
pub(super) fn nqn_is_valid(nqn: &str) -> bool {
    if nqn.len() < 11 || nqn.len() > NQN_MAX {
        return false;
    }
    if let Some(u) = nqn.strip_prefix(UUID_NQN_PREFIX) {
        return u.len() == 36 && Uuid::parse_str(u).is_ok();
    }
    let b = nqn.as_bytes();
    nqn.starts_with("nqn.")
        && b[4..8].iter().all(u8::is_ascii_digit)
        && b[8] == b'-'
        && b[9..11].iter().all(u8::is_ascii_digit)
        && b.get(11) == Some(&b'.')
        && b.get(12).is_some_and(u8::is_ascii_alphabetic)
}

pub(super) fn printable(s: &str, max: usize) -> bool {
    !s.is_empty() && s.len() <= max && s.bytes().all(|c| (0x20..=0x7e).contains(&c))
}

/// A listener without `adrfam` is IPv4.
pub(super) fn parse_adrfam(s: Option<&str>) -> Option<&'static str> {
    s.map_or(Some("IPv4"), adrfam_name)
}

pub(super) fn parse_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let digits: Vec<u8> = s.bytes().filter(|c| *c != b'-').collect();
    if digits.len() != N * 2 {
        return None;
    }
    let mut out = [0u8; N];
    for (i, pair) in digits.chunks(2).enumerate() {
        let hex = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(hex, 16).ok()?;
    }
    Some(out)
}

pub(super) fn hex_upper(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

#[derive(Debug, Deserialize)]
pub(super) struct CreateTransportParams {
    // Decoded relaxed, as SPDK does: transport-specific options may follow.
    pub trtype: String,
    pub tgt_name: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct GetTransportsParams {
    pub trtype: Option<String>,
    pub tgt_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Accepted for compatibility; the emulator does not model them.
pub(super) struct CreateSubsystemParams {
    pub nqn: String,
    pub serial_number: Option<String>,
    pub model_number: Option<String>,
    pub tgt_name: Option<String>,
    pub max_namespaces: Option<u32>,
    #[serde(default)]
    pub allow_any_host: bool,
    pub ana_reporting: Option<bool>,
    pub min_cntlid: Option<u16>,
    pub max_cntlid: Option<u16>,
    pub max_discard_size_kib: Option<u64>,
    pub max_write_zeroes_size_kib: Option<u64>,
    pub passthrough: Option<bool>,
    pub enable_nssr: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NqnParams {
    pub nqn: String,
    pub tgt_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // nsid: accepted; there is no I/O here to pause (see the module doc).
pub(super) struct PauseParams {
    pub nqn: String,
    pub nsid: Option<u32>,
    pub tgt_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // ptpl_file, anagrpid, visibility: accepted, not modelled.
pub(super) struct NamespaceParams {
    pub bdev_name: String,
    pub nsid: Option<u32>,
    pub nguid: Option<String>,
    pub eui64: Option<String>,
    pub uuid: Option<Uuid>,
    pub anagrpid: Option<u32>,
    pub ptpl_file: Option<String>,
    pub no_auto_visible: Option<bool>,
    pub hide_metadata: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AddNsParams {
    pub nqn: String,
    pub namespace: NamespaceParams,
    pub tgt_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RemoveNsParams {
    pub nqn: String,
    pub nsid: u32,
    pub tgt_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListenAddressParams {
    pub trtype: String,
    pub adrfam: Option<String>,
    pub traddr: String,
    pub trsvcid: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Security and ANA options are accepted, not modelled.
pub(super) struct ListenerParams {
    pub nqn: String,
    pub listen_address: ListenAddressParams,
    pub tgt_name: Option<String>,
    pub secure_channel: Option<bool>,
    pub ana_state: Option<String>,
    pub sock_impl: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Authentication keys are accepted, not modelled.
pub(super) struct HostParams {
    pub nqn: String,
    pub host: String,
    pub tgt_name: Option<String>,
    pub psk: Option<String>,
    pub dhchap_key: Option<String>,
    pub dhchap_ctrlr_key: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AllowAnyHostParams {
    pub nqn: String,
    pub allow_any_host: bool,
    pub tgt_name: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct GetSubsystemsParams {
    pub nqn: Option<String>,
    pub tgt_name: Option<String>,
}

pub(super) fn invalid() -> RpcError {
    RpcError::invalid_params()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nqn_validation() {
        assert!(nqn_is_valid("nqn.2016-06.io.spdk:cnode1"));
        assert!(nqn_is_valid("nqn.2024-01.io.example:pvc-123"));
        assert!(nqn_is_valid(
            "nqn.2014-08.org.nvmexpress:uuid:3d757357-127e-4970-bd5e-502e0c0ae268"
        ));
        assert!(!nqn_is_valid("cnode1"));
        assert!(!nqn_is_valid("nqn.16-06.io.spdk:x"));
        assert!(!nqn_is_valid(&format!(
            "nqn.2016-06.io.{}",
            "a".repeat(220)
        )));
    }

    #[test]
    fn hex_fields_round_trip() {
        let g = parse_hex::<16>("7f1a3c2e-5b6d-4e8f-9a0b-1c2d3e4f5a6b").unwrap();
        assert_eq!(hex_upper(&g), "7F1A3C2E5B6D4E8F9A0B1C2D3E4F5A6B");
        assert!(parse_hex::<8>("123").is_none());
        assert_eq!(parse_adrfam(Some("ipv4")), Some("IPv4"));
        assert_eq!(parse_adrfam(Some("x")), None);
    }
}
