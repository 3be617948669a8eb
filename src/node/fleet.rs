//! [`Fleet`]: the DPUs one node reaches, each behind its own [`DpuAttach`]
//! (a host with two BlueFields has two; most hosts have one).
//!
//! A new volume goes to the DPU its volume context names
//! ([`DPU_KEY`], a DPU-local backend's volume), else to one chosen by
//! rendezvous hashing of the volume id over the DPUs: stable, so that a
//! stage retried after a crash that came before its record reaches the same
//! DPU, and spread evenly. A DPU known to be down (its last probe failed)
//! is passed over, as is one that answers UNAVAILABLE, has no free
//! function or cannot serve the volume (FAILED_PRECONDITION: its plugin
//! makes no device of that kind). Once staged, the record names the DPU and every later call
//! goes there alone.
//!
//! Every DPU of several is probed every [`WATCH_PERIOD`], and every DPU at
//! each Probe: `snap_csi_dpu_up{dpu}` and the placement's view come from
//! that; Probe is ready while any DPU is.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::Status;

use super::config::NodeConfig;
use super::dpus::{Reach, dpu_segment, is_label_name};
use crate::dpu::colocated::Colocated;
use crate::dpu::remote::RemoteDpu;
use crate::dpu::{AttachRequest, Attachment, DpuAttach, DpuError};

/// Volume context key naming the one DPU that can serve the volume (a
/// DPU-local backend sets it, with the topology `dpu.snap-csi.io/<name>:
/// <node id>`).
pub const DPU_KEY: &str = "snap-csi.io/dpu";
/// How often each DPU is probed in the background.
const WATCH_PERIOD: Duration = Duration::from_secs(2);
const WATCH_PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Every DPU of this node, in the configured order.
#[derive(Debug)]
pub struct Fleet {
    members: Vec<Member>,
}

/// One DPU.
#[derive(Debug)]
pub struct Member {
    name: String,
    pci_domain: u16,
    dpu: Arc<dyn DpuAttach>,
    /// What its last probe found; up until one says otherwise.
    up: watch::Sender<bool>,
}

impl Member {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn dpu(&self) -> &Arc<dyn DpuAttach> {
        &self.dpu
    }

    pub fn is_up(&self) -> bool {
        *self.up.borrow()
    }

    /// Resolves once the probes find the DPU down: at once if the last one
    /// did, which may have come after the DPU was chosen.
    pub async fn down(&self) {
        // The sender lives as long as `self`: this ends by the value alone.
        let _ = self.up.subscribe().wait_for(|up| !*up).await;
    }

    /// Whether the DPU serves: up by its last probe, or by one made now,
    /// which a hung DPU answers at most [`WATCH_PROBE_TIMEOUT`] late.
    pub async fn serving(&self, deadline: Instant) -> bool {
        self.is_up()
            || self
                .probe(deadline.min(Instant::now() + WATCH_PROBE_TIMEOUT))
                .await
    }

    /// [`DpuAttach::attach`], the function's address in this DPU's domain.
    pub async fn attach(
        &self,
        request: &AttachRequest,
        deadline: Instant,
    ) -> Result<Attachment, DpuError> {
        let mut attachment = self.dpu.attach(request, deadline).await?;
        attachment.locator = attachment.locator.in_pci_domain(self.pci_domain);
        Ok(attachment)
    }

    /// Probes the DPU and keeps what it found.
    async fn probe(&self, deadline: Instant) -> bool {
        let result = tokio::time::timeout_at(deadline, self.dpu.probe(deadline))
            .await
            .unwrap_or_else(|_| Err(DpuError::Unavailable("no answer to the probe".into())));
        let ready = matches!(result, Ok(true));
        if self.up.send_replace(ready) != ready {
            match &result {
                Ok(true) => tracing::info!(dpu = %self.name, "the DPU serves again"),
                Ok(false) => tracing::warn!(dpu = %self.name, "the DPU is down: not ready"),
                Err(e) => tracing::warn!(dpu = %self.name, "the DPU is down: {e}"),
            }
        }
        crate::metrics::set_dpu_up(&self.name, ready);
        ready
    }
}

impl Fleet {
    /// The DPUs as (name, PCI domain, attach layer); at least one.
    pub fn new(members: Vec<(String, u16, Arc<dyn DpuAttach>)>) -> Fleet {
        assert!(!members.is_empty(), "a node reaches at least one DPU");
        Fleet {
            members: members
                .into_iter()
                .map(|(name, pci_domain, dpu)| Member {
                    name,
                    pci_domain,
                    dpu,
                    up: watch::Sender::new(true),
                })
                .collect(),
        }
    }

