//! Everything measured, printed as tables and saved as JSON.

use serde::Serialize;

use crate::Args;
use crate::datapath::DataPath;
use crate::encryption::Encryption;
use crate::failover::Failover;
use crate::filesystem::Filesystem;
use crate::floors::Floors;
use crate::guest::GuestHost;
use crate::latency::{Row, design_round_trips};
use crate::memory::{Memory, Rss};
use crate::packed::Density;
use crate::rpc::Level;
use crate::scale::{ByMethod, Round};
use crate::split::Split;
use crate::stats::{JUDGED_PAIRS, Paired};
use crate::table::{Table, ms, num};
use crate::targets::Target;
use crate::two_dpus::TwoDpus;

/// An RPC against the floor of what it must do at the least, sampled in
/// turns with it.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    pub rpc: String,
    pub floor: String,
    pub paired: Paired,
}

#[derive(Debug, Serialize)]
pub struct Settings {
    pub volumes: usize,
    pub size_mib: i64,
    pub fs: String,
    pub poll_period_us: u64,
    pub poll_volumes: usize,
    pub scale_volumes: usize,
    pub scale_repeats: u32,
    pub scale_size_mib: i64,
    pub count_period_us: u64,
    pub count_volumes: usize,
    pub failovers: u32,
    pub dpu_volumes: usize,
    pub dpu_repeats: u32,
    pub sections: Vec<u8>,
    pub cpus: usize,
    pub profile: String,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub settings: Settings,
    /// Section 1 (its counts are section 3's).
    pub latency: Option<Vec<Row>>,
    /// Section 2.
    pub floors: Option<Floors>,
    /// Sections 1 and 2: each call against its floor.
    pub ratios: Vec<Ratio>,
    /// Section 1: the node's own share against the gRPC floor.
    pub own_shares: Vec<Ratio>,
    /// Section 3: the latency rows again, with the emulator's poller on.
    pub poll: Option<Vec<Row>>,
    /// Section 3: the rows of the counting run (long poll period, each node
    /// RPC started right after a tick).
    pub counted: Option<Vec<Row>>,
    /// Section 4.
    pub scale: Option<Vec<Round>>,
    /// Section 4 with the emulator's poller on.
    pub scale_poll: Option<Vec<Round>>,
    /// Section 5.
    pub memory: Option<Memory>,
    /// Section 6.
    pub jsonrpc: Option<Vec<Level>>,
    /// Section 6 with the emulator's poller on (section 3's period).
    pub jsonrpc_poll: Option<Vec<Level>>,
    /// Sections 3, 4 and 5 in split mode.
    pub split: Split,
    /// Section 7.
    pub density: Option<Density>,
    /// Section 8.
    pub encryption: Option<Encryption>,
    pub filesystem: Option<Filesystem>,
    /// Section 9.
    pub data_path: Option<DataPath>,
    /// Section 11.
    pub failover: Option<Failover>,
    /// Section 12.
    pub two_dpus: Option<TwoDpus>,
    /// Section 13.
    pub guest_host: Option<GuestHost>,
    pub targets: Vec<Target>,
    pub cleanup: Vec<String>,
}

impl Report {
    pub fn new(args: &Args) -> Report {
        Report {
            settings: Settings {
                volumes: args.volumes,
                size_mib: args.size_mib,
                fs: args.fs.clone(),
                poll_period_us: args.poll_period_us,
                poll_volumes: args.poll_volumes,
                scale_volumes: args.scale_volumes,
                scale_repeats: args.scale_repeats,
                scale_size_mib: args.scale_size_mib,
                count_period_us: args.count_period_us,
                count_volumes: args.count_volumes,
                failovers: args.failovers,
                dpu_volumes: args.dpu_volumes,
                dpu_repeats: args.dpu_repeats,
                sections: args.sections.clone(),
                cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
                profile: args.profile.clone(),
            },
            latency: None,
            floors: None,
            ratios: Vec::new(),
            own_shares: Vec::new(),
            poll: None,
            counted: None,
            scale: None,
            scale_poll: None,
            memory: None,
            jsonrpc: None,
            jsonrpc_poll: None,
            split: Split::default(),
            density: None,
            encryption: None,
            filesystem: None,
            data_path: None,
            failover: None,
            two_dpus: None,
            guest_host: None,
            targets: Vec::new(),
            cleanup: Vec::new(),
        }
    }

