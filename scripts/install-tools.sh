#!/usr/bin/env bash
# Installs the real peer processes that phasetrace's integration tests and the bundled stack run:
#   - Prometheus 3 and promtool, Jaeger v2, phasetrace's OpenTelemetry Collector
#     (tools/otelcol) and Thanos (tools/thanos), each built from its Go module at the version
#     pinned in tools/versions.env
#   - rotel (`rotel-agent`, an OpenTelemetry collector) from PyPI into .tools/venv
#   - docker-compose from Debian (only used to validate compose files with `config -q`)
# and writes .tools/env, which exports the absolute paths of those binaries.
#
# Each Go program is built once per pinned version into .tools/bin/NAME-VERSION/, so a re-run
# only checks that the binaries are there and a rebuild happens only when a pin in
# tools/versions.env (or tools/otelcol/main.go) changes.
# Meant to run as root on Debian 12 (as CI does); as another user it uses sudo for apt when that
# is available. Needs Go >= 1.26 on PATH (Prometheus 3.16's go.mod asks for 1.26.7).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.tools"
VENV="$TOOLS/venv"
VERSIONS="$ROOT/tools/versions.env"
[ -f "$VERSIONS" ] || { printf '[install-tools] error: %s is missing\n' "$VERSIONS" >&2; exit 1; }
# shellcheck source=../tools/versions.env
source "$VERSIONS"
ROTEL_VERSION="${PHASETRACE_ROTEL_VERSION:-$ROTEL_VERSION}"

log() { printf '[install-tools] %s\n' "$*" >&2; }
die() { printf '[install-tools] error: %s\n' "$*" >&2; exit 1; }

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO=(sudo); fi
fi

APT_UPDATED=0
apt_install() {
    # apt_install PKG... : installs with --no-install-recommends; runs `apt-get update`
    # only when the first attempt fails (stale or missing package lists).
    command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install $* by hand"
    export DEBIAN_FRONTEND=noninteractive
    if ! "${SUDO[@]}" apt-get install -y --no-install-recommends "$@" >&2; then
        if [ "$APT_UPDATED" -eq 0 ]; then
            log "apt-get install failed; running apt-get update and retrying"
            "${SUDO[@]}" apt-get update >&2
            APT_UPDATED=1
        fi
        "${SUDO[@]}" apt-get install -y --no-install-recommends "$@" >&2
    fi
}

mkdir -p "$TOOLS"

# ---------------------------------------------------------------- rotel (PyPI)
find_rotel() {
    local candidate
    for candidate in "$VENV"/bin/rotel-agent "$VENV"/lib/python3*/site-packages/rotel/rotel-agent; do
        if [ -x "$candidate" ] && [ -f "$candidate" ]; then
            printf '%s\n' "$candidate"
            return 0
        fi
    done
    if [ -d "$VENV/lib" ]; then
        candidate="$(find "$VENV/lib" -type f -name rotel-agent -perm -u+x 2>/dev/null | head -n 1)"
        if [ -n "$candidate" ]; then
            printf '%s\n' "$candidate"
            return 0
        fi
    fi
    return 1
}

ROTEL_BIN="$(find_rotel || true)"
if [ -z "$ROTEL_BIN" ]; then
    log "installing rotel $ROTEL_VERSION into $VENV"
    if [ ! -x "$VENV/bin/python" ]; then
        rm -rf "$VENV"
        if ! python3 -m venv "$VENV" >&2 2>/dev/null; then
            log "python3 -m venv failed; installing python3-venv"
            rm -rf "$VENV"
            apt_install python3-venv
            /usr/bin/python3 -m venv "$VENV" >&2
        fi
    fi
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "rotel==$ROTEL_VERSION" >&2
    ROTEL_BIN="$(find_rotel || true)"
    [ -n "$ROTEL_BIN" ] || die "rotel installed but no rotel-agent binary found under $VENV"
else
    log "rotel-agent present: $ROTEL_BIN"
fi

# ------------------------------------------------------------- docker-compose (Debian)
if ! command -v docker-compose >/dev/null 2>&1; then
    log "installing docker-compose from Debian"
    apt_install docker-compose
fi
command -v docker-compose >/dev/null 2>&1 || die "docker-compose not on PATH after install"

