#!/usr/bin/env bash
# Proves the README's "Two commands" work on a fresh Debian 12 machine: builds
# a minimal Debian 12 (bookworm) root from Debian's packages, copies in this
# repository's HEAD (as /work/main) and the Rust toolchain rustup has for
# rust-toolchain.toml, then runs the commands README.md lists under "Two
# commands" inside it, as root, in a clean environment, and prints each one's
# exit status and duration.
#
# Third-party sources (hack/third-party.txt): with SNAP_CSI_THIRD_PARTY_MIRROR
# naming an offline mirror directory, that directory is bound read-only into
# the root and the variable passed on to the commands, as CI does; without it
# the commands fetch the sources upstream, as on a new machine.
#
# Usage (as root): ./hack/fresh-root-check.sh [--keep] [--dir DIR] [--command 'CMD']...
#   --keep         leave the root in place afterwards (to look around or chroot in)
#   --dir DIR      build the root in DIR (new or empty; default: a new directory
#                  under /var/tmp); it needs ~15 GB
#   --command CMD  run CMD (in /work/main inside the root) instead of the README's
#                  commands; repeatable, e.g. --command ./hack/setup.sh
#
# What "fresh" means here: mmdebstrap's minbase variant (Essential:yes and
# Priority:required packages plus apt; no ca-certificates, gcc, python3, curl
# or sudo), with the sources a Debian 12 install has (bookworm,
# bookworm-updates, bookworm-security; no backports), plus what rustup itself
# puts on a machine (~/.rustup with one toolchain, ~/.cargo/bin). A cloud or
# VM image has more; the fewer packages the root starts with, the more the
# check proves about what the scripts install. No cargo registry is copied:
# crates come from crates.io as on a new machine. Nothing installed on this
# machine leaks in: the root has only its own /usr (but for the network's
# name server and locally added CAs, below).
#
# Everything runs in a private mount namespace: the root is bind-mounted on
# itself (so it is a mount point, shared like / under systemd), with /proc
# mounted, /sys and /dev bound recursively (loop devices are the host
# kernel's), a tmpfs on /run, and /etc/resolv.conf copied in. When the run
# ends, however it ends (Ctrl-C included), processes left in the namespace are
# killed, which releases its mounts; loop devices backed by files in the root
# are detached, and the root is removed unless --keep.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

keep=0
dir=
commands=()
while (($#)); do
  case $1 in
    --keep) keep=1 ;;
    --dir) dir=${2:?--dir needs a directory}; shift ;;
    --command) commands+=("${2:?--command needs a command}"); shift ;;
    -h | --help) sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) echo "fresh-root: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" = 0 ] || { echo "fresh-root: run as root" >&2; exit 1; }
