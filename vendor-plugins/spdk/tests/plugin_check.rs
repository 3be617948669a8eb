//! The sample plugin passes `snap-csi plugin-check`, the conformance checker
//! vendors run on theirs, with the AIO backend on the emulator.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{Emulator, Plugin};
use snap_csi::plugin_check::{self, Verdict};
use snap_csi_spdk_plugin::backend::{AIO, BACKEND_KEY, PATH_KEY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_plugin_passes_plugin_check() {
    let snap = Emulator::snap().await;
    let plugin = Plugin::start(snap.socket()).await;
    let file = snap.file("check.img");
    let config = plugin_check::Config {
        socket: plugin.socket.clone(),
        volume_context: HashMap::from([
            (BACKEND_KEY.to_string(), AIO.to_string()),
            (PATH_KEY.to_string(), file.display().to_string()),
        ]),
        timeout: Duration::from_secs(30),
    };
    let report = plugin_check::run(&config, &mut |result| println!("{result}"))
        .await
        .unwrap();
    assert_eq!(report.failed(), 0, "{report}");
    assert!(report.passed() >= 17, "{report}");
    assert!(report.names(Verdict::Fail).is_empty());
    assert!(
        snap.bdevs().await.is_empty(),
        "plugin-check cleaned up after itself"
    );
}
