#!/usr/bin/env bash
# Installs what the tests need, then runs the checks CI runs: formatting, lints,
# the container images built and started (hack/images.sh), the whole test
# suite (as root: the tests make real loop devices and mounts; with a real
# SPDK in its container for the suites that need one, and a real Linux kernel
# booted under QEMU as the host for tests/guest_host.rs and guest_node*.rs:
# hack/guest/)
# and the DPU and node suites again in split mode,
# the offline checks of the Kubernetes manifests and Dockerfiles, the main job
# (the whole stack on the emulator, volumes through their life; co-located and
# split; and with the node in that guest, a real kernel as the host) in
# debug, the official CSI conformance suite (csi-sanity) on that
# stack for each backend (and in split mode for one, on a host with two
# DPUs in both modes for the block backends, and with the guest as the host
# for a block and the filesystem backend), the DPU side cross-built for
# aarch64 and run as aarch64 processes under qemu-user (the demo's volume
# matrix and csi-sanity in split mode), the benchmark on a
# few volumes in debug: proof that every section still runs and cleans up, not
# a measurement (that is ./hack/bench.sh, release); the demo and csi-sanity
# again from the container images; and the chaos soak for two minutes in debug.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each part's time in the log (how CI's 90 minutes are spent): `part NAME`
# ends the part before it, and the last one ends with the script.
part_name=setup part_started=$SECONDS
part() {
  echo "== test.sh: $part_name took $((SECONDS - part_started)) s; next: $1 (at $SECONDS s)" >&2
  part_name=$1 part_started=$SECONDS
}
trap 'echo "== test.sh: $part_name took $((SECONDS - part_started)) s; $SECONDS s in all (exit $?)" >&2' EXIT
./hack/setup.sh
part lints
cargo fmt --all --check
# Every relative link in the Markdown files resolves (the self-test first, so a checker that flags nothing cannot pass).
python3 hack/check-links.py --self-test
python3 hack/check-links.py
cargo clippy --workspace --all-targets --locked -- -D warnings
# The images deploy/ names (hack/images.sh), from the debug binaries the
# tests run (--no-run builds them as the tests do: with the dev-dependencies'
# features, which a plain cargo build would not unify in) and real SPDK
# (built once, minutes, then cached outside the repository:
# hack/spdk/README.md), each started and checked; cached by content, so an
# unchanged image costs its hash. The real-SPDK suites run spdk_tgt from its
# image, as users test.
part "test build"
cargo test --workspace --locked --no-run
# The DPU side for BlueField's Arm cores (the agent, the plugin; snap-csi's
# node and controller for Arm hosts): cross-built for aarch64 with Debian's
# cross gcc, for the arm64 images below and the split-mode runs under
# qemu-user after csi-sanity; both crates' unit tests run as aarch64
# processes under qemu-user now.
./hack/cross-build.sh --arch arm64 --profile debug --unit-tests
part images
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/hack/containers.conf}
images=$(./hack/images.sh --profile debug --no-build)
echo "$images"
SNAP_CSI_SPDK_IMAGE=$(echo "$images" | sed -n 's/^snap-csi-spdk=\([^ ]*\) .*/\1/p')
export SNAP_CSI_SPDK_IMAGE
part "cargo test"
cargo test --workspace --locked
part "split-mode suites"
# Split mode: the suites that reach the DPU again, now through a real DPU
# agent over mutual TLS (tests/common/dpu.rs), so both modes behave alike.
# node_crash: 100 of its seeded trials here (200 co-located above), rounded
# up to one round, which crashes every step once in every configuration.
SNAP_CSI_TEST_DPU=split SNAP_CSI_CRASH_TRIALS=100 cargo test --locked \
  -p snap-csi --test dpu_attach --test dpu_packed --test node_lifecycle --test csi_node_conformance \
  --test node_metrics --test node_concurrency --test node_crash --test node_kill --test node_recovery \
  --test node_orphans --test node_dependency_faults --test node_kubelet_restart \
  --test node_snap_live_update --test node_encryption --test node_volume_io --test node_snap_crash \
  --test node_virtio_fs --test node_virtio_fs_pods \
  -p snap-csi-spdk-plugin --test node_attach --test csi_stack
# A host with two DPUs (tests/common/dpus.rs: a second SNAP emulator in PCI domain 0001 on the
# first's sysfs tree, its own plugin, in split mode its own agent; the node given both in its
# dpus): the crash suites in both modes, one round each (every crash point and kill cell once; a
# smaller count is rounded up to that), each volume where the node places it and the census over
# both DPUs; node_two_dpus (placement, one DPU dead, cut off or hung) split (co-located above).
# About 4 minutes.
part "two-DPU suites"
SNAP_CSI_TEST_DPUS=2 SNAP_CSI_CRASH_TRIALS=1 cargo test --locked -p snap-csi --test node_crash --test node_kill
SNAP_CSI_TEST_DPU=split SNAP_CSI_TEST_DPUS=2 SNAP_CSI_CRASH_TRIALS=1 cargo test --locked -p snap-csi \
  --test node_crash --test node_kill --test node_two_dpus
