//! QoS limits through the CSI controller, for each backend (run by
//! `scenario_tests!`): from the StorageClass's parameters and the
//! VolumeAttributesClass's mutable parameters at CreateVolume, changed by
//! ControllerModifyVolume key by key (none: nothing changed, no error), and
//! every bad request refused with nothing changed. NVMe-oF reads the limits the target enforces on the
//! lvol; AIO reads those the plugin's CreateDevice will set
//! (`plugin_scenarios.rs` proves that it sets them).

use tonic::Code;

use super::csi::*;
use snap_csi_spdk_plugin::qos::{R_MBYTES_KEY, RW_IOPS_KEY, RW_MBYTES_KEY, W_MBYTES_KEY};

/// A ModifyVolume's volume id and mutable parameters, and what its
/// refusal must name.
type Refusal<'a> = (&'a str, Vec<(&'a str, &'a str)>, &'a str);

pub async fn qos_limits_are_created_modified_and_checked(csi: &Csi, backend: &str) {
    let mut request = volume("pvc-qos", backend, 8 * MIB, 0);
    for (key, value) in [(RW_IOPS_KEY, "2000"), (W_MBYTES_KEY, "0")] {
        request.parameters.insert(key.into(), value.into());
    }
    // Mutable parameters take precedence over parameters (CSI).
    for (key, value) in [(RW_IOPS_KEY, "4000"), (R_MBYTES_KEY, "010")] {
        request.mutable_parameters.insert(key.into(), value.into());
    }
    let created = csi.create(request.clone()).await.unwrap();
    let context = &created.volume_context;
    assert_eq!(context[RW_IOPS_KEY], "4000");
    assert_eq!(context[R_MBYTES_KEY], "10", "canonical, as SPDK reads it");
    assert_eq!(context[W_MBYTES_KEY], "0");
    assert!(!context.contains_key(RW_MBYTES_KEY));
    assert_eq!(csi.qos_limits(&created).await, [4000, 0, 10, 0]);

    // Only the keys given change; the same change again is a no-op.
    let id = created.volume_id.as_str();
    for _ in 0..2 {
        csi.modify(id, &[(W_MBYTES_KEY, "20"), (RW_MBYTES_KEY, "30")])
            .await
            .unwrap();
        assert_eq!(csi.qos_limits(&created).await, [4000, 30, 10, 20]);
    }
    csi.modify(id, &[(RW_IOPS_KEY, "0")]).await.unwrap();
    assert_eq!(csi.qos_limits(&created).await, [0, 30, 10, 20]);
    // A retried CreateVolume answers the volume and undoes no modification.
    assert_eq!(csi.create(request).await.unwrap(), created);
    assert_eq!(csi.qos_limits(&created).await, [0, 30, 10, 20]);

    let refused: Vec<Refusal> = vec![
        ("", vec![(RW_IOPS_KEY, "1000")], "volume_id"),
        (id, vec![("XXX_FakeKey", "XXX_FakeValue")], "XXX_FakeKey"),
        (id, vec![(RW_IOPS_KEY, "1500")], RW_IOPS_KEY),
        (id, vec![(RW_IOPS_KEY, "999")], RW_IOPS_KEY),
        (id, vec![(R_MBYTES_KEY, "-1")], R_MBYTES_KEY),
        (id, vec![(W_MBYTES_KEY, "2.5")], W_MBYTES_KEY),
        (id, vec![(RW_MBYTES_KEY, "lots")], RW_MBYTES_KEY),
        (
            id,
            vec![(RW_MBYTES_KEY, "18446744073709551616")],
            RW_MBYTES_KEY,
        ),
        // One bad key refuses the good ones with it.
        (
            id,
            vec![(RW_IOPS_KEY, "8000"), (W_MBYTES_KEY, "x")],
            W_MBYTES_KEY,
        ),
    ];
    for (volume_id, pairs, names) in refused {
        let status = assert_code(
            csi.modify(volume_id, &pairs).await,
            Code::InvalidArgument,
            names,
        );
        assert!(status.message().contains(names), "{names}: {status:?}");
    }
    assert_eq!(csi.qos_limits(&created).await, [0, 30, 10, 20]);
    // No mutable parameters: nothing to change, which is no error (CSI:
    // only keys that are given modify a volume; csi-sanity's default).
    csi.modify(id, &[]).await.unwrap();
    assert_eq!(csi.qos_limits(&created).await, [0, 30, 10, 20]);
    // An absent volume is NOT_FOUND whatever the parameters.
    let asks: [&[(&str, &str)]; 3] = [
        &[(RW_IOPS_KEY, "1000")],
        &[],
        &[("XXX_FakeKey", "XXX_FakeValue")],
    ];
    for missing in [format!("{backend}-pvc-nope"), "pvc-not-ours".to_string()] {
        for pairs in asks {
            assert_code(csi.modify(&missing, pairs).await, Code::NotFound, &missing);
        }
    }

    // CreateVolume refuses bad limits in either map and makes nothing.
    let mut bad = volume("pvc-qos-bad", backend, 8 * MIB, 0);
    bad.parameters.insert(RW_IOPS_KEY.into(), "100".into());
    assert_code(csi.create(bad).await, Code::InvalidArgument, "parameters");
    let mut bad = volume("pvc-qos-bad", backend, 8 * MIB, 0);
    bad.mutable_parameters
        .insert("XXX_FakeKey".into(), "XXX_FakeValue".into());
    assert_code(csi.create(bad).await, Code::InvalidArgument, "mutable");
    assert_eq!(csi.list_all(0).await, [id]);

    csi.delete(id).await.unwrap();
    // A volume made again under the name starts from its own limits.
    let plain = csi
        .create(volume("pvc-qos", backend, 8 * MIB, 0))
        .await
        .unwrap();
    assert_eq!(csi.qos_limits(&plain).await, [0; 4]);
    csi.delete(&plain.volume_id).await.unwrap();
    let left = csi.leftovers().await;
    assert!(left.is_empty(), "left behind: {left:?}");
}
