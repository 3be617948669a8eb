# snap-csi-spdk-plugin: the sample vendor plugin (plugins.v1 on the DPU, and
# its CSI controller). Build from the repository root, for both
# architectures (the plugin runs on the BlueField's Arm cores):
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     -f deploy/images/spdk-plugin.Dockerfile -t <registry>/snap-csi/snap-csi-spdk-plugin:0.1.0 --push .
# Cross-compiled like snap-csi.Dockerfile (rust-target.sh). deploy/check.sh
# checks this file offline.

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
RUN apt-get update \
    && apt-get install -y --no-install-recommends protobuf-compiler libprotobuf-dev $(rust-target packages) \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY rust-toolchain.toml .
RUN rustup target add "$(rust-target triple)"
COPY . .
# The commit --version names (the context has no .git to read it from).
ARG SNAP_CSI_GIT_COMMIT=unknown
ENV SNAP_CSI_GIT_COMMIT=$SNAP_CSI_GIT_COMMIT
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    eval "$(rust-target env)" \
    && cargo build --release --locked --target "$RUST_TARGET" -p snap-csi-spdk-plugin --bin snap-csi-spdk-plugin \
    && install -D -m 0755 "target/$RUST_TARGET/release/snap-csi-spdk-plugin" /out/snap-csi-spdk-plugin

FROM scratch AS prebuilt
# What hack/images.sh removes once the image is built (an untagged stage).
LABEL io.snap-csi.stage=prebuilt
ARG PREBUILT=target/release
COPY ${PREBUILT}/snap-csi-spdk-plugin /out/snap-csi-spdk-plugin

FROM ${BINARIES} AS binaries


# The CSI controller's filesystem backend makes an ext4 image per volume on
# its share and mounts it (e2fsprogs: mkfs.ext4, e2fsck, resize2fs, chattr;
# mount: mount, umount, losetup; util-linux: fsfreeze; coreutils: cp), named
# so that a slimmer base cannot drop them unseen (deploy/tools/check_images.py
# looks for each). debian slim rather than distroless: the same base as the
# snap-csi image, a release tag to pin, and apt for those packages.
FROM ${BASE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends e2fsprogs mount util-linux \
    && rm -rf /var/lib/apt/lists/*
COPY --from=binaries /out/snap-csi-spdk-plugin /usr/local/bin/snap-csi-spdk-plugin
LABEL org.opencontainers.image.title="snap-csi-spdk-plugin" \
      org.opencontainers.image.description="Sample snap-csi vendor plugin: SPDK AIO and NVMe-oF bdevs inside SNAP" \
      org.opencontainers.image.licenses="Apache-2.0"
# No USER: root by default. The plugin opens SNAP's root-owned socket, and
# as the CSI controller with a filesystem share it loop-mounts volumes
# (privileged); the manifests set the user (deploy/README.md, "Users").
ENTRYPOINT ["/usr/local/bin/snap-csi-spdk-plugin"]
