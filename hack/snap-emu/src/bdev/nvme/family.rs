//! The NVMe-oF initiator's family: its methods, the registration of an
//! attached controller (a new name with its namespaces' bdevs, another
//! path under a name, or an alternate trid), and what the bdev layer asks
//! of its bdevs (`driver_specific`, the data path's I/O through the paths).

use std::sync::{Arc, Mutex, PoisonError};

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use uuid::Uuid;

use super::attach::{self, AttachParams, Mode, Plan};
use super::ctrlr::{NvmeBdev, NvmeBdevCtrlr, NvmeController};
use super::detach::detach;
use super::monitor::{self, Reconnect};
use super::multipath;
use super::options::{self, NvmeOpts};
use crate::bdev::registry::{Bdev, BdevKind, Bdevs, NvmeNsInfo};
use crate::datapath::paths::{Paths, Policy};
use crate::datapath::remote::Remote;
use crate::datapath::volume::{Backing, Volume};
use crate::nvmf::wire::Accepted;
use crate::registry::{Answer, BdevModule, BdevUser, Cx, Family, Reply};
use crate::rpc::{
    EALREADY, EEXIST, EINVAL, ENODEV, OnDecodeError, RpcError, RpcResult, decode, decode_opt,
};

#[derive(Debug)]
pub(crate) struct NvmeInitiator {
    /// Every controller name, in the order they were made.
    names: Vec<NvmeBdevCtrlr>,
    /// `nqn.2014-08.org.nvmexpress:uuid:<uuid>`, fixed per process like SPDK's.
    default_hostnqn: String,
    /// `bdev_nvme_set_options`', which each attach takes as it starts.
    opts: NvmeOpts,
}

const METHODS: &[&str] = &[
    "bdev_nvme_attach_controller",
    "bdev_nvme_detach_controller",
    "bdev_nvme_get_controllers",
    "bdev_nvme_get_io_paths",
    "bdev_nvme_set_multipath_policy",
    "bdev_nvme_set_options",
];

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct GetControllersParams {
    name: Option<String>,
}

impl NvmeInitiator {
    pub(crate) fn new() -> Self {
        Self {
            names: Vec::new(),
            default_hostnqn: format!("nqn.2014-08.org.nvmexpress:uuid:{}", Uuid::new_v4()),
            opts: NvmeOpts::default(),
        }
    }

    fn get(&self, name: &str) -> Option<&NvmeBdevCtrlr> {
        self.names.iter().find(|n| n.name == name)
    }

    fn bdev_nvme_attach_controller(&self, params: Option<Value>, cx: &Cx<'_>) -> Answer {
        let p: AttachParams = decode(params, OnDecodeError::DecodeFailed)?;
        let plan = attach::plan(&p, &self.names, &self.default_hostnqn, &self.opts)?;
        let shared = cx
            .shared()
            .upgrade()
            .ok_or_else(|| RpcError::internal("shutting down"))?;
        // Connect without the lock (the target may be this very process),
        // then register under it.
        Ok(Reply::Later(Box::pin(async move {
            let (stream, accepted) = attach::connect(&plan).await?;
            let mut state = shared.state.lock().await;
            let (nvme, cx) = state
                .family::<NvmeInitiator>()
                .expect("bdev_nvme_attach_controller is answered by NvmeInitiator");
            nvme.finish_attach(plan, stream, accepted, cx.bdevs)
        })))
    }

    fn finish_attach(
        &mut self,
        plan: Plan,
        stream: TcpStream,
        accepted: Accepted,
        bdevs: &mut Bdevs,
    ) -> RpcResult {
        // Another attach may have finished meanwhile.
        attach::check_name(&plan.path, &self.names, false)?;
        attach::check_trid(&plan.path, &self.names)?;
        let Some(i) = self.names.iter().position(|n| n.name == plan.path.name) else {
            let mut n = NvmeBdevCtrlr {
                name: plan.path.name.clone(),
                ctrlrs: vec![],
                bdevs: vec![],
                paths: Arc::new(Paths::default()),
            };
            let names = add_path(&mut n, plan, stream, accepted, bdevs)?;
            self.names.push(n);
            return Ok(names);
        };
        let n = &mut self.names[i];
        if plan.path.mode == Mode::Multipath {
            return add_path(n, plan, stream, accepted, bdevs);
        }
        // Failover: the first controller gains an alternate trid; this
        // connection only checked it (`bdev_nvme_add_secondary_trid`).
        drop(stream);
        // A name goes with its last controller, so it has a first one.
        let (_, first) = n.first().ok_or(RpcError::errno(ENODEV))?;
        if first.trids.contains(&plan.path.trid) {
            return Err(RpcError::errno(EALREADY));
        }
        n.paths
            .update(first.id, |p| p.trids.push(plan.path.trid.clone()));
        Ok(json!([]))
    }

    fn bdev_nvme_detach_controller(&mut self, params: Option<Value>, cx: &mut Cx<'_>) -> RpcResult {
        if let Some(gone) = detach(&mut self.names, params)? {
            for b in &gone.bdevs {
                cx.unregister(self, &b.name);
            }
        }
        Ok(json!(true))
    }

    fn bdev_nvme_get_controllers(&self, params: Option<Value>) -> RpcResult {
        let p: GetControllersParams = decode_opt(params, OnDecodeError::DecodeFailed)?;
        let names: Vec<&NvmeBdevCtrlr> = match &p.name {
            Some(n) => vec![self.get(n).ok_or_else(|| {
                // SPDK really answers with a positive EINVAL here.
                RpcError::new(EINVAL, format!("Controller {n} does not exist"))
            })?],
            None => self.names.iter().collect(),
        };
        Ok(Value::Array(
            names.into_iter().map(NvmeBdevCtrlr::json).collect(),
        ))
    }

