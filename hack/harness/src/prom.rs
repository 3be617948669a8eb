//! Scraping a Prometheus page of ours (`scrape`, [`Page`]): what the bench
//! reads of the outbound-call metrics every process keeps, what the demo
//! reads of a plugin's paths.

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

fn has(labels: &Labels, want: &[(&str, &str)]) -> bool {
    want.iter()
        .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
}

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
            .filter(|(n, labels, _)| n == name && charged(labels) && has(labels, want))
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

    /// The one `name` sample whose labels include all of `want`, if any.
    pub fn value(&self, name: &str, want: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|(n, labels, _)| n == name && has(labels, want))
            .map(|(_, _, value)| *value)
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
            if n != name || !charged(labels) || !has(labels, want) {
                continue;
            }
            if let Some((_, key)) = labels.iter().find(|(k, _)| k == label) {
                *out.entry(key.clone()).or_insert(0.0) += value;
            }
        }
        out
    }
}
