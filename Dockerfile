# syntax=docker/dockerfile:1
# Build: the release binary. BuildKit cache mounts keep the cargo registry and the target dir from
# one build to the next, so a change to the sources recompiles pes-server alone.
# Podman keeps the HEALTHCHECK only in the docker format: `podman build --format docker -t pes-server .`
# (podman-compose: `BUILDAH_FORMAT=docker podman-compose up --build`)
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
# The image's binary carries symbols (a panic's backtrace names functions) but no debug info:
# 63.1 MB (measured) instead of about 200 MB. The repository's release profile keeps line tables for
# profiling; only this build leaves them out.
ENV CARGO_PROFILE_RELEASE_DEBUG=false \
    CARGO_PROFILE_RELEASE_STRIP=debuginfo
# The workspace: the root package (pes-server) and the manifests of its other members, which
# cargo reads but pes-server does not build (the tests' fake model, the benchmark).
COPY Cargo.toml Cargo.lock ./
COPY crates/fake-openai/Cargo.toml crates/fake-openai/
COPY crates/pes-bench/Cargo.toml crates/pes-bench/
COPY src src
# Embedded in the binary at compile time: the schema migrations and the web console's assets.
COPY migrations migrations
COPY console console
# The target dir is a cache mount, not part of the image: the binary is copied out of it. The
# data folder is made here (the run stage has no shell) and copied with its owner.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p pes-server --bin pes-server \
    && install -D target/release/pes-server /out/pes-server \
    && install -d /out/data

# Run: glibc, libgcc, CA certificates and time zones, nothing else (no shell, no package
# manager: nothing to pin or patch but the base image itself): the image measured 88.7 MB
# (Debian's slim image alone is 75 MB). The binary needs only libc, libm and libgcc_s.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/pes-server /usr/local/bin/pes-server
# The volume's mount point, owned by the service's user: a new named volume starts with this
# owner, so the service can write its SQLite file there. A bind-mounted folder must be writable by
# uid 10001 (`chown 10001 ./data`); start-up names the folder when it is not.
COPY --from=build --chown=10001:10001 /out/data /var/lib/pes/data
# A numeric user (and group), so a runtime that checks for non-root can tell without /etc/passwd.
USER 10001:10001
WORKDIR /var/lib/pes
# Listening on every interface refuses to start without PES_API_KEYS (or
# PES_ALLOW_UNAUTHENTICATED=true, to run open on purpose): `docker run -e PES_API_KEYS=…`.
ENV HOME=/var/lib/pes \
    PES_BIND=0.0.0.0:8080 \
    PES_DATABASE_URL=sqlite:///var/lib/pes/data/pes.db \
    PES_LOG_FORMAT=json
VOLUME ["/var/lib/pes/data"]
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["pes-server", "healthcheck"]
ENTRYPOINT ["pes-server"]
CMD ["serve"]
