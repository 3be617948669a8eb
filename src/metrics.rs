//! Prometheus metrics: what each long-running binary exposes on
//! `--metrics-address` at `/metrics`.
//!
//! - `snap_csi_grpc_requests` / `..._seconds`: every gRPC call we serve, by
//!   service method and status code (recorded by [`GrpcMetricsLayer`]).
//! - `snap_csi_grpc_request_own_seconds`: the part of each served call not
//!   spent waiting on an outbound call below (overlapping waits count once):
//!   the process's own work.
//! - `snap_csi_outbound_requests` / `..._seconds`: every call we make, by
//!   target (`snap` for SPDK/SNAP JSON-RPC, `plugin` for the vendor plugin,
//!   `vendor` for the vendor CSI controller, `host` for tools, mount
//!   syscalls, fsyncs and the wait for a hot-plugged disk), method and
//!   outcome.
//! - `snap_csi_volumes_staged`: volumes the node has staged.
//! - `snap_csi_dependency_ready`: 1 when a dependency answered its last probe.
//! - `snap_csi_dpu_up`: by DPU (`dpu`), 1 when the node's last probe of it
//!   (at each Probe, and every 2 s on a host with several) found its plugin
//!   and SNAP ready.
//! - `snap_csi_dpu_drift`: at the node's start, volumes SNAP exposes without
//!   a record here (`kind="unrecorded"`) and records SNAP no longer backs
//!   (`kind="unattached"`).
//! - `snap_csi_orphaned_volumes`: volumes staged here that nothing under the
//!   kubelet directory used at the node's start (a NodeUnstage that never
//!   came), less those `--unstage-orphans` has unstaged since.
//! - `snap_csi_tls_handshakes`: TLS handshakes on the DPU link, by role
//!   (`server`: the agent, `client`: the node) and outcome; one per
//!   connection, not per call.
//! - `snap_csi_tls_reloads`: rotations of the TLS files taken up, by the
//!   certificate file and outcome (`ok`, or `unusable`: caught half-rotated
//!   or invalid, the last good files kept), so a rotation can be seen to
//!   have taken effect without a restart.
//! - Per staged volume, read at scrape time when a [`VolumeIoSource`] is
//!   registered (the node): `snap_csi_volume_read_bytes_total`,
//!   `..._written_bytes_total`, `..._reads_completed_total`,
//!   `..._writes_completed_total`, `..._read_time_seconds_total` and
//!   `..._write_time_seconds_total` (time spent in completed I/O: a rate
//!   over the matching operations' rate is the mean latency), labelled
//!   `volume_id` and, where the volume context says, `pv`, `pvc` and
//!   `pvc_namespace`; `snap_csi_volume_io_up`, 0 when the counters could not
//!   be read and these series are left out of the page; and
//!   `snap_csi_volume_io_errors_total`, the failed reads.
//!
//! One process-wide registry, so that deep layers (the JSON-RPC client) record
//! without every caller threading a handle through.

