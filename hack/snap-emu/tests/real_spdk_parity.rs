//! The emulator held against a real SPDK v24.09 `spdk_tgt`, method by method:
//! every SPDK method the emulator implements is called with the same
//! requests on both (good arguments and bad: missing, wrong types, unknown
//! names, repeated creates and deletes), and every result and error is
//! compared after masking what legitimately differs (UUIDs, the directory,
//! the TCP port, I/O and time counters). The requests are the script in
//! `fixtures/real-spdk-parity.txt`. Differences the emulator keeps on purpose
//! are listed in its module docs (`src/lib.rs`, "Known differences"), each
//! under the id of the step that shows it; any other difference fails.
//!
//! SNAP's methods are not here: SNAP is not public, so the emulator's SNAP
//! side is held against the captures in `reference/snap4-rpc.md` instead.
//! Nor are SPDK's crypto methods ([`WITHOUT_CRYPTO`]): the test `spdk_tgt`
//! has no crypto to compare with.
//! Runs when `SNAP_CSI_SPDK_TGT` names an `spdk_tgt` binary.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use common::real_spdk::Suite;
use common::{Client, Emu, free_port, mask_uuids, sparse_file};
use serde_json::{Value, json};
use snap_emu::Config;

const MIB: u64 = 1 << 20;
const SCRIPT: &str = include_str!("fixtures/real-spdk-parity.txt");
/// How long an `!until` step waits for its answer (a reconnect delay is 1 s).
const UNTIL_TIMEOUT: Duration = Duration::from_secs(20);

/// Keys whose values are measurements, not state: compared by type only.
/// I/O counters are among them: real SPDK reads a new bdev when it examines
/// it (partition tables, lvol superblocks), the emulator does not.
fn measured(key: &str) -> bool {
    matches!(key, "tick_rate" | "ticks")
        || key.ends_with("_ticks")
        || key.starts_with("bytes_")
        || (key.starts_with("num_") && key.ends_with("_ops"))
}

/// One step of the script (`fixtures/real-spdk-parity.txt`), run on both.
enum Step {
    /// A call, named by `id`; `save` remembers its (string) result.
    Call {
        id: String,
        method: String,
        params: Option<Value>,
        save: Option<String>,
    },
    /// Grow a file of the side's directory (for `bdev_aio_rescan`).
    Grow(String, u64),
    /// Call `method` until its answer (compact JSON) has, or lacks, `text`:
    /// each side at its own pace, for what happens in the background.
    Until {
        method: String,
        params: Option<Value>,
        has: bool,
        text: String,
    },
}

fn script() -> Vec<Step> {
    let mut steps = vec![];
    for line in SCRIPT.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(grow) = line.strip_prefix("!grow ") {
            let (file, size) = grow.split_once(' ').expect("!grow FILE BYTES");
            steps.push(Step::Grow(file.into(), size.parse().expect("bytes")));
            continue;
        }
        if let Some(until) = line.strip_prefix("!until ") {
            let mut words = until.splitn(4, ' ');
            let usage = "!until METHOD has|lacks TEXT [PARAMS]";
            let method = words.next().expect(usage).to_string();
            let has = match words.next().expect(usage) {
                "has" => true,
                "lacks" => false,
                other => panic!("{usage}: {other}"),
            };
            let text = words.next().expect(usage).to_string();
            let params = words
                .next()
                .map(|json| serde_json::from_str(json).unwrap_or_else(|e| panic!("{line}: {e}")));
            steps.push(Step::Until {
                method,
                params,
                has,
                text,
            });
            continue;
        }
        let (line, save) = match line.split_once(" => ") {
            Some((line, name)) => (line, Some(name.to_string())),
            None => (line, None),
        };
        let mut words = line.splitn(3, ' ');
        let id = words.next().unwrap().to_string();
        let method = words
            .next()
            .unwrap_or_else(|| panic!("{id}: no method"))
            .to_string();
        let params = words
            .next()
            .map(|json| serde_json::from_str(json).unwrap_or_else(|e| panic!("{id}: {e}")));
        steps.push(Step::Call {
            id,
            method,
            params,
            save,
        });
    }
    steps
}

