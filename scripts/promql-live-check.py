#!/usr/bin/env python3
"""Run every PromQL expression of the bundled dashboards and rules against a live Prometheus.

Modes
-----
Expression check (default): extracts every PromQL expression from

  * every panel target of every dashboard (dashboards/*.json, rows included),
  * every template variable query (`label_values(METRIC, LABEL)` is run as
    `count by (LABEL) (METRIC)`: the variable must offer at least one value),
  * every recording and alerting rule (otel-config/rules/*.yml, unit-test files excluded),
    and, for each recording rule, the recorded series itself (proves Prometheus loaded and
    evaluates the rule),

substitutes Grafana variables, runs each as an instant query (GET /api/v1/query), and fails
listing every expression that does not parse or that returns no data.

Alert check (--alert NAME --expect firing|quiet): polls GET /api/v1/alerts until the alert
is in the expected state (firing: at least one instance firing, optionally matching --label;
quiet: no instance pending or firing), or fails after --timeout seconds.

Offline modes (no Prometheus needed): --list prints the extracted, substituted expressions;
--emit-rule-file FILE writes them as recording rules so `promtool check rules FILE` parses
every dashboard expression with Prometheus's own parser (scripts/validate-stack.sh does this).

Grafana variables
-----------------
Query variables ($job $group $rank $layer $site $bucket; ${name} and [[name]] spellings included)
become `.*`: the dashboards use them in regex matchers (=~) only. Textbox, constant, custom and
interval variables keep their saved value (e.g. $nested = kda_mixer); unknown names become `.*`.
$__rate_interval and $__interval become --rate-interval (default 1m); $__range becomes
--range (default 5m); $__range_s and $__interval_ms become the matching numbers.
Override any of them with --var NAME=VALUE.

Expected-empty allow-list
-------------------------
Some expressions legitimately return nothing on a healthy run. Built in (see ALLOW_EMPTY):

  * alerting rule expressions: they return series only while their condition holds (a
    straggler, a high wait, drops). Each metric they read must still exist; that is checked;
  * anything reading ALERTS: needs a pending or firing alert;
  * phasetrace_moe_*: opt-in (PHASETRACE_EXPERT_COUNTER=on);
  * phasetrace_records_dropped_total: exported only once a record has been dropped;
  * phasetrace:rank_silent: recorded only while a rank is silent;
  * phasetrace_prometheus_web_config_*: only with a web configuration file
    (PHASETRACE_PROMETHEUS_WEB_CONFIG);
  * phasetrace_metric_exports_total: only with metrics over OTLP (and, through a collector,
    only once an export has worked);
  * panels titled "(native histograms)" and phasetrace:collective_layer_wait_seconds:*: they
    read the per-layer distributions, which only a Prometheus with
    `scrape_native_histograms: true` (or exponential OTLP) has.

Add more with --expect-empty PATTERN (a regular expression searched in the item's name, e.g.
'speculative-decoding/Verify sub-split', 'record/phasetrace:collective_wait_seconds:p99_5m',
or in its expression). --no-default-allow disables the built-in list; --expect-data PATTERN
takes the items (and alert input series) it matches off it, for a run that has them
(scripts/live-stack-check.sh runs one demo with a web configuration and OTLP, so it passes
--expect-data for those two).

Exit status: 0 all checks passed, 1 some failed (or the alert did not reach the expected state
in time), 2 usage error or Prometheus unreachable. The last line of an expression check reads
'N passed, N failed'.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (pattern searched in the expression or the item name, why it may be empty)
ALLOW_EMPTY: list[tuple[str, str]] = [
    (r"\bALERTS\b", "needs a pending or firing alert"),
    (r"phasetrace_moe_", "opt-in metrics (PHASETRACE_EXPERT_COUNTER=on)"),
    (r"phasetrace_records_dropped_total", "exported only after a record was dropped"),
    (r"phasetrace:rank_silent", "only while a rank is silent (killed, hung, not exporting)"),
    (r"phasetrace_prometheus_web_config_", "only with a web configuration file (PHASETRACE_PROMETHEUS_WEB_CONFIG)"),
    (r"phasetrace_metric_exports_total", "only with metrics over OTLP (through a collector: once an export worked)"),
    (r"\(native histograms\)", "panels on native histograms: only with scrape_native_histograms: true (or exponential OTLP)"),
    (r"phasetrace:collective_layer_wait_seconds:|phasetrace_collective_layer_wait_duration_seconds", "native histograms only: scrape_native_histograms: true (or exponential OTLP)"),
]

# PromQL words that are not metric names (keywords, aggregation modifiers, literals).
PROMQL_WORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "offset", "inf", "nan", "atan2", "start", "end",
}


@dataclass
class Item:
    """One expression to run."""

    name: str
    expr: str
    kind: str  # panel | variable | record | record-series | alert
    source: str
    allow_empty: str | None = None  # reason, when empty is acceptable
    panel_type: str = ""  # a panel's Grafana type (timeseries, stat, table, heatmap, ...)
    needs_metrics: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- extraction


# The panels that draw a line, a bar or a value per series (--max-series bounds them); tables
# and heatmaps draw rows and cells (a group's layers x buckets), not lines.
LINE_PANELS = ("timeseries", "stat", "bargauge", "gauge", "barchart")


def substitute(expr: str, values: dict[str, str]) -> str:
    """Replaces Grafana variables ($x, ${x}, ${x:fmt}, [[x]]) with test values."""

    def value_of(name: str) -> str:
        if name in values:
            return values[name]
        return ".*"

    expr = re.sub(r"\$\{([A-Za-z0-9_]+)(?::[^}]*)?\}", lambda m: value_of(m.group(1)), expr)
    expr = re.sub(r"\[\[([A-Za-z0-9_]+)(?::[^\]]*)?\]\]", lambda m: value_of(m.group(1)), expr)
    # Longest names first so $__range_s is not read as $__range followed by "_s".
    expr = re.sub(r"\$([A-Za-z_][A-Za-z0-9_]*)", lambda m: value_of(m.group(1)), expr)
    return expr


def default_values(rate_interval: str, range_: str) -> dict[str, str]:
    return {
        "__rate_interval": rate_interval,
        "__interval": rate_interval,
        "__range": range_,
        "__range_s": str(int(parse_duration(range_))),
        "__range_ms": str(int(parse_duration(range_) * 1000)),
        "__interval_ms": str(int(parse_duration(rate_interval) * 1000)),
    }


def parse_duration(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    total = 0.0
    pos = 0
    for match in re.finditer(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)", text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * units[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"not a duration: {text!r}")
    return total


def iter_panels(panels):
    for panel in panels or []:
        yield panel
        yield from iter_panels(panel.get("panels"))


def saved_value(var: dict) -> str | None:
    """The saved value of a textbox/constant/custom/interval variable, as a regex alternation."""
    if var.get("type") not in ("textbox", "constant", "custom", "interval"):
        return None
    current = (var.get("current") or {}).get("value", var.get("query", ""))
    values = current if isinstance(current, list) else [current]
    if any(v in ("$__all", "All") for v in values):
        return var.get("allValue") or ".*"
    return "|".join(str(v) for v in values)


def dashboard_items(path: str, base_values: dict[str, str], overrides: dict[str, str]) -> list[Item]:
    with open(path, encoding="utf-8") as handle:
        dash = json.load(handle)
    base = os.path.splitext(os.path.basename(path))[0]
    items: list[Item] = []
    values = dict(base_values)
    for var in dash.get("templating", {}).get("list", []):
        saved = saved_value(var)
        if saved is not None:
            values[var.get("name")] = saved
    values.update(overrides)
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var.get("query")
        if isinstance(query, dict):
            query = query.get("query", "")
        match = re.fullmatch(r"\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*", query or "")
        if match:
            expr = f"count by ({match.group(2)}) ({match.group(1)})"
        else:
            match = re.fullmatch(r"\s*query_result\((.*)\)\s*", query or "")
            expr = match.group(1) if match else (query or "")
        items.append(Item(f"{base}/variable ${var.get('name')}", substitute(expr, values), "variable", path))
    for panel in iter_panels(dash.get("panels")):
        if panel.get("type") == "row":
            continue
        for target in panel.get("targets") or []:
            expr = target.get("expr")
            if not expr or target.get("hide"):
                continue
            name = f"{base}/{panel.get('title', panel.get('id'))}/{target.get('refId', '?')}"
            items.append(Item(name, substitute(expr, values), "panel", path, panel_type=panel.get("type", "")))
    return items


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1].replace("''", "'")
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return json.loads(value)
    return re.sub(r"\s+#.*$", "", value)


def parse_rule_file(path: str) -> list[dict[str, str]]:
    """Reads `record`/`alert` and `expr` of each rule of a Prometheus rule file.

    A small reader for the YAML subset that rule files use (the standard library has no YAML):
    a rule starts at `- record:` or `- alert:`; `expr` is a plain or quoted one-line scalar or
    a block scalar (| or >, with chomping indicators). promtool validates the full syntax.
    """
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    rules: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        start = re.match(r"^(\s*)-\s+(record|alert):\s*(.*)$", line)
        if start:
            current = {"kind": start.group(2), "name": _unquote(start.group(3)), "expr": ""}
            rules.append(current)
            i += 1
            continue
        key = re.match(r"^(\s*)expr:\s*(.*)$", line)
        if key and current is not None:
            indent = len(key.group(1))
            value = key.group(2).strip()
            if re.fullmatch(r"[|>][+-]?\d*", value):
                block: list[str] = []
                i += 1
                while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                    block.append(lines[i])
                    i += 1
                body = [b for b in block]
                margin = min((len(b) - len(b.lstrip()) for b in body if b.strip()), default=0)
                current["expr"] = "\n".join(b[margin:] for b in body).strip()
                continue
            current["expr"] = _unquote(value)
        i += 1
    return rules


def metric_names(expr: str) -> list[str]:
    """Metric names an expression selects (best effort, for the alert input check)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = []
    for match in re.finditer(r"(?<![\w:.])([A-Za-z_:][A-Za-z0-9_:]*)(?![\w:])(\s*\()?", text):
        word, call = match.group(1), match.group(2)
        if call or word.lower() in PROMQL_WORDS or re.fullmatch(r"\d.*", word):
            continue
        if word not in names:
            names.append(word)
    return names


