#!/usr/bin/env bash
# The benchmark: builds the release binaries, then runs snap-csi-bench, which
# starts the whole stack on the SNAP emulator (hack/local-up.sh) several
# times, plays external-provisioner and kubelet over real gRPC, and prints
# latency, floors, SNAP round trips, scale (with the metrics scrape), memory,
# JSON-RPC client, stage with and without encryption, FUSE data path
# against direct, filesystem devices, a multipath volume's path failover
# (the longest write a cut path costs the pod), and stage time on a host
# with two DPUs against a host with one (a batch at once and one at a time,
# and the batch's spread over the DPUs), and stage time on a real Linux
# kernel as the host (a QEMU guest, hack/guest/) against the emulated tree
# tables (docs/performance.md);
# section 7, density with the packed placement, runs only when named.
# Arguments go to the bench (--help lists them), e.g.
#   ./hack/bench.sh --json /tmp/bench.json
#   ./hack/bench.sh --sections 1,2 --volumes 8
#   ./hack/bench.sh --sections 8,9 --io-seconds 2
#   ./hack/bench.sh --sections 7
#   ./hack/bench.sh --sections 11 --failovers 12
#   ./hack/bench.sh --sections 12 --dpu-volumes 32 --dpu-repeats 8
#   ./hack/bench.sh --profile debug --sections 1,2   # builds and runs debug
# It exits non-zero when a target was missed; a run too short to judge a
# target says "not judged" and counts it as not met (docs/performance.md, "Ratios, noise
# and verdicts").
# Run as root: the emulator makes loop devices and the node mounts.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "bench: run as root (loop devices and mounts)" >&2
  exit 1
fi
# The bench's --profile names the binaries' directory: build the same.
profile=release
previous=
for arg in "$@"; do
  case "$previous" in --profile) profile=$arg ;; esac
  case "$arg" in --profile=*) profile=${arg#--profile=} ;; esac
  previous=$arg
done
case "$profile" in
  release) build=(--release) ;;
  debug) build=() ;;
  *) build=(--profile "$profile") ;;
esac
./hack/setup.sh >&2
cargo build "${build[@]}" --locked --quiet -p snap-csi -p snap-emu -p snap-csi-spdk-plugin -p snap-csi-bench >&2
cargo build "${build[@]}" --locked --quiet -p snap-csi-harness --bin snap-csi-guest >&2
exec "./target/$profile/snap-csi-bench" "$@"
