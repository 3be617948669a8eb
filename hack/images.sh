#!/usr/bin/env bash
# Builds the container images deploy/ names, with podman, from this
# repository's Containerfiles, and checks each by starting it:
#
#   snap-csi             deploy/images/snap-csi.Dockerfile     node, DPU agent, controller proxy
#   snap-csi-spdk-plugin deploy/images/spdk-plugin.Dockerfile  the sample vendor plugin
#   snap-csi-spdk        hack/spdk/Containerfile               SPDK v24.09 spdk_tgt (tests only)
#
# snap-csi and snap-csi-spdk-plugin are built for linux/amd64 and
# linux/arm64 (the DPU agent and the plugin run on the BlueField's Arm
# cores), each architecture's image joined in one manifest list per name;
# snap-csi-spdk for this machine's architecture only (hack/spdk/build.sh
# builds SPDK natively; on the DPU, SPDK is NVIDIA SNAP's own).
#
# The binaries are the ones this machine built and the tests ran: cargo's
# (--profile; the other architecture's cross-compiled, target/TRIPLE/PROFILE,
# as deploy/images/rust-target.sh sets it up) and hack/spdk/build.sh's cache
# entry, copied in through each Containerfile's `prebuilt` stage, not
# compiled again in a builder stage (that is a second full build, and its
# rust image is on a registry). The base is Debian 12 made from Debian's
# packages with mmdebstrap, one per architecture (minbase, the documentation
# left out, as debian:bookworm-slim is made; the other architecture's
# packages configured, and its images' `RUN apt-get` run, under qemu-user
# through binfmt_misc: qemu-user-static), unless --base names an image to use
# instead: --base IMAGE for this machine's architecture, --base ARCH=IMAGE for
# ARCH's (debian:bookworm-slim, pulled with --platform linux/ARCH, on a
# machine that reaches a registry: a local tag is one architecture's image).
#
# Every image is tagged localhost/snap-csi/NAME:KEY-ARCH, KEY a hash of all it
# is made of (its Containerfile, base, binary), and the manifest list
# localhost/snap-csi/NAME:KEY2, KEY2 a hash of its images' digests; a tag that
# exists is not built again, so a warm run costs the hashing (seconds).
# NAME:latest is this machine's architecture's image. The lists, and copies of
# their images, are kept in a store of their own, target/images/lists (podman
# --root target/images/lists/storage --runroot target/images/lists/run): in
# podman 4.3 a list beside an untagged image (every build's layer cache)
# breaks `podman images` and `podman build` in that store (podman#19757).
# Prints one line per image, and exits non-zero if a build or a check fails:
#
#   NAME=TAG SIZE          this machine's architecture (what `podman run` here runs)
#   NAME@ARCH=TAG SIZE     the other architecture's image
#   NAME@list=TAG PLATFORMS  the manifest list of both (what to push)
#
# The checks, of every image of either architecture (the other's started under
# qemu-user, which must be registered: a check that cannot start one fails):
# it is the architecture it is tagged as, its entrypoint answers --help and
# --version (naming this commit) and refuses an unknown flag; the snap-csi
# image has every tool the node runs, the plugin's every tool the plugin runs;
# each manifest list names exactly both images, and `podman run` of it runs
# this machine's; spdk_tgt answers --version (deploy/tools/check_images.py).
#
# Usage (as root, after hack/setup.sh): hack/images.sh [--profile debug|release] [--no-build] [--base [ARCH=]IMAGE]...
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
profile=release
build=1
declare -A bases=()
given=()
while (($#)); do
  case $1 in
    --profile) profile=${2:?--profile needs debug or release}; shift ;;
    --no-build) build=0 ;;
    --base) given+=("${2:?--base needs an image}"); shift ;;
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

# This machine's architecture and the other one (amd64 and arm64 are built).
native=$(dpkg --print-architecture)
case $native in
  amd64) other=arm64 ;;
  arm64) other=amd64 ;;
  *) say "builds on amd64 or arm64, not $native"; exit 1 ;;
esac
for b in "${given[@]}"; do
  case $b in
    amd64=* | arm64=*) bases[${b%%=*}]=${b#*=} ;;
    *) bases[$native]=$b ;;
  esac
