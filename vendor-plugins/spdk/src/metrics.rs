//! The plugin's `/metrics`: the process's shared page
//! ([`snap_csi::metrics::render`]: calls served, SNAP calls made) followed by
//! the state of every path of its remote (NVMe-oF) devices, read from SPDK
//! at each scrape.
//!
//! - `snap_csi_plugin_nvmf_path_connected{volume_id, controller, traddr,
//!   trsvcid}`: 1 when SPDK's controller of that path is connected
//!   (`enabled`), 0 while it is reset or reconnected, or not attached at all
//!   (a path of a multipath device that the keeper, [`crate::paths`], has
//!   yet to attach).
//! - `snap_csi_plugin_nvmf_path_current{...}`: 1 when an I/O channel of the
//!   device sends its I/O through that path now (active-passive: one path).
//!   A device nobody holds open (SNAP exposes none of it) has no channel,
//!   so no current path.
//! - `snap_csi_plugin_nvmf_paths_up`: 1 when SPDK answered both reads
//!   within [`READ_TIMEOUT`]; 0 when it did not, and the path series are
//!   left out rather than shown stale.
//!
//! One round trip per scrape: `bdev_nvme_get_controllers` and
//! `bdev_nvme_get_io_paths`, sent together. Only controllers of ours (named
//! after a volume id, [`crate::names`]) are shown, single-path ones too.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use snap_csi::jsonrpc::RpcClient;
use snap_csi::spdk::nvme::{BdevNvmeGetControllers, BdevNvmeGetIoPaths, NvmeIoPaths};
use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::backend::{Kind, NvmfPath};
use crate::names::{device_name, parse_device_name};
use crate::paths::{Kept, path_of};

/// A scrape's read of SPDK not answered by then fails: well inside
/// Prometheus' default 10 s scrape timeout.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// SPDK's state of a connected controller.
const ENABLED: &str = "enabled";

/// One path of one device, as a scrape found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathState {
    pub volume_id: String,
    pub controller: String,
    pub path: NvmfPath,
    pub connected: bool,
    pub current: bool,
}

/// Where a scrape reads the paths: SNAP's SPDK, and the devices kept.
#[derive(Debug, Clone)]
pub struct PathSource {
    pub spdk: RpcClient,
    pub kept: Arc<Kept>,
}

impl PathSource {
    /// Every path of our controllers, or `None` when SPDK did not answer
    /// within [`READ_TIMEOUT`].
    pub async fn read(&self) -> Option<Vec<PathState>> {
        let deadline = Instant::now() + READ_TIMEOUT;
        let (controllers, io_paths) = (
            BdevNvmeGetControllers::default(),
            BdevNvmeGetIoPaths::default(),
        );
        let (controllers, io_paths) = tokio::join!(
            self.spdk.call_until(&controllers, deadline),
            self.spdk.call_until(&io_paths, deadline),
        );
        let (controllers, io_paths) = match (controllers, io_paths) {
            (Ok(c), Ok(p)) => (c, p),
            (Err(e), _) | (_, Err(e)) => {
                tracing::debug!("cannot read the NVMe-oF paths for the metrics: {e}");
                return None;
            }
        };
        let mut states = BTreeMap::new();
        for controller in &controllers {
            let Some(volume_id) = volume_of(&controller.name) else {
                continue;
            };
            let device = device_name(Kind::Nvmf, &volume_id);
            for ctrlr in &controller.ctrlrs {
                let path = path_of(ctrlr);
                let state = PathState {
                    current: is_current(&io_paths, &device, &path),
                    connected: ctrlr.state == ENABLED,
                    volume_id: volume_id.clone(),
                    controller: controller.name.clone(),
                    path: path.clone(),
                };
                states.insert((controller.name.clone(), path), state);
            }
        }
        for wanted in self.kept.wanted() {
            for path in wanted.paths {
                states
                    .entry((wanted.controller.clone(), path.clone()))
                    .or_insert_with(|| PathState {
                        volume_id: wanted.volume_id.clone(),
                        controller: wanted.controller.clone(),
                        path,
                        connected: false,
                        current: false,
                    });
            }
        }
        Some(states.into_values().collect())
    }
}

/// The volume of controller `name`, if it is one of ours.
fn volume_of(name: &str) -> Option<String> {
    match parse_device_name(&format!("{name}n1"))? {
        (Kind::Nvmf, volume_id) => Some(volume_id),
        _ => None,
    }
}

fn is_current(io_paths: &NvmeIoPaths, device: &str, path: &NvmfPath) -> bool {
    io_paths
        .poll_groups
        .iter()
        .flat_map(|g| &g.io_paths)
        .any(|p| {
            p.current
                && p.bdev_name == device
                && p.transport.traddr == path.traddr
                && p.transport.trsvcid.as_deref() == Some(path.trsvcid.as_str())
        })
}

