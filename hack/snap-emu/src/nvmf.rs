//! The NVMe-oF target (`nvmf_*`): transports, subsystems, namespaces, hosts
//! and listeners, with SPDK's error replies (most failures are `-32602
//! "Invalid parameters"`, a duplicate subsystem is `-32603 "Unable to create
//! subsystem <nqn>"`). Listeners really listen; see [`crate::nvmf_tcp`].
//!
//! `nvmf_subsystem_pause` and `nvmf_subsystem_resume` answer as those of the
//! patched `spdk_tgt` the tests build (hack/spdk: upstream v24.09 has only
//! the library calls): pausing a paused subsystem and resuming an active one
//! succeed (the library's state change to the state it is in), an unknown
//! NQN is -32602 "Invalid parameters", an unknown target -32603, and
//! parameters are decoded strictly. A pause holds the I/O that reaches the
//! target (an initiator's data path volume, see [`crate::nvmf_io`]): it
//! answers once the I/O in flight is done, and later I/O waits for the
//! resume. An initiator exposing its namespace directly (not through the
//! data path) reads and writes the backing file itself, and connects go on
//! while paused: neither is held, where SPDK would hold both.

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use uuid::Uuid;

use std::sync::Arc;

use crate::bdev::BdevKind;
use crate::nvmf_io::Gate;
use crate::nvmf_tcp::{self, Accepted, Listener, WireNamespace};
use crate::rpc::{ENODEV, OnDecodeError, RpcError, RpcResult, decode, decode_opt};
use crate::state::Emulator;

pub(crate) const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
const TGT_NAME: &str = "nvmf_tgt";
const DEFAULT_SN: &str = "00000000000000000000";
const DEFAULT_MN: &str = "SPDK bdev Controller";
const DEFAULT_MAX_NAMESPACES: u32 = 32;
const DEFAULT_MIN_CNTLID: u16 = 1;
const DEFAULT_MAX_CNTLID: u16 = 0xffef;
const NQN_MAX: usize = 223;
const UUID_NQN_PREFIX: &str = "nqn.2014-08.org.nvmexpress:uuid:";

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListenAddr {
    pub adrfam: &'static str,
    pub traddr: String,
    pub trsvcid: String,
}

impl ListenAddr {
    fn json(&self) -> Value {
        json!({"trtype": "TCP", "adrfam": self.adrfam, "traddr": self.traddr, "trsvcid": self.trsvcid})
    }

    fn key(&self) -> (String, String) {
        (self.traddr.clone(), self.trsvcid.clone())
    }
}

#[derive(Debug)]
pub(crate) struct NvmfNamespace {
    pub nsid: u32,
    pub bdev: String,
    pub uuid: Uuid,
    pub nguid: [u8; 16],
    pub eui64: Option<u64>,
}

#[derive(Debug)]
pub(crate) struct HostConnection {
    pub cntlid: u16,
    pub hostnqn: String,
    /// Dropping it closes the connection.
    _kick: oneshot::Sender<()>,
}

#[derive(Debug)]
pub(crate) struct Subsystem {
    pub nqn: String,
    pub serial_number: String,
    pub model_number: String,
    pub allow_any_host: bool,
    pub hosts: Vec<String>,
    pub max_namespaces: u32,
    pub min_cntlid: u16,
    pub max_cntlid: u16,
    pub listeners: Vec<ListenAddr>,
    pub namespaces: Vec<NvmfNamespace>,
    pub connections: Vec<HostConnection>,
    next_cntlid: u16,
    /// Held closed while paused: I/O through the target waits at it.
    pub gate: Arc<Gate>,
}

#[derive(Debug)]
struct BoundListener {
    key: (String, String),
    listener: Listener,
    users: usize,
}

#[derive(Debug, Default)]
pub(crate) struct NvmfTarget {
    tcp_transport: bool,
    subsystems: Vec<Subsystem>,
    listeners: Vec<BoundListener>,
}

impl NvmfTarget {
    fn subsystem(&self, nqn: &str) -> Option<usize> {
        self.subsystems.iter().position(|s| s.nqn == nqn)
    }

