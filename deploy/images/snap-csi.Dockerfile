# snap-csi: the node plugin (`snap-csi node`), the DPU agent
# (`snap-csi dpu-agent`, on the BlueField's Arm cores) and the controller
# proxy (`snap-csi controller`) in one image; the manifests pick the
# subcommand. Build from the repository root, for both architectures:
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     -f deploy/images/snap-csi.Dockerfile -t <registry>/snap-csi/snap-csi:0.1.0 --push .
# deploy/check.sh checks this file offline (no Docker engine there).

# Same Rust as rust-toolchain.toml, so the image builds what CI tested. The
# builder runs on the build machine's platform and cross-compiles for each
# target platform (rust-target.sh): no emulated build.
# BASE: the runtime stage's image. BINARIES: where the binary comes from,
# `builder` (compiled here, the default) or `prebuilt` (a binary already built
# for this platform, at PREBUILT in the context: hack/images.sh passes the one
# the test command just built and tested, and a base made from Debian's
# packages, where no registry is reachable). An unused stage is not built.
ARG BASE=debian:bookworm-slim
ARG BINARIES=builder
FROM --platform=$BUILDPLATFORM rust:1.95-bookworm AS builder
ARG TARGETARCH
COPY deploy/images/rust-target.sh /usr/local/bin/rust-target
# protoc and google/protobuf/*.proto: build.rs compiles the protos; the C
# cross compiler, when the target is another architecture, for ring.
RUN apt-get update \
    && apt-get install -y --no-install-recommends protobuf-compiler libprotobuf-dev $(rust-target packages) \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The toolchain file first, so the target's standard library is a cached layer.
COPY rust-toolchain.toml .
RUN rustup target add "$(rust-target triple)"
COPY . .
# The commit --version names (the context has no .git to read it from).
ARG SNAP_CSI_GIT_COMMIT=unknown
ENV SNAP_CSI_GIT_COMMIT=$SNAP_CSI_GIT_COMMIT
# The caches keep crates and incremental artefacts across builds; the binary
# is copied out of the cached target dir because a cache mount is not part
# of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    eval "$(rust-target env)" \
    && cargo build --release --locked --target "$RUST_TARGET" -p snap-csi --bin snap-csi \
    && install -D -m 0755 "target/$RUST_TARGET/release/snap-csi" /out/snap-csi

FROM scratch AS prebuilt
# What hack/images.sh removes once the image is built (an untagged stage).
LABEL io.snap-csi.stage=prebuilt
ARG PREBUILT=target/release
COPY ${PREBUILT}/snap-csi /out/snap-csi

FROM ${BINARIES} AS binaries

# Debian like the builder, so glibc matches; the target platform's image.
FROM ${BASE}
# What the node execs (deploy/check.sh derives the list from src/node):
#   e2fsprogs  mkfs.ext4 e2fsck resize2fs dumpe2fs
#   xfsprogs   mkfs.xfs xfs_growfs
#   util-linux blkid blockdev
#   coreutils  dd (a device blkid finds blank must read; essential, so
#              always there, named to keep the list whole)
# mount/umount are not exec'd (the node calls mount(2)) but make the image
# usable for debugging a node by hand. ca-certificates: for a vendor
# endpoint over TLS (the DPU link trusts only its own CA file).
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        e2fsprogs \
        xfsprogs \
        util-linux \
        coreutils \
        mount \
        ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=binaries /out/snap-csi /usr/local/bin/snap-csi
LABEL org.opencontainers.image.title="snap-csi" \
      org.opencontainers.image.description="CSI driver for BlueField DPU storage (SNAP): node plugin, DPU agent and controller proxy" \
      org.opencontainers.image.licenses="Apache-2.0"
# No USER: root by default. One image runs the node (root by need: mounts,
# mkfs, /sys), the DPU agent (SNAP's root-owned socket) and the controller
# proxy (its vendor's 0600 socket is root's); the manifests set the user of
# each container (runAsUser, with a `# root:` reason: deploy/README.md,
# "Users"), rather than an image-wide USER that the node would override.
ENTRYPOINT ["/usr/local/bin/snap-csi"]
