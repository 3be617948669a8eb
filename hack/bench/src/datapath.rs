//! Section 9: what the emulator's FUSE data path costs the host against the
//! direct one. Two stacks side by side, their DPU emulators started with
//! `--data-path direct` (the host's loop device straight over the backing
//! file) and `--data-path fuse` (over a file the emulator serves, so every
//! I/O passes it); on each one block volume (AIO, NVMe, `--size-mib`) staged
//! and published, and the host device under the publish target driven from
//! this process with O_DIRECT at queue depth 1: 1 MiB sequential writes and
//! reads, then 4 KiB random writes and reads (all within what the first
//! writes covered, so no read lands on a hole), each for `--io-seconds` on one stack
//! then the other, who goes first alternating. Before measuring, each
//! stack's device is checked to be on the path it is meant to be (its loop
//! device's backing file under the emulator's FUSE mount or not).

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::fcntl::OFlag;
use nix::sys::stat::{major, minor, stat};
use serde::Serialize;

use crate::csi::{Clients, Kind, Volume};
use crate::report::Report;
use crate::stack::{Stack, StackOptions};
use crate::table::Table;
use crate::{Args, Work, stop};

/// The emulator's data path modes compared, in the report's order.
const MODES: [&str; 2] = ["direct", "fuse"];

/// One workload's rate on one path.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Rate {
    pub ops: u64,
    pub ops_per_s: f64,
    pub mib_per_s: f64,
}

/// One workload on both paths.
#[derive(Debug, Clone, Serialize)]
pub struct Workload {
    pub name: String,
    pub block_bytes: u64,
    pub random: bool,
    pub write: bool,
    pub direct: Rate,
    pub fuse: Rate,
    /// FUSE's throughput as a fraction of the direct path's.
    pub ratio: f64,
}

/// Everything section 9 reports.
#[derive(Debug, Clone, Serialize)]
pub struct DataPath {
    pub seconds: f64,
    pub size_mib: i64,
    /// The backing file of each stack's host device (direct, then FUSE).
    pub backing: Vec<String>,
    pub workloads: Vec<Workload>,
}

/// (name, block size, random, write), in the order run: the sequential
/// writes fill the volume before anything reads it.
const WORKLOADS: [(&str, u64, bool, bool); 4] = [
    ("1 MiB sequential write", 1 << 20, false, true),
    ("1 MiB sequential read", 1 << 20, false, false),
    ("4 KiB random write", 4 << 10, true, true),
    ("4 KiB random read", 4 << 10, true, false),
];

/// One stack with its volume published.
struct Side {
    stack: Stack,
    clients: Clients,
    volume: Volume,
}

pub async fn run(args: &Args, work: &Work, report: &mut Report) -> anyhow::Result<()> {
    eprintln!(
        "bench: section 9: the FUSE data path against the direct one, {} s per workload",
        args.io_seconds
    );
    let mut sides = Vec::new();
    for mode in MODES {
        sides.push(side(args, work, mode).await?);
    }
    let mut backing = Vec::new();
    for (side, mode) in sides.iter().zip(MODES) {
        let file = backing_file(&side.volume.target)?;
        if file.contains("/datapath/") != (mode == "fuse") {
            bail!("stack {}: its device is backed by {file}", side.stack.name);
        }
        backing.push(file);
    }
    let size = u64::try_from(args.size_mib)? << 20;
    let seconds = Duration::from_secs_f64(args.io_seconds);
    // What each side's first sequential write covered: nothing reads
    // beyond it, so no read lands on a hole (cheap on the direct path).
    let mut written: [Option<u64>; 2] = [None; 2];
    let mut workloads = Vec::new();
    for (i, &(name, block, random, write)) in WORKLOADS.iter().enumerate() {
        let mut rates = [Rate::default(); 2];
        for k in 0..2 {
            let s = (i + k) % 2;
            let device = sides[s].volume.target.clone();
            let span = written[s].unwrap_or(size);
            rates[s] = tokio::task::spawn_blocking(move || {
                drive(&device, span, block, random, write, seconds)
            })
            .await??;
            if write && written[s].is_none() {
                written[s] = Some((rates[s].ops * block).min(size));
            }
        }
        workloads.push(Workload {
            name: name.to_string(),
            block_bytes: block,
            random,
            write,
            direct: rates[0],
            fuse: rates[1],
            ratio: rates[1].ops_per_s / rates[0].ops_per_s,
        });
    }
    for side in sides {
        let Side {
            stack,
            mut clients,
            volume,
        } = side;
        clients.unpublish(&volume).await?;
        clients.unstage(&volume).await?;
        clients.delete(&volume).await?;
        drop(clients);
        stop(stack, report)?;
    }
    report.data_path = Some(DataPath {
        seconds: args.io_seconds,
        size_mib: args.size_mib,
        backing,
        workloads,
    });
    report.print_data_path();
    report.save(args)
}

