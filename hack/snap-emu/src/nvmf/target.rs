//! The NVMe-oF target (`nvmf_*`): transports, subsystems, namespaces, hosts
//! and listeners, with SPDK's error replies (most failures are `-32602
//! "Invalid parameters"`, a duplicate subsystem is `-32603 "Unable to create
//! subsystem <nqn>"`). Listeners really listen; see [`super::listener`].
//!
//! `nvmf_subsystem_pause` and `nvmf_subsystem_resume` answer as those of the
//! patched `spdk_tgt` the tests build (hack/spdk: upstream v24.09 has only
//! the library calls): pausing a paused subsystem and resuming an active one
//! succeed (the library's state change to the state it is in), an unknown
//! NQN is -32602 "Invalid parameters", an unknown target -32603, and
//! parameters are decoded strictly. A pause holds the I/O that reaches the
//! target (an initiator's data path volume, see [`super::io`]; every
//! exposure of a namespace but with `--data-path direct`): it answers once
//! the I/O in flight is done, and later I/O waits for the resume. The
//! target's QoS limits and iostat counters see that I/O likewise. An
//! initiator exposing its namespace directly reads and writes the backing
//! file itself, and connects go on while paused: neither is held, where
//! SPDK would hold both.
//!
//! `nvmf_subsystem_remove_listener` does what SPDK's does: it pauses the
//! subsystem (the I/O in flight finishes), removes the listener, cuts the
//! connections that came in through it (see [`super::conns`]; their hosts
//! see the path lost, and I/O held meanwhile is not served) and resumes
//! the subsystem. `nvmf_get_subsystems` lists listeners newest first, as
//! SPDK inserts them.

use std::sync::Arc;

use serde_json::{Value, json};
use uuid::Uuid;

use super::conns::{Connections, ListenKey};
use super::io::Gate;
use super::listener::{self, Listener};
use super::params::{
    AddNsParams, AllowAnyHostParams, CreateSubsystemParams, CreateTransportParams,
    GetSubsystemsParams, GetTransportsParams, HostParams, ListenAddressParams, ListenerParams,
    NqnParams, PauseParams, RemoveNsParams, hex_upper, invalid, nqn_is_valid, parse_adrfam,
    parse_hex, printable,
};
use super::wire::DISCOVERY_NQN;
use crate::bdev::registry::{Bdev, Bdevs};
use crate::registry::{Answer, BdevModule, BdevUser, Cx, Family};
use crate::rpc::{ENODEV, OnDecodeError, RpcError, RpcResult, decode, decode_opt};

const TGT_NAME: &str = "nvmf_tgt";
const DEFAULT_SN: &str = "00000000000000000000";
const DEFAULT_MN: &str = "SPDK bdev Controller";
const DEFAULT_MAX_NAMESPACES: u32 = 32;
const DEFAULT_MIN_CNTLID: u16 = 1;
const DEFAULT_MAX_CNTLID: u16 = 0xffef;

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

    pub(crate) fn key(&self) -> ListenKey {
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
    pub connections: Connections,
    pub next_cntlid: u16,
    /// Held closed while paused: I/O through the target waits at it.
    pub gate: Arc<Gate>,
}

#[derive(Debug)]
struct BoundListener {
    key: ListenKey,
    listener: Listener,
    users: usize,
}

#[derive(Debug, Default)]
pub(crate) struct NvmfTarget {
    tcp_transport: bool,
    pub subsystems: Vec<Subsystem>,
    listeners: Vec<BoundListener>,
}

impl NvmfTarget {
    pub(crate) fn subsystem(&self, nqn: &str) -> Option<usize> {
        self.subsystems.iter().position(|s| s.nqn == nqn)
    }

    /// The subsystem a per-subsystem method names, with SPDK's errors: the
    /// target is checked first; an unknown NQN is only named in SPDK's log,
    /// the reply says "Invalid parameters".
    fn named_subsystem(&self, tgt_name: &Option<String>, nqn: &str) -> Result<usize, RpcError> {
        check_tgt(tgt_name)?;
        self.subsystem(nqn).ok_or_else(invalid)
    }
}

fn check_tgt(tgt_name: &Option<String>) -> Result<(), RpcError> {
    match tgt_name.as_deref() {
        None | Some(TGT_NAME) => Ok(()),
        Some(_) => Err(RpcError::internal("Unable to find a target.")),
    }
}

