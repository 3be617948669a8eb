//! The emulator held against a real SPDK v24.09 `spdk_tgt`, method by method:
//! every SPDK method the emulator implements is called with the same
//! requests on both (good arguments and bad: missing, wrong types, unknown
//! names, repeated creates and deletes), and every result and error is
//! compared after masking what legitimately differs (UUIDs, the directory,
//! the TCP port, counters of time). Differences the emulator keeps on purpose
//! are listed in its module docs (`src/lib.rs`, "Known differences"), each
//! under the id of the step that shows it; any other difference fails.
//!
//! SNAP's methods are not here: SNAP is not public, so the emulator's SNAP
//! side is held against the captures in `reference/snap4-rpc.md` instead.
//! Runs when `SNAP_CSI_SPDK_TGT` names an `spdk_tgt` binary.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use common::real_spdk::Suite;
use common::{Client, Emu, free_port, mask_uuids, sparse_file};
use serde_json::{Value, json};
use snap_emu::Config;

const MIB: u64 = 1 << 20;
const NQN: &str = "nqn.2016-06.io.spdk:cnode1";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:2f1e3c4d-5a6b-4c7d-8e9f-0a1b2c3d4e5f";
/// Keys whose values are measurements, not state: compared by type only.
/// I/O counters are among them: real SPDK reads a new bdev when it examines
/// it (partition tables, lvol superblocks), the emulator does not.
fn measured(key: &str) -> bool {
    matches!(key, "tick_rate" | "ticks")
        || key.ends_with("_ticks")
        || key.starts_with("bytes_")
        || (key.starts_with("num_") && key.ends_with("_ops"))
}

