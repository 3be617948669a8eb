//! The guest's link to the DPU side: a tap device on this machine, a /30 of
//! 198.19.0.0/16 (the half of RFC 2544's 198.18.0.0/15 that `local-up`'s
//! links, 198.18.N.0/30, leave), this machine's end here and the guest's
//! `eth0` at the other. The guest's own kernel is
//! the other network stack, as a BlueField host's is its DPU's.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, bail};

#[derive(Debug)]
pub struct Link {
    pub tap: String,
    /// This machine's end: where a DPU agent listens for the guest.
    pub host: Ipv4Addr,
    /// The guest's `eth0`.
    pub guest: Ipv4Addr,
}

impl Link {
    /// A new tap with its own /30, up; removed when dropped.
    pub fn new() -> anyhow::Result<Link> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        // 16384 subnets; the process id keeps concurrent test binaries apart.
        let index = (std::process::id() * 16 + NEXT.fetch_add(1, Ordering::Relaxed)) % 16384;
        let [_, _, c, d] = (index * 4).to_be_bytes();
        let link = Link {
            tap: format!("scg{index}"),
            host: Ipv4Addr::new(198, 19, c, d + 1),
            guest: Ipv4Addr::new(198, 19, c, d + 2),
        };
        ip(&["tuntap", "add", "dev", &link.tap, "mode", "tap"])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/30", link.host),
            "dev",
            &link.tap,
        ])?;
        ip(&["link", "set", &link.tap, "up"])?;
        Ok(link)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.tap]);
    }
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
