#!/usr/bin/env python3
"""A fleet of tensor-parallel ranks on one machine, through a real distributed metrics tier.

    scripts/fleet.py --ranks 128 --check          # what CI runs (scripts/test.sh), ~9 minutes
    scripts/fleet.py --ranks 1024 --balanced-minutes 30 --json fleet-1024.json   # BENCHMARKS.md

What runs (every process real, on loopback; nothing is simulated but the kernels):

  phasetrace demo processes ──/metrics──> Prometheus (agent mode) ──remote write──┐
  (one per group of 8 rank threads;                                             v
   one group as 8 rank processes)           thanos receive x2 (a hashring: each its own
                                            TSDB; a series lands on one, by hash)
                                                 ^ StoreAPI           ^ StoreAPI
                                            thanos query ─────────────┘ (and the ruler's store)
                                                 ^ PromQL
                                            thanos rule: otel-config/rules/*.yml, every
                                            --eval-interval ──alerts──> the alert sink here
                                            (Alertmanager's POST /api/v2/alerts)

The fleet: --ranks / 8 groups of 8 ranks (PHASETRACE_GROUP g000, g001, ...). Group g000 runs as
8 processes, one per rank, meeting over the demo's TCP rendezvous (as ranks on separate hosts
do); every other group is one process of 8 rank threads (as one 8-GPU host runs one group).
Odd groups decode speculatively (--spec 3), so that every dashboard has data. Each process is
one host of the fleet by its identity: OTEL_RESOURCE_ATTRIBUTES host.name
(node-GGG, or node-000-R for g000's rank processes) and its instance (address:port). What is
simulated: the kernels (the synthetic engine's drawn section times, slept, --time-scale times
the default demo's) and the all-reduces (a barrier in each process; TCP for g000). Everything
from the recorder on is phasetrace's real pipeline (recorder, worker, Prometheus endpoint).

The run, on the clock of the first process start (t = 0):
  t in [0, B):  balanced. Any PhasetraceRankStraggler received here is a false alert.
  t = B:        rank --straggler-rank of group --straggler-group becomes --straggler-factor
                times slower (the demo's --straggler-after), and rank --kill-rank of g000 is
                killed (SIGKILL).
  then:         until the straggler alert for exactly that (group, rank) and the silent-rank
                alert for the killed rank have reached the sink (or --detect-timeout).
  after:        the dashboards' panel queries against the querier, and the tier's costs.

Checks (--check fails the run on any): the straggler alert fires for exactly the straggler's
(group, rank) and for no other rank of any group, during the balanced window or after; the
silent alert names exactly the killed rank; every dashboard panel query returns data from the
querier (scripts/promql-live-check.py, with its allow-list for what a run cannot have).

Figures (printed, and written with --json): detection times from the straggler's start and from
the kill, false straggler alerts per rank-hour of the balanced window, active series per
receiver and per rank, samples per second ingested, bytes per sample on disk (the receivers'
TSDB folders, WAL included, over the samples appended), the ruler's evaluation time per rule
group, receiver and ruler resident memory.

Needs: the phasetrace binary (--phasetrace, default target/release/phasetrace, else
target/debug/phasetrace) and .tools/env (scripts/install-tools.sh: Prometheus, Thanos).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RULE_FILES = [
    "phasetrace-thresholds.yml",
    "phasetrace-recording.yml",
    "phasetrace-alerts.yml",
    "phasetrace-requests.yml",
]
STRAGGLER = "PhasetraceRankStraggler"
SILENT = "PhasetraceRankSilent"
GROUP_SIZE = 8
# Thanos waits 2 minutes by default after SIGTERM before it stops serving.
GRACE = ["--http-grace-period=1s", "--grpc-grace-period=1s"]
JOB = "fleet"


def log(msg: str) -> None:
    print(f"[fleet {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tools() -> dict[str, str]:
    """The binaries .tools/env exports (PHASETRACE_*_BIN), the environment first."""
    found = {}
    env_file = ROOT / ".tools" / "env"
    if env_file.exists():
        for line in env_file.read_text().splitlines():
            m = re.match(r"export (PHASETRACE_\w+_BIN)='(.*)'", line)
            if m:
                found[m.group(1)] = m.group(2)
    for k, v in os.environ.items():
        if k.startswith("PHASETRACE_") and k.endswith("_BIN"):
            found[k] = v
    return found


# ---------------------------------------------------------------- the alert sink

class AlertSink:
    """Alertmanager's `POST /api/v2/alerts`, as `thanos rule --alertmanagers.url` sends to:
    keeps, per alert (its labels), when it first arrived and how often."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.first: dict[tuple, float] = {}
        self.posts = 0
        self.bad = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if 0 < n <= 64 << 20 else b""
                try:
                    alerts = json.loads(body)
                    assert isinstance(alerts, list)
                except Exception:  # noqa: BLE001 (anything unreadable is counted, answered 400)
                    with sink.lock:
                        sink.bad += 1
                    self.send_response(400)
                    self.end_headers()
                    return
                now = time.time()
                with sink.lock:
                    sink.posts += 1
                    for a in alerts:
                        labels = tuple(sorted((a.get("labels") or {}).items()))
                        sink.first.setdefault(labels, now)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self, name: str) -> list[tuple[dict, float]]:
        with self.lock:
            return [(dict(k), t) for k, t in self.first.items() if dict(k).get("alertname") == name]