say() { echo "fresh-root: $*"; }
# A duration in seconds as 12m34s.
human() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# The commands a user runs: the first ```sh block under "## Two commands" in
# README.md, one command per line, comments dropped.
if ((${#commands[@]} == 0)); then
  mapfile -t commands < <(awk '
    /^## / { in_section = ($0 == "## Two commands") }
    in_section && /^```sh$/ { in_block = 1; next }
    in_block && /^```$/ { exit }
    in_block { sub(/[ \t]*#.*/, ""); if ($0 != "") print }' "$repo/README.md")
  ((${#commands[@]})) || { echo "fresh-root: no commands found under '## Two commands' in README.md" >&2; exit 1; }
fi

mirror=
if [ -n "${SNAP_CSI_THIRD_PARTY_MIRROR:-}" ]; then
  mirror=$(cd "$SNAP_CSI_THIRD_PARTY_MIRROR" 2>/dev/null && pwd) ||
    { echo "fresh-root: SNAP_CSI_THIRD_PARTY_MIRROR=$SNAP_CSI_THIRD_PARTY_MIRROR is not a directory" >&2; exit 1; }
fi

# The toolchain the repository pins, as rustup on this machine has it: either
# under the pinned name or (hack/setup.sh's case) only as "stable". The root
# gets it under the name it really has here, so setup.sh's own logic runs.
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
cargo_home=${CARGO_HOME:-$HOME/.cargo}
pinned=$(sed -n 's/^channel = "\(.*\)"/\1/p' "$repo/rust-toolchain.toml")
triple=x86_64-unknown-linux-gnu
toolchain=$(readlink -f "$rustup_home/toolchains/$pinned-$triple" 2>/dev/null || true)
[ -x "$toolchain/bin/cargo" ] || toolchain=$rustup_home/toolchains/stable-$triple
if ! "$toolchain/bin/rustc" --version 2>/dev/null | grep -q "^rustc $pinned "; then
  echo "fresh-root: rustup here has no toolchain $pinned (rust-toolchain.toml) to copy" >&2
  exit 1
fi
[ -x "$cargo_home/bin/rustup" ] || { echo "fresh-root: no rustup in $cargo_home/bin" >&2; exit 1; }

if ! command -v mmdebstrap >/dev/null; then
  say "installing mmdebstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
fi

if [ -z "$dir" ]; then
  dir=$(mktemp -d /var/tmp/snap-csi-fresh-root.XXXXXX)
elif [ -e "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
  echo "fresh-root: $dir is not empty" >&2
  exit 1
fi
mkdir -p "$dir"
root=$(cd "$dir" && pwd)

nsfile=$(mktemp /tmp/snap-csi-fresh-root-ns.XXXXXX)
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
  local status=$? pids=() names=() p namespace
  trap - EXIT INT TERM
  namespace=$(cat "$nsfile" 2>/dev/null || true)
  rm -f "$nsfile"
  # Whatever still runs in the root's mount namespace (a daemon a command left
  # behind, or everything after Ctrl-C); the namespace and its mounts go with
  # its last process.
  if [ -n "$namespace" ]; then
    for p in /proc/[0-9]*; do
      [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$namespace" ] || continue
      pids+=("${p#/proc/}")
      names+=("$(cat "$p/comm" 2>/dev/null)")
    done
    if ((${#pids[@]})); then
      say "stopping ${#pids[@]} processes left in the root: ${names[*]}" >&2
      kill -TERM "${pids[@]}" 2>/dev/null || true
      for _ in $(seq 50); do
        kill -0 "${pids[@]}" 2>/dev/null || break
        sleep 0.1
      done
      kill -KILL "${pids[@]}" 2>/dev/null || true
      sleep 0.5
    fi
  fi
  # A loop device on a file in the root would outlive it. Found by device and
  # inode: the path the kernel shows for it here is the dead namespace's.
  local fs name majmin ino inodes=() loops=() found
  fs=$(stat -c '%Hd:%Ld' "$root" 2>/dev/null || true)
  while read -r name majmin ino; do
    [ "$majmin" = "$fs" ] || continue
    loops+=("$name:$ino")
    inodes+=(-o -inum "$ino")
  done < <(losetup --list --noheadings --output NAME,BACK-MAJ:MIN,BACK-INO 2>/dev/null)
  if ((${#loops[@]})); then
    found=$(find "$root" -xdev \( "${inodes[@]:1}" \) -printf '%i\n' 2>/dev/null || true)
    for name in "${loops[@]}"; do
      grep -qx "${name##*:}" <<<"$found" || continue
      say "detaching ${name%:*}, left on a file in the root" >&2
      losetup -d "${name%:*}" || true
    done
  fi
  if awk -v r="$root" '$5 == r || index($5, r "/") == 1 { found = 1 } END { exit !found }' /proc/self/mountinfo; then
    say "mounts are left under $root; not removing it" >&2
  elif ((keep)); then
    say "root kept in $root"
  else
    rm -rf --one-file-system "$root"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start=$(date +%s)
# Release files older than this machine's clock allows: the host's own apt
# settings say whether to check their dates, and the root follows them.
aptopts=()
for opt in Acquire::Check-Valid-Until Acquire::Check-Date; do
  v=$(apt-config dump "$opt" | sed -n "s/^$opt \"\(.*\)\";/\1/p")
  [ -n "$v" ] && aptopts+=(--aptopt="$opt \"$v\"")
done
# Not `mirror`: that names the third-party sources' mirror directory.
debian=http://deb.debian.org/debian
say "building a Debian 12 minbase root in $root"
mmdebstrap --quiet --mode=root --variant=minbase "${aptopts[@]}" bookworm "$root" \
  "deb $debian bookworm main" "deb $debian bookworm-updates main" \
  "deb http://deb.debian.org/debian-security bookworm-security main"
# What the installer writes on every Debian machine.
printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
# The network's settings, which a fresh machine on this network has too: its
# name server, and the CAs it adds locally (a TLS-inspecting proxy's, here),
# which ca-certificates puts in the bundle once something installs it.
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
if [ -d /usr/local/share/ca-certificates ]; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp -a /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
fi

head=$(git -C "$repo" rev-parse HEAD)
say "copying the repository at $head (HEAD; uncommitted changes are not included)"
[ -z "$(git -C "$repo" status --porcelain)" ] || say "note: $repo has uncommitted changes"
git clone --quiet --no-checkout --no-hardlinks "$repo" "$root/work/main"
git -C "$root/work/main" checkout --quiet --detach "$head"

say "copying rustup and the toolchain $(basename "$toolchain")"
mkdir -p "$root/root/.rustup/toolchains" "$root/root/.cargo"
cp -a "$toolchain" "$root/root/.rustup/toolchains/"
cp -a "$cargo_home/bin" "$root/root/.cargo/"
cp -a "$cargo_home/env" "$root/root/.cargo/" 2>/dev/null || true
printf 'version = "12"\ndefault_toolchain = "%s"\nprofile = "minimal"\n' "$(basename "$toolchain")" \
  >"$root/root/.rustup/settings.toml"
if [ -n "$mirror" ]; then
  say "third-party sources from the offline mirror directory $mirror (read-only)"
else
  say "no offline mirror directory (SNAP_CSI_THIRD_PARTY_MIRROR): third-party sources come from upstream"
fi
prepared=$(date +%s)
say "root ready in $(human $((prepared - start)))"

# Runs in the private mount namespace (whose id it writes to NSFILE): the
# mounts, then each command in the chroot, in the foreground so that Ctrl-C
# reaches them as on a real machine. Prints "exit STATUS after DURATION" for
# each. Usage: run_inside ROOT MIRROR NSFILE COMMAND... (MIRROR may be empty)
# shellcheck disable=SC2317 # run through declare -f in the namespace
run_inside() {
  local root=$1 mirror=$2 cmd t0 status failed=0 env=()
  readlink /proc/self/ns/mnt >"$3"
  shift 3
  mount --bind "$root" "$root"
  mount --make-shared "$root"
  mount -t proc proc "$root/proc"
  mount --rbind /sys "$root/sys"
  mount --rbind /dev "$root/dev"
  mount -t tmpfs -o mode=755,nosuid,nodev tmpfs "$root/run"
  if [ -n "$mirror" ]; then
    mkdir -p "$root/mnt/third-party-mirror"
    mount --bind "$mirror" "$root/mnt/third-party-mirror"
    mount -o remount,bind,ro "$root/mnt/third-party-mirror"
    env+=(SNAP_CSI_THIRD_PARTY_MIRROR=/mnt/third-party-mirror)
  fi
  for cmd in "$@"; do
    echo "fresh-root: ==> $cmd"
    t0=$(date +%s)
    status=0
    chroot "$root" /usr/bin/env -i HOME=/root USER=root LOGNAME=root SHELL=/bin/bash \
      PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "${env[@]}" \
      /bin/bash -c "cd /work/main && $cmd" </dev/null || status=$?
    echo "fresh-root: <== $cmd: exit $status after $(human $(($(date +%s) - t0)))"
    ((status == 0)) || failed=1
  done
  return "$failed"
}

status=0
unshare --mount --propagation private -- bash -c "set -euo pipefail; $(declare -f human run_inside)
  run_inside \"\$@\"" fresh-root-inside "$root" "$mirror" "$nsfile" "${commands[@]}" || status=$?
say "total $(human $(($(date +%s) - start))) (root $(human $((prepared - start))), commands $(human $(($(date +%s) - prepared))))"
if ((status == 0)); then
  say "OK: every command passed in a fresh Debian 12 root"
else
  say "FAIL: a command failed (above)"
fi
exit "$status"