def rule_items(paths: list[str]) -> list[Item]:
    items: list[Item] = []
    for path in paths:
        for rule in parse_rule_file(path):
            if not rule["expr"]:
                items.append(Item(f"{rule['kind']}/{rule['name']}", "", rule["kind"], path))
                continue
            if rule["kind"] == "record":
                items.append(Item(f"record/{rule['name']}", rule["expr"], "record", path))
                items.append(Item(f"record-series/{rule['name']}", rule["name"], "record-series", path))
            else:
                items.append(
                    Item(
                        f"alert/{rule['name']}",
                        rule["expr"],
                        "alert",
                        path,
                        allow_empty="alert expression: returns series only while its condition holds",
                        needs_metrics=metric_names(rule["expr"]),
                    )
                )
    return items


# ---------------------------------------------------------------------------- Prometheus


class PromError(Exception):
    pass


def prom_get(base: str, path: str, params: dict[str, str] | None, timeout: float) -> dict:
    url = base.rstrip("/") + path
    if params:
        url += "?" + urllib.parse.urlencode(params)
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as err:
        body = err.read()
        try:
            payload = json.loads(body)
        except ValueError:
            raise PromError(f"HTTP {err.code}: {body[:200]!r}") from err
        raise PromError(f"{payload.get('errorType', 'error')}: {payload.get('error', body[:200])}") from err
    except (urllib.error.URLError, OSError) as err:
        raise ConnectionError(f"{url}: {err}") from err
    payload = json.loads(body)
    if payload.get("status") != "success":
        raise PromError(f"{payload.get('errorType', 'error')}: {payload.get('error')}")
    return payload["data"]


