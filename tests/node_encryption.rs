//! Encryption on the DPU as kubelet drives it (as root: real loop devices
//! and mounts): a StorageClass asking for `aes-xts` and a key in the stage's
//! secrets make the DPU side expose a crypto vbdev over the plugin's bdev, so
//! the host writes plaintext and the volume's storage holds ciphertext only;
//! the same key reads it back after an unstage and a restage; unstage leaves
//! no vbdev and no key in SPDK. Refusals (no key, a malformed key, another key
//! for a staged volume) change nothing. A volume grown while staged keeps
//! its size until its next stage (SPDK's crypto vbdev ignores its base's
//! resize), and NodeExpandVolume says so at once. In both modes: the key
//! crosses the DPU link in split mode (`SNAP_CSI_TEST_DPU=split`).
//!
//! The emulator encrypts for real (AES-XTS as SPDK's software accel module
//! does) in its data path, which every byte of a crypto bdev passes through.

mod common;

use std::io::Seek;
use std::path::Path;
use std::time::{Duration, Instant};

use common::node::{
    NodeStack, Tweaks, block_capability, expand_request, grow_on_the_dpu, mount_capability,
    publish_request, read_volume, stage_request, unpublish, unstage, write_volume,
};
use snap_csi::dpu::crypto::{AES_XTS_VALUE, ENCRYPTION, KEY_SECRET};
use snap_csi::dpu::names::VolumeNames;
use snap_csi::node::config::{EmulationSetting, PlacementSetting};
use snap_csi::proto::csi::v1 as csi;
use snap_csi::proto::csi::v1::volume_capability::access_mode::Mode;
use snap_csi::spdk::accel::AccelCryptoKeysGet;
use snap_csi::spdk::bdev::BdevGetBdevs;
use tonic::Code;

/// 2 × 256 bits: the data key, then the tweak key.
const KEY: &str = "5c0a3f1e9b7d24a8c6e1f0b3d9a7c5e2f4b8d0a6c2e9f1b7d3a5c8e0f6b2d4a1\
                   a1d4b2f6e0c8a5d3b7f1e9c2a6d0b8f4e2c5a7d9b3f0e1c6a8b4d7e9b1f3a0c5";
const OTHER_KEY: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0\
                         1f2e3d4c5b6a79889786b5a4d3c2f1e01f2e3d4c5b6a79889786b5a4d3c2f1e0";
const SIZE: u64 = 64 << 20;

fn encrypted_stage(
    stack: &NodeStack,
    volume_id: &str,
    backing: &Path,
    key: Option<&str>,
) -> csi::NodeStageVolumeRequest {
    let staging = stack.path(&format!("staging/{volume_id}"));
    let mut stage = stage_request(
        volume_id,
        &staging,
        block_capability(Mode::SingleNodeWriter),
        backing,
    );
    stage
        .volume_context
        .insert(ENCRYPTION.into(), AES_XTS_VALUE.into());
    if let Some(key) = key {
        stage.secrets.insert(KEY_SECRET.into(), key.into());
    }
    stage
}

/// A recognisable 1 MiB: no 64-byte window of it is likely in ciphertext.
fn pattern() -> Vec<u8> {
    (0..1u32 << 20)
        .map(|i| b"snap-csi plaintext that must never reach the disk; "[(i % 51) as usize])
        .collect()
}

