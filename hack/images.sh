#!/usr/bin/env bash
# Builds the container images deploy/ names, with podman, from this
# repository's Containerfiles, and checks each by starting it:
#
#   snap-csi             deploy/images/snap-csi.Dockerfile     node, DPU agent, controller proxy
#   snap-csi-spdk-plugin deploy/images/spdk-plugin.Dockerfile  the sample vendor plugin
#   snap-csi-spdk        hack/spdk/Containerfile               SPDK v24.09 spdk_tgt
#
# The binaries are the ones this machine built and the tests ran: cargo's
# (--profile) and hack/spdk/build.sh's cache entry, copied in through each
# Containerfile's `prebuilt` stage, not compiled again in a builder stage
# (that is a second full build, and its rust image is on a registry). The base is
# Debian 12 made from Debian's packages with mmdebstrap (minbase, the
# documentation left out, as debian:bookworm-slim is made), unless --base
# names an image to use instead (debian:bookworm-slim on a machine that
# reaches a registry).
#
# Every image is tagged localhost/snap-csi/NAME:KEY, KEY a hash of all it is
# made of (its Containerfile, base, binary); a tag that exists is not built
# again, so a warm run costs the hashing (seconds). Prints one line per image,
# NAME=TAG SIZE, and exits non-zero if a build or a check fails. The checks:
# each entrypoint answers --help and --version (naming this commit) and
# refuses an unknown flag; the snap-csi image has every tool the node runs;
# spdk_tgt answers --version (deploy/tools/check_images.py).
#
# Usage (as root, after hack/setup.sh): hack/images.sh [--profile debug|release] [--no-build] [--base IMAGE]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
profile=release
build=1
base=
while (($#)); do
  case $1 in
    --profile) profile=${2:?--profile needs debug or release}; shift ;;
    --no-build) build=0 ;;
    --base) base=${2:?--base needs an image}; shift ;;
    -h | --help) sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) echo "images: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
say() { echo "images: $*" >&2; }
export CONTAINERS_CONF=${CONTAINERS_CONF:-$repo/hack/containers.conf}
work=$repo/target/images
mkdir -p "$work"
# A hash of files and strings, in order: NAME:KEY tags.
key() { { for a in "$@"; do if [ -f "$a" ]; then sha256sum <"$a"; else echo "$a"; fi; done; } | sha256sum | cut -c1-16; }

if [ -z "$base" ]; then
  # The base's recipe is its key: the same packages from the same suites. It
  # is not refreshed by itself: a new key (an edit here) makes a new one.
  debian=http://deb.debian.org/debian
  usrmerge=(usrmerge libfile-find-rule-perl libnumber-compare-perl libtext-glob-perl perl libperl5.36
    perl-modules-5.36 libgdbm-compat4)
  recipe=(--mode=root --variant=minbase
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*'
    # mmdebstrap merges /usr with usrmerge, which brings full perl (47 MB);
    # debian:bookworm-slim has neither, only usr-is-merged.
    --include=usr-is-merged --customize-hook="chroot \"\$1\" dpkg --purge ${usrmerge[*]} >/dev/null"
    --customize-hook="copy-in hack/images-apt.conf /etc/apt/apt.conf.d"
    --customize-hook='rm -f "$1"/var/cache/apt/*.bin'
    bookworm - "deb $debian bookworm main" "deb $debian bookworm-updates main"
    "deb http://deb.debian.org/debian-security bookworm-security main")
  base=localhost/snap-csi/debian:bookworm-slim-$(key "${recipe[@]}" hack/images-apt.conf)
  if ! podman image exists "$base"; then
    say "making the base $base from Debian's packages (mmdebstrap)"
    # Through a file: a failed mmdebstrap must not leave an empty image tagged.
    tar=$(mktemp -p "$work" base.XXXXXX.tar)
    mmdebstrap --quiet "${recipe[@]}" >"$tar"
    podman import --quiet --change 'CMD ["bash"]' \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      "$tar" "$base" >/dev/null
    rm "$tar"
  fi
fi

if ((build)); then
  say "building the binaries ($profile)"
  cargo build --locked --profile "$([ "$profile" = debug ] && echo dev || echo release)" \
    -p snap-csi --bin snap-csi -p snap-csi-spdk-plugin --bin snap-csi-spdk-plugin >&2
fi
spdk_tgt=$("$repo/hack/spdk/build.sh" | tail -n1)
spdk_entry=$(dirname "$(dirname "$(readlink -f "$spdk_tgt")")")
# The context is the repository; an ignore file lets in only the one input a
# prebuilt image copies (target/ alone is gigabytes).
spdk_dir=target/images/$(basename "$spdk_entry")
[ -d "$spdk_dir" ] || { rm -rf "$spdk_dir.new" && cp -a "$spdk_entry" "$spdk_dir.new" && mv "$spdk_dir.new" "$spdk_dir"; }

# image NAME CONTAINERFILE INPUT BUILD-ARG...: builds localhost/snap-csi/NAME
# unless its tag exists; INPUT is the prebuilt file or directory it copies.
image() {
  local name=$1 file=$2 input=$3 tag
  shift 3
  tag=localhost/snap-csi/$name:$(key "$file" "$base" "$@" "$(find "$input" -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)")
  if ! podman image exists "$tag"; then
    say "building $tag"
    printf '*\n!%s\n' "$input" >"$work/$name.ignore"
    podman build --quiet --network host --pull=never --ignorefile "$work/$name.ignore" -f "$file" \
      --build-arg TARGETARCH="$(dpkg --print-architecture)" \
      --build-arg BASE="$base" "${@/#/--build-arg=}" -t "$tag" . >/dev/null
    # The prebuilt stage's image, a copy of the binary nothing refers to.
    podman image prune --force --filter label=io.snap-csi.stage=prebuilt >/dev/null
  fi
  podman tag "$tag" "localhost/snap-csi/$name:latest"
  # Earlier builds' tags go (an image a container still uses stays).
  podman images --format '{{.Repository}}:{{.Tag}}' "localhost/snap-csi/$name" |
    grep -v -x -e "$tag" -e "localhost/snap-csi/$name:latest" | xargs -r podman rmi >/dev/null 2>&1 || true
  built+=("$name=$tag")
  echo "$name=$tag $(podman image inspect --format '{{.Size}}' "$tag" | numfmt --to=iec)"
}
built=()
bin=target/$profile
image snap-csi deploy/images/snap-csi.Dockerfile "$bin/snap-csi" BINARIES=prebuilt PREBUILT="$bin"
image snap-csi-spdk-plugin deploy/images/spdk-plugin.Dockerfile "$bin/snap-csi-spdk-plugin" \
  BINARIES=prebuilt PREBUILT="$bin"
image snap-csi-spdk hack/spdk/Containerfile "$spdk_dir" SPDK=prebuilt PREBUILT="$spdk_dir"
# The check shares deploy/check.sh's Python (its modules need PyYAML).
python=target/deploy-tools/venv/bin/python
[ -x "$python" ] || { say "$python is missing; run hack/setup.sh first"; exit 1; }
"$python" deploy/tools/check_images.py "$repo" "${built[@]}"