def instant(base: str, expr: str, timeout: float) -> list:
    data = prom_get(base, "/api/v1/query", {"query": expr}, timeout)
    result = data.get("result")
    if data.get("resultType") == "scalar":
        return [result]
    return result or []


# ---------------------------------------------------------------------------- modes


def collect(args) -> list[Item]:
    values = default_values(args.rate_interval, args.range)
    overrides: dict[str, str] = {}
    for assignment in args.var:
        name, _, value = assignment.partition("=")
        overrides[name.lstrip("$")] = value
    values.update(overrides)
    items: list[Item] = []
    dashboards = sorted(glob.glob(os.path.join(args.dashboards, "*.json")))
    if not dashboards:
        raise SystemExit(f"promql-live-check: no dashboards in {args.dashboards}")
    for path in dashboards:
        items.extend(dashboard_items(path, values, overrides))
    rule_files = sorted(
        p for p in glob.glob(os.path.join(args.rules, "*.yml")) + glob.glob(os.path.join(args.rules, "*.yaml"))
        if not re.search(r"\.test\.ya?ml$", p)
    )
    if not rule_files:
        raise SystemExit(f"promql-live-check: no rule files in {args.rules}")
    items.extend(rule_items(rule_files))
    allow = [] if args.no_default_allow else list(ALLOW_EMPTY)
    allow += [(pattern, "--expect-empty") for pattern in args.expect_empty]
    for item in items:
        if item.allow_empty:
            continue
        if any(re.search(p, item.name) or re.search(p, item.expr) for p in args.expect_data):
            continue
        for pattern, reason in allow:
            if re.search(pattern, item.name) or re.search(pattern, item.expr):
                item.allow_empty = reason
                break
    return items


