#!/usr/bin/env bash
# The library's cargo features, checked as an engine would depend on it:
#   - it builds (`cargo check`) with no default features and with each exporter alone;
#   - with no default features its normal dependency tree has none of the exporters' crates
#     (hyper, tonic, reqwest, rustls, bcrypt, serde_yaml_ng), and with `otlp-grpc` alone none
#     of the Prometheus endpoint's or the HTTP client's (bcrypt, serde_yaml_ng, reqwest);
#   - with `record-off` the hot path is compiled out (the library's own test of that runs).
# Prints the unique crate count of each tree (the figures BENCHMARKS.md records).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

log() { printf '[check-features] %s\n' "$*" >&2; }
fail() { log "FAIL: $*"; exit 1; }

# Unique crates of phasetrace's normal dependency tree with `--no-default-features --features $1`.
tree() {
    cargo tree -q --locked -p phasetrace --no-default-features --features "$1" -e normal --prefix none |
        sed 's/ (\*)$//; s/ (proc-macro)$//' | sort -u
}

for features in "" "tracing" "prometheus" "otlp-grpc" "otlp-http" "otlp-grpc,otlp-http" "record-off"; do
    log "cargo check --no-default-features --features '$features'"
    cargo check -q --locked -p phasetrace --no-default-features --features "$features"
done

none="$(tree "")"
log "no default features: $(wc -l <<<"$none") crates (phasetrace included)"
for forbidden in hyper tonic reqwest rustls bcrypt serde_yaml_ng tokio; do
    if grep -q "^$forbidden v" <<<"$none"; then
        fail "--no-default-features pulls in $forbidden"
    fi
done
[ "$(wc -l <<<"$none")" -le 60 ] || fail "--no-default-features: more than 60 crates"

grpc="$(tree "otlp-grpc")"
log "otlp-grpc alone: $(wc -l <<<"$grpc") crates"
for forbidden in bcrypt serde_yaml_ng reqwest; do
    if grep -q "^$forbidden v" <<<"$grpc"; then
        fail "--features otlp-grpc pulls in $forbidden"
    fi
done
log "default features: $(tree "default" | wc -l) crates"

log "cargo test --lib --no-default-features --features record-off (recording compiled out; the engine's environment starts nothing in a lean build either)"
cargo test -q --locked -p phasetrace --lib --no-default-features --features record-off -- \
    recording_compiled_out its_otel_environment_starts_nothing a_protocol_nobody_set
log "ok"
