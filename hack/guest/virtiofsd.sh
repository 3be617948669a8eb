#!/usr/bin/env bash
# Builds virtiofsd (the vhost-user virtio-fs backend QEMU's vhost-user-fs-pci
# talks to; not packaged in Debian 12) from crates.io once, pinned, into
# ${SNAP_CSI_CACHE:-$HOME/.cache/snap-csi}/virtiofsd-<version>, and prints
# the binary's path. Needs libseccomp-dev and libcap-ng-dev (hack/setup.sh).
set -euo pipefail
version=1.14.0
cache_root=${SNAP_CSI_CACHE:-$HOME/.cache/snap-csi}
out=$cache_root/virtiofsd-$version
if [ -x "$out/bin/virtiofsd" ]; then
  echo "$out/bin/virtiofsd"
  exit 0
fi
mkdir -p "$cache_root"
scratch=$(mktemp -d "$cache_root/.virtiofsd-build.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
CARGO_TARGET_DIR=$scratch/target cargo install --quiet --locked virtiofsd --version "$version" \
  --root "$scratch/out" >&2
mv -T "$scratch/out" "$out" 2>/dev/null || [ -x "$out/bin/virtiofsd" ]
echo "$out/bin/virtiofsd"
