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

# vm_exec SCRIPT: runs SCRIPT in the guest's shell.
vm_exec() { "$bin/snap-csi-guest" exec --socket "$GUEST_EXEC" "$1"; }

# vm_boot: boots the guest (its own start, logs/guest.log) and sets GUEST_*
# from what it prints.
vm_boot() {
  local line
  start guest "$bin/snap-csi-guest" boot --dir "$dir/guest" --hostname local-node
  # Booting under TCG on a loaded two-core machine: up to 3 minutes.
  for _ in $(seq 3000); do
    grep -qx READY "$dir/logs/guest.log" 2>/dev/null && break
    kill -0 "${pids[-1]}" 2>/dev/null || gave_up "the guest did not boot"
    sleep 0.1
  done
  grep -qx READY "$dir/logs/guest.log" || gave_up "the guest did not boot in 5 minutes"
  while IFS= read -r line; do
    case $line in GUEST_*=*) printf -v "${line%%=*}" '%s' "${line#*=}" ;; esac
  done <"$dir/logs/guest.log"
}

# vm_snap_args: snap-emu's flags for the guest: each root port a PF (two
# NVMe, three virtio-blk; the rest for virtio-fs devices, plugged when
# made), no VFs (QEMU puts none of ours on a root port).
vm_snap_args() {
  local port virtiofsd
  virtiofsd=$(./hack/guest/virtiofsd.sh) || gave_up "hack/guest/virtiofsd.sh failed"
  vm_snap=(--guest-qmp "$GUEST_QMP" --virtiofsd "$virtiofsd" --nvme-pfs 2 --nvme-vfs-per-pf 0
    --virtio-blk-pfs 3 --virtio-blk-vfs-per-pf 0)
  for port in ${GUEST_PORTS//,/ }; do vm_snap+=(--guest-port "$port"); done
}

# vm_node KUBELET STATE NODE-FLAGS...: starts the node in the guest with
# kubelet's directory and its state directory at KUBELET and STATE (made
# here, a tmpfs each there) and NODE-FLAGS (how it reaches its DPU), and the
# forwarder of its CSI socket; sets vm_csi_port.
vm_node() {
  local kubelet_dir=$1 state_dir=$2 flags
  shift 2
  vm_csi_port=$(free_port)
  mkdir -p "$kubelet_dir" "$state_dir"
  printf -v flags '%q ' "$@"
  vm_exec "mkdir -p $vm_node_dir && mount -t tmpfs tmpfs $kubelet_dir &&
    mount -t tmpfs -o mode=0700 tmpfs $state_dir &&
    $bin/snap-csi node --endpoint $vm_node_dir/csi.sock --node-id local-node \
      --kubelet-dir $kubelet_dir --state-dir $state_dir $flags \
      >$vm_node_dir/node.log 2>&1 &" || gave_up "the node did not start in the guest"
  vm_exec "for i in \$(seq 900); do [ -S $vm_node_dir/csi.sock ] && exit 0; sleep 0.1; done
    cat $vm_node_dir/node.log; exit 1" >&2 || gave_up "the node in the guest made no socket"
  vm_exec "python3 $repo/hack/guest/uds-forward.py $GUEST_ADDRESS $vm_csi_port \
    $vm_node_dir/csi.sock >$vm_node_dir/forward.log 2>&1 &" ||
    gave_up "the CSI forwarder did not start in the guest"
  wait_for_tcp "$GUEST_ADDRESS" "$vm_csi_port"
}

# vm_save_log: the node's log from the guest into logs/node.log (for the
# cleanup, before the guest goes).
vm_save_log() {
  [ -n "${GUEST_EXEC:-}" ] && vm_exec "cat $vm_node_dir/node.log" >"$dir/logs/node.log" 2>&1
  return 0
}