    /// Writes the JSON file, if asked for; called after every section so
    /// that an interrupted run keeps what it measured.
    pub fn save(&self, args: &Args) -> anyhow::Result<()> {
        if let Some(path) = &args.json {
            std::fs::write(path, serde_json::to_vec_pretty(self)?)?;
        }
        Ok(())
    }

    pub fn print_latency(&mut self) {
        let Some(rows) = &self.latency else {
            return;
        };
        println!();
        println!(
            "1. Latency per RPC (ms; {} volumes of each kind, one at a time; p99 is nearest-rank)",
            self.settings.volumes
        );
        let mut table = Table::new(&["rpc", "n", "p50", "p99", "mean", "min", "max"]);
        for row in rows {
            let l = &row.latency;
            table.row(vec![
                row.rpc.clone(),
                l.samples.to_string(),
                ms(l.p50_ms),
                ms(l.p99_ms),
                ms(l.mean_ms),
                ms(l.min_ms),
                ms(l.max_ms),
            ]);
        }
        table.print();
        let ratios: Vec<Ratio> = rows
            .iter()
            .filter_map(|r| {
                Some(Ratio {
                    rpc: r.rpc.clone(),
                    floor: r.floor.clone()?,
                    paired: r.ratio?,
                })
            })
            .collect();
        print_ratios(
            "Each call against its floor sampled just before it (empty gRPC and JSON-RPC round trips)",
            &ratios,
        );
        let own: Vec<Ratio> = rows
            .iter()
            .filter_map(|r| {
                Some(Ratio {
                    rpc: r.rpc.clone(),
                    floor: "1 empty gRPC round trip".into(),
                    paired: r.own_ratio?,
                })
            })
            .collect();
        print_ratios(
            "The node's own share of each node call (its clock minus outbound calls and host work) against the gRPC floor",
            &own,
        );
        self.ratios.extend(ratios);
        self.own_shares = own;
    }

    /// Section 2: the floors, then each RPC as a multiple of its floor.
    pub fn print_floors(&mut self) {
        let Some(f) = &self.floors else {
            return;
        };
        println!();
        println!("2. Floors, measured by the bench in the same run (ms)");
        let mut table = Table::new(&["floor", "n", "p50", "p99", "mean"]);
        for (name, s) in [
            (
                "empty gRPC round trip (bench's own server, UDS)",
                &f.grpc_empty,
            ),
            (
                "  node's GetPluginCapabilities (no I/O), for comparison",
                &f.node_get_plugin_capabilities,
            ),
            (
                "JSON-RPC round trip (spdk_get_version, raw UnixStream)",
                &f.jsonrpc_round_trip,
            ),
            ("mkdir + bind mount of a mounted fs", &f.publish_dir),
            ("umount + rmdir", &f.unpublish_dir),
            ("create file + bind mount of a device node", &f.publish_file),
            ("umount + unlink", &f.unpublish_file),
            ("  mount(MS_BIND) alone", &f.bind_alone),
            ("  umount2 alone", &f.umount_alone),
            ("  rmdir alone, right after the umount", &f.rmdir_alone),
        ] {
            table.row(vec![
                name.to_string(),
                s.samples.to_string(),
                ms(s.p50_ms),
                ms(s.p99_ms),
                ms(s.mean_ms),
            ]);
        }
        table.print();
        if f.node_publish_block.samples > 0 {
            println!(
                "   The node's publish and unpublish, interleaved with the floors ({} of each kind): {} and {} ms mean by the node's own clock",
                f.node_publish_block.samples,
                ms(f.node_served_publish_ms),
                ms(f.node_served_unpublish_ms)
            );
        }

        let fs = &self.settings.fs;
        let ratios = [
            (
                "NodePublish block".to_string(),
                "gRPC + create file + bind",
                f.publish_block_ratio,
            ),
            (
                format!("NodePublish {fs}"),
                "gRPC + mkdir + bind",
                f.publish_fs_ratio,
            ),
            (
                "NodeUnpublish block".to_string(),
                "gRPC + umount + unlink",
                f.unpublish_block_ratio,
            ),
            (
                format!("NodeUnpublish {fs}"),
                "gRPC + umount + rmdir",
                f.unpublish_fs_ratio,
            ),
        ]
        .map(|(rpc, floor, paired)| Ratio {
            rpc: format!("{rpc} (interleaved with the floors)"),
            floor: floor.to_string(),
            paired,
        });
        print_ratios(
            "The node's publish and unpublish against their floors sampled in the same iteration",
            &ratios,
        );
        self.ratios.extend(ratios);
    }

