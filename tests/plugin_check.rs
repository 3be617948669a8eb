//! `snap-csi plugin-check` against plugins whose conformance is known: the
//! test vendor plugin over the SNAP emulator (every check passes), and the
//! broken plugin with one fault at a time (exactly that fault's checks fail),
//! in-process and through the real binary.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use common::broken_plugin::{self, Fault};
use common::{Emulator, plugin, sparse_file};
use snap_csi::plugin_check::{self, Config, Report, Verdict, checks};
use snap_csi::proto::nvidia::storage::plugins::v1::storage_plugin_service_capability::rpc::Type as Capability;
use snap_csi::spdk::bdev::BdevGetBdevs;

const TIMEOUT: Duration = Duration::from_secs(30);

const ALL_CAPABILITIES: [Capability; 3] = [
    Capability::CreateDeleteBlockDevice,
    Capability::GetDeviceStats,
    Capability::ListDevices,
];

/// The checks that SKIP on a plugin advertising every capability of block
/// devices: they only judge what is not advertised (filesystem devices too).
const UNADVERTISED_ONLY: [&str; 4] = [
    checks::CREATE_DELETE_UNIMPLEMENTED,
    checks::GET_DEVICE_UNIMPLEMENTED,
    checks::LIST_DEVICES_UNIMPLEMENTED,
    checks::FS_DEVICE,
];

/// The checks that SKIP on the test plugin as it starts, which offers every
/// capability and both kinds of device: only a kind it does not offer could
/// be refused.
const SKIPPED_BY_THE_TEST_PLUGIN: [&str; 4] = [
    checks::CREATE_DELETE_UNIMPLEMENTED,
    checks::GET_DEVICE_UNIMPLEMENTED,
    checks::LIST_DEVICES_UNIMPLEMENTED,
    checks::UNOFFERED_KIND_REFUSED,
];

async fn check(socket: &Path, volume_context: HashMap<String, String>) -> Report {
    let config = Config {
        socket: socket.to_path_buf(),
        volume_context,
        fs_volume_context: HashMap::new(),
        timeout: TIMEOUT,
    };
    let mut printed = Vec::new();
    let report = plugin_check::run(&config, &mut |r| printed.push(r.to_string()))
        .await
        .expect("the plugin is reachable");
    let in_order: Vec<_> = report.results.iter().map(|r| r.to_string()).collect();
    assert_eq!(printed, in_order, "each result is handed out as it comes");
    let names: Vec<_> = report.results.iter().map(|r| r.name).collect();
    assert_eq!(names, checks::ALL, "every check reports once, in order");
    report
}

fn all_but(skipped: &[&str]) -> Vec<&'static str> {
    checks::ALL
        .into_iter()
        .filter(|n| !skipped.contains(n))
        .collect()
}

/// The emulator, a backing file, and the test plugin making AIO bdevs on it.
async fn good_stack() -> (Emulator, plugin::TestPlugin, HashMap<String, String>) {
    let emulator = Emulator::start().await;
    let image = emulator.root().join("volume.img");
    sparse_file(&image, 16 << 20);
    let plugin = plugin::start(&emulator.socket, emulator.root()).await;
    let context = HashMap::from([(plugin::PATH_KEY.to_string(), image.display().to_string())]);
    (emulator, plugin, context)
}

