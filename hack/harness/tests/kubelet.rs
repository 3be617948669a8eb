//! kubelet's rules for the Node calls (`snap_csi_harness::kubelet`), each
//! rule as the source it comes from states it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use snap_csi_harness::kubelet::{
    Backoff, Belief, Call, Failure, Volume, is_final, retries_expand, settle,
};
use snap_csi_harness::kubelet_fs::device_mount_refs;
use tonic::Code;

fn wanted() -> Volume {
    Volume {
        wanted: true,
        ..Volume::default()
    }
}

#[test]
fn the_codes_kubelet_takes_as_final() {
    for code in [
        Code::Cancelled,
        Code::DeadlineExceeded,
        Code::Unavailable,
        Code::ResourceExhausted,
        Code::Aborted,
    ] {
        assert!(!is_final(Some(code)), "{code:?}");
    }
    for code in [
        Code::Unknown,
        Code::InvalidArgument,
        Code::NotFound,
        Code::AlreadyExists,
        Code::FailedPrecondition,
        Code::Internal,
    ] {
        assert!(is_final(Some(code)), "{code:?}");
    }
    assert!(!is_final(None), "an error with no status");
    assert!(!retries_expand(Some(Code::FailedPrecondition)));
    assert!(retries_expand(Some(Code::Internal)));
}

#[test]
fn a_broken_connection_is_unavailable_as_grpc_go_says() {
    // What tonic makes of a connection that broke mid-call: its own status
    // with the transport's error as the source.
    let broken = tonic::Status::from_error(Box::new(std::io::Error::other("connection reset")));
    assert_eq!(Failure::of(&broken).code, Some(Code::Unavailable));
    let sent = tonic::Status::failed_precondition("on a dead device");
    assert_eq!(Failure::of(&sent).code, Some(Code::FailedPrecondition));
    let deadline = tonic::Status::from_error(Box::new(tonic::Status::cancelled("timeout")));
    assert_eq!(Failure::of(&deadline).code, Some(Code::Cancelled));
}

#[test]
fn a_pod_stages_then_publishes_and_goes_the_other_way_round() {
    let mut volume = wanted();
    assert_eq!(volume.next(), Some(Call::Stage));
    volume.record(Call::Stage, Ok(()));
    assert_eq!(volume.next(), Some(Call::Publish));
    volume.record(Call::Publish, Ok(()));
    assert_eq!(volume.next(), None, "the pod runs");
    volume.wanted = false;
    assert_eq!(volume.next(), Some(Call::Unpublish));
    volume.record(Call::Unpublish, Ok(()));
    assert_eq!(volume.next(), Some(Call::Unstage));
    volume.record(Call::Unstage, Ok(()));
    assert_eq!(volume.next(), None, "forgotten");
}

#[test]
fn an_interrupted_stage_refused_after_is_never_unstaged() {
    let mut volume = wanted();
    volume.record(Call::Stage, Err(Some(Code::Unavailable)));
    assert_eq!(volume.device, Belief::Uncertain);
    assert_eq!(volume.next(), Some(Call::Stage), "retried");
    volume.record(Call::Stage, Err(Some(Code::FailedPrecondition)));
    assert_eq!(volume.device, Belief::NotMounted);
    assert_eq!(volume.next(), Some(Call::Stage), "retried while wanted");
    volume.wanted = false;
    assert_eq!(volume.next(), None, "no NodeUnstageVolume");
}

#[test]
fn an_uncertain_stage_is_unstaged_when_the_pod_goes() {
    let mut volume = wanted();
    // The stage may still be running: the device may be mounted.
    volume.record(Call::Stage, Err(Some(Code::DeadlineExceeded)));
    volume.wanted = false;
    assert_eq!(volume.next(), Some(Call::Unstage));
    volume.record(Call::Unstage, Err(Some(Code::Internal)));
    assert_eq!(volume.device, Belief::Uncertain);
    assert_eq!(volume.next(), Some(Call::Unstage), "retried");
}

#[test]
fn a_failed_publish_is_retried_alone_and_unpublished_only_if_uncertain() {
    let mut volume = wanted();
    volume.record(Call::Stage, Ok(()));
    volume.record(Call::Publish, Err(Some(Code::Internal)));
    assert_eq!(volume.pod, Belief::NotMounted);
    assert_eq!(volume.next(), Some(Call::Publish));
    volume.wanted = false;
    assert_eq!(volume.next(), Some(Call::Unstage), "no unpublish");
    volume.wanted = true;
    volume.record(Call::Publish, Err(Some(Code::Unavailable)));
    volume.wanted = false;
    assert_eq!(volume.next(), Some(Call::Unpublish));
    volume.record(Call::Unpublish, Err(Some(Code::Internal)));
    assert_eq!(volume.next(), Some(Call::Unpublish), "until it succeeds");
}