use std::borrow::Cow;
use std::cell::RefCell;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use prometheus_client::encoding::{EncodeLabelSet, text};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    method: String,
    code: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VolumeLabels {
    volume_id: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutboundLabels {
    target: &'static str,
    method: Cow<'static, str>,
    outcome: Cow<'static, str>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetMethodLabels {
    target: &'static str,
    method: Cow<'static, str>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DependencyLabels {
    dependency: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DpuLabels {
    dpu: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DriftLabels {
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandshakeLabels {
    role: &'static str,
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    cert: String,
    outcome: &'static str,
}

/// Every metric this process records.
#[derive(Debug)]
struct Metrics {
    registry: Registry,
    grpc_requests: Family<CallLabels, Counter>,
    grpc_seconds: Family<MethodLabels, Histogram>,
    grpc_own_seconds: Family<MethodLabels, Histogram>,
    outbound_requests: Family<OutboundLabels, Counter>,
    outbound_seconds: Family<TargetMethodLabels, Histogram>,
    volumes_staged: Gauge,
    dependency_ready: Family<DependencyLabels, Gauge>,
    dpu_up: Family<DpuLabels, Gauge>,
    dpu_drift: Family<DriftLabels, Gauge>,
    orphaned_volumes: Gauge,
    tls_handshakes: Family<HandshakeLabels, Counter>,
    tls_reloads: Family<ReloadLabels, Counter>,
    volume_condition_abnormal: Family<VolumeLabels, Gauge>,
    volume_io_errors: Counter,
}

/// 100 µs .. ~100 s: from a cached list to a slow mkfs.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 21))
}

fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let mut registry = Registry::with_prefix("snap_csi");
        let grpc_requests = Family::<CallLabels, Counter>::default();
        let grpc_seconds =
            Family::<MethodLabels, Histogram>::new_with_constructor(latency_histogram as fn() -> _);
        let grpc_own_seconds =
            Family::<MethodLabels, Histogram>::new_with_constructor(latency_histogram as fn() -> _);
        let outbound_requests = Family::<OutboundLabels, Counter>::default();
        let outbound_seconds = Family::<TargetMethodLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> _,
        );
        let volumes_staged = Gauge::default();
        let dependency_ready = Family::<DependencyLabels, Gauge>::default();
        let dpu_up = Family::<DpuLabels, Gauge>::default();
        let dpu_drift = Family::<DriftLabels, Gauge>::default();
        let orphaned_volumes = Gauge::default();
        let tls_handshakes = Family::<HandshakeLabels, Counter>::default();
        let tls_reloads = Family::<ReloadLabels, Counter>::default();
        let volume_condition_abnormal = Family::<VolumeLabels, Gauge>::default();
        let volume_io_errors = Counter::default();
        registry.register(
            "grpc_requests",
            "gRPC calls served, by method and status code",
            grpc_requests.clone(),
        );
        registry.register(
            "grpc_request_duration_seconds",
            "Latency of gRPC calls served, by method",
            grpc_seconds.clone(),
        );
        registry.register(
            "grpc_request_own_seconds",
            "Time of gRPC calls served not spent waiting on outbound calls or host work, by method",
            grpc_own_seconds.clone(),
        );
        registry.register(
            "outbound_requests",
            "Calls made to SNAP/SPDK, the vendor plugin or the vendor CSI controller, by outcome",
            outbound_requests.clone(),
        );
        registry.register(
            "outbound_request_duration_seconds",
            "Latency of outbound calls, by target and method",
            outbound_seconds.clone(),
        );
        registry.register(
            "volumes_staged",
            "Volumes staged on this node",
            volumes_staged.clone(),
        );
        registry.register(
            "dependency_ready",
            "1 when the dependency answered its last probe, else 0",
            dependency_ready.clone(),
        );
        registry.register(
            "dpu_up",
            "1 when the DPU answered the node's last probe (plugin and SNAP ready), else 0; by DPU",
            dpu_up.clone(),
        );
        registry.register(
            "dpu_drift",
            "Volumes where the node's records and SNAP disagreed at start, by kind",
            dpu_drift.clone(),
        );
        registry.register(
            "orphaned_volumes",
            "Volumes staged here that nothing under the kubelet directory used at start, not yet unstaged",
            orphaned_volumes.clone(),
        );
        registry.register(
            "tls_handshakes",
            "TLS handshakes on the DPU link, by role and outcome",
            tls_handshakes.clone(),
        );
        registry.register(
            "tls_reloads",
            "Changes of the TLS files taken up (ok) or refused as unusable, by certificate file",
            tls_reloads.clone(),
        );
        registry.register(
            "volume_condition_abnormal",
            "1 when the last NodeGetVolumeStats found the volume abnormal (its filesystem shut \
             down or read-only after errors, its device gone), else 0; by volume, while staged",
            volume_condition_abnormal.clone(),
        );
        registry.register(
            "volume_io_errors",
            "Reads of the DPU's I/O counters for the per-volume series that failed",
            volume_io_errors.clone(),
        );
        Metrics {
            registry,
            grpc_requests,
            grpc_seconds,
            grpc_own_seconds,
            outbound_requests,
            outbound_seconds,
            volumes_staged,
            dependency_ready,
            dpu_up,
            dpu_drift,
            orphaned_volumes,
            tls_handshakes,
            tls_reloads,
            volume_condition_abnormal,
            volume_io_errors,
        }
    })
}

/// Records one outbound call: `target` is `snap`, `plugin`, `vendor` or `host`;
/// `outcome` is `ok` or the error's kind/code.
pub fn observe_outbound(target: &'static str, method: &str, outcome: &str, latency: Duration) {
    observe_outbound_static(
        target,
        Cow::Owned(method.to_string()),
        Cow::Owned(outcome.to_string()),
        latency,
    );
}