# ------------------------------------------- Prometheus 3, Jaeger v2, otelcol (Go modules)
command -v go >/dev/null 2>&1 || die "go not found on PATH: Go >= 1.26 builds Prometheus, Jaeger and the collector"
GO_MINOR="$(go env GOVERSION | sed -n 's/^go1\.\([0-9]*\).*/\1/p')"
[ -n "$GO_MINOR" ] && [ "$GO_MINOR" -ge 26 ] \
    || die "go $(go env GOVERSION) is too old: Prometheus $PROMETHEUS_VERSION needs Go >= 1.26"
# The Go module and build caches are Go's own (GOMODCACHE, GOCACHE; ~/go/pkg/mod and
# ~/.cache/go-build unless set), not .tools/: they outlive a fresh clone on the same machine, so
# a CI run in a new checkout links the binaries from cached packages (about a minute) instead of
# compiling some 2,000 packages again (about 20 minutes on 2 cores). -trimpath keeps the cache
# keys free of the checkout's path.
export GOFLAGS="-buildvcs=false -modcacherw" GOTOOLCHAIN=local
BIN="$TOOLS/bin"
BUILD="$TOOLS/build"
mkdir -p "$BIN" "$BUILD"

# have_build DEST_DIR: true when DEST_DIR (one pinned version's binaries) is complete.
have_build() { [ -f "$1/.complete" ]; }

# build_go NAME DEST_DIR BUILD_MODULE_DIR LDFLAGS TAGS PACKAGE... : builds each PACKAGE (a main
# package the build module requires) into DEST_DIR, atomically: DEST_DIR appears only complete.
build_go() {
    local name="$1" dest="$2" module="$3" ldflags="$4" tags="$5"
    shift 5
    local staging="$dest.partial" started pkg out
    started="$(date +%s)"
    rm -rf "$staging"
    mkdir -p "$staging"
    for pkg in "$@"; do
        out="$(basename "$pkg")"
        [ "$pkg" != . ] || out="$name"
        log "go build $pkg (tags: ${tags:-none})"
        (cd "$module" && nice -n 10 go build -trimpath -tags "$tags" -ldflags "-s -w $ldflags" \
            -o "$staging/$out" "$pkg") >&2 \
            || die "building $name ($pkg) failed; see the go output above"
    done
    touch "$staging/.complete"
    rm -rf "$dest"
    mv "$staging" "$dest"
    log "$name built in $(($(date +%s) - started)) s"
}

# new_module DIR NAME: an empty build module (its go.mod is written by `go get` below).
new_module() {
    rm -rf "$1"
    mkdir -p "$1"
    (cd "$1" && go mod init "phasetrace.local/$2" >/dev/null 2>&1)
}

# Prometheus and promtool. remove_all_sd leaves out the cloud service discoveries (file and
# http stay; the stack uses static_configs), which halves the build; netgo as upstream builds it.
# The web UI's assets are not in the module: the API is what the tests use.
PROM_DIR="$BIN/prometheus-$PROMETHEUS_VERSION"
if ! have_build "$PROM_DIR"; then
    log "building Prometheus $PROMETHEUS_VERSION (github.com/prometheus/prometheus@$PROMETHEUS_MODULE_VERSION)"
    MOD="$BUILD/prometheus-$PROMETHEUS_VERSION"
    new_module "$MOD" prometheus-build
    (cd "$MOD" && go get \
        "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_MODULE_VERSION" \
        "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_MODULE_VERSION") >&2 \
        || die "go get github.com/prometheus/prometheus@$PROMETHEUS_MODULE_VERSION failed"
    build_go prometheus "$PROM_DIR" "$MOD" \
        "-X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION -X github.com/prometheus/common/version.Branch=module-$PROMETHEUS_MODULE_VERSION" \
        "netgo,remove_all_sd" \
        github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool
else
    log "Prometheus $PROMETHEUS_VERSION present: $PROM_DIR"
fi

# Jaeger v2 (one binary, a collector-style YAML config; query API /api/v3).
JAEGER_DIR="$BIN/jaeger-$JAEGER_VERSION"
if ! have_build "$JAEGER_DIR"; then
    log "building Jaeger $JAEGER_VERSION (github.com/jaegertracing/jaeger@$JAEGER_MODULE_VERSION)"
    MOD="$BUILD/jaeger-$JAEGER_VERSION"
    new_module "$MOD" jaeger-build
    (cd "$MOD" && go get "github.com/jaegertracing/jaeger/cmd/jaeger@$JAEGER_MODULE_VERSION") >&2 \
        || die "go get github.com/jaegertracing/jaeger/cmd/jaeger@$JAEGER_MODULE_VERSION failed"
    build_go jaeger "$JAEGER_DIR" "$MOD" \
        "-X github.com/jaegertracing/jaeger/internal/version.latestVersion=v$JAEGER_VERSION" "" \
        github.com/jaegertracing/jaeger/cmd/jaeger
