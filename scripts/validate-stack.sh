#!/usr/bin/env bash
# Validates the bundled observability stack (docker-compose.yml, Dockerfile, otel-config/,
# dashboards/) offline, with the real tools of each format:
#
#   promtool (Prometheus 3, built by      check config (prometheus.yml, prometheus-otlp.yml), check
#     scripts/install-tools.sh)           rules, test rules, and parses every dashboard PromQL
#                                         expression
#   otelcol validate (tools/otelcol)      otel-config/collector.yaml as compose runs it
#   jaeger validate (Jaeger v2)           otel-config/jaeger.yaml as compose runs it
#   docker-compose 1.29 (Debian)          config -q (with a dummy GRAFANA_ADMIN_PASSWORD), and
#                                         refuses the file without one
#   tsc + @grafana/schema (npm)           every dashboard as typed object literals, --strict
#   grafana-foundation-sdk (PyPI)         lossless round trip of every dashboard through the SDK
#   hadolint + BuildKit's parser (PyPI)   Dockerfile
#   tools/stack-check/check_stack.py      cross-file consistency (ports, pins, uids, mounts...)
#
# Installs what it needs when missing (scripts/install-tools.sh for promtool, otelcol, jaeger and
# docker-compose; npm ci in tools/dashboard-check; a venv at .tools/venv-stack) and is safe to
# re-run. Not covered here (needs Docker): image pulls and builds and Grafana rendering. The
# collector, Jaeger and Prometheus running these very files are the live tests' part
# (cli/tests/it/the_demo_reaches_jaeger_and_prometheus_through_the_bundled_collector.rs,
# scripts/live-stack-check.sh).
#
# Usage: scripts/validate-stack.sh [--mutations]
#   --mutations  also prove that each check can fail: injects a fault per check into a scratch
#                copy (misspelled dashboard keys, a broken rule, a bad compose key...) and
#                expects that check to reject it. The repository is never modified.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TOOLS_DIR="$ROOT/.tools"
VENV="$TOOLS_DIR/venv-stack"
DASH_CHECK="$ROOT/tools/dashboard-check"
REQUIREMENTS="$ROOT/tools/stack-check/requirements.txt"
MUTATIONS=0
for arg in "$@"; do
  case "$arg" in
    --mutations) MUTATIONS=1 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "validate-stack: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

SCRATCH="$(mktemp -d)"
trap 'rm -rf "$SCRATCH"' EXIT
START=$SECONDS

log() { printf '%s\n' "$*"; }
section() { printf '\n== %s\n' "$*"; }

# ---------------------------------------------------------------- installs
apt_updated=0
apt_install() {
  # apt_install PACKAGE... : installs Debian packages without starting their services.
  if [ "$(id -u)" -ne 0 ]; then
    echo "validate-stack: need root to apt-get install $*" >&2
    exit 2
  fi
  if [ "$apt_updated" -eq 0 ]; then
    apt-get update -qq
    apt_updated=1
  fi
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [ ! -e "$policy" ]; then
    # Keep the prometheus package from starting its daemon (restored right after).
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod +x "$policy"
    made_policy=1
  fi
  local rc=0
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null || rc=$?
  if [ "$made_policy" -eq 1 ]; then rm -f "$policy"; fi
  return "$rc"
}

stamp_ok() {
  # stamp_ok STAMPFILE INPUT... : true when STAMPFILE records the sha256 of the inputs.
  local stamp="$1"; shift
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(cat "$@" | sha256sum | cut -d' ' -f1)" ]
}
write_stamp() {
  local stamp="$1"; shift
  cat "$@" | sha256sum | cut -d' ' -f1 > "$stamp"
}

section "tools"
# promtool, otelcol and jaeger are the pinned builds of scripts/install-tools.sh (a no-op when
# they are current), never whatever else is on PATH.
"$ROOT/scripts/install-tools.sh" >/dev/null
# shellcheck source=/dev/null
source "$TOOLS_DIR/env"
PROMTOOL="$PHASETRACE_PROMTOOL_BIN"
OTELCOL="$PHASETRACE_OTELCOL_BIN"
JAEGER="$PHASETRACE_JAEGER_BIN"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  log "installing with apt: nodejs npm"
  apt_install nodejs npm
