#!/usr/bin/env bash
# The main job: the whole stack on the SNAP emulator (hack/local-up.sh), and a
# few volumes of each kind taken through their full life by csi-player, which
# plays external-provisioner and kubelet over real gRPC:
#
#   CreateVolume -> NodeStage -> NodePublish -> write -> read back ->
#   NodeUnpublish -> NodeUnstage -> DeleteVolume
#
# for AIO and NVMe-oF volumes, exposed as NVMe or virtio-blk, with ext4, xfs or
# as raw block. It prints one row per volume with each step's time, then stops
# the stack and checks that nothing is left: no loop device, no mount, no
# directory. Run as root: ./hack/demo.sh [--profile release|debug]
# (the test command runs it in debug, on the binaries the tests just built).
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
case "${1:-}" in
  "") ;;
  --profile) profile=${2:?--profile needs release or debug} ;;
  *) echo "demo: unknown argument $1" >&2; exit 2 ;;
esac
case $profile in release | debug) ;; *) echo "demo: --profile must be release or debug" >&2; exit 2 ;; esac
./hack/setup.sh
flag=()
[ "$profile" = release ] && flag=(--release)
cargo build "${flag[@]}" --locked --quiet -p snap-csi -p snap-emu -p snap-csi-spdk-plugin -p csi-player

# shellcheck source=hack/lib/local-up-client.sh
. hack/lib/local-up-client.sh
work=$(mktemp -d /tmp/snap-csi-demo.XXXXXX)
stack=$work/stack
trap 'local_up_stop; rm -rf "$work"' EXIT
local_up_start "$work" --profile "$profile" --dir "$stack"

./target/"$profile"/csi-player

# scrape URL: the Prometheus page at http://HOST:PORT/metrics (bash's /dev/tcp: no curl needed).
scrape() {
  local hostport=${1#http://}
  hostport=${hostport%%/*}
  exec 3<>"/dev/tcp/${hostport%:*}/${hostport#*:}"
  printf 'GET /metrics HTTP/1.1\r\nHost: %s\r\n\r\n' "$hostport" >&3
  cat <&3
  exec 3<&-
}
echo
echo "metrics (calls served by method, from each endpoint during this run):"
for page in "$NODE_METRICS" "$CONTROLLER_METRICS" "$PLUGIN_METRICS"; do
  counted=$(scrape "$page" | grep '^snap_csi_grpc_requests_total' || true)
  if [ -z "$counted" ]; then
    echo "FAIL: $page counted no calls" >&2
    exit 1
  fi
  echo "  $page"
  # shellcheck disable=SC2001
  sed 's/^/    /' <<<"$counted"
done

local_up_stop
local_up_assert_clean "$stack"
echo "OK: the stack is stopped; no loop device, mount or directory is left"