done
for arch in "$native" "$other"; do
  [ -z "${bases[$arch]:-}" ] || continue
  # The base's recipe is its key: the same packages from the same suites. It
  # is not refreshed by itself: a new key (an edit here) makes a new one.
  debian=http://deb.debian.org/debian
  usrmerge=(usrmerge libfile-find-rule-perl libnumber-compare-perl libtext-glob-perl perl libperl5.36
    perl-modules-5.36 libgdbm-compat4)
  recipe=(--mode=root --variant=minbase --arch="$arch"
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*'
    # mmdebstrap merges /usr with usrmerge, which brings full perl (47 MB);
    # debian:bookworm-slim has neither, only usr-is-merged.
    --include=usr-is-merged --customize-hook="chroot \"\$1\" dpkg --purge ${usrmerge[*]} >/dev/null"
    --customize-hook="copy-in hack/images-apt.conf /etc/apt/apt.conf.d"
    --customize-hook='rm -f "$1"/var/cache/apt/*.bin'
    bookworm - "deb $debian bookworm main" "deb $debian bookworm-updates main"
    "deb http://deb.debian.org/debian-security bookworm-security main")
  bases[$arch]=localhost/snap-csi/debian:bookworm-slim-$arch-$(key "${recipe[@]}" hack/images-apt.conf)
  if ! podman image exists "${bases[$arch]}"; then
    say "making the base ${bases[$arch]} from Debian's packages (mmdebstrap)"
    # Through a file: a failed mmdebstrap must not leave an empty image tagged.
    tar=$(mktemp -p "$work" base.XXXXXX.tar)
    skip=()
    if [ "$arch" != "$native" ]; then
      # The other architecture's maintainer scripts run under qemu-user:
      # checked here, instead of by arch-test (a package mmdebstrap wants).
      binfmt=/proc/sys/fs/binfmt_misc/qemu-$([ "$arch" = arm64 ] && echo aarch64 || echo x86_64)
      grep -qx enabled "$binfmt" 2>/dev/null || {
        say "$binfmt is not enabled: $arch binaries cannot run here (apt-get install qemu-user-static)"
        exit 1
      }
      skip=(--skip=check/qemu)
    fi
    mmdebstrap --quiet "${skip[@]}" "${recipe[@]}" >"$tar" || { rm -f "$tar"; exit 1; }
    podman import --quiet --arch "$arch" --os linux --change 'CMD ["bash"]' \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      "$tar" "${bases[$arch]}" >/dev/null
    rm "$tar"
  fi
done

# Where cargo puts each architecture's binaries: this machine's in
# target/PROFILE, the other's, cross-compiled, in target/TRIPLE/PROFILE.
declare -A bins=([$native]=target/$profile)
bins[$other]=target/$(TARGETARCH=$other deploy/images/rust-target.sh triple)/$profile
cargo_profile=$([ "$profile" = debug ] && echo dev || echo release)
if ((build)); then
  say "building the binaries ($profile, $native)"
  cargo build --locked --profile "$cargo_profile" \
    -p snap-csi --bin snap-csi -p snap-csi-spdk-plugin --bin snap-csi-spdk-plugin >&2
  say "building the binaries ($profile, $other: cross-compiled)"
  ./hack/cross-build.sh --arch "$other" --profile "$profile" >/dev/null
fi
for arch in "$native" "$other"; do
  for b in snap-csi snap-csi-spdk-plugin; do
    [ -x "${bins[$arch]}/$b" ] || {
      say "${bins[$arch]}/$b is missing: build it (hack/images.sh without --no-build does;" \
        "hack/cross-build.sh --arch $arch --profile $profile for the other architecture's)"
      exit 1
    }
  done
done
spdk_tgt=$("$repo/hack/spdk/build.sh" | tail -n1)
spdk_entry=$(dirname "$(dirname "$(readlink -f "$spdk_tgt")")")
# The context is the repository; an ignore file lets in only the one input a
# prebuilt image copies (target/ alone is gigabytes).
spdk_dir=target/images/$(basename "$spdk_entry")
[ -d "$spdk_dir" ] || { rm -rf "$spdk_dir.new" && cp -a "$spdk_entry" "$spdk_dir.new" && mv "$spdk_dir.new" "$spdk_dir"; }

