#!/usr/bin/env bash
# Builds SPDK's spdk_tgt against Debian 12's DPDK (no hugepages needed at run
# time: spdk_tgt --no-huge -s 1024 --no-pci) and caches it outside the
# repository, keyed by a hash of the source, the patch and this script. Prints
# the path of a runnable spdk_tgt as its last line on stdout; everything else
# goes to stderr or the build log.
#
# Usage: hack/spdk/build.sh [--source TARBALL_OR_DIR] [--patch FILE]
#   --source  SPDK v24.09 as a .tar.gz (one top directory) or a source tree
#             with the isa-l and isa-l-crypto submodules checked out
#             (default: ../shared/third_party/spdk-v24.09.tar.gz from the repo)
#   --patch   applied with patch -p1 unless already applied
#             (default: hack/spdk/spdk-v24.09-debian-dpdk.patch)
# Cache: ${SNAP_CSI_CACHE:-$HOME/.cache/snap-csi}/spdk-<hash>/bin/spdk_tgt.
# A cache hit (an entry whose spdk_tgt starts) runs no apt-get and no build.
# Installs the Debian packages it needs (only missing ones), as root.
#   tgt=$(hack/spdk/build.sh | tail -n1)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
source=$repo/../shared/third_party/spdk-v24.09.tar.gz
patch=$here/spdk-v24.09-debian-dpdk.patch
while (($#)); do
  case $1 in
    --source) source=$2; shift 2 ;;
    --patch) patch=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -e "$source" ] || { echo "build.sh: no SPDK source at $source" >&2; exit 1; }
[ -f "$patch" ] || { echo "build.sh: no patch at $patch" >&2; exit 1; }
source=$(cd "$(dirname "$source")" && pwd)/$(basename "$source")

# A source tree is hashed file by file (names and contents, .git left out), so
# an edit anywhere in it makes a new cache entry.
if [ -d "$source" ]; then
  source_hash=$(cd "$source" && find . -path ./.git -prune -o -type f -print0 | LC_ALL=C sort -z |
    xargs -0 sha256sum | sha256sum | cut -c1-64)
else
  source_hash=$(sha256sum <"$source" | cut -c1-64)
fi
hash=$({ echo "$source_hash"; sha256sum <"$patch"; sha256sum <"$0"; } | sha256sum | cut -c1-16)
cache=${SNAP_CSI_CACHE:-$HOME/.cache/snap-csi}
dest=$cache/spdk-$hash

# The build packages (the -dev ones bring the libraries spdk_tgt runs with).
install_packages() {
  local packages=(gcc g++ make pkgconf patch libdpdk-dev libnuma-dev libaio-dev uuid-dev
    libssl-dev libncurses-dev libcunit1-dev python3-pyelftools meson ninja-build libjson-c-dev
    libkeyutils-dev nasm autoconf automake libtool)
  local missing=() p
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "build.sh: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# "SPDK v..." from a spdk_tgt that starts (its libraries all found).
version_of() {
  "$1" --version 2>&1 || true
}

# A cache hit is an entry whose spdk_tgt starts. One copied from elsewhere may
# lack Debian's libraries here: those are installed, not rebuilt.
if [ -x "$dest/bin/spdk_tgt" ]; then
  case $(version_of "$dest/bin/spdk_tgt") in
    "SPDK v"*) ;;
    *) install_packages ;;
  esac
  case $(version_of "$dest/bin/spdk_tgt") in
    "SPDK v"*) echo "$dest/bin/spdk_tgt"; exit 0 ;;
  esac
fi

mkdir -p "$cache"
# One build per hash at a time; whoever waited finds the cache filled.
exec 9>"$cache/spdk-$hash.lock"
flock 9
if [ -x "$dest/bin/spdk_tgt" ]; then
  case $(version_of "$dest/bin/spdk_tgt") in
    "SPDK v"*) echo "$dest/bin/spdk_tgt"; exit 0 ;;
    *) echo "build.sh: $dest does not run; building it again" >&2; rm -rf "$dest" ;;
  esac
fi
install_packages

# Built and assembled in a temporary directory beside the cache entry, then
# renamed into place: an interrupted build leaves no half entry behind.
work=$(mktemp -d "$cache/.spdk-$hash.XXXXXX")
trap 'rm -rf "$work"' EXIT
log=$cache/spdk-$hash.log
echo "build.sh: building spdk_tgt from $source (log: $log; about 8 minutes on 2 cores)" >&2
started=$SECONDS
build() {
  set -x
  mkdir "$work/src"
  if [ -d "$source" ]; then
    cp -a "$source/." "$work/src/"
  else
    tar -xzf "$source" -C "$work/src" --strip-components=1
  fi
  cd "$work/src"
  if ! patch -p1 -R --dry-run -s -f <"$patch" >/dev/null; then
    patch -p1 -s <"$patch"
  fi
  # --with-shared: a static link against Debian's DPDK misses libnuma symbols.
  ./configure --with-shared --with-dpdk=/usr --without-crypto --without-vhost --without-virtio \
    --without-vfio-user --without-idxd --without-fuse --without-nvme-cuse --without-xnvme \
    --without-uring --without-rdma --without-usdt --disable-tests --disable-unit-tests \
    --disable-examples
  # Debian's libdpdk.pc names IPSec_MB, which would send the build looking for
  # the intel-ipsec-mb submodule; nothing needs it without crypto.
  sed -i 's/^CONFIG_IPSEC_MB?=.*/CONFIG_IPSEC_MB?=n/' mk/config.mk
  # isa-l-crypto's own parallel build races; build it alone first.
  make -C isa-l-crypto all
  make -j"$(nproc)"
}
if ! (build) >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "build.sh: the SPDK build failed; the whole log is $log" >&2
  exit 1
fi

# spdk_tgt links SPDK's own shared libraries; a wrapper points the loader at
# the copies beside it, so callers need no LD_LIBRARY_PATH (the check below
# runs after the build tree is gone, so it proves that). exec keeps the
# process id, so killing the wrapper's pid kills spdk_tgt.
mkdir -p "$work/out/bin" "$work/out/libexec" "$work/out/lib"
cp "$work/src/build/bin/spdk_tgt" "$work/out/libexec/"
# With SPDK's own ISA-L libraries (those built shared): the binary's RUNPATH
# names them in the build tree, which goes away.
shopt -s nullglob
libs=("$work/src/build/lib/"*.so* "$work/src/isa-l/.libs/"*.so* "$work/src/isa-l-crypto/.libs/"*.so*)
cp -P "${libs[@]}" "$work/out/lib/"
rm -rf "$work/src"
cat >"$work/out/bin/spdk_tgt" <<'WRAPPER'
#!/bin/sh
# spdk_tgt with SPDK's shared libraries from this cache entry (hack/spdk/build.sh).
here=$(dirname "$(readlink -f "$0")")/..
LD_LIBRARY_PATH=$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec "$here/libexec/spdk_tgt" "$@"
WRAPPER
chmod +x "$work/out/bin/spdk_tgt"
version=$(version_of "$work/out/bin/spdk_tgt")
case $version in
  "SPDK v"*) echo "build.sh: $version" >&2 ;;
  *) echo "build.sh: the built spdk_tgt does not start: $version" >&2; exit 1 ;;
esac
mv -T "$work/out" "$dest"
echo "build.sh: built in $((SECONDS - started)) s" >&2
echo "$dest/bin/spdk_tgt"
