#!/usr/bin/env bash
# The whole stack on one machine, on the SNAP emulator, in a fresh directory:
#
#   snap-emu (as the DPU's SNAP)          <- JSON-RPC <- sample plugin (plugins.v1 + CSI controller)
#   snap-emu --no-snap (NVMe-oF target)   <- JSON-RPC <- sample plugin's CSI controller (lvols, subsystems)
#   DIR/fs-share (btrfs on a loop file)   <- the controller's fs volumes (ext4 images, mounted), SNAP's fsdevs
#   snap-csi controller (proxy)           -> CSI     -> sample plugin's CSI controller
#   snap-csi node (co-located DPU attach) -> plugins.v1 -> sample plugin; JSON-RPC -> SNAP emulator
#   sample plugin's CSI controller        -> plugins.v1 -> every DPU's plugin (DeleteVolume: in use?)
#
# --mode split puts the DPU attach layer behind a link, as on a BlueField host:
#
#   snap-csi node --dpu-endpoint https://198.18.N.2:9830   (the host's network namespace)
#     | mutual TLS over a veth pair: 198.18.N.1/30 (host) <-> 198.18.N.2/30 (namespace snapcsi-ID)
#   snap-csi dpu-agent (in snapcsi-ID) -> plugins.v1 -> sample plugin; JSON-RPC -> SNAP emulator
#
# The agent runs in a network namespace of its own (entered with nsenter), joined
# to the host's by a veth pair on a /30 of the benchmarking range
# 198.18.0.0/15 (RFC 2544): 198.18.N.0/30, one that no address or route
# here touches, picked at random under a lock so that concurrent stacks
# differ. The plugin and the SNAP emulator stay in the host's namespace: the
# agent reaches them by UNIX socket (the filesystem is shared), as it does
# beside them on a DPU.
# A CA and two certificates are made fresh with openssl in the run's
# directory: the agent's names the DPU (local-dpu, serverAuth), the node's
# names the node (local-node, clientAuth).
#
# Prints CSI_CONTROLLER_ENDPOINT=, CSI_NODE_ENDPOINT=, KUBELET_DIR= (one per
# line; then NODE_METRICS=, CONTROLLER_METRICS= and PLUGIN_METRICS=, the
# Prometheus pages, and NVMF_TARGET_SOCKET= (the remote NVMe-oF target's
# JSON-RPC socket; it listens on two ports, every volume's two paths),
# NODE_STATE_DIR= (the node's --state-dir: its volume records); in
# split mode also DPU_AGENT_ENDPOINT=, AGENT_METRICS=,
# DPU_NETNS= (the agent's namespace, e.g. for nftables rules that break the
# link: `ip netns exec NAME nft ...`) and DPU_VETH= (the host's end of the
# pair)), then READY, and stays in the foreground. SIGINT or SIGTERM stops
# everything and removes what it created, the namespace and veth pair included.
#
# The sample plugin serves all three backends; --backend names the one a
# volume gets when its parameters name none (fs: filesystem volumes, which
# the emulated host mounts as virtio-fs).
#
# --fs-only runs the sample plugin as a file-storage vendor's would be: it
# makes filesystem devices only (--no-block-devices), as SNAP's NFS fsdevs of
# the share as an NFS server's export (--fs-nfs-server 127.0.0.1, the way
# DPF's plugin makes them; the emulator serves the export's directory), and
# its controller serves the fs backend alone (the default then).
#
# --second-host adds a second host (node service local-node-2 with its own
# kubelet directory, SNAP emulator and plugin, co-located in either mode;
# with --host vm a second guest, its node reaching its own agent here) over
# the same filesystem share, for a ReadWriteMany volume: it prints
# CSI_NODE2_ENDPOINT= and KUBELET2_DIR= as well (with --host vm
# GUEST2_ADDRESS= and GUEST2_EXEC= too).
#
# --dpus 2 makes the host one with two DPUs, as a server with two BlueFields
# is: a second SNAP emulator (--pci-domain 0001: its functions appear in the
# first's sysfs tree, in PCI domain 0001), a second sample plugin that serves
# plugins.v1 only, against it (the CSI controller stays the first plugin's,
# one for the cluster; the NVMe-oF target and the AIO pool, on this machine,
# serve both DPUs), in split mode a second agent in a second network
# namespace (its own veth pair and /30, and certificate naming local-dpu-b;
# the CA and the node's certificate are shared), and the node given both
# DPUs in DIR/node.toml (its `dpus`: local-dpu in PCI domain 0000 and
# local-dpu-b in 0001) instead of --dpu-name and the per-DPU flags. Their
# processes are snap-b, plugin-b and agent-b (--supervise: DIR/pids/NAME).
# It prints SNAP_SOCKET_B=, PLUGIN_SOCKET_B= and PLUGIN_METRICS_B= (the
# second plugin's page: its calls, a multipath volume's paths), and in split mode
# DPU_AGENT_ENDPOINT_B=, AGENT_METRICS_B=, DPU_NETNS_B= and DPU_VETH_B=
# (the second DPU's as above). DPUS= (comma-separated) names the DPUs in
# every run: DPUS=local-dpu, or DPUS=local-dpu,local-dpu-b. Not with
# --fs-only or --backend fs: the emulated host's virtio-fs devices are one
# emulator's (their sysfs entries and mounts), and the node has one
# --virtiofs-emulated-dir, so the second DPU's plugin makes no filesystem
# devices. --second-host stays a host with one DPU.
#
# Usage (as root): hack/local-up.sh [--mode colocated|split] [--backend aio|nvmf|fs] [--dir DIR]
#   [--profile release|debug] [--no-build] [--snap-poll-period-us N] [--snap-nvme-pfs N]
#   [--snap-nvme-vfs-per-pf N] [--snap-data-path auto|fuse|direct] [--allow-node-restart]
#   [--supervise] [--fs-only] [--second-host] [--containers] [--dpus 1|2] [--host local|vm]
#   [--dpu-arch amd64|arm64]
# The --snap-* options go to each DPU's SNAP emulator only (not the NVMe-oF
# target): its RPC poller period (8000 reproduces real SPDK's ~8 ms per
# sequential call), how many NVMe functions it offers (default 1 PF with 16
# VFs) and which exposures pass its FUSE data path (default auto: those with
# crypto or QoS limits; fuse: all; direct: none but crypto).
# --allow-node-restart keeps the stack up when the node service exits, so that
# a benchmark can restart it with the same flags (it then stops its
# replacement itself). --supervise restarts every process that exits (as
# kubelet restarts a crashed container: same command line, a short pause) and
# keeps the pid of each one running now in DIR/pids/NAME (NAME: target, snap,
# plugin, controller, agent, node; snap-b, plugin-b, agent-b), so that a chaos
# run can kill any of them;
# its log gains a line per restart. The pause before a restart is 0.2 s, or
# the seconds in DIR/pids/NAME.restart-delay when that file exists (read at
# each restart).
# --host vm makes the host a real Linux kernel (hack/lib/local-up-vm.sh):
# Debian's kernel under QEMU (KVM where it boots, else TCG), the node inside
# it, SNAP's functions hot-plugged into it (two NVMe PFs, three virtio-blk,
# virtio-fs devices as they are made), the agent here on the guest's link;
# split mode. CSI_NODE_ENDPOINT is then http://GUEST_ADDRESS:PORT (a
# forwarder in the guest, on the link only), KUBELET_DIR and NODE_STATE_DIR
# are the guest's (the same paths here hold nothing of theirs), and it also
# prints GUEST_KERNEL= (its uname -r),
# GUEST_ADDRESS= and GUEST_EXEC= (`snap-csi-guest exec --socket GUEST_EXEC
# SCRIPT` runs a script in the guest, as a pod would); no DPU_NETNS or
# DPU_VETH. Not with --containers, --supervise, --allow-node-restart or
# --dpus 2.
# --dpu-arch arm64 runs the DPU side (every sample plugin and, in split mode,
# every agent) as aarch64 processes, as on BlueField's Arm cores: cross-built
# (hack/cross-build.sh) and started by qemu-aarch64-static, with Debian's
# arm64 libc (libc6-arm64-cross) as their root for the loader and libraries.
# What they exec (mkfs.ext4, mount, losetup) is this machine's. qemu-user
# translates each instruction (startup and CPU-bound work several times
# slower) and maps system calls; it does not give a real Arm core's memory
# ordering or timing, nor BlueField's kernel. Not with --containers (the
# arm64 images are built and started by hack/images.sh) or --host vm.
# --containers runs every process that has an image (the sample plugin, the
# controller proxy, the node and, in split mode, the DPU agent; the second
# host's and the second DPU's too) from it with podman instead of the bare
# binary: the images hack/images.sh builds from this profile's binaries, each
# run with the privileges, capabilities, user, root filesystem, network and
# host mounts (/dev, /sys, their propagation) its container has in
# deploy/kubernetes, as deploy/tools/podman_spec.py derives them from the
# rendered manifests. The manifests' own host paths are replaced by this
# run's directories (bound at their own paths, so every flag here stays as it
# is, DIR/node.toml's paths too): the kubelet directory (made a shared mount
# first, as a kubelet host's is, so that the node's mounts reach the host),
# the node's state directory, and DIR itself for the sockets' directories;
# emptyDir volumes are DIR and Secrets DIR/tls. The pod network is the host's
# (there is no CNI here), and an agent's host network is its namespace. The
# SNAP emulators stay bare processes (SNAP has no image here). Containers are
# named snapcsi-ID-NAME and removed at the stop. Not with --supervise or
# --allow-node-restart (they restart and kill processes by pid). The
# manifests read are deploy/'s, or those of the copy of deploy/ that
# SNAP_CSI_DEPLOY names, and the images hack/images.sh's, or those
# SNAP_CSI_IMAGES names ("snap-csi=REF snap-csi-spdk-plugin=REF"): to try a
# change of either here.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

