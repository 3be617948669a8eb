#!/usr/bin/env bash
# Installs what the tests need, then runs the checks CI runs: formatting, lints,
# the whole test suite (as root: the tests make real loop devices and mounts),
# the offline checks of the Kubernetes manifests and Dockerfiles, and the main
# job (the whole stack on the emulator, volumes through their life) in debug.
set -euo pipefail
cd "$(dirname "$0")/.."
./hack/setup.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
./deploy/check.sh
./hack/demo.sh --profile debug
