#!/usr/bin/env bash
# Runs every dashboard and rule expression against a real Prometheus (with the bundled rules,
# unchanged) that scrapes real demo runs, and checks the straggler alert. Three groups of rank
# threads, each its own demo process, all in one Prometheus job (groups are told apart by the
# `group` label, as two tensor-parallel groups of one job would be):
#   straggler  4 ranks, rank 1 computes 1.2x slower (with speculative decoding and the expert
#              counter, so that every metric the dashboards read exists);
#   balanced4  4 ranks, with a web configuration file of its own for its Prometheus endpoint
#              (every endpoint asks for basic auth) and metrics also over OTLP, to a port where nothing listens (so that phasetrace's own
#              health series exist: web config reloads, last reload successful, metrics
#              exports, every one failing);
#   balanced8  8 ranks.
# Checks: every expression parses and returns data (the web-config and metrics-export series
# too: --expect-data; the open-step series, which every live rank has); PhasetraceRankStraggler
# fires for group=straggler rank=1 (within 5 minutes); it stays quiet for both balanced groups
# and no PhasetraceStepHung is raised; PhasetraceMetricsExportFailing fires for
# balanced4; breaking its web configuration file fires PhasetraceWebConfigReloadFailed (and
# the engine's stderr says why), and fixing it clears the alert.
# The demos shorten nothing but their own knobs (sections 20x longer, sleeping instead of
# spinning: 16 rank threads share this machine's cores); scrape and evaluation every 1 s.
# Uses the debug build of the CLI (built by `cargo test`); everything listens on 127.0.0.1.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
[ -f "$ROOT/.tools/env" ] && source "$ROOT/.tools/env"
PROMETHEUS="${PHASETRACE_PROMETHEUS_BIN:-prometheus}"
cargo build --locked --quiet --bin phasetrace
DEMO="$ROOT/target/debug/phasetrace"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]+"${PIDS[@]}"}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]+"${PIDS[@]}"}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=()
}
trap 'cleanup; rm -rf "$WORK"' EXIT

TARGETS=()
# start_demo GROUP DEMO_ARGS...
start_demo() {
  local group="$1"; shift
  local port
  port="$(free_port)"
  "$DEMO" demo --duration 600 --layers 4 --time-scale 20 --spin-us 0 --trace-every 0 \
    --group "$group" --prometheus "127.0.0.1:$port" "$@" >"$WORK/$group.log" 2>&1 &
  PIDS+=("$!")
  TARGETS+=("\"127.0.0.1:$port\"")
}

# Every endpoint asks for basic auth (a web configuration file; an empty one is refused as a
# half-written file would be), and Prometheus scrapes with the password. balanced4's file is its
# own: check 5 breaks it and fixes it. The hash is bcrypt at cost 4 of the password below (a
# test credential: python3 -c 'import bcrypt; print(bcrypt.hashpw(b"live-check", bcrypt.gensalt(4)))').
PASSWORD=live-check
web_config() { printf "basic_auth_users:\n  prometheus: '%s'\n" '$2b$04$mgAYtweAOiYHz9QCPCTTMec/spI4ueIXIu8NuULBkH8RiEtrnF6hS'; }
web_config > "$WORK/web-shared.yml"
WEB="$WORK/web.yml"
web_config > "$WEB"
export PHASETRACE_PROMETHEUS_WEB_CONFIG="$WORK/web-shared.yml"
start_demo straggler --ranks 4 --straggler-rank 1 --straggler-factor 1.2 --spec 4 --expert-counter on
DEAD_OTLP="http://127.0.0.1:$(free_port)"
PHASETRACE_PROMETHEUS_WEB_CONFIG="$WEB" OTEL_EXPORTER_OTLP_ENDPOINT="$DEAD_OTLP" \
  OTEL_METRICS_EXPORTER=otlp,prometheus OTEL_TRACES_EXPORTER=none \
  OTEL_METRIC_EXPORT_INTERVAL=2000 OTEL_EXPORTER_OTLP_TIMEOUT=1000 \
  start_demo balanced4 --ranks 4
start_demo balanced8 --ranks 8

prom_port="$(free_port)"
# Every bundled rule file (the unit-test files left out), as promql-live-check.py reads them.
RULE_FILES="$(for f in "$ROOT"/otel-config/rules/*.yml; do
  case "$f" in *.test.yml) ;; *) printf '  - %s\n' "$f" ;; esac