/// One step of the script, run on both.
enum Step {
    /// A call: `id` names it in the docs; `{dir}`, `{port}` and saved values
    /// in the params are replaced per side.
    Call {
        id: &'static str,
        method: &'static str,
        params: Option<Value>,
        /// Remember the (string) result under this name.
        save: Option<&'static str>,
    },
    /// Grow a file of the side's directory (for `bdev_aio_rescan`).
    Grow(&'static str, u64),
}

fn call(id: &'static str, method: &'static str, params: Value) -> Step {
    Step::Call {
        id,
        method,
        params: Some(params),
        save: None,
    }
}

fn bare(id: &'static str, method: &'static str) -> Step {
    Step::Call {
        id,
        method,
        params: None,
        save: None,
    }
}

fn saved(id: &'static str, method: &'static str, params: Value, name: &'static str) -> Step {
    Step::Call {
        id,
        method,
        params: Some(params),
        save: Some(name),
    }
}

fn listen_address(port: &str) -> Value {
    json!({"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": port})
}

/// The script: each method with good and bad arguments, in an order that
/// builds on what earlier steps made.
fn script() -> Vec<Step> {
    let aio = "{dir}/aio.img";
    vec![
        // The application.
        bare("version", "spdk_get_version"),
        call("version-params", "spdk_get_version", json!({"x": 1})),
        bare("wait-init", "framework_wait_init"),
        call("wait-init-params", "framework_wait_init", json!({"x": 1})),
        bare("start-init", "framework_start_init"),
        bare("examine", "bdev_wait_for_examine"),
        call("examine-params", "bdev_wait_for_examine", json!({"x": 1})),
        call("methods-bad", "rpc_get_methods", json!({"current": "yes"})),
        call("methods-unknown-key", "rpc_get_methods", json!({"x": 1})),
        bare("unknown-method", "no_such_method"),
        // Malloc and null bdevs.
        call(
            "malloc",
            "bdev_malloc_create",
            json!({"name": "Malloc0", "num_blocks": 2048, "block_size": 512}),
        ),
        call(
            "malloc-again",
            "bdev_malloc_create",
            json!({"name": "Malloc0", "num_blocks": 2048, "block_size": 512}),
        ),
        call(
            "malloc-unnamed",
            "bdev_malloc_create",
            json!({"num_blocks": 4096, "block_size": 4096}),
        ),
        call(
            "malloc-bad-block-size",
            "bdev_malloc_create",
            json!({"name": "M", "num_blocks": 8, "block_size": 513}),
        ),
        call(
            "malloc-no-blocks",
            "bdev_malloc_create",
            json!({"name": "M", "block_size": 512}),
        ),
        call(
            "malloc-string-blocks",
            "bdev_malloc_create",
            json!({"name": "M", "num_blocks": "8", "block_size": 512}),
        ),
        call("malloc-array", "bdev_malloc_create", json!(["M", 8, 512])),
        bare("malloc-no-params", "bdev_malloc_create"),
        call(
            "null",
            "bdev_null_create",
            json!({"name": "Null0", "num_blocks": 1024, "block_size": 512}),
        ),
        call(
            "null-again",
            "bdev_null_create",
            json!({"name": "Null0", "num_blocks": 1024, "block_size": 512}),
        ),
        call(
            "null-bad-block-size",
            "bdev_null_create",
            json!({"name": "N", "num_blocks": 8, "block_size": 100}),
        ),
        call(
            "null-no-name",
            "bdev_null_create",
            json!({"num_blocks": 8, "block_size": 512}),
        ),
        call("bdev", "bdev_get_bdevs", json!({"name": "Malloc0"})),
        bare("bdevs", "bdev_get_bdevs"),
        call("bdev-missing", "bdev_get_bdevs", json!({"name": "nope"})),
        call(
            "bdev-missing-waited",
            "bdev_get_bdevs",
            json!({"name": "nope", "timeout": 50}),
        ),
        call("bdev-number-name", "bdev_get_bdevs", json!({"name": 5})),
        call("bdev-unknown-key", "bdev_get_bdevs", json!({"x": 1})),
        call("iostat", "bdev_get_iostat", json!({"name": "Malloc0"})),
        call("iostat-missing", "bdev_get_iostat", json!({"name": "nope"})),
        call(
            "iostat-per-channel",
            "bdev_get_iostat",
            json!({"name": "Null0", "per_channel": true}),
        ),
        call(
            "iostat-per-channel-unnamed",
            "bdev_get_iostat",
            json!({"per_channel": true}),
        ),
        call("iostat-unknown-key", "bdev_get_iostat", json!({"x": 1})),
        call(
            "malloc-delete",
            "bdev_malloc_delete",
            json!({"name": "Malloc0"}),
        ),
        call(
            "malloc-delete-again",
            "bdev_malloc_delete",
            json!({"name": "Malloc0"}),
        ),
        call(
            "malloc-delete-null",
            "bdev_malloc_delete",
            json!({"name": "Null0"}),
        ),
        call("malloc-delete-empty", "bdev_malloc_delete", json!({})),
        call("null-delete", "bdev_null_delete", json!({"name": "Null0"})),
        call(
            "null-delete-again",
            "bdev_null_delete",
            json!({"name": "Null0"}),
        ),
        // AIO bdevs.
        call(
            "aio",
            "bdev_aio_create",
            json!({"name": "Aio0", "filename": aio, "block_size": 512}),
        ),
        call(
            "aio-again",
            "bdev_aio_create",
            json!({"name": "Aio0", "filename": aio, "block_size": 512}),
        ),
        call(
            "aio-no-block-size",
            "bdev_aio_create",
            json!({"name": "Aio1", "filename": aio}),
        ),
        call(
            "aio-same-file",
            "bdev_aio_create",
            json!({"name": "Aio1", "filename": aio, "block_size": 512}),
        ),
        call(
            "aio-missing-file",
            "bdev_aio_create",
            json!({"name": "Aio2", "filename": "{dir}/missing.img"}),
        ),
        call(
            "aio-empty-file",
            "bdev_aio_create",
            json!({"name": "Aio2", "filename": "{dir}/empty.img", "block_size": 512}),
        ),
        call(
            "aio-partial-block",
            "bdev_aio_create",
            json!({"name": "Aio2", "filename": "{dir}/odd.img", "block_size": 4096}),
        ),
        call(
            "aio-bad-block-size",
            "bdev_aio_create",
            json!({"name": "Aio2", "filename": "{dir}/other.img", "block_size": 1000}),
        ),
        call(
            "aio-readonly",
            "bdev_aio_create",
            json!({"name": "Aio3", "filename": "{dir}/other.img", "readonly": true, "block_size": 512}),
        ),
        call("aio-no-file", "bdev_aio_create", json!({"name": "Aio2"})),
        call("aio-bdev", "bdev_get_bdevs", json!({"name": "Aio0"})),
        Step::Grow("aio.img", 16 * MIB),
        call("aio-rescan", "bdev_aio_rescan", json!({"name": "Aio0"})),
        call("aio-rescanned", "bdev_get_bdevs", json!({"name": "Aio0"})),
        call(
            "aio-rescan-missing",
            "bdev_aio_rescan",
            json!({"name": "nope"}),
        ),
        call("aio-delete", "bdev_aio_delete", json!({"name": "Aio0"})),
        call(
            "aio-delete-again",
            "bdev_aio_delete",
            json!({"name": "Aio0"}),
        ),
        call(
            "aio-delete-readonly",
            "bdev_aio_delete",
            json!({"name": "Aio3"}),
        ),
        call(
            "aio-delete-same-file",
            "bdev_aio_delete",
            json!({"name": "Aio1"}),
        ),
        call("aio-delete-number", "bdev_aio_delete", json!({"name": 1})),
        // Logical volumes.
        call(
            "pool",
            "bdev_aio_create",
            json!({"name": "pool0", "filename": "{dir}/pool.img", "block_size": 4096}),
        ),
        saved(
            "lvstore",
            "bdev_lvol_create_lvstore",
            json!({"bdev_name": "pool0", "lvs_name": "lvs0"}),
            "lvs",
        ),
        call(
            "lvstore-again",
            "bdev_lvol_create_lvstore",
            json!({"bdev_name": "pool0", "lvs_name": "lvs0"}),
        ),
        call(
            "lvstore-other-name",
            "bdev_lvol_create_lvstore",
            json!({"bdev_name": "pool0", "lvs_name": "lvs1"}),
        ),
        call(
            "lvstore-missing-bdev",
            "bdev_lvol_create_lvstore",
            json!({"bdev_name": "nope", "lvs_name": "lvs1"}),
        ),
        call(
            "lvstore-no-name",
            "bdev_lvol_create_lvstore",
            json!({"bdev_name": "pool0"}),
        ),
        call(
            "small-pool",
            "bdev_aio_create",
            json!({"name": "pool1", "filename": "{dir}/small.img", "block_size": 4096}),
        ),
        call(
            "lvstore-name-taken",
            "bdev_lvol_create_lvstore",
            json!({"bdev_name": "pool1", "lvs_name": "lvs0"}),
        ),
        call(
            "lvstore-cluster-below-block",
            "bdev_lvol_create_lvstore",
            json!({"bdev_name": "pool1", "lvs_name": "lvs1", "cluster_sz": 1024}),
        ),
        call(
            "lvstore-odd-cluster",
            "bdev_lvol_create_lvstore",
            json!({"bdev_name": "pool1", "lvs_name": "lvs1", "cluster_sz": 6144}),
        ),
        call(
            "lvstore-too-small",
            "bdev_lvol_create_lvstore",
            json!({"bdev_name": "pool1", "lvs_name": "lvs1"}),
        ),
        call(
            "small-pool-delete",
            "bdev_aio_delete",
            json!({"name": "pool1"}),
        ),
        bare("lvstores", "bdev_lvol_get_lvstores"),
        call("lvstores-empty-params", "bdev_lvol_get_lvstores", json!({})),
        call(
            "lvstore-by-name",
            "bdev_lvol_get_lvstores",
            json!({"lvs_name": "lvs0"}),
        ),
        call(
            "lvstore-by-uuid",
            "bdev_lvol_get_lvstores",
            json!({"uuid": "{lvs}"}),
        ),
        call(
            "lvstore-missing",
            "bdev_lvol_get_lvstores",
            json!({"lvs_name": "nope"}),
        ),
        call(
            "lvstore-both-selectors",
            "bdev_lvol_get_lvstores",
            json!({"lvs_name": "lvs0", "uuid": "{lvs}"}),
        ),
        call(
            "lvol",
            "bdev_lvol_create",
            json!({"lvol_name": "v1", "size_in_mib": 8, "lvs_name": "lvs0", "thin_provision": true}),
        ),
        call(
            "lvol-again",
            "bdev_lvol_create",
            json!({"lvol_name": "v1", "size_in_mib": 8, "lvs_name": "lvs0", "thin_provision": true}),
        ),
        call(
            "lvol-thick",
            "bdev_lvol_create",
            json!({"lvol_name": "v2", "size_in_mib": 4, "uuid": "{lvs}"}),
        ),
        call(
            "lvol-too-big",
            "bdev_lvol_create",
            json!({"lvol_name": "v3", "size_in_mib": 1024, "lvs_name": "lvs0"}),
        ),
        call(
            "lvol-no-store",
            "bdev_lvol_create",
            json!({"lvol_name": "v3", "size_in_mib": 4}),
        ),
        call(
            "lvol-missing-store",
            "bdev_lvol_create",
            json!({"lvol_name": "v3", "size_in_mib": 4, "lvs_name": "nope"}),
        ),
        call(
            "lvol-no-size",
            "bdev_lvol_create",
            json!({"lvol_name": "v3", "lvs_name": "lvs0"}),
        ),
        bare("lvols", "bdev_lvol_get_lvols"),
        call(
            "lvols-of-store",
            "bdev_lvol_get_lvols",
            json!({"lvs_name": "lvs0"}),
        ),
        call(
            "lvols-missing-store",
            "bdev_lvol_get_lvols",
            json!({"lvs_name": "nope"}),
        ),
        call("lvol-bdev", "bdev_get_bdevs", json!({"name": "lvs0/v1"})),
        call(
            "lvol-resize",
            "bdev_lvol_resize",
            json!({"name": "lvs0/v1", "size_in_mib": 16}),
        ),
        call(
            "lvol-shrink",
            "bdev_lvol_resize",
            json!({"name": "lvs0/v1", "size_in_mib": 12}),
        ),
        call(
            "lvol-resize-too-big",
            "bdev_lvol_resize",
            json!({"name": "lvs0/v2", "size_in_mib": 1024}),
        ),
        call(
            "lvol-resize-missing",
            "bdev_lvol_resize",
            json!({"name": "lvs0/nope", "size_in_mib": 16}),
        ),
        call(
            "snapshot",
            "bdev_lvol_snapshot",
            json!({"lvol_name": "lvs0/v1", "snapshot_name": "s1"}),
        ),
        call(
            "snapshot-again",
            "bdev_lvol_snapshot",
            json!({"lvol_name": "lvs0/v1", "snapshot_name": "s1"}),
        ),
        call(
            "snapshot-missing",
            "bdev_lvol_snapshot",
            json!({"lvol_name": "lvs0/nope", "snapshot_name": "s2"}),
        ),
        call(
            "snapshot-bdev",
            "bdev_get_bdevs",
            json!({"name": "lvs0/s1"}),
        ),
        call(
            "snapshot-resize",
            "bdev_lvol_resize",
            json!({"name": "lvs0/s1", "size_in_mib": 32}),
        ),
        call(
            "clone",
            "bdev_lvol_clone",
            json!({"snapshot_name": "lvs0/s1", "clone_name": "c1"}),
        ),
        call(
            "clone-again",
            "bdev_lvol_clone",
            json!({"snapshot_name": "lvs0/s1", "clone_name": "c1"}),
        ),
        call(
            "clone-of-a-volume",
            "bdev_lvol_clone",
            json!({"snapshot_name": "lvs0/v2", "clone_name": "c2"}),
        ),
        call(
            "clone-no-name",
            "bdev_lvol_clone",
            json!({"snapshot_name": "lvs0/s1"}),
        ),
        call("clone-bdev", "bdev_get_bdevs", json!({"name": "lvs0/c1"})),
        call(
            "lvols-with-snapshot",
            "bdev_lvol_get_lvols",
            json!({"lvs_name": "lvs0"}),
        ),
        call(
            "snapshot-delete-busy",
            "bdev_lvol_delete",
            json!({"name": "lvs0/s1"}),
        ),
        call(
            "decouple",
            "bdev_lvol_decouple_parent",
            json!({"name": "lvs0/c1"}),
        ),
        call(
            "decouple-again",
            "bdev_lvol_decouple_parent",
            json!({"name": "lvs0/c1"}),
        ),
        call(
            "decouple-missing",
            "bdev_lvol_decouple_parent",
            json!({"name": "lvs0/nope"}),
        ),
        call(
            "snapshot-delete-one-clone",
            "bdev_lvol_delete",
            json!({"name": "lvs0/s1"}),
        ),
        call(
            "lvols-after",
            "bdev_lvol_get_lvols",
            json!({"lvs_name": "lvs0"}),
        ),
        call(
            "lvol-delete",
            "bdev_lvol_delete",
            json!({"name": "lvs0/v1"}),
        ),
        call(
            "lvol-delete-again",
            "bdev_lvol_delete",
            json!({"name": "lvs0/v1"}),
        ),
        call("lvol-delete-no-name", "bdev_lvol_delete", json!({})),
        call(
            "lvstore-delete-busy-bdev",
            "bdev_aio_delete",
            json!({"name": "pool0"}),
        ),
        call(
            "lvstore-delete",
            "bdev_lvol_delete_lvstore",
            json!({"lvs_name": "lvs0"}),
        ),
        call(
            "lvstore-delete-again",
            "bdev_lvol_delete_lvstore",
            json!({"lvs_name": "lvs0"}),
        ),
        call(
            "lvstore-delete-no-selector",
            "bdev_lvol_delete_lvstore",
            json!({}),
        ),
        call("pool-delete", "bdev_aio_delete", json!({"name": "pool0"})),
        // The NVMe-oF target.
        bare("transports-none", "nvmf_get_transports"),
        call(
            "transport",
            "nvmf_create_transport",
            json!({"trtype": "TCP"}),
        ),
        call(
            "transport-again",
            "nvmf_create_transport",
            json!({"trtype": "TCP"}),
        ),
        call(
            "transport-unknown",
            "nvmf_create_transport",
            json!({"trtype": "bogus"}),
        ),
        call("transport-no-type", "nvmf_create_transport", json!({})),
        bare("transports", "nvmf_get_transports"),
        call(
            "transports-tcp",
            "nvmf_get_transports",
            json!({"trtype": "tcp"}),
        ),
        call(
            "transports-missing",
            "nvmf_get_transports",
            json!({"trtype": "rdma"}),
        ),
        call(
            "transport-unknown-target",
            "nvmf_create_transport",
            json!({"trtype": "TCP", "tgt_name": "nope"}),
        ),
        call(
            "subsystems-unknown-target",
            "nvmf_get_subsystems",
            json!({"tgt_name": "nope"}),
        ),
        call(
            "subsystem-unknown-target",
            "nvmf_create_subsystem",
            json!({"nqn": "nqn.2016-06.io.spdk:cnode3", "tgt_name": "nope"}),
        ),
        bare("subsystems-discovery", "nvmf_get_subsystems"),
        call(
            "subsystem",
            "nvmf_create_subsystem",
            json!({"nqn": NQN, "serial_number": "SN1", "model_number": "M1", "max_namespaces": 4}),
        ),
        call(
            "subsystem-again",
            "nvmf_create_subsystem",
            json!({"nqn": NQN}),
        ),
        call(
            "subsystem-bad-nqn",
            "nvmf_create_subsystem",
            json!({"nqn": "foo"}),
        ),
        call("subsystem-no-nqn", "nvmf_create_subsystem", json!({})),
        call(
            "subsystem-long-serial",
            "nvmf_create_subsystem",
            json!({"nqn": "nqn.2016-06.io.spdk:cnode2", "serial_number": "S".repeat(21)}),
        ),
        call("subsystem-get", "nvmf_get_subsystems", json!({"nqn": NQN})),
        call(
            "subsystem-get-missing",
            "nvmf_get_subsystems",
            json!({"nqn": "nqn.2016-06.io.spdk:nope"}),
        ),
        call(
            "ns-bdev",
            "bdev_malloc_create",
            json!({"name": "Malloc9", "num_blocks": 2048, "block_size": 512}),
        ),
        call(
            "ns",
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "Malloc9"}}),
        ),
        call(
            "ns-again",
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "Malloc9"}}),
        ),
        call(
            "ns-missing-bdev",
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "nope"}}),
        ),
        call(
            "ns-missing-subsystem",
            "nvmf_subsystem_add_ns",
            json!({"nqn": "nqn.2016-06.io.spdk:nope", "namespace": {"bdev_name": "Malloc1"}}),
        ),
        call(
            "ns-nsid",
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "Malloc1", "nsid": 3}}),
        ),
        call(
            "ns-nsid-taken",
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "Null9", "nsid": 3}}),
        ),
        call(
            "ns-remove",
            "nvmf_subsystem_remove_ns",
            json!({"nqn": NQN, "nsid": 3}),
        ),
        call(
            "ns-remove-again",
            "nvmf_subsystem_remove_ns",
            json!({"nqn": NQN, "nsid": 3}),
        ),
        call(
            "ns-remove-no-nsid",
            "nvmf_subsystem_remove_ns",
            json!({"nqn": NQN}),
        ),
        call(
            "listener",
            "nvmf_subsystem_add_listener",
            json!({"nqn": NQN, "listen_address": listen_address("{port}")}),
        ),
        call(
            "listener-again",
            "nvmf_subsystem_add_listener",
            json!({"nqn": NQN, "listen_address": listen_address("{port}")}),
        ),
        call(
            "listener-bad-trtype",
            "nvmf_subsystem_add_listener",
            json!({"nqn": NQN, "listen_address": {"trtype": "bogus", "traddr": "127.0.0.1", "trsvcid": "{port}"}}),
        ),
        call(
            "listener-missing-subsystem",
            "nvmf_subsystem_add_listener",
            json!({"nqn": "nqn.2016-06.io.spdk:nope", "listen_address": listen_address("{port}")}),
        ),
        call(
            "host",
            "nvmf_subsystem_add_host",
            json!({"nqn": NQN, "host": HOST}),
        ),
        call(
            "host-again",
            "nvmf_subsystem_add_host",
            json!({"nqn": NQN, "host": HOST}),
        ),
        call(
            "host-remove",
            "nvmf_subsystem_remove_host",
            json!({"nqn": NQN, "host": HOST}),
        ),
        call(
            "host-remove-again",
            "nvmf_subsystem_remove_host",
            json!({"nqn": NQN, "host": HOST}),
        ),
        call(
            "host-missing-subsystem",
            "nvmf_subsystem_add_host",
            json!({"nqn": "nqn.2016-06.io.spdk:nope", "host": HOST}),
        ),
        call(
            "host-unknown-target",
            "nvmf_subsystem_add_host",
            json!({"nqn": NQN, "host": HOST, "tgt_name": "nope"}),
        ),
        call(
            "host-remove-missing-subsystem",
            "nvmf_subsystem_remove_host",
            json!({"nqn": "nqn.2016-06.io.spdk:nope", "host": HOST}),
        ),
        call(
            "any-host-missing-subsystem",
            "nvmf_subsystem_allow_any_host",
            json!({"nqn": "nqn.2016-06.io.spdk:nope", "allow_any_host": true}),
        ),
        call(
            "ns-remove-missing-subsystem",
            "nvmf_subsystem_remove_ns",
            json!({"nqn": "nqn.2016-06.io.spdk:nope", "nsid": 1}),
        ),
        call(
            "listener-remove-missing-subsystem",
            "nvmf_subsystem_remove_listener",
            json!({"nqn": "nqn.2016-06.io.spdk:nope", "listen_address": listen_address("{port}")}),
        ),
        call(
            "any-host",
            "nvmf_subsystem_allow_any_host",
            json!({"nqn": NQN, "allow_any_host": true}),
        ),
        call(
            "any-host-no-flag",
            "nvmf_subsystem_allow_any_host",
            json!({"nqn": NQN}),
        ),
        call("subsystems", "nvmf_get_subsystems", json!({})),
        // The initiator, attaching to this same target over TCP.
        call(
            "attach",
            "bdev_nvme_attach_controller",
            json!({"name": "Nvme0", "trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": "{port}", "subnqn": NQN}),
        ),
        call(
            "attach-again",
            "bdev_nvme_attach_controller",
            json!({"name": "Nvme0", "trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": "{port}", "subnqn": NQN}),
        ),
        call(
            "attach-other-name",
            "bdev_nvme_attach_controller",
            json!({"name": "Nvme1", "trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": "{port}", "subnqn": NQN}),
        ),
        call(
            "attach-missing-subsystem",
            "bdev_nvme_attach_controller",
            json!({"name": "Nvme2", "trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": "{port}", "subnqn": "nqn.2016-06.io.spdk:nope"}),
        ),
        call(
            "attach-nothing-listens",
            "bdev_nvme_attach_controller",
            json!({"name": "Nvme2", "trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": "{closed}", "subnqn": NQN}),
        ),
        call(
            "attach-no-address",
            "bdev_nvme_attach_controller",
            json!({"name": "Nvme2", "trtype": "tcp"}),
        ),
        bare("controllers", "bdev_nvme_get_controllers"),
        call(
            "controller",
            "bdev_nvme_get_controllers",
            json!({"name": "Nvme0"}),
        ),
        call(
            "controller-missing",
            "bdev_nvme_get_controllers",
            json!({"name": "nope"}),
        ),
        call(
            "attached-bdev",
            "bdev_get_bdevs",
            json!({"name": "Nvme0n1"}),
        ),
        call(
            "attached-subsystem",
            "nvmf_get_subsystems",
            json!({"nqn": NQN}),
        ),
        call(
            "detach",
            "bdev_nvme_detach_controller",
            json!({"name": "Nvme0"}),
        ),
        call(
            "detach-again",
            "bdev_nvme_detach_controller",
            json!({"name": "Nvme0"}),
        ),
        call("detach-no-name", "bdev_nvme_detach_controller", json!({})),
        call(
            "listener-remove",
            "nvmf_subsystem_remove_listener",
            json!({"nqn": NQN, "listen_address": listen_address("{port}")}),
        ),
        call(
            "listener-remove-again",
            "nvmf_subsystem_remove_listener",
            json!({"nqn": NQN, "listen_address": listen_address("{port}")}),
        ),
        call(
            "subsystem-delete",
            "nvmf_delete_subsystem",
            json!({"nqn": NQN}),
        ),
        call(
            "subsystem-delete-again",
            "nvmf_delete_subsystem",
            json!({"nqn": NQN}),
        ),
        call(
            "subsystem-delete-no-nqn",
            "nvmf_delete_subsystem",
            json!({}),
        ),
        bare("subsystems-end", "nvmf_get_subsystems"),
        bare("bdevs-end", "bdev_get_bdevs"),
    ]
}