else
    log "Jaeger $JAEGER_VERSION present: $JAEGER_DIR"
fi

# The collector: tools/otelcol/main.go with the components of otel-config/collector.yaml. Its
# folder name carries a hash of main.go, so a changed component list rebuilds too.
OTELCOL_SRC="$ROOT/tools/otelcol/main.go"
[ -f "$OTELCOL_SRC" ] || die "$OTELCOL_SRC is missing"
OTELCOL_HASH="$(sha256sum "$OTELCOL_SRC" | cut -c1-12)"
OTELCOL_DIR="$BIN/otelcol-${OTELCOL_VERSION#v}-$OTELCOL_HASH"
if ! have_build "$OTELCOL_DIR"; then
    log "building otelcol ${OTELCOL_VERSION#v} (collector $OTELCOL_VERSION/$OTELCOL_CORE_VERSION, contrib $OTELCOL_CONTRIB_VERSION)"
    MOD="$BUILD/otelcol-${OTELCOL_VERSION#v}"
    new_module "$MOD" otelcol
    cp "$OTELCOL_SRC" "$MOD/main.go"
    C=go.opentelemetry.io/collector
    CONTRIB=github.com/open-telemetry/opentelemetry-collector-contrib
    (cd "$MOD" && go get \
        "$C/otelcol@$OTELCOL_VERSION" \
        "$C/service@$OTELCOL_VERSION" \
        "$C/receiver/otlpreceiver@$OTELCOL_VERSION" \
        "$C/processor/batchprocessor@$OTELCOL_VERSION" \
        "$C/processor/memorylimiterprocessor@$OTELCOL_VERSION" \
        "$C/exporter/otlpexporter@$OTELCOL_VERSION" \
        "$C/component@$OTELCOL_CORE_VERSION" \
        "$C/confmap@$OTELCOL_CORE_VERSION" \
        "$C/confmap/provider/envprovider@$OTELCOL_CORE_VERSION" \
        "$C/confmap/provider/fileprovider@$OTELCOL_CORE_VERSION" \
        "$C/confmap/provider/yamlprovider@$OTELCOL_CORE_VERSION" \
        "$C/exporter@$OTELCOL_CORE_VERSION" \
        "$C/extension@$OTELCOL_CORE_VERSION" \
        "$C/processor@$OTELCOL_CORE_VERSION" \
        "$C/receiver@$OTELCOL_CORE_VERSION" \
        "$CONTRIB/exporter/prometheusexporter@$OTELCOL_CONTRIB_VERSION" \
        "$CONTRIB/extension/healthcheckextension@$OTELCOL_CONTRIB_VERSION" \
        && go mod tidy) >&2 \
        || die "resolving the collector modules ($OTELCOL_VERSION/$OTELCOL_CORE_VERSION, contrib $OTELCOL_CONTRIB_VERSION) failed"
    # Every collector module that the binary is built from at the pinned release, none lifted
    # by another's requirements.
    drift="$(cd "$MOD" && go list -deps -f '{{with .Module}}{{.Path}} {{.Version}}{{end}}' . | sort -u | awk -v v0="$OTELCOL_VERSION" -v v1="$OTELCOL_CORE_VERSION" -v vc="$OTELCOL_CONTRIB_VERSION" '
        $1 ~ /^go\.opentelemetry\.io\/collector(\/|$)/ && $2 != v0 && $2 != v1 { print }
        $1 ~ /^github\.com\/open-telemetry\/opentelemetry-collector-contrib\// && $2 != vc { print }')"
    [ -z "$drift" ] || die "collector modules off the pinned release (tools/versions.env): $drift"
    build_go otelcol "$OTELCOL_DIR" "$MOD" "-X main.version=${OTELCOL_VERSION#v}" "" .
else
    log "otelcol ${OTELCOL_VERSION#v} present: $OTELCOL_DIR"
fi