/// Records host work (a tool, a syscall, a flush) that took `took`.
pub fn observe_host<T, E>(operation: &'static str, result: &Result<T, E>, took: Duration) {
    let outcome = if result.is_ok() { "ok" } else { "error" };
    observe_outbound("host", operation, outcome, took);
}

/// Runs `work` on this thread and records it as host work: waiting on the
/// kernel or the disk is not the process's own time.
pub fn host_work<T, E>(
    operation: &'static str,
    work: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    let started = Instant::now();
    let result = work();
    observe_host(operation, &result, started.elapsed());
    result
}

/// [`observe_outbound`] for the JSON-RPC client's hot path: labels that are
/// borrowed `'static` strings cost no allocation, except when first seen.
pub fn observe_outbound_static(
    target: &'static str,
    method: Cow<'static, str>,
    outcome: Cow<'static, str>,
    latency: Duration,
) {
    let end = Instant::now();
    // Outside a served call (startup probes, tools) there is nothing to charge.
    let _ = WAITS.try_with(|waits| {
        waits
            .borrow_mut()
            .push((end.checked_sub(latency).unwrap_or(end), end));
    });
    let m = metrics();
    let labels = OutboundLabels {
        target,
        method,
        outcome,
    };
    m.outbound_requests.get_or_create(&labels).inc();
    m.outbound_seconds
        .get_or_create(&TargetMethodLabels {
            target,
            method: labels.method,
        })
        .observe(latency.as_secs_f64());
}

/// Sets how many volumes the node has staged.
pub fn set_volumes_staged(count: usize) {
    metrics()
        .volumes_staged
        .set(i64::try_from(count).unwrap_or(i64::MAX));
}

/// Records whether `dependency` (e.g. `vendor-plugin`, `snap`) is ready.
pub fn set_dependency_ready(dependency: &str, ready: bool) {
    metrics()
        .dependency_ready
        .get_or_create(&DependencyLabels {
            dependency: dependency.into(),
        })
        .set(i64::from(ready));
}

/// Records whether the node's last probe of DPU `dpu` found it serving.
pub fn set_dpu_up(dpu: &str, up: bool) {
    metrics()
        .dpu_up
        .get_or_create(&DpuLabels { dpu: dpu.into() })
        .set(i64::from(up));
}

/// Sets how many volumes of `kind` the records and SNAP disagreed on.
pub fn set_dpu_drift(kind: &'static str, count: usize) {
    metrics()
        .dpu_drift
        .get_or_create(&DriftLabels { kind })
        .set(i64::try_from(count).unwrap_or(i64::MAX));
}

/// Sets how many staged volumes are orphaned (see the module doc).
pub fn set_orphaned_volumes(count: usize) {
    metrics()
        .orphaned_volumes
        .set(i64::try_from(count).unwrap_or(i64::MAX));
}

/// Records what NodeGetVolumeStats found of `volume_id`'s condition.
pub fn set_volume_condition(volume_id: &str, abnormal: bool) {
    metrics()
        .volume_condition_abnormal
        .get_or_create(&VolumeLabels {
            volume_id: volume_id.into(),
        })
        .set(i64::from(abnormal));
}

/// Drops `volume_id`'s condition: unstaged, or about to be repaired (the
/// next NodeGetVolumeStats says again what is true).
pub fn forget_volume_condition(volume_id: &str) {
    metrics().volume_condition_abnormal.remove(&VolumeLabels {
        volume_id: volume_id.into(),
    });
}

/// Records one TLS handshake on the DPU link.
pub fn observe_handshake(role: &'static str, outcome: &'static str) {
    metrics()
        .tls_handshakes
        .get_or_create(&HandshakeLabels { role, outcome })
        .inc();
}

/// Records that the TLS files whose certificate is `cert` changed and were
/// taken up (`ok`) or refused (`unusable`).
pub fn observe_tls_reload(cert: &std::path::Path, outcome: &'static str) {
    metrics()
        .tls_reloads
        .get_or_create(&ReloadLabels {
            cert: cert.display().to_string(),
            outcome,
        })
        .inc();
}

