#!/usr/bin/env bash
# Runs every dashboard and rule expression against a real Prometheus (with the bundled rules)
# that scrapes a real demo run, and checks the straggler alert:
#   1. a demo with a straggler rank: every expression parses and returns data, and
#      PhasetraceRankStraggler becomes active (pending or firing) for the straggler;
#   2. a balanced demo: PhasetraceRankStraggler stays quiet.
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

# start_run NAME DEMO_ARGS...: starts the demo and a Prometheus scraping it; sets URL.
start_run() {
  local name="$1"; shift
  local demo_port prom_port
  demo_port="$(free_port)"
  prom_port="$(free_port)"
  mkdir -p "$WORK/$name"
  cat > "$WORK/$name/prometheus.yml" <<YAML
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files:
  - $ROOT/otel-config/rules/phasetrace-thresholds.yml
  - $ROOT/otel-config/rules/phasetrace-recording.yml
  - $ROOT/otel-config/rules/phasetrace-alerts.yml
scrape_configs:
  - job_name: phasetrace
    static_configs: [{targets: ["127.0.0.1:$demo_port"]}]
YAML
  "$DEMO" demo --duration 150 --ranks 2 --layers 4 --spec 4 --expert-counter on \
    --trace-every 0 --prometheus "127.0.0.1:$demo_port" "$@" >"$WORK/$name/demo.log" 2>&1 &
  PIDS+=("$!")
  "$PROMETHEUS" --config.file="$WORK/$name/prometheus.yml" --storage.tsdb.path="$WORK/$name/data" \
    --web.listen-address="127.0.0.1:$prom_port" >"$WORK/$name/prometheus.log" 2>&1 &
  PIDS+=("$!")
  URL="http://127.0.0.1:$prom_port"
  for _ in $(seq 1 30); do
    curl -fsS "$URL/-/ready" >/dev/null 2>&1 && return 0
    sleep 1
  done
  cat "$WORK/$name/prometheus.log" >&2
  return 1
}

echo "live check 1/2: demo with straggler rank 1" >&2
start_run straggler --straggler-rank 1 --straggler-factor 4
python3 scripts/promql-live-check.py --prometheus "$URL" --retry-for 90 --retry-interval 5 \
  || { tail -20 "$WORK/straggler/demo.log" >&2; exit 1; }
python3 scripts/promql-live-check.py --prometheus "$URL" --alert PhasetraceRankStraggler \
  --expect active --label rank=1 --timeout-alert 90 --poll 2
cleanup

echo "live check 2/2: balanced demo" >&2
start_run balanced
# Wait until rates exist, then require the straggler alert to stay quiet.
python3 scripts/promql-live-check.py --prometheus "$URL" --retry-for 90 --retry-interval 5 >/dev/null
python3 scripts/promql-live-check.py --prometheus "$URL" --alert PhasetraceRankStraggler \
  --expect quiet --hold 30 --poll 2
cleanup
echo "live stack check passed" >&2
