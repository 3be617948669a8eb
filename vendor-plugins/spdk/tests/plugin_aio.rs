//! The plugin over real gRPC against the SNAP emulator, AIO backend (see
//! `common/plugin_scenarios.rs` for what each test checks).

mod common;

plugin_scenario_tests!(aio, Some(common::Source::Emulator));

/// With an NFS server configured, filesystem devices are DOCA SNAP's NFS
/// fsdevs of the volume's directory in the server's export, as DPF's plugin
/// makes them (the emulator serves the export's path from this machine),
/// made, found, listed and removed like aio ones. SPDK v24.09 has no NFS
/// fsdev, so only the emulator runs this.
#[tokio::test]
async fn with_an_nfs_server_fs_devices_are_nfs_fsdevs_of_the_export() {
    use snap_csi::spdk::fsdev::FrameworkGetConfig;
    use snap_csi_spdk_plugin::backend::Devices;

    let snap = common::Spdk::snap().await;
    let export = snap.dir.path().join("export");
    let dir = export.join("pvc-nfs");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("hello"), b"kept").unwrap();
    let devices = Devices {
        block: false,
        fs_share: Some(export.clone()),
        fs_nfs_server: Some("192.0.2.10".into()),
    };
    let plugin = common::Plugin::start_making(snap.socket(), devices).await;
    let context = common::fs_context(&dir);
    let device = plugin
        .create_as("pvc-nfs", "Filesystem", context.clone())
        .await
        .unwrap();
    let again = plugin
        .create_as("pvc-nfs", "Filesystem", context)
        .await
        .unwrap();
    assert_eq!(again, device);

    let query = FrameworkGetConfig {
        name: "fsdev".into(),
    };
    let config = snap.client().call(&query).await.unwrap();
    let made: Vec<_> = config
        .iter()
        .filter(|c| c.method != "fsdev_set_opts")
        .collect();
    assert_eq!(made.len(), 1, "{config:?}");
    assert_eq!(made[0].method, "fsdev_nfs_create");
    assert_eq!(made[0].params["name"], device.as_str());
    assert_eq!(made[0].params["server"], "192.0.2.10");
    assert_eq!(made[0].params["exportname"], dir.display().to_string());
    assert_eq!(
        plugin.get("pvc-nfs", &device).await.unwrap().volume_mode,
        "Filesystem"
    );
    assert_eq!(
        plugin.list_all(0).await,
        [("pvc-nfs".to_string(), device.clone())]
    );

    plugin.delete("pvc-nfs", &device).await.unwrap();
    plugin.delete("pvc-nfs", &device).await.unwrap();
    assert!(snap.fsdevs().await.is_empty());
    assert_eq!(std::fs::read(dir.join("hello")).unwrap(), b"kept");
}