/// `text` with every `number` that is a whole number (no digit either side)
/// replaced: a port must not be masked inside a longer number (port 41943
/// in a cluster size of 4194304).
fn replace_number(text: &str, number: &str, with: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(number) {
        let end = at + number.len();
        let digit_before = rest[..at].ends_with(|c: char| c.is_ascii_digit())
            || (at == 0 && out.ends_with(|c: char| c.is_ascii_digit()));
        let digit_after = rest[end..].starts_with(|c: char| c.is_ascii_digit());
        out.push_str(&rest[..at]);
        out.push_str(if digit_before || digit_after {
            number
        } else {
            with
        });
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[test]
fn a_port_is_masked_only_as_a_whole_number() {
    assert_eq!(
        replace_number(
            r#"{"trsvcid":"41943","cluster_size":4194304}"#,
            "41943",
            "{port}"
        ),
        r#"{"trsvcid":"{port}","cluster_size":4194304}"#
    );
    assert_eq!(replace_number("4194341943", "41943", "P"), "4194341943");
    assert_eq!(replace_number("41943:41943", "41943", "P"), "P:P");
}

/// One side: the emulator or the real target, with its directory and port.
struct Side {
    client: Client,
    dir: String,
    vars: HashMap<String, String>,
}

impl Side {
    async fn new(socket: &Path, dir: &Path) -> Side {
        sparse_file(&dir.join("aio.img"), 8 * MIB);
        sparse_file(&dir.join("other.img"), 4 * MIB);
        sparse_file(&dir.join("pool.img"), 64 * MIB);
        sparse_file(&dir.join("empty.img"), 0);
        sparse_file(&dir.join("odd.img"), 4096 + 512);
        sparse_file(&dir.join("small.img"), 4 * MIB);
        std::fs::create_dir(dir.join("fs")).unwrap();
        let vars = HashMap::from([
            ("port".to_string(), free_port().to_string()),
            ("closed".to_string(), free_port().to_string()),
            ("mp1".to_string(), free_port().to_string()),
            ("mp2".to_string(), free_port().to_string()),
        ]);
        Side {
            client: Client::connect(socket).await,
            dir: dir.display().to_string(),
            vars,
        }
    }

    /// `{dir}` and the saved values put in.
    fn fill(&self, params: &Value) -> Value {
        serde_json::from_str(&self.fill_text(&params.to_string())).unwrap()
    }

    fn fill_text(&self, text: &str) -> String {
        let mut text = text.replace("{dir}", &self.dir);
        for (name, value) in &self.vars {
            text = text.replace(&format!("{{{name}}}"), value);
        }
        text
    }

    /// An answer with what legitimately differs masked: the directory, the
    /// ports, UUIDs, and measurements (by type only).
    fn masked(&self, answer: &Result<Value, (i64, String)>) -> String {
        let text = match answer {
            Ok(result) => json!({"result": measured_masked(result.clone())}),
            Err((code, message)) => json!({"error": {"code": code, "message": message}}),
        }
        .to_string()
        .replace(&self.dir, "{dir}");
        let mut text = mask_nguids(&String::from_utf8(mask_uuids(text.as_bytes())).unwrap());
        for (name, value) in &self.vars {
            text = replace_number(&text, value, &format!("{{{name}}}"));
        }
        text
    }

    async fn run(&mut self, step: &Step) -> Option<String> {
        match step {
            Step::Grow(file, size) => {
                let file = std::fs::File::options()
                    .write(true)
                    .open(Path::new(&self.dir).join(file))
                    .unwrap();
                file.set_len(*size).unwrap();
                None
            }
            Step::Until {
                method,
                params,
                has,
                text,
            } => {
                let params = params.as_ref().map(|p| self.fill(p));
                let text = self.fill_text(text);
                let started = Instant::now();
                loop {
                    let answer = match self.client.call(method, params.clone()).await {
                        Ok(result) => result.to_string(),
                        Err((code, message)) => format!("{code} {message}"),
                    };
                    if answer.contains(&text) == *has {
                        return None;
                    }
                    assert!(
                        started.elapsed() < UNTIL_TIMEOUT,
                        "{} {method}: not {} {text} within {UNTIL_TIMEOUT:?}: {answer}",
                        self.dir,
                        if *has { "has" } else { "lacks" },
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            Step::Call {
                method,
                params,
                save,
                ..
            } => {
                let params = params.as_ref().map(|p| self.fill(p));
                let answer = self.client.call(method, params).await;
                if let (Some(name), Ok(Value::String(value))) = (save, &answer) {
                    self.vars.insert(name.clone(), value.clone());
                }
                Some(self.masked(&answer))
            }
        }
    }
}

fn measured_masked(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| {
                    let v = match (measured(&k), v) {
                        (true, Value::Number(_)) => json!(0),
                        (_, v) => measured_masked(v),
                    };
                    (k, v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(measured_masked).collect()),
        other => other,
    }
}

/// Masks NGUIDs (a UUID's 16 bytes in upper-case hex, as both derive them
/// from the bdev's UUID) like [`mask_uuids`] masks UUIDs.
fn mask_nguids(text: &str) -> String {
    let mut parts: Vec<String> = text.split('"').map(str::to_string).collect();
    for part in &mut parts {
        if part.len() == 32
            && part
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_lowercase())
        {
            *part = "0".repeat(32);
        }
    }
    parts.join("\"")
}

/// The step ids whose differences the emulator's docs accept.
fn documented() -> BTreeSet<String> {
    const DOCS: &str = include_str!("../src/lib.rs");
    DOCS.split("`parity:")
        .skip(1)
        .map(|rest| rest.split('`').next().unwrap().to_string())
        .collect()
}

/// SPDK's crypto methods, which SNAP carries but the test `spdk_tgt` cannot
/// answer: it is built without crypto (no crypto vbdev, no ISA-L crypto for
/// the software module's keys), so they are held to SPDK v24.09's sources
/// instead (`src/bdev/crypto.rs` says where each check and message comes from).
const WITHOUT_CRYPTO: [&str; 5] = [
    "accel_crypto_key_create",
    "accel_crypto_key_destroy",
    "accel_crypto_keys_get",
    "bdev_crypto_create",
    "bdev_crypto_delete",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_emulator_answers_as_real_spdk_does() {
    let Some(suite) = Suite::acquire() else {
        return;
    };
    let real = suite.spdk_tgt();
    let dir = tempfile::tempdir().unwrap();
    let emulator = Emu::start(Config::for_test(dir.path()).without_snap()).await;
    let mut sides = [
        Side::new(&real.socket, real.path()).await,
        Side::new(&emulator.socket, dir.path()).await,
    ];

    let script = script();
    let mut ids = BTreeSet::new();
    for step in &script {
        if let Step::Call { id, .. } = step {
            assert!(ids.insert(id), "step id {id} is used twice");
        }
    }
    let mut differences = vec![];
    let mut covered = BTreeSet::new();
    for step in &script {
        let mut answers = vec![];
        for side in &mut sides {
            answers.extend(side.run(step).await);
        }
        if let (Step::Call { id, method, .. }, [real, emulated]) = (step, &answers[..]) {
            covered.insert(method.as_str());
            if real != emulated {
                differences.push((id.clone(), real.clone(), emulated.clone()));
            }
        }
    }

    // Every method the emulator offers is in real SPDK's list and in the script.
    let mut methods = vec![];
    for side in &mut sides {
        let listed = side.client.call("rpc_get_methods", None).await.unwrap();
        methods.push(serde_json::from_value::<BTreeSet<String>>(listed).unwrap());
    }
    let [real_methods, emulated] = &methods[..] else {
        unreachable!()
    };
    let missing: Vec<_> = emulated
        .difference(real_methods)
        .filter(|m| !WITHOUT_CRYPTO.contains(&m.as_str()))
        .collect();
    assert!(missing.is_empty(), "not methods of spdk_tgt: {missing:?}");
    let uncovered: Vec<_> = emulated
        .iter()
        .filter(|m| !covered.contains(m.as_str()) && !WITHOUT_CRYPTO.contains(&m.as_str()))
        .collect();
    assert!(uncovered.is_empty(), "not in the script: {uncovered:?}");

    let documented = documented();
    let mut report = String::new();
    for (id, real, emulated) in &differences {
        let mark = if documented.contains(id) {
            "documented"
        } else {
            "NEW"
        };
        report += &format!("{mark} {id}:\n  spdk_tgt: {real}\n  emulator: {emulated}\n");
    }
    println!("{report}");
    let found: BTreeSet<String> = differences.iter().map(|d| d.0.clone()).collect();
    let undocumented: Vec<_> = found.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "differences not in the emulator's docs: {undocumented:?}\n{report}"
    );
    let stale: Vec<_> = documented.difference(&found).collect();
    assert!(
        stale.is_empty(),
        "documented differences that are gone (remove them from src/lib.rs): {stale:?}"
    );
    emulator.stop().await;
}
