//! Which DPU a volume is attached on and detached from: the record's, or
//! for a new volume the first of the fleet's candidates that takes it
//! ([`super::fleet`]); and what a DPU that was tried and not kept may hold.
//!
//! On a host with several DPUs the choice is written down before anything
//! is made there ([`super::placing`]: the DPUs a stage tried, in order), so that a
//! stage cut short by a crash before its record is retried on the DPU it
//! last tried, and every other DPU it tried is cleared once the record names
//! one. Clearing runs in the background, under the volume's hold, until each
//! detach succeeds, and again after a restart.

use std::collections::HashSet;
use std::time::Duration;

use futures::future::join_all;
use tokio::time::Instant;
use tonic::Status;

use super::error::NodeError;
use super::fleet::Member;
use super::records::VolumeRecord;
use super::service::NodeService;
use crate::dpu::{AttachRequest, Attachment, DpuError};

/// One detach of what a DPU tried and not kept may hold gets this long; the
/// next waits from the first delay, doubling, to the last.
const CLEAR_TIMEOUT: Duration = Duration::from_secs(30);
const CLEAR_FIRST_RETRY: Duration = Duration::from_secs(1);
const CLEAR_LAST_RETRY: Duration = Duration::from_secs(60);

impl NodeService {
    /// Attaches the volume on a DPU: the one `previous` names (a restage),
    /// else the first of the fleet's candidates that takes it (a DPU that
    /// answers UNAVAILABLE, has no free function or cannot serve it passes
    /// it on; one that is not the last may take half of what is left of
    /// the deadline, and is left as soon as the fleet's watch finds it down,
    /// before or during its attempt: a DPU that hung, or died, whose plugin
    /// keeps trying to reach its SNAP). A bad request is refused by the
    /// first: it is bad everywhere.
    /// Returns where it went.
    ///
    /// An attach that fails for a reason the DPU cannot name (INTERNAL:
    /// typically an SPDK object gone between two of its calls, as when SNAP
    /// restarted in the middle and came back empty) is tried once more,
    /// inside the deadline: attaching continues from whatever the DPU holds,
    /// so the second attempt starts from SNAP's new state instead of
    /// answering kubelet a final error for a moment's state.
    ///
    /// A definite refusal of a first attach (no free function, bad
    /// arguments) undoes what the attempt made rather than leave it for an
    /// unstage that may never come; a transient failure is left for the retry.
    pub(super) async fn attach(
        &self,
        request: &AttachRequest,
        previous: Option<&VolumeRecord>,
        deadline: Instant,
    ) -> Result<(Attachment, String), Status> {
        let fleet = self.fleet();
        let volume_id = &request.volume_id;
        let several = fleet.several();
        let members = match previous {
            Some(record) => vec![fleet.recorded(record.dpu.as_deref())?],
            None => {
                let mut members = fleet.candidates(volume_id, &request.volume_context)?;
                // A stage cut short continues on the DPU it last tried.
                let tried = match several {
                    true => self.placing().tried(volume_id)?,
                    false => Vec::new(),
                };
                if let Some(last) = tried.last()
                    && let Some(at) = members.iter().position(|m| m.name() == last && m.is_up())
                {
                    let member = members.remove(at);
                    members.insert(0, member);
                }
                members
            }
        };
        for (i, member) in members.iter().enumerate() {
            if previous.is_none() && several {
                self.placing().trying(volume_id, member.name())?;
            }
            let last = i + 1 == members.len();
            let until = match last {
                true => deadline,
                false => Instant::now() + deadline.saturating_duration_since(Instant::now()) / 2,
            };
            let attempt = match last {
                true => self.attach_on(member, request, until).await,
                false => tokio::select! {
                    biased;
                    attempt = self.attach_on(member, request, until) => attempt,
                    () = member.down() => Err(DpuError::Unavailable(
                        "the DPU's probes find it down".into(),
                    )),
                },
            };
            match attempt {
                Ok(attachment) => return Ok((attachment, member.name().to_string())),
                Err(
                    e @ (DpuError::Unavailable(_)
                    | DpuError::Exhausted(_)
                    | DpuError::FailedPrecondition(_)),
                ) if !last => {
                    tracing::warn!(%volume_id, dpu = %member.name(), "DPU did not take the volume, trying the next: {e}");
                }
                Err(e) => return Err(e.into()),
            }
        }
        unreachable!("the last candidate returns")
    }