def run_checks(args, items: list[Item]) -> int:
    deadline = time.monotonic() + args.retry_for
    while True:
        failures, passed, notes = check_once(args, items)
        if not failures or time.monotonic() >= deadline:
            break
        print(f"... {len(failures)} failing, retrying (until --retry-for runs out)", flush=True)
        time.sleep(min(args.retry_interval, max(0.0, deadline - time.monotonic())))
    for note in notes:
        print(note)
    if failures:
        print(f"\nFAILED ({len(failures)}):")
        for failure in failures:
            print(failure)
    print(f"\n{passed} passed, {len(failures)} failed")
    return 1 if failures else 0


def check_once(args, items: list[Item]):
    failures: list[str] = []
    notes: list[str] = []
    passed = 0
    metric_cache: dict[str, bool] = {}
    for item in items:
        if not item.expr:
            failures.append(f"  {item.name} ({item.source}): no expression found")
            continue
        try:
            result = instant(args.prometheus, item.expr, args.timeout)
        except PromError as err:
            failures.append(f"  {item.name} ({item.source}): query error: {err}\n    {one_line(item.expr)}")
            continue
        problem = None
        if (args.max_series and item.kind == "panel" and item.panel_type in LINE_PANELS
                and len(result) > args.max_series):
            problem = (f"returned {len(result)} series, over --max-series {args.max_series}: a {item.panel_type} "
                       "panel must stay readable at fleet scale (top-k or per-group)")
        if not result:
            if item.allow_empty:
                notes.append(f"empty (allowed: {item.allow_empty}): {item.name}")
            else:
                problem = "returned no data"
        for metric in item.needs_metrics:
            if metric not in metric_cache:
                try:
                    metric_cache[metric] = bool(instant(args.prometheus, f"count({{__name__={json.dumps(metric)}}})", args.timeout))
                except PromError:
                    metric_cache[metric] = False
            required = any(re.search(p, metric) for p in args.expect_data)
            if not metric_cache[metric] and (required or not any(
                re.search(pattern, metric) for pattern, _ in ([] if args.no_default_allow else ALLOW_EMPTY)
            )) and not any(re.search(p, metric) for p in args.expect_empty):
                problem = (problem + "; " if problem else "") + f"input series {metric} has no data"
        if problem:
            failures.append(f"  {item.name} ({item.source}): {problem}\n    {one_line(item.expr)}")
        else:
            passed += 1
            if args.verbose:
                notes.append(f"ok ({len(result)} series): {item.name}")
    return failures, passed, notes


