#!/usr/bin/env bash
# Builds snap-csi and the sample plugin for another architecture: the DPU's
# (BlueField's Arm cores run the agent and the plugin) or an Arm host's. Rust
# cross-compiles with Debian's cross C compiler and libc for ring's C and
# assembly (deploy/images/rust-target.sh, the image builder's settings; the
# packages and rustup's target come from hack/setup.sh). Cargo's own cache
# makes a second run cost its check (seconds). Prints the directory holding
# the two binaries, target/TRIPLE/PROFILE.
#
# --unit-tests also runs both crates' unit tests (their libraries') as that
# architecture's processes, under qemu-user (rust-target.sh runner): what
# compiles there can still assume this machine (a usize's width, a system
# call's number or structure, a C type's signedness: c_char is unsigned on
# aarch64).
#
# Usage: hack/cross-build.sh --arch amd64|arm64 [--profile debug|release] [--unit-tests]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
arch=
profile=release
unit_tests=0
while (($#)); do
  case $1 in
    --arch) arch=${2:?--arch needs amd64 or arm64}; shift ;;
    --profile) profile=${2:?--profile needs debug or release}; shift ;;
    --unit-tests) unit_tests=1 ;;
    -h | --help) sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) echo "cross-build: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case $profile in debug) cargo_profile=dev ;; release) cargo_profile=release ;;
  *) echo "cross-build: --profile must be debug or release" >&2; exit 2 ;; esac
[ -n "$arch" ] || { echo "cross-build: --arch is required" >&2; exit 2; }
eval "$(TARGETARCH=$arch deploy/images/rust-target.sh env)"
cargo build --locked --quiet --profile "$cargo_profile" --target "$RUST_TARGET" \
  -p snap-csi --bin snap-csi -p snap-csi-spdk-plugin --bin snap-csi-spdk-plugin >&2
if ((unit_tests)); then
  cargo test --locked --profile "$cargo_profile" --target "$RUST_TARGET" --lib -p snap-csi -p snap-csi-spdk-plugin >&2
fi
echo "$repo/target/$RUST_TARGET/$profile"
