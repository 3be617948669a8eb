#!/usr/bin/env bash
# Installs what the tests need, then runs the checks CI runs: formatting, lints,
# the whole test suite (as root: the tests make real loop devices and mounts;
# with a real SPDK built by hack/spdk/build.sh for the suites that need one),
# the offline checks of the Kubernetes manifests and Dockerfiles, the main job
# (the whole stack on the emulator, volumes through their life) in debug, and
# the benchmark on a few volumes in debug: proof that every section still runs
# and cleans up, not a measurement (that is ./hack/bench.sh, release).
set -euo pipefail
cd "$(dirname "$0")/.."
./hack/setup.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# Real SPDK for the real-SPDK suites: built once (minutes), then cached
# outside the repository (hack/spdk/README.md).
SNAP_CSI_SPDK_TGT=$(./hack/spdk/build.sh | tail -n1)
export SNAP_CSI_SPDK_TGT
cargo test --workspace --locked
./deploy/check.sh
./hack/demo.sh --profile debug
cargo build --locked -p snap-csi -p snap-emu -p snap-csi-spdk-plugin -p snap-csi-bench
./target/debug/snap-csi-bench --profile debug --volumes 2 --poll-volumes 1 --count-volumes 1 \
  --floor-iterations 20 --scale-volumes 8 --concurrency 1,4 --rpc-seconds 0.2 --rpc-repeats 1