    /// The subsystem a per-subsystem method names, with SPDK's errors: the
    /// target is checked first; an unknown NQN is only named in SPDK's log,
    /// the reply says "Invalid parameters".
    fn named_subsystem(&self, tgt_name: &Option<String>, nqn: &str) -> Result<usize, RpcError> {
        check_tgt(tgt_name)?;
        self.subsystem(nqn).ok_or_else(invalid)
    }

    /// Stops every listener (shutdown).
    pub fn stop(&mut self) {
        for l in self.listeners.drain(..) {
            l.listener.task.abort();
        }
        // I/O connections end too, held I/O fails.
        for s in self.subsystems.drain(..) {
            s.gate.close();
        }
    }
}

fn check_tgt(tgt_name: &Option<String>) -> Result<(), RpcError> {
    match tgt_name.as_deref() {
        None | Some(TGT_NAME) => Ok(()),
        Some(_) => Err(RpcError::internal("Unable to find a target.")),
    }
}

/// `nvmf_nqn_is_valid`: length, then either the UUID form or `nqn.yyyy-mm.<domain>`.
pub(crate) fn nqn_is_valid(nqn: &str) -> bool {
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

fn printable(s: &str, max: usize) -> bool {
    !s.is_empty() && s.len() <= max && s.bytes().all(|c| (0x20..=0x7e).contains(&c))
}

/// `spdk_nvme_transport_id_parse_adrfam`, which the target and the initiator
/// share: any case in, SPDK's spelling out.
pub(crate) fn adrfam_name(s: &str) -> Option<&'static str> {
    match s.to_ascii_lowercase().as_str() {
        "ipv4" => Some("IPv4"),
        "ipv6" => Some("IPv6"),
        "ib" => Some("IB"),
        "fc" => Some("FC"),
        "intra_host" => Some("INTRA_HOST"),
        _ => None,
    }
}

/// A listener without `adrfam` is IPv4.
fn parse_adrfam(s: Option<&str>) -> Option<&'static str> {
    s.map_or(Some("IPv4"), adrfam_name)
}

fn parse_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
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

