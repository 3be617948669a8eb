#!/usr/bin/env bash
# The whole stack on one machine, on the SNAP emulator, in a fresh directory:
#
#   snap-emu (as the DPU's SNAP)          <- JSON-RPC <- sample plugin (plugins.v1 + CSI controller)
#   snap-emu --no-snap (NVMe-oF target)   <- JSON-RPC <- sample plugin's CSI controller (lvols, subsystems)
#   snap-csi controller (proxy)           -> CSI     -> sample plugin's CSI controller
#   snap-csi node (co-located DPU attach) -> plugins.v1 -> sample plugin; JSON-RPC -> SNAP emulator
#
# Prints CSI_CONTROLLER_ENDPOINT=, CSI_NODE_ENDPOINT=, KUBELET_DIR= (one per
# line; then NODE_METRICS=, CONTROLLER_METRICS= and PLUGIN_METRICS=, the
# Prometheus pages), then READY, and stays in the foreground. SIGINT or SIGTERM stops
# everything and removes what it created.
#
# Usage (as root): hack/local-up.sh [--backend aio|nvmf] [--dir DIR] [--profile release|debug] [--no-build]
#   [--snap-poll-period-us N] [--snap-nvme-pfs N] [--snap-nvme-vfs-per-pf N] [--allow-node-restart]
# The --snap-* options go to the DPU's SNAP emulator only (not the NVMe-oF
# target): its RPC poller period (8000 reproduces real SPDK's ~8 ms per
# sequential call) and how many NVMe functions it offers (default 1 PF with 16
# VFs). --allow-node-restart keeps the stack up when the node service exits,
# so that a benchmark can restart it with the same flags (it then stops its
# replacement itself).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

backend=aio
dir=
profile=release
build=1
snap_args=()
allow_node_restart=0
while (($#)); do
  case $1 in
    --backend) backend=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --profile) profile=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --snap-poll-period-us) snap_args+=(--poll-period-us "$2"); shift 2 ;;
    --snap-nvme-pfs) snap_args+=(--nvme-pfs "$2"); shift 2 ;;
    --snap-nvme-vfs-per-pf) snap_args+=(--nvme-vfs-per-pf "$2"); shift 2 ;;
    --allow-node-restart) allow_node_restart=1; shift ;;
    -h | --help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "local-up: unknown argument $1" >&2; exit 2 ;;
  esac
done
case $backend in aio | nvmf) ;; *) echo "local-up: --backend must be aio or nvmf" >&2; exit 2 ;; esac
case $profile in release | debug) ;; *) echo "local-up: --profile must be release or debug" >&2; exit 2 ;; esac

if ((build)); then
  ./hack/setup.sh >&2
  flag=()
  [ "$profile" = release ] && flag=(--release)
  cargo build "${flag[@]}" --locked --quiet -p snap-csi -p snap-emu -p snap-csi-spdk-plugin >&2
fi
bin=$repo/target/$profile

if [ -z "$dir" ]; then
  dir=$(mktemp -d /tmp/snap-csi-local.XXXXXX)
else
  mkdir -p "$dir"
fi
dir=$(cd "$dir" && pwd)
kubelet=$dir/kubelet
mkdir -p "$kubelet" "$dir/logs" "$dir/aio-pool"