fn holds(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// What SPDK holds of the volume's encryption: its crypto vbdev's base, and
/// whether its key is in the keyring.
async fn dpu_side(stack: &NodeStack, volume_id: &str) -> (Option<String>, bool) {
    let names = VolumeNames::new(volume_id);
    let snap = stack.emulator.client();
    let bdevs = snap.call(&BdevGetBdevs::default()).await.unwrap();
    let base = bdevs
        .into_iter()
        .find(|b| b.name == names.crypto_bdev)
        .map(|b| {
            b.driver_specific
                .crypto
                .expect("a crypto vbdev")
                .base_bdev_name
        });
    let key = snap
        .call(&AccelCryptoKeysGet {
            key_name: names.crypto_key,
        })
        .await
        .is_ok_and(|keys| !keys.is_empty());
    (base, key)
}

async fn stage_write_restage_read(emulation: EmulationSetting, placement: PlacementSetting) {
    let tweaks = Tweaks {
        placement: Some(placement),
        ..Default::default()
    };
    let mut stack = NodeStack::start_with(emulation, tweaks).await;
    let volume_id = "encrypted-1";
    let backing = stack.backing_file("encrypted.img", SIZE);
    let stage = encrypted_stage(&stack, volume_id, &backing, Some(KEY));
    let staging = Path::new(&stage.staging_target_path).to_path_buf();
    let target = stack.path("target/encrypted-1");
    let capability = block_capability(Mode::SingleNodeWriter);
    let data = pattern();

    stack.client.node_stage_volume(stage.clone()).await.unwrap();
    // SNAP exposes the crypto vbdev, over the plugin's device.
    let (base, key) = dpu_side(&stack, volume_id).await;
    assert!(base.is_some() && key, "no crypto vbdev or key while staged");
    stack
        .client
        .node_publish_volume(publish_request(
            volume_id,
            &staging,
            &target,
            capability.clone(),
            false,
        ))
        .await
        .unwrap();
    write_volume(&target, &data);
    assert_eq!(read_volume(&target, data.len()), data);
    unpublish(&mut stack.client, volume_id, &target).await;
    unstage(&mut stack.client, volume_id, &staging).await;
    assert_eq!(dpu_side(&stack, volume_id).await, (None, false));
    stack.assert_nothing_left(&backing).await;

    // The storage holds ciphertext: something was written where the host
    // wrote, and none of it is the plaintext.
    let stored = std::fs::read(&backing).unwrap();
    let written = &stored[1 << 20..(1 << 20) + data.len()];
    assert!(
        written.iter().any(|b| *b != 0),
        "nothing reached the storage"
    );
    for window in data.chunks(4096).take(8) {
        assert!(!holds(&stored, &window[..64]), "plaintext on the storage");
    }

    // The same key reads it back.
    stack.client.node_stage_volume(stage).await.unwrap();
    stack
        .client
        .node_publish_volume(publish_request(
            volume_id, &staging, &target, capability, false,
        ))
        .await
        .unwrap();
    assert_eq!(read_volume(&target, data.len()), data);
    unpublish(&mut stack.client, volume_id, &target).await;
    unstage(&mut stack.client, volume_id, &staging).await;
    stack.assert_nothing_left(&backing).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvme_volumes_hold_ciphertext_only_and_read_back_with_their_key() {
    stage_write_restage_read(EmulationSetting::Nvme, PlacementSetting::Dedicated).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packed_nvme_volumes_hold_ciphertext_only_and_read_back_with_their_key() {
    stage_write_restage_read(EmulationSetting::Nvme, PlacementSetting::Packed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn virtio_blk_volumes_hold_ciphertext_only_and_read_back_with_their_key() {
    stage_write_restage_read(EmulationSetting::VirtioBlk, PlacementSetting::Dedicated).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_malformed_key_is_refused_and_changes_nothing() {
    let mut stack = NodeStack::start(EmulationSetting::Nvme).await;
    let backing = stack.backing_file("refused.img", SIZE);
    let equal_halves = format!("{}{}", &KEY[..64], &KEY[..64]);
    for (key, why) in [
        (None, "hold no"),
        (Some(&KEY[..100]), "100 hex digits"),
        (Some("not a key at all"), "not hex digits"),
        (Some(&equal_halves[..]), "halves are equal"),
    ] {
        let stage = encrypted_stage(&stack, "refused-1", &backing, key);
        let status = stack.client.node_stage_volume(stage).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(why), "{}", status.message());
        assert!(
            !status.message().contains(&KEY[..16]),
            "the key in a message"
        );
        stack.assert_nothing_left(&backing).await;
    }
    let mut unknown = encrypted_stage(&stack, "refused-1", &backing, Some(KEY));
    unknown
        .volume_context
        .insert(ENCRYPTION.into(), "rot13".into());
    let status = stack.client.node_stage_volume(unknown).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    stack.assert_nothing_left(&backing).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_key_for_a_staged_volume_is_refused_and_the_volume_stays() {
    let mut stack = NodeStack::start(EmulationSetting::Nvme).await;
    let backing = stack.backing_file("rekeyed.img", SIZE);
    let stage = encrypted_stage(&stack, "rekeyed-1", &backing, Some(KEY));
    let staging = Path::new(&stage.staging_target_path).to_path_buf();
    stack.client.node_stage_volume(stage.clone()).await.unwrap();
    let before = dpu_side(&stack, "rekeyed-1").await;

    let mut rekeyed = stage.clone();
    rekeyed.secrets.insert(KEY_SECRET.into(), OTHER_KEY.into());
    let status = stack.client.node_stage_volume(rekeyed).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().contains("another encryption key"),
        "{}",
        status.message()
    );
    assert_eq!(dpu_side(&stack, "rekeyed-1").await, before);

    // The right key still stages (idempotently), and unstage cleans up.
    stack.client.node_stage_volume(stage).await.unwrap();
    unstage(&mut stack.client, "rekeyed-1", &staging).await;
    stack.assert_nothing_left(&backing).await;
    assert_eq!(dpu_side(&stack, "rekeyed-1").await, (None, false));
}

/// An encrypted volume the controller grew while a pod uses it: SPDK's
/// crypto vbdev keeps the size it was made with, so NodeExpandVolume
/// answers at once, naming encryption and the next stage, instead of
/// waiting out kubelet's deadline for a size that cannot come. The next
/// stage makes the vbdev over the grown base: the device has the new size
/// and the stage itself grew the filesystem (what `df` in the pod shows),
/// every byte written before still there. `fs_type` `None`: a raw block
/// volume.
async fn grown_while_in_use_grows_at_the_next_stage(
    emulation: EmulationSetting,
    fs_type: Option<&str>,
) {
    // xfs takes nothing under 300 MiB.
    const SIZE: u64 = 320 << 20;
    let mut stack = NodeStack::start(emulation).await;
    let volume_id = "grown-1";
    let backing = stack.backing_file("grown.img", SIZE);
    let capability = match fs_type {
        Some(fs) => mount_capability(fs, Mode::SingleNodeWriter),
        None => block_capability(Mode::SingleNodeWriter),
    };
    let mut stage = encrypted_stage(&stack, volume_id, &backing, Some(KEY));
    stage.volume_capability = Some(capability.clone());
    let staging = Path::new(&stage.staging_target_path).to_path_buf();
    let target = stack.path("pods/grown/volumes/grown-1");
    let publish = publish_request(volume_id, &staging, &target, capability, false);
    let stage_and_publish = async |stack: &mut NodeStack| {
        stack.client.node_stage_volume(stage.clone()).await.unwrap();
        let published = stack.client.node_publish_volume(publish.clone()).await;
        published.unwrap();
    };
    // What the pod sees: its filesystem's size, or its device's.
    let size_seen = |target: &Path| match fs_type {
        Some(_) => {
            let fs = nix::sys::statvfs::statvfs(target).unwrap();
            fs.blocks() * fs.fragment_size()
        }
        None => std::fs::File::open(target)
            .unwrap()
            .seek(std::io::SeekFrom::End(0))
            .unwrap(),
    };
    let data = pattern();

    stage_and_publish(&mut stack).await;
    write_volume(&target, &data);
    let before = size_seen(&target);
    grow_on_the_dpu(&stack.emulator, &backing, 2 * SIZE).await;

    let deadline = Duration::from_secs(15);
    let expand = expand_request(volume_id, &target, &staging, 2 * SIZE);
    let asked = Instant::now();
    let status = stack
        .client
        .node_expand_volume(common::timed(expand.clone(), deadline))
        .await
        .unwrap_err();
    let took = asked.elapsed();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(
        took < deadline / 10,
        "NodeExpandVolume took {took:?} of its {deadline:?} to refuse what cannot happen"
    );
    for part in ["encrypted", "crypto bdev", "next stage", "stop every pod"] {
        assert!(
            status.message().contains(part),
            "{part:?} not in {status:?}"
        );
    }
    assert_eq!(size_seen(&target), before);
    assert_eq!(read_volume(&target, data.len()), data);

    // The pods stop: kubelet unpublishes and unstages; one starts again.
    unpublish(&mut stack.client, volume_id, &target).await;
    unstage(&mut stack.client, volume_id, &staging).await;
    stage_and_publish(&mut stack).await;
    let after = size_seen(&target);
    assert!(
        after > before + SIZE / 2,
        "{fs_type:?}: {before} bytes before, {after} after the stage"
    );
    assert_eq!(read_volume(&target, data.len()), data);
    // kubelet's NodeExpandVolume after the stage finds the size there.
    let expanded = stack.client.node_expand_volume(expand).await.unwrap();
    assert_eq!(expanded.into_inner().capacity_bytes, (2 * SIZE) as i64);

    unpublish(&mut stack.client, volume_id, &target).await;
    unstage(&mut stack.client, volume_id, &staging).await;
    assert_eq!(dpu_side(&stack, volume_id).await, (None, false));
    stack.assert_nothing_left(&backing).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xfs_volume_grown_while_in_use_grows_at_its_next_stage() {
    grown_while_in_use_grows_at_the_next_stage(EmulationSetting::Nvme, Some("xfs")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ext4_volume_grown_while_in_use_grows_at_its_next_stage() {
    grown_while_in_use_grows_at_the_next_stage(EmulationSetting::VirtioBlk, Some("ext4")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_volume_grown_while_in_use_grows_at_its_next_stage() {
    grown_while_in_use_grows_at_the_next_stage(EmulationSetting::Nvme, None).await;
}
