#!/usr/bin/env bash
# Installs what the tests need, then runs the checks CI runs: formatting, lints
# and the whole test suite (as root: the tests make real loop devices and mounts).
set -euo pipefail
cd "$(dirname "$0")/.."
./hack/setup.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
