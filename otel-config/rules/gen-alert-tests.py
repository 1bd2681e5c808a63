#!/usr/bin/env python3
"""Writes phasetrace-alerts.test.yml, the promtool unit tests of the bundled alerts.

    python3 otel-config/rules/gen-alert-tests.py      # rewrite the test file
    python3 otel-config/rules/gen-alert-tests.py --check   # fail if the file is out of date

Generated because the fleet cases are big: a 96-layer model has 192 per-(site, layer) wait
series per rank. Edit the scenarios here, never the YAML. Series are sampled every 15 s (a
typical scrape and evaluation interval), so the times asserted below are the ones a
production Prometheus would show.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "phasetrace-alerts.test.yml")
STEP_S = 15  # seconds between samples
N = 60  # samples per series: 15 minutes
DASH = "/d/phasetrace-collectives/phasetrace-collectives-and-rank-skew"
DECODE_DASH = "/d/phasetrace-decode/phasetrace-decode-sections"


def fmt(x: float) -> str:
    return repr(round(x, 9))


def labels(**kv: str) -> str:
    return ",".join(f'{k}="{v}"' for k, v in kv.items())


def series(name: str, values: str, **kv: str) -> str:
    return f"      - series: '{name}{{{labels(**kv)}}}'\n        values: '{values}'\n"


def ramp(per_sample: float, n: int = N) -> str:
    """A counter growing by `per_sample` every sample."""
    return f"0+{fmt(per_sample)}x{n}"


def pieces(*parts: tuple[float, int]) -> str:
    """A counter growing by rate r for n samples, then the next (rate, n), ...: 'a+bxn c+dxm'."""
    out, start, first = [], 0.0, True
    for per_sample, n in parts:
        begin = start if first else start + per_sample
        out.append(f"{fmt(begin)}+{fmt(per_sample)}x{n if first else n - 1}")
        start = begin + per_sample * (n if first else n - 1)
        first = False
    return " ".join(out)


def rank_series(job, group, rank, instance, share, steps_per_s=50.0, stop_after=None, stale=False):
    """Per-step series of one rank: step time 1 s per second (always busy), `share` of it
    waiting. `share` may be a list of (share, samples) pieces. With `stop_after`, the counters
    stop there: frozen (still exported) or, with `stale`, gone (stale markers)."""
    kv = dict(job=job, group=group, rank=str(rank), instance=instance)
    shares = share if isinstance(share, list) else [(share, N + 1)]
    wait = pieces(*[(s * STEP_S, n) for s, n in shares])
    total = N + 1
    if stop_after is None:
        dur, steps = ramp(STEP_S), ramp(steps_per_s * STEP_S)
    else:
        tail = total - 1 - stop_after
        end_d, end_s = STEP_S * stop_after, steps_per_s * STEP_S * stop_after
        if stale:
            suffix_d = suffix_s = " " + " ".join(["stale"] * tail)
            shares = [(s, n) for s, n in shares]
            wait = pieces(*[(s * STEP_S, n) for s, n in shares]).rsplit("x", 1)[0] + f"x{stop_after}" + suffix_d
        else:
            suffix_d, suffix_s = f" {fmt(end_d)}x{tail}", f" {fmt(end_s)}x{tail}"
        dur = f"0+{fmt(STEP_S)}x{stop_after}{suffix_d}"
        steps = f"0+{fmt(steps_per_s * STEP_S)}x{stop_after}{suffix_s}"
    return (
        series("phasetrace_step_duration_seconds_sum", dur, **kv)
        + series("phasetrace_step_collective_wait_seconds_sum", wait, **kv)
        + series("phasetrace_steps_total", steps, **kv)
    )


def layer_series(job, group, rank, instance, layers, mean_wait, sites=("attn", "mlp"), calls_per_s=50.0):
    """Per-(site, layer) collective wait totals (the per-layer time and calls counters);
    `mean_wait(site, layer)`."""
    out = []
    for site in sites:
        for layer in layers:
            kv = dict(job=job, group=group, rank=str(rank), instance=instance, site=site)
            if layer is not None:
                kv["layer"] = str(layer)
            calls = calls_per_s * STEP_S
            out.append(series("phasetrace_collective_layer_wait_time_seconds_total", ramp(calls * mean_wait(site, layer)), **kv))
            out.append(series("phasetrace_collective_layer_wait_calls_total", ramp(calls), **kv))
    return "".join(out)


def target_info(job, instance, host):
    return series("target_info", f"1x{N}", job=job, instance=instance, host_name=host)


def alert(name, at, exp=None):
    text = f"      - alertname: {name}\n        eval_time: {at}\n"
    if not exp:
        return text + "        exp_alerts: []\n"
    text += "        exp_alerts:\n"
    for labels_, annotations in exp:
        text += "          - exp_labels:\n"
        for k, v in labels_.items():
            text += f"              {k}: {quote(v)}\n"
        if annotations:
            text += "            exp_annotations:\n"
            for k, v in annotations.items():
                text += f"              {k}: {quote(v)}\n"
    return text


def quote(v: str) -> str:
    return "'" + v.replace("'", "''") + "'"


def test(name, inputs, alerts, exprs=""):
    return (
        f"  - name: {quote(name)}\n    interval: {STEP_S}s\n    input_series:\n{inputs}"
        + (f"    promql_expr_test:\n{exprs}" if exprs else "")
        + f"    alert_rule_test:\n{alerts}"
    )


def expr_test(expr, at, samples):
    text = f"      - expr: {quote(expr)}\n        eval_time: {at}\n        exp_samples:"
    text += "\n" if samples else " []\n"
    for lbl, value in samples:
        text += f"          - labels: {quote(lbl)}\n            value: {value}\n"
    return text


def straggler_annotations(rank, group, job, instance, host, lost, own, others, worst, hot=()):
    where = f"instance {instance}" + (f", host {host}" if host else "")
    desc = (
        f"Rank {rank} of group {group} in {job} ({where}) is the rank its group waits for: the "
        f"other ranks spend {lost} more of each step waiting at the collectives than it does "
        f"({own} for it, {others} for the others on average), so the group runs about that much "
        f"slower than it would if this rank kept up."
    )
    if worst:
        desc += " " + worst
    if hot:
        desc += (
            " It hosts the hot experts"
            + "".join(f" {e} of layer {l} ({share} of the layer's tokens)," for l, e, share in hot)
            + " so the tokens routed to it, not its hardware, may be what makes it slow: replicate"
            " or move those experts."
        )
    return {
        "summary": f"Rank {rank} of group {group} is a straggler: it costs its group {lost} of its step time",
        "description": desc,
        "dashboard": DASH,
    }


# The per-site p99 and dropped-records alerts: hand-written, one sample a minute.
OTHER_ALERTS = """  # --- PhasetraceCollectiveWaitHigh --------------------------------------------------------
  # attn: every wait in (5 ms, 10 ms] for 20 minutes (p99 ~ 9.95 ms > 5 ms), then all under
  # 1 ms (resolved). mlp: every wait under 1 ms all along (quiet).
  - name: collective wait p99 fires, stays quiet elsewhere, resolves
    interval: 1m
    input_series:
      - series: 'phasetrace_collective_wait_seconds_bucket{job="phasetrace",group="tp0",site="attn",rank="2",le="0.001"}'
        values: '0x20 60+60x19'
      - series: 'phasetrace_collective_wait_seconds_bucket{job="phasetrace",group="tp0",site="attn",rank="2",le="0.005"}'
        values: '0x20 60+60x19'
      - series: 'phasetrace_collective_wait_seconds_bucket{job="phasetrace",group="tp0",site="attn",rank="2",le="0.01"}'
        values: '0+60x40'
      - series: 'phasetrace_collective_wait_seconds_bucket{job="phasetrace",group="tp0",site="attn",rank="2",le="+Inf"}'
        values: '0+60x40'
      - series: 'phasetrace_collective_wait_seconds_bucket{job="phasetrace",group="tp0",site="attn",rank="1",le="0.001"}'
        values: '0+60x40'
      - series: 'phasetrace_collective_wait_seconds_bucket{job="phasetrace",group="tp0",site="attn",rank="1",le="0.005"}'
        values: '0+60x40'
      - series: 'phasetrace_collective_wait_seconds_bucket{job="phasetrace",group="tp0",site="attn",rank="1",le="0.01"}'
        values: '0+60x40'
      - series: 'phasetrace_collective_wait_seconds_bucket{job="phasetrace",group="tp0",site="attn",rank="1",le="+Inf"}'
        values: '0+60x40'
      - series: 'phasetrace_collective_wait_seconds_bucket{job="phasetrace",group="tp0",site="mlp",rank="2",le="0.001"}'
        values: '0+60x40'
      - series: 'phasetrace_collective_wait_seconds_bucket{job="phasetrace",group="tp0",site="mlp",rank="2",le="0.005"}'
        values: '0+60x40'
      - series: 'phasetrace_collective_wait_seconds_bucket{job="phasetrace",group="tp0",site="mlp",rank="2",le="0.01"}'
        values: '0+60x40'
      - series: 'phasetrace_collective_wait_seconds_bucket{job="phasetrace",group="tp0",site="mlp",rank="2",le="+Inf"}'
        values: '0+60x40'
    alert_rule_test:
      - alertname: PhasetraceCollectiveWaitHigh
        eval_time: 4m
        exp_alerts: []
      - alertname: PhasetraceCollectiveWaitHigh
        eval_time: 15m
        exp_alerts:
          - exp_labels:
              severity: warning
              job: phasetrace
              group: tp0
              site: attn
            exp_annotations:
              summary: High p99 collective wait at site attn in group tp0
              description: >-
                p99 of the rendezvous wait at the attn collectives of group
                tp0 in phasetrace is
                9.9ms (threshold
                5ms).
                Worst:
                rank 2 (9.95ms).
              dashboard: /d/phasetrace-collectives/phasetrace-collectives-and-rank-skew
      - alertname: PhasetraceCollectiveWaitHigh
        eval_time: 35m
        exp_alerts: []

  # --- PhasetraceRecordsDropped ------------------------------------------------------------
  - name: records dropped fires, stays quiet without drops, resolves
    interval: 1m
    input_series:
      # queue_full drops for 20 minutes, then none.
      - series: 'phasetrace_records_dropped_total{job="phasetrace",group="tp0",reason="queue_full",rank="0"}'
        values: '0+120x20 2400x20'
      # A reason that is exported but never increments.
      - series: 'phasetrace_records_dropped_total{job="phasetrace",group="tp0",reason="clock",rank="0"}'
        values: '0x40'
    alert_rule_test:
      - alertname: PhasetraceRecordsDropped
        eval_time: 5m
        exp_alerts: []
      - alertname: PhasetraceRecordsDropped
        eval_time: 15m
        exp_alerts:
          - exp_labels:
              severity: info
              job: phasetrace
              group: tp0
              reason: queue_full
            exp_annotations:
              summary: phasetrace is dropping records (queue_full)
              description: >-
                phasetrace (group tp0) drops 2 records/s
                for reason queue_full; the section and collective metrics undercount while it
                lasts.
              dashboard: /d/phasetrace-decode/phasetrace-decode-sections
      - alertname: PhasetraceRecordsDropped
        eval_time: 35m
        exp_alerts: []
