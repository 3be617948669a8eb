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
    use crate::common::Source;

    crate::multipath_scenario_tests!(csi, Source::real());
    crate::multipath_scenario_tests!(plugin, Source::real());
    crate::multipath_scenario_tests!(silent, Source::real());
}
