#!/usr/bin/env bash
# Cross-compilation settings for the image builds. Each Dockerfile's builder
# stage runs on the build machine's own platform (FROM --platform=
# $BUILDPLATFORM) and compiles for the platform of the image being built,
# which BuildKit passes as TARGETARCH (amd64 or arm64: BlueField's Arm cores
# run the DPU agent and the vendor plugin). Native Rust and C (ring, under
# rustls, has C and assembly) for that platform, instead of building under
# an emulator. The build machine's own architecture is dpkg's (or BUILDARCH).
#
# Usage: TARGETARCH=ARCH rust-target.sh packages|triple|env|runner
#   packages  Debian packages the builder installs for ARCH: a C cross
#             compiler and the target's libc, none when building natively
#   triple    the Rust target triple for ARCH
#   env       shell assignments for `eval`: RUST_TARGET, and the linker, C
#             compiler and archiver cargo and cc-rs use for that target, and
#             the runner of `cargo test` (runner, below) when cross-compiling
#   runner    the command that runs ARCH's binaries on this machine when
#             it is another architecture: qemu-user (qemu-user-static), with
#             the cross libc's directory as the root of the loader and
#             libraries; nothing when native
# deploy/check.sh runs it for every pair of architectures.
set -euo pipefail

arch=${TARGETARCH:?set TARGETARCH (BuildKit does, given ARG TARGETARCH in the stage)}
build_arch=${BUILDARCH:-$(dpkg --print-architecture)}

# Rust triple, GNU triple, Debian's name of the architecture in cross packages.
case $arch in
  amd64) triple=x86_64-unknown-linux-gnu gnu=x86_64-linux-gnu debian=amd64 ;;
  arm64) triple=aarch64-unknown-linux-gnu gnu=aarch64-linux-gnu debian=arm64 ;;
  *)
    echo "rust-target.sh: no cross settings for TARGETARCH=$arch (amd64 and arm64 are built)" >&2
    exit 1
    ;;
esac

# What runs ARCH's binaries here: qemu-user, the cross libc's directory the
# root of their loader and libraries; nothing when native.
runner=
[ "$arch" != "$build_arch" ] && runner="qemu-${triple%%-*}-static -L /usr/$gnu"

case ${1:-} in
  packages)
    if [ "$arch" != "$build_arch" ]; then
      # The compiler package is named after the GNU triple, with - for _;
      # its libc is only a Recommends, which --no-install-recommends drops.
      echo "gcc-${gnu//_/-} libc6-dev-$debian-cross"
    fi
    ;;
  triple) echo "$triple" ;;
  env)
    upper=$(echo "$triple" | tr 'a-z-' 'A-Z_')
    lower=${triple//-/_}
    echo "export RUST_TARGET=$triple"
    echo "export CARGO_TARGET_${upper}_LINKER=$gnu-gcc"
    echo "export CC_$lower=$gnu-gcc"
    echo "export AR_$lower=$gnu-ar"
    [ -z "$runner" ] || echo "export CARGO_TARGET_${upper}_RUNNER='$runner'"
    ;;
  runner) [ -z "$runner" ] || echo "$runner" ;;
  *)
    awk '/^# Usage:/ { on = 1 } on && !/^#/ { exit } on { sub(/^# ?/, ""); print }' "$0" >&2
    exit 2
    ;;
esac