/// One staged volume's I/O counters, read at scrape time.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeIo {
    /// `volume_id`, then whichever of `pv`, `pvc`, `pvc_namespace` are known.
    pub labels: Vec<(&'static str, String)>,
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub reads: u64,
    pub writes: u64,
    /// Time spent in completed reads and writes.
    pub read_seconds: f64,
    pub write_seconds: f64,
}

/// Where a scrape finds the per-volume I/O counters (the node: its staged
/// volumes against the DPU's counters).
#[async_trait::async_trait]
pub trait VolumeIoSource: Send + Sync {
    /// Every staged volume's counters, or `None` when they cannot be read
    /// fresh: the series are then left out, never shown stale. Returns
    /// within a bounded time.
    async fn read(&self) -> Option<Vec<VolumeIo>>;
}

/// The registered source and its registration's number.
type Registered = (u64, Arc<dyn VolumeIoSource>);

fn volume_io_source() -> &'static Mutex<Option<Registered>> {
    static SOURCE: Mutex<Option<Registered>> = Mutex::new(None);
    &SOURCE
}

/// Keeps a [`VolumeIoSource`] on this process's page until dropped.
#[derive(Debug)]
#[must_use = "the source is served only while this lives"]
pub struct VolumeIoRegistration(u64);

impl Drop for VolumeIoRegistration {
    fn drop(&mut self) {
        let mut source = volume_io_source().lock().unwrap_or_else(|e| e.into_inner());
        // A node started after this one (a test's restart) keeps its own.
        if source.as_ref().is_some_and(|(n, _)| *n == self.0) {
            *source = None;
        }
    }
}

/// Serves `source`'s per-volume series on every scrape from now on, in
/// place of any registered before.
pub fn serve_volume_io(source: Arc<dyn VolumeIoSource>) -> VolumeIoRegistration {
    static REGISTRATIONS: AtomicU64 = AtomicU64::new(0);
    let number = REGISTRATIONS.fetch_add(1, Ordering::Relaxed);
    *volume_io_source().lock().unwrap_or_else(|e| e.into_inner()) = Some((number, source));
    VolumeIoRegistration(number)
}

/// Counts a failed read of the DPU's I/O counters.
pub fn observe_volume_io_error() {
    metrics().volume_io_errors.inc();
}

