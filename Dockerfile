# syntax=docker/dockerfile:1
# targetlease: the operator and CLI in one small, non-root image.
#
#   docker build -t ghcr.io/targetlease/targetlease:0.1.0 \
#     --build-arg TARGETLEASE_COMMIT="$(git rev-parse --short=12 HEAD)" .   (docs/install.md)
#
# Build stage: the full Rust image (it has the C compiler `ring` needs).
# The Lua scripts are compiled into the binary (include_str!); lua/ is copied
# into the runtime image only so the exact scripts can be read from the image.
# The release workflow (.github/workflows/release.yml) passes both bases
# pinned by digest (image@sha256:…), resolved at the start of each release.
ARG RUST_IMAGE=docker.io/library/rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot
FROM ${RUST_IMAGE} AS build
# The commit `targetlease --version` names (.git is not in the build context):
#   docker build --build-arg TARGETLEASE_COMMIT="$(git rev-parse --short=12 HEAD)" .
ARG TARGETLEASE_COMMIT=""
# protoc: the etcd client's build compiles etcd's protos.
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends protobuf-compiler libprotobuf-dev \
 && rm -rf /var/lib/apt/lists/*
ENV PROTOC=/usr/bin/protoc
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY build ./build
# The test support crate and the fault matrix are members of the
# workspace: cargo reads their manifests to resolve the workspace (the image
# build compiles none of them).
COPY tests/support ./tests/support
COPY tests/faults ./tests/faults
COPY src ./src
COPY lua ./lua
# jemalloc (the binary's allocator) fixes its page size when it is built: on
# arm64, whose kernels use 4, 16 or 64 KiB pages, it is built for 64 KiB so
# the image starts on any of them (jemalloc refuses a larger page than it was
# built for).
ARG TARGETARCH
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    if [ "$TARGETARCH" = arm64 ]; then export JEMALLOC_SYS_WITH_LG_PAGE=16; fi \
 && cargo build --release --locked --bin targetlease \
 && install -D -m 0755 target/release/targetlease /out/targetlease

# Runtime: distroless with glibc and CA certificates, no shell, no package
# manager, runs as UID/GID 65532 (matches the Helm chart's securityContext).
FROM ${RUNTIME_IMAGE}
LABEL org.opencontainers.image.title="targetlease" \
      org.opencontainers.image.description="Leases with fencing tokens for Kubernetes workloads, stored in Valkey" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/targetlease /usr/local/bin/targetlease
COPY lua /usr/share/targetlease/lua
COPY crds /usr/share/targetlease/crds
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/targetlease"]
CMD ["operator"]
