//! `bdev_nvme_attach_controller` before its answer: the parameters, the
//! checks SPDK makes before connecting (`rpc_bdev_nvme_attach_controller`,
//! then `spdk_bdev_nvme_create`), in its order and with its errors, what
//! the attach will do under a name that exists (`multipath`: "multipath"
//! adds a controller, a path; "failover", the default, adds an alternate
//! trid to the first controller; "disable" refuses), and the connection.

use std::time::Duration;

use serde::Deserialize;
use tokio::net::TcpStream;

use super::ctrlr::NvmeBdevCtrlr;
use super::options::{NvmeOpts, resilience_of};
use crate::datapath::paths::{AckTimeout, Resilience, Trid};
use crate::nvmf::wire::{self, Accepted, ConnectError, ConnectRequest, DISCOVERY_NQN, adrfam_name};
use crate::rpc::{EALREADY, EEXIST, EINVAL, EIO, ENODEV, RpcError};

const DEFAULT_MAX_BDEVS: u32 = 128;

/// `bdev_nvme_decode_multipath`: any other string fails the decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Mode {
    Failover,
    Multipath,
    Disable,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Path tuning and security options are accepted, not modelled.
pub(super) struct AttachParams {
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
    multipath: Option<Mode>,
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

/// The controller an attach asks for: its name and path.
#[derive(Debug)]
pub(super) struct NewPath {
    pub name: String,
    pub trid: Trid,
    pub hostnqn: String,
    pub hostaddr: String,
    pub hostsvcid: String,
    /// Under a name that exists: a path of its own (or an alternate trid).
    pub mode: Mode,
}

/// What an attach will do, decided under the lock before connecting.
#[derive(Debug)]
pub(super) struct Plan {
    pub path: NewPath,
    pub timeout: Duration,
    pub max_bdevs: u32,
    pub resilience: Resilience,
    /// `bdev_nvme_set_options`' as the attach starts (SPDK copies them
    /// into the controller's options), and the keep-alive's period.
    pub ack_timeout: AckTimeout,
    pub keep_alive: Option<Duration>,
}

/// `bdev_nvme_check_io_error_resiliency_params`: SPDK refuses (-EINVAL,
/// before connecting) what cannot be a reconnect policy. An attach's
/// policy is its parameters', else `bdev_nvme_set_options`'
/// (`spdk_bdev_nvme_get_default_ctrlr_opts`).
fn resilience(p: &AttachParams, opts: &NvmeOpts) -> Result<Resilience, RpcError> {
    resilience_of(
        p.ctrlr_loss_timeout_sec
            .unwrap_or(opts.ctrlr_loss_timeout_sec),
        p.reconnect_delay_sec.unwrap_or(opts.reconnect_delay_sec),
        p.fast_io_fail_timeout_sec
            .unwrap_or(opts.fast_io_fail_timeout_sec),
    )
}

pub(super) fn plan(
    p: &AttachParams,
    names: &[NvmeBdevCtrlr],
    default_hostnqn: &str,
    opts: &NvmeOpts,
) -> Result<Plan, RpcError> {
    if p.max_bdevs == Some(0) {
        return Err(RpcError::new(-EINVAL, "max_bdevs cannot be zero"));
    }
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
    let path = NewPath {
        name: p.name.clone(),
        trid: Trid {
            adrfam,
            traddr: p.traddr.clone(),
            trsvcid: p.trsvcid.clone().unwrap_or_default(),
            subnqn: p.subnqn.clone().unwrap_or_else(|| DISCOVERY_NQN.to_owned()),
        },
        hostnqn: p
            .hostnqn
            .clone()
            .unwrap_or_else(|| default_hostnqn.to_owned()),
        hostaddr: p.hostaddr.clone().unwrap_or_default(),
        hostsvcid: p.hostsvcid.clone().unwrap_or_default(),
        mode: p.multipath.unwrap_or(Mode::Failover),
    };
    let pi = p.prchk_reftag == Some(true) || p.prchk_guard == Some(true);
    check_name(&path, names, pi)?;
    if p.num_io_queues.is_some_and(|n| n == 0 || n > 65536) {
        return Err(RpcError::new(
            -EINVAL,
            "num_io_queues out of bounds, min: 1 max: 65536",
        ));
    }
    check_trid(&path, names)?;
    let resilience = resilience(p, opts)?;
    if !p.trtype.eq_ignore_ascii_case("tcp") {
        // Only TCP reaches other emulators; anything else finds no device.
        return Err(RpcError::errno(ENODEV));
    }
    Ok(Plan {
        path,
        timeout: match p.fabrics_connect_timeout_us {
            Some(us) if us > 0 => {
                Duration::from_micros(us).clamp(Duration::from_millis(1), Duration::from_secs(60))
            }
            _ => wire::CONNECT_TIMEOUT,
        },
        max_bdevs: p.max_bdevs.unwrap_or(DEFAULT_MAX_BDEVS),
        resilience,
        ack_timeout: opts.ack_timeout(),
        keep_alive: opts.keep_alive(),
    })
}

/// A name that exists: what a new path must share with its first
/// controller. Also checked again before registering, since another
/// attach may have finished meanwhile.
pub(super) fn check_name(
    want: &NewPath,
    names: &[NvmeBdevCtrlr],
    pi: bool,
) -> Result<(), RpcError> {
    let Some((first, path)) = names
        .iter()
        .find(|n| n.name == want.name)
        .and_then(NvmeBdevCtrlr::first)
    else {
        return Ok(());
    };
    let name = &want.name;
    if want.mode == Mode::Disable {
        return Err(RpcError::new(
            -EALREADY,
            format!("A controller named {name} already exists and multipath is disabled"),
        ));
    }
    let trid = path.trid();
    if trid.traddr == want.trid.traddr
        && trid.trsvcid == want.trid.trsvcid
        && first.hostaddr == want.hostaddr
        && first.hostsvcid == want.hostsvcid
    {
        return Err(RpcError::new(
            -EALREADY,
            format!("A controller named {name} already exists with the specified network path"),
        ));
    }
    if trid.subnqn != want.trid.subnqn {
        return Err(RpcError::new(
            -EINVAL,
            format!(
                "A controller named {name} already exists, but uses a different subnqn ({})",
                trid.subnqn
            ),
        ));
    }
    if first.hostnqn != want.hostnqn {
        return Err(RpcError::new(
            -EINVAL,
            format!(
                "A controller named {name} already exists, but uses a different hostnqn ({})",
                first.hostnqn
            ),
        ));
    }
    if pi {
        return Err(RpcError::new(
            -EINVAL,
            format!(
                "A controller named {name} already exists. To add a path, do not specify PI options."
            ),
        ));
    }
    Ok(())
}

/// One controller per trid and host, whatever its name
/// (`spdk_bdev_nvme_create`'s first check, on each controller's trid in use).
pub(super) fn check_trid(want: &NewPath, names: &[NvmeBdevCtrlr]) -> Result<(), RpcError> {
    let taken = names
        .iter()
        .flat_map(|n| n.with_paths())
        .any(|(c, p)| *p.trid() == want.trid && c.hostnqn == want.hostnqn);
    if taken {
        return Err(RpcError::errno(EEXIST));
    }
    Ok(())
}

/// Connects and shakes hands, as SPDK's probe does before the controller
/// is registered (or, for an alternate trid, checked and let go).
pub(super) async fn connect(plan: &Plan) -> Result<(TcpStream, Accepted), RpcError> {
    let want = &plan.path;
    let req = ConnectRequest {
        proto: wire::PROTO.into(),
        subnqn: want.trid.subnqn.clone(),
        hostnqn: want.hostnqn.clone(),
    };
    let (traddr, trsvcid) = (&want.trid.traddr, &want.trid.trsvcid);
    match wire::connect(traddr, trsvcid, req, plan.timeout, plan.ack_timeout).await {
        Ok(connected) => Ok(connected),
        Err(ConnectError::Unreachable) => Err(RpcError::errno(ENODEV)),
        Err(ConnectError::Rejected(why)) => {
            tracing::info!("attach {} refused: {why}", want.name);
            Err(RpcError::errno(EIO))
        }
    }
}