def one_line(expr: str) -> str:
    return re.sub(r"\s+", " ", expr).strip()


def run_alert(args) -> int:
    wanted = dict(pair.split("=", 1) for pair in args.label)
    deadline = time.monotonic() + max(args.timeout_alert, args.hold + args.poll)
    last = "no answer yet"
    quiet_since = None
    while True:
        try:
            alerts = prom_get(args.prometheus, "/api/v1/alerts", None, args.timeout).get("alerts", [])
        except PromError as err:
            print(f"promql-live-check: {err}", file=sys.stderr)
            return 2
        mine = [
            a for a in alerts
            if a.get("labels", {}).get("alertname") == args.alert
            and all(a.get("labels", {}).get(k) == v for k, v in wanted.items())
        ]
        states = sorted({a.get("state", "?") for a in mine})
        last = f"{len(mine)} instance(s), states {states or ['none']}"
        if args.expect == "firing" and any(a.get("state") == "firing" for a in mine):
            for a in mine:
                if a.get("state") == "firing":
                    print(f"firing: {json.dumps(a.get('labels'), sort_keys=True)}")
            print(f"ok: {args.alert} is firing")
            return 0
        if args.expect == "active" and mine:
            for a in mine:
                print(f"{a.get('state')}: {json.dumps(a.get('labels'), sort_keys=True)}")
            print(f"ok: {args.alert} is active")
            return 0
        if args.expect == "quiet" and mine:
            if args.hold > 0:
                print(f"FAILED: {args.alert} expected quiet; {last}")
                for a in mine:
                    print(f"  {a.get('state')}: {json.dumps(a.get('labels'), sort_keys=True)}")
                return 1
        if args.expect == "quiet" and not mine:
            if args.hold <= 0:
                print(f"ok: {args.alert} is quiet (no pending or firing instance)")
                return 0
            if quiet_since is None:
                quiet_since = time.monotonic()
            if time.monotonic() - quiet_since >= args.hold:
                print(f"ok: {args.alert} stayed quiet for {args.hold:g}s")
                return 0
        if time.monotonic() >= deadline:
            print(f"FAILED: {args.alert} expected {args.expect} within {args.timeout_alert:g}s; last seen {last}")
            for a in mine:
                print(f"  {a.get('state')}: {json.dumps(a.get('labels'), sort_keys=True)}")
            return 1
        time.sleep(args.poll)