/// The per-volume series of one scrape, in a registry of their own made
/// for it: a volume gone since the last scrape leaves nothing behind.
fn volume_io_registry(volumes: Option<&[VolumeIo]>) -> Registry {
    let mut registry = Registry::with_prefix("snap_csi");
    let up: Gauge = Gauge::default();
    up.set(i64::from(volumes.is_some()));
    registry.register(
        "volume_io_up",
        "1 when the per-volume I/O series come from the DPU's counters read within the last \
         second; 0 when they could not be read, and the series are left out",
        up,
    );
    let Some(volumes) = volumes else {
        return registry;
    };
    type Labels = Vec<(&'static str, String)>;
    let mut count = |name: &str, help: &str, value: fn(&VolumeIo) -> u64| {
        let family = Family::<Labels, Counter>::default();
        for volume in volumes {
            family.get_or_create(&volume.labels).inc_by(value(volume));
        }
        registry.register(name, help, family);
    };
    count(
        "volume_read_bytes",
        "Bytes read from the volume, as its bdev on the DPU counts them",
        |v| v.read_bytes,
    );
    count(
        "volume_written_bytes",
        "Bytes written to the volume, as its bdev on the DPU counts them",
        |v| v.written_bytes,
    );
    count(
        "volume_reads_completed",
        "Read operations the volume's bdev completed",
        |v| v.reads,
    );
    count(
        "volume_writes_completed",
        "Write operations the volume's bdev completed",
        |v| v.writes,
    );
    let mut time = |name: &str, help: &str, value: fn(&VolumeIo) -> f64| {
        let family = Family::<Labels, Counter<f64, AtomicU64>>::default();
        for volume in volumes {
            family.get_or_create(&volume.labels).inc_by(value(volume));
        }
        registry.register(name, help, family);
    };
    time(
        "volume_read_time_seconds",
        "Time the volume's completed reads took on the DPU (over the reads' rate: mean latency)",
        |v| v.read_seconds,
    );
    time(
        "volume_write_time_seconds",
        "Time the volume's completed writes took on the DPU (over the writes' rate: mean latency)",
        |v| v.write_seconds,
    );
    registry
}

/// The text exposition of every metric, with the per-volume series read
/// now from the registered [`VolumeIoSource`], if any.
pub async fn render() -> String {
    let source = volume_io_source()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map(|(_, source)| Arc::clone(source));
    let volumes = match source {
        Some(source) => Some(source.read().await),
        None => None,
    };
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = text::encode_registry(&mut out, &metrics().registry);
    if let Some(volumes) = volumes {
        let _ = text::encode_registry(&mut out, &volume_io_registry(volumes.as_deref()));
    }
    let _ = text::encode_eof(&mut out);
    out
}

/// Binds the metrics address, when there is one: binding before serving makes
/// a taken port an error at start, not a silent gap in the graphs.
pub async fn bind(address: Option<SocketAddr>) -> std::io::Result<Option<TcpListener>> {
    match address {
        Some(address) => {
            let listener = TcpListener::bind(address).await?;
            tracing::info!(%address, "metrics endpoint listening");
            Ok(Some(listener))
        }
        None => Ok(None),
    }
}

/// Serves `/metrics` on `listener` (if any) until `shutdown`.
pub async fn serve_optional(
    listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    match listener {
        Some(listener) => serve(listener, shutdown).await,
        None => Ok(()),
    }
}

async fn serve(listener: TcpListener, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
    serve_page(listener, render, shutdown).await
}

/// Serves `GET /metrics` on `listener` until `shutdown`, each answer the
/// page `page` renders then (a binary with series of its own, like the
/// sample plugin's paths, adds them to [`render`]'s). A deliberately tiny
/// HTTP/1.1 responder: Prometheus needs nothing more, and it keeps a web
/// framework out of a storage driver.
pub async fn serve_page<F, P>(
    listener: TcpListener,
    page: P,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    P: Fn() -> F + Clone + Send + 'static,
    F: Future<Output = String> + Send,
{
    tokio::pin!(shutdown);
    loop {
        let (mut stream, _) = tokio::select! {
            accepted = listener.accept() => accepted?,
            () = &mut shutdown => return Ok(()),
        };
        let page = page.clone();
        tokio::spawn(async move {
            let mut request = Vec::with_capacity(1024);
            let mut chunk = [0u8; 1024];
            // Headers end at an empty line; a client that never sends one is dropped.
            let read = tokio::time::timeout(Duration::from_secs(5), async {
                while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16 * 1024 {
                    let n = stream.read(&mut chunk).await?;
                    if n == 0 {
                        break;
                    }
                    request.extend_from_slice(&chunk[..n]);
                }
                Ok::<_, std::io::Error>(())
            })
            .await;
            if !matches!(read, Ok(Ok(()))) {
                return;
            }
            let response = if request.starts_with(b"GET /metrics ") {
                let body = page().await;
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
            } else {
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_string()
            };
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

tokio::task_local! {
    /// When the served call running in this task waited on outbound calls
    /// or host work: the handler runs inside the layer's future, so every
    /// wait it records lands here, also from calls it sends together.
    static WAITS: RefCell<Vec<(Instant, Instant)>>;
}

/// How long at least one of `waits` was in progress.
fn covered(waits: &mut [(Instant, Instant)]) -> Duration {
    waits.sort_unstable();
    let mut total = Duration::ZERO;
    let mut current: Option<(Instant, Instant)> = None;
    for &(start, end) in waits.iter() {
        current = match current {
            Some((s, e)) if start <= e => Some((s, e.max(end))),
            Some((s, e)) => {
                total += e - s;
                Some((start, end))
            }
            None => Some((start, end)),
        };
    }
    total + current.map_or(Duration::ZERO, |(s, e)| e - s)
}

/// A tower layer for tonic servers that records each call's latency and
/// status code. A handler's error travels in the response headers
/// (trailers-only response); a success's `grpc-status: 0` comes in the
/// trailers, so a response without one in its headers counts as OK.
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcMetricsLayer;

impl<S> tower::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetrics { inner }
    }
}

#[derive(Debug, Clone)]
pub struct GrpcMetrics<S> {
    inner: S,
}

impl<S, B, R> tower::Service<http::Request<B>> for GrpcMetrics<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // "/csi.v1.Node/NodeStageVolume" -> "NodeStageVolume" would lose the
        // service; keep "Node/NodeStageVolume".
        let method = request
            .uri()
            .path()
            .rsplit('/')
            .take(2)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .map(|part| part.rsplit('.').next().unwrap_or(part))
            .collect::<Vec<_>>()
            .join("/");
        let started = Instant::now();
        let future = self.inner.call(request);
        Box::pin(WAITS.scope(RefCell::new(Vec::new()), async move {
            let response = future.await?;
            let took = started.elapsed();
            let own = took.saturating_sub(WAITS.with(|waits| covered(&mut waits.borrow_mut())));
            let code = response
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<i32>().ok())
                .map_or(tonic::Code::Ok, tonic::Code::from_i32);
            let m = metrics();
            m.grpc_requests
                .get_or_create(&CallLabels {
                    method: method.clone(),
                    code: format!("{code:?}"),
                })
                .inc();
            m.grpc_seconds
                .get_or_create(&MethodLabels {
                    method: method.clone(),
                })
                .observe(took.as_secs_f64());
            m.grpc_own_seconds
                .get_or_create(&MethodLabels { method })
                .observe(own.as_secs_f64());
            Ok(response)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_waits_count_once() {
        let t = Instant::now();
        let ms = |n| t + Duration::from_millis(n);
        // [0,4] and [2,6] overlap, [6,7] touches, [10,12] stands apart.
        let mut waits = vec![
            (ms(10), ms(12)),
            (ms(2), ms(6)),
            (ms(0), ms(4)),
            (ms(6), ms(7)),
        ];
        assert_eq!(covered(&mut waits), Duration::from_millis(9));
        assert_eq!(covered(&mut []), Duration::ZERO);
    }

    #[test]
    fn volume_io_series_carry_their_labels_or_are_left_out() {
        let volume = VolumeIo {
            labels: vec![("volume_id", "pvc-1".into()), ("pvc", "data".into())],
            read_bytes: 4096,
            written_bytes: 8192,
            reads: 1,
            writes: 2,
            read_seconds: 0.5,
            write_seconds: 0.25,
        };
        let mut page = String::new();
        text::encode_registry(&mut page, &volume_io_registry(Some(&[volume]))).unwrap();
        for expected in [
            "snap_csi_volume_io_up 1",
            r#"snap_csi_volume_read_bytes_total{volume_id="pvc-1",pvc="data"} 4096"#,
            r#"snap_csi_volume_written_bytes_total{volume_id="pvc-1",pvc="data"} 8192"#,
            r#"snap_csi_volume_reads_completed_total{volume_id="pvc-1",pvc="data"} 1"#,
            r#"snap_csi_volume_writes_completed_total{volume_id="pvc-1",pvc="data"} 2"#,
            r#"snap_csi_volume_read_time_seconds_total{volume_id="pvc-1",pvc="data"} 0.5"#,
            r#"snap_csi_volume_write_time_seconds_total{volume_id="pvc-1",pvc="data"} 0.25"#,
            "# TYPE snap_csi_volume_read_bytes counter",
        ] {
            assert!(page.contains(expected), "{expected} missing from:\n{page}");
        }
        let mut page = String::new();
        text::encode_registry(&mut page, &volume_io_registry(None)).unwrap();
        assert!(page.contains("snap_csi_volume_io_up 0"), "{page}");
        assert!(!page.contains("snap_csi_volume_read"), "{page}");
    }

    #[tokio::test]
    async fn the_endpoint_serves_what_was_recorded() {
        observe_outbound("snap", "bdev_get_bdevs", "ok", Duration::from_millis(3));
        set_dependency_ready("snap", true);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, async move {
            let _ = stopped.await;
        }));
        let mut body = String::new();
        for _ in 0..100 {
            if let Ok(mut stream) = tokio::net::TcpStream::connect(address).await {
                stream
                    .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                    .await
                    .unwrap();
                stream.read_to_string(&mut body).await.unwrap();
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
        assert!(
            body.contains(
                r#"snap_csi_outbound_requests_total{target="snap",method="bdev_get_bdevs",outcome="ok"} 1"#
            ),
            "{body}"
        );
        assert!(
            body.contains(r#"snap_csi_dependency_ready{dependency="snap"} 1"#),
            "{body}"
        );
        let _ = stop.send(());
        server.await.unwrap().unwrap();
    }
}
