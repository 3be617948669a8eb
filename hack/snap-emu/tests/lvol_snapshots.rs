//! Lvol snapshots and clones as SPDK v24.09 answers them: names, flags,
//! the deletion rule for lvols with clones, decoupling, and the bytes each
//! lvol reads (a snapshot keeps what its origin held when it was taken).

mod common;

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use common::{Client, Emu, sparse_file};
use serde_json::{Value, json};
use snap_emu::Config;

const MIB: u64 = 1 << 20;

/// A target with pool bdev `pool` (64 MiB, 4 KiB blocks), lvstore `lvs` and
/// an 8 MiB thin lvol `lvs/v`; returns the lvstore's directory of lvol files.
async fn store(emu: &Emu, dir: &Path) -> (Client, PathBuf) {
    let pool = dir.join("pool.img");
    sparse_file(&pool, 64 * MIB);
    let mut t = emu.client().await;
    t.ok(
        "bdev_aio_create",
        json!({"name": "pool", "filename": pool, "block_size": 4096}),
    )
    .await;
    let lvs = t
        .ok(
            "bdev_lvol_create_lvstore",
            json!({"bdev_name": "pool", "lvs_name": "lvs"}),
        )
        .await;
    t.ok(
        "bdev_lvol_create",
        json!({"lvol_name": "v", "size_in_mib": 8, "lvs_name": "lvs", "thin_provision": true}),
    )
    .await;
    let files = emu
        .state_dir
        .join("lvstores")
        .join(format!("lvs-{}", lvs.as_str().unwrap()));
    (t, files)
}

async fn lvol(t: &mut Client, name: &str) -> Value {
    let bdevs = t.ok("bdev_get_bdevs", json!({"name": name})).await;
    bdevs[0].clone()
}

fn file_of(files: &Path, bdev: &Value) -> PathBuf {
    files.join(format!("{}.img", bdev["name"].as_str().unwrap()))
}

fn write_at(path: &Path, offset: u64, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(bytes).unwrap();
}

