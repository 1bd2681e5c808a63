#!/usr/bin/env bash
# Self-test of scripts/promql-live-check.py, the rules and the dashboards' queries against a
# real Prometheus, without Docker or the Rust demo: a synthetic phasetrace endpoint
# (fake_exporter.py, rank 0 a straggler at `attn`) scraped every second by Debian's Prometheus
# loading otel-config/rules. Everything listens on 127.0.0.1 and is stopped on exit.
#
# Usage: tools/promql-selftest/run.sh [--alerts]
#   --alerts  also wait (about 4 minutes: the rules' `for:`) for PhasetraceRankStraggler to fire
#             on rank 0 and check that PhasetraceRecordsDropped stays quiet.
# Ports: PROM_PORT (default 19090) and EXPORTER_PORT (default 19464).
# A template for the live test with the demo: point a Prometheus with these rules at the
# demo's endpoint instead of the fake one and run the same promql-live-check.py commands.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PROM_PORT="${PROM_PORT:-19090}"
EXPORTER_PORT="${EXPORTER_PORT:-19464}"
ALERTS=0
[ "${1:-}" = "--alerts" ] && ALERTS=1

command -v prometheus >/dev/null 2>&1 || {
  echo "selftest: needs Debian's prometheus (apt-get install --no-install-recommends prometheus)" >&2
  exit 2
}

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]+"${PIDS[@]}"}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]+"${PIDS[@]}"}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

cat > "$WORK/prometheus.yml" <<YAML
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files:
  - $ROOT/otel-config/rules/phasetrace-thresholds.yml
  - $ROOT/otel-config/rules/phasetrace-recording.yml
  - $ROOT/otel-config/rules/phasetrace-alerts.yml
scrape_configs:
  - job_name: phasetrace
    static_configs: [{targets: ["127.0.0.1:$EXPORTER_PORT"]}]
YAML

python3 "$ROOT/tools/promql-selftest/fake_exporter.py" --addr 127.0.0.1 --port "$EXPORTER_PORT" &
PIDS+=("$!")
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/data" \
  --web.listen-address="127.0.0.1:$PROM_PORT" >"$WORK/prometheus.log" 2>&1 &
PIDS+=("$!")

URL="http://127.0.0.1:$PROM_PORT"
for _ in $(seq 1 30); do
  curl -fsS "$URL/-/ready" >/dev/null 2>&1 && break
  sleep 1
done
curl -fsS "$URL/-/ready" >/dev/null || { cat "$WORK/prometheus.log" >&2; exit 1; }

# Rates need two scrapes, recording rules one evaluation after that.
python3 "$ROOT/scripts/promql-live-check.py" --prometheus "$URL" --retry-for 60 --retry-interval 5

if [ "$ALERTS" -eq 1 ]; then
  python3 "$ROOT/scripts/promql-live-check.py" --prometheus "$URL" \
    --alert PhasetraceRankStraggler --expect firing --label rank=0 --label site=attn --timeout-alert 300
  python3 "$ROOT/scripts/promql-live-check.py" --prometheus "$URL" \
    --alert PhasetraceRecordsDropped --expect quiet --timeout-alert 10
  # Now that alerts fire, the ALERTS panels must return data too.
  python3 "$ROOT/scripts/promql-live-check.py" --prometheus "$URL" --no-default-allow \
    --expect-empty 'alert/PhasetraceRecordsDropped' \
    --expect-empty 'phasetrace_records_dropped_total'
fi
