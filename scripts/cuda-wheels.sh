#!/usr/bin/env bash
# Installs a CUDA 13.0 toolkit for *building* (nvcc, headers, link-time libraries) from NVIDIA's
# PyPI wheels into a git-ignored folder, for the CUDA build of the candle engine
# (engines/candle-cuda, candle-core's `cuda` feature: its kernels are compiled with nvcc).
#
#   scripts/cuda-wheels.sh [DIR]       # DIR defaults to .cuda/ (git-ignored); about 1.3 GiB
#   source DIR/env                     # CUDA_HOME, PATH (nvcc), CUDA_COMPUTE_CAP
#
# No GPU and no driver are needed to build: CUDA_COMPUTE_CAP (default 90: H100/H200) replaces
# nvidia-smi's answer. The wheels are pinned to CUDA 13.0 because the kernels are shipped as
# PTX and a driver JIT-compiles only the PTX versions it knows: PTX from nvcc 13.0 (ISA 9.0)
# loads on drivers 580 and later, a newer nvcc's would not.
#
# What the wheels lack, made here:
#   - unversioned names of the libraries that cudarc's `dynamic-linking` (which candle-core's
#     `cuda` feature selects) links by name (libcublas.so -> libcublas.so.13, and so on);
#   - lib/stubs/libcuda.so, a stub of the driver library (soname libcuda.so.1) exporting every
#     driver function cudarc binds, built with the C compiler (the real one comes with the
#     driver, at run time, on the GPU machine; the wheels carry none).
#
# Environment: PIP (default python3 -m pip), CUDA_COMPUTE_CAP, CC (default cc).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/.cuda}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"

log() { printf '[cuda-wheels] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# One CUDA release: 13.0 (nvcc 13.0.88, the runtime of 13.0 Update 2, cuBLAS of 13.0).
WHEELS=(
    nvidia-cuda-nvcc==13.0.88
    nvidia-nvvm==13.0.88
    nvidia-cuda-crt==13.0.88
    nvidia-cuda-runtime==13.0.96
    nvidia-cuda-cccl==13.0.85
    nvidia-cuda-nvrtc==13.0.88
    nvidia-curand==10.4.0.35
    nvidia-cublas==13.0.2.14
)
read -r -a PIP <<<"${PIP:-python3 -m pip}"
CC="${CC:-cc}"
command -v "$CC" >/dev/null 2>&1 || die "no C compiler ($CC): nvcc needs one as its host compiler"
command -v jq >/dev/null 2>&1 || die "jq is not on PATH (needed to find cudarc's sources)"

stamp="$DIR/site/.installed"
want="$(printf '%s\n' "${WHEELS[@]}")"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    log "downloading ${#WHEELS[@]} wheels into $DIR/wheels"
    "${PIP[@]}" download --quiet --no-deps --only-binary=:all: -d "$DIR/wheels" "${WHEELS[@]}"
    rm -rf "$DIR/site"
    log "unpacking them into $DIR/site"
    files=()
    for w in "${WHEELS[@]}"; do
        name="${w%%==*}"
        version="${w##*==}"
        f="$(ls "$DIR/wheels/${name//-/_}-$version-"*.whl 2>/dev/null | head -n 1)"
        [ -n "$f" ] || die "the wheel of $w was not downloaded"
        files+=("$f")
    done
    "${PIP[@]}" install --quiet --no-deps --no-compile --target "$DIR/site" "${files[@]}"
    printf '%s\n' "$want" >"$stamp"
fi

CUDA_ROOT="$DIR/site/nvidia/cu13"
[ -x "$CUDA_ROOT/bin/nvcc" ] || die "no nvcc in $CUDA_ROOT/bin after the install"
[ -x "$CUDA_ROOT/nvvm/bin/cicc" ] || die "no cicc in $CUDA_ROOT/nvvm/bin (nvidia-nvvm)"

# Link-time names.
lib="$CUDA_ROOT/lib"
ln -sfn lib "$CUDA_ROOT/lib64"
for so in "$lib"/lib*.so.[0-9]*; do
    base="$(basename "$so")"
    case "$base" in *.alt.so.* | libnvrtc-builtins*) continue ;; esac
    ln -sfn "$base" "$lib/${base%%.so.*}.so"
done

# The driver stub: every `cu*` symbol cudarc's driver bindings can call.
if ! meta="$(cargo metadata --format-version 1 --locked \
    --manifest-path "$ROOT/engines/candle-cuda/Cargo.toml" 2>"$DIR/metadata.err")"; then
    die "cargo metadata --locked on engines/candle-cuda failed (is its Cargo.lock current?): $(tail -n 3 "$DIR/metadata.err")"
fi
cudarc_src="$(jq -r '.packages[] | select(.name == "cudarc") | .manifest_path' <<<"$meta" | head -n 1)"
[ -n "$cudarc_src" ] || die "cudarc is not in engines/candle-cuda's dependency graph (cargo metadata)"
bindings="$(dirname "$cudarc_src")/src/driver/sys/mod.rs"
mkdir -p "$lib/stubs"
grep -o 'load::<_F>("cu[A-Za-z0-9_]*")' "$bindings" | sed 's/.*("\(.*\)")/\1/' | sort -u |
    awk '{ printf "int %s(void) { return 34; }\n", $1 }' >"$lib/stubs/libcuda.c"
# 34 is CUDA_ERROR_STUB_LIBRARY: what NVIDIA's own stub answers.
"$CC" -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$lib/stubs/libcuda.so" "$lib/stubs/libcuda.c"
log "driver stub: $(wc -l <"$lib/stubs/libcuda.c") functions in $lib/stubs/libcuda.so"

cat >"$DIR/env" <<EOF
# Written by scripts/cuda-wheels.sh: the CUDA 13.0 wheels as a build toolkit.
export CUDA_HOME="$CUDA_ROOT"
export CUDA_PATH="$CUDA_ROOT"
export NVCC="$CUDA_ROOT/bin/nvcc"
export PATH="$CUDA_ROOT/bin:\$PATH"
export CUDA_COMPUTE_CAP="\${CUDA_COMPUTE_CAP:-${CUDA_COMPUTE_CAP:-90}}"
EOF
log "$("$CUDA_ROOT/bin/nvcc" --version | tail -n 2 | head -n 1)"
log "done: source $DIR/env"
