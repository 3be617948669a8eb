# snap-csi: the node plugin (`snap-csi node`) and the controller proxy
# (`snap-csi controller`) in one image; the manifests pick the subcommand.
# Build from the repository root:
#   docker build -f deploy/images/snap-csi.Dockerfile -t <registry>/snap-csi/snap-csi:0.1.0 .
# deploy/check.sh checks this file offline (no Docker engine there).

# Same Rust as rust-toolchain.toml, so the image builds what CI tested.
FROM rust:1.95-bookworm AS builder
# protoc: build.rs compiles the CSI and plugins.v1 protos.
RUN apt-get update \
    && apt-get install -y --no-install-recommends protobuf-compiler \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The caches keep crates and incremental artefacts across builds; the binary
# is copied out of the cached target dir because a cache mount is not part
# of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p snap-csi --bin snap-csi \
    && install -D -m 0755 target/release/snap-csi /out/snap-csi

# Debian like the builder, so glibc matches.
FROM debian:bookworm-slim
# What the node execs (deploy/check.sh derives the list from src/node):
#   e2fsprogs  mkfs.ext4 e2fsck resize2fs dumpe2fs
#   xfsprogs   mkfs.xfs xfs_growfs
#   util-linux blkid blockdev
# mount/umount are not exec'd (the node calls mount(2)) but make the image
# usable for debugging a node by hand. ca-certificates: nothing speaks TLS
# yet; it is there so a TLS vendor endpoint needs no new image.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        e2fsprogs \
        xfsprogs \
        util-linux \
        mount \
        ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=builder /out/snap-csi /usr/local/bin/snap-csi
LABEL org.opencontainers.image.title="snap-csi" \
      org.opencontainers.image.description="CSI driver for BlueField DPU storage (SNAP): node plugin and controller proxy" \
      org.opencontainers.image.licenses="Apache-2.0"
# Runs as root: the node mounts and formats host devices (the pod is
# privileged), and the proxy shares its 0600 socket with root sidecars.
ENTRYPOINT ["/usr/local/bin/snap-csi"]