#[test]
fn a_final_code_on_a_stage_never_tried_before_changes_nothing() {
    let mut volume = wanted();
    volume.record(Call::Stage, Err(Some(Code::InvalidArgument)));
    assert_eq!(volume.device, Belief::NotMounted);
    volume.wanted = false;
    assert_eq!(volume.next(), None);
}

#[tokio::test]
async fn settle_retries_until_it_works_or_its_patience_ends() {
    let backoff = Backoff {
        first: Duration::from_millis(1),
        max: Duration::from_millis(4),
        patience: Duration::from_millis(100),
    };
    let mut volume = wanted();
    let mut calls = Vec::new();
    let mut failures = 2;
    settle(&mut volume, None, &backoff, |call| {
        calls.push(call);
        let fail = call == Call::Stage && failures > 0;
        failures -= usize::from(fail);
        async move {
            match fail {
                true => Err(Failure {
                    code: Some(Code::Unavailable),
                    message: "killed".into(),
                }),
                false => Ok(()),
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(
        calls,
        [Call::Stage, Call::Stage, Call::Stage, Call::Publish]
    );

    let mut volume = wanted();
    let stuck = settle(&mut volume, None, &backoff, |_| async {
        Err(Failure {
            code: Some(Code::FailedPrecondition),
            message: "on a dead device".into(),
        })
    })
    .await
    .unwrap_err();
    assert_eq!(stuck.call, Call::Stage);
    assert!(stuck.attempts > 3, "{stuck}");
    assert_eq!(stuck.volume.device, Belief::NotMounted);
}

/// A tmpfs at `at`, unmounted when dropped.
struct Mounted(PathBuf);

impl Mounted {
    fn tmpfs(at: &Path) -> Mounted {
        std::fs::create_dir_all(at).unwrap();
        mount(
            Some("tmpfs"),
            at,
            Some("tmpfs"),
            MsFlags::empty(),
            None::<&str>,
        )
        .unwrap();
        Mounted(at.to_owned())
    }

    fn bind(from: &Path, at: &Path) -> Mounted {
        std::fs::create_dir_all(at).unwrap();
        mount(Some(from), at, None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap();
        Mounted(at.to_owned())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = umount2(&self.0, MntFlags::MNT_DETACH);
    }
}

/// GetDeviceMountRefs: the layout the SNAP emulator's host once left, its
/// own mount of a virtio-fs device bound onto the staging path, is a
/// reference kubelet will not unstage past; kubelet's own mounts (another
/// kubelet root's path, a pod's) and a subdirectory's bind are not; a
/// dead mount has none. Needs root.
#[tokio::test]
async fn another_mount_of_the_staging_filesystem_keeps_kubelet_from_unstaging() {
    let dir = tempfile::tempdir().unwrap();
    let csi = "plugins/kubernetes.io/csi/csi.snap-csi.io/0123abcd/globalmount";
    let staging = dir.path().join("var/lib/kubelet").join(csi);
    let emulator = dir.path().join("emulator/virtiofs/tag");
    let device = Mounted::tmpfs(&emulator);
    std::fs::create_dir(emulator.join("sub")).unwrap();
    let staged = Mounted::bind(&emulator, &staging);
    assert_eq!(
        device_mount_refs(&staging).unwrap(),
        std::slice::from_ref(&emulator)
    );

    let backoff = Backoff {
        first: Duration::from_millis(1),
        max: Duration::from_millis(2),
        patience: Duration::from_millis(50),
    };
    let mut volume = Volume {
        device: Belief::Mounted,
        ..Volume::default()
    };
    let mut calls = Vec::new();
    let stuck = settle(&mut volume, Some(&staging), &backoff, |call| {
        calls.push(call);
        async { Ok(()) }
    })
    .await
    .unwrap_err();
    assert!(calls.is_empty(), "NodeUnstageVolume was sent: {calls:?}");
    assert_eq!(stuck.call, Call::Unstage);
    assert_eq!(stuck.volume.device, Belief::Uncertain);
    assert!(
        stuck
            .last
            .message
            .contains("GetDeviceMountRefs check failed")
            && stuck.last.message.contains(emulator.to_str().unwrap()),
        "{stuck}"
    );
    drop(device);
    assert_eq!(device_mount_refs(&staging).unwrap(), Vec::<PathBuf>::new());

    let other_root = dir.path().join("mnt/kubelet").join(csi);
    let _kubelets = Mounted::bind(&staging, &other_root);
    let _sub = Mounted::bind(&staging.join("sub"), &dir.path().join("subpath"));
    assert_eq!(device_mount_refs(&staging).unwrap(), Vec::<PathBuf>::new());
    let mut volume = Volume {
        device: Belief::Mounted,
        ..Volume::default()
    };
    settle(&mut volume, Some(&staging), &backoff, |_| async { Ok(()) })
        .await
        .unwrap();
    drop(staged);
    assert_eq!(
        device_mount_refs(&dir.path().join("gone")).unwrap(),
        Vec::<PathBuf>::new()
    );
}