/// The path series of one scrape, in the text format (OpenMetrics).
fn path_series(states: Option<&[PathState]>) -> String {
    let mut out = String::new();
    let mut family = |name: &str, help: &str, samples: &mut dyn Iterator<Item = String>| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        for sample in samples {
            let _ = writeln!(out, "{name}{sample}");
        }
    };
    family(
        "snap_csi_plugin_nvmf_paths_up",
        "1 when the NVMe-oF paths were read from SPDK for this scrape; 0 when they could not \
         be, and the path series are left out",
        &mut std::iter::once(format!(" {}", u8::from(states.is_some()))),
    );
    let Some(states) = states else {
        return out;
    };
    let labels = |s: &PathState| {
        format!(
            "{{volume_id=\"{}\",controller=\"{}\",traddr=\"{}\",trsvcid=\"{}\"}}",
            escape(&s.volume_id),
            escape(&s.controller),
            escape(&s.path.traddr),
            escape(&s.path.trsvcid)
        )
    };
    family(
        "snap_csi_plugin_nvmf_path_connected",
        "1 when SPDK's controller of this path of the volume's NVMe-oF device is connected; \
         0 while it is reconnected, or not attached",
        &mut states
            .iter()
            .map(|s| format!("{} {}", labels(s), u8::from(s.connected))),
    );
    family(
        "snap_csi_plugin_nvmf_path_current",
        "1 when the device's I/O goes through this path now",
        &mut states
            .iter()
            .map(|s| format!("{} {}", labels(s), u8::from(s.current))),
    );
    out
}

/// A label value as the text format quotes it.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The whole page: the shared metrics, then the path series, then the end.
pub async fn render(source: &PathSource) -> String {
    let (shared, states) = tokio::join!(snap_csi::metrics::render(), source.read());
    let mut page = shared
        .strip_suffix("# EOF\n")
        .unwrap_or(&shared)
        .to_string();
    page.push_str(&path_series(states.as_deref()));
    page.push_str("# EOF\n");
    page
}

/// Serves `GET /metrics` on `listener` until `shutdown`, with `source`'s
/// paths on every page.
pub async fn serve(
    listener: TcpListener,
    source: PathSource,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let page = move || {
        let source = source.clone();
        async move { render(&source).await }
    };
    snap_csi::metrics::serve_page(listener, page, shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(port: &str, connected: bool, current: bool) -> PathState {
        PathState {
            volume_id: "pvc-\"1\"".into(),
            controller: "snapcsi-nvmf-_cHZjLSIxIg".into(),
            path: NvmfPath {
                traddr: "127.0.0.1".into(),
                trsvcid: port.into(),
            },
            connected,
            current,
        }
    }

    #[test]
    fn each_path_is_a_series_and_an_unread_scrape_shows_none() {
        let page = path_series(Some(&[
            state("4420", true, true),
            state("4421", false, false),
        ]));
        for expected in [
            "snap_csi_plugin_nvmf_paths_up 1",
            "# TYPE snap_csi_plugin_nvmf_path_connected gauge",
            r#"snap_csi_plugin_nvmf_path_connected{volume_id="pvc-\"1\"",controller="snapcsi-nvmf-_cHZjLSIxIg",traddr="127.0.0.1",trsvcid="4420"} 1"#,
            r#"snap_csi_plugin_nvmf_path_connected{volume_id="pvc-\"1\"",controller="snapcsi-nvmf-_cHZjLSIxIg",traddr="127.0.0.1",trsvcid="4421"} 0"#,
            r#"snap_csi_plugin_nvmf_path_current{volume_id="pvc-\"1\"",controller="snapcsi-nvmf-_cHZjLSIxIg",traddr="127.0.0.1",trsvcid="4420"} 1"#,
            r#"snap_csi_plugin_nvmf_path_current{volume_id="pvc-\"1\"",controller="snapcsi-nvmf-_cHZjLSIxIg",traddr="127.0.0.1",trsvcid="4421"} 0"#,
        ] {
            assert!(page.contains(expected), "{expected} missing from:\n{page}");
        }
        let page = path_series(None);
        assert!(page.contains("snap_csi_plugin_nvmf_paths_up 0"), "{page}");
        assert!(!page.contains("path_connected{"), "{page}");
    }

    #[test]
    fn only_our_controllers_have_volumes() {
        assert_eq!(volume_of("snapcsi-nvmf-pvc-1").as_deref(), Some("pvc-1"));
        assert_eq!(volume_of("snapcsi-aio-pvc-1"), None);
        assert_eq!(volume_of("Nvme0"), None);
    }
}
