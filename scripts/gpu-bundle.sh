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
#   gpu-check.sh           the runner, and MANIFEST (commit, toolchain, sizes)
# The test executables are found through `cargo test --no-run --message-format=json`. The
# binaries link only the C library dynamically; the CUDA driver, cuBLAS and friends are opened
# at run time (cudarc's dynamic loading), so nothing else is needed there. The folder must stay
# under MAX_MIB (default 48) MiB; the script fails otherwise.
#
# Environment: PHASETRACE_CARGO_FLAGS (extra cargo flags, e.g. --offline), MAX_MIB.
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
trap 'rm -f "$messages"' EXIT

log "building the test executables: cargo test ${FLAGS[*]} --no-run -p phasetrace --lib --test it"
cargo test "${FLAGS[@]}" --no-run --message-format=json -p phasetrace --lib --test it >"$messages"
# The benchmark package always enables phasetrace's `cuda` feature; it has none of its own.
# shellcheck disable=SC2206
BENCH_FLAGS=(--release ${PHASETRACE_CARGO_FLAGS:-})
log "building the benchmark: cargo build ${BENCH_FLAGS[*]} -p phasetrace-gpu-bench"
cargo build "${BENCH_FLAGS[@]}" --message-format=json -p phasetrace-gpu-bench >>"$messages"

# One executable per target: the library's test harness, the `it` test, the bench binary.
exe() {
    jq -r --arg kind "$1" --arg name "$2" --argjson test "$3" '
        select(.reason == "compiler-artifact" and .executable != null
               and .target.name == $name and (.target.kind | index($kind))
               and .profile.test == $test) | .executable' "$messages" | tail -n 1
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
cp scripts/gpu-check.sh "$DIR/gpu-check.sh"
# Already stripped by the profile; `strip` again where it exists (a no-op otherwise).
if command -v strip >/dev/null 2>&1; then
    strip "$DIR"/phasetrace-* || true
fi
chmod +x "$DIR"/phasetrace-* "$DIR/gpu-check.sh"

{
    echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m) with $(rustc --version)"
    echo "cargo flags ${FLAGS[*]}"
    (cd "$DIR" && ls -l phasetrace-* gpu-check.sh | awk '{print $5, $9}')
    # The binaries link glibc dynamically (dlopen of the CUDA libraries needs it): the GPU
    # machine's glibc must be at least the newest version they reference.
    if command -v objdump >/dev/null 2>&1; then
        echo "needs glibc >= $(objdump -T "$DIR"/phasetrace-* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1 | cut -d_ -f2)"
    fi
} >"$DIR/MANIFEST"

kib="$(du -sk "$DIR" | cut -f1)"
log "bundle: $DIR, $((kib / 1024)) MiB"
if [ "$kib" -gt $((MAX_MIB * 1024)) ]; then
    die "the bundle is $((kib / 1024)) MiB, over the $MAX_MIB MiB limit"
fi
log "run it on the GPU machine with: bash $DIR/gpu-check.sh --prebuilt $DIR"