fi

if ! stamp_ok "$DASH_CHECK/node_modules/.validate-stack.stamp" "$DASH_CHECK/package-lock.json"; then
  log "npm ci in tools/dashboard-check"
  (cd "$DASH_CHECK" && npm ci --no-audit --no-fund --loglevel=error)
  write_stamp "$DASH_CHECK/node_modules/.validate-stack.stamp" "$DASH_CHECK/package-lock.json"
fi

if [ ! -x "$VENV/bin/python" ]; then
  mkdir -p "$TOOLS_DIR"
  if ! python3 -m venv "$VENV" 2>/dev/null; then
    rm -rf "$VENV"
    apt_install python3-venv
    python3 -m venv "$VENV"
  fi
fi
if ! stamp_ok "$VENV/.validate-stack.stamp" "$REQUIREMENTS"; then
  log "pip install -r tools/stack-check/requirements.txt into .tools/venv-stack"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQUIREMENTS"
  write_stamp "$VENV/.validate-stack.stamp" "$REQUIREMENTS"
fi
PY="$VENV/bin/python"
log "promtool: $("$PROMTOOL" --version 2>&1 | head -n1)"
log "otelcol: $("$OTELCOL" --version 2>&1 | head -n1)"
log "jaeger: $("$JAEGER" version 2>&1 | head -n1)"
log "docker-compose: $(docker-compose version --short 2>/dev/null || docker-compose --version)"
log "node: $(node --version), tsc: $("$DASH_CHECK/node_modules/.bin/tsc" --version)"
log "@grafana/schema: $(node -p "require('$DASH_CHECK/node_modules/@grafana/schema/package.json').version")"
log "grafana-foundation-sdk: $("$PY" -m pip show grafana-foundation-sdk 2>/dev/null | sed -n 's/^Version: //p')"
log "hadolint: $("$VENV/bin/hadolint" --version)"

# ---------------------------------------------------------------- the checks
# Each takes its inputs as arguments (repository paths by default) so --mutations can point
# them at faulty copies. They run as `if check ...`, where bash ignores `set -e`: every
# command but the last carries its own `|| return 1`.
check_prom_config() { "$PROMTOOL" check config "$1"; }
check_rules() { "$PROMTOOL" check rules "$@"; }
check_rule_tests() { "$PROMTOOL" test rules "$@"; }
# The collector and Jaeger configs as compose runs them: no environment variable set, so every
# ${env:NAME:-default} takes its default (the compose service names).
check_collector_config() { "$OTELCOL" validate --config="$1"; }
check_jaeger_config() { "$JAEGER" validate --config="$1"; }
# The rule tests are generated (otel-config/rules/gen-alert-tests.py): the file must be current.
check_rule_tests_generated() { python3 "$1" --check; }
check_dashboard_promql() {
  # Every dashboard and rule expression (Grafana variables substituted), parsed by promtool.
  local dashboards="$1" rules="$2" out="$SCRATCH/promql-$RANDOM.yml"
  python3 "$ROOT/scripts/promql-live-check.py" --dashboards "$dashboards" --rules "$rules" --emit-rule-file "$out" || return 1
  "$PROMTOOL" check rules "$out"
}
check_compose() {
  local file="$1"
  GRAFANA_ADMIN_PASSWORD=validate-stack-dummy docker-compose --project-directory "$ROOT" -f "$file" config -q || return 1
  # The Grafana admin password has no default: without it, compose must refuse the file.
  if (unset GRAFANA_ADMIN_PASSWORD; docker-compose --project-directory "$ROOT" -f "$file" config -q) >/dev/null 2>&1; then
    echo "docker-compose accepted $file without GRAFANA_ADMIN_PASSWORD (the password must not have a default)"
    return 1
  fi
  echo "docker-compose: $file valid; refused without GRAFANA_ADMIN_PASSWORD as intended"
}
check_dockerfile() {
  "$VENV/bin/hadolint" "$1" || return 1
  "$PY" -c 'import sys, dockerfile
cmds = dockerfile.parse_file(sys.argv[1])
stages = [c for c in cmds if c.cmd == "FROM"]
assert len(stages) >= 2, "expected a multi-stage build"
print(f"BuildKit parser: {len(cmds)} instructions, {len(stages)} stages")' "$1"
}
check_dashboards_ts() {
  # Typed object literals (.generated/*.ts) compiled with tsc --strict against @grafana/schema.
  (cd "$DASH_CHECK" && node gen-ts.mjs "$@" && ./node_modules/.bin/tsc --strict --noEmit -p tsconfig.json)
}
check_dashboards_sdk() { "$PY" "$DASH_CHECK/sdk_roundtrip.py" "$@"; }
check_consistency() { "$PY" "$ROOT/tools/stack-check/check_stack.py" "$1"; }

