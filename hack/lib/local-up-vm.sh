# shellcheck shell=bash
# hack/local-up.sh --host vm: the host is a QEMU guest running Debian's own
# kernel (hack/guest/), booted by snap-csi-guest (hack/harness/src/bin), as a
# BlueField's host is a machine of its own: the node runs inside it, SNAP's
# emulator hot-plugs its functions into it through QMP (snap-emu
# --guest-qmp), and the DPU agent here serves it over the guest's link (a
# tap on a /30 of 198.19.0.0/16) with mutual TLS. Sourced by local-up.sh,
# which defines start, gave_up, wait_for_tcp, free_port and the variables
# used here.
#
# The guest sees this machine's / read-only, so the binaries and the TLS
# files are the same paths there. Kubelet's directory and the node's state
# directory are the guest's own, a tmpfs each (gone with the guest), mounted
# at the paths of DIR/kubelet and DIR/node-state: a path a client names is
# the same on both sides, and what it makes here (a player's directories)
# stays in DIR. CSI reaches the node's socket through
# hack/guest/uds-forward.py in the guest, listening on the link only.
#
# --second-host boots a second guest (GUEST2_*), a host of its own with its
# own DPU side here: SNAP, plugin and agent, as on the first.

vm_node_dir=/run/snap-csi

# vm_visible PATH: fails, saying why, unless the guest sees PATH: it has
# this machine's / read-only, but its own /tmp, /var, /run and /root.
vm_visible() {
  case $1/ in
    /tmp/* | /var/* | /run/* | /root/*)
      echo "local-up: --host vm: the guest has its own /tmp, /var, /run and /root, so it" \
        "cannot see $1: use a directory (--dir) and a checkout elsewhere" >&2
      return 1
      ;;
  esac
}

# vm_exec SOCKET SCRIPT: runs SCRIPT in the shell of the guest whose
# GUEST_EXEC is SOCKET.
vm_exec() { "$bin/snap-csi-guest" exec --socket "$1" "$2"; }

# vm_boot NAME HOSTNAME PREFIX: boots a guest called HOSTNAME (its own
# start NAME, logs/NAME.log) and sets PREFIX_* from the GUEST_* it prints
# (GUEST_QMP as GUEST2_QMP for PREFIX GUEST2).
vm_boot() {
  local name=$1 hostname=$2 prefix=$3 line var
  start "$name" "$bin/snap-csi-guest" boot --dir "$dir/$name" --hostname "$hostname"
  # Booting under TCG on a loaded two-core machine: up to 3 minutes.
  for _ in $(seq 3000); do
    grep -qx READY "$dir/logs/$name.log" 2>/dev/null && break
    kill -0 "${pids[-1]}" 2>/dev/null || gave_up "the guest $hostname did not boot"
    sleep 0.1
  done
  grep -qx READY "$dir/logs/$name.log" || gave_up "the guest $hostname did not boot in 5 minutes"
  while IFS= read -r line; do
    case $line in
      GUEST_*=*)
        var=${line%%=*}
        printf -v "${prefix}_${var#GUEST_}" '%s' "${line#*=}"
        ;;
    esac
  done <"$dir/logs/$name.log"
}

# vm_snap_args QMP PORTS: snap-emu's flags for the guest whose GUEST_QMP and
# GUEST_PORTS these are: each root port a PF (two NVMe, three virtio-blk; the
# rest for virtio-fs devices, plugged when made), no VFs (QEMU puts none of
# ours on a root port).
vm_snap_args() {
  local port virtiofsd
  virtiofsd=$(./hack/guest/virtiofsd.sh) || gave_up "hack/guest/virtiofsd.sh failed"
  vm_snap=(--guest-qmp "$1" --virtiofsd "$virtiofsd" --nvme-pfs 2 --nvme-vfs-per-pf 0
    --virtio-blk-pfs 3 --virtio-blk-vfs-per-pf 0)
  for port in ${2//,/ }; do vm_snap+=(--guest-port "$port"); done
}

# vm_node EXEC ADDRESS NODE-ID KUBELET STATE NODE-FLAGS...: starts the node
# NODE-ID in the guest whose GUEST_EXEC and GUEST_ADDRESS are EXEC and
# ADDRESS, with kubelet's directory and its state directory at KUBELET and
# STATE (made here, a tmpfs each there) and NODE-FLAGS (how it reaches its
# DPU), and the forwarder of its CSI socket; sets vm_csi_port.
vm_node() {
  local exec=$1 address=$2 node_id=$3 kubelet_dir=$4 state_dir=$5 flags
  shift 5
  free_port vm_csi_port
  mkdir -p "$kubelet_dir" "$state_dir"
  printf -v flags '%q ' "$@"
  vm_exec "$exec" "mkdir -p $vm_node_dir && mount -t tmpfs tmpfs $kubelet_dir &&
    mount -t tmpfs -o mode=0700 tmpfs $state_dir &&
    $bin/snap-csi node --endpoint $vm_node_dir/csi.sock --node-id $node_id \
      --kubelet-dir $kubelet_dir --state-dir $state_dir $flags \
      >$vm_node_dir/node.log 2>&1 &" || gave_up "the node did not start in the guest"
  vm_exec "$exec" "for i in \$(seq 900); do [ -S $vm_node_dir/csi.sock ] && exit 0; sleep 0.1; done
    cat $vm_node_dir/node.log; exit 1" >&2 || gave_up "the node in the guest made no socket"
  vm_exec "$exec" "python3 $repo/hack/guest/uds-forward.py $address $vm_csi_port \
    $vm_node_dir/csi.sock >$vm_node_dir/forward.log 2>&1 &" ||
    gave_up "the CSI forwarder did not start in the guest"
  wait_for_tcp "$address" "$vm_csi_port"
}

# vm_save_log: each guest's node log into logs/node.log and logs/node2.log
# (for the cleanup, before the guests go).
vm_save_log() {
  [ -n "${GUEST_EXEC:-}" ] && vm_exec "$GUEST_EXEC" "cat $vm_node_dir/node.log" >"$dir/logs/node.log" 2>&1
  [ -n "${GUEST2_EXEC:-}" ] && vm_exec "$GUEST2_EXEC" "cat $vm_node_dir/node.log" >"$dir/logs/node2.log" 2>&1
  return 0
}
