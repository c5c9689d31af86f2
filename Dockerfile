# syntax=docker/dockerfile:1
# Build: the release binary. BuildKit cache mounts keep the cargo registry and the target dir from
# one build to the next, so a change to the sources recompiles pes-server alone.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
# The workspace: the root package (pes-server) and the manifests of its other members, which
# cargo reads but pes-server does not build (the tests' fake model, the benchmark).
COPY Cargo.toml Cargo.lock ./
COPY crates/fake-openai/Cargo.toml crates/fake-openai/
COPY crates/pes-bench/Cargo.toml crates/pes-bench/
COPY src src
# Embedded in the binary at compile time: the schema migrations and the web console's assets.
COPY migrations migrations
COPY console console
# The target dir is a cache mount, not part of the image: the binary is copied out of it.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p pes-server --bin pes-server \
    && install -D target/release/pes-server /out/pes-server

# Run: a small image, a non-root user, data on a volume.
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/pes --create-home pes
COPY --from=build /out/pes-server /usr/local/bin/pes-server
USER pes
WORKDIR /var/lib/pes
ENV PES_BIND=0.0.0.0:8080 \
    PES_DATABASE_URL=sqlite:///var/lib/pes/data/pes.db \
    PES_LOG_FORMAT=json
VOLUME ["/var/lib/pes/data"]
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["pes-server", "healthcheck"]
ENTRYPOINT ["pes-server"]
CMD ["serve"]