    /// Section 3: SNAP calls per node RPC, and the poller's effect.
    pub fn print_round_trips(&self) {
        let Some(rows) = &self.latency else {
            return;
        };
        println!();
        println!(
            "3. SNAP/SPDK calls per node RPC (means per call, from the node's and the plugin's /metrics)"
        );
        let mut table = Table::new(&[
            "rpc",
            "SNAP by node",
            "by plugin",
            "total",
            "max",
            "plugin calls",
            "p50 ms",
            "node ms",
            "SNAP ms",
            "plugin ms",
            "host ms",
            "own p50",
            "own p99",
        ]);
        for row in rows.iter().filter(|r| r.rpc.starts_with("Node")) {
            table.row(vec![
                row.rpc.clone(),
                num(row.node_snap_calls),
                num(row.plugin_snap_calls),
                num(row.node_snap_calls + row.plugin_snap_calls),
                num(row.max_snap_calls),
                num(row.node_plugin_calls),
                ms(row.latency.p50_ms),
                ms(row.node_served_ms),
                ms(row.node_snap_wait_ms),
                ms(row.node_plugin_wait_ms),
                ms(row.node_host_wait_ms),
                ms(row.node_outside_calls.p50_ms),
                ms(row.node_outside_calls.p99_ms),
            ]);
        }
        table.print();
        println!(
            "   (node ms: the call by the node's own clock, mean; SNAP/plugin/host ms: the node's calls to them and its\n    host work (tools such as mkfs and blockdev, mount syscalls), summed, mean; own: the node's own work per\n    call (records, sysfs, checks, gRPC), the node's clock minus the time any of those was in progress, which\n    the node measures itself: snap_csi_grpc_request_own_seconds)"
        );
    }

    /// Section 3, second part: stage and unstage with the poller on vs
    /// off, and the dependent round trips counted.
    pub fn print_poll(&self) {
        let (Some(rows), Some(poll), Some(counted)) = (&self.latency, &self.poll, &self.counted)
        else {
            return;
        };
        println!();
        println!(
            "3 (continued). Stage and unstage with the emulator's RPC poller at {} us (real SPDK: ~8 ms per sequential call) vs off,",
            self.settings.poll_period_us
        );
        println!(
            "   and dependent SNAP round trips counted with the poller at {} us",
            self.settings.count_period_us
        );
        let mut table = Table::new(&[
            "rpc",
            "SNAP calls",
            "p50 off",
            "p50 on",
            "p99 on",
            "dependent trips",
            "max",
            "design",
        ]);
        for row in poll.iter().filter(|r| design_round_trips(&r.rpc).is_some()) {
            let off = rows.iter().find(|r| r.rpc == row.rpc);
            let count = counted.iter().find(|r| r.rpc == row.rpc);
            table.row(vec![
                row.rpc.clone(),
                off.map_or(String::new(), |r| {
                    num(r.node_snap_calls + r.plugin_snap_calls)
                }),
                off.map_or(String::new(), |r| ms(r.latency.p50_ms)),
                ms(row.latency.p50_ms),
                ms(row.latency.p99_ms),
                count
                    .and_then(|r| r.dependent_round_trips)
                    .map_or(String::new(), num),
                count
                    .and_then(|r| r.dependent_round_trips_max)
                    .map_or(String::new(), num),
                design_round_trips(&row.rpc).map_or(String::new(), |t| format!("<= {t}")),
            ]);
        }
        table.print();
        println!(
            "   (on: {} volumes of each kind. Counting: {} volumes of each kind, each node RPC started right after a poll\n    tick; dependent trips = floor(latency / {} ms), median: every call that waited for an earlier reply waits\n    for a tick, calls sent together share one; exact while the rest of the RPC takes under one period)",
            self.settings.poll_volumes,
            self.settings.count_volumes,
            self.settings.count_period_us / 1000
        );
    }

    /// Section 4.
    pub fn print_scale(&self) {
        if let Some(rounds) = &self.scale {
            println!();
            println!(
                "4. Scale: {} block volumes ({} MiB, NVMe), stage + publish each in its own task, at most N at a time",
                self.settings.scale_volumes, self.settings.scale_size_mib
            );
            print_rounds(rounds);
        }
    }