mode=colocated
backend=aio
dir=
profile=release
build=1
snap_args=()
allow_node_restart=0
supervise=0
second_host=0
fs_only=0
containers=0
dpus=1
host=local
dpu_arch=$(dpkg --print-architecture)
while (($#)); do
  case $1 in
    --mode) mode=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --profile) profile=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --snap-poll-period-us) snap_args+=(--poll-period-us "$2"); shift 2 ;;
    --snap-nvme-pfs) snap_args+=(--nvme-pfs "$2"); shift 2 ;;
    --snap-nvme-vfs-per-pf) snap_args+=(--nvme-vfs-per-pf "$2"); shift 2 ;;
    --snap-data-path) snap_args+=(--data-path "$2"); shift 2 ;;
    --allow-node-restart) allow_node_restart=1; shift ;;
    --supervise) supervise=1; shift ;;
    --second-host) second_host=1; shift ;;
    --fs-only) fs_only=1; backend=fs; shift ;;
    --containers) containers=1; shift ;;
    --dpus) dpus=$2; shift 2 ;;
    --host) host=$2; shift 2 ;;
    --dpu-arch) dpu_arch=$2; shift 2 ;;
    -h | --help) sed -n '/^set -euo/q; 2,$p' "$0"; exit 0 ;;
    *) echo "local-up: unknown argument $1" >&2; exit 2 ;;
  esac
done
case $mode in colocated | split) ;; *) echo "local-up: --mode must be colocated or split" >&2; exit 2 ;; esac
case $backend in aio | nvmf | fs) ;; *) echo "local-up: --backend must be aio, nvmf or fs" >&2; exit 2 ;; esac
case $profile in release | debug) ;; *) echo "local-up: --profile must be release or debug" >&2; exit 2 ;; esac
case $dpus in 1 | 2) ;; *) echo "local-up: --dpus must be 1 or 2" >&2; exit 2 ;; esac
case $host in local | vm) ;; *) echo "local-up: --host must be local or vm" >&2; exit 2 ;; esac
case $dpu_arch in amd64 | arm64) ;; *) echo "local-up: --dpu-arch must be amd64 or arm64" >&2; exit 2 ;; esac
cross=0
[ "$dpu_arch" != "$(dpkg --print-architecture)" ] && cross=1
if ((cross)) && { ((containers)) || [ "$host" = vm ]; }; then
  echo "local-up: --dpu-arch $dpu_arch runs bare processes on the emulated host" \
    "(not with --containers or --host vm)" >&2
  exit 2