/// One side: the emulator or the real target, with its directory and port.
struct Side {
    client: Client,
    dir: String,
    vars: HashMap<&'static str, String>,
}

impl Side {
    async fn new(socket: &Path, dir: &Path) -> Side {
        sparse_file(&dir.join("aio.img"), 8 * MIB);
        sparse_file(&dir.join("other.img"), 4 * MIB);
        sparse_file(&dir.join("pool.img"), 64 * MIB);
        sparse_file(&dir.join("empty.img"), 0);
        sparse_file(&dir.join("odd.img"), 4096 + 512);
        sparse_file(&dir.join("small.img"), 4 * MIB);
        let vars = HashMap::from([
            ("port", free_port().to_string()),
            ("closed", free_port().to_string()),
        ]);
        Side {
            client: Client::connect(socket).await,
            dir: dir.display().to_string(),
            vars,
        }
    }

    /// `{dir}` and the saved values put in.
    fn fill(&self, params: &Value) -> Value {
        let mut text = params.to_string().replace("{dir}", &self.dir);
        for (name, value) in &self.vars {
            text = text.replace(&format!("{{{name}}}"), value);
        }
        serde_json::from_str(&text).unwrap()
    }

    /// An answer with what legitimately differs masked: the directory, the
    /// ports, UUIDs, and measurements (by type only).
    fn masked(&self, answer: &Result<Value, (i64, String)>) -> String {
        let text = match answer {
            Ok(result) => json!({"result": measured_masked(result.clone())}),
            Err((code, message)) => json!({"error": {"code": code, "message": message}}),
        }
        .to_string()
        .replace(&self.dir, "{dir}");
        let mut text = mask_nguids(&String::from_utf8(mask_uuids(text.as_bytes())).unwrap());
        for (name, value) in &self.vars {
            text = text.replace(value.as_str(), &format!("{{{name}}}"));
        }
        text
    }