    /// Section 4 with the poller on.
    pub fn print_scale_poll(&self) {
        if let Some(rounds) = &self.scale_poll {
            println!();
            println!(
                "4 (continued). Scale with the DPU emulator's RPC poller at {} us, as real SPDK answers",
                self.settings.poll_period_us
            );
            print_rounds(rounds);
        }
    }

    /// Section 5.
    pub fn print_memory(&self) {
        let Some(m) = &self.memory else {
            return;
        };
        println!();
        println!("5. Memory (MiB; peak = VmHWM, now = VmRSS) and node restart");
        let staged = format!("{} volumes staged", m.staged_volumes);
        print_memory_table(&[
            ("node", "idle, after start", Some(m.node_idle)),
            ("proxy", "idle, after start", Some(m.proxy_idle)),
            ("node", staged.as_str(), Some(m.node_staged)),
            ("proxy", staged.as_str(), Some(m.proxy_staged)),
            (
                "node (restarted)",
                "ready, volumes staged",
                m.node_restarted,
            ),
            (
                "node (restarted)",
                "after teardown",
                m.node_restarted_after_teardown,
            ),
        ]);
        if !m.restarts_ready_ms.is_empty() {
            println!(
                "   node restarts (SIGTERM, same command line) with {} volumes staged: process start to Probe ready in {} ms",
                m.staged_volumes,
                each_ms(&m.restarts_ready_ms)
            );
        }
    }