    /// The DPUs the configuration names: an agent each in split mode, else
    /// the plugin's and SNAP's sockets on this host. Must be called inside
    /// the runtime that serves: the layers' connections run there.
    pub fn from_config(config: &NodeConfig) -> anyhow::Result<Fleet> {
        let mut members = Vec::new();
        for spec in config.dpu_specs().map_err(anyhow::Error::msg)? {
            let dpu: Arc<dyn DpuAttach> = match &spec.reach {
                Reach::Agent(address) => {
                    tracing::info!(agent = %address, dpu = %spec.name, "split mode: the DPU attach layer is the DPU agent");
                    Arc::new(RemoteDpu::new(
                        address.clone(),
                        &spec.name,
                        &config.dpu_tls,
                    )?)
                }
                Reach::Sockets {
                    plugin_socket,
                    snap_socket_template,
                } => Arc::new(Colocated::new(
                    plugin_socket.clone(),
                    snap_socket_template.clone(),
                )),
            };
            members.push((spec.name, spec.pci_domain, dpu));
        }
        Ok(Fleet::new(members))
    }

    /// Each DPU's attach layer wrapped by `wrap` (tests put theirs around).
    pub fn wrapped(self, mut wrap: impl FnMut(Arc<dyn DpuAttach>) -> Arc<dyn DpuAttach>) -> Fleet {
        Fleet {
            members: self
                .members
                .into_iter()
                .map(|m| Member {
                    dpu: wrap(m.dpu),
                    ..m
                })
                .collect(),
        }
    }

    /// A host with more than one DPU: only there is a volume's DPU a
    /// choice, written down, watched and cleared.
    pub fn several(&self) -> bool {
        self.members.len() > 1
    }

    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// The DPU a record names; a record of an older node names none, and
    /// its volume is on the first. A node with one DPU has only one place
    /// for it (its DPU may have been renamed). Otherwise a DPU no longer
    /// configured is FAILED_PRECONDITION: the volume cannot be reached.
    pub fn recorded(&self, name: Option<&str>) -> Result<&Member, Status> {
        match name {
            None => Ok(&self.members[0]),
            Some(_) if !self.several() => Ok(&self.members[0]),
            Some(name) => self.named(name).ok_or_else(|| {
                Status::failed_precondition(format!(
                    "the volume is on DPU {name}, which this node no longer reaches (its DPUs: {})",
                    self.names()
                ))
            }),
        }
    }

    /// Where a new volume may go, best first (see the module doc); the
    /// ones known down come last, still tried if all are.
    pub fn candidates(
        &self,
        volume_id: &str,
        volume_context: &HashMap<String, String>,
    ) -> Result<Vec<&Member>, Status> {
        if let Some(name) = volume_context.get(DPU_KEY) {
            return match self.named(name) {
                Some(member) => Ok(vec![member]),
                None => Err(Status::failed_precondition(format!(
                    "volume {volume_id} can be served only by DPU {name} ({DPU_KEY}), which \
                     this node does not have (its DPUs: {}); its topology should have kept it \
                     off this node",
                    self.names()
                ))),
            };
        }
        let mut ranked: Vec<&Member> = self.members.iter().collect();
        ranked.sort_by_key(|m| {
            (
                !m.is_up(),
                std::cmp::Reverse(rendezvous(volume_id, &m.name)),
            )
        });
        Ok(ranked)
    }

    /// Where the volume goes when every DPU is up and takes it.
    pub fn first_choice(&self, volume_id: &str) -> &str {
        let best = self
            .members
            .iter()
            .max_by_key(|m| rendezvous(volume_id, &m.name))
            .expect("a fleet has at least one DPU");
        &best.name
    }

    /// Ready while any DPU is: answered as soon as one says so, not after
    /// a hung one's deadline.
    pub async fn probe(&self, deadline: Instant) -> bool {
        let mut probes: FuturesUnordered<_> =
            self.members.iter().map(|m| m.probe(deadline)).collect();
        while let Some(ready) = probes.next().await {
            if ready {
                return true;
            }
        }
        false
    }

    /// Probes every DPU until it answers or `deadline` passes, each keeping
    /// what it found: the watch's round, whose word placement and
    /// `snap_csi_dpu_up` take, so no DPU's probe is cut short by another's
    /// readiness as in [`Fleet::probe`].
    async fn probe_each(&self, deadline: Instant) {
        futures::future::join_all(self.members.iter().map(|m| m.probe(deadline))).await;
    }

    /// Down by the background probes' last word (a host with several
    /// DPUs: [`Fleet::watch`]); a caller need not wait on such a DPU.
    pub fn known_down(&self, member: &Member) -> bool {
        self.several() && !member.is_up()
    }