# Thanos (scripts/fleet.py's receive hashring, querier and ruler). Its go.mod has `replace`
# directives, which only a main module's go.mod applies, so it is built from tools/thanos/go.mod
# (the same replacements), copied into the build folder, where `go get` adds the requirements.
# Thanos v0.42.5 asks for Go 1.26.10: GOTOOLCHAIN names a newer toolchain, which the go command
# fetches from the module proxy once (into the module cache). The tags are upstream's
# (.promu.yml): Thanos needs Prometheus's slice-backed labels (`slicelabels`); without the tag
# the querier panics decoding a store's label sets.
THANOS_DIR="$BIN/thanos-$THANOS_VERSION"
THANOS_MOD_SRC="$ROOT/tools/thanos/go.mod"
[ -f "$THANOS_MOD_SRC" ] || die "$THANOS_MOD_SRC is missing"
if ! have_build "$THANOS_DIR"; then
    log "building Thanos $THANOS_VERSION (github.com/thanos-io/thanos@$THANOS_MODULE_VERSION, toolchain $THANOS_GOTOOLCHAIN)"
    MOD="$BUILD/thanos-$THANOS_VERSION"
    rm -rf "$MOD"
    mkdir -p "$MOD"
    cp "$THANOS_MOD_SRC" "$MOD/go.mod"
    (cd "$MOD" && GOTOOLCHAIN="$THANOS_GOTOOLCHAIN" go get \
        "github.com/thanos-io/thanos/cmd/thanos@$THANOS_MODULE_VERSION") >&2 \
        || die "go get github.com/thanos-io/thanos/cmd/thanos@$THANOS_MODULE_VERSION failed (toolchain $THANOS_GOTOOLCHAIN)"
    GOTOOLCHAIN="$THANOS_GOTOOLCHAIN" build_go thanos "$THANOS_DIR" "$MOD" \
        "-X github.com/prometheus/common/version.Version=$THANOS_VERSION" "netgo,slicelabels" \
        github.com/thanos-io/thanos/cmd/thanos
else
    log "Thanos $THANOS_VERSION present: $THANOS_DIR"
fi
THANOS_BIN="$THANOS_DIR/thanos"

# Stable names for a person at a shell (and the harnesses' fallbacks): .tools/bin/NAME.
ln -sfn "prometheus-$PROMETHEUS_VERSION/prometheus" "$BIN/prometheus"
ln -sfn "prometheus-$PROMETHEUS_VERSION/promtool" "$BIN/promtool"
ln -sfn "jaeger-$JAEGER_VERSION/jaeger" "$BIN/jaeger"
ln -sfn "$(basename "$OTELCOL_DIR")/otelcol" "$BIN/otelcol"
ln -sfn "thanos-$THANOS_VERSION/thanos" "$BIN/thanos"
PROMETHEUS_BIN="$PROM_DIR/prometheus"
PROMTOOL_BIN="$PROM_DIR/promtool"
JAEGER_BIN="$JAEGER_DIR/jaeger"
OTELCOL_BIN="$OTELCOL_DIR/otelcol"
for bin in "$PROMETHEUS_BIN" "$PROMTOOL_BIN" "$JAEGER_BIN" "$OTELCOL_BIN" "$THANOS_BIN"; do
    [ -x "$bin" ] || die "$bin is missing after the build"
done

# ------------------------------------------------------------------ .tools/env
cat >"$TOOLS/env.tmp" <<ENV
# Written by scripts/install-tools.sh; source it before running the tests.
export PHASETRACE_ROTEL_BIN='$ROTEL_BIN'
export PHASETRACE_PROMETHEUS_BIN='$PROMETHEUS_BIN'
export PHASETRACE_PROMTOOL_BIN='$PROMTOOL_BIN'
export PHASETRACE_JAEGER_BIN='$JAEGER_BIN'
export PHASETRACE_OTELCOL_BIN='$OTELCOL_BIN'
export PHASETRACE_THANOS_BIN='$THANOS_BIN'
ENV
mv "$TOOLS/env.tmp" "$TOOLS/env"

log "rotel-agent:    $ROTEL_BIN"
log "prometheus:     $PROMETHEUS_BIN ($("$PROMETHEUS_BIN" --version 2>&1 | head -n 1))"
log "promtool:       $PROMTOOL_BIN"
log "jaeger:         $JAEGER_BIN"
log "otelcol:        $OTELCOL_BIN ($("$OTELCOL_BIN" --version 2>&1 | head -n 1))"
log "thanos:         $THANOS_BIN ($("$THANOS_BIN" --version 2>&1 | head -n 1))"
log "docker-compose: $(command -v docker-compose)"
log "wrote $TOOLS/env"
printf '%s\n' "$ROTEL_BIN"
