#!/usr/bin/env bash
# Builds the guest host the real-kernel suites boot (hack/guest/README.md):
# Debian's own kernel from bookworm-backports (downloaded, unpacked, never
# installed) and an initramfs of busybox-static with the kernel modules a
# BlueField host's storage needs, which mounts this machine's root read-only
# over 9p as the guest's userland. Cached by content under
# ${SNAP_CSI_CACHE:-$HOME/.cache/snap-csi}/guest-<hash>: a hit needs no
# network. Prints that directory (vmlinuz, initrd, release).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

# The kernel package linux-image-amd64 names in bookworm-backports: the
# version users of Debian 12 get, whose name keys the cache.
kernel_package() {
  package=$(apt-cache depends linux-image-amd64/bookworm-backports 2>/dev/null |
    sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\)$/\1/p' | head -1)
  version=$(apt-cache show "$package" 2>/dev/null | sed -n 's/^Version: //p' | head -1)
}
kernel_package
if [ -z "$package" ] || [ -z "$version" ]; then
  echo "guest: no linux-image-amd64 in bookworm-backports (hack/setup.sh enables it; run apt-get update)" >&2
  exit 1
fi
busybox=$(command -v busybox || true)
case "$busybox" in
  /bin/busybox|/usr/bin/busybox) ;;
  *) echo "guest: busybox-static is missing (hack/setup.sh installs it)" >&2; exit 1 ;;
esac
cache_root=${SNAP_CSI_CACHE:-$HOME/.cache/snap-csi}
cached() {
  out=$cache_root/guest-$({ echo "$package $version"; sha256sum "$busybox"; cat "$here/build.sh" "$here/init" "$here/agent.sh"; } |
    sha256sum | cut -c1-16)
  [ -s "$out/initrd" ]
}
if cached; then
  echo "$out"
  exit 0
fi

mkdir -p "$cache_root"
scratch=$(mktemp -d "$cache_root/.guest-build.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
# Backports keeps only its newest kernel: lists older than that name one the
# archive no longer has, so a failed download refreshes them once.
if ! (cd "$scratch" && apt-get download -qq "$package=$version" 2>/dev/null); then
  apt-get update -qq
  kernel_package
  if cached; then
    echo "$out"
    exit 0
  fi
  (cd "$scratch" && apt-get download -qq "$package=$version")
fi
dpkg-deb -x "$scratch"/*.deb "$scratch/kernel"
release=${package#linux-image-}
depmod -b "$scratch/kernel" "$release"

# What a host needs of its storage, in load order with dependencies first:
# NVMe (native multipath is nvme_core's parameter, set at boot), virtio-blk,
# the filesystems the node makes, 9p for the shared userland, virtio-net for
# its link to the DPU. virtio-fs,
# FUSE, virtio-pci and the console (the agent's port) are built in.
root=$scratch/root
mkdir -p "$root"/{bin,dev,proc,sys,newroot,lib/modules}
for m in nvme virtio_blk ext4 xfs 9p 9pnet_virtio virtio_net crc32c_generic; do
  modprobe -d "$scratch/kernel" -S "$release" --show-depends "$m" | sed -n 's/^insmod \([^ ]*\).*/\1/p'
done | awk '!seen[$0]++' | while read -r ko; do
  name=$(basename "$ko"); name=${name%.ko*}
  case "$ko" in
    *.xz) xz -dc "$ko" >"$root/lib/modules/$name.ko" ;;
    *.zst) zstd -qdc "$ko" >"$root/lib/modules/$name.ko" ;;
    *) cp "$ko" "$root/lib/modules/$name.ko" ;;
  esac
  echo "$name" >>"$root/lib/modules/order"
done
cp "$busybox" "$root/bin/busybox"
install -m 0755 "$here/init" "$root/init"
install -m 0644 "$here/agent.sh" "$root/agent.sh"
(cd "$root" && find . | "$busybox" cpio -o -H newc 2>/dev/null | gzip -1) >"$scratch/initrd"

mkdir -p "$scratch/out"
cp "$scratch/kernel/boot/vmlinuz-$release" "$scratch/out/vmlinuz"
mv "$scratch/initrd" "$scratch/out/initrd"
echo "$release" >"$scratch/out/release"
mv -T "$scratch/out" "$out" 2>/dev/null || [ -s "$out/initrd" ]
echo "$out"