async fn bdevs_left_by_the_check(emulator: &Emulator) -> Vec<String> {
    emulator
        .client()
        .call(&BdevGetBdevs::default())
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.name)
        .filter(|n| n.contains("plugin-check-"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_test_plugin_passes_every_check_and_keeps_no_device() {
    let (emulator, plugin, context) = good_stack().await;
    let report = check(&plugin.socket, context).await;
    assert_eq!(report.failed(), 0, "{report}");
    assert_eq!(
        report.names(Verdict::Pass),
        all_but(&SKIPPED_BY_THE_TEST_PLUGIN),
        "{report}"
    );
    assert_eq!(
        bdevs_left_by_the_check(&emulator).await,
        Vec::<String>::new()
    );
    plugin.stop().await;
    emulator.stop().await;
}

#[tokio::test]
async fn a_correct_plugin_passes_whatever_it_advertises() {
    let cases: [(&[Capability], &[&str]); 4] = [
        (&ALL_CAPABILITIES, &UNADVERTISED_ONLY),
        // Nothing advertised: only the UNIMPLEMENTED answers are judged.
        (
            &[],
            &[
                checks::GET_DEVICE_NOT_FOUND,
                checks::DELETE_DEVICE_ABSENT,
                checks::LIST_DEVICES_BAD_TOKEN,
                checks::CREATE_DEVICE,
                checks::CREATE_DEVICE_IDEMPOTENT,
                checks::GET_DEVICE,
                checks::LIST_DEVICES,
                checks::LIST_DEVICES_PAGING,
                checks::DELETE_DEVICE,
                checks::DELETE_DEVICE_IDEMPOTENT,
                checks::GET_DEVICE_AFTER_DELETE,
                checks::LIST_DEVICES_AFTER_DELETE,
                checks::FS_DEVICE,
                checks::UNOFFERED_KIND_REFUSED,
                checks::CLEANUP,
            ],
        ),
        (
            &[Capability::CreateDeleteBlockDevice],
            &[
                checks::CREATE_DELETE_UNIMPLEMENTED,
                checks::GET_DEVICE_NOT_FOUND,
                checks::LIST_DEVICES_BAD_TOKEN,
                checks::GET_DEVICE,
                checks::LIST_DEVICES,
                checks::LIST_DEVICES_PAGING,
                checks::GET_DEVICE_AFTER_DELETE,
                checks::LIST_DEVICES_AFTER_DELETE,
                checks::FS_DEVICE,
                // Nothing left: the paging devices were never made.
                checks::CLEANUP,
            ],
        ),
        (
            &[Capability::CreateDeleteBlockDevice, Capability::ListDevices],
            &[
                checks::CREATE_DELETE_UNIMPLEMENTED,
                checks::LIST_DEVICES_UNIMPLEMENTED,
                checks::GET_DEVICE_NOT_FOUND,
                checks::GET_DEVICE,
                checks::GET_DEVICE_AFTER_DELETE,
                checks::FS_DEVICE,
            ],
        ),
    ];
    for (capabilities, skipped) in cases {
        let dir = tempfile::tempdir().unwrap();
        let plugin = broken_plugin::start(dir.path(), capabilities, &[]);
        let report = check(plugin.socket(), HashMap::new()).await;
        assert_eq!(report.failed(), 0, "{capabilities:?}\n{report}");
        assert_eq!(
            report.names(Verdict::Skip),
            *skipped,
            "{capabilities:?}\n{report}"
        );
        assert_eq!(plugin.devices(), vec![], "{capabilities:?}: cleaned up");
    }
}

/// Each fault alone, on the capabilities that expose it, and the checks it
/// must fail: those and no others.
fn faults() -> Vec<(Fault, &'static [Capability], Vec<&'static str>)> {
    vec![
        (Fault::NotReady, &ALL_CAPABILITIES, vec![checks::PROBE]),
        (
            Fault::NewNameEachCreate,
            &ALL_CAPABILITIES,
            vec![checks::CREATE_DEVICE_IDEMPOTENT],
        ),
        (
            Fault::DeleteAbsentFails,
            &ALL_CAPABILITIES,
            vec![
                checks::DELETE_DEVICE_ABSENT,
                checks::DELETE_DEVICE_IDEMPOTENT,
            ],
        ),
        (
            Fault::GetAbsentOk,
            &ALL_CAPABILITIES,
            vec![
                checks::GET_DEVICE_NOT_FOUND,
                checks::GET_DEVICE_AFTER_DELETE,
            ],
        ),
        (
            Fault::AnyToken,
            &ALL_CAPABILITIES,
            vec![checks::LIST_DEVICES_BAD_TOKEN],
        ),
        (
            Fault::UnadvertisedInternal,
            &[Capability::CreateDeleteBlockDevice],
            vec![
                checks::GET_DEVICE_UNIMPLEMENTED,
                checks::LIST_DEVICES_UNIMPLEMENTED,
            ],
        ),
        (
            Fault::UnadvertisedInternal,
            &[],
            vec![
                checks::CREATE_DELETE_UNIMPLEMENTED,
                checks::GET_DEVICE_UNIMPLEMENTED,
                checks::LIST_DEVICES_UNIMPLEMENTED,
            ],
        ),
    ]
}

#[tokio::test]
async fn each_broken_rule_fails_exactly_its_checks_and_the_run_still_cleans_up() {
    for (fault, capabilities, failing) in faults() {
        let dir = tempfile::tempdir().unwrap();
        let plugin = broken_plugin::start(dir.path(), capabilities, &[fault]);
        let report = check(plugin.socket(), HashMap::new()).await;
        assert_eq!(report.names(Verdict::Fail), failing, "{fault:?}\n{report}");
        for result in report.results.iter().filter(|r| r.verdict == Verdict::Fail) {
            assert!(
                result.detail.contains("expected") && result.detail.contains("The API text: "),
                "{fault:?}: a FAIL says what was expected and what the API requires: {result}"
            );
        }
        assert_eq!(plugin.devices(), vec![], "{fault:?}: cleaned up\n{report}");
    }
}

#[tokio::test]
async fn a_new_name_each_create_is_reported_with_both_names() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = broken_plugin::start(dir.path(), &ALL_CAPABILITIES, &[Fault::NewNameEachCreate]);
    let report = check(plugin.socket(), HashMap::new()).await;
    let fail = report
        .results
        .iter()
        .find(|r| r.name == checks::CREATE_DEVICE_IDEMPOTENT)
        .unwrap();
    assert!(
        fail.detail.contains("got another device \"mem-2-")
            && fail.detail.contains("expected the same device \"mem-1-"),
        "{fail}"
    );
}

// ----- the binary -----

async fn run_binary(socket: &Path, volume_context: &[(&str, &str)]) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_snap-csi"));
    command
        .arg("plugin-check")
        .arg("--endpoint")
        .arg(format!("unix://{}", socket.display()))
        .arg("--timeout")
        .arg("20")
        .kill_on_drop(true);
    for (key, value) in volume_context {
        command
            .arg("--volume-context")
            .arg(format!("{key}={value}"));
    }
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("plugin-check finishes")
        .unwrap();
    // Shown with --nocapture: what a vendor engineer would read.
    println!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The result lines and the summary line of the binary's output.
fn lines(output: &Output) -> (Vec<String>, String) {
    let stdout = String::from_utf8(output.stdout.clone()).unwrap();
    let mut lines: Vec<String> = stdout.lines().map(str::to_string).collect();
    let summary = lines.pop().unwrap_or_default();
    (lines, summary)
}

fn names_with(lines: &[String], verdict: &str) -> Vec<String> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix(verdict)?.strip_prefix(' '))
        .map(|l| l.split(':').next().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_exits_zero_on_the_test_plugin() {
    let (emulator, plugin, context) = good_stack().await;
    let path = &context[plugin::PATH_KEY];
    let output = run_binary(&plugin.socket, &[(plugin::PATH_KEY, path)]).await;
    let (lines, summary) = lines(&output);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}\n{}",
        lines.join("\n"),
        String::from_utf8_lossy(&output.stderr)
    );
    let passing = all_but(&SKIPPED_BY_THE_TEST_PLUGIN);
    assert_eq!(summary, format!("{} passed, 0 failed", passing.len()));
    assert_eq!(names_with(&lines, "PASS"), passing);
    assert_eq!(names_with(&lines, "SKIP"), SKIPPED_BY_THE_TEST_PLUGIN);
    assert_eq!(lines.len(), checks::ALL.len(), "{}", lines.join("\n"));
    assert_eq!(
        bdevs_left_by_the_check(&emulator).await,
        Vec::<String>::new()
    );
    plugin.stop().await;
    emulator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_exits_non_zero_on_the_broken_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let all_at_once = [
        Fault::NotReady,
        Fault::NewNameEachCreate,
        Fault::DeleteAbsentFails,
        Fault::GetAbsentOk,
        Fault::AnyToken,
    ];
    let plugin = broken_plugin::start(dir.path(), &ALL_CAPABILITIES, &all_at_once);
    let output = run_binary(plugin.socket(), &[]).await;
    let (lines, summary) = lines(&output);
    assert_eq!(output.status.code(), Some(1), "{}", lines.join("\n"));
    let mut expected: Vec<&str> = faults()
        .into_iter()
        .filter(|(fault, _, _)| all_at_once.contains(fault))
        .flat_map(|(_, _, failing)| failing)
        .collect();
    expected.sort_by_key(|n| checks::ALL.iter().position(|a| a == n));
    assert_eq!(names_with(&lines, "FAIL"), expected, "{}", lines.join("\n"));
    let passed = checks::ALL.len() - UNADVERTISED_ONLY.len() - expected.len();
    assert_eq!(
        summary,
        format!("{passed} passed, {} failed", expected.len())
    );
    assert_eq!(plugin.devices(), vec![]);
}

#[tokio::test]
async fn the_binary_exits_two_when_nothing_listens() {
    let dir = tempfile::tempdir().unwrap();
    let output = run_binary(&PathBuf::from(dir.path()).join("none.sock"), &[]).await;
    assert_eq!(output.status.code(), Some(2));
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot connect to the plugin"), "{stderr}");
}
