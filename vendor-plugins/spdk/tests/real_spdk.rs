//! The sample plugin against real SPDK v24.09 `spdk_tgt` processes (no
//! hugepages, no PCI), running the same scenarios as the emulator's tests:
//! the plugin service with every plugins.v1 RPC for both backends (a real
//! `spdk_tgt` as the DPU's SPDK, a second one as the NVMe-oF target) and
//! `plugin-check`; and the CSI controller's NVMe-oF backend with a real
//! target (lvstore, lvols, subsystems, a TCP listener on loopback) while the
//! other `spdk_tgt` reads and writes the volumes over NVMe/TCP.
//!
//! SNAP's emulation methods (NVMe and virtio-blk functions) exist only in the
//! emulator: SNAP is not public. The plugin service calls none of them.
//! Runs when `SNAP_CSI_SPDK_TGT` names an `spdk_tgt` binary.

mod common;

mod plugin {
    use crate::common::Source;

    crate::plugin_scenario_tests!(aio, Source::real());
    crate::plugin_scenario_tests!(nvmf, Source::real());
    crate::plugin_scenario_tests!(fs, Source::real());
    crate::plugin_scenario_tests!(check, Source::real());
    crate::plugin_scenario_tests!(check_fs, Source::real());
}

mod csi_nvmf {
    use crate::common::Source;
    use crate::common::csi::{Backends, Csi};

    async fn controller() -> Option<Csi> {
        let source = Source::real()?;
        let backends = Backends {
            aio: false,
            nvmf: true,
            default: "nvmf",
        };
        Some(Csi::start_on(backends, &source).await)
    }

    crate::scenario_tests!(controller().await, "nvmf");
}

mod multipath {
    use std::time::Duration;

    use crate::common::Source;
    use crate::common::multipath::{SilentCut, a_silent_cut_stalls_writes_briefly_and_fails_none};

    crate::multipath_scenario_tests!(csi, Source::real());
    crate::multipath_scenario_tests!(plugin, Source::real());

    /// A silent cut of the current path for 8 s (packets dropped, nothing
    /// closed) under a writer, with the settings SNAP's SPDK should run
    /// with (`snap_csi_spdk_plugin::paths::snap_bdev_nvme_options`): no
    /// write fails, every block reads back, the failover stalls a write
    /// under 2 s (measured 1.7 s: ~0.7 s for the kernel to give up the
    /// socket, then SPDK's reset blocks its reactor in `connect()` ~1 s),
    /// and no write stalls 3 s while the path stays silent (measured
    /// 2.05 s every ~3 s: each reconnect attempt, chained twice, blocks
    /// the reactor ~1 s; see `TRANSPORT_ACK_TIMEOUT`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_cut_fails_over_within_two_seconds() {
        let Some(source) = Source::real() else {
            return;
        };
        let cut = SilentCut {
            options: snap_csi_spdk_plugin::paths::snap_bdev_nvme_options(),
            failover_bound: Duration::from_secs(2),
            cut_bound: Duration::from_secs(3),
            hold: Duration::from_secs(8),
        };
        a_silent_cut_stalls_writes_briefly_and_fails_none(&source, &cut).await;
    }
}
