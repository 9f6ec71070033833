# syntax=docker/dockerfile:1
#
# The Baton server as a container image: `baton serve` as user baton (uid and
# gid 10001), clients on port 4181, data in the volume /var/lib/baton.
#
# Build (needs BuildKit, Docker's default builder since 23.0):
#
#   docker build -t baton .
#
# Run, with the data in a named volume:
#
#   docker run -d --name baton -p 4181:4181 -v baton-data:/var/lib/baton baton
#   docker exec baton baton status
#
# With a config file (keys as in deploy/baton.toml):
#
#   docker run -d --name baton -p 4181:4181 -v baton-data:/var/lib/baton \
#     -v "$PWD/baton.toml:/etc/baton/baton.toml:ro" \
#     -e BATON_CONFIG=/etc/baton/baton.toml baton
#
# BATON_LISTEN and BATON_DATA_DIR below override `listen` and `data-dir` in a
# config file: change them with -e (the health check asks 127.0.0.1:4181). A
# bind-mounted data directory must be writable by uid 10001. A server that
# serves many clients needs a higher open-file limit than Docker's default,
# e.g. --ulimit nofile=262144:262144. Anything after the image name replaces
# `serve`: `docker run --rm baton serve --print-config` prints the settings in
# effect.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
# The registry and target directory live in BuildKit cache mounts, so a
# rebuild after a source change compiles only Baton's own crates. The target
# directory is not part of the image: the binary is copied out of it.
# Debug info is stripped (symbols stay, so backtraces still name functions).
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p baton-cli \
    && mkdir -p /out \
    && objcopy --strip-debug target/release/baton /out/baton

FROM debian:bookworm-slim
# The binary needs only libc, libm and libgcc_s, all in the base image.
RUN groupadd --gid 10001 baton \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/baton \
        --shell /usr/sbin/nologin baton \
    && install -d -o baton -g baton -m 0750 /var/lib/baton \
    && install -d -m 0755 /etc/baton
COPY --from=build /out/baton /usr/local/bin/baton
# NO_COLOR keeps colour codes out of the logs (stderr).
ENV BATON_LISTEN=0.0.0.0:4181 \
    BATON_DATA_DIR=/var/lib/baton \
    NO_COLOR=1
USER 10001:10001
WORKDIR /var/lib/baton
VOLUME /var/lib/baton
EXPOSE 4181
STOPSIGNAL SIGTERM
# `baton status` exits 0 once the server has answered, 1 if it did not
# within its --timeout (milliseconds).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["baton", "--server", "127.0.0.1:4181", "status", "--timeout", "3000"]
ENTRYPOINT ["baton"]
CMD ["serve"]
