#!/usr/bin/env bash
# The main job today: one volume taken through its life on the SNAP emulator,
# the way it goes on a BlueField, with every step's time.
#
#   an SPDK AIO bdev over a file
#   -> exposed as an NVMe namespace on an emulated function (NVIDIA's order:
#      subsystem, namespace, controller created suspended, attach, resume)
#   -> found on the host only through sysfs, written through /dev/loopN
#   -> torn down in reverse
#   -> exposed again through virtio-blk, found by serial, read back and compared
#   -> torn down; the emulator stops; nothing may be left (loop device, tree).
#
# Run as root from anywhere: ./hack/emulator-demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
./hack/setup.sh
cargo build --release --locked --quiet -p snap-csi -p snap-emu

bin=$PWD/target/release
work=$(mktemp -d /tmp/snap-csi-demo.XXXXXX)
sock=$work/snap.sock
sysfs=$work/sysfs
backing=$work/vol1.img
emu_pid=
cleanup() {
  if [ -n "$emu_pid" ] && kill -0 "$emu_pid" 2>/dev/null; then
    kill -TERM "$emu_pid"
    wait "$emu_pid" || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

now() { date +%s%N; }
ms() { awk -v ns="$1" 'BEGIN { printf "%.2f", ns / 1e6 }'; }
printf '%-62s %10s\n' "step" "ms"
printf '%-62s %10s\n' "----" "--"
# step DESCRIPTION COMMAND...: runs the command in this shell (so it may set
# variables) and keeps its stdout in $out.
step() {
  local what=$1
  shift
  local start end
  start=$(now)
  "$@" >"$work/out"
  end=$(now)
  out=$(cat "$work/out")
  printf '%-62s %10s\n' "$what" "$(ms $((end - start)))"
}
rpc() { "$bin/snap-csi" rpc -s "$sock" "$@"; }
field() { sed -n "s/.*\"$1\": \"\\([^\"]*\\)\".*/\\1/p" | head -n1; }

start_emulator() {
  "$bin/snap-emu" --socket "$sock" --state-dir "$work/state" --sysfs-root "$sysfs" \
    >"$work/emulator.log" 2>&1 &
  emu_pid=$!
  for _ in $(seq 500); do
    [ -S "$sock" ] && rpc spdk_get_version >/dev/null 2>&1 && return 0
    sleep 0.01
  done
  echo "emulator did not start:" >&2
  cat "$work/emulator.log" >&2
  return 1
}

nqn=nqn.2022-10.io.nvda.nvme:snap-csi-demo
uuid=6a1f3c2e-5b6d-4e8f-9a0b-1c2d3e4f5a6b
nvme_bdf=26:00.1
vblk_bdf=27:00.1
serial=snap-csi-demo

truncate -s 64M "$backing"
head -c 1048576 /dev/urandom >"$work/pattern.bin"

step "start the SNAP emulator (socket answering)" start_emulator
step "spdk_get_version" rpc spdk_get_version
step "bdev_aio_create aio-vol1 over a 64 MiB file" \
  rpc bdev_aio_create "{\"name\":\"aio-vol1\",\"filename\":\"$backing\",\"block_size\":512}"
step "nvme_subsystem_create" rpc nvme_subsystem_create "{\"nqn\":\"$nqn\"}"
step "nvme_namespace_create nsid 1" rpc nvme_namespace_create \
  "{\"bdev_type\":\"spdk\",\"nqn\":\"$nqn\",\"nsid\":1,\"uuid\":\"$uuid\",\"bdev_name\":\"aio-vol1\"}"
step "nvme_controller_create on $nvme_bdf, suspended" rpc nvme_controller_create \
  "{\"nqn\":\"$nqn\",\"pci_bdf\":\"$nvme_bdf\",\"suspended\":true}"
ctrl=$(field ctrl_id <<<"$out")
step "nvme_controller_attach_ns $ctrl nsid 1" rpc nvme_controller_attach_ns "{\"ctrl_id\":\"$ctrl\",\"nsid\":1}"
step "nvme_controller_resume $ctrl" rpc nvme_controller_resume "{\"ctrl_id\":\"$ctrl\"}"
step "find the namespace on the host through sysfs" \
  "$bin/snap-csi" find-device --sysfs-root "$sysfs" --bdf "$nvme_bdf" --nsid 1 --uuid "$uuid"
nvme_dev=${out%% *}
echo "    -> $out"
step "write 1 MiB at offset 4 MiB through $nvme_dev" \
  dd if="$work/pattern.bin" of="$nvme_dev" bs=1M seek=4 count=1 conv=fsync status=none
step "nvme_controller_detach_ns" rpc nvme_controller_detach_ns "{\"ctrl_id\":\"$ctrl\",\"nsid\":1}"
step "nvme_controller_destroy" rpc nvme_controller_destroy "{\"ctrl_id\":\"$ctrl\",\"force\":true}"
step "nvme_namespace_destroy" rpc nvme_namespace_destroy "{\"nqn\":\"$nqn\",\"nsid\":1}"
step "nvme_subsystem_destroy" rpc nvme_subsystem_destroy "{\"nqn\":\"$nqn\"}"
if "$bin/snap-csi" find-device --sysfs-root "$sysfs" --bdf "$nvme_bdf" --nsid 1 2>/dev/null; then
  echo "FAIL: the namespace is still visible after teardown" >&2
  exit 1
fi
if [ -n "$(losetup -j "$backing")" ]; then
  echo "FAIL: a loop device is left after the NVMe teardown" >&2
  exit 1
fi
step "virtio_blk_controller_create on $vblk_bdf" rpc virtio_blk_controller_create \
  "{\"pci_bdf\":\"$vblk_bdf\",\"bdev\":\"aio-vol1\",\"vblk_id\":\"$serial\"}"
vblk_ctrl=$(field ctrl_id <<<"$out")
step "find the virtio-blk disk on the host by serial" \
  "$bin/snap-csi" find-device --sysfs-root "$sysfs" --bdf "$vblk_bdf" --serial "$serial"
vblk_dev=${out%% *}
echo "    -> $out"
step "read the 1 MiB back through $vblk_dev" \
  dd if="$vblk_dev" of="$work/readback.bin" bs=1M skip=4 count=1 status=none
if ! cmp -s "$work/pattern.bin" "$work/readback.bin"; then
  echo "FAIL: the data read through virtio-blk differs from what NVMe wrote" >&2
  exit 1
fi
echo "    -> same bytes as written through NVMe"
step "virtio_blk_controller_destroy $vblk_ctrl" rpc virtio_blk_controller_destroy \
  "{\"ctrl\":\"$vblk_ctrl\",\"force\":true}"
step "bdev_aio_delete" rpc bdev_aio_delete '{"name":"aio-vol1"}'
stop_emulator() {
  kill -TERM "$emu_pid"
  wait "$emu_pid"
  emu_pid=
}
step "stop the emulator (SIGTERM)" stop_emulator

left=$(losetup -j "$backing")
if [ -n "$left" ] || [ -e "$sysfs/bus" ] || [ -e "$sock" ]; then
  echo "FAIL: left behind: ${left:-} $(ls "$sysfs" 2>/dev/null)" >&2
  exit 1
fi
echo
echo "OK: data survived NVMe -> virtio-blk; no loop device, sysfs tree or socket left behind"
