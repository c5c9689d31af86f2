# syntax=docker/dockerfile:1
# Build: the release binary, with dependencies cached in their own layer.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src/bin && echo 'fn main() {}' > src/main.rs && echo '' > src/lib.rs \
    && echo 'fn main() {}' > src/bin/pes-bench.rs \
    && cargo build --release --locked --bin pes-server \
    && rm -rf src
COPY src src
COPY migrations migrations
RUN touch src/main.rs src/lib.rs && cargo build --release --locked --bin pes-server

# Run: a small image, a non-root user, data on a volume.
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/pes --create-home pes
COPY --from=build /src/target/release/pes-server /usr/local/bin/pes-server
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