    /// Probes every DPU every [`WATCH_PERIOD`] until the fleet is dropped,
    /// when there are several: placement passes over one found down. A
    /// single DPU has nowhere to pass to, and its state comes from Probe
    /// (kubelet's liveness probe), so its SNAP sees no calls of ours
    /// between the CO's.
    pub fn watch(self: &Arc<Fleet>) {
        if !self.several() {
            return;
        }
        let fleet = Arc::downgrade(self);
        tokio::spawn(async move {
            while let Some(fleet) = fleet.upgrade() {
                fleet.probe_each(Instant::now() + WATCH_PROBE_TIMEOUT).await;
                drop(fleet);
                tokio::time::sleep(WATCH_PERIOD).await;
            }
        });
    }

    /// NodeGetInfo's segments: one key per DPU, since CSI gives a node one
    /// value per key and a volume local to one DPU must reach only the node
    /// that has it, valued with `node_id`, since other hosts' DPUs may have
    /// the same names ([`dpu_segment`]); and the first DPU's name under the
    /// key nodes had before. A DPU whose name cannot be a label name (a
    /// single DPU named after a long node id) has no key of its own.
    pub fn topology(&self, legacy_key: &str, node_id: &str) -> HashMap<String, String> {
        let mut segments: HashMap<String, String> = self
            .members
            .iter()
            .filter(|m| is_label_name(&m.name))
            .map(|m| dpu_segment(&m.name, node_id))
            .collect();
        segments.insert(legacy_key.to_string(), self.members[0].name.clone());
        segments
    }

    fn named(&self, name: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.name == name)
    }

    fn names(&self) -> String {
        let names: Vec<&str> = self.members.iter().map(|m| m.name.as_str()).collect();
        names.join(", ")
    }
}