fi
if [ "$host" = vm ]; then
  if ((containers || supervise || allow_node_restart || dpus == 2)); then
    echo "local-up: --host vm cannot be combined with --containers, --supervise," \
      "--allow-node-restart or --dpus 2" >&2
    exit 2
  fi
  mode=split
fi
if ((dpus == 2)) && [ "$backend" = fs ]; then
  echo "local-up: --dpus 2 cannot be combined with --fs-only or --backend fs (the emulated" \
    "host's virtio-fs devices are one emulator's; the node has one --virtiofs-emulated-dir)" >&2
  exit 2
fi
if ((containers)) && ((supervise || allow_node_restart)); then
  echo "local-up: --containers cannot be combined with --supervise or --allow-node-restart" \
    "(they restart and kill processes by pid; a container's is podman's)" >&2
  exit 2
fi

if ((build)); then
  ./hack/setup.sh >&2
  flag=()
  [ "$profile" = release ] && flag=(--release)
  cargo build "${flag[@]}" --locked --quiet -p snap-csi -p snap-emu -p snap-csi-spdk-plugin >&2
  [ "$host" = vm ] && cargo build "${flag[@]}" --locked --quiet -p snap-csi-harness --bin snap-csi-guest >&2
fi
bin=$repo/target/$profile
# The DPU side's binaries, and what starts them: this machine's, or with
# --dpu-arch another architecture's under qemu-user (rust-target.sh runner).
dpu_bin=$bin
dpu_exec=()
if ((cross)); then
  if ((build)); then
    dpu_bin=$(./hack/cross-build.sh --arch "$dpu_arch" --profile "$profile")
  else
    dpu_bin=$repo/target/$(TARGETARCH=$dpu_arch deploy/images/rust-target.sh triple)/$profile
  fi
  read -ra dpu_exec <<<"$(TARGETARCH=$dpu_arch deploy/images/rust-target.sh runner)"
  for program in snap-csi snap-csi-spdk-plugin; do
    [ -x "$dpu_bin/$program" ] || { echo "local-up: $dpu_bin/$program is missing (hack/cross-build.sh)" >&2; exit 1; }
  done
  command -v "${dpu_exec[0]}" >/dev/null || { echo "local-up: ${dpu_exec[0]} is missing (hack/setup.sh)" >&2; exit 1; }
fi
# shellcheck source=hack/lib/local-up-vm.sh
. "$repo/hack/lib/local-up-vm.sh"

