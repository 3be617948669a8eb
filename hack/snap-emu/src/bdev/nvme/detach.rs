//! `bdev_nvme_detach_controller` (`bdev_nvme_delete`): without a trid every
//! controller of the name goes; with one (any of trtype, traddr, adrfam,
//! trsvcid, subnqn, hostaddr, hostsvcid), each trid matching it: an
//! alternate is dropped, the one in use fails over to the next alternate,
//! or, the controller's only one, takes the controller (a path) with it.
//! Nothing matching is -ENXIO; an unknown name -ENODEV.

use serde::Deserialize;
use serde_json::Value;

use super::ctrlr::{NvmeBdevCtrlr, NvmeController};
use crate::datapath::paths::Trid;
use crate::nvmf::wire::adrfam_name;
use crate::rpc::{EINVAL, ENODEV, ENXIO, OnDecodeError, RpcError, decode};

/// `SPDK_NVMF_TRSTRING_MAX_LEN`: a longer trtype does not parse.
const TRSTRING_MAX_LEN: usize = 32;

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

/// What `nvme_path_id_compare` compares: the fields given.
struct Wanted {
    trtype: Option<String>,
    traddr: Option<String>,
    adrfam: Option<&'static str>,
    trsvcid: Option<String>,
    subnqn: Option<String>,
    hostaddr: Option<String>,
    hostsvcid: Option<String>,
}

impl Wanted {
    /// Whether `trid`, used with host address `host` (empty for an
    /// alternate: SPDK keeps none for it), is one the call names.
    fn matches(&self, trid: &Trid, host: (&str, &str)) -> bool {
        let same = |want: &Option<String>, have: &str, fold: bool| {
            want.as_deref().is_none_or(|w| {
                if fold {
                    w.eq_ignore_ascii_case(have)
                } else {
                    w == have
                }
            })
        };
        same(&self.trtype, "tcp", true)
            && same(&self.traddr, &trid.traddr, true)
            && self.adrfam.is_none_or(|a| a == trid.adrfam)
            && same(&self.trsvcid, &trid.trsvcid, true)
            && same(&self.subnqn, &trid.subnqn, false)
            && same(&self.hostaddr, host.0, false)
            && same(&self.hostsvcid, host.1, false)
    }
}

/// Detaches what the call names; returns the name itself once its last
/// controller is gone (its bdevs are then to be unregistered).
pub(super) fn detach(
    names: &mut Vec<NvmeBdevCtrlr>,
    params: Option<Value>,
) -> Result<Option<NvmeBdevCtrlr>, RpcError> {
    let p: DetachParams = decode(params, OnDecodeError::DecodeFailed)?;
    if let Some(t) = &p.trtype
        && t.len() > TRSTRING_MAX_LEN
    {
        return Err(RpcError::new(
            -EINVAL,
            format!("Failed to parse trtype: {t}"),
        ));
    }
    let adrfam = match &p.adrfam {
        Some(a) => Some(
            adrfam_name(a)
                .ok_or_else(|| RpcError::new(-EINVAL, format!("Failed to parse adrfam: {a}")))?,
        ),
        None => None,
    };
    let wanted = Wanted {
        trtype: p.trtype,
        traddr: p.traddr,
        adrfam,
        trsvcid: p.trsvcid,
        subnqn: p.subnqn,
        hostaddr: p.hostaddr,
        hostsvcid: p.hostsvcid,
    };
    let i = names
        .iter()
        .position(|n| n.name == p.name)
        .ok_or(RpcError::errno(ENODEV))?;
    let n = &mut names[i];
    let mut found = false;
    let mut doomed = vec![];
    for c in &n.ctrlrs {
        found |= detach_from(n, c, &wanted, &mut doomed);
    }
    if !found {
        return Err(RpcError::errno(ENXIO));
    }
    n.ctrlrs.retain(|c| !doomed.contains(&c.id));
    for id in doomed {
        n.paths.remove(id);
    }
    Ok(n.ctrlrs.is_empty().then(|| names.remove(i)))
}

/// `_bdev_nvme_delete` on one controller: whether a trid matched; a
/// controller left with none goes into `doomed`.
fn detach_from(
    n: &NvmeBdevCtrlr,
    c: &NvmeController,
    wanted: &Wanted,
    doomed: &mut Vec<u64>,
) -> bool {
    let Some(path) = n.paths.get(c.id) else {
        return false;
    };
    let alternates: Vec<Trid> = path.trids[1..]
        .iter()
        .filter(|t| !wanted.matches(t, ("", "")))
        .cloned()
        .collect();
    let mut found = alternates.len() + 1 < path.trids.len();
    let in_use = wanted.matches(path.trid(), (&c.hostaddr, &c.hostsvcid));
    found |= in_use;
    if in_use && alternates.is_empty() {
        doomed.push(c.id);
    } else if in_use {
        // Fails over to the next alternate, the one in use dropped.
        n.paths.update(c.id, |p| p.trids = alternates);
        c.monitor.reset();
    } else {
        n.paths.update(c.id, |p| {
            p.trids.truncate(1);
            p.trids.extend(alternates);
        });
    }
    found
}