/// A stack whose emulator runs `--data-path mode`, one volume published.
async fn side(args: &Args, work: &Work, mode: &'static str) -> anyhow::Result<Side> {
    let name = format!("io-{mode}");
    eprintln!("bench: starting stack {name} (--data-path {mode})");
    let stack = Stack::start(
        &name,
        &args.local_up,
        &args.profile,
        work.stack_dir(&name),
        work.dir.path(),
        &StackOptions {
            data_path: Some(mode),
            ..StackOptions::default()
        },
    )
    .await?;
    let mut clients = Clients::connect(&stack.controller, &stack.node).await?;
    let volume = clients
        .create(&stack.kubelet, &name, &Kind::Block, args.size_mib)
        .await?;
    clients.stage(&volume).await?;
    clients.publish(&volume).await?;
    Ok(Side {
        stack,
        clients,
        volume,
    })
}

/// The backing file of the loop device `device` (a node or a bind of one).
fn backing_file(device: &Path) -> anyhow::Result<String> {
    let rdev = stat(device)
        .with_context(|| format!("stat {}", device.display()))?
        .st_rdev;
    let sysfs = PathBuf::from(format!(
        "/sys/dev/block/{}:{}/loop/backing_file",
        major(rdev),
        minor(rdev)
    ));
    Ok(std::fs::read_to_string(&sysfs)
        .with_context(|| format!("{}: not a loop device?", sysfs.display()))?
        .trim()
        .to_string())
}

/// Drives `device` (O_DIRECT, one I/O at a time) for `seconds`: blocks of
/// `block` bytes over its first `span` bytes, at random aligned offsets or one
/// after the other (wrapping).
fn drive(
    device: &Path,
    span: u64,
    block: u64,
    random: bool,
    write: bool,
    seconds: Duration,
) -> anyhow::Result<Rate> {
    let file = File::options()
        .read(true)
        .write(true)
        .custom_flags(OFlag::O_DIRECT.bits())
        .open(device)
        .with_context(|| format!("opening {}", device.display()))?;
    // O_DIRECT wants the buffer aligned to the logical block (4 KiB covers any).
    let len = usize::try_from(block)?;
    let mut raw = vec![0x5au8; len + 4096];
    let start = raw.as_ptr().align_offset(4096);
    let buf = &mut raw[start..start + len];
    let blocks = (span / block).max(1);
    // xorshift64: a cheap, fixed sequence of offsets.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let began = Instant::now();
    let mut ops = 0u64;
    while began.elapsed() < seconds {
        let index = if random {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % blocks
        } else {
            ops % blocks
        };
        let offset = index * block;
        if write {
            file.write_all_at(buf, offset)
        } else {
            file.read_exact_at(buf, offset)
        }
        .with_context(|| format!("{} at {offset}", device.display()))?;
        ops += 1;
    }
    let elapsed = began.elapsed().as_secs_f64();
    Ok(Rate {
        ops,
        ops_per_s: ops as f64 / elapsed,
        mib_per_s: (ops * block) as f64 / elapsed / f64::from(1u32 << 20),
    })
}

impl Report {
    /// Section 9.
    pub fn print_data_path(&self) {
        let Some(d) = &self.data_path else {
            return;
        };
        println!();
        println!(
            "9. The emulator's FUSE data path against the direct one: a staged block volume's host device ({} MiB, AIO, NVMe),\n   O_DIRECT, queue depth 1, {} s per workload",
            d.size_mib, d.seconds
        );
        let mut table = Table::new(&[
            "workload",
            "direct IOPS",
            "direct MiB/s",
            "FUSE IOPS",
            "FUSE MiB/s",
            "FUSE/direct",
        ]);
        for w in &d.workloads {
            table.row(vec![
                w.name.clone(),
                format!("{:.0}", w.direct.ops_per_s),
                format!("{:.0}", w.direct.mib_per_s),
                format!("{:.0}", w.fuse.ops_per_s),
                format!("{:.0}", w.fuse.mib_per_s),
                format!("{:.2}", w.ratio),
            ]);
        }
        table.print();
        println!(
            "   (the host devices' loop backing files: {})",
            d.backing.join(", ")
        );
    }
}
