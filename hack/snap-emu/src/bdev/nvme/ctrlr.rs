//! What the initiator keeps of a controller name (SPDK's `nvme_bdev_ctrlr`):
//! its controllers, one per path, its namespaces' bdevs with their
//! multipath policies, and the paths their I/O shares (whose state, trids
//! and controller ids each controller's monitor keeps up to date).

use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Value, json};

use super::monitor::Monitor;
use crate::datapath::paths::{MpPolicy, Path, Paths, Policy, Selector, Trid};

/// One controller: a path to the subsystem.
#[derive(Debug)]
pub(super) struct NvmeController {
    /// Its entry in the name's [`Paths`].
    pub id: u64,
    pub hostnqn: String,
    pub hostaddr: String,
    pub hostsvcid: String,
    pub serial_number: String,
    pub model_number: String,
    /// Keeps its connection; dropping it closes the connection.
    pub monitor: Monitor,
}

/// A namespace's bdev.
#[derive(Debug)]
pub(super) struct NvmeBdev {
    pub name: String,
    pub nsid: u32,
    pub policy: Arc<Mutex<Policy>>,
}

impl NvmeBdev {
    pub(super) fn policy(&self) -> Policy {
        *self.policy.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Debug)]
pub(super) struct NvmeBdevCtrlr {
    pub name: String,
    /// In the order they were attached.
    pub ctrlrs: Vec<NvmeController>,
    pub bdevs: Vec<NvmeBdev>,
    pub paths: Arc<Paths>,
}

impl Drop for NvmeBdevCtrlr {
    /// I/O waiting for a lost path gives up with the name.
    fn drop(&mut self) {
        self.paths.detach();
    }
}

impl NvmeBdevCtrlr {
    /// Each controller with its path, in attach order.
    pub(super) fn with_paths(&self) -> Vec<(&NvmeController, Path)> {
        self.ctrlrs
            .iter()
            .filter_map(|c| Some((c, self.paths.get(c.id)?)))
            .collect()
    }

    /// The first controller (`nvme_ctrlr_get_by_name`), which a new path is
    /// checked against.
    pub(super) fn first(&self) -> Option<(&NvmeController, Path)> {
        self.with_paths().into_iter().next()
    }

    pub(super) fn bdev(&self, name: &str) -> Option<&NvmeBdev> {
        self.bdevs.iter().find(|b| b.name == name)
    }

    /// One element of `bdev_nvme_get_controllers`.
    pub(super) fn json(&self) -> Value {
        let ctrlrs: Vec<Value> = self
            .with_paths()
            .into_iter()
            .map(|(c, p)| {
                let mut o = serde_json::Map::new();
                o.insert("state".into(), json!(p.state.name()));
                o.insert("trid".into(), p.trid().json());
                if p.trids.len() > 1 {
                    let alternates: Vec<Value> = p.trids[1..].iter().map(Trid::json).collect();
                    o.insert("alternate_trids".into(), json!(alternates));
                }
                o.insert("cntlid".into(), json!(p.cntlid));
                o.insert(
                    "host".into(),
                    json!({"nqn": c.hostnqn, "addr": c.hostaddr, "svcid": c.hostsvcid}),
                );
                Value::Object(o)
            })
            .collect();
        json!({"name": self.name, "ctrlrs": ctrlrs})
    }

    /// `bdev_nvme_dump_info_json` of one of its bdevs: the namespace as each
    /// path shows it, and the policy.
    pub(super) fn dump(&self, bdev: &NvmeBdev) -> Value {
        let nvme: Vec<Value> = self
            .with_paths()
            .into_iter()
            .map(|(c, p)| {
                json!({
                    "trid": p.trid().json(),
                    "ctrlr_data": {
                        "cntlid": p.cntlid,
                        "vendor_id": "0x8086",
                        "model_number": c.model_number,
                        "serial_number": c.serial_number,
                        "firmware_revision": "24.09",
                        "subnqn": p.trid().subnqn,
                        "oacs": {"security": 0, "format": 0, "firmware": 0, "ns_manage": 0},
                        "multi_ctrlr": true,
                        "ana_reporting": false
                    },
                    "vs": {"nvme_version": "1.3"},
                    "ns_data": {"id": bdev.nsid, "can_share": true}
                })
            })
            .collect();
        let mut o = serde_json::Map::new();
        o.insert("nvme".into(), json!(nvme));
        let policy = bdev.policy();
        match policy.policy {
            MpPolicy::ActivePassive => {
                o.insert("mp_policy".into(), json!("active_passive"));
            }
            MpPolicy::ActiveActive => {
                o.insert("mp_policy".into(), json!("active_active"));
                let selector = match policy.selector {
                    Selector::RoundRobin => "round_robin",
                    Selector::QueueDepth => "queue_depth",
                };
                o.insert("selector".into(), json!(selector));
                if policy.selector == Selector::RoundRobin {
                    o.insert("rr_min_io".into(), json!(policy.rr_min_io));
                }
            }
        }
        Value::Object(o)
    }
}
