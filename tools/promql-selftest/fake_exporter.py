#!/usr/bin/env python3
"""A synthetic phasetrace metrics endpoint (Prometheus text format), standard library only.

Serves every series of the telemetry contract (section, step, collective wait, MoE expert,
speculative metrics) with counters that grow with wall time, for 4 ranks and a few layers.
Rank 0 is a straggler at the `attn` collective of every layer (its wait is ~0, the others wait
~10 ms), so PhasetraceRankStraggler and PhasetraceCollectiveWaitHigh fire on it.
Used by scripts/promql-live-selftest.sh to exercise scripts/promql-live-check.py, the rules and
the dashboards' queries against a real Prometheus without the Rust demo.

Usage: fake_exporter.py [--port 9464] [--addr 127.0.0.1]
"""

import argparse
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BOUNDS = [1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2,
          5e-2, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0]
RANKS = 4
LAYERS = 4
SECTIONS = {  # bucket: (site, seconds per call)
    "norm": ("attn", 20e-6), "kda_mixer": ("attn", 300e-6), "dsa_attend": ("attn", 250e-6),
    "reduce_attn": ("attn", 80e-6), "moe_experts": ("mlp", 400e-6), "moe_router": ("mlp", 30e-6),
    "reduce_mlp": ("mlp", 70e-6),
}
STEP_RATE = 50.0  # decode steps per second per rank
START = time.time()


def labels(**kv):
    return "{" + ",".join(f'{k}="{v}"' for k, v in kv.items()) + "}"


def histogram(out, name, lbl, count, value):
    """A histogram whose observations are all `value`."""
    for bound in BOUNDS:
        out.append(f"{name}_bucket{labels(**lbl, le=repr(bound))} {count if value <= bound else 0}")
    out.append(f"{name}_bucket{labels(**lbl, le='+Inf')} {count}")
    out.append(f"{name}_sum{labels(**lbl)} {count * value}")
    out.append(f"{name}_count{labels(**lbl)} {count}")


def render():
    t = time.time() - START
    steps = int(t * STEP_RATE)
    out = []
    out.append("# TYPE phasetrace_steps_total counter")
    for r in range(RANKS):
        out.append(f"phasetrace_steps_total{labels(rank=r)} {steps}")
    out.append("# TYPE phasetrace_step_duration_seconds histogram")
    for r in range(RANKS):
        histogram(out, "phasetrace_step_duration_seconds", {"rank": r}, steps, 0.018)
    out.append("# TYPE phasetrace_section_duration_seconds histogram")
    for r in range(RANKS):
        for layer in range(LAYERS):
            for bucket, (site, secs) in SECTIONS.items():
                histogram(out, "phasetrace_section_duration_seconds",
                          {"bucket": bucket, "layer": layer, "site": site, "rank": r}, steps, secs)
    out.append("# TYPE phasetrace_collective_wait_seconds histogram")
    for r in range(RANKS):
        for layer in range(LAYERS):
            for site in ("attn", "mlp"):
                wait = 2e-6 if (site == "attn" and r == 0) else (9e-3 if site == "attn" else 40e-6)
                histogram(out, "phasetrace_collective_wait_seconds",
                          {"site": site, "layer": layer, "rank": r}, steps, wait)
    out.append("# TYPE phasetrace_moe_expert_tokens_total counter")
    for layer in range(LAYERS):
        for expert in range(8):
            out.append(f"phasetrace_moe_expert_tokens_total{labels(layer=layer, expert=expert)} {steps * (expert + 1)}")
    rounds = int(t * 20)
    out.append("# TYPE phasetrace_spec_phase_duration_seconds histogram")
    for r in range(RANKS):
        for phase, secs in (("draft", 0.004), ("verify", 0.03), ("accept", 2e-4), ("rollback", 1e-4), ("maint", 5e-5)):
            histogram(out, "phasetrace_spec_phase_duration_seconds", {"phase": phase, "rank": r}, rounds, secs)
        for part, secs in (("kda", 0.01), ("kda_scan", 0.003), ("mla", 0.008), ("ffn", 0.007), ("rest", 0.002)):
            histogram(out, "phasetrace_spec_verify_part_duration_seconds", {"part": part, "rank": r}, rounds, secs)
        out.append(f"phasetrace_spec_rounds_total{labels(rank=r)} {rounds}")
        out.append(f"phasetrace_spec_draft_tokens_total{labels(rank=r)} {rounds * 4}")
        out.append(f"phasetrace_spec_accepted_tokens_total{labels(rank=r)} {int(rounds * 2.5)}")
        for le in range(0, 5):
            out.append(f"phasetrace_spec_accepted_length_bucket{labels(rank=r, le=str(float(le)))} {int(rounds * min(1.0, (le + 1) / 5))}")
        out.append(f"phasetrace_spec_accepted_length_bucket{labels(rank=r, le='+Inf')} {rounds}")
        out.append(f"phasetrace_spec_accepted_length_sum{labels(rank=r)} {rounds * 2.5}")
        out.append(f"phasetrace_spec_accepted_length_count{labels(rank=r)} {rounds}")
    return "\n".join(out) + "\n"


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404)
            return
        body = render().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--addr", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9464)
    args = parser.parse_args()
    ThreadingHTTPServer((args.addr, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
