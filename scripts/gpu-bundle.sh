#!/usr/bin/env bash
# Builds the GPU checks into one folder that runs where the GPU is, without cargo or network.
#
#   scripts/gpu-bundle.sh [DIR]        # DIR defaults to gpu-bundle/ (git-ignored)
#   scripts/gpu-check.sh --prebuilt DIR   # then, on the GPU machine
#
# DIR receives, built in release with --features cuda and stripped:
#   phasetrace-lib-tests   the library's unit tests (the timing::cuda ones run there)
#   phasetrace-it-tests    the integration tests (gpu_backends_agree runs there)
#   phasetrace-gpu-bench   the decode loop of real kernels, eager and as a CUDA graph
#   phasetrace-candle-cuda the candle decoder on candle's CUDA device (engines/candle-cuda), only
#                          where nvcc is: see below
#   gpu-check.sh           the runner, and MANIFEST (commit, toolchain, sizes)
# The test executables are found through `cargo test --no-run --message-format=json`. These
# binaries link only the C library dynamically; the CUDA driver, cuBLAS and friends are opened
# at run time (cudarc's dynamic loading), so nothing else is needed there.
#
# The candle engine is another matter: candle-core's `cuda` feature compiles its kernels with
# nvcc at build time (for CUDA_COMPUTE_CAP, default 90: H100/H200) and links the CUDA 13
# libraries (libcuda.so.1, libcudart.so.13, libcublas(Lt).so.13, libcurand.so.10,
# libnvrtc.so.13), which the GPU machine's toolkit provides. It is built when nvcc is on PATH,
# or when .cuda/env exists (scripts/cuda-wheels.sh installs nvcc and the libraries from PyPI);
# otherwise it is left out with a warning. CANDLE_CUDA=require makes that an error, =skip never
# builds it.
#
# The folder must stay under MAX_MIB (default 48) MiB; the script fails otherwise.
#
# Environment: PHASETRACE_CARGO_FLAGS (extra cargo flags, e.g. --offline), MAX_MIB, CANDLE_CUDA
# (auto | require | skip), CUDA_COMPUTE_CAP.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DIR="${1:-$ROOT/gpu-bundle}"
MAX_MIB="${MAX_MIB:-48}"

log() { printf '[gpu-bundle] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v cargo >/dev/null 2>&1 || die "cargo is not on PATH (the bundle is built on a development machine)"
command -v jq >/dev/null 2>&1 || die "jq is not on PATH (needed to read cargo's JSON messages)"

# shellcheck disable=SC2206 # word splitting of the extra flags is intended
FLAGS=(--release --features cuda ${PHASETRACE_CARGO_FLAGS:-})
# Strip at link time: no debug info, no symbols (the release profile keeps line tables).
export CARGO_PROFILE_RELEASE_STRIP=symbols CARGO_PROFILE_RELEASE_DEBUG=0

messages="$(mktemp)"
candle_messages="$(mktemp)"
trap 'rm -f "$messages" "$candle_messages"' EXIT

log "building the test executables: cargo test ${FLAGS[*]} --no-run -p phasetrace --lib --test it"
cargo test "${FLAGS[@]}" --no-run --message-format=json -p phasetrace --lib --test it >"$messages"
# The benchmark package always enables phasetrace's `cuda` feature; it has none of its own.
# shellcheck disable=SC2206
BENCH_FLAGS=(--release ${PHASETRACE_CARGO_FLAGS:-})
log "building the benchmark: cargo build ${BENCH_FLAGS[*]} -p phasetrace-gpu-bench"
cargo build "${BENCH_FLAGS[@]}" --message-format=json -p phasetrace-gpu-bench >>"$messages"

# The candle engine on CUDA: a workspace of its own (engines/candle-cuda), built where nvcc is.
CANDLE_CUDA="${CANDLE_CUDA:-auto}"
case "$CANDLE_CUDA" in auto | require | skip) ;; *) die "CANDLE_CUDA=$CANDLE_CUDA: expected auto, require or skip" ;; esac
candle_note="not built (CANDLE_CUDA=skip)"
if [ "$CANDLE_CUDA" != skip ]; then
    if ! command -v nvcc >/dev/null 2>&1 && [ -f "$ROOT/.cuda/env" ]; then
        # shellcheck disable=SC1091 # written by scripts/cuda-wheels.sh
        source "$ROOT/.cuda/env"
    fi
    if command -v nvcc >/dev/null 2>&1; then
        export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
        log "building the candle engine: cargo build ${BENCH_FLAGS[*]} --manifest-path engines/candle-cuda/Cargo.toml (nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), sm_$CUDA_COMPUTE_CAP)"
        cargo build "${BENCH_FLAGS[@]}" --message-format=json \
            --manifest-path engines/candle-cuda/Cargo.toml >"$candle_messages"
        candle_note="built with nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') for sm_$CUDA_COMPUTE_CAP"
    elif [ "$CANDLE_CUDA" = require ]; then
        die "CANDLE_CUDA=require but nvcc is not on PATH (scripts/cuda-wheels.sh, then source .cuda/env)"
    else
        log "warning: no nvcc: the candle engine is left out of the bundle (scripts/cuda-wheels.sh installs one)"
        candle_note="not built (no nvcc on the build machine)"
    fi
