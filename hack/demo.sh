#!/usr/bin/env bash
# The main job: the whole stack on the SNAP emulator (hack/local-up.sh), and a
# few volumes of each kind taken through their full life by csi-player, which
# plays external-provisioner and kubelet over real gRPC:
#
#   CreateVolume -> NodeStage -> NodePublish -> write -> read back ->
#   NodeUnpublish -> NodeUnstage -> DeleteVolume
#
# for AIO and NVMe-oF volumes, exposed as NVMe or virtio-blk, with ext4, xfs or
# as raw block, and a filesystem volume (backend fs) the host mounts as
# virtio-fs. The host has two DPUs (local-up --dpus 2): each row names the
# DPU the node put the volume on (both must hold some; virtio-fs volumes are
# pinned to the first, whose emulator alone mounts them), and one DPU is
# then stopped (co-located its SNAP, split its agent) while a pod writes on
# a volume on each: the node must show it down, call its volume abnormal,
# stay ready, stage a new volume elsewhere, and the other pod see no error.
# A second host (its own node, SNAP and plugin) then shares a
# ReadWriteMany filesystem volume with the first: each writes, the other
# reads, one leaves while the other writes on; the player prints what each
# saw. It runs twice: co-located (the node drives each DPU's vendor plugin
# and SNAP itself) and split (the node calls each DPU's agent, in a network
# namespace of its own, over mutual TLS, as on a BlueField host). Each time it
# prints one row per volume with each step's time and the calls each metrics
# endpoint counted; in split mode it also checks the agents' pages: one
# Attach per NodeStage, one Detach per NodeUnstage, one TLS handshake per
# agent (the stopped one's link may be made once more). Then it
# stops the stack and checks that nothing is left: no loop device, mount,
# directory, network namespace or veth. Two volumes also show the DPU's data
# path: an encrypted one (its AIO file holds ciphertext only) and a
# rate-limited one (writes at its limit, then at the one ControllerModifyVolume
# sets). Every process runs at debug level, and the encrypted volume's key is
# a canary: found in any process's log, the demo fails. Run as root:
#   ./hack/demo.sh [--profile release|debug] [--mode colocated|split] [--containers]
#     [--host vm] [--dpu-arch amd64|arm64]
# (default: both modes; the test command runs it in debug, on the binaries the
# tests just built). --containers runs the stack's plugin, controller proxy,
# node and agent from their images, with their manifests' privileges and
# mounts (hack/local-up.sh --containers). --host vm runs the main job once
# with a real Linux kernel as the host (hack/local-up.sh --host vm: the node
# in a QEMU guest, split mode, one DPU): it prints the guest's kernel and,
# under each volume's row, the device and filesystem that kernel mounted;
# plain volumes of every kind (the data-path proofs and the second DPU need
# this machine's devices and stay with the emulated host); and a second
# guest, a host with a DPU side of its own, shares the ReadWriteMany volume.
# --dpu-arch arm64 runs every plugin and agent as an aarch64 process under
# qemu-user, as on BlueField's Arm cores (hack/local-up.sh --dpu-arch); the
# demo counts them (by the emulator each runs under) before it plays.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
modes=(colocated split)
containers=()
host=local
dpu_arch=()
while (($#)); do
  case $1 in
    --profile) profile=${2:?--profile needs release or debug}; shift 2 ;;
    --mode) modes=("${2:?--mode needs colocated or split}"); shift 2 ;;
    --containers) containers=(--containers); shift ;;
    --host) host=${2:?--host needs local or vm}; shift 2 ;;
    --dpu-arch) dpu_arch=(--dpu-arch "${2:?--dpu-arch needs amd64 or arm64}"); shift 2 ;;
    *) echo "demo: unknown argument $1" >&2; exit 2 ;;
  esac