def emit_rule_file(path: str, items: list[Item]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("# Generated by promql-live-check.py --emit-rule-file: every extracted expression as a\n")
        handle.write("# recording rule, for `promtool check rules` to parse. Not for loading into Prometheus.\n")
        handle.write("groups:\n  - name: promql-live-check\n    rules:\n")
        for index, item in enumerate(items):
            handle.write(f"      # {item.name}\n")
            handle.write(f"      - record: promql_live_check:expr_{index}\n")
            handle.write(f"        expr: {json.dumps(item.expr)}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="promql-live-check.py",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__[__doc__.index("Modes"):],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--prometheus", metavar="URL", help="Prometheus base URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("--dashboards", default=os.path.join(REPO, "dashboards"), metavar="DIR",
                        help="dashboard directory (default: %(default)s)")
    parser.add_argument("--rules", default=os.path.join(REPO, "otel-config", "rules"), metavar="DIR",
                        help="rule directory; *.test.yml are skipped (default: %(default)s)")
    parser.add_argument("--rate-interval", default="1m", help="value of $__rate_interval and $__interval (default: 1m)")
    parser.add_argument("--range", default="5m", help="value of $__range (default: 5m)")
    parser.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                        help="value of a Grafana variable (default for dashboard variables: .*)")
    parser.add_argument("--expect-empty", action="append", default=[], metavar="PATTERN",
                        help="allow items whose name or expression matches PATTERN to return no data")
    parser.add_argument("--no-default-allow", action="store_true", help="disable the built-in allow-list")
    parser.add_argument("--expect-data", action="append", default=[], metavar="PATTERN",
                        help="items (and alert input series) matching PATTERN must return data, "
                             "even where the built-in allow-list lets them be empty")
    parser.add_argument("--retry-for", type=float, default=0, metavar="SECONDS",
                        help="re-run failing checks until they pass or this time is up (default: 0)")
    parser.add_argument("--retry-interval", type=float, default=10, metavar="SECONDS", help="(default: 10)")
    parser.add_argument("--timeout", type=float, default=10, metavar="SECONDS", help="HTTP timeout (default: 10)")
    parser.add_argument("--max-series", type=int, default=0, metavar="N",
                        help="fail a line, stat or bar panel query that returns more than N series (0: no bound; "
                             "scripts/fleet.py passes 100 with one group selected, as the dashboards open)")
    parser.add_argument("--verbose", action="store_true", help="also list passing items")
    parser.add_argument("--list", action="store_true", help="print the extracted expressions and exit (offline)")
    parser.add_argument("--emit-rule-file", metavar="FILE",
                        help="write the expressions as a rule file for `promtool check rules` and exit (offline)")
    parser.add_argument("--alert", metavar="NAME", help="alert mode: poll /api/v1/alerts for this alert")
    parser.add_argument("--expect", choices=["firing", "active", "quiet"],
                        help="alert mode: the state to wait for (active: pending or firing)")
    parser.add_argument("--hold", type=float, default=0, metavar="SECONDS",
                        help="alert mode, quiet: the alert must stay quiet this long (default: 0)")
    parser.add_argument("--label", action="append", default=[], metavar="K=V",
                        help="alert mode: only instances with this label (repeatable)")
    parser.add_argument("--timeout-alert", type=float, default=300, metavar="SECONDS",
                        help="alert mode: give up after this long (default: 300)")
    parser.add_argument("--poll", type=float, default=5, metavar="SECONDS", help="alert mode: poll interval (default: 5)")
    args = parser.parse_args(argv)

    try:
        parse_duration(args.rate_interval)
        parse_duration(args.range)
    except ValueError as err:
        parser.error(str(err))
    if any("=" not in pair for pair in args.label + args.var):
        parser.error("--label and --var take NAME=VALUE")

    if args.alert or args.expect:
        if not (args.alert and args.expect):
            parser.error("--alert and --expect go together")
        if not args.prometheus:
            parser.error("--prometheus is required")
        try:
            return run_alert(args)
        except ConnectionError as err:
            print(f"promql-live-check: Prometheus unreachable: {err}", file=sys.stderr)
            return 2

    items = collect(args)
    if args.list:
        for item in items:
            flag = f"  [may be empty: {item.allow_empty}]" if item.allow_empty else ""
            print(f"{item.kind:13} {item.name}{flag}\n    {one_line(item.expr)}")
        print(f"{len(items)} expressions")
        return 0
    if args.emit_rule_file:
        emit_rule_file(args.emit_rule_file, items)
        print(f"wrote {len(items)} expressions to {args.emit_rule_file}")
        return 0
    if not args.prometheus:
        parser.error("--prometheus is required (or use --list / --emit-rule-file)")
    try:
        prom_get(args.prometheus, "/api/v1/status/buildinfo", None, args.timeout)
    except (ConnectionError, PromError) as err:
        print(f"promql-live-check: Prometheus unreachable: {err}", file=sys.stderr)
        return 2
    try:
        return run_checks(args, items)
    except ConnectionError as err:
        print(f"promql-live-check: Prometheus unreachable: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