PASSED=0
FAILED=0
FAILED_NAMES=()
run() {
  # run NAME COMMAND... : runs one check, records the outcome, never exits.
  local name="$1"; shift
  section "$name"
  local t0=$SECONDS
  if "$@"; then
    PASSED=$((PASSED + 1))
    log "-- ok: $name ($((SECONDS - t0))s)"
  else
    FAILED=$((FAILED + 1))
    FAILED_NAMES+=("$name")
    log "-- FAILED: $name"
  fi
}

mapfile -t RULE_FILES < <(find otel-config/rules -maxdepth 1 -name '*.yml' ! -name '*.test.yml' | sort)
mapfile -t RULE_TESTS < <(find otel-config/rules -maxdepth 1 -name '*.test.yml' | sort)
mapfile -t DASHBOARDS < <(find dashboards -maxdepth 1 -name '*.json' | sort)

run "promtool check config" check_prom_config otel-config/prometheus.yml
run "promtool check config (OTLP receiver)" check_prom_config otel-config/prometheus-otlp.yml
run "otelcol validate (collector.yaml)" check_collector_config otel-config/collector.yaml
run "jaeger validate (jaeger.yaml)" check_jaeger_config otel-config/jaeger.yaml
run "promtool check rules" check_rules "${RULE_FILES[@]}"
run "promtool test rules" check_rule_tests "${RULE_TESTS[@]}"
run "rule tests are up to date with their generator" check_rule_tests_generated otel-config/rules/gen-alert-tests.py
run "dashboard PromQL parses (promtool)" check_dashboard_promql dashboards otel-config/rules
run "docker-compose config" check_compose docker-compose.yml
run "Dockerfile (hadolint, BuildKit parser)" check_dockerfile Dockerfile
run "dashboards: tsc --strict against @grafana/schema" check_dashboards_ts "${DASHBOARDS[@]/#/$ROOT/}"
run "dashboards: grafana-foundation-sdk round trip" check_dashboards_sdk "${DASHBOARDS[@]}"
run "cross-file consistency" check_consistency "$ROOT"