"""


def silent_annotations(rank, group, job, instance, host):
    where = f"instance {instance}" + (f", host {host}" if host else "")
    return {
        "summary": f"Rank {rank} of group {group} is silent",
        "description": (
            f"Rank {rank} of group {group} in {job} ({where}) has stopped reporting decode steps "
            "while other ranks of its group still report: its process died, hung, or stopped "
            "exporting. The group cannot make progress without it; straggler alerts for the group "
            "are held back while this lasts."
        ),
        "dashboard": DASH,
    }


def open_series(job, group, rank, instance, values):
    """phasetrace_step_open_duration_seconds of one rank: `values` in promtool notation, or a
    list of numbers (one a sample)."""
    if not isinstance(values, str):
        values = " ".join(fmt(v) for v in values)
    return series("phasetrace_step_open_duration_seconds", values, job=job, group=group, rank=str(rank), instance=instance)


def hung_from(start, offset=0.0, busy=0.02):
    """The open-step gauge of a rank busy stepping (a step in flight at each scrape reads a few
    ms), whose step at sample `start` never ends: from then on it grows by the sample interval.
    `offset` seconds later (a deferred clock: counted from the first drain that found the
    stream stuck) it reads `offset` less."""
    return [busy if i < start else STEP_S * (i - start) - offset for i in range(N + 1)]


def hung_annotations(rank, group, job, instance, host, open_for, hung, seen, silent=()):
    where = f"instance {instance}" + (f", host {host}" if host else "")
    desc = (
        f"Rank {rank} of group {group} in {job} ({where}) has had a decode step open for {open_for} "
        f"without finishing it (threshold 30s). Hung in group {group}: {len(hung)} of the {seen} ranks "
        f"seen in the last 10 minutes (rank {', '.join(str(r) for r in hung)})."
    )
    for r, inst in silent:
        desc += f" Rank {r} ({inst}) is silent: it died or stopped exporting, and the others most likely wait for it."
    desc += (
        " All ranks of a group hung together points at a collective: an all-reduce (NCCL) that never "
        "completes, or a peer that hung or died mid-collective, which every other rank then waits for "
        "at its next collective. A stack dump of each rank (py-spy dump, cuda-gdb) shows which one is "
        "elsewhere. Straggler alerts for the group are held back while this lasts and for 2 minutes after."
    )
    return {
        "summary": f"Rank {rank} of group {group} is hung inside a decode step",
        "description": desc,
        "dashboard": DASH,
    }


def hung_alert(job, group, rank, instance, host, open_for, hung, seen, silent=()):
    return (
        {"severity": "critical", "job": job, "group": group, "rank": str(rank)},
        hung_annotations(rank, group, job, instance, host, open_for, hung, seen, silent),
    )


def main() -> int:
    tests = []
    job = "engine"

    # 1. A 1.2x straggler among 4 ranks of a 96-layer model, per-layer waits on: exactly one
    #    alert, for the straggler, naming its host and the worst (site, layer); it resolves
    #    once the rank keeps up again (from sample 40 = 10m).
    #    Shares: the others wait 16% of each step (1 - 1/1.2 of a compute-bound step), the
    #    straggler 1%: 15% of the group's time is lost to it.
    inputs = ""
    layers = list(range(96))
    for r in range(4):
        inst = f"10.0.0.{r + 1}:9464"
        slow = r == 2
        share = [(0.01, 41), (0.16, 20)] if slow else 0.16
        inputs += rank_series(job, "tp0", r, inst, share)
        inputs += target_info(job, inst, f"node-{r}")
        # Everyone waits 100 us per collective, except where the others wait for the straggler:
        # mlp layer 57 is the slowest (1.2 ms), where the straggler waits 10 us.
        inputs += layer_series(
            job, "tp0", r, inst, layers,
            lambda site, layer, slow=slow: (1e-5 if slow else 1.2e-3) if (site, layer) == ("mlp", 57) else 1e-4,
        )
    ann = straggler_annotations(
        2, "tp0", job, "10.0.0.3:9464", "node-2", "15%", "1%", "16%",
        "Worst at the mlp collective of layer 57 (1.19ms between the ranks' mean waits there).",
    )
    alerts = (
        alert("PhasetraceRankStraggler", "45s")
        + alert("PhasetraceRankStraggler", "2m", [({"severity": "warning", "job": job, "group": "tp0", "rank": "2"}, ann)])
        + alert("PhasetraceRankStraggler", "9m", [({"severity": "warning", "job": job, "group": "tp0", "rank": "2"}, ann)])
        + alert("PhasetraceRankStraggler", "14m")
        + alert("PhasetraceRankSilent", "9m")
    )
    exprs = expr_test(
        "count(phasetrace:rank_time_lost:ratio2m > on () group_left () phasetrace:straggler_time_lost_ratio:threshold)",
        "5m", [("{}", 1)],
    ) + expr_test(
        "round(phasetrace:rank_time_lost:ratio2m{rank=\"2\"}, 0.001)",
        "5m", [('{job="engine",group="tp0",rank="2"}', 0.15)],
    )
    tests.append(test("a 1.2x straggler among 4 ranks of a 96-layer model raises exactly one alert, then resolves", inputs, alerts, exprs))

    # 2. A 3x straggler, 2 ranks, per-layer attribute off (waits without `layer`), no
    #    target_info: fires within 2 minutes; the worst site is named without a layer.
    inputs = ""
    for r in range(2):
        inst = f"127.0.0.1:{9464 + r}"
        slow = r == 0
        inputs += rank_series(job, "default", r, inst, 0.0 if slow else 0.64)
        inputs += layer_series(job, "default", r, inst, [None], lambda site, layer, slow=slow: 0.0 if slow else (2e-3 if site == "attn" else 1e-3))
    ann = straggler_annotations(
        0, "default", job, "127.0.0.1:9464", None, "64%", "0%", "64%",
        "Worst at the attn collective (2ms between the ranks' mean waits there).",
    )
    alerts = (
        alert("PhasetraceRankStraggler", "1m")
        + alert("PhasetraceRankStraggler", "1m30s", [({"severity": "warning", "job": job, "group": "default", "rank": "0"}, ann)])
    )
    tests.append(test("a 3x straggler fires within 2 minutes, also without per-layer data", inputs, alerts))

    # 3. Balanced groups: 8 ranks whose wait shares differ by scheduling noise (up to 3 points
    #    apart), 4 ranks that all wait a lot (oversubscribed cores), and a group of one rank
    #    (nothing to compare with): no alert over 15 minutes.
    inputs = ""
    noise = [0.50, 0.52, 0.49, 0.51, 0.50, 0.48, 0.51, 0.50]
    for r, s in enumerate(noise):
        inputs += rank_series(job, "tp8", r, "127.0.0.1:9464", s)
    for r in range(4):
        inputs += rank_series(job, "tp4", r, f"10.0.1.{r + 1}:9464", 0.62 + 0.01 * (r % 2))
    inputs += rank_series(job, "solo", 0, "127.0.0.1:9470", 0.3)
    alerts = "".join(alert("PhasetraceRankStraggler", t) for t in ("2m", "5m", "10m", "15m"))
    alerts += alert("PhasetraceRankSilent", "15m")
    exprs = expr_test("count(phasetrace:rank_time_lost:ratio2m{group=\"solo\"})", "5m", [])
    tests.append(test("balanced ranks and single-rank groups raise no straggler alert", inputs, alerts, exprs))

    # 4. Two groups of one job with the same rank numbers: a straggler in tp1 only.
    inputs = ""
    for g, slow_rank in (("tp0", None), ("tp1", 3)):
        for r in range(4):
            inst = f"10.0.{2 if g == 'tp0' else 3}.{r + 1}:9464"
            inputs += rank_series(job, g, r, inst, 0.02 if r == slow_rank else 0.2)
    ann = straggler_annotations(3, "tp1", job, "10.0.3.4:9464", None, "18%", "2%", "20%", None)
    alerts = alert("PhasetraceRankStraggler", "3m", [({"severity": "warning", "job": job, "group": "tp1", "rank": "3"}, ann)])
    tests.append(test("two groups in one job: only the straggler's group alerts, for the right rank", inputs, alerts))

    # 5. A killed rank: rank 1 of 4 stops at 5m (its series go stale: scrape failing); the
    #    others go on, and their last windows look skewed (rank 0 would pass for a straggler). The silent alert fires within 2 minutes, for rank 1 only,
    #    and no straggler alert fires for the others.
    inputs = ""
    for r in range(4):
        inst = f"10.0.4.{r + 1}:9464"
        if r == 1:
            inputs += rank_series(job, "tp0", r, inst, 0.2, stop_after=20, stale=True)
        else:
            inputs += rank_series(job, "tp0", r, inst, [(0.2, 21), (0.0 if r == 0 else 0.6, 40)], stop_after=None)
        inputs += target_info(job, inst, f"node-{r}")
    alerts = (
        alert("PhasetraceRankSilent", "5m")
        + alert("PhasetraceRankSilent", "6m15s", [({"severity": "critical", "job": job, "group": "tp0", "rank": "1", "instance": "10.0.4.2:9464"}, silent_annotations(1, "tp0", job, "10.0.4.2:9464", "node-1"))])
        + alert("PhasetraceRankStraggler", "6m45s")
        + alert("PhasetraceRankStraggler", "9m")
    )
    tests.append(test("a killed rank raises the silent alert and no straggler alert for the others", inputs, alerts))

    # 6. A hung rank: still exported, its steps stop at 5m while the others go on.
    #    And a whole group that stops (a job that ended): no silent alert.
    inputs = ""
    for r in range(2):
        inputs += rank_series(job, "tp0", r, f"10.0.5.{r + 1}:9464", 0.2, stop_after=20 if r == 1 else None)
    for r in range(2):
        inputs += rank_series(job, "done", r, f"10.0.6.{r + 1}:9464", 0.2, stop_after=20, stale=True)
    alerts = (
        alert("PhasetraceRankSilent", "5m30s")
        + alert("PhasetraceRankSilent", "7m", [({"severity": "critical", "job": job, "group": "tp0", "rank": "1", "instance": "10.0.5.2:9464"}, silent_annotations(1, "tp0", job, "10.0.5.2:9464", None))])
    )
    tests.append(test("a hung rank is silent; a group that stops as a whole is not", inputs, alerts))

    # 6b. A group that stops stepping as a whole while still exported (an idle engine; the live
    #     ranks of a group whose peer died, lingering): rank 0's last step is seen 30 s (two
    #     scrapes) before the others' (its scrape phase, its exporter's lag on a loaded host).
    #     No rank is silent at any time, and the alert stays quiet. (Comparing 1 m rates alone
    #     read rank 0 as silent at 5m45s.)
    inputs = ""
    for r in range(4):
        inputs += rank_series(job, "tp0", r, f"10.0.13.{r + 1}:9464", 0.2, stop_after=19 if r == 0 else 21)
    exprs = "".join(expr_test("phasetrace:rank_silent", at, []) for at in ["5m30s", "5m45s", "6m", "6m15s", "8m"])
    alerts = alert("PhasetraceRankSilent", "6m30s") + alert("PhasetraceRankSilent", "8m")
    tests.append(test("a group that stops as a whole, its ranks' last steps seen up to 30 s apart, has no silent rank", inputs, alerts, exprs))

    # 7. The web configuration file: a change refused at 5m (the gauge 0: the endpoint serves
    #    the configuration it read before), fixed at 10m; a healthy endpoint; and one whose
    #    file was broken for 30 s only (fixed within the `for`). Fires at 6m for the first only,
    #    names its host, and clears with the fix.
    inputs = ""
    for inst, gauge, ok, failed in (
        ("10.0.7.1:9464", "1x19 0x19 1x20", "2x39 3x20", "0x19 1x39"),
        ("10.0.7.2:9464", "1x59", "0x59", "0x59"),
        ("10.0.7.3:9464", "1x19 0x1 1x37", "0x21 1x37", "0x19 1x39"),
    ):
        kv = dict(job=job, instance=inst, group="tp0")
        inputs += series("phasetrace_prometheus_web_config_last_reload_successful", gauge, **kv)
        inputs += series("phasetrace_prometheus_web_config_reloads_total", ok, result="ok", **kv)
        inputs += series("phasetrace_prometheus_web_config_reloads_total", failed, result="failed", **kv)
        inputs += target_info(job, inst, "node-" + inst.split(".")[-1].split(":")[0])
    reload_alert = [(
        {"severity": "warning", "job": job, "instance": "10.0.7.1:9464", "group": "tp0"},
        {
            "summary": "The phasetrace Prometheus endpoint on 10.0.7.1:9464 refused its changed web config",
            "description": (
                f"The Prometheus endpoint of {job} (group tp0, instance 10.0.7.1:9464, host node-1) "
                "could not apply the last change to its web configuration file "
                "(PHASETRACE_PROMETHEUS_WEB_CONFIG) or a certificate, key or CA file it names: it "
                "keeps serving the previous config (the certificates and users it read before) until "
                "the file is fixed (changes refused since it started: 1). Look at the engine's stderr "
                'for why: one warning per refused change, "the changed web configuration is not '
                'applied", with the file and the field.'
            ),
            "dashboard": DECODE_DASH,
        },
    )]
    alerts = (
        alert("PhasetraceWebConfigReloadFailed", "4m45s")
        + alert("PhasetraceWebConfigReloadFailed", "5m45s")
        + alert("PhasetraceWebConfigReloadFailed", "6m", reload_alert)
        + alert("PhasetraceWebConfigReloadFailed", "9m45s", reload_alert)
        + alert("PhasetraceWebConfigReloadFailed", "10m")
        + alert("PhasetraceWebConfigReloadFailed", "14m")
    )
    tests.append(test("a refused web config change fires after 1 minute, for that endpoint only, and clears with the fix", inputs, alerts))

    # 8. OTLP metrics exports, one every 10 s (1.5 a sample): process 1 exports fine for 5
    #    minutes, then every export fails for 10 minutes (the collector down), then they work
    #    again; process 2 never fails; process 3 loses every other export (a flapping collector:
    #    half of them, under the threshold of 1); process 4 never had a collector (every export
    #    failed from the start). Process 1 fires 6m45s into its outage (the 5-minute window
    #    holds no ok export from 9m45s: Prometheus 3's range selectors are left-open, so the
    #    window at 9m45s leaves out the last ok increment's first sample, at 4m45s; then
    #    `for: 2m`) and clears at the first export that works; process 4 about 2.5 minutes after
    #    its start.
    inputs = ""
    for inst, ok, failed in (
        ("10.0.8.1:9464", "0+1.5x20 30x39 31.5+1.5x20", "0x20 1.5+1.5x39 60x20"),
        ("10.0.8.2:9464", "0+1.5x81", "0x81"),
        ("10.0.8.3:9464", "0+0.75x81", "0+0.75x81"),
        ("10.0.8.4:9464", "0x81", "0+1.5x81"),
    ):
        kv = dict(job=job, instance=inst, group="tp0")
        inputs += series("phasetrace_metric_exports_total", ok, result="ok", **kv)
        inputs += series("phasetrace_metric_exports_total", failed, result="failed", **kv)
        inputs += target_info(job, inst, "node-" + inst.split(".")[-1].split(":")[0])

    def export_alert(inst, host, failed):
        return (
            {"severity": "warning", "job": job, "instance": inst, "group": "tp0"},
            {
                "summary": f"OTLP metrics exports of {job} on {inst} are failing",
                "description": (
                    f"100% of the OTLP metrics exports of {job} (group tp0, instance {inst}, "
                    f"host {host}) failed over the last 5 minutes ({failed} failed): the collector "
                    "(OTEL_EXPORTER_OTLP_ENDPOINT) is down, unreachable or refusing. Nothing is lost "
                    "(the next export that works carries the cumulative totals), but what the "
                    "collector's backend shows of this process is stale until then. The engine's "
                    "stderr has the first error of the outage. This fires where Prometheus scrapes "
                    "the embedded endpoint; a Prometheus fed only through the collector cannot see "
                    "it, since the collector receives the count only once exports work again."
                ),
                "dashboard": DECODE_DASH,
            },
        )

    never = export_alert("10.0.8.4:9464", "node-4", "30")
    alerts = (
        alert("PhasetraceMetricsExportFailing", "2m")
        + alert("PhasetraceMetricsExportFailing", "3m", [export_alert("10.0.8.4:9464", "node-4", "18")])
        + alert("PhasetraceMetricsExportFailing", "11m30s", [never])
        + alert("PhasetraceMetricsExportFailing", "11m45s", [export_alert("10.0.8.1:9464", "node-1", "30"), never])
        + alert("PhasetraceMetricsExportFailing", "15m", [export_alert("10.0.8.1:9464", "node-1", "30"), never])
        + alert("PhasetraceMetricsExportFailing", "15m15s", [never])
    )
    exprs = expr_test(
        'sum by (instance) (rate(phasetrace_metric_exports_total{result="failed"}[5m])) / sum by (instance) (rate(phasetrace_metric_exports_total[5m]))',
        "12m",
        [('{instance="10.0.8.1:9464"}', 1), ('{instance="10.0.8.2:9464"}', 0), ('{instance="10.0.8.3:9464"}', 0.5), ('{instance="10.0.8.4:9464"}', 1)],
    )
    tests.append(test("steadily failing OTLP metrics exports fire, a healthy or flapping exporter does not, recovery clears", inputs, alerts, exprs))

    # 9. A whole group hung in a collective: at 5m (sample 20) every rank of tp0 enters a step
    #    that never ends (an all-reduce that never completes); the processes stay up and keep
    #    exporting, their steps stop. PhasetraceStepHung fires for every rank 75 s later (open
    #    45 s at the first evaluation over the 30 s threshold, then `for: 30s`), names the group's
    #    hung ranks and each rank's host; no rank is silent and none straggles. tp1 beside it,
    #    healthy, stays quiet.
    inputs = ""
    for r in range(4):
        inst = f"10.0.9.{r + 1}:9464"
        inputs += rank_series(job, "tp0", r, inst, 0.2, stop_after=20)
        inputs += open_series(job, "tp0", r, inst, hung_from(20))
        inputs += target_info(job, inst, f"node-{r}")
        inst1 = f"10.0.10.{r + 1}:9464"
        inputs += rank_series(job, "tp1", r, inst1, 0.2)
        inputs += open_series(job, "tp1", r, inst1, "0.02x60")
    every = [0, 1, 2, 3]
    alerts = (
        alert("PhasetraceStepHung", "5m45s")
        + alert("PhasetraceStepHung", "6m")
        + alert("PhasetraceStepHung", "6m15s", [hung_alert(job, "tp0", r, f"10.0.9.{r + 1}:9464", f"node-{r}", "1m 15s", every, 4) for r in every])
        + alert("PhasetraceStepHung", "14m", [hung_alert(job, "tp0", r, f"10.0.9.{r + 1}:9464", f"node-{r}", "9m 0s", every, 4) for r in every])
        + alert("PhasetraceRankSilent", "8m")
        + alert("PhasetraceRankSilent", "14m")
        + alert("PhasetraceRankStraggler", "8m")
    )
    tests.append(test("a group hung as a whole fires PhasetraceStepHung for every rank within 75 s; no rank is silent, a healthy group stays quiet", inputs, alerts))

    # 10. One rank hung in a kernel (rank 2, an event clock: its stream never reaches the marks
    #     after the kernel, counted from the worker's first drain that found them pending, 10 s
    #     into the step), the others blocked at the next collective inside the same step: every
    #     rank fires, at the same evaluation.
    inputs = ""
    for r in range(4):
        inst = f"10.0.11.{r + 1}:9464"
        inputs += rank_series(job, "tp0", r, inst, 0.2, stop_after=20)
        inputs += open_series(job, "tp0", r, inst, hung_from(20, offset=10.0) if r == 2 else hung_from(20))
    alerts = (
        alert("PhasetraceStepHung", "6m")
        + alert("PhasetraceStepHung", "6m15s", [
            hung_alert(job, "tp0", r, f"10.0.11.{r + 1}:9464", None, "1m 5s" if r == 2 else "1m 15s", every, 4)
            for r in every
        ])
        + alert("PhasetraceRankSilent", "8m")
    )
    tests.append(test("one rank hung in a kernel and the others blocked at the collective: every rank fires", inputs, alerts))

    # 11. A peer that died mid-collective: rank 3 is killed at 5m (its series go stale), the
    #     others block in the collective it never reaches. PhasetraceStepHung fires for the
    #     three, naming rank 3 as silent; PhasetraceRankSilent fires for rank 3.
    inputs = ""
    for r in range(4):
        inst = f"10.0.12.{r + 1}:9464"
        if r == 3:
            inputs += rank_series(job, "tp0", r, inst, 0.2, stop_after=20, stale=True)
            inputs += open_series(job, "tp0", r, inst, "0.02x20 " + " ".join(["stale"] * (N - 20)))
        else:
            inputs += rank_series(job, "tp0", r, inst, 0.2, stop_after=20)
            inputs += open_series(job, "tp0", r, inst, hung_from(20))
    alive = [0, 1, 2]
    alerts = (
        alert("PhasetraceStepHung", "6m15s", [
            hung_alert(job, "tp0", r, f"10.0.12.{r + 1}:9464", None, "1m 15s", alive, 4, [(3, "10.0.12.4:9464")])
            for r in alive
        ])
        + alert("PhasetraceRankSilent", "6m15s", [({"severity": "critical", "job": job, "group": "tp0", "rank": "3", "instance": "10.0.12.4:9464"}, silent_annotations(3, "tp0", job, "10.0.12.4:9464", None))])
        + alert("PhasetraceRankStraggler", "8m")
    )
    tests.append(test("a peer that died mid-collective: the others are hung, it is silent", inputs, alerts))

    # 12. Idle, and long steps that finish. An idle server: its steps stop at 5m with no step
    #     open (0). Steps of 25 s (never 30 s open) and of 55 s (over 30 s for two evaluations
    #     in a row, 15 s, less than the `for`): no alert.
    inputs = ""
    for r in range(2):
        inputs += rank_series(job, "idle", r, f"10.0.13.{r + 1}:9464", 0.2, stop_after=20)
        inputs += open_series(job, "idle", r, f"10.0.13.{r + 1}:9464", "0.02x19 0x40")
        for name, length in (("long25", 25), ("long55", 55)):
            inst = f"10.0.{14 if length == 25 else 15}.{r + 1}:9464"
            inputs += rank_series(job, name, r, inst, 0.2, steps_per_s=1.0 / length)
            inputs += open_series(job, name, r, inst, [(STEP_S * i) % length for i in range(N + 1)])
    alerts = "".join(alert("PhasetraceStepHung", t) for t in ("2m", "5m", "7m", "10m", "15m"))
    alerts += alert("PhasetraceRankSilent", "10m")
    exprs = expr_test(
        'count by (group) (phasetrace:step_open_seconds:max > on () group_left () phasetrace:step_hung_seconds:threshold)',
        "11m45s", [('{group="long55"}', 2)],
    )
    tests.append(test("an idle server and long steps that finish raise no hung-step alert", inputs, alerts, exprs))

    # 13. A group that recovers from a 3-minute hang: rank 1 hangs at 5m, the others block;
    #     at 8m it goes on, and that step ends on every rank holding the whole hang, as the
    #     others' wait (180 s) and not as rank 1's. The 2-minute windows then make rank 1 look
    #     like a straggler costing 75% of the group's time until about 9m45s; the straggler
    #     alert is held back (the group was hung in the last 2 minutes). The hung alert clears
    #     with the recovery.
    inputs = ""
    hang, back, length = 20, 32, 180.0
    for r in range(4):
        inst = f"10.0.16.{r + 1}:9464"
        dur, wait, steps, gauge = [], [], [], []
        for i in range(N + 1):
            run = min(i, hang) + max(0, i - back)  # samples of normal stepping so far
            jumped = i >= back
            dur.append(STEP_S * run + (length if jumped else 0))
            wait.append(0.2 * STEP_S * run + (length if jumped and r != 1 else 0))
            steps.append(50 * STEP_S * run + (1 if jumped else 0))
            gauge.append(STEP_S * (i - hang) if hang <= i < back else 0.02)
        kv = dict(job=job, group="rec", rank=str(r), instance=inst)
        inputs += series("phasetrace_step_duration_seconds_sum", " ".join(fmt(v) for v in dur), **kv)
        inputs += series("phasetrace_step_collective_wait_seconds_sum", " ".join(fmt(v) for v in wait), **kv)
        inputs += series("phasetrace_steps_total", " ".join(fmt(v) for v in steps), **kv)
        inputs += open_series(job, "rec", r, inst, gauge)
    alerts = (
        alert("PhasetraceStepHung", "7m", [hung_alert(job, "rec", r, f"10.0.16.{r + 1}:9464", None, "2m 0s", every, 4) for r in every])
        + alert("PhasetraceStepHung", "8m")
        + alert("PhasetraceStepHung", "12m")
        + alert("PhasetraceRankStraggler", "8m15s")
        + alert("PhasetraceRankStraggler", "9m15s")
        + alert("PhasetraceRankStraggler", "12m")
        + alert("PhasetraceRankSilent", "7m")
    )
    exprs = expr_test(
        'count(phasetrace:rank_time_lost:ratio2m{group="rec"} > on () group_left () phasetrace:straggler_time_lost_ratio:threshold)',
        "9m15s", [("{}", 1)],
    )
    tests.append(test("a group that recovers from a hang raises no straggler alert for the rank that hung", inputs, alerts, exprs))

    # 14. Expert parallelism: 4 ranks, experts in blocks of 16; rank 0 hosts the hot experts
    #     (expert 1 of layer 3, expert 2 of layer 4) and straggles. Its straggler alert names
    #     them; the hot expert of rank 1's block is not named for rank 0.
    inputs = ""
    for r in range(4):
        inst = f"10.0.17.{r + 1}:9464"
        inputs += rank_series(job, "ep4", r, inst, 0.02 if r == 0 else 0.3)
        for layer, expert, ep, share in ((3, 1, 0, "0.3"), (4, 2, 0, "0.2"), (4, 20, 1, "0.05")):
            inputs += series(
                "phasetrace_moe_hot_expert_share", f"{share}x{N}", job=job, group="ep4",
                rank=str(r), instance=inst, layer=str(layer), expert=str(expert), ep_rank=str(ep),
            )
    ann = straggler_annotations(
        0, "ep4", job, "10.0.17.1:9464", None, "28%", "2%", "30%", None,
        hot=[(3, 1, "30%"), (4, 2, "20%")],
    )
    alerts = alert("PhasetraceRankStraggler", "3m", [({"severity": "warning", "job": job, "group": "ep4", "rank": "0"}, ann)])
    tests.append(test("under expert parallelism the straggler alert names the hot experts its rank hosts", inputs, alerts))

    # 15. A MoE layer whose imbalance stays at 6 (threshold 4) on one rank for 12.5 minutes,
    #     then drops to 1.5; another layer at 1.5 throughout, and a spike of 8 lasting 5 minutes
    #     on layer 5 (shorter than `for: 10m`): one alert, for layer 3, from 10 minutes on;
    #     resolved once the layer balances. Hot experts are listed hottest first.
    inputs = ""
    for r in range(2):
        inst = f"10.0.18.{r + 1}:9464"
        kv = dict(job=job, group="moe", rank=str(r), instance=inst)
        hi = "6" if r == 1 else "2"
        inputs += series("phasetrace_moe_expert_load_imbalance", f"{hi}x50 1.5x20", layer="3", **kv)
        inputs += series("phasetrace_moe_expert_load_imbalance", f"1.5x{N}", layer="4", **kv)
        inputs += series("phasetrace_moe_expert_load_imbalance", "1.5x10 8x20 1.5x30", layer="5", **kv)
        inputs += series("phasetrace_moe_hot_expert_share", f"0.4x{N}", layer="3", expert="12", **kv)
        inputs += series("phasetrace_moe_hot_expert_share", f"0.1x{N}", layer="3", expert="7", **kv)
    imb_ann = {
        "summary": "MoE layer 3 of group moe routes unevenly",
        "description": (
            "The hottest expert of MoE layer 3 in group moe of engine gets 6.0 times the mean "
            "tokens per expert (threshold 4), and has for 10 minutes. Hot experts: 12 (40% of the "
            "layer's tokens) 7 (10% of the layer's tokens). An expert-parallel load balancer can "
            "replicate or move them; Profiler::expert_load gives the full per-expert counts."
        ),
        "dashboard": DECODE_DASH,
    }
    firing = [({"severity": "info", "job": job, "group": "moe", "layer": "3"}, imb_ann)]
    alerts = (
        alert("PhasetraceMoeLayerImbalanced", "9m")
        + alert("PhasetraceMoeLayerImbalanced", "10m15s", firing)
        + alert("PhasetraceMoeLayerImbalanced", "12m", firing)
        + alert("PhasetraceMoeLayerImbalanced", "14m")
    )
    tests.append(test("a MoE layer that stays unbalanced alerts, a short spike does not, and it resolves", inputs, alerts))

    rest = OTHER_ALERTS

    text = (
        "# promtool unit tests of phasetrace-alerts.yml, GENERATED by gen-alert-tests.py: edit that,\n"
        "# then run it. `promtool test rules otel-config/rules/phasetrace-alerts.test.yml`.\n"
        "# Every alert is tested to fire on a bad series, stay quiet on a healthy one, and resolve.\n"
        "# The thresholds are the ones in phasetrace-thresholds.yml, so retuning them re-runs these\n"
        "# scenarios against the new values.\n\n"
        "rule_files:\n  - phasetrace-thresholds.yml\n  - phasetrace-recording.yml\n  - phasetrace-alerts.yml\n  - phasetrace-requests.yml\n\n"
        f"evaluation_interval: {STEP_S}s\n\ntests:\n" + "".join(tests) + rest
    )
    if "--check" in sys.argv[1:]:
        with open(OUT, encoding="utf-8") as f:
            if f.read() != text:
                print(f"{OUT} is out of date: run {sys.argv[0]}", file=sys.stderr)
                return 1
        return 0
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