fn hex_upper(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

#[derive(Debug, Deserialize)]
struct CreateTransportParams {
    // Decoded relaxed, as SPDK does: transport-specific options may follow.
    trtype: String,
    tgt_name: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct GetTransportsParams {
    trtype: Option<String>,
    tgt_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Accepted for compatibility; the emulator does not model them.
struct CreateSubsystemParams {
    nqn: String,
    serial_number: Option<String>,
    model_number: Option<String>,
    tgt_name: Option<String>,
    max_namespaces: Option<u32>,
    #[serde(default)]
    allow_any_host: bool,
    ana_reporting: Option<bool>,
    min_cntlid: Option<u16>,
    max_cntlid: Option<u16>,
    max_discard_size_kib: Option<u64>,
    max_write_zeroes_size_kib: Option<u64>,
    passthrough: Option<bool>,
    enable_nssr: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NqnParams {
    nqn: String,
    tgt_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // nsid: accepted; there is no I/O here to pause (see the module doc).
struct PauseParams {
    nqn: String,
    nsid: Option<u32>,
    tgt_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // ptpl_file, anagrpid, visibility: accepted, not modelled.
struct NamespaceParams {
    bdev_name: String,
    nsid: Option<u32>,
    nguid: Option<String>,
    eui64: Option<String>,
    uuid: Option<Uuid>,
    anagrpid: Option<u32>,
    ptpl_file: Option<String>,
    no_auto_visible: Option<bool>,
    hide_metadata: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AddNsParams {
    nqn: String,
    namespace: NamespaceParams,
    tgt_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RemoveNsParams {
    nqn: String,
    nsid: u32,
    tgt_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListenAddressParams {
    trtype: String,
    adrfam: Option<String>,
    traddr: String,
    trsvcid: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Security and ANA options are accepted, not modelled.
struct ListenerParams {
    nqn: String,
    listen_address: ListenAddressParams,
    tgt_name: Option<String>,
    secure_channel: Option<bool>,
    ana_state: Option<String>,
    sock_impl: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Authentication keys are accepted, not modelled.
struct HostParams {
    nqn: String,
    host: String,
    tgt_name: Option<String>,
    psk: Option<String>,
    dhchap_key: Option<String>,
    dhchap_ctrlr_key: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AllowAnyHostParams {
    nqn: String,
    allow_any_host: bool,
    tgt_name: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct GetSubsystemsParams {
    nqn: Option<String>,
    tgt_name: Option<String>,
}

fn invalid() -> RpcError {
    RpcError::invalid_params()
}

impl Emulator {
    pub(crate) fn nvmf_create_transport(&mut self, params: Option<Value>) -> RpcResult {
        let p: CreateTransportParams = decode(params, OnDecodeError::InvalidParams)?;
        check_tgt(&p.tgt_name)?;
        if !p.trtype.eq_ignore_ascii_case("tcp") {
            return Err(RpcError::invalid_params_msg(format!(
                "Invalid transport type '{}'",
                p.trtype
            )));
        }
        if self.nvmf.tcp_transport {
            return Err(RpcError::internal(format!(
                "Transport type '{}' already exists",
                p.trtype
            )));
        }
        self.nvmf.tcp_transport = true;
        Ok(json!(true))
    }

    pub(crate) fn nvmf_get_transports(&self, params: Option<Value>) -> RpcResult {
        let p: GetTransportsParams = decode_opt(params, OnDecodeError::InvalidParams)?;
        check_tgt(&p.tgt_name)?;
        if let Some(t) = &p.trtype
            && (!t.eq_ignore_ascii_case("tcp") || !self.nvmf.tcp_transport)
        {
            return Err(RpcError::errno(ENODEV));
        }
        if !self.nvmf.tcp_transport {
            return Ok(json!([]));
        }
        // SPDK v24.09's TCP defaults.
        Ok(json!([{
            "trtype": "TCP",
            "max_queue_depth": 128,
            "max_io_qpairs_per_ctrlr": 127,
            "in_capsule_data_size": 4096,
            "max_io_size": 131072,
            "io_unit_size": 131072,
            "max_aq_depth": 128,
            "num_shared_buffers": 511,
            "buf_cache_size": 4294967295u64,
            "dif_insert_or_strip": false,
            "zcopy": false,
            "c2h_success": true,
            "sock_priority": 0,
            "abort_timeout_sec": 1,
            "ack_timeout": 0,
            "data_wr_pool_size": 0
        }]))
    }

    pub(crate) fn nvmf_create_subsystem(&mut self, params: Option<Value>) -> RpcResult {
        let p: CreateSubsystemParams = decode(params, OnDecodeError::InvalidParams)?;
        if let Some(name) = p.tgt_name.as_deref().filter(|n| *n != TGT_NAME) {
            return Err(RpcError::internal(format!("Unable to find target {name}")));
        }
        if let Some(sn) = &p.serial_number
            && !printable(sn, 20)
        {
            return Err(RpcError::invalid_params_msg(format!("Invalid SN {sn}")));
        }
        if let Some(mn) = &p.model_number
            && !printable(mn, 40)
        {
            return Err(RpcError::invalid_params_msg(format!("Invalid MN {mn}")));
        }
        let min = p.min_cntlid.unwrap_or(DEFAULT_MIN_CNTLID);
        let max = p.max_cntlid.unwrap_or(DEFAULT_MAX_CNTLID);
        if min == 0 || max > DEFAULT_MAX_CNTLID || min > max {
            return Err(RpcError::invalid_params_msg(format!(
                "Invalid cntlid range [{min}-{max}]"
            )));
        }
        if p.nqn == DISCOVERY_NQN || !nqn_is_valid(&p.nqn) || self.nvmf.subsystem(&p.nqn).is_some()
        {
            return Err(RpcError::internal(format!(
                "Unable to create subsystem {}",
                p.nqn
            )));
        }
        self.nvmf.subsystems.push(Subsystem {
            nqn: p.nqn,
            serial_number: p.serial_number.unwrap_or_else(|| DEFAULT_SN.into()),
            model_number: p.model_number.unwrap_or_else(|| DEFAULT_MN.into()),
            allow_any_host: p.allow_any_host,
            hosts: vec![],
            max_namespaces: p.max_namespaces.unwrap_or(DEFAULT_MAX_NAMESPACES),
            min_cntlid: min,
            max_cntlid: max,
            listeners: vec![],
            namespaces: vec![],
            connections: vec![],
            next_cntlid: min,
            gate: Arc::default(),
        });
        Ok(json!(true))
    }

    /// Answers once the I/O in flight through the target is done; what
    /// comes later waits for the resume.
    pub(crate) fn nvmf_subsystem_pause(&mut self, params: Option<Value>) -> RpcResult {
        let p: PauseParams = decode(params, OnDecodeError::InvalidParams)?;
        let si = self.nvmf.named_subsystem(&p.tgt_name, &p.nqn)?;
        self.nvmf.subsystems[si].gate.pause();
        Ok(json!(true))
    }

    /// Decoded as the pause is (SPDK's resume shares its decoders).
    pub(crate) fn nvmf_subsystem_resume(&mut self, params: Option<Value>) -> RpcResult {
        let p: PauseParams = decode(params, OnDecodeError::InvalidParams)?;
        let si = self.nvmf.named_subsystem(&p.tgt_name, &p.nqn)?;
        self.nvmf.subsystems[si].gate.resume();
        Ok(json!(true))
    }

    pub(crate) fn nvmf_delete_subsystem(&mut self, params: Option<Value>) -> RpcResult {
        let p: NqnParams = decode(params, OnDecodeError::InvalidParams)?;
        check_tgt(&p.tgt_name)?;
        let i = self.nvmf.subsystem(&p.nqn).ok_or_else(invalid)?;
        let s = self.nvmf.subsystems.remove(i);
        s.gate.close();
        for l in &s.listeners {
            self.release_listener(&l.key());
        }
        for ns in &s.namespaces {
            self.unclaim(&ns.bdev);
        }
        // Dropping the connections closes them.
        drop(s);
        Ok(json!(true))
    }

    fn unclaim(&mut self, bdev: &str) {
        if let Some(b) = self.bdevs.get_mut(bdev)
            && b.claim == Some("nvmf")
        {
            b.claim = None;
        }
    }

    pub(crate) fn nvmf_subsystem_add_ns(&mut self, params: Option<Value>) -> RpcResult {
        let p: AddNsParams = decode(params, OnDecodeError::InvalidParams)?;
        let si = self.nvmf.named_subsystem(&p.tgt_name, &p.nqn)?;
        let ns = p.namespace;
        let nguid = match &ns.nguid {
            Some(s) => Some(parse_hex::<16>(s).ok_or_else(invalid)?),
            None => None,
        };
        let eui64 = match &ns.eui64 {
            Some(s) => Some(u64::from_be_bytes(parse_hex::<8>(s).ok_or_else(invalid)?)),
            None => None,
        };
        let bdev = self.bdevs.get(&ns.bdev_name).ok_or_else(invalid)?;
        if bdev.claim.is_some() || self.bdev_has_writers(&bdev.name) {
            return Err(invalid());
        }
        let (bdev_name, bdev_uuid) = (bdev.name.clone(), bdev.uuid);
        let s = &mut self.nvmf.subsystems[si];
        let nsid = match ns.nsid.unwrap_or(0) {
            0 => (1..=u32::MAX)
                .find(|n| !s.namespaces.iter().any(|x| x.nsid == *n))
                .ok_or_else(invalid)?,
            n => n,
        };
        if s.namespaces.iter().any(|x| x.nsid == nsid)
            || (s.max_namespaces != 0 && nsid > s.max_namespaces)
        {
            return Err(invalid());
        }
        s.namespaces.push(NvmfNamespace {
            nsid,
            bdev: bdev_name.clone(),
            uuid: ns.uuid.unwrap_or(bdev_uuid),
            // Without an NGUID SPDK derives one from the bdev's UUID.
            nguid: nguid.unwrap_or(*bdev_uuid.as_bytes()),
            eui64,
        });
        s.namespaces.sort_by_key(|n| n.nsid);
        if let Some(b) = self.bdevs.get_mut(&bdev_name) {
            b.claim = Some("nvmf");
        }
        Ok(json!(nsid))
    }

    pub(crate) fn nvmf_subsystem_remove_ns(&mut self, params: Option<Value>) -> RpcResult {
        let p: RemoveNsParams = decode(params, OnDecodeError::InvalidParams)?;
        let si = self.nvmf.named_subsystem(&p.tgt_name, &p.nqn)?;
        let s = &mut self.nvmf.subsystems[si];
        let i = s
            .namespaces
            .iter()
            .position(|n| n.nsid == p.nsid)
            .ok_or_else(invalid)?;
        let ns = s.namespaces.remove(i);
        self.unclaim(&ns.bdev);
        Ok(json!(true))
    }

    /// A bdev is going away: namespaces using it are removed (hot remove).
    pub(crate) fn nvmf_release_bdev(&mut self, bdev: &str) {
        for s in &mut self.nvmf.subsystems {
            s.namespaces.retain(|n| n.bdev != bdev);
        }
    }

    fn listen_addr(p: &ListenAddressParams) -> Result<ListenAddr, RpcError> {
        if !p.trtype.eq_ignore_ascii_case("tcp") {
            return Err(invalid());
        }
        let adrfam = parse_adrfam(p.adrfam.as_deref()).ok_or_else(invalid)?;
        let trsvcid = p.trsvcid.clone().ok_or_else(invalid)?;
        if trsvcid.parse::<u16>().is_err() || p.traddr.is_empty() {
            return Err(invalid());
        }
        Ok(ListenAddr {
            adrfam,
            traddr: p.traddr.clone(),
            trsvcid,
        })
    }

    fn acquire_listener(&mut self, key: &(String, String)) -> Result<(), RpcError> {
        if let Some(l) = self.nvmf.listeners.iter_mut().find(|l| &l.key == key) {
            l.users += 1;
            return Ok(());
        }
        let listener = nvmf_tcp::listen(self.me.clone(), &key.0, &key.1).map_err(|e| {
            tracing::warn!("cannot listen on {}:{}: {e}", key.0, key.1);
            invalid()
        })?;
        self.nvmf.listeners.push(BoundListener {
            key: key.clone(),
            listener,
            users: 1,
        });
        Ok(())
    }

    fn release_listener(&mut self, key: &(String, String)) {
        let Some(i) = self.nvmf.listeners.iter().position(|l| &l.key == key) else {
            return;
        };
        let l = &mut self.nvmf.listeners[i];
        l.users -= 1;
        if l.users == 0 {
            self.nvmf.listeners.remove(i).listener.task.abort();
        }
    }

    pub(crate) fn nvmf_subsystem_add_listener(&mut self, params: Option<Value>) -> RpcResult {
        let p: ListenerParams = decode(params, OnDecodeError::InvalidParams)?;
        let si = self.nvmf.named_subsystem(&p.tgt_name, &p.nqn)?;
        let addr = Self::listen_addr(&p.listen_address)?;
        if !self.nvmf.tcp_transport {
            return Err(invalid());
        }
        if self.nvmf.subsystems[si]
            .listeners
            .iter()
            .any(|l| l.key() == addr.key())
        {
            return Err(invalid());
        }
        self.acquire_listener(&addr.key())?;
        self.nvmf.subsystems[si].listeners.push(addr);
        Ok(json!(true))
    }

    pub(crate) fn nvmf_subsystem_remove_listener(&mut self, params: Option<Value>) -> RpcResult {
        let p: ListenerParams = decode(params, OnDecodeError::InvalidParams)?;
        let si = self.nvmf.named_subsystem(&p.tgt_name, &p.nqn)?;
        let addr = Self::listen_addr(&p.listen_address)?;
        let s = &mut self.nvmf.subsystems[si];
        let i = s
            .listeners
            .iter()
            .position(|l| l.key() == addr.key())
            .ok_or_else(invalid)?;
        s.listeners.remove(i);
        self.release_listener(&addr.key());
        Ok(json!(true))
    }

    pub(crate) fn nvmf_subsystem_add_host(&mut self, params: Option<Value>) -> RpcResult {
        let p: HostParams = decode(params, OnDecodeError::InvalidParams)?;
        let si = self.nvmf.named_subsystem(&p.tgt_name, &p.nqn)?;
        let s = &mut self.nvmf.subsystems[si];
        if s.hosts.contains(&p.host) {
            // spdk_nvmf_subsystem_add_host_ext's -EINVAL, reported generically.
            return Err(RpcError::internal("Internal error"));
        }
        s.hosts.push(p.host);
        Ok(json!(true))
    }

    pub(crate) fn nvmf_subsystem_remove_host(&mut self, params: Option<Value>) -> RpcResult {
        let p: HostParams = decode(params, OnDecodeError::InvalidParams)?;
        let si = self.nvmf.named_subsystem(&p.tgt_name, &p.nqn)?;
        let s = &mut self.nvmf.subsystems[si];
        if !s.hosts.contains(&p.host) {
            // spdk_nvmf_subsystem_remove_host's -ENOENT, reported generically.
            return Err(RpcError::internal("Internal error"));
        }
        s.hosts.retain(|h| *h != p.host);
        // A removed host loses its connections.
        s.connections.retain(|c| c.hostnqn != p.host);
        Ok(json!(true))
    }

    pub(crate) fn nvmf_subsystem_allow_any_host(&mut self, params: Option<Value>) -> RpcResult {
        let p: AllowAnyHostParams = decode(params, OnDecodeError::InvalidParams)?;
        let si = self.nvmf.named_subsystem(&p.tgt_name, &p.nqn)?;
        self.nvmf.subsystems[si].allow_any_host = p.allow_any_host;
        Ok(json!(true))
    }

    fn subsystem_json(&self, s: &Subsystem) -> Value {
        let namespaces: Vec<Value> = s
            .namespaces
            .iter()
            .map(|n| {
                let mut o = serde_json::Map::new();
                o.insert("nsid".into(), json!(n.nsid));
                o.insert("bdev_name".into(), json!(n.bdev));
                // "name" is kept by SPDK for compatibility; it repeats bdev_name.
                o.insert("name".into(), json!(n.bdev));
                if n.nguid != [0; 16] {
                    o.insert("nguid".into(), json!(hex_upper(&n.nguid)));
                }
                if let Some(e) = n.eui64 {
                    o.insert("eui64".into(), json!(format!("{e:016X}")));
                }
                o.insert("uuid".into(), json!(n.uuid.to_string()));
                Value::Object(o)
            })
            .collect();
        let hosts: Vec<Value> = s.hosts.iter().map(|h| json!({"nqn": h})).collect();
        json!({
            "nqn": s.nqn,
            "subtype": "NVMe",
            "listen_addresses": s.listeners.iter().map(ListenAddr::json).collect::<Vec<_>>(),
            "allow_any_host": s.allow_any_host,
            "hosts": hosts,
            "serial_number": s.serial_number,
            "model_number": s.model_number,
            "max_namespaces": s.max_namespaces,
            "min_cntlid": s.min_cntlid,
            "max_cntlid": s.max_cntlid,
            "namespaces": namespaces
        })
    }

    fn discovery_json() -> Value {
        json!({
            "nqn": DISCOVERY_NQN,
            "subtype": "Discovery",
            "listen_addresses": [],
            "allow_any_host": true,
            "hosts": []
        })
    }

    pub(crate) fn nvmf_get_subsystems(&self, params: Option<Value>) -> RpcResult {
        let p: GetSubsystemsParams = decode_opt(params, OnDecodeError::InvalidParams)?;
        check_tgt(&p.tgt_name)?;
        match p.nqn.as_deref() {
            Some(DISCOVERY_NQN) => Ok(json!([Self::discovery_json()])),
            Some(nqn) => {
                let i = self.nvmf.subsystem(nqn).ok_or(RpcError::errno(ENODEV))?;
                Ok(json!([self.subsystem_json(&self.nvmf.subsystems[i])]))
            }
            None => {
                let mut all = vec![Self::discovery_json()];
                all.extend(self.nvmf.subsystems.iter().map(|s| self.subsystem_json(s)));
                Ok(Value::Array(all))
            }
        }
    }

    /// The subsystem `hostnqn` may reach as `subnqn` on listener `key`, for
    /// the I/O connections of [`crate::nvmf_io`].
    pub(crate) fn nvmf_admitted(
        &self,
        key: &(String, String),
        subnqn: &str,
        hostnqn: &str,
    ) -> Result<&Subsystem, String> {
        self.nvmf_admit(key, subnqn, hostnqn)
            .map(|si| &self.nvmf.subsystems[si])
    }

    /// The subsystem `hostnqn` may reach as `subnqn` on listener `key`.
    fn nvmf_admit(
        &self,
        key: &(String, String),
        subnqn: &str,
        hostnqn: &str,
    ) -> Result<usize, String> {
        let si = self
            .nvmf
            .subsystem(subnqn)
            .ok_or_else(|| format!("no subsystem {subnqn}"))?;
        let s = &self.nvmf.subsystems[si];
        if !s.listeners.iter().any(|l| &l.key() == key) {
            return Err(format!("{subnqn} does not listen on {}:{}", key.0, key.1));
        }
        if !s.allow_any_host && !s.hosts.iter().any(|h| h == hostnqn) {
            return Err(format!("host {hostnqn} is not allowed on {subnqn}"));
        }
        Ok(si)
    }

    /// A host's handshake arrived on listener `key`: admit it or say why not.
    pub(crate) fn nvmf_connect(
        &mut self,
        key: &(String, String),
        subnqn: &str,
        hostnqn: &str,
        kick: oneshot::Sender<()>,
    ) -> Result<Accepted, String> {
        let si = self.nvmf_admit(key, subnqn, hostnqn)?;
        let s = &self.nvmf.subsystems[si];
        let namespaces: Vec<WireNamespace> = s
            .namespaces
            .iter()
            .filter_map(|n| {
                let b = self.bdevs.get(&n.bdev)?;
                let backing = self.backing_of(b);
                let (unmap, copy) = match &b.kind {
                    BdevKind::Aio { fallocate, .. } => (*fallocate, false),
                    BdevKind::Null { .. } => (false, false),
                    BdevKind::Malloc { .. } => (true, true),
                    BdevKind::Lvol { .. } => (true, false),
                    BdevKind::Nvme(i) => (i.unmap, i.copy),
                    // The fabrics shortcut hands over a file range, which for
                    // a crypto bdev holds ciphertext: not offered (see `nvmf_tcp`).
                    BdevKind::Crypto { .. } => return None,
                };
                Some(WireNamespace {
                    nsid: n.nsid,
                    uuid: n.uuid.to_string(),
                    block_size: b.block_size,
                    num_blocks: b.num_blocks,
                    path: backing.path,
                    offset: backing.offset,
                    size: backing.size,
                    read_only: backing.read_only,
                    unmap,
                    copy,
                })
            })
            .collect();
        let s = &mut self.nvmf.subsystems[si];
        let span = u32::from(s.max_cntlid - s.min_cntlid) + 1;
        let cntlid = (0..span)
            .map(|i| {
                let off = (u32::from(s.next_cntlid - s.min_cntlid) + i) % span;
                s.min_cntlid + off as u16
            })
            .find(|c| !s.connections.iter().any(|x| x.cntlid == *c))
            .ok_or_else(|| "no free controller id".to_owned())?;
        s.next_cntlid = if cntlid == s.max_cntlid {
            s.min_cntlid
        } else {
            cntlid + 1
        };
        s.connections.push(HostConnection {
            cntlid,
            hostnqn: hostnqn.to_owned(),
            _kick: kick,
        });
        Ok(Accepted {
            cntlid,
            serial_number: s.serial_number.clone(),
            model_number: s.model_number.clone(),
            namespaces,
        })
    }

    pub(crate) fn nvmf_disconnect(&mut self, subnqn: &str, cntlid: u16) {
        if let Some(i) = self.nvmf.subsystem(subnqn) {
            self.nvmf.subsystems[i]
                .connections
                .retain(|c| c.cntlid != cntlid);
        }
    }
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
