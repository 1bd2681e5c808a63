#!/usr/bin/env bash
# Runs every fuzz target in fuzz/ for SECONDS each (default 60), starting from the seed corpus
# in fuzz/corpus/<target>; what a run adds goes to a scratch corpus (target/fuzz-corpus/), so
# that the repository keeps its small seeds. A crash stops the script: its input is in
# fuzz/artifacts/<target>/; fix it, and keep it as a regression test (see docs/development.md).
#
#   scripts/fuzz.sh            # 60 s per target
#   scripts/fuzz.sh 300        # 5 minutes per target
#   FUZZ_TARGETS="accept settings" scripts/fuzz.sh 30
#
# cargo-fuzz needs nightly flags: RUSTC_BOOTSTRAP=1 lets the stable toolchain take them. The
# address sanitizer is used when its runtime is there, else none (-s none).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET="${1:-60}"
export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: cargo-fuzz is not installed: cargo install cargo-fuzz --locked" >&2
    exit 2
fi
targets="${FUZZ_TARGETS:-$(cd fuzz && cargo fuzz list)}"
sanitizer="${FUZZ_SANITIZER:-}"
if [ -z "$sanitizer" ]; then
    sanitizer=address
    first=$(echo "$targets" | head -n1)
    if ! (cd fuzz && cargo fuzz build -s address "$first") >/dev/null 2>&1; then
        echo "fuzz.sh: no address-sanitizer runtime here: building with -s none" >&2
        sanitizer=none
    fi
fi
# `cargo fuzz build` takes one target or none (then every target).
if [ -n "${FUZZ_TARGETS:-}" ]; then
    for t in $targets; do (cd fuzz && cargo fuzz build -s "$sanitizer" "$t"); done
else
    (cd fuzz && cargo fuzz build -s "$sanitizer")
fi
for t in $targets; do
    scratch="target/fuzz-corpus/$t"
    mkdir -p "$scratch"
    echo "fuzz.sh: $t for ${SECONDS_PER_TARGET}s (-s $sanitizer)"
    log="target/fuzz-corpus/$t.log"
    # scrape_request keeps one profiler (its endpoint and worker threads) for the process's
    # life on purpose: LeakSanitizer would report that as a leak, so it is off for that target.
    leaks=1
    [ "$t" = scrape_request ] && leaks=0
    if (cd fuzz && ASAN_OPTIONS="detect_leaks=$leaks" cargo fuzz run -s "$sanitizer" "$t" "../$scratch" "corpus/$t" -- \
        -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -detect_leaks="$leaks") \
        >"$log" 2>&1; then
        status=0
    else
        status=$?
    fi
    grep -E '^(#[0-9]+.*DONE|stat::number_of_executed_units|stat::peak_rss_mb)' "$log" || true
    if [ "$status" -ne 0 ]; then
        tail -n 40 "$log" >&2
        echo "fuzz.sh: $t failed (exit $status); the input is in fuzz/artifacts/$t/" >&2
        exit 1
    fi
done
echo "fuzz.sh: every target ran ${SECONDS_PER_TARGET}s without a failure"