part "manifests and the demo"
./deploy/check.sh
./hack/demo.sh --profile debug
# The main job with a real Linux kernel as the host (a QEMU guest, the node
# inside it, SNAP's functions hot-plugged through QMP; hack/local-up.sh --host vm):
# every plain volume kind, each row with the device the guest's kernel mounted.
part "the demo on the guest host"
./hack/demo.sh --profile debug --host vm
part csi-sanity
# csi-sanity (built once from csi-test's pinned source, then cached): fails on
# any failed spec, and on any skip not explained by a capability we lack.
# Every backend: AIO, NVMe-oF (one path, and nvmf-multipath: both of the
# target's listeners, one device) and fs (filesystem volumes, staged as virtio-fs).
./hack/csi-sanity.sh --profile debug
# And with csi-sanity's default flags, no mutable parameters: its
# ControllerModifyVolume then asks for nothing, which must succeed: ModifyVolume
# is held to the suite with parameters and without.
./hack/csi-sanity.sh --profile debug --no-build --no-mutable-parameters --backend aio --backend nvmf
# csi-sanity again in split mode (the node reaching a DPU agent in its own
# network namespace over mutual TLS), one block backend and fs: the backend
# is the plugin's concern, the same in both modes; the node's calls and the
# link are what split mode changes, and one backend of each kind of device
# (block, filesystem) drives all of them.
./hack/csi-sanity.sh --profile debug --no-build --backend aio --backend fs -- --mode split
# csi-sanity on a host with two DPUs (local-up --dpus 2: two SNAP emulators
# in one sysfs tree, PCI domains 0000 and 0001, each with its plugin; the node
# given both in its config file's dpus), co-located and split (an agent per
# DPU, each in its own namespace, certificate and link): what the node does
# across DPUs (placement, records, inventory, NodeGetInfo) is held to the suite
# in both modes; AIO the DPU-local backend, NVMe-oF the remote one.
./hack/csi-sanity.sh --profile debug --no-build --backend aio --backend nvmf -- --dpus 2
./hack/csi-sanity.sh --profile debug --no-build --backend aio --backend nvmf -- --dpus 2 --mode split
# csi-sanity with a real Linux kernel as the host (the node in a QEMU guest,
# split mode; local-up --host vm): block (AIO, as NVMe) and filesystem
# devices (virtio-fs), csi-sanity's paths made and checked in the guest.
cargo build --locked -p snap-csi-harness --bin snap-csi-guest
./hack/csi-sanity.sh --profile debug --no-build --backend aio --backend fs -- --host vm
part "the DPU side as aarch64 processes"
# Split mode with every plugin and agent an aarch64 process under qemu-user
# (hack/local-up.sh --dpu-arch arm64): the demo's volume matrix (each kind of
# volume through its life, a host with two DPUs, one of them stopped, and a
# second host; it counts the qemu-user processes) and csi-sanity for a block
# and the filesystem backend.
./hack/demo.sh --profile debug --mode split --dpu-arch arm64
./hack/csi-sanity.sh --profile debug --no-build --backend aio --backend fs -- --mode split --dpu-arch arm64
part "the demo and csi-sanity from the images"
# The main job and csi-sanity once more with every process that has an image
# started from it, with the privileges, mounts and propagation its manifest
# gives it (hack/local-up.sh --containers; deploy/tools/podman_spec.py reads
# them from the rendered manifests): both modes, every backend.
./hack/demo.sh --profile debug --containers
./hack/csi-sanity.sh --profile debug --no-build --backend aio --backend nvmf --backend fs -- --containers
./hack/csi-sanity.sh --profile debug --no-build --backend aio --backend fs -- --mode split --containers
part bench
cargo build --locked -p snap-csi -p snap-emu -p snap-csi-spdk-plugin -p snap-csi-bench
# The bench in debug on a few volumes: every section runs and cleans up, and
# it fails on a target missed (debug time targets x2; memory and the JSON-RPC
# client are judged in release only and shown here). Enough samples and
# repeats that every other target is judged (8 pairs for a ratio's median, 6
# repeats for a figure measured once per repeat: 8 volumes, 6 poller stages,
# six scale rounds of 8 volumes, six batches of 8 on a host with one DPU and
# one with two); the summary counts any target not judged as not met.
./target/debug/snap-csi-bench --profile debug --volumes 8 --poll-volumes 6 --count-volumes 1 \
  --floor-iterations 20 --scale-volumes 8 --scale-repeats 6 --concurrency 1,4 \
  --rpc-seconds 0.2 --rpc-repeats 1 --dpu-volumes 8 --dpu-repeats 6 --guest-volumes 2
# The chaos soak for two minutes (docs/chaos.md): random volume lives while the stack's
# processes are killed, SNAP stalls, functions run out and a path of the NVMe-oF target goes
# down or flaps (half the NVMe-oF volumes are multipath: they must see no I/O error at all);
# two of its four rounds (one co-located, one split) on a host with two DPUs, one of which also
# goes down for 2-8 s: the other DPU's volumes see no I/O error, the node's gauge and Probe
# follow, new stages go to the DPU that is up, and nothing stays on a DPU a volume's record
# does not name; then 180 kill trials per mode on a host with one DPU (one
# volume's life, the node, plugin, agent, SNAP or the NVMe-oF target killed at a random instant
# inside one step, a census after each; about 3 minutes per mode in debug). Fails on a leak, a
# data error, a call that never converges as kubelet makes it, or what it promised and did not
# test (a fault not injected, a kind of fault that never fired, a kill cell without a kill); a pod's I/O refused while a
# SNAP restart took its device away is counted apart and the pod restarted (unpublish, unstage,
# stage, publish), its data then read back. Its seed (printed first) replays the same script.
part "chaos soak"
./hack/chaos.sh --profile debug --duration 2m --round 30s --kill-trials 180 \
  --kill-processes node,plugin,agent,snap,target