    /// Refused while any controller name exists (SPDK's
    /// `g_nvme_bdev_ctrlrs`), so it belongs to the start-up configuration.
    fn bdev_nvme_set_options(&mut self, params: Option<Value>) -> RpcResult {
        self.opts = options::set_options(&self.opts, params, !self.names.is_empty())?;
        Ok(json!(true))
    }

    fn bdev_nvme_set_multipath_policy(&self, params: Option<Value>, cx: &Cx<'_>) -> RpcResult {
        let (n, bdev, policy) = multipath::set_multipath_policy(&self.names, params, cx)?;
        *bdev.policy.lock().unwrap_or_else(PoisonError::into_inner) = policy;
        // Its channels drop the path they cached, as SPDK's do.
        n.paths.touch();
        Ok(json!(true))
    }

    /// The bdev `bdev` is one of, with its name.
    fn owner(&self, bdev: &Bdev) -> Option<(&NvmeBdevCtrlr, &NvmeBdev)> {
        let BdevKind::Nvme(info) = &bdev.kind else {
            return None;
        };
        let n = self.get(&info.ctrlr)?;
        Some((n, n.bdev(&bdev.name)?))
    }
}

/// Registers a connected controller as a path of `n`, with a bdev for each
/// namespace it shows that `n` has none for yet; the names of all of them,
/// as `nvme_ctrlr_populate_namespaces_done` reports.
fn add_path(
    n: &mut NvmeBdevCtrlr,
    plan: Plan,
    stream: TcpStream,
    accepted: Accepted,
    bdevs: &mut Bdevs,
) -> RpcResult {
    // `bdev_nvme_check_multipath`: one subsystem's controllers have distinct ids.
    if n.with_paths()
        .iter()
        .any(|(_, p)| p.cntlid == accepted.cntlid)
    {
        return Err(RpcError::errno(EINVAL));
    }
    let mut names = vec![];
    for ns in accepted.namespaces.iter().take(plan.max_bdevs as usize) {
        if let Some(b) = n.bdevs.iter().find(|b| b.nsid == ns.nsid) {
            names.push(b.name.clone());
            continue;
        }
        let name = format!("{}n{}", n.name, ns.nsid);
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
                ctrlr: n.name.clone(),
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
            Ok(()) => {
                n.bdevs.push(NvmeBdev {
                    name: name.clone(),
                    nsid: ns.nsid,
                    policy: Arc::new(Mutex::new(Policy::default())),
                });
                names.push(name);
            }
            // SPDK logs and skips a namespace whose bdev cannot register.
            Err(e) if e.code == -EEXIST => {
                tracing::warn!("namespace bdev {name} clashes with an existing bdev");
            }
            Err(e) => return Err(e),
        }
    }
    let want = plan.path;
    let id = n.paths.add(
        vec![want.trid],
        plan.resilience,
        plan.ack_timeout,
        accepted.cntlid,
    );
    let how = Reconnect {
        paths: Arc::clone(&n.paths),
        id,
        hostnqn: want.hostnqn.clone(),
        timeout: plan.timeout,
        ack_timeout: plan.ack_timeout,
        keep_alive: plan.keep_alive,
    };
    n.ctrlrs.push(NvmeController {
        id,
        hostnqn: want.hostnqn,
        hostaddr: want.hostaddr,
        hostsvcid: want.hostsvcid,
        serial_number: accepted.serial_number,
        model_number: accepted.model_number,
        monitor: monitor::spawn(how, stream),
    });
    Ok(json!(names))
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
            "bdev_nvme_get_io_paths" => {
                multipath::get_io_paths(&self.names, params, cx).map(Into::into)
            }
            "bdev_nvme_set_multipath_policy" => self
                .bdev_nvme_set_multipath_policy(params, cx)
                .map(Into::into),
            "bdev_nvme_set_options" => self.bdev_nvme_set_options(params).map(Into::into),
            _ => Err(RpcError::method_not_found()),
        }
    }

    /// Dropping the controllers closes their connections to the targets.
    fn shutdown(&mut self) {
        self.names.clear();
    }
}

impl BdevModule for NvmeInitiator {
    fn dump(&self, bdev: &Bdev) -> Option<Value> {
        if !matches!(bdev.kind, BdevKind::Nvme(_)) {
            return None;
        }
        Some(match self.owner(bdev) {
            Some((n, b)) => n.dump(b),
            None => json!({}),
        })
    }

    /// The I/O through the data path of an NVMe-oF namespace, or of a
    /// crypto vbdev whose bytes are one's, goes to its target over the
    /// name's paths (see [`crate::datapath::remote`]), as SPDK's goes over
    /// the fabric.
    fn io_path(&self, bdev: &Bdev, bdevs: &Bdevs, volume: &mut Volume) -> Result<(), RpcError> {
        let Some((n, b)) = self.owner(bdevs.bytes_of(bdev)) else {
            return Ok(());
        };
        let Some((c, _)) = n.first() else {
            return Ok(());
        };
        volume.remote = Some(Arc::new(Remote::new(
            c.hostnqn.clone(),
            b.nsid,
            Arc::clone(&n.paths),
            Arc::clone(&b.policy),
        )));
        Ok(())
    }
}

impl BdevUser for NvmeInitiator {}
