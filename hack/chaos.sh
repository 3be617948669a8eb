#!/usr/bin/env bash
# The chaos soak: builds the binaries, then runs snap-csi-chaos, which starts
# the whole stack (hack/local-up.sh --supervise, one fresh stack per round,
# cycling through co-located and split mode, SNAP's pace and a host with one
# DPU or two), drives random
# volume lives on every backend, emulation and volume kind at once (NVMe-oF
# volumes single-path or multipath) with a
# known pattern read back after every restage, kills and restarts the node,
# the plugin, the controller proxy, SNAP, the NVMe-oF target and the DPU
# agent, stalls SNAP, fills the function pool, takes one of the target's
# two paths down or flaps it, takes one DPU of a two-DPU host down, and holds
# mounts busy, then counts what leaked.
# Its last line is `chaos: N operations, F faults, L leaks, D data errors, R I/O
# refused (pod restarted)`; it exits non-zero when L or D is not zero or a call
# never converged.
# Every stack is stopped and removed on the way out (also on Ctrl-C).
#
# Usage (as root): hack/chaos.sh [--profile release|debug] [CHAOS-ARGS...]
#   e.g. hack/chaos.sh --duration 8h --seed 42     (--help lists the rest)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "chaos: run as root (loop devices and mounts)" >&2
  exit 1
fi
profile=release
if [ "${1:-}" = --profile ]; then
  profile=$2
  shift 2
fi
case $profile in release | debug) ;; *) echo "chaos: --profile must be release or debug" >&2; exit 2 ;; esac
flag=()
[ "$profile" = release ] && flag=(--release)
./hack/setup.sh >&2
cargo build "${flag[@]}" --locked --quiet -p snap-csi -p snap-emu -p snap-csi-spdk-plugin -p snap-csi-chaos >&2
exec "./target/$profile/snap-csi-chaos" --profile "$profile" "$@"
