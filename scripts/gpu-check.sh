#!/usr/bin/env bash
# GPU checks of the CUDA timing backends (src/timing/cuda/) and the CUDA-graph path.
#
#   scripts/gpu-bundle.sh DIR                  # on a development machine (cargo, network)
#   bash DIR/gpu-check.sh --prebuilt DIR       # on the GPU machine: driver + toolkit only
#   scripts/gpu-check.sh                       # both at once, on a GPU machine that has cargo
#
# With --prebuilt nothing is built and cargo is never called. It runs, one at a time (they share
# the GPU and measure time), with PHASETRACE_GPU=1:
#   - the library's `timing::cuda` unit tests (probe, constructors with a driver present);
#   - tests/it/gpu_backends_agree.rs: sync vs events on memsets, events on the host timeline,
#     throughput overhead, capture skipping, sections inside a captured graph timed at replay;
#   - phasetrace-gpu-bench: a decode loop of real kernels (spin kernels of known duration, cuBLAS
#     decode GEMMs), eager and as a CUDA graph, with every clock;
#   - phasetrace-candle-cuda, when the bundle has it: the candle decoder on candle's CUDA device,
#     candle's stream handed to phasetrace: tokens/s unprofiled vs host vs sync vs events, the
#     same tokens in every variant, each layer's time per token under each clock;
# then prints one table of every figure. Each step has its own timeout (TESTS_TIMEOUT, default
# 150 s; BENCH_TIMEOUT, default 100 s; CANDLE_TIMEOUT, default 150 s): under 10 minutes in all.
#
# Without a usable NVIDIA driver it stops at once with a clear message (exit 3).
# cuBLAS is found in CUDA_HOME/lib64, /usr/local/cuda/lib64 or the loader path, CUDA 12 or 13
# (an unversioned link to the newest libcublas.so.N is made in a private folder when needed).
# Exit status: 0 when every check passed and every goal was met; 1 when a check failed;
# 3 without a driver; 2 on bad arguments.
set -uo pipefail

log() { printf '[gpu-check] %s\n' "$*" >&2; }
usage() {
    log "usage: gpu-check.sh [--prebuilt DIR]"
    exit 2
}

PREBUILT=""
while [ $# -gt 0 ]; do
    case "$1" in
    --prebuilt)
        [ $# -ge 2 ] || usage
        PREBUILT="$2"
        shift 2
        ;;
    -h | --help) usage ;;
    *)
        log "unknown argument: $1"
        usage
        ;;
    esac
done

if [ -z "$PREBUILT" ]; then
    ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    PREBUILT="$ROOT/gpu-bundle"
    log "no --prebuilt DIR: building the bundle into $PREBUILT first"
    "$ROOT/scripts/gpu-bundle.sh" "$PREBUILT" || exit 1
fi
DIR="$(cd "$PREBUILT" 2>/dev/null && pwd)" || {
    log "error: --prebuilt $PREBUILT: no such folder (make it with scripts/gpu-bundle.sh)"
    exit 2
}
for bin in phasetrace-lib-tests phasetrace-it-tests phasetrace-gpu-bench; do
    if [ ! -x "$DIR/$bin" ]; then
        log "error: --prebuilt $DIR: $bin is missing (make the folder with scripts/gpu-bundle.sh)"
        exit 2
    fi
done

# The binaries need the glibc they were linked against (MANIFEST says which), nothing else.
need="$(sed -n 's/^needs glibc >= //p' "$DIR/MANIFEST" 2>/dev/null)"
have="$(getconf GNU_LIBC_VERSION 2>/dev/null | cut -d' ' -f2)"
if [ -n "$need" ] && [ -n "$have" ] &&
    [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n 1)" != "$need" ]; then
    log "error: the bundle needs glibc >= $need, this machine has $have (build it on an older distribution)"
    exit 2
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# cudarc opens libcublas by its unversioned name or by .so.12/.11; a CUDA 13 toolkit ships
# libcublas.so.13 (and its own libcublasLt.so.13, found by soname on the same path).
LIBDIRS=()
for d in "${CUDA_HOME:-}/lib64" "${CUDA_PATH:-}/lib64" /usr/local/cuda/lib64 \
    /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/targets/sbsa-linux/lib; do
    [ -d "$d" ] && LIBDIRS+=("$d")
done
mkdir -p "$WORK/lib"
for d in "${LIBDIRS[@]}"; do
    for name in libcublas libcublasLt; do
        if [ ! -e "$WORK/lib/$name.so" ] && [ ! -e "$d/$name.so" ]; then
            newest="$(ls "$d/$name.so."[0-9]* 2>/dev/null | sort -V | tail -n 1)"
            [ -n "$newest" ] && ln -s "$newest" "$WORK/lib/$name.so"
        fi
    done