done
case $profile in release | debug) ;; *) echo "demo: --profile must be release or debug" >&2; exit 2 ;; esac
case $host in local | vm) ;; *) echo "demo: --host must be local or vm" >&2; exit 2 ;; esac
if [ "$host" = vm ] && ((${#containers[@]})); then
  echo "demo: --host vm runs bare processes (no --containers)" >&2
  exit 2
fi
for mode in "${modes[@]}"; do
  case $mode in colocated | split) ;; *) echo "demo: --mode must be colocated or split" >&2; exit 2 ;; esac
done
./hack/setup.sh
flag=()
[ "$profile" = release ] && flag=(--release)
cargo build "${flag[@]}" --locked --quiet -p snap-csi -p snap-emu -p snap-csi-spdk-plugin -p csi-player
cross_bin=
if ((${#dpu_arch[@]})) && [ "${dpu_arch[1]}" != "$(dpkg --print-architecture)" ]; then
  cross_bin=$(./hack/cross-build.sh --arch "${dpu_arch[1]}" --profile "$profile")
fi
[ "$host" = vm ] && cargo build "${flag[@]}" --locked --quiet -p snap-csi-harness --bin snap-csi-guest
# shellcheck source=hack/lib/local-up-client.sh
. hack/lib/local-up-client.sh
local_up_images "$profile" "${containers[@]}"
if [ "$host" = vm ]; then
  # Where the guest sees it (hack/lib/local-up-vm.sh: vm_visible).
  work=$(mktemp -d "$PWD/target/snap-csi-demo.XXXXXX")
else
  work=$(mktemp -d /tmp/snap-csi-demo.XXXXXX)
fi
trap 'local_up_stop; rm -rf "$work"' EXIT

# scrape URL: the Prometheus page at http://HOST:PORT/metrics (bash's /dev/tcp: no curl needed).
scrape() {
  local hostport=${1#http://}
  hostport=${hostport%%/*}
  exec 3<>"/dev/tcp/${hostport%:*}/${hostport#*:}"
  printf 'GET /metrics HTTP/1.1\r\nHost: %s\r\n\r\n' "$hostport" >&3
  cat <&3
  exec 3<&-
}

# total PAGE REGEX: the sum of the samples on PAGE (text) whose line matches REGEX.
total() { grep -E "$2" <<<"$1" | awk '{ sum += $NF } END { print sum + 0 }'; }

# show PAGE-URL REGEX: the samples matching REGEX, indented; fails on none.
show() {
  local counted
  counted=$(scrape "$1" | grep -E "$2" || true)
  if [ -z "$counted" ]; then
    echo "FAIL: $1 counted no calls" >&2
    exit 1
  fi
  echo "  $1"
  # shellcheck disable=SC2001
  sed 's/^/    /' <<<"$counted"
}

# split_checks: the agents together served each node call that needs a DPU
# exactly once, each over one TLS connection; the second DPU's agent over
# at most two: the player's DPU-down proof stops it (SIGSTOP) for several
# seconds, and the node's keepalive drops a link whose ping goes unanswered
# for 5 s, to connect again once the agent answers.
split_checks() {
  local node agent page stages unstages attaches=0 detaches=0 handshakes=()
  node=$(scrape "$NODE_METRICS")
  stages=$(total "$node" '^snap_csi_grpc_requests_total\{method="Node/NodeStageVolume"')
  unstages=$(total "$node" '^snap_csi_grpc_requests_total\{method="Node/NodeUnstageVolume"')
  for page in "$AGENT_METRICS" "$AGENT_METRICS_B"; do
    agent=$(scrape "$page")
    attaches=$((attaches + $(total "$agent" '^snap_csi_grpc_requests_total\{method="DpuAgent/Attach"')))
    detaches=$((detaches + $(total "$agent" '^snap_csi_grpc_requests_total\{method="DpuAgent/Detach"')))
    handshakes+=("$(total "$agent" '^snap_csi_tls_handshakes_total\{.*role="server"')")
  done
  echo "  split mode: $stages NodeStage -> $attaches Attach, $unstages NodeUnstage -> $detaches Detach" \
    "(both agents), TLS handshakes at each agent: ${handshakes[*]}"
  if ((stages == 0 || attaches != stages || detaches != unstages || handshakes[0] != 1 ||
    handshakes[1] < 1 || handshakes[1] > 2)); then
    echo "FAIL: expected one agent call per NodeStage and NodeUnstage, one TLS handshake at the" \
      "first agent and one or two at the second" >&2
    exit 1
  fi
}

# cross_checks STACK MODE: with --dpu-arch another architecture, the DPU side
# (three plugins: two DPUs' and the second host's; in split mode two agents)
# runs as that architecture's processes, each a qemu-user process started on
# this stack's cross-built binary.
cross_checks() {
  local stack=$1 want=3 found=0 p cmd exe emulator=
  [ "$2" = split ] && want=5
  # /proc, not pgrep: a minimal Debian has no procps.
  for p in /proc/[0-9]*; do
    cmd=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
    [[ $cmd == *"$cross_bin/snap-csi"*" $stack/"* ]] || continue
    exe=$(readlink "$p/exe" 2>/dev/null) || continue
    # qemu-aarch64-static, or where it is a link (QEMU 10's packages) qemu-aarch64.
    [[ $exe == */qemu-* ]] && found=$((found + 1)) emulator=${exe##*/}
  done
  echo "  the DPU side: $found processes of $(basename "$(dirname "$cross_bin")") under qemu-user" \
    "(${emulator:-none})"
  if ((found != want)); then
    echo "FAIL: expected $want plugins and agents as qemu-user processes of $cross_bin, found $found" >&2
    exit 1
  fi
}

# key_canary DIR KEY: no process's log in DIR holds the key, either half of
# it, or its upper-case form; the logs are at debug level (they say so).
key_canary() {
  local dir=$1 key=$2 lines
  lines=$(cat "$dir"/*.log | wc -l)
  if ! grep -q DEBUG "$dir"/*.log; then
    echo "FAIL: the stack's logs are not at debug level" >&2
    exit 1
  fi
  if grep -rliF -e "${key:0:64}" -e "${key:64}" "$dir"; then
    echo "FAIL: the encryption key reached the log(s) above" >&2
    exit 1
  fi
  echo "  canary: the encryption key is in none of the $(find "$dir" -name '*.log' | wc -l) processes' debug logs ($lines lines)"
}

# vm_job: the main job with the guest as the host.
vm_job() {
  local run=$work/vm started took
  mkdir -p "$run"
  started=$EPOCHREALTIME
  echo
  echo "== main job, the host a real Linux kernel (a QEMU guest), split mode"
  local_up_start "$run" --profile "$profile" --host vm --second-host --dir "$run/stack"
  echo "  the guest's kernel: $GUEST_KERNEL; the node there reaches the DPU agent at" \
    "$DPU_AGENT_ENDPOINT over the guest's link; a second guest is host B"
  ./target/"$profile"/csi-player --volumes \
    aio:nvme:ext4,aio:virtio-blk:xfs,aio:nvme:block,nvmf:nvme:xfs,nvmf:virtio-blk:ext4,nvmf:virtio-blk:block,fs:virtio-fs:virtiofs
  echo
  echo "metrics (calls served by method, from each endpoint during this run):"
  for page in "$NODE_METRICS" "$CONTROLLER_METRICS" "$PLUGIN_METRICS" "$AGENT_METRICS"; do
    show "$page" '^snap_csi_grpc_requests_total'
  done
  local_up_stop
  local_up_assert_clean "$run/stack"
  took=$(awk -v from="$started" -v to="$EPOCHREALTIME" 'BEGIN { printf "%.1f", to - from }')
  echo "OK (the guest host, $took s from start to stopped): the stack and the guest are stopped;" \
    "no loop device, mount, directory or tap is left"
}
if [ "$host" = vm ]; then
  vm_job
  exit 0
fi

for mode in "${modes[@]}"; do
  run=$work/$mode
  mkdir -p "$run"
  started=$EPOCHREALTIME
  echo
  echo "== main job, $mode mode"
  # Every process at debug level: the key must reach no log even then.
  RUST_LOG=debug local_up_start "$run" --profile "$profile" --mode "$mode" --dir "$run/stack" \
    --dpus 2 --second-host "${containers[@]}" "${dpu_arch[@]}"
  echo "  a host with two DPUs: $DPUS (the second's functions in PCI domain 0001)"
  [ -n "$cross_bin" ] && cross_checks "$run/stack" "$mode"
  if [ "$mode" = split ]; then
    echo "  the node reaches the DPU agents at $DPU_AGENT_ENDPOINT (namespace $DPU_NETNS) and" \
      "$DPU_AGENT_ENDPOINT_B (namespace $DPU_NETNS_B)"
  fi

  # kubelet hands the key over in NodeStageVolume's secrets, from memory.
  key=$(od -An -tx1 -N64 /dev/urandom | tr -d ' \n')
  SNAP_CSI_DEMO_KEY=$key ./target/"$profile"/csi-player

  echo
  echo "metrics, $mode mode (calls served by method, from each endpoint during this run):"
  for page in "$NODE_METRICS" "$CONTROLLER_METRICS" "$PLUGIN_METRICS" "$PLUGIN_METRICS_B"; do
    show "$page" '^snap_csi_grpc_requests_total'
  done
  if [ "$mode" = split ]; then
    for page in "$AGENT_METRICS" "$AGENT_METRICS_B"; do
      show "$page" '^snap_csi_(grpc_requests|tls_handshakes)_total'
    done
    split_checks
  fi

  # Before the stop, which removes the stack's directory with its logs.
  key_canary "$run/stack/logs" "$key"
  local_up_stop
  local_up_assert_clean "$run/stack"
  took=$(awk -v from="$started" -v to="$EPOCHREALTIME" 'BEGIN { printf "%.1f", to - from }')
  echo "OK ($mode mode, $took s from start to stopped): the stack is stopped; no loop device, mount," \
    "directory, network namespace or veth is left"
done