fn read_at(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut f = std::fs::File::open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    let mut buf = vec![0; len];
    f.read_exact(&mut buf).unwrap();
    buf
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_and_clones_follow_spdks_rules() {
    let dir = tempfile::tempdir().unwrap();
    let emu = Emu::start(Config::for_test(&dir.path().join("state")).without_snap()).await;
    let (mut t, files) = store(&emu, dir.path()).await;
    let v = file_of(&files, &lvol(&mut t, "lvs/v").await);
    write_at(&v, 3 * MIB, b"before");

    let snap = t
        .ok(
            "bdev_lvol_snapshot",
            json!({"lvol_name": "lvs/v", "snapshot_name": "s"}),
        )
        .await;
    let s = lvol(&mut t, "lvs/s").await;
    assert_eq!(s["name"], snap);
    assert_eq!(s["aliases"], json!(["lvs/s"]));
    assert_eq!(s["num_blocks"], json!(8 * MIB / 4096));
    assert_eq!(s["supported_io_types"]["write"], json!(false));
    assert_eq!(s["driver_specific"]["lvol"]["snapshot"], json!(true));
    assert_eq!(s["driver_specific"]["lvol"]["clones"], json!(["v"]));
    let origin = lvol(&mut t, "lvs/v").await;
    assert_eq!(origin["driver_specific"]["lvol"]["clone"], json!(true));
    assert_eq!(
        origin["driver_specific"]["lvol"]["base_snapshot"],
        json!("s")
    );

    // Refusals after the lookup come from the blobstore's callback.
    for (params, message) in [
        (
            json!({"lvol_name": "lvs/v", "snapshot_name": "s"}),
            "File exists",
        ),
        (
            json!({"lvol_name": "lvs/v", "snapshot_name": "v"}),
            "File exists",
        ),
        (
            json!({"lvol_name": "lvs/s", "snapshot_name": "s2"}),
            "Invalid argument",
        ),
        (
            json!({"lvol_name": "lvs/v", "snapshot_name": ""}),
            "Invalid argument",
        ),
    ] {
        assert_eq!(
            t.err("bdev_lvol_snapshot", params).await,
            (-32602, message.to_string())
        );
    }
    assert_eq!(
        t.err(
            "bdev_lvol_snapshot",
            json!({"lvol_name": "lvs/nope", "snapshot_name": "x"})
        )
        .await,
        (-19, "No such device".to_string())
    );

    // The snapshot keeps what the origin held; the origin goes on changing.
    let s_file = file_of(&files, &s);
    write_at(&v, 3 * MIB, b"after!");
    assert_eq!(read_at(&s_file, 3 * MIB, 6), b"before");

    let clone = t
        .ok(
            "bdev_lvol_clone",
            json!({"snapshot_name": "lvs/s", "clone_name": "c"}),
        )
        .await;
    let c = lvol(&mut t, "lvs/c").await;
    assert_eq!(c["name"], clone);
    assert_eq!(c["num_blocks"], s["num_blocks"]);
    assert_eq!(c["driver_specific"]["lvol"]["thin_provision"], json!(true));
    assert_eq!(c["driver_specific"]["lvol"]["base_snapshot"], json!("s"));
    assert_eq!(read_at(&file_of(&files, &c), 3 * MIB, 6), b"before");
    for (params, message) in [
        (
            json!({"snapshot_name": "lvs/v", "clone_name": "c2"}),
            "Invalid argument",
        ),
        (
            json!({"snapshot_name": "lvs/s", "clone_name": "c"}),
            "File exists",
        ),
        (json!({"snapshot_name": "lvs/s"}), "Invalid argument"),
    ] {
        assert_eq!(
            t.err("bdev_lvol_clone", params).await,
            (-32602, message.to_string())
        );
    }
    let listed = t
        .ok("bdev_lvol_get_lvols", json!({"lvs_name": "lvs"}))
        .await;
    let flags: Vec<(String, bool, bool)> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap().to_string(),
                l["is_snapshot"].as_bool().unwrap(),
                l["is_clone"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        flags,
        [
            ("v".to_string(), false, true),
            ("s".to_string(), true, false),
            ("c".to_string(), false, true)
        ]
    );

    // Two clones pin the snapshot (the delete callback answers -32603);
    // resizing a snapshot is refused too.
    assert_eq!(
        t.err("bdev_lvol_delete", json!({"name": "lvs/s"})).await,
        (-32603, "Operation not permitted".to_string())
    );
    assert_eq!(
        t.err(
            "bdev_lvol_resize",
            json!({"name": "lvs/s", "size_in_mib": 16})
        )
        .await,
        (-32602, "Operation not permitted".to_string())
    );

    // Decoupled, the clone stands alone; a second decouple has no parent.
    assert_eq!(
        t.ok("bdev_lvol_decouple_parent", json!({"name": "lvs/c"}))
            .await,
        json!(true)
    );
    let c = lvol(&mut t, "lvs/c").await;
    assert_eq!(c["driver_specific"]["lvol"]["clone"], json!(false));
    assert_eq!(
        t.err("bdev_lvol_decouple_parent", json!({"name": "lvs/c"}))
            .await,
        (-32602, "Invalid argument".to_string())
    );

    // One clone left: the snapshot goes and the origin stands alone, with its data.
    t.ok("bdev_lvol_delete", json!({"name": "lvs/s"})).await;
    let origin = lvol(&mut t, "lvs/v").await;
    assert_eq!(origin["driver_specific"]["lvol"]["clone"], json!(false));
    assert_eq!(read_at(&v, 3 * MIB, 6), b"after!");
    assert!(!s_file.exists());
    for name in ["lvs/v", "lvs/c"] {
        t.ok("bdev_lvol_delete", json!({"name": name})).await;
    }
    let stores = t
        .ok("bdev_lvol_get_lvstores", json!({"lvs_name": "lvs"}))
        .await;
    assert_eq!(stores[0]["free_clusters"], stores[0]["total_data_clusters"]);
    drop(t);
    emu.stop().await;
}

/// Snapshots of snapshots' clones chain: decoupling climbs one level at a
/// time, and deleting a middle snapshot hands its parent down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chains_are_climbed_one_parent_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let emu = Emu::start(Config::for_test(&dir.path().join("state")).without_snap()).await;
    let (mut t, _files) = store(&emu, dir.path()).await;
    for s in ["s1", "s2"] {
        t.ok(
            "bdev_lvol_snapshot",
            json!({"lvol_name": "lvs/v", "snapshot_name": s}),
        )
        .await;
    }
    let s2 = lvol(&mut t, "lvs/s2").await;
    assert_eq!(s2["driver_specific"]["lvol"]["base_snapshot"], json!("s1"));
    t.ok(
        "bdev_lvol_clone",
        json!({"snapshot_name": "lvs/s2", "clone_name": "c"}),
    )
    .await;
    t.ok("bdev_lvol_decouple_parent", json!({"name": "lvs/c"}))
        .await;
    let c = lvol(&mut t, "lvs/c").await;
    assert_eq!(c["driver_specific"]["lvol"]["base_snapshot"], json!("s1"));
    t.ok("bdev_lvol_decouple_parent", json!({"name": "lvs/c"}))
        .await;
    let c = lvol(&mut t, "lvs/c").await;
    assert_eq!(c["driver_specific"]["lvol"]["clone"], json!(false));

    // s1's one clone is s2: deleting s1 makes s2 parentless.
    t.ok("bdev_lvol_delete", json!({"name": "lvs/s1"})).await;
    let s2 = lvol(&mut t, "lvs/s2").await;
    assert_eq!(s2["driver_specific"]["lvol"]["clone"], json!(false));
    assert_eq!(s2["driver_specific"]["lvol"]["clones"], json!(["v"]));
    drop(t);
    emu.stop().await;
}