    async fn run(&mut self, step: &Step) -> Option<(&'static str, String)> {
        match step {
            Step::Grow(file, size) => {
                let file = std::fs::File::options()
                    .write(true)
                    .open(Path::new(&self.dir).join(file))
                    .unwrap();
                file.set_len(*size).unwrap();
                None
            }
            Step::Call {
                id,
                method,
                params,
                save,
            } => {
                let params = params.as_ref().map(|p| self.fill(p));
                let answer = self.client.call(method, params).await;
                if let (Some(name), Ok(Value::String(value))) = (save, &answer) {
                    self.vars.insert(name, value.clone());
                }
                Some((id, self.masked(&answer)))
            }
        }
    }
}

fn measured_masked(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| {
                    let v = match (measured(&k), v) {
                        (true, Value::Number(_)) => json!(0),
                        (_, v) => measured_masked(v),
                    };
                    (k, v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(measured_masked).collect()),
        other => other,
    }
}

/// Masks NGUIDs (a UUID's 16 bytes in upper-case hex, as both derive them
/// from the bdev's UUID) like [`mask_uuids`] masks UUIDs.
fn mask_nguids(text: &str) -> String {
    let mut parts: Vec<String> = text.split('"').map(str::to_string).collect();
    for part in &mut parts {
        if part.len() == 32
            && part
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_lowercase())
        {
            *part = "0".repeat(32);
        }
    }
    parts.join("\"")
}