const METHODS: &[&str] = &[
    "nvmf_create_subsystem",
    "nvmf_create_transport",
    "nvmf_delete_subsystem",
    "nvmf_get_subsystems",
    "nvmf_get_transports",
    "nvmf_subsystem_add_host",
    "nvmf_subsystem_add_listener",
    "nvmf_subsystem_add_ns",
    "nvmf_subsystem_allow_any_host",
    "nvmf_subsystem_pause",
    "nvmf_subsystem_remove_host",
    "nvmf_subsystem_remove_listener",
    "nvmf_subsystem_remove_ns",
    "nvmf_subsystem_resume",
];

impl NvmfTarget {
    fn nvmf_create_transport(&mut self, params: Option<Value>) -> RpcResult {
        let p: CreateTransportParams = decode(params, OnDecodeError::InvalidParams)?;
        check_tgt(&p.tgt_name)?;
        if !p.trtype.eq_ignore_ascii_case("tcp") {
            return Err(RpcError::invalid_params_msg(format!(
                "Invalid transport type '{}'",
                p.trtype
            )));
        }
        if self.tcp_transport {
            return Err(RpcError::internal(format!(
                "Transport type '{}' already exists",
                p.trtype
            )));
        }
        self.tcp_transport = true;
        Ok(json!(true))
    }