fi

# One executable per target: the library's test harness, the `it` test, the bench binary.
exe() {
    jq -r --arg kind "$1" --arg name "$2" --argjson test "$3" '
        select(.reason == "compiler-artifact" and .executable != null
               and .target.name == $name and (.target.kind | index($kind))
               and .profile.test == $test) | .executable' "${4:-$messages}" | tail -n 1
}
lib_tests="$(exe lib phasetrace true)"
it_tests="$(exe test it true)"
bench="$(exe bin phasetrace-gpu-bench false)"
[ -n "$lib_tests" ] || die "no library test executable in cargo's output"
[ -n "$it_tests" ] || die "no integration test executable in cargo's output"
[ -n "$bench" ] || die "no phasetrace-gpu-bench executable in cargo's output"

rm -rf "$DIR"
mkdir -p "$DIR"
cp "$lib_tests" "$DIR/phasetrace-lib-tests"
cp "$it_tests" "$DIR/phasetrace-it-tests"
cp "$bench" "$DIR/phasetrace-gpu-bench"
candle=""
if [ -s "$candle_messages" ]; then
    candle="$(exe bin phasetrace-candle-cuda false "$candle_messages")"
    [ -n "$candle" ] || die "no phasetrace-candle-cuda executable in cargo's output"
    cp "$candle" "$DIR/phasetrace-candle-cuda"
fi
cp scripts/gpu-check.sh "$DIR/gpu-check.sh"
# Already stripped by the profile; `strip` again where it exists (a no-op otherwise).
if command -v strip >/dev/null 2>&1; then
    strip "$DIR"/phasetrace-* || true
fi
chmod +x "$DIR"/phasetrace-* "$DIR/gpu-check.sh"
# The candle engine is 45 MB (candle's PTX and sm_90a kernels inside), more than the bundle's
# room beside the others: gzip takes it to about 11 MiB, and gpu-check.sh unpacks it into its
# work folder.
if [ -n "$candle" ]; then
    gzip -9 -n "$DIR/phasetrace-candle-cuda"
fi

{
    echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m) with $(rustc --version)"
    echo "cargo flags ${FLAGS[*]}"
    (cd "$DIR" && ls -l phasetrace-* gpu-check.sh | awk '{print $5, $9}')
    echo "candle engine $candle_note"
    if [ -n "$candle" ] && command -v objdump >/dev/null 2>&1; then
        echo "candle engine links $(objdump -p "$candle" | awk '/NEEDED/ {print $2}' | tr '\n' ' ')"
    fi
    # The binaries link glibc dynamically (dlopen of the CUDA libraries needs it): the GPU
    # machine's glibc must be at least the newest version they reference.
    if command -v objdump >/dev/null 2>&1; then
        echo "needs glibc >= $(objdump -T "$DIR"/phasetrace-*[!z] ${candle:+"$candle"} 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1 | cut -d_ -f2)"
    fi
} >"$DIR/MANIFEST"

kib="$(du -sk "$DIR" | cut -f1)"
log "bundle: $DIR, $((kib / 1024)) MiB"
if [ "$kib" -gt $((MAX_MIB * 1024)) ]; then
    die "the bundle is $((kib / 1024)) MiB, over the $MAX_MIB MiB limit"
fi
log "run it on the GPU machine with: bash $DIR/gpu-check.sh --prebuilt $DIR"
