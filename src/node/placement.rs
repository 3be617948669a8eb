//! Which DPU a volume is attached on and detached from: the record's, or
//! for a new volume the first of the fleet's candidates that takes it
//! ([`super::fleet`]); and what a volume that went elsewhere than its
//! first choice may have left there.

use std::time::Duration;

use futures::future::join_all;
use tokio::time::Instant;
use tonic::Status;

use super::fleet::Member;
use super::records::VolumeRecord;
use super::service::NodeService;
use crate::dpu::{AttachRequest, Attachment, DpuError};

/// One detach of what a passed-over DPU may hold gets this long; the
/// next waits from the first delay, doubling, to the last.
const CLEAR_TIMEOUT: Duration = Duration::from_secs(30);
const CLEAR_FIRST_RETRY: Duration = Duration::from_secs(1);
const CLEAR_LAST_RETRY: Duration = Duration::from_secs(60);

impl NodeService {
    /// Attaches the volume on a DPU: the one `previous` names (a restage),
    /// else the first of the fleet's candidates that takes it (a DPU that
    /// answers UNAVAILABLE or has no free function passes it on; one that
    /// is not the last may take half of what is left of the deadline).
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
        let members = match previous {
            Some(record) => vec![fleet.recorded(record.dpu.as_deref())?],
            None => fleet.candidates(&request.volume_id, &request.volume_context)?,
        };
        for (i, member) in members.iter().enumerate() {
            let last = i + 1 == members.len();
            let until = match last {
                true => deadline,
                false => Instant::now() + deadline.saturating_duration_since(Instant::now()) / 2,
            };
            match self.attach_on(member, request, until).await {
                Ok(attachment) => {
                    let passed = members[..i].iter().map(|m| m.name());
                    self.clear_elsewhere(&request.volume_id, member.name(), passed);
                    return Ok((attachment, member.name().to_string()));
                }
                Err(e @ (DpuError::Unavailable(_) | DpuError::Exhausted(_))) if !last => {
                    tracing::warn!(volume_id = %request.volume_id, dpu = %member.name(), "DPU did not take the volume, trying the next: {e}");
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

    /// Takes the volume off every DPU it passed over on its way to `on`
    /// (they answered late or were full, and may hold half an attach), and
    /// off its first choice, where a stage cut short before its record would
    /// have put it: in the background, until each detach succeeds, each
    /// under the volume's hold and only while the volume is not recorded
    /// there (a later stage may have put it there since).
    fn clear_elsewhere<'a>(
        &self,
        volume_id: &str,
        on: &str,
        passed: impl Iterator<Item = &'a str>,
    ) {
        let first_choice = self.fleet().first_choice(volume_id);
        let mut dpus: Vec<String> = passed.map(str::to_string).collect();
        if first_choice != on && !dpus.iter().any(|d| d == first_choice) {
            dpus.push(first_choice.to_string());
        }
        if dpus.is_empty() {
            return;
        }
        let node = self.clone();
        let volume_id = volume_id.to_string();
        tokio::spawn(async move {
            for dpu in dpus {
                node.clear_on(&volume_id, &dpu).await;
            }
        });
    }

    async fn clear_on(&self, volume_id: &str, dpu: &str) {
        let mut delay = CLEAR_FIRST_RETRY;
        loop {
            if let Ok(_held) = self.hold(volume_id) {
                match self.recorded(volume_id) {
                    Ok(Some(record)) if record.dpu.as_deref() == Some(dpu) => return,
                    Ok(_) => {
                        let Ok(member) = self.fleet().recorded(Some(dpu)) else {
                            return;
                        };
                        let deadline = Instant::now() + CLEAR_TIMEOUT;
                        match member.dpu().detach(volume_id, None, deadline).await {
                            Ok(()) => {
                                tracing::info!(%volume_id, %dpu, "cleared what a passed-over DPU held of the volume");
                                return;
                            }
                            Err(e) => {
                                tracing::debug!(%volume_id, %dpu, "clearing a passed-over DPU waits: {e}")
                            }
                        }
                    }
                    Err(e) => {
                        tracing::debug!(%volume_id, "clearing a passed-over DPU waits for the record: {e}")
                    }
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(CLEAR_LAST_RETRY);
        }
    }
}
