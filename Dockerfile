# syntax=docker/dockerfile:1
#
# lanekeeper container image: a static musl build (rustls, no OpenSSL, no
# libc at run time) on distroless/static, running as the non-root user 65532.
# The image holds both binaries: `lanekeeper` (the entrypoint) and
# `lanekeeper-fake-model` (the e2e suite's stand-in for a vLLM server; run it
# with `--entrypoint /usr/local/bin/lanekeeper-fake-model` or as the pod's
# `command`).
#
#   docker build -t lanekeeper:0.1.0 .

# The toolchain the project is built and tested with (its dependencies are
# resolved for it).
ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-alpine AS build
# musl-dev: the C runtime the static link needs (ring's assembly is built
# with the same toolchain). On Alpine, Rust targets musl and links
# statically by default.
RUN apk add --no-cache musl-dev gcc
WORKDIR /src
# Dependencies first, so source edits don't rebuild them: a throwaway
# workspace with the real manifests and lockfile (the root package and its
# member crates/lanes, a path dependency).
# Every target a manifest declares must exist, so the benches (small) are
# copied as they are and only the crates' own sources are stubbed.
# (tests/it/docker_context.rs replays these steps on the build context.)
COPY Cargo.toml Cargo.lock ./
COPY benches ./benches
COPY crates/lanes/Cargo.toml ./crates/lanes/
COPY crates/lanes/benches ./crates/lanes/benches
RUN mkdir -p src/bin crates/lanes/src \
 && echo 'fn main() {}' > src/main.rs \
 && echo 'fn main() {}' > src/bin/lanekeeper-fake-model.rs \
 && touch src/lib.rs crates/lanes/src/lib.rs \
 && cargo build --release --locked --bins \
 && rm -rf src crates/lanes/src
COPY src ./src
COPY crates/lanes/src ./crates/lanes/src
# Touch the sources so cargo rebuilds both crates over the throwaway ones.
RUN find src crates/lanes/src -name '*.rs' -exec touch {} + \
 && cargo build --release --locked --bins \
 && mkdir -p /out \
 && cp target/release/lanekeeper target/release/lanekeeper-fake-model /out/ \
 && /out/lanekeeper --version

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="lanekeeper" \
      org.opencontainers.image.description="Kubernetes operator for shared GPU inference pools: lane contracts, capacity profiles and degradation ladders." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/lanekeeper /out/lanekeeper-fake-model /usr/local/bin/
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/lanekeeper"]
CMD ["run"]
