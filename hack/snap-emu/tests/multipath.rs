//! SPDK's bdev_nvme multipath through the emulator's data path, end to end:
//! a target's volume attached by a DPU through both listeners of its
//! subsystem (two controllers under one name, "multipath": "multipath",
//! the sample plugin's reconnect policy) and written by the host without a
//! pause. The target removes the listener of the path in use: no write
//! fails, the longest write stalls far less than Linux's NVMe I/O timeout
//! (30 s), and every block holds what was last written; the listener back,
//! the path reconnects by itself and active_passive uses it again. With
//! both listeners removed the writes wait, as one path's would under that
//! policy, and go on once one is back.
//! Needs root, loop devices and /dev/fuse.

mod common;
#[path = "../../../tests/common/direct_io.rs"]
mod direct_io;

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{Client, Emu, expose_virtio_blk, free_port, sparse_file};
use direct_io::{Aligned, open_direct};
use serde_json::{Value, json};

const BLOCK: usize = 4096;
/// The writes go round these blocks (1 MiB), each rewritten many times.
const BLOCKS: u64 = 256;
/// Far below the 30 s after which Linux's NVMe driver fails an I/O.
const STALL_LIMIT: Duration = Duration::from_secs(5);
/// How long a wait for the emulators' background work may take.
const WAIT: Duration = Duration::from_secs(60);
const NQN: &str = "nqn.2024-01.io.example:mp";

/// The host writing one block after another, each stamped with its block
/// and sequence number, until stopped.
struct Writer {
    done: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    /// When the write in flight started.
    busy: Arc<Mutex<Option<Instant>>>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Written>,
}

/// What the writer did: the longest write, the errors, and each block's
/// last sequence number.
struct Written {
    max_stall: Duration,
    errors: Vec<String>,
    last: HashMap<u64, u64>,
}

fn stamped(block: u64, seq: u64) -> Aligned {
    let mut buf = Aligned::new(BLOCK, seq as u8);
    buf.get_mut()[..8].copy_from_slice(&block.to_le_bytes());
    buf.get_mut()[8..16].copy_from_slice(&seq.to_le_bytes());
    buf
}

impl Writer {
    fn start(dev: &Path) -> Writer {
        let f = open_direct(dev);
        let done = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let busy = Arc::new(Mutex::new(None));
        let (d, e, s) = (Arc::clone(&done), Arc::clone(&errors), Arc::clone(&stop));
        let b = Arc::clone(&busy);
        let thread = std::thread::spawn(move || {
            let mut out = Written {
                max_stall: Duration::ZERO,
                errors: vec![],
                last: HashMap::new(),
            };
            let mut seq = 0u64;
            while !s.load(Ordering::Relaxed) {
                seq += 1;
                let block = seq % BLOCKS;
                let started = Instant::now();
                *b.lock().unwrap() = Some(started);
                let written = f.write_all_at(stamped(block, seq).get(), block * BLOCK as u64);
                *b.lock().unwrap() = None;
                out.max_stall = out.max_stall.max(started.elapsed());
                match written {
                    Ok(()) => {
                        out.last.insert(block, seq);
                    }
                    Err(err) => {
                        out.errors
                            .push(format!("write {seq} at block {block}: {err}"));
                        e.fetch_add(1, Ordering::Relaxed);
                    }
                }
                d.fetch_add(1, Ordering::Relaxed);
            }
            out
        });
        Writer {
            done,
            errors,
            busy,
            stop,
            thread,
        }
    }

    /// Waits until `n` more writes are done than now.
    async fn more(&self, n: u64) {
        let target = self.done.load(Ordering::Relaxed) + n;
        let done = Arc::clone(&self.done);
        poll(&format!("{n} more writes"), || {
            done.load(Ordering::Relaxed) >= target
        })
        .await;
    }

    /// Waits until a write has been in flight for `held`.
    async fn held(&self, held: Duration) {
        let busy = Arc::clone(&self.busy);
        poll(&format!("a write in flight for {held:?}"), || {
            busy.lock().unwrap().is_some_and(|t| t.elapsed() >= held)
        })
        .await;
    }

    fn finish(self) -> Written {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the writer")
    }
}