    /// Section 6.
    pub fn print_jsonrpc(&self) {
        let Some(levels) = &self.jsonrpc else {
            return;
        };
        println!();
        println!(
            "6. JSON-RPC client alone: spdk_get_version calls per second on one connection to the emulator"
        );
        let mut table = Table::new(&[
            "in flight",
            "RpcClient/s",
            "raw socket/s",
            "ratio",
            "RpcClient runs",
            "raw runs",
        ]);
        let runs = |v: &[f64]| {
            v.iter()
                .map(|r| format!("{r:.0}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        for l in levels {
            table.row(vec![
                l.in_flight.to_string(),
                format!("{:.0}", l.client_per_s),
                format!("{:.0}", l.raw_per_s),
                format!("{:.2}", l.ratio),
                runs(&l.client_runs),
                runs(&l.raw_runs),
            ]);
        }
        table.print();
        println!(
            "   (median of the runs; raw: requests written back-to-back, replies split by a streaming JSON decoder)"
        );
        self.print_jsonrpc_poll();
    }

    /// Section 6 with the poller on.
    pub fn print_jsonrpc_poll(&self) {
        let Some(levels) = &self.jsonrpc_poll else {
            return;
        };
        println!();
        println!(
            "   The same with the emulator's RPC poller at {} us, as real SPDK answers",
            self.settings.poll_period_us
        );
        let mut table = Table::new(&["in flight", "RpcClient/s", "raw socket/s", "ratio"]);
        for l in levels {
            table.row(vec![
                l.in_flight.to_string(),
                format!("{:.0}", l.client_per_s),
                format!("{:.0}", l.raw_per_s),
                format!("{:.2}", l.ratio),
            ]);
        }
        table.print();
    }
}

/// Ratios as a table: the median quotient, its 95% interval, and how far
/// another run may put it.
fn print_ratios(title: &str, ratios: &[Ratio]) {
    if ratios.is_empty() {
        return;
    }
    println!();
    println!("   {title}");
    let mut table = Table::new(&[
        "rpc",
        "pairs",
        "p50",
        "floor p50",
        "x floor",
        "95% in",
        "run to run",
        "floor is",
    ]);
    for r in ratios {
        let p = &r.paired;
        table.row(vec![
            r.rpc.clone(),
            p.pairs.to_string(),
            ms(p.measured_p50_ms),
            ms(p.floor_p50_ms),
            format!("{:.2}x", p.ratio),
            format!("{:.2}-{:.2}", p.low, p.high),
            format!(
                "+-{:.0}%{}",
                (p.run_to_run() * 100.0).min(999.0),
                if p.pairs < JUDGED_PAIRS {
                    " (too few to judge)"
                } else {
                    ""
                }
            ),
            r.floor.clone(),
        ]);
    }
    table.print();
    println!(
        "   (x floor: the median of each call divided by its own floor sample; 95% in: that median's interval (order\n    statistics); run to run: how far another run may put it, the interval's half-width x sqrt 2; a target is\n    judged by the median over {JUDGED_PAIRS} pairs or more)"
    );
}

/// "12.3, 14.0, 13.1": each of several times in ms.
pub fn each_ms(times: &[f64]) -> String {
    times.iter().map(|&t| ms(t)).collect::<Vec<_>>().join(", ")
}

/// One row per (process, when, memory) measured.
pub fn print_memory_table(rows: &[(&str, &str, Option<Rss>)]) {
    let mut table = Table::new(&["process", "when", "peak", "now", "threads"]);
    for (process, when, rss) in rows {
        if let Some(rss) = rss {
            table.row(vec![
                process.to_string(),
                when.to_string(),
                format!("{:.1}", rss.peak_mib),
                format!("{:.1}", rss.now_mib),
                num(rss.threads),
            ]);
        }
    }
    table.print();
}

/// One table row per concurrency round, then the SNAP calls by method.
pub fn print_rounds(rounds: &[Round]) {
    let mut table = Table::new(&[
        "concurrency",
        "wall s",
        "volumes/s",
        "speed-up",
        "stage+publish p50 ms",
        "p99 ms",
        "stage p99 ms",
        "publish p99 ms",
        "node ms/vol",
        "SNAP ms/vol",
        "plugin ms/vol",
        "teardown wall s",
        "create wall s",
    ]);
    for r in rounds {
        table.row(vec![
            r.concurrency.to_string(),
            format!("{:.2}", r.wall_s),
            format!("{:.1}", r.volumes_per_s),
            r.speedup.map_or(String::new(), |s| format!("{s:.2}x")),
            ms(r.stage_publish.p50_ms),
            ms(r.stage_publish.p99_ms),
            ms(r.stage.p99_ms),
            ms(r.publish.p99_ms),
            ms(r.node_ms),
            ms(r.node_snap_ms),
            ms(r.node_plugin_ms),
            format!("{:.2}", r.teardown_wall_s),
            format!("{:.2}", r.create_wall_s),
        ]);
    }
    table.print();
    println!(
        "   SNAP calls of the DPU attach layer (the node's; the agent's in split mode) during stage + publish, by method:\n   calls per volume, mean ms per call"
    );
    print_methods(
        "method",
        &rounds
            .iter()
            .map(|r| (r.concurrency, &r.snap_methods))
            .collect::<Vec<_>>(),
    );
    println!(
        "   (node/SNAP/plugin ms per volume: stage + publish by the node's clock, and the SNAP and plugin calls' summed\n    time (the agent's in split mode), means; teardown: unpublish + unstage at the same concurrency; create: every\n    volume first, 8 at a time)"
    );
    for (r, scrape) in rounds
        .iter()
        .filter_map(|r| r.scrape.as_ref().map(|s| (r, s)))
    {
        println!(
            "   /metrics with {} volumes staged (after the c={} round), series of {} volumes: a scrape that reads SNAP's\n    counters p50 {} ms, max {} ms; one sharing that read p50 {} ms, max {} ms; bdev_get_iostat per read: {}, {} ms each",
            scrape.volumes,
            r.concurrency,
            scrape.volumes_on_page,
            ms(scrape.reading.p50_ms),
            ms(scrape.reading.max_ms),
            ms(scrape.sharing.p50_ms),
            ms(scrape.sharing.max_ms),
            num(scrape.iostat_per_read),
            ms(scrape.iostat_ms)
        );
    }
}

/// SNAP calls by method, one column per concurrency level: calls per
/// volume x mean ms per call.
pub fn print_methods(title: &str, levels: &[(usize, &ByMethod)]) {
    let mut methods: Vec<&String> = levels.iter().flat_map(|(_, m)| m.keys()).collect();
    methods.sort();
    methods.dedup();
    let mut headers = vec![title.to_string()];
    headers.extend(levels.iter().map(|(c, _)| format!("c={c}")));
    let mut table = Table::new(&headers.iter().map(String::as_str).collect::<Vec<_>>());
    for method in methods {
        let mut row = vec![method.clone()];
        for (_, by_method) in levels {
            row.push(
                by_method
                    .get(method)
                    .map_or(String::new(), |(calls, mean)| {
                        format!("{} x {}", num(*calls), ms(*mean))
                    }),
            );
        }
        table.row(row);
    }
    table.print();
}