    /// [`NodeService::attach`] on one DPU.
    async fn attach_on(
        &self,
        member: &Member,
        request: &AttachRequest,
        deadline: Instant,
    ) -> Result<Attachment, DpuError> {
        let volume_id = &request.volume_id;
        let mut attached = member.attach(request, deadline).await;
        if let Err(DpuError::Internal(why)) = &attached {
            tracing::warn!(%volume_id, "attaching failed ({why}); trying once more from what the DPU holds now");
            attached = member.attach(request, deadline).await;
        }
        let error = match attached {
            Ok(attachment) => return Ok(attachment),
            Err(error) => error,
        };
        if !request.attached_before
            && !matches!(error, DpuError::Unavailable(_))
            && let Err(undo) = member.dpu().detach(volume_id, None, deadline).await
        {
            tracing::warn!(%volume_id, "undoing a failed attach: {undo}");
        }
        Err(error)
    }

    /// Detaches the volume from the DPU its record names; without a record
    /// (a stage cut short before writing it) from every DPU, since that
    /// stage may have attached it on any.
    pub(super) async fn detach(
        &self,
        volume_id: &str,
        record: Option<&VolumeRecord>,
        deadline: Instant,
    ) -> Result<(), Status> {
        let members: Vec<&Member> = match record {
            Some(record) => vec![self.fleet().recorded(record.dpu.as_deref())?],
            None => self.fleet().members().iter().collect(),
        };
        let device_name = record.and_then(|r| r.device_name.as_deref());
        let detached = join_all(
            members
                .iter()
                .map(|m| m.dpu().detach(volume_id, device_name, deadline)),
        )
        .await;
        detached
            .into_iter()
            .try_for_each(|d| d.map_err(Status::from))
    }

    /// The record now names `dpu`: every other DPU a stage of the volume
    /// tried is cleared in the background.
    pub(super) fn placed(&self, volume_id: &str, dpu: &str) -> Result<(), NodeError> {
        if !self.fleet().several() {
            return Ok(());
        }
        let others = self.placing().forget(volume_id, dpu)?;
        self.clear(volume_id, others);
        Ok(())
    }

    /// Unstaged from every DPU (a stage cut short before its record): none
    /// holds anything of it.
    pub(super) fn unplaced(&self, volume_id: &str) -> Result<(), NodeError> {
        self.placing().keep(volume_id, Vec::new())
    }