/// The step ids whose differences the emulator's docs accept.
fn documented() -> BTreeSet<String> {
    const DOCS: &str = include_str!("../src/lib.rs");
    DOCS.split("`parity:")
        .skip(1)
        .map(|rest| rest.split('`').next().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_emulator_answers_as_real_spdk_does() {
    let Some(suite) = Suite::acquire() else {
        return;
    };
    let real = suite.spdk_tgt();
    let dir = tempfile::tempdir().unwrap();
    let emulator = Emu::start(Config::for_test(dir.path()).without_snap()).await;
    let mut sides = [
        Side::new(&real.socket, real.path()).await,
        Side::new(&emulator.socket, dir.path()).await,
    ];

    let script = script();
    let mut differences = vec![];
    let mut covered = BTreeSet::new();
    for step in &script {
        let mut answers = vec![];
        for side in &mut sides {
            answers.extend(side.run(step).await);
        }
        if let [(id, real), (_, emulated)] = &answers[..] {
            if let Step::Call { method, .. } = step {
                covered.insert(*method);
            }
            if real != emulated {
                differences.push((id.to_string(), real.clone(), emulated.clone()));
            }
        }
    }

    // Every method the emulator offers is in real SPDK's list and in the script.
    let mut methods = vec![];
    for side in &mut sides {
        let listed = side.client.call("rpc_get_methods", None).await.unwrap();
        methods.push(serde_json::from_value::<BTreeSet<String>>(listed).unwrap());
    }
    let [real_methods, emulated] = &methods[..] else {
        unreachable!()
    };
    let missing: Vec<_> = emulated.difference(real_methods).collect();
    assert!(missing.is_empty(), "not methods of spdk_tgt: {missing:?}");
    let uncovered: Vec<_> = emulated
        .iter()
        .filter(|m| !covered.contains(m.as_str()) && *m != "rpc_get_methods")
        .collect();
    assert!(uncovered.is_empty(), "not in the script: {uncovered:?}");

    let documented = documented();
    let mut report = String::new();
    for (id, real, emulated) in &differences {
        let mark = if documented.contains(id) {
            "documented"
        } else {
            "NEW"
        };
        report += &format!("{mark} {id}:\n  spdk_tgt: {real}\n  emulator: {emulated}\n");
    }
    println!("{report}");
    let found: BTreeSet<String> = differences.iter().map(|d| d.0.clone()).collect();
    let undocumented: Vec<_> = found.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "differences not in the emulator's docs: {undocumented:?}\n{report}"
    );
    let stale: Vec<_> = documented.difference(&found).collect();
    assert!(
        stale.is_empty(),
        "documented differences that are gone (remove them from src/lib.rs): {stale:?}"
    );
    emulator.stop().await;
}