# ---------------------------------------------------------------- --mutations
if [ "$MUTATIONS" -eq 1 ]; then
  MUT_PASSED=0
  MUT_FAILED=0
  expect_failure() {
    # expect_failure NAME COMMAND... : the check must reject the injected fault.
    local name="$1"; shift
    if "$@" >"$SCRATCH/mutation.log" 2>&1; then
      MUT_FAILED=$((MUT_FAILED + 1))
      FAILED_NAMES+=("mutation not caught: $name")
      log "-- NOT CAUGHT: $name"
      sed 's/^/   | /' "$SCRATCH/mutation.log" | tail -n 5
    else
      MUT_PASSED=$((MUT_PASSED + 1))
      log "-- caught: $name"
      grep -m2 -iE 'error|fail|unknown|invalid|unsupported|problem|DL[0-9]+|not |parse' "$SCRATCH/mutation.log" | cut -c1-160 | sed 's/^/   | /' || true
    fi
  }
  mutate() {
    # mutate SRC DEST SED-EXPRESSION : copies SRC to DEST with one substitution, which must apply.
    mkdir -p "$(dirname "$2")"
    sed "$3" "$1" > "$2"
    if cmp -s "$1" "$2"; then
      echo "validate-stack: mutation '$3' did not change $1" >&2
      exit 2
    fi
  }
  section "mutations: each check must reject an injected fault"
  M="$SCRATCH/mut"
  # Dashboards: a misspelled key in a target, in panel options, in a field config, a variable.
  mutate dashboards/decode-sections.json "$M/d1/decode-sections.json" '0,/"legendFormat"/s//"legendFromat"/'
  mutate dashboards/collectives-rank-skew.json "$M/d2/collectives-rank-skew.json" '0,/"placement"/s//"placment"/'
  mutate dashboards/speculative-decoding.json "$M/d3/speculative-decoding.json" '0,/"fillOpacity"/s//"fillOpactiy"/'
  mutate dashboards/decode-sections.json "$M/d4/decode-sections.json" '0,/"allValue"/s//"allValu"/'
  mutate dashboards/decode-sections.json "$M/d5/decode-sections.json" '0,/"valueField"/s//"valueFeild"/'
  for d in d1 d2 d3 d4; do
    f="$(ls "$M/$d"/*.json)"
    expect_failure "tsc: misspelled key ($d, $(basename "$f"))" check_dashboards_ts "$f"
    expect_failure "sdk: misspelled key ($d, $(basename "$f"))" check_dashboards_sdk "$f"
  done
  expect_failure "tsc: misspelled transformation option (d5)" check_dashboards_ts "$M/d5/decode-sections.json"
  # A wrong type: a string where the schema wants a number.
  mutate dashboards/decode-sections.json "$M/d6/decode-sections.json" '0,/"w": \([0-9]*\)/s//"w": "\1"/'
  expect_failure "tsc: wrong value type (gridPos.w as a string)" check_dashboards_ts "$M/d6/decode-sections.json"
  # A panel whose target is not a Prometheus query for the SDK.
  mkdir -p "$M/d7"
  "$PY" -c 'import json, sys
