#!/usr/bin/env bash
# The project's single test command:
#   1. installs the real peer processes (rotel; Prometheus 3 + promtool, Jaeger v2 and the
#      collector, built from their Go modules at the tools/versions.env pins; docker-compose),
#   2. runs every Rust test with all features against them,
#   3. validates the deployable stack (scripts/validate-stack.sh), when present,
#   4. runs every dashboard and alert expression against live demo runs (scripts/live-stack-check.sh),
#   5. runs a 128-rank fleet through Thanos receive, query and rule (scripts/fleet.py).
# Extra arguments are passed to `cargo test`, e.g. `scripts/test.sh -p phasetrace-testkit --test it rotel_harness`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

START="$(date +%s)"
section() { printf '\n==== %s ==== (disk: %s free; %s s into scripts/test.sh)\n' "$*" "$(df -h --output=avail . 2>/dev/null | tail -1 | tr -d ' ')" "$(($(date +%s) - START))" >&2; }

section "installing test tools (scripts/install-tools.sh)"
"$ROOT/scripts/install-tools.sh" >/dev/null

# shellcheck source=/dev/null
source "$ROOT/.tools/env"
printf 'PHASETRACE_ROTEL_BIN=%s\nPHASETRACE_PROMETHEUS_BIN=%s\nPHASETRACE_PROMTOOL_BIN=%s\nPHASETRACE_JAEGER_BIN=%s\nPHASETRACE_OTELCOL_BIN=%s\nPHASETRACE_THANOS_BIN=%s\n' \
    "$PHASETRACE_ROTEL_BIN" "$PHASETRACE_PROMETHEUS_BIN" "$PHASETRACE_PROMTOOL_BIN" \
    "$PHASETRACE_JAEGER_BIN" "$PHASETRACE_OTELCOL_BIN" "$PHASETRACE_THANOS_BIN" >&2

# Every feature but `record-off`, which compiles recording out (checked on its own below).
FEATURES="phasetrace/cuda,phasetrace-cli/cuda,phasetrace-cli/candle"
section "cargo test --workspace --features $FEATURES --locked --no-fail-fast $*"
# The tools were just installed: a test that cannot find one fails rather than skips. Every
# test binary runs (--no-fail-fast), so one CI run lists every failure.
PHASETRACE_REQUIRE_TOOLS=1 cargo test --workspace --features "$FEATURES" --locked --no-fail-fast "$@"

section "feature builds: each exporter alone, none, and recording compiled out (scripts/check-features.sh)"
"$ROOT/scripts/check-features.sh"

if [ -f "$ROOT/scripts/validate-stack.sh" ]; then
    section "validating the stack (scripts/validate-stack.sh)"
    if [ -x "$ROOT/scripts/validate-stack.sh" ]; then
        "$ROOT/scripts/validate-stack.sh"
    else
        bash "$ROOT/scripts/validate-stack.sh"
    fi
fi

section "live check: every dashboard and rule expression against demo runs (scripts/live-stack-check.sh)"
"$ROOT/scripts/live-stack-check.sh"

# The distributed tier: 128 ranks (16 groups of 8) into Thanos receive (a hashring of 2), the
# bundled rules on thanos rule, the dashboards against thanos query; a 1.2x straggler and a
# killed rank must be named, nothing else (about 9 minutes; the 1,024-rank run is the same
# script by hand: docs/operations.md, "A fleet").
section "fleet: 128 ranks through Thanos (scripts/fleet.py --ranks 128 --check)"
python3 "$ROOT/scripts/fleet.py" --ranks 128 --check --phasetrace "$ROOT/target/debug/phasetrace"

section "all tests passed"
