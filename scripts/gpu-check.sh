#!/usr/bin/env bash
# GPU checks of the CUDA timing backends (src/timing/cuda/), for a machine with an NVIDIA GPU.
#
#   scripts/gpu-check.sh            # build (release, --features cuda), then run the GPU tests
#
# Runs, with PHASETRACE_GPU=1 and --nocapture (they print their tables):
#   - the `timing::cuda` unit tests (the probe and both constructors with a driver present);
#   - tests/it/gpu_backends_agree.rs: sync vs event backend on memsets of 1x/4x/16x the bytes
#     (agree within 5 %), event times on the host timeline (also after re-anchoring), the event
#     backend's throughput overhead on a loop of small kernels, graph-capture skipping.
# Tests run one at a time (they share the GPU and measure time). The test run itself takes well
# under a minute on an H200 and is capped by RUN_TIMEOUT (default 240 s); building from a warm
# cargo cache adds about a minute (capped by BUILD_TIMEOUT, default 600 s).
#
# Environment:
#   PHASETRACE_CARGO_FLAGS  extra cargo flags, e.g. "--offline" on a machine without network
#   BUILD_TIMEOUT / RUN_TIMEOUT  seconds
# Exit status: 0 when every check passed; cargo's (or timeout's 124) otherwise.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

log() { printf '[gpu-check] %s\n' "$*" >&2; }

if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 || true
else
    log "nvidia-smi not found; continuing (the tests need libcuda and a device, not nvidia-smi)"
fi

# shellcheck disable=SC2206 # word splitting of the extra flags is intended
CARGO_FLAGS=(--release --features cuda ${PHASETRACE_CARGO_FLAGS:-})
TEST_ARGS=(--nocapture --test-threads 1 --include-ignored)

start=$SECONDS
log "building: cargo test ${CARGO_FLAGS[*]} --no-run -p phasetrace --lib --test it"
timeout "${BUILD_TIMEOUT:-600}" cargo test "${CARGO_FLAGS[@]}" --no-run -p phasetrace --lib --test it
log "built in $((SECONDS - start)) s"

export PHASETRACE_GPU=1
start=$SECONDS
log "running the timing::cuda unit tests"
timeout "${RUN_TIMEOUT:-240}" cargo test "${CARGO_FLAGS[@]}" -p phasetrace --lib timing::cuda -- "${TEST_ARGS[@]}"
log "running tests/it/gpu_backends_agree.rs"
timeout "${RUN_TIMEOUT:-240}" cargo test "${CARGO_FLAGS[@]}" -p phasetrace --test it gpu_backends_agree -- "${TEST_ARGS[@]}"
log "all GPU checks passed in $((SECONDS - start)) s"