d = json.load(open(sys.argv[1]))
panel = next(p for p in d["panels"] if p["type"] != "row")
panel["datasource"]["type"] = "prometheu"
json.dump(d, open(sys.argv[2], "w"), indent=2)' dashboards/decode-sections.json "$M/d7/decode-sections.json"
  expect_failure "sdk: target not decoded as a Prometheus query" check_dashboards_sdk "$M/d7/decode-sections.json"
  # Dashboard PromQL that does not parse.
  mkdir -p "$M/p1"
  mutate dashboards/decode-sections.json "$M/p1/decode-sections.json" '0,/sum by (group, bucket) (rate(/s//sum by (group, bucket) (rate((/'
  expect_failure "promtool: unparsable dashboard PromQL" check_dashboard_promql "$M/p1" otel-config/rules
  # Rules: a broken expression; a threshold change that breaks the unit tests.
  mkdir -p "$M/r1" "$M/r2"
  cp otel-config/rules/*.yml "$M/r1/"
  mutate otel-config/rules/phasetrace-alerts.yml "$M/r1/phasetrace-alerts.yml" 's/group_left ()$/group_left (/'
  expect_failure "promtool check rules: broken alert expression" check_rules "$M/r1/phasetrace-alerts.yml"
  cp otel-config/rules/*.yml "$M/r2/"
  mutate otel-config/rules/phasetrace-thresholds.yml "$M/r2/phasetrace-thresholds.yml" 's/vector(0.05)/vector(0)/'
  expect_failure "promtool test rules: straggler time-lost threshold lowered to 0 (balanced ranks alert)" check_rule_tests "$M/r2/phasetrace-alerts.test.yml"
  # The silent-rank suppression removed: the killed-rank scenario raises straggler alerts.
  mkdir -p "$M/r3"
  cp otel-config/rules/*.yml "$M/r3/"
  mutate otel-config/rules/phasetrace-alerts.yml "$M/r3/phasetrace-alerts.yml" 's/^          unless on (job, group)$/          or on (job, group)/'
  expect_failure "promtool test rules: straggler alerts no longer held back by a silent rank" check_rule_tests "$M/r3/phasetrace-alerts.test.yml"
  # The web-config alert on the healthy state: the healthy endpoints of its scenario alert.
  mkdir -p "$M/r4"
  cp otel-config/rules/*.yml "$M/r4/"
  mutate otel-config/rules/phasetrace-alerts.yml "$M/r4/phasetrace-alerts.yml" 's/_last_reload_successful == 0$/_last_reload_successful == 1/'
  expect_failure "promtool test rules: web-config reload alert fires on a healthy endpoint" check_rule_tests "$M/r4/phasetrace-alerts.test.yml"
  # The export-failure threshold lowered to one failure in two: the flapping exporter alerts.
  mkdir -p "$M/r5"
  cp otel-config/rules/*.yml "$M/r5/"
  mutate otel-config/rules/phasetrace-thresholds.yml "$M/r5/phasetrace-thresholds.yml" 's/vector(1)$/vector(0.5)/'
  expect_failure "promtool test rules: metrics-export failure threshold lowered to 0.5 (a flapping exporter alerts)" check_rule_tests "$M/r5/phasetrace-alerts.test.yml"
  # The hung-step alert: its threshold at 0 (every busy rank alerts), no `for:` (a 55 s step
  # that finishes alerts), and the straggler hold-back shortened below its 2-minute windows (a
  # group that recovers from a hang raises a straggler alert for the rank that hung).
  mkdir -p "$M/r6" "$M/r7" "$M/r8"
  cp otel-config/rules/*.yml "$M/r6/"
  mutate otel-config/rules/phasetrace-thresholds.yml "$M/r6/phasetrace-thresholds.yml" 's/vector(30)$/vector(0)/'
  expect_failure "promtool test rules: hung-step threshold lowered to 0 (busy ranks alert)" check_rule_tests "$M/r6/phasetrace-alerts.test.yml"
  cp otel-config/rules/*.yml "$M/r7/"
  mutate otel-config/rules/phasetrace-alerts.yml "$M/r7/phasetrace-alerts.yml" '/alert: PhasetraceStepHung/,/for:/s/for: 30s$/for: 0s/'
  expect_failure "promtool test rules: hung-step alert without its 30 s for (a long step that finishes alerts)" check_rule_tests "$M/r7/phasetrace-alerts.test.yml"
  cp otel-config/rules/*.yml "$M/r8/"
  mutate otel-config/rules/phasetrace-alerts.yml "$M/r8/phasetrace-alerts.yml" 's/max_over_time(phasetrace:step_open_seconds:max\[2m\])/max_over_time(phasetrace:step_open_seconds:max[15s])/'
  expect_failure "promtool test rules: straggler alerts no longer held back after a hang" check_rule_tests "$M/r8/phasetrace-alerts.test.yml"
  # Prometheus config: a rule file that does not resolve.
  mkdir -p "$M/c1/rules"
  cp otel-config/rules/*.yml "$M/c1/rules/"
  mutate otel-config/prometheus.yml "$M/c1/prometheus.yml" 's#rules/phasetrace-alerts.yml#rules/phasetrace-alert.yml#'
  expect_failure "promtool check config: missing rule file" check_prom_config "$M/c1/prometheus.yml"
  # Collector: a component the build lacks; a setting the component does not have.
  mutate otel-config/collector.yaml "$M/collector1.yaml" 's/processors: \[memory_limiter, batch\]$/processors: [memory_limiter, batch, filter]/'
  expect_failure "otelcol validate: a processor that is not defined" check_collector_config "$M/collector1.yaml"
  mutate otel-config/collector.yaml "$M/collector2.yaml" 's/^    metric_expiration: 1m$/    metric_expiraton: 1m/'
  expect_failure "otelcol validate: a misspelled exporter setting" check_collector_config "$M/collector2.yaml"
  # Jaeger: a misspelled storage setting; an extension that is not configured.
  mutate otel-config/jaeger.yaml "$M/jaeger1.yaml" 's/^          max_traces:/          max_trace:/'
  expect_failure "jaeger validate: a misspelled memory storage setting" check_jaeger_config "$M/jaeger1.yaml"
  mutate otel-config/jaeger.yaml "$M/jaeger2.yaml" 's/^  extensions: \[jaeger_storage, jaeger_query, healthcheckv2\]$/  extensions: [jaeger_storage, jaeger_query, healthcheckv2, pprof]/'
  expect_failure "jaeger validate: an extension that is not configured" check_jaeger_config "$M/jaeger2.yaml"
  # Compose: a misspelled service key; a default for the Grafana password.
  mutate docker-compose.yml "$M/compose1.yml" '0,/    restart: unless-stopped/s//    restrat: unless-stopped/'
  expect_failure "docker-compose: misspelled service key" check_compose "$M/compose1.yml"
  # shellcheck disable=SC2016 # a literal ${...} for sed
  mutate docker-compose.yml "$M/compose2.yml" 's/${GRAFANA_ADMIN_PASSWORD:?set GRAFANA_ADMIN_PASSWORD}/${GRAFANA_ADMIN_PASSWORD:-admin}/'
  expect_failure "docker-compose: Grafana password with a default" check_compose "$M/compose2.yml"
  # Dockerfile: a lint error (apt lists left in the image).
  mutate Dockerfile "$M/Dockerfile" 's#    && rm -rf /var/lib/apt/lists/\* \\#    \&\& true \\#'
  expect_failure "hadolint: apt lists not removed" check_dockerfile "$M/Dockerfile"
  # Consistency: a port published on all interfaces.
  mkdir -p "$M/repo/tools"
  cp tools/versions.env "$M/repo/tools/"
  cp -r dashboards otel-config Dockerfile "$M/repo/"
  mutate docker-compose.yml "$M/repo/docker-compose.yml" 's/"127.0.0.1:9090:9090"/"9090:9090"/'
  expect_failure "consistency: port not bound to 127.0.0.1" check_consistency "$M/repo"
  # Consistency: a compose image that is not the release the tests ran.
  mkdir -p "$M/repo-pin/tools"
  cp tools/versions.env "$M/repo-pin/tools/"
  cp -r dashboards otel-config Dockerfile "$M/repo-pin/"
  mutate docker-compose.yml "$M/repo-pin/docker-compose.yml" 's#prom/prometheus:v3.16.0#prom/prometheus:v3.15.0#'
  expect_failure "consistency: Prometheus image off the tools/versions.env pin" check_consistency "$M/repo-pin"
  # Consistency: an alert that compares against a literal instead of a threshold series.
  mkdir -p "$M/repo-th/tools"
  cp tools/versions.env "$M/repo-th/tools/"
  cp -r dashboards otel-config Dockerfile docker-compose.yml "$M/repo-th/"
  mutate otel-config/rules/phasetrace-alerts.yml "$M/repo-th/otel-config/rules/phasetrace-alerts.yml" 's/^          phasetrace:metric_exports_failed_ratio:threshold$/          vector(1)/'
  expect_failure "consistency: alert threshold as a literal" check_consistency "$M/repo-th"
  # Consistency: exemplars that link nowhere, or panels that do not show them.
  mkdir -p "$M/repo-ex1/tools"
  cp tools/versions.env "$M/repo-ex1/tools/"
  cp -r dashboards otel-config Dockerfile docker-compose.yml "$M/repo-ex1/"
  mutate otel-config/grafana/provisioning/datasources/phasetrace.yml "$M/repo-ex1/otel-config/grafana/provisioning/datasources/phasetrace.yml" 's/datasourceUid: jaeger$/datasourceUid: prometheus/'
  expect_failure "consistency: exemplars not linked to Jaeger" check_consistency "$M/repo-ex1"
  mkdir -p "$M/repo-ex2/tools"
  cp tools/versions.env "$M/repo-ex2/tools/"
  cp -r dashboards otel-config Dockerfile docker-compose.yml "$M/repo-ex2/"
  mutate dashboards/decode-sections.json "$M/repo-ex2/dashboards/decode-sections.json" 's/"exemplar": true/"exemplar": false/g'
  expect_failure "consistency: step-time panel without exemplars" check_consistency "$M/repo-ex2"
  log ""
  log "mutations: $MUT_PASSED caught, $MUT_FAILED not caught"
  PASSED=$((PASSED + MUT_PASSED))
  FAILED=$((FAILED + MUT_FAILED))
fi

section "summary ($((SECONDS - START))s)"
for name in "${FAILED_NAMES[@]+"${FAILED_NAMES[@]}"}"; do log "FAILED: $name"; done
echo "validate-stack: $PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