# --containers: the images of these binaries (built unless their tags exist),
# and the tool that reads each container's flags from the manifests.
declare -A images=()
if ((containers)); then
  export CONTAINERS_CONF=${CONTAINERS_CONF:-$repo/hack/containers.conf}
  spec_python=$repo/target/deploy-tools/venv/bin/python
  spec_deploy=$(cd "${SNAP_CSI_DEPLOY:-$repo/deploy}" && pwd)
  if [ ! -x "$spec_python" ] || [ ! -x "$repo/target/deploy-tools/venv/bin/kubectl" ]; then
    echo "local-up: --containers needs target/deploy-tools/venv (hack/setup.sh)" >&2
    exit 1
  fi
  if [ -n "${SNAP_CSI_IMAGES:-}" ]; then
    images_out=$(tr ' ' '\n' <<<"$SNAP_CSI_IMAGES")
  else
    images_out=$(./hack/images.sh --profile "$profile" --no-build) || {
      echo "local-up: hack/images.sh --profile $profile --no-build failed" >&2
      exit 1
    }
  fi
  while read -r line _; do
    images[${line%%=*}]=${line#*=}
  done <<<"$images_out"
  for name in snap-csi snap-csi-spdk-plugin; do
    [ -n "${images[$name]:-}" ] || { echo "local-up: hack/images.sh printed no $name image" >&2; exit 1; }
  done
fi

if [ -z "$dir" ]; then
  # --host vm: where the guest sees it (vm_visible).
  if [ "$host" = vm ]; then
    mkdir -p "$repo/target"
    dir=$(mktemp -d "$repo/target/local-up-vm.XXXXXX")
  else
    dir=$(mktemp -d /tmp/snap-csi-local.XXXXXX)
  fi
else
  mkdir -p "$dir"
fi
dir=$(cd "$dir" && pwd)
if [ "$host" = vm ]; then
  vm_visible "$dir" && vm_visible "$bin" || exit 2
fi
kubelet=$dir/kubelet
mkdir -p "$kubelet" "$dir/logs" "$dir/aio-pool"

pids=()
# Split mode's network namespaces and the host's ends of their veth pairs
# (one per DPU), for the cleanup.
netnss=()
veths=()
# --containers: this run's containers (snapcsi-ID-NAME) and the kubelet
# directories made shared mounts (bound onto themselves).
cid=
((containers)) && cid=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
run_containers=()
shared_dirs=()
cleanup() {
  trap - INT TERM EXIT
  # Best effort from here on: one failed step must not skip the rest.
  set +e
  [ "$host" = vm ] && vm_save_log
  # Stop in reverse order of start, each gracefully: the node and the
  # emulators take their mounts and loop devices down themselves.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
  # podman run passed the TERM on to its container and removes it when it
  # exits (--rm); whatever is still there (podman killed before it could)
  # goes by name.
  for ((i = ${#run_containers[@]} - 1; i >= 0; i--)); do
    if podman container exists "${run_containers[i]}" 2>/dev/null; then
      podman stop --time 10 "${run_containers[i]}" >/dev/null 2>&1
      podman rm --force "${run_containers[i]}" >/dev/null 2>&1
    fi
  done
  # Deleting a namespace deletes the veth end in it, and with it the pair;
  # the host's end goes by name in case the pair never reached the namespace.
  for n in "${netnss[@]}"; do ip netns delete "$n" 2>/dev/null; done
  for n in "${veths[@]}"; do ip link delete "$n" 2>/dev/null; done
  # Whatever a consumer left mounted under our kubelet directory.
  grep -o " ${kubelet}2\?/[^ ]*" /proc/self/mountinfo | sort -r | while read -r m; do
    umount -l "$m"
  done
  # The kubelet directories' binds onto themselves (as many as a container
  # left stacked there).
  for m in "${shared_dirs[@]}"; do
    while mountpoint -q "$m"; do umount -l "$m" || break; done
  done
  # The share with the volumes the controller mounted in it; their loop
  # devices, and the share's, go with their mounts (autoclear).
  mountpoint -q "$dir/fs-share" && umount -R "$dir/fs-share"
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start NAME COMMAND...: runs it in the background, logging to logs/NAME.log
# (with --supervise, under supervised).
start() {
  local name=$1
  shift
  if ((supervise)); then
    supervised "$name" "$@" &
  else
    "$@" >"$dir/logs/$name.log" 2>&1 &
  fi
  pids+=($!)
}

# run NAME COMPONENT SPEC-ARGS... -- PROGRAM ARGS...: starts PROGRAM (snap-csi
# or snap-csi-spdk-plugin) with ARGS, as start does: this profile's binary,
# or with --containers its image in container snapcsi-ID-NAME, run with the
# flags deploy/tools/podman_spec.py derives from COMPONENT's manifest
# (SPEC-ARGS: its --mode, --map and --host-network; --also FLAG adds a podman
# flag of this machine's that no manifest can give: the emulator's stand-in
# for a kernel device). Volumes without a host path are this run's: emptyDir
# DIR, Secrets (the link's TLS files) DIR/tls.
run() {
  local name=$1 component=$2 spec=() also=() program volume kind _ out flags=() container
  shift 2
  while [ "$1" != -- ]; do
    if [ "$1" = --also ]; then also+=("$2"); shift 2; else spec+=("$1"); shift; fi
  done
  shift
  program=$1
  shift
  if ! ((containers)); then
    case $component in
      plugin | agent) start "$name" "${dpu_exec[@]}" "$dpu_bin/$program" "$@" ;;
      *) start "$name" "$bin/$program" "$@" ;;
    esac
    return
  fi
  spec+=(--deploy "$spec_deploy")
  out=$("$spec_python" deploy/tools/podman_spec.py "$component" "${spec[@]}" --volumes) ||
    gave_up "deploy/tools/podman_spec.py $component failed"
  while read -r volume kind _; do
    [ -n "$volume" ] || continue
    case $kind in
      secret | projected) spec+=(--map "$volume=$dir/tls") ;;
      *) spec+=(--map "$volume=$dir") ;;
    esac
  done <<<"$out"
  # No CNI here: the pod network is the host's.
  out=$("$spec_python" deploy/tools/podman_spec.py "$component" "${spec[@]}" --pod-network host) ||
    gave_up "deploy/tools/podman_spec.py $component failed"
  mapfile -t flags <<<"$out"
  flags+=("${also[@]}")
  container=snapcsi-$cid-$name
  run_containers+=("$container")
  echo "podman run --rm --name $container ${flags[*]} ${images[$program]} $*" >"$dir/logs/$name.podman"
  start "$name" podman run --rm --name "$container" --env RUST_LOG --env RUST_BACKTRACE \
    "${flags[@]}" "${images[$program]}" "$@"
}

# share_dir DIR: with --containers, DIR becomes a shared mount (bound onto
# itself), as a kubelet host's /var/lib/kubelet is: what the node mounts
# below it in its container (Bidirectional) then reaches the host.
share_dir() {
  ((containers)) || return 0
  mount --bind "$1" "$1" && shared_dirs+=("$1") && mount --make-rshared "$1" ||
    gave_up "could not make $1 a shared mount"
}

# supervised NAME COMMAND...: runs COMMAND again whenever it exits, its pid in
# pids/NAME, until SIGTERM, which it passes on to COMMAND and waits for.
supervised() {
  local name=$1 child= stopping=0 pause
  shift
  mkdir -p "$dir/pids"
  trap 'stopping=1; [ -n "$child" ] && kill -TERM "$child" 2>/dev/null' TERM
  while :; do
    "$@" >>"$dir/logs/$name.log" 2>&1 &
    child=$!
    echo "$child" >"$dir/pids/$name.new"
    mv "$dir/pids/$name.new" "$dir/pids/$name"
    ((stopping)) && kill -TERM "$child" 2>/dev/null
    # A trapped signal ends wait early: wait again until the child is gone.
    while kill -0 "$child" 2>/dev/null; do wait "$child" || true; done
    ((stopping)) && exit 0
    # The pause before the restart: 0.2 s, or what pids/NAME.restart-delay
    # says (seconds; a chaos run varies when a successor arrives).
    pause=0.2
    [ -f "$dir/pids/$name.restart-delay" ] && pause=$(<"$dir/pids/$name.restart-delay")
    echo "local-up: $name exited; restarting it in $pause s" >>"$dir/logs/$name.log"
    sleep "$pause"
  done
}

# gave_up WHAT: the stack cannot come up; says why with the logs' tails.
gave_up() {
  echo "local-up: $1; logs in $dir/logs" >&2
  tail -n 20 "$dir"/logs/*.log >&2 || true
  exit 1
}

# wait_for_socket PATH: until something answers there (or the process died).
wait_for_socket() {
  for _ in $(seq 1000); do
    [ -S "$1" ] && return 0
    sleep 0.01
  done
  gave_up "nothing listens on $1"
}

# wait_for_tcp HOST PORT: until something accepts connections there.
wait_for_tcp() {
  for _ in $(seq 1000); do
    (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && return 0
    sleep 0.01
  done
  gave_up "nothing listens on $1:$2"
}

rpc() { "$bin/snap-csi" rpc -s "$1" "${@:2}" >/dev/null; }

# free_port VAR: sets VAR to a loopback TCP port nobody listens on now and
# that this run has not handed out yet. Below the kernel's ephemeral range
# (32768-60999 by default), so no outgoing connection can take it between
# this check and the bind (one did, while the bench restarted a node). Not
# called in a subshell ($(...)): the ports handed out must be remembered
# here (in one they were not, and the plugin's metrics once took the
# NVMe-oF target's second listener's port).
picked_ports=" "
free_port() {
  local candidate
  for _ in $(seq 100); do
    candidate=$(shuf -i 20000-32000 -n 1)
    [[ $picked_ports == *" $candidate "* ]] && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then
      picked_ports+="$candidate "
      printf -v "$1" %s "$candidate"
      return 0
    fi
  done
  echo "local-up: no free port found" >&2
  exit 1
}

# Split mode's link (one per DPU): a namespace and a veth pair on a /30 of
# 198.18.0.0/15 that no address or route of this machine overlaps. The pick
# and the creation happen under a lock, so that two stacks starting together
# take different subnets (and a second DPU's link another than the first's);
# the lock is released before any process starts, so none inherits it. Sets
# netns, veth and subnet (198.18.N).
link_up() {
  local id n lock
  id=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
  netns=snapcsi-$id
  # Interface names have at most 15 characters.
  veth=snapcsi-${id}h
  netnss+=("$netns")
  veths+=("$veth")
  mkdir -p /run/lock
  exec {lock}>/run/lock/snap-csi-local-up.lock
  flock "$lock"
  for n in $(shuf -i 0-255); do
    subnet=198.18.$n
    if [ -z "$(ip -4 -o addr show to "$subnet.0/30")" ] &&
       [ -z "$(ip -4 route show root "$subnet.0/30")" ] &&
       ! ip -4 route show match "$subnet.0/30" | grep -qv '^default '; then
      break
    fi
    subnet=
  done
  if [ -z "$subnet" ]; then
    exec {lock}>&-
    echo "local-up: every /30 of 198.18.0.0/24..198.18.255.0/24 is in use here" >&2
    exit 1
  fi
  ip netns add "$netns"
  ip link add "$veth" type veth peer name "snapcsi-${id}d"
  ip link set "snapcsi-${id}d" netns "$netns"
  ip addr add "$subnet.1/30" dev "$veth"
  ip link set "$veth" up
  ip -n "$netns" addr add "$subnet.2/30" dev "snapcsi-${id}d"
  ip -n "$netns" link set "snapcsi-${id}d" up
  ip -n "$netns" link set lo up
  exec {lock}>&-
}

# Split mode's certificates, fresh for this run: a CA (P-256), the agent's
# certificate naming the DPU for serverAuth (with --dpus 2 also agent-b's,
# naming the second), the node's naming the node for clientAuth (with
# --host vm --second-host also the second host's agent's and node's). Keys
# are readable by root only.
make_certificates() {
  local tls=$dir/tls role name usage roles=(agent:local-dpu:serverAuth node:local-node:clientAuth)
  ((dpus == 2)) && roles+=(agent-b:local-dpu-b:serverAuth)
  [ "$host" = vm ] && ((second_host)) &&
    roles+=(agent2:local-dpu-2:serverAuth node2:local-node-2:clientAuth)
  mkdir -m 700 "$tls"
  (
    umask 077
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 7 \
      -subj "/CN=local-up CA ${netns:-$GUEST_ADDRESS}" -keyout "$tls/ca.key" -out "$tls/ca.crt" \
      -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
    for role in "${roles[@]}"; do
      IFS=: read -r role name usage <<<"$role"
      openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -subj "/CN=$name" -keyout "$tls/$role.key" -out "$tls/$role.csr"
      openssl x509 -req -in "$tls/$role.csr" -CA "$tls/ca.crt" -CAkey "$tls/ca.key" \
        -set_serial "0x$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')" -days 7 -out "$tls/$role.crt" \
        -extfile <(printf '%s\n' "subjectAltName=DNS:$name" "extendedKeyUsage=$usage" \
          basicConstraints=critical,CA:FALSE keyUsage=critical,digitalSignature)
      rm "$tls/$role.csr"
    done
  ) 2>"$dir/logs/openssl.log" || gave_up "openssl could not make the certificates"
}

if [ "$host" = vm ]; then
  # The guest's link is its tap: the agent listens on this machine's end.
  # Booted first, so that it goes last, after SNAP unplugged from it.
  vm_boot guest local-node GUEST
  ((second_host)) && vm_boot guest2 local-node-2 GUEST2
  netns= veth=
  agent_listen=$GUEST_LINK:9830
  agent_metrics=$GUEST_LINK:9831
  make_certificates
elif [ "$mode" = split ]; then
  # The agents' namespaces are fresh and their own: the deployment's default
  # ports are free there. (The second DPU's link first: link_up sets netns,
  # veth and subnet, and the first DPU's stay in them.)
  if ((dpus == 2)); then
    link_up
    netns_b=$netns veth_b=$veth
    agent_b_listen=$subnet.2:9830
    agent_b_metrics=$subnet.2:9831
  fi
  link_up
  agent_listen=$subnet.2:9830
  agent_metrics=$subnet.2:9831
  make_certificates
fi

# The remote NVMe-oF target: a plain SPDK with a pool and an lvstore. Its
# pool is in its start-up configuration, as a real target's would be: a
# restarted target (--supervise) makes the pool again and finds its lvstore
# on it; the controller exports its volumes again.
truncate -s 8G "$dir/target-pool.img"
cat >"$dir/target.json" <<EOF
{"subsystems": [{"subsystem": "bdev", "config": [
  {"method": "bdev_aio_create",
   "params": {"name": "pool0", "filename": "$dir/target-pool.img", "block_size": 4096}}
]}]}
EOF
start target "$bin/snap-emu" --no-snap --socket "$dir/target.sock" --state-dir "$dir/target" \
  --json "$dir/target.json"
wait_for_socket "$dir/target.sock"
rpc "$dir/target.sock" bdev_lvol_create_lvstore '{"bdev_name":"pool0","lvs_name":"lvs0"}'
# Two listeners: every NVMe-oF volume the controller exports is reachable on
# both, and one asked for with nvmf-multipath is attached through both.
free_port port
free_port port2
free_port node_metrics_port
free_port controller_metrics_port
free_port plugin_metrics_port
node_metrics=127.0.0.1:$node_metrics_port
controller_metrics=127.0.0.1:$controller_metrics_port
plugin_metrics=127.0.0.1:$plugin_metrics_port

# The filesystem share: each of the controller's fs volumes is an ext4
# image in it, mounted on the volume's directory there, which SNAP's fsdevs
# serve (docs/operator-guide.md: Filesystem devices); btrfs for its reflinks (snapshots and
# clones). --containers: shared, so the controller's mounts in its
# container reach the emulator.
truncate -s 2G "$dir/fs-share.img"
mkdir "$dir/fs-share"
mkfs.btrfs -q "$dir/fs-share.img" >"$dir/logs/fs-share.log" 2>&1 &&
  mount -o loop "$dir/fs-share.img" "$dir/fs-share" &&
  { ! ((containers)) || mount --make-rshared "$dir/fs-share"; } ||
  gave_up "could not make the filesystem share (btrfs on a loop file)"

# SNAP's start-up configuration, every SNAP's here as a BlueField's:
# bdev_nvme's options, which SPDK takes only before any controller exists.
# transport_ack_timeout is the sample plugin's TRANSPORT_ACK_TIMEOUT
# (vendor-plugins/spdk/src/paths.rs says why 8): a path gone silent is
# given up and its I/O failed over.
cat >"$dir/snap.json" <<EOF
{"subsystems": [{"subsystem": "bdev", "config": [
  {"method": "bdev_nvme_set_options", "params": {"transport_ack_timeout": 8}}
]}]}
EOF
snap_args+=(--json "$dir/snap.json")

# The DPU's SNAP (--host vm: hot-plugging into the guest).
vm_snap=()
[ "$host" = vm ] && vm_snap_args "$GUEST_QMP" "$GUEST_PORTS"
start snap "$bin/snap-emu" --socket "$dir/snap.sock" --state-dir "$dir/snap" "${snap_args[@]}" \
  "${vm_snap[@]}"
wait_for_socket "$dir/snap.sock"

# The sample vendor plugin: plugins.v1 toward the node, CSI toward the proxy.
# (--containers: the manifests' host paths, each this run's directory; the
# node's its own state directory and kubelet directory, made shared.)
dpu_maps=(--require-mapped --pass /dev --pass /sys --map "/var/lib/nvidia/storage/snap=$dir")
node_maps=("${dpu_maps[@]}" --map "/var/lib/kubelet/plugins/csi.snap-csi.io=$dir")
# (The second host's plugin serves devices only: the flags of their kind.)
block_devices=()
if ((fs_only)); then
  devices=(--no-block-devices --fs-nfs-server 127.0.0.1)
  block_devices=("${devices[@]}")
else
  devices=(
    --aio-pool-dir "$dir/aio-pool"
    --nvmf-target-socket "$dir/target.sock"
    --nvmf-lvstore lvs0
    --nvmf-listen "127.0.0.1:$port"
    --nvmf-listen "127.0.0.1:$port2"
  )
fi
# This plugin is the vendor's CSI controller and a DPU's plugin in one, run
# as the DPU plugin's container (component plugin), which neither mounts nor
# is privileged; the controller's fs backend mounts a loop device per volume
# (mount, chattr, fsfreeze, resize2fs) in the share, so it gets what the
# vendor container has in controller/deployment.yaml: privileged, the share
# bound rshared (Bidirectional there): the mounts must reach SNAP
# (deploy/README.md, "The manifests' containers on one machine").
fs_cap=(--also --privileged --also "--volume=$dir/fs-share:$dir/fs-share:rshared")
# DeleteVolume refuses a volume a DPU still serves: the controller asks every
# DPU's plugin this run starts, each under the name the node gives that DPU
# (this one's; --dpus 2: plugin-b's; --second-host: plugin2's, all started
# below: the controller connects at its first DeleteVolume). --containers:
# their sockets are in DIR, which dpu_maps maps.
dpu_plugins=(--dpu-plugin "local-dpu=$dir/plugin.sock")
((dpus == 2)) && dpu_plugins+=(--dpu-plugin "local-dpu-b=$dir/plugin-b.sock")
((second_host)) && dpu_plugins+=(--dpu-plugin "local-dpu-2=$dir/plugin2.sock")
run plugin plugin "${dpu_maps[@]}" "${fs_cap[@]}" -- snap-csi-spdk-plugin \
  --plugin-socket "$dir/plugin.sock" \
  --spdk-socket "$dir/snap.sock" \
  --csi-socket "$dir/vendor-csi.sock" \
  --state-dir "$dir/plugin-state" \
  "${devices[@]}" \
  --fs-share "$dir/fs-share" \
  --default-backend "$backend" \
  "${dpu_plugins[@]}" \
  --metrics-address "$plugin_metrics"
wait_for_socket "$dir/plugin.sock"
wait_for_socket "$dir/vendor-csi.sock"

run controller controller "${dpu_maps[@]}" -- snap-csi controller \
  --endpoint "$dir/controller.sock" \
  --vendor-endpoint "unix://$dir/vendor-csi.sock" \
  --metrics-address "$controller_metrics"
wait_for_socket "$dir/controller.sock"

# The second DPU (--dpus 2): its SNAP, whose functions appear in the first's
# sysfs tree in PCI domain 0001, as a second BlueField's do on one host, and
# its plugin, plugins.v1 only: no second CSI controller (the first serves the
# cluster), and no filesystem devices (see --dpus above). The AIO pool's
# files and the NVMe-oF target are this machine's, which both DPUs reach.
if ((dpus == 2)); then
  start snap-b "$bin/snap-emu" --socket "$dir/snap-b.sock" --state-dir "$dir/snap-b" \
    --sysfs-root "$dir/snap/sysfs" --pci-domain 0001 "${snap_args[@]}"
  wait_for_socket "$dir/snap-b.sock"
  free_port plugin_b_metrics_port
  plugin_b_metrics=127.0.0.1:$plugin_b_metrics_port
  run plugin-b plugin "${dpu_maps[@]}" -- snap-csi-spdk-plugin \
    --plugin-socket "$dir/plugin-b.sock" \
    --spdk-socket "$dir/snap-b.sock" \
    --state-dir "$dir/plugin-b-state" \
    --metrics-address "$plugin_b_metrics"
  wait_for_socket "$dir/plugin-b.sock"
fi

# start_agent NAME NETNS LISTEN METRICS CERT PLUGIN-SOCKET SNAP-SOCKET: a DPU
# agent in namespace NETNS serving on LISTEN and METRICS (ADDR:PORT) with
# DIR/tls/CERT.{crt,key}, in front of that DPU's plugin and SNAP. nsenter
# --net, not `ip netns exec`: that also gives the agent a mount namespace of
# its own, a copy of the host's mounts when it starts. Where / is private (no
# propagation), a restarted agent's copy then holds the filesystem of every
# volume staged at that moment: the host's unstage cannot release the
# device, and an xfs volume restaged on its new device is refused as a
# duplicate UUID (found by hack/chaos.sh).
start_agent() {
  local name=$1 ns=$2 listen=$3 metrics=$4 cert=$5 args
  args=(
    --listen "https://$listen"
    --host-name "${8:-local-node}"
    --tls-cert "$dir/tls/$cert.crt"
    --tls-key "$dir/tls/$cert.key"
    --tls-ca "$dir/tls/ca.crt"
    --plugin-socket "$6"
    --snap-socket-template "$7"
    --metrics-address "$metrics"
  )
  if ((containers)); then
    # The manifest's hostNetwork is the DPU's own network: the namespace.
    run "$name" agent "${dpu_maps[@]}" --host-network "ns:/run/netns/$ns" -- snap-csi dpu-agent "${args[@]}"
  elif [ -z "$ns" ]; then
    # --host vm: this machine is the DPU, the guest's link its own.
    start "$name" "$bin/snap-csi" dpu-agent "${args[@]}"
  else
    start "$name" nsenter --net="/run/netns/$ns" "${dpu_exec[@]}" "$dpu_bin/snap-csi" dpu-agent "${args[@]}"
  fi
  # From the host's namespace, across the link, as the node will.
  wait_for_tcp "${listen%:*}" "${listen#*:}"
  wait_for_tcp "${metrics%:*}" "${metrics#*:}"
}

# toml_string TEXT: TEXT as a TOML basic string.
toml_string() {
  local text=${1//\\/\\\\}
  printf '"%s"' "${text//\"/\\\"}"
}

# How the node reaches the DPU attach layer: one DPU by flags; two by the
# config file's `dpus` (the node refuses --dpu-name and --dpu-endpoint then),
# each in its PCI domain, reached by its sockets or its agent.
dpu_name=(--dpu-name local-dpu)
if [ "$mode" = split ]; then
  start_agent agent "$netns" "$agent_listen" "$agent_metrics" agent "$dir/plugin.sock" "$dir/snap.sock"
  dpu=(
    --dpu-endpoint "https://$agent_listen"
    --dpu-tls-cert "$dir/tls/node.crt"
    --dpu-tls-key "$dir/tls/node.key"
    --dpu-tls-ca "$dir/tls/ca.crt"
  )
  if ((dpus == 2)); then
    start_agent agent-b "$netns_b" "$agent_b_listen" "$agent_b_metrics" agent-b \
      "$dir/plugin-b.sock" "$dir/snap-b.sock"
    cat >"$dir/node.toml" <<EOF
[[dpus]]
name = "local-dpu"
pci_domain = "0000"
endpoint = $(toml_string "https://$agent_listen")
[[dpus]]
name = "local-dpu-b"
pci_domain = "0001"
endpoint = $(toml_string "https://$agent_b_listen")
EOF
    # The TLS files stay flags: both links' (the CA and the node's certificate).
    dpu=(--config "$dir/node.toml" "${dpu[@]:2}")
    dpu_name=()
  fi
else
  dpu=(--plugin-socket "$dir/plugin.sock" --snap-socket-template "$dir/snap.sock")
  if ((dpus == 2)); then
    cat >"$dir/node.toml" <<EOF
[[dpus]]
name = "local-dpu"
pci_domain = "0000"
plugin_socket = $(toml_string "$dir/plugin.sock")
snap_socket_template = $(toml_string "$dir/snap.sock")
[[dpus]]
name = "local-dpu-b"
pci_domain = "0001"
plugin_socket = $(toml_string "$dir/plugin-b.sock")
snap_socket_template = $(toml_string "$dir/snap-b.sock")
EOF
    dpu=(--config "$dir/node.toml")
    dpu_name=()
  fi
fi

# The emulated host sees a new function within milliseconds: a stage whose
# attach SNAP lost (it restarted empty just after answering) gives up waiting
# for the device after 5 s, not the 30 s a real host's hot-plug may need,
# and kubelet's retry attaches it again.
# (--containers: the emulated host's virtio-fs mounts, which the emulator
# makes as a host's kernel would when a device is hot-plugged, reach the
# node's container as a kernel's device would: the emulator's directory for
# them is a shared mount, seen by the node HostToContainer. No manifest
# names it: on a real host they are devices, not a directory.)
# virtiofs_mounts DIR: sets virtiofs to run's SPEC-ARGS for that.
virtiofs=()
virtiofs_mounts() {
  ((containers)) || return 0
  mkdir -p "$1"
  share_dir "$1"
  virtiofs=(--also --mount --also "type=bind,src=$1,dst=$1,bind-propagation=rslave")
}
if ((containers)); then
  mkdir -p "$dir/node-state"
  share_dir "$kubelet"
fi
virtiofs_mounts "$dir/snap/host/virtiofs"
if [ "$host" = vm ]; then
  free_port node_metrics_port
  node_metrics=$GUEST_ADDRESS:$node_metrics_port
  vm_node "$GUEST_EXEC" "$GUEST_ADDRESS" local-node "$kubelet" "$dir/node-state" \
    "${dpu[@]}" "${dpu_name[@]}" --metrics-address "$node_metrics"
  node_endpoint=http://$GUEST_ADDRESS:$vm_csi_port
  node_pid=
else
  run node node --mode "$mode" "${node_maps[@]}" --map "/var/lib/kubelet=$kubelet" \
    --map "/var/lib/snap-csi=$dir/node-state" "${virtiofs[@]}" -- snap-csi node \
    --endpoint "$dir/node.sock" \
    --device-wait 5 \
    --node-id local-node \
    --kubelet-dir "$kubelet" \
    --state-dir "$dir/node-state" \
    --sysfs-root "$dir/snap/sysfs" \
    --virtiofs-emulated-dir "$dir/snap/host/virtiofs" \
    "${dpu[@]}" \
    "${dpu_name[@]}" \
    --metrics-address "$node_metrics"
  wait_for_socket "$dir/node.sock"
  node_pid=${pids[-1]}
fi

# The second host: its own SNAP (own functions and sysfs tree), plugin and
# node, its DPU co-located; the volumes' data (the share, the pools) is the
# one machine's. With --host vm the second guest, its DPU split as the
# first's: SNAP hot-plugging into it, and an agent here on its link.
if ((second_host)); then
  mkdir -p "${kubelet}2"
  vm_snap=()
  [ "$host" = vm ] && vm_snap_args "$GUEST2_QMP" "$GUEST2_PORTS"
  start snap2 "$bin/snap-emu" --socket "$dir/snap2.sock" --state-dir "$dir/snap2" "${snap_args[@]}" \
    "${vm_snap[@]}"
  wait_for_socket "$dir/snap2.sock"
  run plugin2 plugin "${dpu_maps[@]}" "${fs_cap[@]}" -- snap-csi-spdk-plugin \
    --plugin-socket "$dir/plugin2.sock" \
    --spdk-socket "$dir/snap2.sock" \
    --state-dir "$dir/plugin2-state" \
    "${block_devices[@]}" \
    --fs-share "$dir/fs-share"
  wait_for_socket "$dir/plugin2.sock"
fi
if ((second_host)) && [ "$host" = vm ]; then
  start_agent agent2 "" "$GUEST2_LINK:9830" "$GUEST2_LINK:9831" agent2 "$dir/plugin2.sock" \
    "$dir/snap2.sock" local-node-2
  vm_node "$GUEST2_EXEC" "$GUEST2_ADDRESS" local-node-2 "${kubelet}2" "$dir/node2-state" \
    --dpu-endpoint "https://$GUEST2_LINK:9830" --dpu-name local-dpu-2 \
    --dpu-tls-cert "$dir/tls/node2.crt" --dpu-tls-key "$dir/tls/node2.key" \
    --dpu-tls-ca "$dir/tls/ca.crt"
  node2_endpoint=http://$GUEST2_ADDRESS:$vm_csi_port
elif ((second_host)); then
  if ((containers)); then
    mkdir -p "$dir/node2-state"
    share_dir "${kubelet}2"
  fi
  virtiofs_mounts "$dir/snap2/host/virtiofs"
  run node2 node "${node_maps[@]}" --map "/var/lib/kubelet=${kubelet}2" \
    --map "/var/lib/snap-csi=$dir/node2-state" "${virtiofs[@]}" -- snap-csi node \
    --endpoint "$dir/node2.sock" \
    --device-wait 5 \
    --node-id local-node-2 \
    --kubelet-dir "${kubelet}2" \
    --state-dir "$dir/node2-state" \
    --sysfs-root "$dir/snap2/sysfs" \
    --virtiofs-emulated-dir "$dir/snap2/host/virtiofs" \
    --plugin-socket "$dir/plugin2.sock" \
    --snap-socket-template "$dir/snap2.sock" \
    --dpu-name local-dpu-2
  wait_for_socket "$dir/node2.sock"
  node2_endpoint=unix://$dir/node2.sock
fi

echo "CSI_CONTROLLER_ENDPOINT=unix://$dir/controller.sock"
if [ "$host" = vm ]; then
  echo "CSI_NODE_ENDPOINT=$node_endpoint"
  echo "GUEST_KERNEL=$GUEST_KERNEL"
  echo "GUEST_ADDRESS=$GUEST_ADDRESS"
  echo "GUEST_EXEC=$GUEST_EXEC"
else
  echo "CSI_NODE_ENDPOINT=unix://$dir/node.sock"
fi
echo "KUBELET_DIR=$kubelet"
echo "NODE_STATE_DIR=$dir/node-state"
echo "NODE_METRICS=http://$node_metrics/metrics"
echo "CONTROLLER_METRICS=http://$controller_metrics/metrics"
echo "PLUGIN_METRICS=http://$plugin_metrics/metrics"
echo "NVMF_TARGET_SOCKET=$dir/target.sock"
if [ "$mode" = split ]; then
  echo "DPU_AGENT_ENDPOINT=https://$agent_listen"
  echo "AGENT_METRICS=http://$agent_metrics/metrics"
  if [ "$host" = local ]; then
    echo "DPU_NETNS=$netns"
    echo "DPU_VETH=$veth"
  fi
fi
if ((dpus == 2)); then
  echo "DPUS=local-dpu,local-dpu-b"
  echo "SNAP_SOCKET_B=$dir/snap-b.sock"
  echo "PLUGIN_SOCKET_B=$dir/plugin-b.sock"
  echo "PLUGIN_METRICS_B=http://$plugin_b_metrics/metrics"
  if [ "$mode" = split ]; then
    echo "DPU_AGENT_ENDPOINT_B=https://$agent_b_listen"
    echo "AGENT_METRICS_B=http://$agent_b_metrics/metrics"
    echo "DPU_NETNS_B=$netns_b"
    echo "DPU_VETH_B=$veth_b"
  fi
else
  echo "DPUS=local-dpu"
fi
if ((second_host)); then
  echo "CSI_NODE2_ENDPOINT=$node2_endpoint"
  echo "KUBELET2_DIR=${kubelet}2"
  if [ "$host" = vm ]; then
    echo "GUEST2_ADDRESS=$GUEST2_ADDRESS"
    echo "GUEST2_EXEC=$GUEST2_EXEC"
  fi
fi
echo "READY"

# Stay up until told to stop, or until a part dies (then stop the rest). With
# --allow-node-restart the node is not watched: it may exit and be replaced.
watched=()
for pid in "${pids[@]}"; do
  ((allow_node_restart)) && [ "$pid" = "$node_pid" ] && continue
  watched+=("$pid")
done
wait -n "${watched[@]}" || true
echo "local-up: a process exited; stopping (logs were in $dir/logs)" >&2
tail -n 20 "$dir"/logs/*.log >&2 || true
exit 1
