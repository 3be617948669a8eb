# shellcheck shell=bash
# Starting hack/local-up.sh from another script and reading what it prints;
# shared by hack/demo.sh and hack/csi-sanity.sh. Source it from a script whose
# working directory is the repository root (both cd there first).
#
#   local_up_start OUT_DIR [LOCAL-UP-ARGS...]   start the stack, wait for READY,
#                                               export its endpoints
#   local_up_images PROFILE [LOCAL-UP-ARGS...]  with --containers among the
#                                               args, the images local-up runs
#   local_up_stop                               stop it (idempotent; for traps)
#   local_up_assert_clean STACK_DIR             no loop device, mount, directory,
#                                               network namespace or veth left

# local_up_start OUT_DIR ARGS...: runs `hack/local-up.sh --no-build ARGS...` in
# the background with its output in OUT_DIR/local-up.{out,err}, waits (60 s at
# most; 5 minutes with --host vm, a guest booting) for READY, then exports
# what it printed: CSI_CONTROLLER_ENDPOINT,
# CSI_NODE_ENDPOINT, KUBELET_DIR, NODE_METRICS, CONTROLLER_METRICS,
# PLUGIN_METRICS, NVMF_TARGET_SOCKET, NODE_STATE_DIR, with --second-host CSI_NODE2_ENDPOINT and KUBELET2_DIR, and
# in split mode DPU_AGENT_ENDPOINT, AGENT_METRICS,
# DPU_NETNS and DPU_VETH (unset in co-located mode, also after a split run),
# DPUS, and with --dpus 2 SNAP_SOCKET_B, PLUGIN_SOCKET_B and PLUGIN_METRICS_B, in split mode
# also DPU_AGENT_ENDPOINT_B, AGENT_METRICS_B, DPU_NETNS_B and DPU_VETH_B;
# with --host vm GUEST_KERNEL, GUEST_ADDRESS and GUEST_EXEC.
LOCAL_UP_KEYS='CSI_CONTROLLER_ENDPOINT|CSI_NODE_ENDPOINT|KUBELET_DIR|CSI_NODE2_ENDPOINT|KUBELET2_DIR|NODE_METRICS|CONTROLLER_METRICS|PLUGIN_METRICS|NVMF_TARGET_SOCKET|NODE_STATE_DIR|DPU_AGENT_ENDPOINT|AGENT_METRICS|DPU_NETNS|DPU_VETH|DPUS|SNAP_SOCKET_B|PLUGIN_SOCKET_B|PLUGIN_METRICS_B|DPU_AGENT_ENDPOINT_B|AGENT_METRICS_B|DPU_NETNS_B|DPU_VETH_B|GUEST_KERNEL|GUEST_ADDRESS|GUEST_EXEC|GUEST2_ADDRESS|GUEST2_EXEC'
# local_up_images PROFILE ARGS...: when ARGS (local-up's) hold --containers,
# builds the images of PROFILE's binaries now (hack/images.sh), so that no
# stack's start spends its 60 s on them.
local_up_images() {
  local profile=$1 arg
  shift
  for arg in "$@"; do
    if [ "$arg" = --containers ]; then
      ./hack/images.sh --profile "$profile" --no-build >/dev/null
      return
    fi
  done
}

local_up_start() {
  local out=$1 limit=600
  shift
  [[ " $* " == *" --host vm "* ]] && limit=3000
  # shellcheck disable=SC2086 # the keys are words separated by |
  unset ${LOCAL_UP_KEYS//|/ }
  # Made first, so that the wait below never looks before the stack has written.
  : >"$out/local-up.out"
  ./hack/local-up.sh --no-build "$@" >"$out/local-up.out" 2>"$out/local-up.err" &
  LOCAL_UP_PID=$!
  for _ in $(seq "$limit"); do
    grep -qx READY "$out/local-up.out" && break
    if ! kill -0 "$LOCAL_UP_PID" 2>/dev/null; then
      echo "$(basename "$0"): the stack did not come up:" >&2
      cat "$out/local-up.err" >&2
      return 1
    fi
    sleep 0.1
  done
  if ! grep -qx READY "$out/local-up.out"; then
    echo "$(basename "$0"): the stack did not come up in $((limit / 10)) s" >&2
    return 1
  fi
  set -a
  # shellcheck disable=SC1090
  . <(grep -E "^($LOCAL_UP_KEYS)=" "$out/local-up.out")
  set +a
}

# local_up_stop: stops the stack local_up_start started, if it still runs,
# and waits until it has taken everything down.
local_up_stop() {
  if [ -n "${LOCAL_UP_PID:-}" ] && kill -0 "$LOCAL_UP_PID" 2>/dev/null; then
    kill -TERM "$LOCAL_UP_PID"
    wait "$LOCAL_UP_PID" || true
  fi
}

# local_up_assert_clean STACK_DIR: after local_up_stop, fails unless the stack
# left no loop device, no mount and no directory behind, nor (split mode) its
# network namespaces or veth pairs (one per DPU), nor (--host vm) the guest
# or its tap.
local_up_assert_clean() {
  local stack=$1 left mounted link= netns address
  left=$( (losetup -a | grep -F "$stack") || true)
  mounted=$( (grep -F "$stack" /proc/self/mountinfo) || true)
  for netns in ${DPU_NETNS:-} ${DPU_NETNS_B:-}; do
    link+=$( (ip netns list | grep -wF "$netns") || true)
    # The pair's two ends are named after the namespace.
    link+=$( (ip -o link show | grep -F "$netns") || true)
  done
  for address in ${GUEST_ADDRESS:-} ${GUEST2_ADDRESS:-}; do
    link+=$( (ip -4 -o addr show to "$address/30") || true)
  done
  # Each guest's directory is $stack/guest or $stack/guest2.
  [ -n "${GUEST_ADDRESS:-}" ] && link+=$( (pgrep -af -- "--dir $stack/guest") || true)
  if [ -n "$left" ] || [ -n "$mounted" ] || [ -n "$link" ] || [ -e "$stack" ]; then
    echo "FAIL: left behind:" >&2
    printf '%s\n' "$left" "$mounted" "$link" >&2
    ls "$stack" >&2 2>/dev/null || true
    return 1
  fi
}
