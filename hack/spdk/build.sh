#!/usr/bin/env bash
# Builds SPDK's spdk_tgt against Debian 12's DPDK (no hugepages needed at run
# time: spdk_tgt --no-huge -s 1024 --no-pci) and caches it outside the
# repository, keyed by what is built: the source's identity, the patch and
# the recipe (hack/spdk/recipe.sh). Prints the path of a runnable spdk_tgt as
# its last line on stdout; everything else goes to stderr or the build log.
#
# Usage: hack/spdk/build.sh [--source TARBALL_OR_DIR] [--patch FILE]
#   --source  SPDK v24.09 as a .tar.gz (one top directory) or a source tree
#             with the isa-l and isa-l-crypto submodules checked out
#             (default: the source hack/third-party.txt pins, from
#             hack/fetch-third-party.sh spdk: upstream, or an offline mirror
#             directory when SNAP_CSI_THIRD_PARTY_MIRROR names one; fetched
#             only when there is something to build)
#   --patch   applied with patch -p1 unless already applied
#             (default: hack/spdk/spdk-v24.09-debian-dpdk.patch)
# Cache: ${SNAP_CSI_CACHE:-$HOME/.cache/snap-csi}/spdk-<hash>/bin/spdk_tgt.
# A cache hit (an entry whose spdk_tgt starts) runs no apt-get, no fetch and
# no build. Installs the Debian packages it needs (only missing ones), as root.
#   tgt=$(hack/spdk/build.sh | tail -n1)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=hack/spdk/recipe.sh
. "$here/recipe.sh"
source=
patch=$here/spdk-v24.09-debian-dpdk.patch
while (($#)); do
  case $1 in
    --source) source=$2; shift 2 ;;
    --patch) patch=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -f "$patch" ] || { echo "build.sh: no patch at $patch" >&2; exit 1; }

if [ -z "$source" ]; then
  # The pinned source's tree id: the same whichever way it is fetched, and
  # known without fetching, so a cache hit needs no network.
  source_id=$("$repo/hack/fetch-third-party.sh" --id spdk)
else
  [ -e "$source" ] || { echo "build.sh: no SPDK source at $source" >&2; exit 1; }
  source=$(cd "$(dirname "$source")" && pwd)/$(basename "$source")
  # A source tree is hashed file by file (names and contents, .git left out),
  # so an edit anywhere in it makes a new cache entry.
  if [ -d "$source" ]; then
    source_id=$(cd "$source" && find . -path ./.git -prune -o -type f -print0 | LC_ALL=C sort -z |
      xargs -0 sha256sum | sha256sum | cut -c1-64)
  else
    source_id=$(sha256sum <"$source" | cut -c1-64)
  fi
fi
hash=$({ echo "$source_id"; sha256sum <"$patch"; sha256sum <"$here/recipe.sh"; } | sha256sum | cut -c1-16)
cache=${SNAP_CSI_CACHE:-$HOME/.cache/snap-csi}
dest=$cache/spdk-$hash

install_packages() {
  local missing=() p
  for p in "${spdk_packages[@]}"; do
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
[ -n "$source" ] || source=$("$repo/hack/fetch-third-party.sh" spdk | tail -n1)
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
  spdk_build
}
if ! (build) >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "build.sh: the SPDK build failed; the whole log is $log" >&2
  exit 1
fi

spdk_install "$work/src" "$work/out"
rm -rf "$work/src"
version=$(version_of "$work/out/bin/spdk_tgt")
case $version in
  "SPDK v"*) echo "build.sh: $version" >&2 ;;
  *) echo "build.sh: the built spdk_tgt does not start: $version" >&2; exit 1 ;;
esac
mv -T "$work/out" "$dest"
echo "build.sh: built in $((SECONDS - started)) s" >&2
echo "$dest/bin/spdk_tgt"