    fn nvmf_get_transports(&self, params: Option<Value>) -> RpcResult {
        let p: GetTransportsParams = decode_opt(params, OnDecodeError::InvalidParams)?;
        check_tgt(&p.tgt_name)?;
        if let Some(t) = &p.trtype
            && (!t.eq_ignore_ascii_case("tcp") || !self.tcp_transport)
        {
            return Err(RpcError::errno(ENODEV));
        }
        if !self.tcp_transport {
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

    fn nvmf_create_subsystem(&mut self, params: Option<Value>) -> RpcResult {
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
        if p.nqn == DISCOVERY_NQN || !nqn_is_valid(&p.nqn) || self.subsystem(&p.nqn).is_some() {
            return Err(RpcError::internal(format!(
                "Unable to create subsystem {}",
                p.nqn
            )));
        }
        self.subsystems.push(Subsystem {
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
            connections: Connections::default(),
            next_cntlid: min,
            gate: Arc::default(),
        });
        Ok(json!(true))
    }

    /// Answers once the I/O in flight through the target is done; what
    /// comes later waits for the resume.
    fn nvmf_subsystem_pause(&mut self, params: Option<Value>) -> RpcResult {
        let p: PauseParams = decode(params, OnDecodeError::InvalidParams)?;
        let si = self.named_subsystem(&p.tgt_name, &p.nqn)?;
        self.subsystems[si].gate.pause();
        Ok(json!(true))
    }

    /// Decoded as the pause is (SPDK's resume shares its decoders).
    fn nvmf_subsystem_resume(&mut self, params: Option<Value>) -> RpcResult {
        let p: PauseParams = decode(params, OnDecodeError::InvalidParams)?;
        let si = self.named_subsystem(&p.tgt_name, &p.nqn)?;
        self.subsystems[si].gate.resume();
        Ok(json!(true))
    }

    fn nvmf_delete_subsystem(&mut self, params: Option<Value>, bdevs: &mut Bdevs) -> RpcResult {
        let p: NqnParams = decode(params, OnDecodeError::InvalidParams)?;
        check_tgt(&p.tgt_name)?;
        let i = self.subsystem(&p.nqn).ok_or_else(invalid)?;
        let s = self.subsystems.remove(i);
        s.gate.close();
        for l in &s.listeners {
            self.release_listener(&l.key());
        }
        for ns in &s.namespaces {
            unclaim(bdevs, &ns.bdev);
        }
        // Dropping the connections closes them.
        drop(s);
        Ok(json!(true))
    }

    fn nvmf_subsystem_add_ns(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        let p: AddNsParams = decode(params, OnDecodeError::InvalidParams)?;
        let si = self.named_subsystem(&p.tgt_name, &p.nqn)?;
        let ns = p.namespace;
        let nguid = match &ns.nguid {
            Some(s) => Some(parse_hex::<16>(s).ok_or_else(invalid)?),
            None => None,
        };
        let eui64 = match &ns.eui64 {
            Some(s) => Some(u64::from_be_bytes(parse_hex::<8>(s).ok_or_else(invalid)?)),
            None => None,
        };
        let bdev = cx.bdevs.get(&ns.bdev_name).ok_or_else(invalid)?;
        if bdev.claim.is_some() || cx.writes(&bdev.name) {
            return Err(invalid());
        }
        let (bdev_name, bdev_uuid) = (bdev.name.clone(), bdev.uuid);
        let s = &mut self.subsystems[si];
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
        if let Some(b) = cx.bdevs.get_mut(&bdev_name) {
            b.claim = Some("nvmf");
        }
        Ok(json!(nsid))
    }

    fn nvmf_subsystem_remove_ns(&mut self, params: Option<Value>, bdevs: &mut Bdevs) -> RpcResult {
        let p: RemoveNsParams = decode(params, OnDecodeError::InvalidParams)?;
        let si = self.named_subsystem(&p.tgt_name, &p.nqn)?;
        let s = &mut self.subsystems[si];
        let i = s
            .namespaces
            .iter()
            .position(|n| n.nsid == p.nsid)
            .ok_or_else(invalid)?;
        let ns = s.namespaces.remove(i);
        unclaim(bdevs, &ns.bdev);
        Ok(json!(true))
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

    fn acquire_listener(&mut self, key: &ListenKey, cx: &Cx<'_>) -> Result<(), RpcError> {
        if let Some(l) = self.listeners.iter_mut().find(|l| &l.key == key) {
            l.users += 1;
            return Ok(());
        }
        let listener = listener::listen::<Self>(cx.shared(), &key.0, &key.1).map_err(|e| {
            tracing::warn!("cannot listen on {}:{}: {e}", key.0, key.1);
            invalid()
        })?;
        self.listeners.push(BoundListener {
            key: key.clone(),
            listener,
            users: 1,
        });
        Ok(())
    }

    fn release_listener(&mut self, key: &ListenKey) {
        let Some(i) = self.listeners.iter().position(|l| &l.key == key) else {
            return;
        };
        let l = &mut self.listeners[i];
        l.users -= 1;
        if l.users == 0 {
            self.listeners.remove(i).listener.task.abort();
        }
    }

    fn nvmf_subsystem_add_listener(&mut self, params: Option<Value>, cx: &Cx<'_>) -> RpcResult {
        let p: ListenerParams = decode(params, OnDecodeError::InvalidParams)?;
        let si = self.named_subsystem(&p.tgt_name, &p.nqn)?;
        let addr = Self::listen_addr(&p.listen_address)?;
        if !self.tcp_transport {
            return Err(invalid());
        }
        if self.subsystems[si]
            .listeners
            .iter()
            .any(|l| l.key() == addr.key())
        {
            return Err(invalid());
        }
        self.acquire_listener(&addr.key(), cx)?;
        self.subsystems[si].listeners.insert(0, addr);
        Ok(json!(true))
    }

    fn nvmf_subsystem_remove_listener(&mut self, params: Option<Value>) -> RpcResult {
        let p: ListenerParams = decode(params, OnDecodeError::InvalidParams)?;
        let si = self.named_subsystem(&p.tgt_name, &p.nqn)?;
        let addr = Self::listen_addr(&p.listen_address)?;
        let s = &mut self.subsystems[si];
        let i = s
            .listeners
            .iter()
            .position(|l| l.key() == addr.key())
            .ok_or_else(invalid)?;
        s.gate.pause();
        s.listeners.remove(i);
        s.connections.cut_listener(&addr.key());
        s.gate.resume();
        self.release_listener(&addr.key());
        Ok(json!(true))
    }

    fn nvmf_subsystem_add_host(&mut self, params: Option<Value>) -> RpcResult {
        let p: HostParams = decode(params, OnDecodeError::InvalidParams)?;
        let si = self.named_subsystem(&p.tgt_name, &p.nqn)?;
        let s = &mut self.subsystems[si];
        if s.hosts.contains(&p.host) {
            // spdk_nvmf_subsystem_add_host_ext's -EINVAL, reported generically.
            return Err(RpcError::internal("Internal error"));
        }
        s.hosts.push(p.host);
        Ok(json!(true))
    }

    fn nvmf_subsystem_remove_host(&mut self, params: Option<Value>) -> RpcResult {
        let p: HostParams = decode(params, OnDecodeError::InvalidParams)?;
        let si = self.named_subsystem(&p.tgt_name, &p.nqn)?;
        let s = &mut self.subsystems[si];
        if !s.hosts.contains(&p.host) {
            // spdk_nvmf_subsystem_remove_host's -ENOENT, reported generically.
            return Err(RpcError::internal("Internal error"));
        }
        s.hosts.retain(|h| *h != p.host);
        // A removed host loses its connections.
        s.connections.drop_hostnqn(&p.host);
        Ok(json!(true))
    }

    fn nvmf_subsystem_allow_any_host(&mut self, params: Option<Value>) -> RpcResult {
        let p: AllowAnyHostParams = decode(params, OnDecodeError::InvalidParams)?;
        let si = self.named_subsystem(&p.tgt_name, &p.nqn)?;
        self.subsystems[si].allow_any_host = p.allow_any_host;
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

    fn nvmf_get_subsystems(&self, params: Option<Value>) -> RpcResult {
        let p: GetSubsystemsParams = decode_opt(params, OnDecodeError::InvalidParams)?;
        check_tgt(&p.tgt_name)?;
        match p.nqn.as_deref() {
            Some(DISCOVERY_NQN) => Ok(json!([Self::discovery_json()])),
            Some(nqn) => {
                let i = self.subsystem(nqn).ok_or(RpcError::errno(ENODEV))?;
                Ok(json!([self.subsystem_json(&self.subsystems[i])]))
            }
            None => {
                let mut all = vec![Self::discovery_json()];
                all.extend(self.subsystems.iter().map(|s| self.subsystem_json(s)));
                Ok(Value::Array(all))
            }
        }
    }
}

impl Family for NvmfTarget {
    fn methods(&self) -> Vec<&'static str> {
        METHODS.to_vec()
    }

    fn call(&mut self, method: &str, params: Option<Value>, cx: &mut Cx<'_>) -> Answer {
        match method {
            "nvmf_create_transport" => self.nvmf_create_transport(params),
            "nvmf_get_transports" => self.nvmf_get_transports(params),
            "nvmf_create_subsystem" => self.nvmf_create_subsystem(params),
            "nvmf_delete_subsystem" => self.nvmf_delete_subsystem(params, cx.bdevs),
            "nvmf_get_subsystems" => self.nvmf_get_subsystems(params),
            "nvmf_subsystem_add_ns" => self.nvmf_subsystem_add_ns(params, cx),
            "nvmf_subsystem_remove_ns" => self.nvmf_subsystem_remove_ns(params, cx.bdevs),
            "nvmf_subsystem_add_listener" => self.nvmf_subsystem_add_listener(params, cx),
            "nvmf_subsystem_remove_listener" => self.nvmf_subsystem_remove_listener(params),
            "nvmf_subsystem_add_host" => self.nvmf_subsystem_add_host(params),
            "nvmf_subsystem_remove_host" => self.nvmf_subsystem_remove_host(params),
            "nvmf_subsystem_allow_any_host" => self.nvmf_subsystem_allow_any_host(params),
            "nvmf_subsystem_pause" => self.nvmf_subsystem_pause(params),
            "nvmf_subsystem_resume" => self.nvmf_subsystem_resume(params),
            _ => Err(RpcError::method_not_found()),
        }
        .map(Into::into)
    }

    /// Stops every listener.
    fn shutdown(&mut self) {
        for l in self.listeners.drain(..) {
            l.listener.task.abort();
        }
        // I/O connections end too, held I/O fails.
        for s in self.subsystems.drain(..) {
            s.gate.close();
        }
    }
}

impl BdevModule for NvmfTarget {}

impl BdevUser for NvmfTarget {
    /// A bdev is going away: namespaces using it are removed (hot remove).
    fn release(&mut self, bdev: &Bdev, _bdevs: &mut Bdevs) {
        for s in &mut self.subsystems {
            s.namespaces.retain(|n| n.bdev != bdev.name);
        }
    }

    /// The target's poll group holds a channel of every namespace's bdev
    /// (one poll group: SPDK has one per core, the tests' `spdk_tgt` one core).
    fn io_channel(&self, bdev: &str) -> Option<&'static str> {
        self.subsystems
            .iter()
            .flat_map(|s| &s.namespaces)
            .any(|n| n.bdev == bdev)
            .then_some("nvmf_tgt_poll_group_000")
    }
}

/// Frees a namespace's bdev of the target's claim.
fn unclaim(bdevs: &mut Bdevs, bdev: &str) {
    if let Some(b) = bdevs.get_mut(bdev)
        && b.claim == Some("nvmf")
    {
        b.claim = None;
    }
}
