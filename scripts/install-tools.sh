#!/usr/bin/env bash
# Installs the real peer processes that phasetrace's integration tests drive:
#   - rotel (`rotel-agent`, an OpenTelemetry collector) from PyPI into .tools/venv
#   - Prometheus 2.x and promtool from Debian
#   - docker-compose from Debian (only used to validate compose files with `config -q`)
# and writes .tools/env, which exports the absolute paths of those binaries.
#
# Idempotent: whatever is already present is skipped. Meant to run as root on Debian 12
# (as CI does); as another user it uses sudo for apt when that is available.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.tools"
VENV="$TOOLS/venv"
ROTEL_VERSION="${PHASETRACE_ROTEL_VERSION:-0.0.1a15}"

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

# ------------------------------------------------- Prometheus, docker-compose (Debian)
missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
if [ "${#missing[@]}" -gt 0 ]; then
    # shellcheck disable=SC2207
    missing=($(printf '%s\n' "${missing[@]}" | sort -u))
    log "installing from Debian: ${missing[*]}"
    # Keep the package's postinst from starting prometheus as a service where
    # invoke-rc.d honours policy-rc.d (exit 101 = action forbidden).
    POLICY=/usr/sbin/policy-rc.d
    CREATED_POLICY=0
    if [ ! -e "$POLICY" ] && [ -w /usr/sbin ]; then
        printf '#!/bin/sh\nexit 101\n' >"$POLICY"
        chmod +x "$POLICY"
        CREATED_POLICY=1
    fi
    status=0
    apt_install "${missing[@]}" || status=$?
    if [ "$CREATED_POLICY" -eq 1 ]; then rm -f "$POLICY"; fi
    [ "$status" -eq 0 ] || die "apt-get install ${missing[*]} failed"
fi

# The tests start their own Prometheus on free ports; a system instance would only hold
# :9090 and burn CPU. Stop and disable it wherever an init system is present.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    "${SUDO[@]}" systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
# Without systemd: stop only the daemon the init script started (its pidfile, user prometheus).
if [ -x /etc/init.d/prometheus ] && [ -f /run/prometheus/prometheus.pid ]; then
    "${SUDO[@]}" /etc/init.d/prometheus stop >/dev/null 2>&1 || true
fi
if command -v update-rc.d >/dev/null 2>&1 && [ -e /etc/init.d/prometheus ]; then
    "${SUDO[@]}" update-rc.d prometheus disable >/dev/null 2>&1 || true
fi

PROMETHEUS_BIN="$(command -v prometheus)" || die "prometheus not on PATH after install"
PROMTOOL_BIN="$(command -v promtool)" || die "promtool not on PATH after install"
command -v docker-compose >/dev/null 2>&1 || die "docker-compose not on PATH after install"

# ------------------------------------------------------------------ .tools/env
cat >"$TOOLS/env.tmp" <<ENV
# Written by scripts/install-tools.sh; source it before running the tests.
export PHASETRACE_ROTEL_BIN='$ROTEL_BIN'
export PHASETRACE_PROMETHEUS_BIN='$PROMETHEUS_BIN'
export PHASETRACE_PROMTOOL_BIN='$PROMTOOL_BIN'
ENV
mv "$TOOLS/env.tmp" "$TOOLS/env"

log "rotel-agent:    $ROTEL_BIN"
log "prometheus:     $PROMETHEUS_BIN ($("$PROMETHEUS_BIN" --version 2>&1 | head -n 1))"
log "promtool:       $PROMTOOL_BIN"
log "docker-compose: $(command -v docker-compose)"
log "wrote $TOOLS/env"
printf '%s\n' "$ROTEL_BIN"
