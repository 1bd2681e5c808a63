# Image of the phasetrace CLI, used by the `demo` service of docker-compose.yml.
#   docker build -t phasetrace-demo:local .
# Builds on the classic builder and BuildKit alike (no cache mounts), linted with hadolint and
# parsed with BuildKit's parser by scripts/validate-stack.sh.

FROM rust:1.91-slim-bookworm AS builder
WORKDIR /src
# Manifest and sources only (.dockerignore keeps target/ and the tooling out of the context).
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
COPY cli ./cli
COPY testkit ./testkit
COPY import ./import
COPY sim ./sim
COPY names ./names
COPY gpu-bench ./gpu-bench
COPY examples ./examples
RUN cargo build --release --locked --bin phasetrace \
    && install -m 0755 target/release/phasetrace /usr/local/bin/phasetrace

FROM debian:bookworm-slim
# ca-certificates: for https:// OTLP endpoints. Unpinned on purpose: bookworm's security updates.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin phasetrace
COPY --from=builder /usr/local/bin/phasetrace /usr/local/bin/phasetrace
USER 10001
ENV OTEL_SERVICE_NAME=phasetrace
ENTRYPOINT ["/usr/local/bin/phasetrace"]
CMD ["demo", "--forever", "--ranks", "4", "--layers", "12", "--straggler-period", "300"]