/// The volume's weight on a DPU (highest wins): FNV-1a over both names,
/// mixed by SplitMix64's finalizer; fixed forever, so that a node of a
/// later version places a retried stage where an earlier one did.
fn rendezvous(volume_id: &str, dpu: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in dpu.bytes().chain([0]).chain(volume_id.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash ^= hash >> 30;
    hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 27;
    hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Nothing;

    #[async_trait::async_trait]
    impl DpuAttach for Nothing {
        async fn attach(&self, _: &AttachRequest, _: Instant) -> Result<Attachment, DpuError> {
            Err(DpuError::Unavailable("no DPU".into()))
        }
        async fn detach(&self, _: &str, _: Option<&str>, _: Instant) -> Result<(), DpuError> {
            Ok(())
        }
        async fn probe(&self, _: Instant) -> Result<bool, DpuError> {
            Err(DpuError::Unavailable("no DPU".into()))
        }
        async fn inventory(&self, _: Instant) -> Result<crate::dpu::Inventory, DpuError> {
            Ok(Default::default())
        }
        async fn io_stats(&self, _: Instant) -> Result<crate::dpu::IoStats, DpuError> {
            Err(DpuError::Unavailable("no DPU".into()))
        }
    }

    /// A DPU whose probe answers ready, or never (`hung`).
    #[derive(Debug)]
    struct Probed {
        hung: bool,
    }

    #[async_trait::async_trait]
    impl DpuAttach for Probed {
        async fn attach(&self, r: &AttachRequest, d: Instant) -> Result<Attachment, DpuError> {
            Nothing.attach(r, d).await
        }
        async fn detach(&self, v: &str, n: Option<&str>, d: Instant) -> Result<(), DpuError> {
            Nothing.detach(v, n, d).await
        }
        async fn probe(&self, _: Instant) -> Result<bool, DpuError> {
            if self.hung {
                std::future::pending::<()>().await;
            }
            Ok(true)
        }
        async fn inventory(&self, d: Instant) -> Result<crate::dpu::Inventory, DpuError> {
            Nothing.inventory(d).await
        }
        async fn io_stats(&self, d: Instant) -> Result<crate::dpu::IoStats, DpuError> {
            Nothing.io_stats(d).await
        }
    }

    #[tokio::test]
    async fn probe_is_ready_as_soon_as_one_dpu_is_and_a_hung_one_is_asked_briefly() {
        let two = Fleet::new(vec![
            ("hung".into(), 0, Arc::new(Probed { hung: true }) as _),
            ("ready".into(), 1, Arc::new(Probed { hung: false }) as _),
        ]);
        let asked = Instant::now();
        assert!(two.probe(asked + Duration::from_secs(120)).await);
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "waited on the hung DPU"
        );
        two.members[0].up.send_replace(false);
        assert!(two.known_down(&two.members[0]) && !two.known_down(&two.members[1]));
        // Its condition is asked under a caller's long deadline: answered
        // within the watch's timeout, not the caller's two minutes.
        let asked = Instant::now();
        let hung = &two.members[0];
        assert!(!hung.serving(asked + Duration::from_secs(120)).await);
        let took = asked.elapsed();
        assert!(took < WATCH_PROBE_TIMEOUT * 2, "{took:?}");
    }

    #[tokio::test]
    async fn the_watch_hears_every_dpu_not_only_the_first_ready() {
        let two = Fleet::new(vec![
            ("ready".into(), 0, Arc::new(Probed { hung: false }) as _),
            ("hung".into(), 1, Arc::new(Probed { hung: true }) as _),
        ]);
        two.probe_each(Instant::now() + Duration::from_millis(100))
            .await;
        assert!(two.members[0].is_up());
        assert!(!two.members[1].is_up(), "a hung DPU is known down");
    }

    fn fleet(names: &[&str]) -> Fleet {
        Fleet::new(
            names
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    (
                        n.to_string(),
                        i as u16,
                        Arc::new(Nothing) as Arc<dyn DpuAttach>,
                    )
                })
                .collect(),
        )
    }

    fn first(fleet: &Fleet, volume_id: &str) -> String {
        fleet.candidates(volume_id, &HashMap::new()).unwrap()[0]
            .name
            .clone()
    }

    #[test]
    fn volumes_spread_evenly_and_stay_put() {
        let two = fleet(&["bf3-a", "bf3-b"]);
        let on_a = (0..1000)
            .filter(|i| first(&two, &format!("pvc-{i}")) == "bf3-a")
            .count();
        assert!((430..=570).contains(&on_a), "{on_a} of 1000 on bf3-a");
        // The weights are fixed: a later node places a volume as this one.
        assert_eq!(rendezvous("pvc-0", "bf3-a"), 0x3303_1286_ad12_2c85);
        // A third DPU takes volumes only to itself: the others stay put.
        let three = fleet(&["bf3-a", "bf3-b", "bf3-c"]);
        for i in 0..200 {
            let id = format!("pvc-{i}");
            let now = first(&three, &id);
            assert!(
                now == "bf3-c" || now == first(&two, &id),
                "{id} moved to {now}"
            );
        }
    }

    #[test]
    fn a_down_dpu_comes_last_and_a_pinned_volume_goes_only_to_its_dpu() {
        let two = fleet(&["bf3-a", "bf3-b"]);
        let id = (0..)
            .map(|i| format!("pvc-{i}"))
            .find(|id| first(&two, id) == "bf3-a")
            .unwrap();
        two.members[0].up.send_replace(false);
        let order: Vec<&str> = two
            .candidates(&id, &HashMap::new())
            .unwrap()
            .iter()
            .map(|m| m.name())
            .collect();
        assert_eq!(order, ["bf3-b", "bf3-a"]);
        let pinned = HashMap::from([(DPU_KEY.to_string(), "bf3-a".to_string())]);
        assert_eq!(two.candidates(&id, &pinned).unwrap()[0].name(), "bf3-a");
        let elsewhere = HashMap::from([(DPU_KEY.to_string(), "bf3-z".to_string())]);
        let refused = two.candidates(&id, &elsewhere).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        assert!(
            refused.message().contains("bf3-a, bf3-b"),
            "{}",
            refused.message()
        );
    }

    #[test]
    fn records_reach_their_dpu_and_old_ones_the_first() {
        let two = fleet(&["bf3-a", "bf3-b"]);
        assert_eq!(two.recorded(None).unwrap().name(), "bf3-a");
        assert_eq!(two.recorded(Some("bf3-b")).unwrap().name(), "bf3-b");
        assert_eq!(
            two.recorded(Some("gone")).unwrap_err().code(),
            tonic::Code::FailedPrecondition
        );
        let one = fleet(&["renamed"]);
        assert_eq!(one.recorded(Some("bf3-a")).unwrap().name(), "renamed");
    }

    #[test]
    fn topology_has_a_key_per_dpu_and_the_first_under_the_old_key() {
        let segments = fleet(&["bf3-a", "bf3-b"]).topology("topology.snap-csi.io/dpu", "host-1");
        assert_eq!(
            segments,
            HashMap::from([
                ("topology.snap-csi.io/dpu".to_string(), "bf3-a".to_string()),
                ("dpu.snap-csi.io/bf3-a".to_string(), "host-1".to_string()),
                ("dpu.snap-csi.io/bf3-b".to_string(), "host-1".to_string()),
            ])
        );
    }

    #[tokio::test]
    async fn probe_is_not_ready_when_no_dpu_answers() {
        let two = fleet(&["bf3-a", "bf3-b"]);
        assert!(!two.probe(Instant::now() + Duration::from_secs(1)).await);
        assert!(!two.members[0].is_up());
    }
}