/// Waits until `done` holds, polling.
async fn poll(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A path as `bdev_nvme_get_io_paths` shows it: its port, whether it is
/// connected and whether it is current.
#[derive(Debug, Clone, PartialEq, Eq)]
struct IoPath {
    port: String,
    connected: bool,
    current: bool,
}

async fn io_paths(d: &mut Client) -> Vec<IoPath> {
    let answer = d.ok("bdev_nvme_get_io_paths", json!({"name": "rn1"})).await;
    answer["poll_groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["io_paths"].as_array().unwrap().clone())
        .map(|p| IoPath {
            port: p["transport"]["trsvcid"].as_str().unwrap().to_owned(),
            connected: p["connected"].as_bool().unwrap(),
            current: p["current"].as_bool().unwrap(),
        })
        .collect()
}

/// Polls the initiator's paths until `want` holds of them.
async fn wait_paths(d: &mut Client, what: &str, want: impl Fn(&[IoPath]) -> bool) -> Vec<IoPath> {
    let deadline = Instant::now() + WAIT;
    loop {
        let paths = io_paths(d).await;
        if want(&paths) {
            return paths;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {WAIT:?}: {paths:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn path<'a>(paths: &'a [IoPath], port: &str) -> &'a IoPath {
    paths.iter().find(|p| p.port == port).expect("the path")
}

fn listener(port: &str) -> Value {
    json!({"nqn": NQN, "listen_address": {"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": port}})
}

/// A target exporting a volume on two listeners, a DPU attached through
/// both, and the volume on the DPU's host.
struct Rig {
    target: Emu,
    dpu: Emu,
    t: Client,
    d: Client,
    img: PathBuf,
    dev: PathBuf,
    ports: [String; 2],
    _dir: tempfile::TempDir,
}

impl Rig {
    async fn start() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let (target, dpu) = Emu::start_target_and_dpu(dir.path()).await;
        let (mut t, mut d) = (target.client().await, dpu.client().await);
        let img = dir.path().join("vol.img");
        sparse_file(&img, 16 << 20);
        t.ok(
            "bdev_aio_create",
            json!({"name": "vol", "filename": img, "block_size": 512}),
        )
        .await;
        let ports = [free_port().to_string(), free_port().to_string()];
        t.export_over_tcp("vol", NQN, &ports[0]).await;
        t.ok("nvmf_subsystem_add_listener", listener(&ports[1]))
            .await;
        for port in &ports {
            let names = d
                .ok(
                    "bdev_nvme_attach_controller",
                    json!({"name": "r", "trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1",
                           "trsvcid": port, "subnqn": NQN, "multipath": "multipath",
                           "ctrlr_loss_timeout_sec": -1, "reconnect_delay_sec": 1}),
                )
                .await;
            assert_eq!(names, json!(["rn1"]));
        }
        let dev = expose_virtio_blk(&dpu, &mut d, "rn1").await;
        Rig {
            target,
            dpu,
            t,
            d,
            img,
            dev,
            ports,
            _dir: dir,
        }
    }

    /// Every block holds the last write the host made to it.
    fn check_blocks(&self, written: &Written) {
        let file = File::open(&self.img).unwrap();
        for (block, seq) in &written.last {
            let mut got = vec![0; BLOCK];
            file.read_exact_at(&mut got, block * BLOCK as u64).unwrap();
            assert!(
                got == stamped(*block, *seq).get(),
                "block {block} holds write {} of block {}, not write {seq}",
                u64::from_le_bytes(got[8..16].try_into().unwrap()),
                u64::from_le_bytes(got[..8].try_into().unwrap()),
            );
        }
        assert_eq!(written.last.len() as u64, BLOCKS, "every block was written");
    }

    async fn stop(self) {
        drop((self.t, self.d));
        self.dpu.stop().await;
        self.target.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_cut_under_writes_is_a_short_pause_and_comes_back_by_itself() {
    let mut rig = Rig::start().await;
    let [first, second] = rig.ports.clone();
    let writer = Writer::start(&rig.dev);
    writer.more(2 * BLOCKS).await;
    let paths = io_paths(&mut rig.d).await;
    assert!(
        path(&paths, &first).current && !path(&paths, &second).current,
        "active_passive writes by the first path: {paths:?}"
    );

    // Cut the path in use while the host writes.
    rig.t
        .ok("nvmf_subsystem_remove_listener", listener(&first))
        .await;
    wait_paths(&mut rig.d, "the first path lost", |p| {
        !path(p, &first).connected && path(p, &second).current
    })
    .await;
    writer.more(2 * BLOCKS).await;
    let paths = io_paths(&mut rig.d).await;
    assert!(
        !path(&paths, &first).connected,
        "the writes went by the second path: {paths:?}"
    );
    assert_eq!(writer.errors.load(Ordering::Relaxed), 0);

    // The listener back: the path reconnects by itself (the initiator is
    // only asked for its paths) and is preferred again.
    rig.t
        .ok("nvmf_subsystem_add_listener", listener(&first))
        .await;
    wait_paths(&mut rig.d, "the first path back and current", |p| {
        p.iter().all(|p| p.connected) && path(p, &first).current
    })
    .await;
    writer.more(2 * BLOCKS).await;

    let written = writer.finish();
    assert!(written.errors.is_empty(), "{:?}", written.errors);
    eprintln!("longest write across the failover: {:?}", written.max_stall);
    assert!(
        written.max_stall < STALL_LIMIT,
        "a write stalled {:?}",
        written.max_stall
    );
    rig.check_blocks(&written);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_path_cut_writes_wait_for_one_to_come_back() {
    let mut rig = Rig::start().await;
    let [first, second] = rig.ports.clone();
    let writer = Writer::start(&rig.dev);
    writer.more(BLOCKS).await;

    for port in [&first, &second] {
        rig.t
            .ok("nvmf_subsystem_remove_listener", listener(port))
            .await;
    }
    wait_paths(&mut rig.d, "every path lost", |p| {
        p.iter().all(|p| !p.connected)
    })
    .await;
    // The write in flight waits (ctrlr_loss_timeout_sec -1) for longer
    // than a reconnect delay, rather than fail.
    writer.held(Duration::from_millis(1500)).await;
    assert_eq!(writer.errors.load(Ordering::Relaxed), 0, "no write fails");

    rig.t
        .ok("nvmf_subsystem_add_listener", listener(&second))
        .await;
    wait_paths(&mut rig.d, "the second path back", |p| {
        path(p, &second).connected && path(p, &second).current
    })
    .await;
    writer.more(BLOCKS).await;
    let written = writer.finish();
    assert!(written.errors.is_empty(), "{:?}", written.errors);
    eprintln!("longest write with every path cut: {:?}", written.max_stall);
    assert!(written.max_stall >= Duration::from_millis(1500));
    rig.check_blocks(&written);
    rig.stop().await;
}
