//! The NVMe-oF initiator (`bdev_nvme_*`): attaching a remote subsystem turns
//! each of its namespaces into a `<name>n<nsid>` bdev backed by the target's
//! bytes (see [`crate::nvmf::wire`] for what travels over the wire), whose
//! I/O through the data path goes to the target.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use uuid::Uuid;

use super::registry::{Bdev, BdevKind, Bdevs, NvmeNsInfo};
use crate::datapath::remote::{Link, Remote, Resilience};
use crate::datapath::volume::{Backing, Volume};
use crate::nvmf::wire::{self, Accepted, ConnectError, ConnectRequest, DISCOVERY_NQN, adrfam_name};
use crate::registry::{Answer, BdevModule, BdevUser, Cx, Family, Reply, Shared};
use crate::rpc::{
    EALREADY, EEXIST, EINVAL, EIO, ENODEV, OnDecodeError, RpcError, RpcResult, decode, decode_opt,
};

const DEFAULT_MAX_BDEVS: u32 = 128;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Trid {
    pub adrfam: &'static str,
    pub traddr: String,
    pub trsvcid: String,
    pub subnqn: String,
}

impl Trid {
    fn json(&self) -> Value {
        json!({
            "trtype": "TCP",
            "adrfam": self.adrfam,
            "traddr": self.traddr,
            "trsvcid": self.trsvcid,
            "subnqn": self.subnqn
        })
    }
}

#[derive(Debug)]
pub(crate) struct NvmeController {
    pub name: String,
    pub trid: Trid,
    pub hostnqn: String,
    pub hostaddr: String,
    pub hostsvcid: String,
    pub cntlid: u16,
    pub serial_number: String,
    pub model_number: String,
    pub bdevs: Vec<String>,
    /// What its namespaces' I/O shares with it.
    link: Arc<Link>,
    /// Dropping it closes the connection to the target.
    _conn: oneshot::Sender<()>,
}

impl Drop for NvmeController {
    /// I/O waiting for a lost connection gives up with the controller.
    fn drop(&mut self) {
        self.link.detach();
    }
}

#[derive(Debug)]
pub(crate) struct NvmeInitiator {
    ctrls: Vec<NvmeController>,
    /// `nqn.2014-08.org.nvmexpress:uuid:<uuid>`, fixed per process like SPDK's.
    default_hostnqn: String,
}

const METHODS: &[&str] = &[
    "bdev_nvme_attach_controller",
    "bdev_nvme_detach_controller",
    "bdev_nvme_get_controllers",
];

impl NvmeInitiator {
    pub(crate) fn new() -> Self {
        Self {
            ctrls: Vec::new(),
            default_hostnqn: format!("nqn.2014-08.org.nvmexpress:uuid:{}", Uuid::new_v4()),
        }
    }

