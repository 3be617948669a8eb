//! kubelet's volume manager as a CSI node plugin sees it, in one place: which
//! Node calls it makes for one volume used by one pod, which failures it
//! tries again, and when it unpublishes and unstages after a failure. The
//! chaos soak and the node's crash test (which includes this file by path)
//! drive their volumes through it, so that a volume kubelet would leave stuck
//! is reported stuck, never papered over by a call kubelet would not make.
//!
//! What kubelet does, from kubernetes/kubernetes (v1.30 to v1.33):
//! - `pkg/volume/csi/csi_client.go`: a failed NodeStageVolume,
//!   NodePublishVolume or NodeExpandVolume whose error is not final becomes
//!   an "uncertain progress" error; `isFinalError` calls every code final but
//!   CANCELLED, DEADLINE_EXCEEDED, UNAVAILABLE, RESOURCE_EXHAUSTED and
//!   ABORTED, and an error that is no gRPC status not final ("be on the safe
//!   side"). NodeUnpublishVolume and NodeUnstageVolume errors stay plain.
//! - `pkg/volume/util/operationexecutor/operation_generator.go`: a failed
//!   MountDevice (NodeStageVolume; SetUpDevice for a block volume) marks the
//!   device uncertain when the error is uncertain and the device was not
//!   mounted, and not mounted when the error is final and the device was
//!   uncertain (`markDeviceErrorState`); a failed SetUp (NodePublishVolume;
//!   MapPodDevice) does the same to the pod's volume (`markVolumeErrorState`);
//!   a failed UnmountDevice (NodeUnstageVolume) marks the device uncertain.
//!   MountDevice runs only while the device is not marked mounted, so a
//!   failed publish is retried alone.
//! - `pkg/kubelet/volumemanager/reconciler`: every failed operation runs again
//!   after an exponential backoff (500 ms doubling to 2 min 2 s) for as long
//!   as its reason holds: stage and publish while the pod wants the volume,
//!   whatever the code. Once the pod is gone, a volume mounted or uncertain
//!   for it is unpublished (again until that succeeds); then the device is
//!   unstaged only if it is mounted or uncertain (`DeviceMayBeMounted`). A
//!   device marked not mounted is forgotten, whatever the driver holds.
//! - `operation_generator.go` `GenerateUnmountDeviceFunc`: before
//!   NodeUnstageVolume of a filesystem volume kubelet asks
//!   `GetDeviceMountRefs` (k8s.io/mount-utils `GetMountRefs`, then
//!   `SearchMountPoints`): every other mount of the staging path's filesystem
//!   at the same directory of it (same major:minor and root) is a reference,
//!   and one that is not kubelet's own (`util.HasMountRefs`) fails the
//!   unmount without any call: the device stays uncertain and the check runs
//!   again after the backoff, for ever while the reference stays
//!   (`kubelet_fs::device_mount_refs`).
//! - `pkg/volume/util/operationexecutor/node_expander.go`: a failed
//!   NodeExpandVolume is tried again, but FAILED_PRECONDITION stops expansion
//!   on this node while the volume is in use (the mount goes on).
//!
//! So a stage interrupted (UNAVAILABLE: uncertain) and then refused with a
//! final code is never unstaged, and a pod whose stage keeps failing waits
//! for ever. Only the backoff's pace is the caller's ([`Backoff`]; a test
//! cannot wait two minutes between attempts); the rules are kubelet's.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use tonic::Code;

use super::kubelet_fs;

/// A Node call kubelet makes for a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Call {
    Stage,
    Publish,
    Unpublish,
    Unstage,
}

impl Call {
    pub const ALL: [Call; 4] = [Call::Stage, Call::Publish, Call::Unpublish, Call::Unstage];

    pub fn name(self) -> &'static str {
        match self {
            Call::Stage => "NodeStageVolume",
            Call::Publish => "NodePublishVolume",
            Call::Unpublish => "NodeUnpublishVolume",
            Call::Unstage => "NodeUnstageVolume",
        }
    }

    /// The step's short name (stage, publish, ...).
    pub fn step(self) -> &'static str {
        match self {
            Call::Stage => "stage",
            Call::Publish => "publish",
            Call::Unpublish => "unpublish",
            Call::Unstage => "unstage",
        }
    }
}

/// What kubelet believes of a mount (its "actual state of the world"): the
/// device's (stage) or the pod's (publish).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Belief {
    #[default]
    NotMounted,
    Uncertain,
    Mounted,
}

/// Whether kubelet takes a failure with `code` (`None`: no gRPC status) as
/// the end of the operation rather than one that may still be in progress.
pub fn is_final(code: Option<Code>) -> bool {
    !matches!(
        code,
        None | Some(
            Code::Cancelled
                | Code::DeadlineExceeded
                | Code::Unavailable
                | Code::ResourceExhausted
                | Code::Aborted
        )
    )
}

/// Whether kubelet tries a failed NodeExpandVolume again on this node while
/// the volume is in use.
pub fn retries_expand(code: Option<Code>) -> bool {
    code != Some(Code::FailedPrecondition)
}

/// A failed call as kubelet sees it: its code (`None`: no gRPC status) and
/// message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub code: Option<Code>,
    pub message: String,
}

impl Failure {
    /// A status the server sent keeps its code. One the client's transport
    /// made (it carries the transport's error as its source: the connection
    /// broke mid-call, as when the node is killed) is UNAVAILABLE, as
    /// kubelet's grpc-go reports a broken connection, where tonic says
    /// UNKNOWN or INTERNAL; a client-side deadline keeps its code.
    pub fn of(status: &tonic::Status) -> Failure {
        let code = match status.code() {
            Code::Cancelled | Code::DeadlineExceeded => status.code(),
            _ if std::error::Error::source(status).is_some() => Code::Unavailable,
            code => code,
        };
        Failure {
            code: Some(code),
            message: status.message().to_string(),
        }
    }
}