done
LD_LIBRARY_PATH="$WORK/lib$(printf ':%s' "${LIBDIRS[@]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH

if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 || true
fi

# The driver first: without one, stop now with the probe's own words.
if ! probe="$("$DIR/phasetrace-gpu-bench" --probe 2>&1)"; then
    log "error: no usable NVIDIA GPU here: ${probe#phasetrace-gpu-bench: }"
    log "(the checks need the NVIDIA driver's libcuda.so.1 on the loader path and a CUDA device 0)"
    exit 3
fi
log "$probe"

export PHASETRACE_GPU=1
TEST_ARGS=(--nocapture --test-threads 1 --include-ignored)
status=0
start=$SECONDS

run_tests() { # name, binary, filter
    log "running $1"
    timeout "${TESTS_TIMEOUT:-150}" "$DIR/$2" "$3" "${TEST_ARGS[@]}" >"$WORK/$1.log" 2>&1
    local rc=$?
    cat "$WORK/$1.log" >&2
    [ $rc -eq 0 ] || { log "$1 failed (exit $rc)"; status=1; }
}
run_tests lib-tests phasetrace-lib-tests timing::cuda
run_tests it-tests phasetrace-it-tests gpu_backends_agree

log "running phasetrace-gpu-bench"
timeout "${BENCH_TIMEOUT:-100}" "$DIR/phasetrace-gpu-bench" >"$WORK/bench.log" 2>&1
rc=$?
cat "$WORK/bench.log" >&2
[ $rc -eq 0 ] || { log "phasetrace-gpu-bench failed (exit $rc)"; status=1; }

# The candle engine is linked against the CUDA 13 libraries (candle's `cuda` feature): look for
# them where the toolkit or NVIDIA's Python wheels (nvidia/cu13/lib) put them, then check that
# the loader finds every one before running it.
# The bundle carries it gzipped (scripts/gpu-bundle.sh): unpacked into the work folder.
candle=""
if [ -f "$DIR/phasetrace-candle-cuda.gz" ]; then
    if gunzip -c "$DIR/phasetrace-candle-cuda.gz" >"$WORK/phasetrace-candle-cuda"; then
        chmod +x "$WORK/phasetrace-candle-cuda"
        candle="$WORK/phasetrace-candle-cuda"
    else
        log "phasetrace-candle-cuda.gz does not unpack (gunzip failed)"
        status=1
    fi
elif [ -x "$DIR/phasetrace-candle-cuda" ]; then
    candle="$DIR/phasetrace-candle-cuda"
fi
if [ -n "$candle" ]; then
    for py in python3 python; do
        wheel_lib="$("$py" -c 'import nvidia.cu13, os; print(os.path.join(list(nvidia.cu13.__path__)[0], "lib"))' 2>/dev/null)" && break
    done
    if [ -n "${wheel_lib:-}" ] && [ -d "$wheel_lib" ]; then
        LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$wheel_lib"
    fi
    missing="$(ldd "$candle" 2>/dev/null | awk '/not found/ {print $1}' | tr '\n' ' ')"
    if [ -n "$missing" ]; then
        log "phasetrace-candle-cuda cannot start: the loader finds no ${missing}(LD_LIBRARY_PATH=$LD_LIBRARY_PATH)"
        printf 'FIGURE\tcandle engine on CUDA\tcannot start: no %s\tstarts\tMISSING\n' "$missing" >"$WORK/candle.log"
        status=1
    else
        run_candle() { # log name, figure name, arguments
            local log="$WORK/$1.log" name="$2"
            shift 2
            log "running phasetrace-candle-cuda $*"
            timeout "${CANDLE_TIMEOUT:-150}" "$candle" "$@" >"$log" 2>&1
            local rc=$?
            cat "$log" >&2
            if [ $rc -ne 0 ]; then
                log "phasetrace-candle-cuda $* failed (exit $rc)"
                printf 'FIGURE\t%s\texit %s\texit 0\tFAILED\n' "$name" "$rc" >>"$log"
                status=1
                return 1
            fi
        }
        # One sequence, then the same engine serving requests under continuous batching (its
        # figures named `serving: ...`).
        run_candle candle "candle engine on CUDA" &&
            run_candle candle-serve "candle engine on CUDA, serving" --serve
    fi
else
    log "no phasetrace-candle-cuda in the bundle ($(sed -n 's/^candle engine //p' "$DIR/MANIFEST" 2>/dev/null | head -n 1)): skipped"
fi

# One table: every test's verdict, every FIGURE line the tests and the bench printed.
{
    printf 'figure\tvalue\tgoal\tverdict\n'
    for f in lib-tests it-tests; do
        sed -n 's/^test \(.*\) \.\.\. \(ok\|FAILED\|ignored\)$/test \1\t\2\t\t/p' "$WORK/$f.log"
    done
    cat "$WORK"/*.log | sed -n 's/^FIGURE\t//p'
} >"$WORK/table.tsv"
if grep -q $'\tMISSED$\|\tMISSING$\|\tFAILED\t' "$WORK/table.tsv"; then
    status=1
fi
echo
echo "phasetrace GPU check ($(cat "$DIR/MANIFEST" 2>/dev/null | head -n 1)), $((SECONDS - start)) s"
awk -F '\t' '
    NR == FNR { for (i = 1; i <= NF; i++) if (length($i) > w[i]) w[i] = length($i); next }
    { printf ("%-" w[1] "s  %-" w[2] "s  %-" w[3] "s  %s\n"), $1, $2, $3, $4 }
' "$WORK/table.tsv" "$WORK/table.tsv"
exit $status