pids=()
cleanup() {
  trap - INT TERM EXIT
  # Best effort from here on: one failed step must not skip the rest.
  set +e
  # Stop in reverse order of start, each gracefully: the node and the
  # emulators take their mounts and loop devices down themselves.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
  # Whatever a consumer left mounted under our kubelet directory.
  grep -o " $kubelet[^ ]*" /proc/self/mountinfo | sort -r | while read -r m; do
    umount -l "$m"
  done
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start NAME COMMAND...: runs it in the background, logging to logs/NAME.log.
start() {
  local name=$1
  shift
  "$@" >"$dir/logs/$name.log" 2>&1 &
  pids+=($!)
}

# wait_for_socket PATH: until something answers there (or the process died).
wait_for_socket() {
  for _ in $(seq 1000); do
    [ -S "$1" ] && return 0
    sleep 0.01
  done
  echo "local-up: nothing listens on $1; logs in $dir/logs" >&2
  tail -n 20 "$dir"/logs/*.log >&2 || true
  exit 1
}

rpc() { "$bin/snap-csi" rpc -s "$1" "${@:2}" >/dev/null; }

# The remote NVMe-oF target: a plain SPDK with a pool and an lvstore.
start target "$bin/snap-emu" --no-snap --socket "$dir/target.sock" --state-dir "$dir/target"
wait_for_socket "$dir/target.sock"
truncate -s 8G "$dir/target-pool.img"
rpc "$dir/target.sock" bdev_aio_create "{\"name\":\"pool0\",\"filename\":\"$dir/target-pool.img\",\"block_size\":4096}"
rpc "$dir/target.sock" bdev_lvol_create_lvstore '{"bdev_name":"pool0","lvs_name":"lvs0"}'
# free_port: a loopback TCP port nobody listens on now.
free_port() {
  local port
  for _ in $(seq 100); do
    port=$(shuf -i 20000-60000 -n 1)
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return 0
    fi
  done
  echo "local-up: no free port found" >&2
  exit 1
}
port=$(free_port)
node_metrics=127.0.0.1:$(free_port)
controller_metrics=127.0.0.1:$(free_port)
plugin_metrics=127.0.0.1:$(free_port)

# The DPU's SNAP.
start snap "$bin/snap-emu" --socket "$dir/snap.sock" --state-dir "$dir/snap" "${snap_args[@]}"
wait_for_socket "$dir/snap.sock"

# The sample vendor plugin: plugins.v1 toward the node, CSI toward the proxy.
start plugin "$bin/snap-csi-spdk-plugin" \
  --plugin-socket "$dir/plugin.sock" \
  --spdk-socket "$dir/snap.sock" \
  --csi-socket "$dir/vendor-csi.sock" \
  --state-dir "$dir/plugin-state" \
  --aio-pool-dir "$dir/aio-pool" \
  --nvmf-target-socket "$dir/target.sock" \
  --nvmf-lvstore lvs0 \
  --nvmf-listen "127.0.0.1:$port" \
  --default-backend "$backend" \
  --metrics-address "$plugin_metrics"
wait_for_socket "$dir/plugin.sock"
wait_for_socket "$dir/vendor-csi.sock"

start controller "$bin/snap-csi" controller \
  --endpoint "$dir/controller.sock" \
  --vendor-endpoint "unix://$dir/vendor-csi.sock" \
  --metrics-address "$controller_metrics"
wait_for_socket "$dir/controller.sock"

start node "$bin/snap-csi" node \
  --endpoint "$dir/node.sock" \
  --node-id local-node \
  --kubelet-dir "$kubelet" \
  --state-dir "$dir/node-state" \
  --sysfs-root "$dir/snap/sysfs" \
  --plugin-socket "$dir/plugin.sock" \
  --snap-socket-template "$dir/snap.sock" \
  --dpu-name local-dpu \
  --metrics-address "$node_metrics"
wait_for_socket "$dir/node.sock"

echo "CSI_CONTROLLER_ENDPOINT=unix://$dir/controller.sock"
echo "CSI_NODE_ENDPOINT=unix://$dir/node.sock"
echo "KUBELET_DIR=$kubelet"
echo "NODE_METRICS=http://$node_metrics/metrics"
echo "CONTROLLER_METRICS=http://$controller_metrics/metrics"
echo "PLUGIN_METRICS=http://$plugin_metrics/metrics"
echo "READY"

# Stay up until told to stop, or until a part dies (then stop the rest). With
# --allow-node-restart the node is not watched: it may exit and be replaced.
watched=("${pids[@]}")
((allow_node_restart)) && unset 'watched[-1]'
wait -n "${watched[@]}" || true
echo "local-up: a process exited; stopping (logs were in $dir/logs)" >&2
tail -n 20 "$dir"/logs/*.log >&2 || true
exit 1
