//! Scraping a Prometheus page and reading the outbound-call metrics the
//! node and the plugin keep, so that the bench can say how many SNAP and
//! plugin calls one node RPC made and how long they took; in split mode
//! also the node's calls to the DPU agent, the calls the agent served, and
//! the TLS handshakes on the link.

#[cfg(test)]
use snap_csi_harness::prom::parse;
pub use snap_csi_harness::prom::{Page, scrape};

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
