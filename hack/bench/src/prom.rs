//! Scraping a Prometheus page and reading the outbound-call metrics the
//! node and the plugin keep, so that the bench can say how many SNAP and
//! plugin calls one node RPC made and how long they took; in split mode
//! also the node's calls to the DPU agent, the calls the agent served, and
//! the TLS handshakes on the link.

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A sample's labels, in page order.
type Labels = Vec<(String, String)>;

/// One page: every sample as (name, labels, value).
#[derive(Debug, Default)]
pub struct Page {
    samples: Vec<(String, Labels, f64)>,
}

/// GETs `url` (`http://host:port/path`); our responder closes after one answer.
pub async fn scrape(url: &str) -> anyhow::Result<Page> {
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("{url}: not an http:// address"))?;
    let (host_port, path) = match rest.split_once('/') {
        Some((h, p)) => (h, format!("/{p}")),
        None => (rest, "/metrics".to_string()),
    };
    let mut stream = TcpStream::connect(host_port)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {host_port}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let Some((head, body)) = response.split_once("\r\n\r\n") else {
        bail!("{url}: no HTTP header in the answer");
    };
    if !head.starts_with("HTTP/1.1 200") {
        bail!("{url}: {}", head.lines().next().unwrap_or(""));
    }
    Ok(parse(body))
}

/// Parses the text exposition format; lines it does not understand are skipped.
pub fn parse(body: &str) -> Page {
    let mut samples = Vec::new();
    for line in body.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, value) = match line.rsplit_once(' ') {
            Some(parts) => parts,
            None => continue,
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, parse_labels(rest.trim_end_matches('}'))),
            None => (series, Vec::new()),
        };
        samples.push((name.to_string(), labels, value));
    }
    Page { samples }
}

/// `a="x",b="y"`; our label values contain no quotes or commas.
fn parse_labels(text: &str) -> Labels {
    text.split("\",")
        .filter_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            Some((key.to_string(), value.trim_matches('"').to_string()))
        })
        .collect()
}

/// The calls a scrape of the node's page makes itself (its per-volume I/O
/// series read SNAP's counters: the node's `bdev_get_iostat`, or its
/// `GetIoStats` that the agent serves with one), which no node RPC makes:
/// [`Page::sum`] and [`Page::by_label`] leave them out, so that the bench's
/// pages before and after an RPC charge it only with its own calls.
const SCRAPE_CALLS: [&str; 3] = ["bdev_get_iostat", "GetIoStats", "DpuAgent/GetIoStats"];

fn charged(labels: &Labels) -> bool {
    !labels
        .iter()
        .any(|(k, v)| k == "method" && SCRAPE_CALLS.contains(&v.as_str()))
}

impl Page {
    /// The sum of every `name` sample whose labels include all of `want`
    /// (but for [`SCRAPE_CALLS`]).
    pub fn sum(&self, name: &str, want: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(n, labels, _)| {
                n == name
                    && charged(labels)
                    && want
                        .iter()
                        .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, _, value)| value)
            .sum()
    }

    /// The sum of the `name` samples of the page process's
    /// `bdev_get_iostat` calls (a scrape's own).
    pub fn iostat(&self, name: &str) -> f64 {
        self.samples
            .iter()
            .filter(|(n, labels, _)| {
                n == name
                    && labels
                        .iter()
                        .any(|(k, v)| k == "method" && v == "bdev_get_iostat")
            })
            .map(|(_, _, value)| value)
            .sum()
    }

    /// How many samples `name` has: series on the page.
    pub fn series(&self, name: &str) -> usize {
        self.samples.iter().filter(|(n, _, _)| n == name).count()
    }
}

impl Page {
    /// Per value of `label`: the sum of the `name` samples carrying it that
    /// also match `want` (but for [`SCRAPE_CALLS`]).
    pub fn by_label(
        &self,
        name: &str,
        label: &str,
        want: &[(&str, &str)],
    ) -> std::collections::BTreeMap<String, f64> {
        let mut out = std::collections::BTreeMap::new();
        for (n, labels, value) in &self.samples {
            if n != name
                || !charged(labels)
                || !want
                    .iter()
                    .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
            {
                continue;
            }
            if let Some((_, key)) = labels.iter().find(|(k, _)| k == label) {
                *out.entry(key.clone()).or_insert(0.0) += value;
            }
        }
        out
    }
}

/// Per SNAP method: calls and their summed seconds, from one process's page.
pub fn snap_methods(page: &Page) -> std::collections::BTreeMap<String, (f64, f64)> {
    let calls = page.by_label(
        "snap_csi_outbound_request_duration_seconds_count",
        "method",
        &[("target", "snap")],
    );
    let seconds = page.by_label(
        "snap_csi_outbound_request_duration_seconds_sum",
        "method",
        &[("target", "snap")],
    );
    calls
        .into_iter()
        .map(|(method, n)| {
            let s = seconds.get(&method).copied().unwrap_or(0.0);
            (method, (n, s))
        })
        .collect()
}