# ---------------------------------------------------------------- processes

class Procs:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        out = open(self.work / f"{name}.log", "wb")
        p = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=self.work,
            start_new_session=True,
        )
        self.procs.append((name, p))
        return p

    def tail(self, name: str, lines: int = 15) -> str:
        try:
            return "\n".join((self.work / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def check_alive(self, names: list[str]) -> None:
        for name, p in self.procs:
            if name in names and p.poll() is not None:
                raise SystemExit(f"{name} exited with {p.returncode}:\n{self.tail(name)}")

    def stop(self) -> None:
        for _, p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 20
        for _, p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def http_get(url: str, timeout: float = 30) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def wait_ready(url: str, what: str, timeout: float, procs: Procs, name: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            http_get(url, timeout=5)
            return
        except (urllib.error.URLError, OSError):
            procs.check_alive([name])
            time.sleep(0.5)
    raise SystemExit(f"{what} not ready at {url} within {timeout:.0f} s:\n{procs.tail(name)}")


class Query:
    def __init__(self, base: str) -> None:
        self.base = base

    def vector(self, expr: str) -> list[dict]:
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            body = json.loads(http_get(url, timeout=60))
        except (urllib.error.URLError, OSError, ValueError) as e:
            log(f"query failed ({e}): {expr}")
            return []
        return body.get("data", {}).get("result", [])

    def scalar(self, expr: str) -> float | None:
        v = self.vector(expr)
        return float(v[0]["value"][1]) if v else None


def fill(template: str, values: dict[str, str]) -> str:
    """`template` with each ${NAME} replaced; a name without a value is an error."""
    def one(m: re.Match) -> str:
        if m.group(1) not in values:
            raise SystemExit(f"no value for ${{{m.group(1)}}} in a template of otel-config/thanos/")
        return values[m.group(1)]
    return re.sub(r"\$\{([A-Z0-9_]+)\}", one, template)


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# ---------------------------------------------------------------- the tier

def start_tier(a, t: dict, procs: Procs, work: Path, sink: AlertSink, targets: list[str]) -> dict:
    thanos = t.get("PHASETRACE_THANOS_BIN")
    prom = t.get("PHASETRACE_PROMETHEUS_BIN")
    if not thanos or not prom:
        raise SystemExit("thanos or prometheus not found: run scripts/install-tools.sh (it writes .tools/env)")
    ports = {k: free_port() for k in ("r0_grpc", "r0_http", "r0_rw", "r0_capnp", "r1_grpc", "r1_http", "r1_rw", "r1_capnp",
                                       "q_http", "q_grpc", "rule_http", "rule_grpc", "agent")}
    cfg = ROOT / "otel-config" / "thanos"
    hashring = work / "hashring.json"
    hashring.write_text(fill((cfg / "hashring.json").read_text(), {
        "RECEIVE_0_GRPC": f"127.0.0.1:{ports['r0_grpc']}", "RECEIVE_1_GRPC": f"127.0.0.1:{ports['r1_grpc']}",
        "RECEIVE_0_CAPNP": f"127.0.0.1:{ports['r0_capnp']}", "RECEIVE_1_CAPNP": f"127.0.0.1:{ports['r1_capnp']}"}))
    for i in (0, 1):
        procs.start(f"receive-{i}", [
            thanos, "receive",
            f"--tsdb.path={work / f'receive-{i}'}",
            f"--grpc-address=127.0.0.1:{ports[f'r{i}_grpc']}",
            f"--http-address=127.0.0.1:{ports[f'r{i}_http']}",
            f"--remote-write.address=127.0.0.1:{ports[f'r{i}_rw']}",
            f"--receive.capnproto-address=127.0.0.1:{ports[f'r{i}_capnp']}",
            *GRACE,
            f"--receive.local-endpoint=127.0.0.1:{ports[f'r{i}_grpc']}",
            f"--receive.hashrings-file={hashring}",
            "--receive.replication-factor=1",
            # A forward to the receiver that owns a series waits up to 5 s by default: on a
            # loaded machine that failed whole batches, whose retries then collided with the
            # half already written (409, out of order). The agent's own timeout is 30 s.
            "--receive-forward-timeout=30s",
            f'--label=receive_replica="{i}"',
            "--tsdb.retention=1d",
            "--log.level=warn",
        ])
    procs.start("rule", [
        thanos, "rule",
        f"--data-dir={work / 'rule'}",
        *[f"--rule-file={ROOT / 'otel-config' / 'rules' / f}" for f in RULE_FILES],
        f"--query=http://127.0.0.1:{ports['q_http']}",
        f"--alertmanagers.url=http://127.0.0.1:{sink.port}",
        f"--eval-interval={a.eval_interval}s",
        f"--http-address=127.0.0.1:{ports['rule_http']}",
        f"--grpc-address=127.0.0.1:{ports['rule_grpc']}",
        '--label=ruler="0"',
        *GRACE,
        "--resend-delay=15s",
        "--log.level=warn",
    ])
    procs.start("query", [
        thanos, "query",
        f"--http-address=127.0.0.1:{ports['q_http']}",
        f"--grpc-address=127.0.0.1:{ports['q_grpc']}",
        "--endpoint.sd-config=" + json.dumps({"endpoints": [
            {"address": f"127.0.0.1:{ports[p]}"} for p in ("r0_grpc", "r1_grpc", "rule_grpc")]}),
        *GRACE,
        "--query.replica-label=receive_replica",
        "--log.level=warn",
    ])
    # The agent (otel-config/thanos/prometheus-agent.yml): half the fleet scraped as text
    # (classic histograms), half as protobuf with native histograms, both as one job.
    half = round(len(targets) * (1 - a.native_share))
    (work / "targets-classic.json").write_text(json.dumps([{"targets": targets[:half]}]))
    (work / "targets-native.json").write_text(json.dumps([{"targets": targets[half:]}]))
    (work / "targets-thanos.json").write_text(json.dumps([
        {"targets": [f"127.0.0.1:{ports[p]}"], "labels": {"component": c}}
        for p, c in (("r0_http", "receive"), ("r1_http", "receive"), ("q_http", "query"), ("rule_http", "rule"))]))
    (work / "agent.yml").write_text(fill((cfg / "prometheus-agent.yml").read_text(), {
        "SCRAPE_INTERVAL": f"{a.scrape_interval:g}s",
        "SCRAPE_TIMEOUT": f"{min(a.scrape_interval, 10):g}s",
        "TARGETS_CLASSIC": str(work / "targets-classic.json"),
        "TARGETS_NATIVE": str(work / "targets-native.json"),
        "TARGETS_THANOS": str(work / "targets-thanos.json"),
        "JOB": JOB,
        "RECEIVE_URL": f"http://127.0.0.1:{ports['r0_rw']}/api/v1/receive",
    }))
    procs.start("agent", [
        prom, "--agent",
        f"--config.file={work / 'agent.yml'}",
        f"--storage.agent.path={work / 'agent-wal'}",
        f"--web.listen-address=127.0.0.1:{ports['agent']}",
        "--log.level=warn",
    ])
    for name, port in (("receive-0", "r0_http"), ("receive-1", "r1_http"), ("query", "q_http"),
                       ("rule", "rule_http"), ("agent", "agent")):
        wait_ready(f"http://127.0.0.1:{ports[port]}/-/ready", name, 120, procs, name)
    return ports


# ---------------------------------------------------------------- the fleet

def start_fleet(a, procs: Procs, binary: str) -> tuple[list[str], dict, float]:
    groups = a.ranks // GROUP_SIZE
    targets: list[str] = []
    killed = None
    common = [
        "demo", "--layers", str(a.layers), "--dense-layers", "1", "--time-scale", str(a.time_scale),
        "--spin-us", "0", "--forever", "--linger", "3600", "--request-rate", str(a.request_rate),
        "--rendezvous-timeout", "3600",
    ]
    env_common = {
        "OTEL_SERVICE_NAME": JOB,
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_TRACES_EXPORTER": "none",
        "PHASETRACE_LAYER_RANKS": a.layer_ranks,
        "PHASETRACE_LEVEL": "full",
    }
    start = time.time()
    straggle_after = a.balanced_minutes * 60
    for g in range(groups):
        name = f"g{g:03d}"
        extra = []
        if name == a.straggler_group:
            extra = ["--straggler-rank", str(a.straggler_rank), "--straggler-factor", str(a.straggler_factor),
                     "--straggler-after", f"{straggle_after - (time.time() - start):.3f}"]
        if g % 2:
            # Odd groups decode speculatively: the speculative dashboard's panels have data.
            extra += ["--spec", "3"]
        if g == 0:
            rdv = f"127.0.0.1:{free_port()}"
            for r in range(GROUP_SIZE):
                port = free_port()
                targets.append(f"127.0.0.1:{port}")
                p = procs.start(f"{name}-rank{r}", [binary, *common, "--seed", str(1000 + g), "--ranks", str(GROUP_SIZE),
                                                  "--rank", str(r), "--rendezvous", rdv, "--prometheus", f"127.0.0.1:{port}", *extra],
                                {**env_common, "PHASETRACE_GROUP": name,
                                 "OTEL_RESOURCE_ATTRIBUTES": f"host.name=node-{g:03d}-{r}"})
                if r == a.kill_rank:
                    killed = {"group": name, "rank": str(r), "pid": p.pid, "instance": targets[-1]}
            continue
        port = free_port()
        targets.append(f"127.0.0.1:{port}")
        procs.start(name, [binary, *common, "--seed", str(1000 + g), "--ranks", str(GROUP_SIZE),
                           "--prometheus", f"127.0.0.1:{port}", *extra],
                    {**env_common, "PHASETRACE_GROUP": name, "OTEL_RESOURCE_ATTRIBUTES": f"host.name=node-{g:03d}"})
    return targets, killed or {}, start


# ---------------------------------------------------------------- measuring

RULE_DURATION = 'max by (rule_group) (prometheus_rule_group_last_duration_seconds{job="thanos", component="rule"})'


def rules_alone(a, ports: dict, procs: "Procs") -> dict:
    """The rule groups' evaluation time with the tier alone on the machine: the rank processes
    and the agent stopped (SIGSTOP) for four evaluation intervals, the store holding what they
    wrote. On one machine the fleet's processes take the CPU the querier needs, so the figure
    under load (`rule_group_seconds_balanced_median`) measures the machine as much as the rules;
    a real tier runs on machines of its own. Nothing is ingested meanwhile: the rules read the
    last minutes' samples, as they did."""
    paused = [p for name, p in procs.procs if name.startswith("g") or name == "agent"]
    for p in paused:
        try:
            os.killpg(p.pid, signal.SIGSTOP)
        except ProcessLookupError:
            pass
    samples: dict[str, list[float]] = {}
    try:
        time.sleep(a.eval_interval)  # the evaluation under way when they stopped ends first
        for _ in range(4):
            time.sleep(a.eval_interval)
            # From the ruler itself: the agent that scrapes it into the store is stopped too.
            text = http_get(f"http://127.0.0.1:{ports['rule_http']}/metrics").decode()
            # Thanos adds labels of its own (`strategy`) beside `rule_group`.
            for m in re.finditer(r'^prometheus_rule_group_last_duration_seconds\{([^}]*)\} (\S+)$', text, re.M):
                group = re.search(r'rule_group="([^"]*)"', m.group(1))
                if group:
                    samples.setdefault(group.group(1).rsplit(";", 1)[-1], []).append(float(m.group(2)))
    finally:
        for p in paused:
            try:
                os.killpg(p.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    if not samples:
        log("rule groups with the tier alone: the ruler's /metrics had no prometheus_rule_group_last_duration_seconds")
    med = {g: sorted(v)[len(v) // 2] for g, v in sorted(samples.items())}
    log(f"rule groups with the tier alone: {sum(med.values()) * 1000:.0f} ms in all")
    return {"rule_group_seconds_tier_alone": med, "rule_seconds_total_tier_alone": sum(med.values())}


def costs(a, q: Query, ports: dict, procs: Procs, work: Path, ranks: int) -> dict:
    """What the fleet costs the tier, read from the store itself (the agent scrapes the tier's
    own metrics as job `thanos`) and from /proc and the TSDB folders."""
    out: dict = {}
    sc = lambda e: q.scalar(e)  # noqa: E731
    out["series_thanos_own"] = sc('count({job="thanos"})')
    out["series_head_receivers"] = sc('sum(prometheus_tsdb_head_series{job="thanos", component="receive"})')
    # count() over every series of a large fleet can outlast the query timeout on a busy
    # machine: the receivers' head (all that was written: the fleet's and the tier's own
    # series) less the tier's own is the same figure, read from two gauges.
    out["series_fleet"] = sc(f'count({{job="{JOB}"}})')
    if out["series_fleet"] is None and out["series_head_receivers"] is not None:
        out["series_fleet"] = out["series_head_receivers"] - (out["series_thanos_own"] or 0)
        out["series_fleet_from"] = "receivers' head series less job thanos"
    out["series_per_rank"] = (out["series_fleet"] or 0) / ranks
    # One rank of each kind, by metric (cheap: one rank's series): the formula's check.
    for kind, grp in (("plain", "g002"), ("speculative", "g001")):
        for rank in ("0", "3"):
            out[f"series_rank{rank}_{kind}"] = sc(f'count({{job="{JOB}", group="{grp}", rank="{rank}"}})')
    out["series_recorded_by_ruler"] = sc('count({__name__=~"phasetrace:.+"})')
    out["series_per_rank_by_metric_top"] = {
        r["metric"].get("__name__", "?"): float(r["value"][1]) / ranks
        for r in q.vector(f'topk(12, count by (__name__) ({{job="{JOB}"}}))')}
    out["samples_per_second"] = sc('sum(rate(prometheus_tsdb_head_samples_appended_total{job="thanos", component="receive"}[2m]))')
    out["samples_per_second_per_rank"] = (out["samples_per_second"] or 0) / ranks
    appended = sc('sum(prometheus_tsdb_head_samples_appended_total{job="thanos", component="receive"})') or 0
    disk = du(work / "receive-0") + du(work / "receive-1")
    out["receiver_disk_bytes"] = disk
    out["bytes_per_sample_on_disk"] = disk / appended if appended else None
    out["rule_group_seconds"] = {
        r["metric"].get("rule_group", "?").rsplit(";", 1)[-1]: float(r["value"][1])
        for r in q.vector(RULE_DURATION)}
    out["rule_iterations_missed"] = sc('sum(prometheus_rule_group_iterations_missed_total{job="thanos", component="rule"})')
    out["rule_seconds_total"] = sum(out["rule_group_seconds"].values())
    for name, p in procs.procs:
        if name in ("receive-0", "receive-1", "rule", "query", "agent"):
            out[f"{name}_rss_bytes"] = rss_bytes(p.pid)
    demo_rss = [r for r in (rss_bytes(p.pid) for n, p in procs.procs if n.startswith("g")) if r]
    out["demo_process_rss_bytes_mean"] = sum(demo_rss) / len(demo_rss) if demo_rss else None
    return out


def dashboards(a, ports: dict, work: Path) -> tuple[bool, str]:
    """Every panel and variable query of the bundled dashboards, and every rule expression and
    recorded series, against the querier (the recorded series come from the ruler's store)."""
    cmd = [sys.executable, str(ROOT / "scripts" / "promql-live-check.py"),
           "--prometheus", f"http://127.0.0.1:{ports['q_http']}",
           "--rate-interval", "2m", "--range", "10m", "--timeout", "60", "--retry-for", "120",
           # As the dashboards open: one group selected (g001, a group of rank threads with
           # speculative decoding), every panel within 100 series whatever the fleet's size.
           "--var", "group=g001", "--max-series", "100"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    (work / "dashboards.log").write_text(r.stdout + r.stderr)
    return r.returncode == 0, (r.stdout + r.stderr)[-3000:]


# ---------------------------------------------------------------- the run

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=128, help="ranks in the fleet, a multiple of 8 (default 128)")
    p.add_argument("--layers", type=int, default=12, help="layers of each rank's model (default 12)")
    p.add_argument("--layer-ranks", default="0", help="PHASETRACE_LAYER_RANKS of every rank (default 0: one rank per group)")
    p.add_argument("--time-scale", type=float, default=200.0,
                   help="the demo's --time-scale: kernels this many times the default demo's (default 200: a step of about 1 s at 12 layers)")
    p.add_argument("--request-rate", type=float, default=0.05, help="requests a second per group (default 0.05)")
    p.add_argument("--balanced-minutes", type=float, default=4.0, help="minutes before the straggler starts and the rank is killed (default 4)")
    p.add_argument("--straggler-group", default=None, help="the straggler's group (default: the middle group)")
    p.add_argument("--straggler-rank", type=int, default=3)
    p.add_argument("--straggler-factor", type=float, default=1.2)
    p.add_argument("--kill-rank", type=int, default=5, help="the rank of g000 killed at the straggler's start")
    p.add_argument("--native-share", type=float, default=0.5,
                   help="the share of the rank processes scraped as protobuf with native histograms; the rest as text with "
                        "classic buckets (default 0.5; 1 for the 1,024-rank run: classic buckets cost 20x the series)")
    p.add_argument("--scrape-interval", type=float, default=15.0)
    p.add_argument("--eval-interval", type=float, default=15.0)
    p.add_argument("--detect-timeout", type=float, default=480.0, help="seconds to wait for both alerts (default 480)")
    p.add_argument("--phasetrace", default=None, help="the phasetrace binary (default target/release/phasetrace, else target/debug/phasetrace)")
    p.add_argument("--json", default=None, help="write the figures here")
    p.add_argument("--keep", action="store_true", help="keep the work folder (logs, TSDBs)")
    p.add_argument("--check", action="store_true", help="exit 1 when a check fails")
    a = p.parse_args()
    if a.ranks < 2 * GROUP_SIZE or a.ranks % GROUP_SIZE:
        p.error(f"--ranks {a.ranks}: expected a multiple of {GROUP_SIZE}, at least {2 * GROUP_SIZE}")
    if not 0 <= a.straggler_rank < GROUP_SIZE or not 0 <= a.kill_rank < GROUP_SIZE:
        p.error(f"--straggler-rank and --kill-rank: expected a rank from 0 to {GROUP_SIZE - 1}")
    groups = a.ranks // GROUP_SIZE
    a.straggler_group = a.straggler_group or f"g{groups // 2:03d}"
    if a.straggler_group == "g000":
        p.error("--straggler-group g000: expected another group (g000's rank --kill-rank is killed)")
    binary = a.phasetrace or next((str(b) for b in (ROOT / "target/release/phasetrace", ROOT / "target/debug/phasetrace") if b.exists()), None)
    if not binary:
        p.error("no phasetrace binary: cargo build --release -p phasetrace-cli (or pass --phasetrace)")
    # The processes run in the work folder: a relative path is taken from here, once.
    binary = os.path.abspath(binary)
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        p.error(f"--phasetrace {a.phasetrace}: expected an executable phasetrace binary, found none at {binary}")
    t = tools()
    if not t.get("PHASETRACE_THANOS_BIN"):
        p.error("no thanos binary: run scripts/install-tools.sh (it writes .tools/env), or set PHASETRACE_THANOS_BIN")
    # The bundled rules as Thanos reads them (its own parser and checks), before anything runs.
    check = subprocess.run([t["PHASETRACE_THANOS_BIN"], "tools", "rules-check",
                            *[f"--rules={ROOT / 'otel-config' / 'rules' / f}" for f in RULE_FILES]],
                           capture_output=True, text=True)
    if check.returncode != 0:
        raise SystemExit(f"thanos tools rules-check refused the bundled rules:\n{check.stdout}{check.stderr}")
    work = Path(tempfile.mkdtemp(prefix="phasetrace-fleet-"))
    log(f"{a.ranks} ranks in {groups} groups of {GROUP_SIZE}, {a.layers} layers, PHASETRACE_LAYER_RANKS={a.layer_ranks}, "
        f"time scale {a.time_scale}; straggler {a.straggler_group} rank {a.straggler_rank} x{a.straggler_factor} "
        f"and g000 rank {a.kill_rank} killed after {a.balanced_minutes} min; work folder {work}; binary {binary}")
    sink = AlertSink()
    procs = Procs(work)
    results: dict = {"ranks": a.ranks, "groups": groups, "layers": a.layers, "layer_ranks": a.layer_ranks,
                     "time_scale": a.time_scale, "scrape_interval_s": a.scrape_interval, "eval_interval_s": a.eval_interval,
                     "balanced_minutes": a.balanced_minutes, "native_share": a.native_share,
                     "machine": f"{os.cpu_count()} cores"}
    failures: list[str] = []
    # SIGTERM (a CI timeout, kill) stops the fleet and the tier as the end of a run does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        # The fleet first (its processes take a while to start), its addresses for the agent.
        targets, killed, t0 = start_fleet(a, procs, binary)
        ports = start_tier(a, t, procs, work, sink, targets)
        q = Query(f"http://127.0.0.1:{ports['q_http']}")
        deadline = time.time() + 240
        seen = 0.0
        while time.time() < deadline:
            seen = q.scalar(f'count(count by (group, rank) (phasetrace_steps_total{{job="{JOB}"}}))') or 0
            if seen >= a.ranks:
                break
            time.sleep(5)
        log(f"the querier sees {seen:.0f} of {a.ranks} ranks, {time.time() - t0:.0f} s after the start")
        if seen < a.ranks:
            failures.append(f"only {seen:.0f} of {a.ranks} ranks reached the querier within 4 minutes")
        # The balanced window. Once a minute: how far the store is behind the ranks (the newest
        # sample the querier has). A tier that falls behind (receivers short of CPU) makes every
        # figure after it meaningless (rules over windows that hold no data yet), so it fails
        # the run, saying so, rather than measuring it.
        straggle_at = t0 + a.balanced_minutes * 60
        lags: list[float] = []
        rule_samples: dict[str, list[float]] = {}
        next_lag = time.time()
        while time.time() < straggle_at:
            if time.time() >= next_lag:
                lag = q.scalar(f'time() - max(timestamp(phasetrace_steps_total{{job="{JOB}"}}))')
                if lag is not None:
                    lags.append(lag)
                    log(f"the store is {lag:.0f} s behind the ranks")
                # The rule groups' evaluation time in the steady state (the last evaluation of
                # each, once a minute): the figure for rule cost, apart from the end of the run,
                # where the dashboards' queries share the querier.
                for r in q.vector(RULE_DURATION):
                    group = r["metric"].get("rule_group", "?").rsplit(";", 1)[-1]
                    rule_samples.setdefault(group, []).append(float(r["value"][1]))
                next_lag = time.time() + 60
            time.sleep(min(10, max(0.1, straggle_at - time.time())))
        # Four scrapes and a minute of remote write: past it the rules' 2-minute windows are empty.
        results["rule_group_seconds_balanced_median"] = {
            g: sorted(v)[len(v) // 2] for g, v in sorted(rule_samples.items())}
        results["rule_seconds_total_balanced_median"] = sum(results["rule_group_seconds_balanced_median"].values())
        lag_limit = 4 * a.scrape_interval + 60
        results["store_lag_max_s"] = max(lags, default=None)
        results["store_lag_median_s"] = sorted(lags)[len(lags) // 2] if lags else None
        if lags and max(lags) > lag_limit:
            failures.append(f"the store fell {max(lags):.0f} s behind the ranks (limit {lag_limit:.0f} s: four "
                            f"scrapes and a minute of remote write): the tier is short of CPU for {a.ranks} ranks "
                            f"at a {a.scrape_interval:g} s scrape; the figures of this run are not valid")
        balanced_false = sink.alerts(STRAGGLER)
        rank_hours = a.ranks * a.balanced_minutes / 60
        results["balanced_rank_hours"] = rank_hours
        results["false_straggler_alerts_balanced"] = len(balanced_false)
        results["false_alerts_per_rank_hour"] = len(balanced_false) / rank_hours
        log(f"balanced window over: {len(balanced_false)} straggler alerts in {rank_hours:.1f} rank-hours")
        if killed:
            os.kill(killed["pid"], signal.SIGKILL)
            killed_at = time.time()
            log(f"killed {killed['group']} rank {killed['rank']} (pid {killed['pid']}); straggler {a.straggler_group} rank {a.straggler_rank} starts now")
        # Detection.
        want_s = {"group": a.straggler_group, "rank": str(a.straggler_rank)}
        want_k = {"group": killed.get("group"), "rank": killed.get("rank")}
        s_at = k_at = None
        deadline = time.time() + a.detect_timeout
        while time.time() < deadline and (s_at is None or k_at is None):
            procs.check_alive(["receive-0", "receive-1", "query", "rule", "agent"])
            for labels, at in sink.alerts(STRAGGLER):
                if s_at is None and all(labels.get(k) == v for k, v in want_s.items()):
                    s_at = at
                    log(f"{STRAGGLER} for {want_s} after {at - straggle_at:.0f} s")
            for labels, at in sink.alerts(SILENT):
                if k_at is None and all(labels.get(k) == v for k, v in want_k.items()):
                    k_at = at
                    log(f"{SILENT} for {want_k} after {at - killed_at:.0f} s")
            time.sleep(2)
        results["straggler_detection_s"] = None if s_at is None else s_at - straggle_at
        results["silent_detection_s"] = None if k_at is None else k_at - killed_at
        if s_at is None:
            failures.append(f"no {STRAGGLER} for {want_s} within {a.detect_timeout:.0f} s")
        if k_at is None:
            failures.append(f"no {SILENT} for {want_k} within {a.detect_timeout:.0f} s")
        wrong = [l for l, _ in sink.alerts(STRAGGLER) if not all(l.get(k) == v for k, v in want_s.items())]
        results["false_straggler_alerts_total"] = len(wrong)
        if wrong:
            failures.append(f"{len(wrong)} {STRAGGLER} alerts for other ranks: {wrong[:5]}")
        wrong_silent = [l for l, _ in sink.alerts(SILENT) if not all(l.get(k) == v for k, v in want_k.items())]
        if wrong_silent:
            failures.append(f"{len(wrong_silent)} {SILENT} alerts for other ranks: {wrong_silent[:5]}")
        results["alerts_received"] = sorted({l.get("alertname", "") + " " + l.get("group", "") + "/" + l.get("rank", "")
                                             for l in (dict(k) for k in sink.first)})
        # The dashboards, then the costs.
        ok, text = dashboards(a, ports, work)
        results["dashboards_ok"] = ok
        if not ok:
            failures.append("dashboard queries failed against the querier:\n" + text)
        results.update(costs(a, q, ports, procs, work, a.ranks))
        results.update(rules_alone(a, ports, procs))
    finally:
        procs.stop()
    results["failures"] = failures
    results["wall_s"] = time.time() - t0
    print(json.dumps(results, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2) + "\n")
    if not a.keep:
        subprocess.run(["rm", "-rf", str(work)], check=False)
    else:
        log(f"kept {work}")
    checks = 4
    print(f"fleet: {checks - min(checks, len(failures))} passed, {len(failures)} failed")
    for f in failures:
        log(f"FAILED: {f}")
    return 1 if failures and a.check else 0


if __name__ == "__main__":
    sys.exit(main())