done)"
cat > "$WORK/prometheus.yml" <<YAML
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files:
$RULE_FILES
scrape_configs:
  - job_name: phasetrace
    basic_auth: {username: prometheus, password: $PASSWORD}
    static_configs: [{targets: [$(IFS=,; echo "${TARGETS[*]}")]}]
YAML
"$PROMETHEUS" --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/data" \
  --web.listen-address="127.0.0.1:$prom_port" >"$WORK/prometheus.log" 2>&1 &
PIDS+=("$!")
URL="http://127.0.0.1:$prom_port"
ready=0
for _ in $(seq 1 30); do
  if curl -fsS "$URL/-/ready" >/dev/null 2>&1; then ready=1; break; fi
  sleep 1
done
if [ "$ready" -ne 1 ]; then cat "$WORK/prometheus.log" >&2; exit 1; fi

echo "live check 1/5: every expression returns data" >&2
python3 scripts/promql-live-check.py --prometheus "$URL" --retry-for 120 --retry-interval 5 \
  --expect-data phasetrace_prometheus_web_config_ --expect-data phasetrace_metric_exports_total \
  || { tail -20 "$WORK"/*.log >&2; exit 1; }
echo "live check 2/5: PhasetraceRankStraggler fires for the 1.2x straggler (rank 1 of group straggler)" >&2
python3 scripts/promql-live-check.py --prometheus "$URL" --alert PhasetraceRankStraggler \
  --expect firing --label group=straggler --label rank=1 --timeout-alert 300 --poll 2
echo "live check 3/5: and stays quiet for the balanced groups of 4 and 8 rank threads" >&2
for group in balanced4 balanced8; do
  python3 scripts/promql-live-check.py --prometheus "$URL" --alert PhasetraceRankStraggler \
    --expect quiet --label "group=$group" --hold 20 --poll 2
done
# No straggler alert other than the straggler's, ever pending or firing, in any group.
python3 - "$URL" <<'PY'
import json, sys, urllib.request
alerts = json.load(urllib.request.urlopen(sys.argv[1] + "/api/v1/alerts"))["data"]["alerts"]
wrong = [a["labels"] for a in alerts if a["labels"]["alertname"] == "PhasetraceRankStraggler"
         and (a["labels"].get("group"), a["labels"].get("rank")) != ("straggler", "1")]
if wrong:
    sys.exit(f"FAILED: straggler alerts for the wrong group or rank: {wrong}")
print("ok: the only straggler alert is rank 1 of group straggler")
# Every rank of these demos steps on: no step stays open, so no hung-step alert, not even pending
# (phasetrace_step_open_duration_seconds itself is among the series check 1 found).
hung = [a["labels"] for a in alerts if a["labels"]["alertname"] == "PhasetraceStepHung"]
if hung:
    sys.exit(f"FAILED: hung-step alerts for demos that step on: {hung}")
print("ok: no PhasetraceStepHung for demos that step on")
PY
echo "live check 4/5: PhasetraceMetricsExportFailing fires for balanced4 (every OTLP export fails)" >&2
python3 scripts/promql-live-check.py --prometheus "$URL" --alert PhasetraceMetricsExportFailing \
  --expect firing --label group=balanced4 --timeout-alert 240 --poll 2
echo "live check 5/5: a broken web config fires PhasetraceWebConfigReloadFailed for balanced4; the fix clears it" >&2
printf 'basic_auth_users: [\n' > "$WEB.new" && mv "$WEB.new" "$WEB"
python3 scripts/promql-live-check.py --prometheus "$URL" --alert PhasetraceWebConfigReloadFailed \
  --expect firing --label group=balanced4 --timeout-alert 120 --poll 2
grep -q "the changed web configuration is not applied" "$WORK/balanced4.log" \
  || { echo "FAILED: balanced4's stderr does not say why its web config was refused" >&2; exit 1; }
echo "ok: balanced4's stderr says the changed web configuration is not applied" >&2
web_config > "$WEB.new" && mv "$WEB.new" "$WEB"
python3 scripts/promql-live-check.py --prometheus "$URL" --alert PhasetraceWebConfigReloadFailed \
  --expect quiet --label group=balanced4 --timeout-alert 30 --poll 1
cleanup
echo "live stack check passed" >&2