# image NAME ARCH CONTAINERFILE INPUT BUILD-ARG...: builds
# localhost/snap-csi/NAME:KEY-ARCH for linux/ARCH unless its tag exists, and
# sets tag to it; INPUT is the prebuilt file or directory it copies.
image() {
  local name=$1 arch=$2 file=$3 input=$4
  shift 4
  tag=localhost/snap-csi/$name:$(key "$file" "${bases[$arch]}" "$arch" "$@" \
    "$(find "$input" -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)")-$arch
  if ! podman image exists "$tag"; then
    say "building $tag"
    printf '*\n!%s\n' "$input" >"$work/$name.ignore"
    podman build --quiet --network host --pull=never --ignorefile "$work/$name.ignore" -f "$file" \
      --platform "linux/$arch" --build-arg TARGETARCH="$arch" \
      --build-arg BASE="${bases[$arch]}" "${@/#/--build-arg=}" -t "$tag" . >/dev/null
    # The prebuilt stage's image, a copy of the binary nothing refers to.
    podman image prune --force --filter label=io.snap-csi.stage=prebuilt >/dev/null
  fi
  keep+=("$tag")
  size=$(podman image inspect --format '{{.Size}}' "$tag" | numfmt --to=iec)
  if [ "$arch" = "$native" ]; then
    podman tag "$tag" "localhost/snap-csi/$name:latest"
    keep+=("localhost/snap-csi/$name:latest")
    built+=("$name=$tag")
    echo "$name=$tag $size"
  else
    built+=("$name@$arch=$tag")
    echo "$name@$arch=$tag $size"
  fi
}
# The manifest lists live in a store of their own, target/images/lists, with
# copies of their images (podman 4.3, Debian 12's: while a manifest list is in
# a store that also holds an untagged image, as every build's layer cache
# does, `podman images` and `podman build` there fail, reading the list as
# an image: podman#19757).
lists=$work/lists
lstore=(--root "$lists/storage" --runroot "$lists/run" --storage-driver overlay)
# list NAME TAG...: the manifest list localhost/snap-csi/NAME:KEY of the
# images TAG... (copied into the lists' store), made unless it exists; KEY a
# hash of their digests (a tag names the image's inputs, and a build of the
# same inputs, after the image was removed, is another image).
list() {
  local name=$1 tag digest platforms=() digests=()
  shift
  for tag; do
    digest=$(podman image inspect --format '{{.Digest}}' "$tag")
    if [ "$(podman "${lstore[@]}" image inspect --format '{{.Digest}}' "$tag" 2>/dev/null)" != "$digest" ]; then
      # Another image of that tag goes first: left untagged, beside a list, it
      # would break the store (above).
      podman "${lstore[@]}" rmi --force "$tag" >/dev/null 2>&1 || true
      # Only the layers the store lacks are copied (a changed binary's).
      podman push --quiet "$tag" "containers-storage:[overlay@$lists/storage+$lists/run]$tag"
    fi
    lkeep+=("$tag")
    platforms+=("linux/${tag##*-}")
    digests+=("$digest")
  done
  local list
  list=localhost/snap-csi/$name:$(key "${digests[@]}")
  if ! podman "${lstore[@]}" manifest exists "$list"; then
    podman "${lstore[@]}" manifest create "$list" >/dev/null
    for tag; do
      # containers-storage: the image in this store, not one on a registry.
      podman "${lstore[@]}" manifest add "$list" "containers-storage:$tag" >/dev/null ||
        { podman "${lstore[@]}" manifest rm "$list" >/dev/null; exit 1; }
    done
  fi
  lkeep+=("$list")
  built+=("$name@list=$list")
  echo "$name@list=$list $(IFS=,; echo "${platforms[*]}") (podman --root $lists/storage --runroot $lists/run)"
}
# prune [STORE-FLAG...] -- NAME KEEP...: earlier builds' tags of NAME go, the
# manifest lists first (an image a container still uses stays).
prune() {
  local flags=() name old
  while [ "$1" != -- ]; do flags+=("$1"); shift; done
  name=$2
  shift 2
  podman "${flags[@]}" images --format '{{.Repository}}:{{.Tag}}' "localhost/snap-csi/$name" |
    grep -v -x -F "${@/#/-e}" | while read -r old; do
      # A manifest list is removed as one (podman rmi looks up its image).
      if podman "${flags[@]}" manifest exists "$old" 2>/dev/null; then podman "${flags[@]}" manifest rm "$old" >/dev/null 2>&1; else echo "$old"; fi
    done | xargs -r podman "${flags[@]}" rmi >/dev/null 2>&1 || true
}
built=()
for name in snap-csi snap-csi-spdk-plugin; do
  file=deploy/images/$([ "$name" = snap-csi ] && echo snap-csi || echo spdk-plugin).Dockerfile
  keep=()
  lkeep=()
  tags=()
  for arch in "$native" "$other"; do
    image "$name" "$arch" "$file" "${bins[$arch]}/$name" BINARIES=prebuilt PREBUILT="${bins[$arch]}"
    tags+=("$tag")
  done
  # amd64 first in the list, whichever machine made it.
  list "$name" "$(printf '%s\n' "${tags[@]}" | grep -e '-amd64$')" "$(printf '%s\n' "${tags[@]}" | grep -e '-arm64$')"
  prune -- "$name" "${keep[@]}"
  prune "${lstore[@]}" -- "$name" "${lkeep[@]}"
done
keep=()
image snap-csi-spdk "$native" hack/spdk/Containerfile "$spdk_dir" SPDK=prebuilt PREBUILT="$spdk_dir"
prune -- snap-csi-spdk "${keep[@]}"
# The check shares deploy/check.sh's Python (its modules need PyYAML).
python=target/deploy-tools/venv/bin/python
[ -x "$python" ] || { say "$python is missing; run hack/setup.sh first"; exit 1; }
"$python" deploy/tools/check_images.py "$repo" --lists "$lists" "${built[@]}"