    /// At start: clears what an earlier run left to clear for the volumes
    /// it recorded; a volume without a record is its stage's retry's, or its
    /// unstage's, which detaches it everywhere.
    pub(super) fn clear_left_over(&self) {
        for (volume_id, dpus) in self.placing().all() {
            match self.recorded(&volume_id) {
                Ok(Some(record)) => {
                    let others = dpus.into_iter().filter(|d| record.dpu.as_ref() != Some(d));
                    self.clear(&volume_id, others.collect());
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(%volume_id, "{e}"),
            }
        }
    }

    fn clear(&self, volume_id: &str, dpus: Vec<String>) {
        if dpus.is_empty() {
            return;
        }
        let node = self.clone();
        let volume_id = volume_id.to_string();
        tokio::spawn(async move {
            let unique: HashSet<String> = dpus.into_iter().collect();
            join_all(unique.iter().map(|dpu| node.clear_on(&volume_id, dpu))).await;
        });
    }

    /// Detaches the volume from `dpu`, under the volume's hold and only
    /// while its record does not name `dpu` (a later stage may have put it
    /// there since), until that succeeds.
    ///
    /// A DPU known down is waited for without the hold: a detach there
    /// would hold the volume, which lives on another DPU, for its whole
    /// timeout, and kubelet's calls for it would be refused as busy.
    async fn clear_on(&self, volume_id: &str, dpu: &str) {
        let mut delay = CLEAR_FIRST_RETRY;
        loop {
            let fleet = self.fleet();
            if fleet.recorded(Some(dpu)).is_ok_and(|m| fleet.known_down(m)) {
                tokio::time::sleep(CLEAR_FIRST_RETRY).await;
                continue;
            }
            if let Ok(_held) = self.hold(volume_id) {
                match self.clear_held(volume_id, dpu).await {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::debug!(%volume_id, %dpu, "clearing a DPU tried and not kept waits: {e}")
                    }
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(CLEAR_LAST_RETRY);
        }
    }

    async fn clear_held(&self, volume_id: &str, dpu: &str) -> Result<(), Status> {
        let record = self.recorded(volume_id)?;
        if record.as_ref().and_then(|r| r.dpu.as_deref()) != Some(dpu)
            && let Ok(member) = self.fleet().recorded(Some(dpu))
        {
            let deadline = Instant::now() + CLEAR_TIMEOUT;
            member.dpu().detach(volume_id, None, deadline).await?;
            tracing::info!(%volume_id, %dpu, "cleared what a DPU tried and not kept held of the volume");
        }
        self.placing().forget(volume_id, dpu)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::*;
    use crate::node::config::NodeConfig;
    use crate::node::fleet::Fleet;

    /// A DPU that answers once `back`; gone, a detach waits out its
    /// deadline (as a call to an agent that does not answer, retried).
    #[derive(Debug)]
    struct Dpu {
        back: AtomicBool,
        detached: AtomicUsize,
    }

    impl Dpu {
        fn new(back: bool) -> Arc<Dpu> {
            Arc::new(Dpu {
                back: AtomicBool::new(back),
                detached: AtomicUsize::new(0),
            })
        }
    }

    #[async_trait::async_trait]
    impl crate::dpu::DpuAttach for Dpu {
        async fn attach(&self, _: &AttachRequest, _: Instant) -> Result<Attachment, DpuError> {
            Err(DpuError::Unavailable("not in this test".into()))
        }
        async fn detach(
            &self,
            _: &str,
            _: Option<&str>,
            deadline: Instant,
        ) -> Result<(), DpuError> {
            if !self.back.load(Ordering::SeqCst) {
                tokio::time::sleep_until(deadline).await;
                return Err(DpuError::Unavailable("gone".into()));
            }
            self.detached.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        async fn probe(&self, _: Instant) -> Result<bool, DpuError> {
            Ok(self.back.load(Ordering::SeqCst))
        }
        async fn inventory(&self, _: Instant) -> Result<crate::dpu::Inventory, DpuError> {
            Ok(Default::default())
        }
        async fn io_stats(&self, _: Instant) -> Result<crate::dpu::IoStats, DpuError> {
            Err(DpuError::Unavailable("not in this test".into()))
        }
    }

    async fn until(what: &str, done: impl Fn() -> bool) {
        let patience = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < patience, "{what}: not within 10 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_dpu_known_down_is_cleared_once_back_without_holding_the_volume_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let config = NodeConfig {
            state_dir: dir.path().to_path_buf(),
            ..NodeConfig::default()
        };
        let gone = Dpu::new(false);
        let fleet = Arc::new(Fleet::new(vec![
            ("a".into(), 0, Dpu::new(true) as _),
            ("b".into(), 1, Arc::clone(&gone) as _),
        ]));
        fleet.watch();
        until("b known down", || fleet.known_down(&fleet.members()[1])).await;
        let node = NodeService::new(config, Arc::clone(&fleet)).unwrap();
        node.placing().trying("pvc-1", "b").unwrap();
        node.clear("pvc-1", vec!["b".into()]);
        // kubelet's calls for the volume are not refused as busy meanwhile.
        let meanwhile = Instant::now() + CLEAR_FIRST_RETRY * 2;
        while Instant::now() < meanwhile {
            assert!(node.hold("pvc-1").is_ok(), "the volume is held");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(gone.detached.load(Ordering::SeqCst), 0);
        gone.back.store(true, Ordering::SeqCst);
        until("b cleared", || gone.detached.load(Ordering::SeqCst) == 1).await;
        until("b forgotten", || {
            node.placing().tried("pvc-1").is_ok_and(|t| t.is_empty())
        })
        .await;
    }
}
