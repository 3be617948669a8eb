# shellcheck shell=bash
# What hack/spdk/build.sh builds from a patched SPDK source tree, and how:
# the Debian 12 packages, SPDK's configure flags and make steps, and the cache
# entry's layout. Sourced by build.sh. This file's text is part of the cache
# key (with the source's identity and the patch); build.sh's own (the cache,
# the fetch, the messages) is not, so only a change here builds anew.

# The build packages (the -dev ones bring the libraries spdk_tgt runs with).
# shellcheck disable=SC2034 # build.sh installs them
spdk_packages=(gcc g++ make pkgconf patch libdpdk-dev libnuma-dev libaio-dev uuid-dev
  libssl-dev libncurses-dev libcunit1-dev python3-pyelftools meson ninja-build libjson-c-dev
  libkeyutils-dev nasm autoconf automake libtool)

# Builds spdk_tgt in the current directory, the patched source tree.
spdk_build() {
  # --with-shared: a static link against Debian's DPDK misses libnuma symbols.
  ./configure --with-shared --with-dpdk=/usr --without-crypto --without-vhost --without-virtio \
    --without-vfio-user --without-idxd --without-fuse --without-nvme-cuse --without-xnvme \
    --without-uring --without-rdma --without-usdt --disable-tests --disable-unit-tests \
    --disable-examples
  # Debian's libdpdk.pc names IPSec_MB, which would send the build looking for
  # the intel-ipsec-mb submodule; nothing needs it without crypto.
  sed -i 's/^CONFIG_IPSEC_MB?=.*/CONFIG_IPSEC_MB?=n/' mk/config.mk
  # isa-l-crypto's own parallel build races; build it alone first.
  make -C isa-l-crypto all
  make -j"$(nproc)"
}

# spdk_install SRC OUT: the cache entry in OUT from the built tree SRC.
# spdk_tgt links SPDK's own shared libraries; a wrapper points the loader at
# the copies beside it, so callers need no LD_LIBRARY_PATH (build.sh starts
# the wrapper once the build tree is gone, which proves that). exec keeps the
# process id, so killing the wrapper's pid kills spdk_tgt.
spdk_install() {
  local src=$1 out=$2 libs
  mkdir -p "$out/bin" "$out/libexec" "$out/lib"
  cp "$src/build/bin/spdk_tgt" "$out/libexec/"
  # With SPDK's own ISA-L libraries (those built shared): the binary's RUNPATH
  # names them in the build tree, which goes away.
  shopt -s nullglob
  libs=("$src/build/lib/"*.so* "$src/isa-l/.libs/"*.so* "$src/isa-l-crypto/.libs/"*.so*)
  shopt -u nullglob
  cp -P "${libs[@]}" "$out/lib/"
  cat >"$out/bin/spdk_tgt" <<'WRAPPER'
#!/bin/sh
# spdk_tgt with SPDK's shared libraries from this cache entry (hack/spdk/build.sh).
here=$(dirname "$(readlink -f "$0")")/..
LD_LIBRARY_PATH=$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec "$here/libexec/spdk_tgt" "$@"
WRAPPER
  chmod +x "$out/bin/spdk_tgt"
}