/// Outbound calls one process made, by target, and their summed time.
#[derive(Debug, Default, Clone, Copy)]
pub struct Outbound {
    pub snap_calls: f64,
    pub snap_seconds: f64,
    pub plugin_calls: f64,
    pub plugin_seconds: f64,
    /// The node's host work: tools (mkfs, blockdev, ...) and mount syscalls.
    pub host_seconds: f64,
    /// Time the process spent serving gRPC calls, by its own clock (from
    /// the request's arrival in its tower stack to the response).
    pub served_seconds: f64,
    /// The part of it no outbound call or host work was in progress: the
    /// process's own work, as it measures it.
    pub own_seconds: f64,
    /// Calls to the DPU agent (the node, split mode).
    pub link_calls: f64,
    /// gRPC calls served (the agent's: calls that crossed the link).
    pub served_calls: f64,
    /// TLS handshakes completed on the DPU link, either role.
    pub handshakes: f64,
}

impl Outbound {
    pub fn of(page: &Page) -> Outbound {
        let calls = |target| page.sum("snap_csi_outbound_requests_total", &[("target", target)]);
        let seconds = |target| {
            page.sum(
                "snap_csi_outbound_request_duration_seconds_sum",
                &[("target", target)],
            )
        };
        Outbound {
            snap_calls: calls("snap"),
            snap_seconds: seconds("snap"),
            plugin_calls: calls("plugin"),
            plugin_seconds: seconds("plugin"),
            host_seconds: seconds("host"),
            served_seconds: page.sum("snap_csi_grpc_request_duration_seconds_sum", &[]),
            own_seconds: page.sum("snap_csi_grpc_request_own_seconds_sum", &[]),
            link_calls: calls("dpu-agent"),
            served_calls: page.sum("snap_csi_grpc_requests_total", &[]),
            handshakes: page.sum("snap_csi_tls_handshakes_total", &[("outcome", "ok")]),
        }
    }

    /// What happened between `before` and `self`.
    pub fn since(&self, before: &Outbound) -> Outbound {
        Outbound {
            snap_calls: self.snap_calls - before.snap_calls,
            snap_seconds: self.snap_seconds - before.snap_seconds,
            plugin_calls: self.plugin_calls - before.plugin_calls,
            plugin_seconds: self.plugin_seconds - before.plugin_seconds,
            host_seconds: self.host_seconds - before.host_seconds,
            served_seconds: self.served_seconds - before.served_seconds,
            own_seconds: self.own_seconds - before.own_seconds,
            link_calls: self.link_calls - before.link_calls,
            served_calls: self.served_calls - before.served_calls,
            handshakes: self.handshakes - before.handshakes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_our_outbound_metrics() {
        let page = parse(concat!(
            "# HELP x\n",
            "snap_csi_outbound_requests_total{target=\"snap\",method=\"a\",outcome=\"ok\"} 3\n",
            "snap_csi_outbound_requests_total{target=\"snap\",method=\"b\",outcome=\"-17\"} 1\n",
            "snap_csi_outbound_requests_total{target=\"plugin\",method=\"c\",outcome=\"ok\"} 2\n",
            "snap_csi_outbound_request_duration_seconds_sum{target=\"snap\",method=\"a\"} 0.5\n",
            "snap_csi_outbound_request_duration_seconds_bucket{le=\"0.1\",target=\"snap\",method=\"a\"} 1\n",
            "snap_csi_outbound_requests_total{target=\"dpu-agent\",method=\"Attach\",outcome=\"ok\"} 5\n",
            "snap_csi_grpc_requests_total{method=\"DpuAgent/Attach\",code=\"Ok\"} 7\n",
            "snap_csi_tls_handshakes_total{role=\"client\",outcome=\"ok\"} 1\n",
            "snap_csi_tls_handshakes_total{role=\"client\",outcome=\"refused\"} 2\n",
            "# EOF\n"
        ));
        let out = Outbound::of(&page);
        assert_eq!(out.snap_calls, 4.0);
        assert_eq!(out.plugin_calls, 2.0);
        assert_eq!(out.snap_seconds, 0.5);
        assert_eq!(out.link_calls, 5.0);
        assert_eq!(out.served_calls, 7.0);
        assert_eq!(out.handshakes, 1.0);
    }

    #[test]
    fn a_scrapes_own_reads_are_not_charged_to_rpcs() {
        let page = parse(concat!(
            "snap_csi_outbound_requests_total{target=\"snap\",method=\"a\",outcome=\"ok\"} 3\n",
            "snap_csi_outbound_requests_total{target=\"snap\",method=\"bdev_get_iostat\",outcome=\"ok\"} 2\n",
            "snap_csi_outbound_request_duration_seconds_count{target=\"snap\",method=\"bdev_get_iostat\"} 2\n",
            "snap_csi_outbound_requests_total{target=\"dpu-agent\",method=\"GetIoStats\",outcome=\"ok\"} 2\n",
            "snap_csi_grpc_requests_total{method=\"DpuAgent/GetIoStats\",code=\"Ok\"} 2\n",
            "# EOF\n"
        ));
        let out = Outbound::of(&page);
        assert_eq!(
            (out.snap_calls, out.link_calls, out.served_calls),
            (3.0, 0.0, 0.0)
        );
        assert!(snap_methods(&page).is_empty());
        assert_eq!(page.iostat("snap_csi_outbound_requests_total"), 2.0);
    }
}