impl From<tonic::Status> for Failure {
    fn from(status: tonic::Status) -> Failure {
        Failure::of(&status)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.code {
            Some(code) => write!(f, "{code:?}: {}", self.message),
            None => write!(f, "{}", self.message),
        }
    }
}

/// One volume on a node as kubelet tracks it for one pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Volume {
    /// The device's global mount: staged.
    pub device: Belief,
    /// The pod's mount: published.
    pub pod: Belief,
    /// Whether the pod exists (wants the volume).
    pub wanted: bool,
}

impl Volume {
    /// The call kubelet makes next, or `None`: the pod runs with the volume,
    /// or (without a pod) kubelet has forgotten the volume.
    pub fn next(&self) -> Option<Call> {
        if self.wanted {
            if self.device != Belief::Mounted {
                Some(Call::Stage)
            } else if self.pod != Belief::Mounted {
                Some(Call::Publish)
            } else {
                None
            }
        } else if self.pod != Belief::NotMounted {
            Some(Call::Unpublish)
        } else if self.device != Belief::NotMounted {
            Some(Call::Unstage)
        } else {
            None
        }
    }

    /// What kubelet concludes from one call's outcome.
    pub fn record(&mut self, call: Call, outcome: Result<(), Option<Code>>) {
        let belief = match call {
            Call::Stage | Call::Unstage => &mut self.device,
            Call::Publish | Call::Unpublish => &mut self.pod,
        };
        *belief = match (call, outcome) {
            (Call::Stage | Call::Publish, Ok(())) => Belief::Mounted,
            (Call::Unpublish | Call::Unstage, Ok(())) => Belief::NotMounted,
            (Call::Stage | Call::Publish, Err(code)) => match (*belief, is_final(code)) {
                (Belief::Uncertain, true) => Belief::NotMounted,
                (Belief::NotMounted, false) => Belief::Uncertain,
                (unchanged, _) => unchanged,
            },
            // The pod's volume stays as it was: unpublished again.
            (Call::Unpublish, Err(_)) => *belief,
            (Call::Unstage, Err(_)) => Belief::Uncertain,
        };
    }
}

/// The pace of kubelet's retries: a pause of `first` after the first
/// failure, doubling to `max`; after `patience` of failures a call counts
/// as stuck (kubelet itself would go on for ever).
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
    pub patience: Duration,
}

/// A call kubelet would go on making for ever: it kept failing for the
/// whole patience.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stuck {
    pub call: Call,
    pub attempts: u32,
    pub last: Failure,
    /// kubelet's beliefs when the caller stopped waiting.
    pub volume: Volume,
}

impl std::fmt::Display for Stuck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} still failing after {} attempts (device {:?}, pod {:?}); the last: {}",
            self.call.name(),
            self.attempts,
            self.volume.device,
            self.volume.pod,
            self.last
        )
    }
}

/// kubelet's mount-reference check on a blocking thread: its stat of a
/// FUSE mount whose server is stopped (a SNAP stall) waits until the server
/// answers, as kubelet's goroutine for the volume does, and must not hold a
/// runtime worker the caller's other tasks (the one that ends the stall)
/// need meanwhile.
async fn check_off_the_runtime(path: &Path) -> Result<(), Failure> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || kubelet_fs::check_device_mount_refs(&path))
        .await
        .unwrap_or_else(|e| {
            Err(Failure {
                code: None,
                message: format!("GetDeviceMountRefs check failed: {e}"),
            })
        })
}

/// Makes kubelet's calls for `volume` until it has nothing more to do (the
/// pod runs with the volume, or the volume is forgotten), each through
/// `make`, pausing as `backoff` says after a failure. A call that keeps
/// failing for `backoff.patience` is [`Stuck`]. `device_mount_path` is a
/// filesystem volume's staging path, which kubelet checks for references
/// before each NodeUnstageVolume (`None`: a block volume, which it does not).
pub async fn settle<F, Fut>(
    volume: &mut Volume,
    device_mount_path: Option<&Path>,
    backoff: &Backoff,
    mut make: F,
) -> Result<(), Stuck>
where
    F: FnMut(Call) -> Fut,
    Fut: Future<Output = Result<(), Failure>>,
{
    let mut failing: Option<(Call, u32, tokio::time::Instant)> = None;
    let mut pause = backoff.first;
    while let Some(call) = volume.next() {
        let checked = match (call, device_mount_path) {
            (Call::Unstage, Some(path)) => check_off_the_runtime(path).await,
            _ => Ok(()),
        };
        let outcome = match checked {
            Ok(()) => make(call).await,
            Err(failure) => Err(failure),
        };
        match outcome {
            Ok(()) => {
                volume.record(call, Ok(()));
                failing = None;
                pause = backoff.first;
            }
            Err(failure) => {
                volume.record(call, Err(failure.code));
                let (attempts, since) = match failing {
                    Some((same, attempts, since)) if same == call => (attempts + 1, since),
                    _ => (1, tokio::time::Instant::now()),
                };
                failing = Some((call, attempts, since));
                if since.elapsed() + pause > backoff.patience {
                    return Err(Stuck {
                        call,
                        attempts,
                        last: failure,
                        volume: *volume,
                    });
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(backoff.max);
            }
        }
    }
    Ok(())
}
