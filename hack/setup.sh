#!/usr/bin/env bash
# Installs what building and testing snap-csi needs on a Debian 12 machine:
# protoc for the gRPC code, filesystem and loop-device tools for the host side.
# Idempotent; run as root. Rust itself comes from rustup (rust-toolchain.toml).
set -euo pipefail

packages=(protobuf-compiler libudev-dev pkg-config e2fsprogs xfsprogs util-linux mount fdisk kmod)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Loop devices back the emulated host functions.
[ -e /dev/loop-control ] || modprobe loop 2>/dev/null || true
if [ ! -e /dev/loop-control ]; then
  echo "setup: /dev/loop-control is missing; the emulator cannot create host devices" >&2
  exit 1
fi

# rust-toolchain.toml pins 1.95.0. Where rustup only has it as "stable", point
# the pinned name at it instead of downloading (this machine has no route to
# the toolchain server).
pinned=$(sed -n 's/^channel = "\(.*\)"/\1/p' "$(dirname "$0")/../rust-toolchain.toml")
toolchains="${RUSTUP_HOME:-$HOME/.rustup}/toolchains"
triple=x86_64-unknown-linux-gnu
if [ ! -e "$toolchains/$pinned-$triple" ] && [ -d "$toolchains/stable-$triple" ] &&
   "$toolchains/stable-$triple/bin/rustc" --version | grep -q "^rustc $pinned "; then
  ln -s "$toolchains/stable-$triple" "$toolchains/$pinned-$triple"
fi
cargo --version >/dev/null
