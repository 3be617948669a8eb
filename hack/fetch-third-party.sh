#!/usr/bin/env bash
# Gets a third-party source the test command builds (pinned in
# hack/third-party.txt: spdk, csi-test) and prints the path of a checked
# tarball of it (one top directory) as its last line on stdout.
#
# Usage: hack/fetch-third-party.sh NAME
#        hack/fetch-third-party.sh --id NAME   prints NAME's pinned tree id
#                                              (a cache key; no fetch, no network)
#
# With SNAP_CSI_THIRD_PARTY_MIRROR naming an offline mirror directory, the
# tarball is that directory's copy, used in place (read-only) if its SHA-256
# is the manifest's and refused otherwise; nothing is fetched. Without it,
# each part is cloned from its upstream repository at its tag, its commit
# checked, the whole tree checked against the pinned tree id, and the result
# packed once into ${SNAP_CSI_CACHE:-$HOME/.cache/snap-csi}/third-party/,
# where later calls find it without a network. Installs git if missing (root).
set -euo pipefail
manifest=$(cd "$(dirname "$0")" && pwd)/third-party.txt
die() { echo "fetch-third-party: $*" >&2; exit 1; }

id_only=0
if [ "${1:-}" = --id ]; then id_only=1; shift; fi
case ${1:-} in
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac
(($# == 1)) || die "usage: $0 [--id] NAME (see --help)"
name=$1

tree='' file='' sum=''
read -r tree file sum < <(awk -v n="$name" '$1 == "source" && $2 == n { print $3, $4, $5 }' "$manifest") || true
[ -n "$tree" ] || die "$manifest pins no source $name (it has: $(awk '$1 == "source" { printf "%s ", $2 }' "$manifest"))"
if ((id_only)); then
  echo "$tree"
  exit 0
fi

if [ -n "${SNAP_CSI_THIRD_PARTY_MIRROR:-}" ]; then
  mirror=$(cd "$SNAP_CSI_THIRD_PARTY_MIRROR" 2>/dev/null && pwd) ||
    die "SNAP_CSI_THIRD_PARTY_MIRROR=$SNAP_CSI_THIRD_PARTY_MIRROR is not a directory"
  [ -f "$mirror/$file" ] ||
    die "the offline mirror directory $mirror (SNAP_CSI_THIRD_PARTY_MIRROR) has no $file" \
      "(sha256 $sum); put it there, or unset SNAP_CSI_THIRD_PARTY_MIRROR to fetch $name upstream"
  actual=$(sha256sum <"$mirror/$file" | cut -c1-64)
  [ "$actual" = "$sum" ] ||
    die "refused $mirror/$file: its sha256 is $actual, hack/third-party.txt pins $sum"
  echo "$mirror/$file"
  exit 0
fi

cache=${SNAP_CSI_CACHE:-$HOME/.cache/snap-csi}/third-party
out=$cache/$name-$tree.tar.gz
if [ -f "$out" ]; then
  echo "$out"
  exit 0
fi
if ! command -v git >/dev/null; then
  [ "$(id -u)" = 0 ] || die "git is missing; install it, or use an offline mirror directory (SNAP_CSI_THIRD_PARTY_MIRROR)"
  echo "fetch-third-party: installing git" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends git ca-certificates >/dev/null
fi
# The user's git settings reach the clones (a proxy, a URL rewrite), but no
# line-ending conversion, which would change the files the tree id covers.
git=(git -c core.autocrlf=false)
mkdir -p "$cache"
work=$(mktemp -d "$cache/.$name.XXXXXX")
trap 'rm -rf "$work"' EXIT
top=$work/${file%.tar.gz}
while read -r dir url tag commit; do
  # git clones into an absent or empty directory: a submodule's place in the
  # top part's checkout is an empty one.
  dest=$top
  [ "$dir" = . ] || dest=$top/$dir
  expected=$commit
  [ "$commit" != - ] || expected="none pinned; the tree must be $tree"
  echo "fetch-third-party: cloning $url at $tag into $dir" >&2
  # A deadline: a stalled transfer fails instead of hanging the test command.
  timeout 900 "${git[@]}" -c http.lowSpeedLimit=1000 -c http.lowSpeedTime=60 \
    clone --quiet --depth 1 --branch "$tag" --config advice.detachedHead=false "$url" "$dest" ||
    die "could not fetch $name: git clone $url at tag $tag (expected commit: $expected) failed." \
      "Without access to $url, set SNAP_CSI_THIRD_PARTY_MIRROR to an offline mirror directory" \
      "holding $file (sha256 $sum)."
  head=$(git -C "$dest" rev-parse HEAD)
  case $commit in
    -) ;;
    *) [[ $head == "$commit"* ]] || die "refused $url: tag $tag is commit $head, hack/third-party.txt pins $commit" ;;
  esac
  rm -rf "$dest/.git"
done < <(awk -v n="$name" '$1 == "part" && $2 == n { print $3, $4, $5, $6 }' "$manifest")

index=$work/index.git
git init --quiet --bare "$index"
# Every file, whatever the tree's own .gitignore files say.
actual=$(cd "$top" && export GIT_DIR=$index GIT_WORK_TREE=$top &&
  "${git[@]}" add -A -f . && "${git[@]}" write-tree)
[ "$actual" = "$tree" ] ||
  die "refused $name fetched from upstream: its tree is $actual, hack/third-party.txt pins $tree"
tar -czf "$work/out.tar.gz" -C "$work" "${file%.tar.gz}"
mv -f "$work/out.tar.gz" "$out"
echo "$out"
