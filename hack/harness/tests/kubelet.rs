//! kubelet's rules for the Node calls (`snap_csi_harness::kubelet`), each
//! rule as the source it comes from states it.

use std::time::Duration;

use snap_csi_harness::kubelet::{
    Backoff, Belief, Call, Failure, Volume, is_final, retries_expand, settle,
};
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
    settle(&mut volume, &backoff, |call| {
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
    let stuck = settle(&mut volume, &backoff, |_| async {
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