    fn get(&self, name: &str) -> Option<&NvmeController> {
        self.ctrls.iter().find(|c| c.name == name)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Path tuning and security options are accepted, not modelled.
struct AttachParams {
    name: String,
    trtype: String,
    traddr: String,
    adrfam: Option<String>,
    trsvcid: Option<String>,
    priority: Option<String>,
    subnqn: Option<String>,
    hostnqn: Option<String>,
    hostaddr: Option<String>,
    hostsvcid: Option<String>,
    prchk_reftag: Option<bool>,
    prchk_guard: Option<bool>,
    hdgst: Option<bool>,
    ddgst: Option<bool>,
    fabrics_connect_timeout_us: Option<u64>,
    multipath: Option<String>,
    num_io_queues: Option<u32>,
    ctrlr_loss_timeout_sec: Option<i32>,
    reconnect_delay_sec: Option<u32>,
    fast_io_fail_timeout_sec: Option<u32>,
    psk: Option<String>,
    max_bdevs: Option<u32>,
    dhchap_key: Option<String>,
    dhchap_ctrlr_key: Option<String>,
    allow_unrecognized_csi: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DetachParams {
    name: String,
    trtype: Option<String>,
    traddr: Option<String>,
    adrfam: Option<String>,
    trsvcid: Option<String>,
    subnqn: Option<String>,
    hostaddr: Option<String>,
    hostsvcid: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct GetControllersParams {
    name: Option<String>,
}

/// What an attach will do, decided under the lock before connecting.
#[derive(Debug)]
struct Plan {
    name: String,
    trid: Trid,
    hostnqn: String,
    hostaddr: String,
    hostsvcid: String,
    timeout: Duration,
    max_bdevs: u32,
    resilience: Resilience,
}

/// `bdev_nvme_check_io_error_resiliency_params`: SPDK refuses (-EINVAL,
/// before connecting) what cannot be a reconnect policy.
fn resilience(p: &AttachParams) -> Result<Resilience, RpcError> {
    let loss = p.ctrlr_loss_timeout_sec.unwrap_or(0);
    let delay = p.reconnect_delay_sec.unwrap_or(0);
    let fast = p.fast_io_fail_timeout_sec.unwrap_or(0);
    let valid = match loss {
        ..-1 => false,
        -1 => delay != 0 && (fast == 0 || fast >= delay),
        0 => delay == 0 && fast == 0,
        _ => {
            let loss = loss.unsigned_abs();
            delay != 0 && delay <= loss && (fast == 0 || (fast >= delay && fast <= loss))
        }
    };
    if !valid {
        return Err(RpcError::errno(EINVAL));
    }
    let secs = |s: u32| Duration::from_secs(u64::from(s));
    Ok(Resilience {
        reconnect_delay: secs(delay),
        ctrlr_loss: u32::try_from(loss).ok().map(secs),
        fast_io_fail: (fast != 0).then(|| secs(fast)),
    })
}

/// An attach under a name that is taken by a controller on the same path; also
/// what the loser of two concurrent attaches of one name gets.
fn same_path_exists(name: &str) -> RpcError {
    RpcError::new(
        -EALREADY,
        format!("A controller named {name} already exists with the specified network path"),
    )
}

/// The rest of `bdev_nvme_attach_controller`, planned under the lock:
/// connect without it (the target may be this very process), then register
/// under the lock.
async fn attach(shared: Arc<Shared>, plan: Plan) -> RpcResult {
    let req = ConnectRequest {
        proto: wire::PROTO.into(),
        subnqn: plan.trid.subnqn.clone(),
        hostnqn: plan.hostnqn.clone(),
    };
    let connected = wire::connect(&plan.trid.traddr, &plan.trid.trsvcid, req, plan.timeout).await;
    let (stream, accepted) = match connected {
        Ok(c) => c,
        Err(ConnectError::Unreachable) => return Err(RpcError::errno(ENODEV)),
        Err(ConnectError::Rejected(why)) => {
            tracing::info!("attach {} refused: {why}", plan.name);
            return Err(RpcError::errno(EIO));
        }
    };
    let conn = wire::hold_initiator(stream);
    let mut state = shared.state.lock().await;
    let (nvme, cx) = state
        .family::<NvmeInitiator>()
        .expect("bdev_nvme_attach_controller is answered by NvmeInitiator");
    nvme.finish_attach(plan, accepted, conn, cx.bdevs)
}

impl NvmeInitiator {
    fn bdev_nvme_attach_controller(&self, params: Option<Value>, cx: &Cx<'_>) -> Answer {
        let p: AttachParams = decode(params, OnDecodeError::DecodeFailed)?;
        let plan = self.plan_attach(&p)?;
        let shared = cx
            .shared()
            .upgrade()
            .ok_or_else(|| RpcError::internal("shutting down"))?;
        Ok(Reply::Later(Box::pin(attach(shared, plan))))
    }

    fn plan_attach(&self, p: &AttachParams) -> Result<Plan, RpcError> {
        let known = ["pcie", "rdma", "tcp", "fc", "vfiouser", "custom"];
        if !known.contains(&p.trtype.to_ascii_lowercase().as_str()) {
            return Err(RpcError::new(
                -EINVAL,
                format!("Failed to parse trtype: {}", p.trtype),
            ));
        }
        let adrfam = match &p.adrfam {
            Some(a) => adrfam_name(a)
                .ok_or_else(|| RpcError::new(-EINVAL, format!("Failed to parse adrfam: {a}")))?,
            None => "IPv4",
        };
        let trid = Trid {
            adrfam,
            traddr: p.traddr.clone(),
            trsvcid: p.trsvcid.clone().unwrap_or_default(),
            subnqn: p.subnqn.clone().unwrap_or_else(|| DISCOVERY_NQN.to_owned()),
        };
        let hostaddr = p.hostaddr.clone().unwrap_or_default();
        let hostsvcid = p.hostsvcid.clone().unwrap_or_default();
        if let Some(c) = self.get(&p.name) {
            let same_path = c.trid.traddr == trid.traddr
                && c.trid.trsvcid == trid.trsvcid
                && c.hostaddr == hostaddr
                && c.hostsvcid == hostsvcid;
            if same_path {
                return Err(same_path_exists(&p.name));
            }
            // A second path to one controller (multipath) is not emulated.
            return Err(RpcError::new(
                -EALREADY,
                format!(
                    "A controller named {} already exists and multipath is disabled",
                    p.name
                ),
            ));
        }
        let hostnqn = p
            .hostnqn
            .clone()
            .unwrap_or_else(|| self.default_hostnqn.clone());
        // One controller per path and host: the same one under another name
        // is refused before connecting (`spdk_bdev_nvme_create`).
        if self
            .ctrls
            .iter()
            .any(|c| c.trid == trid && c.hostnqn == hostnqn)
        {
            return Err(RpcError::errno(EEXIST));
        }
        let resilience = resilience(p)?;
        if !p.trtype.eq_ignore_ascii_case("tcp") {
            // Only TCP reaches other emulators; anything else finds no device.
            return Err(RpcError::errno(ENODEV));
        }
        let timeout = match p.fabrics_connect_timeout_us {
            Some(us) if us > 0 => {
                Duration::from_micros(us).clamp(Duration::from_millis(1), Duration::from_secs(60))
            }
            _ => wire::CONNECT_TIMEOUT,
        };
        Ok(Plan {
            name: p.name.clone(),
            trid,
            hostnqn,
            hostaddr,
            hostsvcid,
            timeout,
            max_bdevs: p.max_bdevs.unwrap_or(DEFAULT_MAX_BDEVS),
            resilience,
        })
    }

    fn finish_attach(
        &mut self,
        plan: Plan,
        accepted: Accepted,
        conn: oneshot::Sender<()>,
        bdevs: &mut Bdevs,
    ) -> RpcResult {
        if self.get(&plan.name).is_some() {
            return Err(same_path_exists(&plan.name));
        }
        let mut names = vec![];
        for ns in accepted.namespaces.iter().take(plan.max_bdevs as usize) {
            let name = format!("{}n{}", plan.name, ns.nsid);
            let uuid = Uuid::parse_str(&ns.uuid).unwrap_or_else(|_| Uuid::new_v4());
            let bdev = Bdev {
                name: name.clone(),
                aliases: vec![],
                uuid,
                product_name: "NVMe disk",
                block_size: ns.block_size,
                num_blocks: ns.num_blocks,
                claim: None,
                io: Default::default(),
                kind: BdevKind::Nvme(NvmeNsInfo {
                    ctrlr: plan.name.clone(),
                    nsid: ns.nsid,
                    backing: Backing {
                        path: ns.path.clone(),
                        offset: ns.offset,
                        size: ns.size,
                        read_only: ns.read_only,
                    },
                    unmap: ns.unmap,
                    copy: ns.copy,
                }),
            };
            match bdevs.insert(bdev) {
                Ok(()) => names.push(name),
                // SPDK logs and skips a namespace whose bdev cannot register.
                Err(e) if e.code == -EEXIST => {
                    tracing::warn!("namespace bdev {name} clashes with an existing bdev");
                }
                Err(e) => return Err(e),
            }
        }
        self.ctrls.push(NvmeController {
            name: plan.name,
            trid: plan.trid,
            hostnqn: plan.hostnqn,
            hostaddr: plan.hostaddr,
            hostsvcid: plan.hostsvcid,
            cntlid: accepted.cntlid,
            serial_number: accepted.serial_number,
            model_number: accepted.model_number,
            bdevs: names.clone(),
            link: Link::new(plan.resilience),
            _conn: conn,
        });
        Ok(json!(names))
    }

    fn bdev_nvme_detach_controller(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        let p: DetachParams = decode(params, OnDecodeError::DecodeFailed)?;
        let c = self.get(&p.name).ok_or(RpcError::errno(ENODEV))?;
        let mismatch = |want: &Option<String>, have: &str| {
            want.as_deref()
                .is_some_and(|w| !w.eq_ignore_ascii_case(have))
        };
        if mismatch(&p.trtype, "tcp")
            || mismatch(&p.traddr, &c.trid.traddr)
            || mismatch(&p.adrfam, c.trid.adrfam)
            || mismatch(&p.trsvcid, &c.trid.trsvcid)
            || mismatch(&p.subnqn, &c.trid.subnqn)
            || mismatch(&p.hostaddr, &c.hostaddr)
            || mismatch(&p.hostsvcid, &c.hostsvcid)
        {
            return Err(RpcError::errno(ENODEV));
        }
        let Some(i) = self.ctrls.iter().position(|c| c.name == p.name) else {
            return Err(RpcError::errno(ENODEV));
        };
        let ctrl = self.ctrls.remove(i);
        for b in &ctrl.bdevs {
            cx.unregister(self, b);
        }
        // Dropping the controller closes its connection to the target.
        drop(ctrl);
        Ok(json!(true))
    }

    fn bdev_nvme_get_controllers(&self, params: Option<Value>) -> RpcResult {
        let p: GetControllersParams = decode_opt(params, OnDecodeError::DecodeFailed)?;
        let ctrls: Vec<&NvmeController> = match &p.name {
            Some(n) => vec![self.get(n).ok_or_else(|| {
                // SPDK really answers with a positive EINVAL here.
                RpcError::new(EINVAL, format!("Controller {n} does not exist"))
            })?],
            None => self.ctrls.iter().collect(),
        };
        Ok(Value::Array(
            ctrls
                .into_iter()
                .map(|c| {
                    json!({
                        "name": c.name,
                        "ctrlrs": [{
                            "state": "enabled",
                            "trid": c.trid.json(),
                            "cntlid": c.cntlid,
                            "host": {"nqn": c.hostnqn, "addr": c.hostaddr, "svcid": c.hostsvcid}
                        }]
                    })
                })
                .collect(),
        ))
    }
}

impl Family for NvmeInitiator {
    fn methods(&self) -> Vec<&'static str> {
        METHODS.to_vec()
    }

    fn call(&mut self, method: &str, params: Option<Value>, cx: &mut Cx<'_>) -> Answer {
        match method {
            "bdev_nvme_attach_controller" => self.bdev_nvme_attach_controller(params, cx),
            "bdev_nvme_detach_controller" => {
                self.bdev_nvme_detach_controller(params, cx).map(Into::into)
            }
            "bdev_nvme_get_controllers" => self.bdev_nvme_get_controllers(params).map(Into::into),
            _ => Err(RpcError::method_not_found()),
        }
    }

    /// Dropping the controllers closes their connections to the targets.
    fn shutdown(&mut self) {
        self.ctrls.clear();
    }
}

impl BdevModule for NvmeInitiator {
    fn dump(&self, bdev: &Bdev) -> Option<Value> {
        let BdevKind::Nvme(info) = &bdev.kind else {
            return None;
        };
        let Some(c) = self.get(&info.ctrlr) else {
            return Some(json!({}));
        };
        Some(json!({
            "nvme": [{
                "trid": c.trid.json(),
                "ctrlr_data": {
                    "cntlid": c.cntlid,
                    "vendor_id": "0x8086",
                    "model_number": c.model_number,
                    "serial_number": c.serial_number,
                    "firmware_revision": "24.09",
                    "subnqn": c.trid.subnqn,
                    "oacs": {"security": 0, "format": 0, "firmware": 0, "ns_manage": 0},
                    "multi_ctrlr": true,
                    "ana_reporting": false
                },
                "vs": {"nvme_version": "1.3"},
                "ns_data": {"id": info.nsid, "can_share": true}
            }],
            "mp_policy": "active_passive"
        }))
    }

    /// The I/O through the data path of an NVMe-oF namespace, or of a
    /// crypto vbdev whose bytes are one's, goes to its target (see
    /// [`crate::datapath::remote`]), as SPDK's goes over the fabric.
    fn io_path(&self, bdev: &Bdev, bdevs: &Bdevs, volume: &mut Volume) -> Result<(), RpcError> {
        let BdevKind::Nvme(info) = &bdevs.bytes_of(bdev).kind else {
            return Ok(());
        };
        let Some(ctrl) = self.get(&info.ctrlr) else {
            return Ok(());
        };
        if let Ok(port) = ctrl.trid.trsvcid.parse() {
            volume.remote = Some(Arc::new(Remote::new(
                (ctrl.trid.traddr.clone(), port),
                ctrl.trid.subnqn.clone(),
                ctrl.hostnqn.clone(),
                info.nsid,
                Arc::clone(&ctrl.link),
            )));
        }
        Ok(())
    }
}

impl BdevUser for NvmeInitiator {}
