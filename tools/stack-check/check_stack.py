#!/usr/bin/env python3
"""Cross-file consistency checks of the bundled observability stack.

The tools that own each file validate its syntax (docker-compose, promtool, tsc against
@grafana/schema, grafana-foundation-sdk, hadolint). What none of them sees is whether the files
agree with each other and with the stack's rules; this script checks that:

  docker-compose.yml  pinned images, ports on 127.0.0.1 only, no top-level include, Grafana
                      admin password required from the environment with no default, anonymous
                      access off (or read-only Viewer), bind-mount sources exist, the mounts
                      that make prometheus.yml's relative rule paths resolve in the container;
  tools/versions.env  the compose images are the releases scripts/install-tools.sh builds
                      (Prometheus, Jaeger, collector-contrib), and jaeger.yaml is mounted;
  collector.yaml      every pipeline component defined, every defined component used, OTLP on
                      4317/4318, traces -> Jaeger over OTLP, metrics -> prometheus exporter on
                      8889 with resource_to_telemetry_conversion enabled;
  prometheus.yml      scrapes the collector (honor_labels) and host.docker.internal:9464; loads
                      exactly the rule files in rules/ (unit tests excluded), as does the test;
  rules               every alert has `for`, a severity, summary/description naming site
                      (and rank/layer where it has them), compares against a
                      `...:threshold` series (no literal thresholds; a 0/1 state gauge
                      `..._successful == 0` has none) and is unit-tested firing
                      and quiet; dashboard links in annotations point at existing dashboards;
  Grafana             datasource uids `prometheus`/`jaeger` with compose-service URLs; the
                      dashboard provider path is where compose mounts dashboards/;
  dashboards          unique uids, datasource/job/rank/layer variables, every panel and target
                      on the `${datasource}` Prometheus, units set, no overlapping panels,
                      trace links to the Jaeger datasource uid.

Usage: check_stack.py [REPO_ROOT]     exit 0: consistent, 1: problems found
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys
import urllib.parse

import yaml

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
PROBLEMS: list[str] = []


def problem(where: str, text: str) -> None:
    PROBLEMS.append(f"{where}: {text}")


def load_yaml(rel: str):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def rel(path: str) -> str:
    return os.path.relpath(path, ROOT)


# ------------------------------------------------------------------ docker-compose.yml
def check_compose() -> dict:
    where = "docker-compose.yml"
    compose = load_yaml(where)
    if "include" in compose:
        problem(where, "top-level `include:` is not allowed")
    services = compose.get("services", {})
    for name in ("otel-collector", "jaeger", "prometheus", "grafana", "demo"):
        if name not in services:
            problem(where, f"service {name!r} missing")
    for name, svc in services.items():
        image = svc.get("image")
        if image and "build" not in svc:
            repo, _, tag = image.rpartition(":")
            if not repo or "/" in tag or tag in ("", "latest"):
                problem(where, f"{name}: image {image!r} is not pinned to a version tag")
        for port in svc.get("ports", []) or []:
            text = str(port if not isinstance(port, dict) else port.get("host_ip", ""))
            if not text.startswith("127.0.0.1"):
                problem(where, f"{name}: port {port!r} is not bound to 127.0.0.1")
        for volume in svc.get("volumes", []) or []:
            source = str(volume).split(":")[0]
            if source.startswith("."):
                if not os.path.exists(os.path.join(ROOT, source)):
                    problem(where, f"{name}: bind-mount source {source} does not exist")
    grafana = services.get("grafana", {})
    env = grafana.get("environment", {}) or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    password = str(env.get("GF_SECURITY_ADMIN_PASSWORD", ""))
    if not re.fullmatch(r"\$\{GRAFANA_ADMIN_PASSWORD:\?[^}]*\}", password):
        problem(where, "grafana: GF_SECURITY_ADMIN_PASSWORD must be ${GRAFANA_ADMIN_PASSWORD:?...} (required, no default)")
    anonymous = str(env.get("GF_AUTH_ANONYMOUS_ENABLED", "false")).lower()
    if anonymous != "false" and str(env.get("GF_AUTH_ANONYMOUS_ORG_ROLE", "Viewer")) != "Viewer":
        problem(where, "grafana: anonymous access must be off or the Viewer role")
    prom = services.get("prometheus", {})
    if "host.docker.internal:host-gateway" not in (prom.get("extra_hosts") or []):
        problem(where, "prometheus: extra_hosts needs host.docker.internal:host-gateway")
    mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in prom.get("volumes", []) if ":" in str(v)}
    if mounts.get("/etc/prometheus/prometheus.yml") != "./otel-config/prometheus.yml":
        problem(where, "prometheus: ./otel-config/prometheus.yml must be mounted at /etc/prometheus/prometheus.yml")
    if mounts.get("/etc/prometheus/rules") != "./otel-config/rules":
        problem(where, "prometheus: ./otel-config/rules must be mounted at /etc/prometheus/rules "
                       "(prometheus.yml's relative rule_files resolve there)")
    demo = services.get("demo", {})
    demo_env = demo.get("environment", {}) or {}
    if demo_env.get("OTEL_EXPORTER_OTLP_ENDPOINT") != "http://otel-collector:4317":
        problem(where, "demo: OTEL_EXPORTER_OTLP_ENDPOINT must be http://otel-collector:4317")
    build = demo.get("build", {})
    dockerfile = build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else "Dockerfile"
    if not os.path.exists(os.path.join(ROOT, dockerfile)):
        problem(where, f"demo: {dockerfile} missing")
    return compose


# ------------------------------------------------------------------ collector.yaml
ENV_REFERENCE = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def compose_defaults(node):
    """The config as compose runs it: each `${env:NAME:-default}` replaced by its default (the
    compose services set none of those variables; the tests set them to loopback ports)."""
    if isinstance(node, dict):
        return {key: compose_defaults(value) for key, value in node.items()}
    if isinstance(node, list):
        return [compose_defaults(value) for value in node]
    if isinstance(node, str):
        return ENV_REFERENCE.sub(lambda m: m.group(2) or "", node)
    return node


def check_collector(compose: dict) -> None:
    where = "otel-config/collector.yaml"
    cfg = compose_defaults(load_yaml(where))
    defined = {kind: set((cfg.get(kind) or {}).keys()) for kind in ("receivers", "processors", "exporters", "extensions")}
    used = {kind: set() for kind in defined}
    service = cfg.get("service", {})
    for ext in service.get("extensions", []) or []:
        used["extensions"].add(ext)
        if ext not in defined["extensions"]:
            problem(where, f"service.extensions: {ext!r} not defined")
    pipelines = service.get("pipelines", {}) or {}
    for pname, pipe in pipelines.items():
        for kind in ("receivers", "processors", "exporters"):
            for comp in pipe.get(kind, []) or []:
                used[kind].add(comp)
                if comp not in defined[kind]:
                    problem(where, f"pipeline {pname}: {kind[:-1]} {comp!r} not defined")
        if not pipe.get("receivers") or not pipe.get("exporters"):
            problem(where, f"pipeline {pname}: needs receivers and exporters")
    for kind in defined:
        for comp in sorted(defined[kind] - used[kind]):
            problem(where, f"{kind[:-1]} {comp!r} defined but not used")
    otlp = (cfg.get("receivers") or {}).get("otlp", {}).get("protocols", {})
    if (otlp.get("grpc") or {}).get("endpoint") != "0.0.0.0:4317" or (otlp.get("http") or {}).get("endpoint") != "0.0.0.0:4318":
        problem(where, "otlp receiver must listen on 0.0.0.0:4317 (grpc) and 0.0.0.0:4318 (http)")
    exporters = cfg.get("exporters") or {}
    traces = pipelines.get("traces", {}).get("exporters", [])
    jaeger = [e for e in traces if e.split("/")[0] in ("otlp", "otlp_grpc", "otlphttp", "otlp_http") and "jaeger" in exporters.get(e, {}).get("endpoint", "")]
    if not jaeger:
        problem(where, "traces pipeline must export to Jaeger over OTLP")
    else:
        host = re.sub(r"^\w+://", "", exporters[jaeger[0]]["endpoint"]).split(":")[0]
        if host not in compose.get("services", {}):
            problem(where, f"Jaeger endpoint host {host!r} is not a compose service")
    prom = exporters.get("prometheus")
    if "prometheus" not in pipelines.get("metrics", {}).get("exporters", []) or not prom:
        problem(where, "metrics pipeline must export through the `prometheus` exporter")
    else:
        if not str(prom.get("endpoint", "")).endswith(":8889"):
            problem(where, "prometheus exporter must listen on :8889")
        if not (prom.get("resource_to_telemetry_conversion") or {}).get("enabled"):
            problem(where, "prometheus exporter needs resource_to_telemetry_conversion.enabled: true")


# ------------------------------------------------------------------ prometheus.yml + rules
def rule_files_in_dir() -> set[str]:
    return {
        "rules/" + os.path.basename(p)
        for p in glob.glob(os.path.join(ROOT, "otel-config/rules/*.yml"))
        if not p.endswith(".test.yml")
    }


def check_prometheus() -> None:
    where = "otel-config/prometheus.yml"
    cfg = load_yaml(where)
    loaded = set(cfg.get("rule_files") or [])
    present = rule_files_in_dir()
    for missing in sorted(present - loaded):
        problem(where, f"rule file {missing} exists but is not in rule_files")
    for extra in sorted(loaded - present):
        problem(where, f"rule_files entry {extra} does not exist (or is a glob/test file)")
    targets = {}
    for job in cfg.get("scrape_configs", []):
        for static in job.get("static_configs", []):
            for target in static.get("targets", []):
                targets[target] = job
    collector = targets.get("otel-collector:8889")
    if not collector:
        problem(where, "must scrape otel-collector:8889")
    elif not collector.get("honor_labels"):
        problem(where, "the otel-collector job needs honor_labels: true (keeps job = service.name)")
    if "host.docker.internal:9464" not in targets:
        problem(where, "must scrape host.docker.internal:9464 (embedded endpoint of a local engine)")
    for test in glob.glob(os.path.join(ROOT, "otel-config/rules/*.test.yml")):
        tcfg = load_yaml(rel(test))
        tested = {"rules/" + f for f in tcfg.get("rule_files", [])}
        if tested != present:
            problem(rel(test), f"rule_files {sorted(tested)} differ from the rule files {sorted(present)}")


def check_rules(dashboard_uids: set[str]) -> None:
    tests: dict[str, dict[str, int]] = {}
    for test in glob.glob(os.path.join(ROOT, "otel-config/rules/*.test.yml")):
        for case in load_yaml(rel(test)).get("tests", []):
            for art in case.get("alert_rule_test", []) or []:
                counts = tests.setdefault(art["alertname"], {"firing": 0, "quiet": 0})
                counts["firing" if art.get("exp_alerts") else "quiet"] += 1
    for path in sorted(glob.glob(os.path.join(ROOT, "otel-config/rules/*.yml"))):
        if path.endswith(".test.yml"):
            continue
        for group in load_yaml(rel(path)).get("groups", []):
            for rule in group.get("rules", []):
                if "alert" not in rule:
                    continue
                name = rule["alert"]
                where = f"{rel(path)}: {name}"
                if not rule.get("for"):
                    problem(where, "needs `for:`")
                if not (rule.get("labels") or {}).get("severity"):
                    problem(where, "needs a severity label")
                ann = rule.get("annotations") or {}
                if not ann.get("summary") or not ann.get("description"):
                    problem(where, "needs summary and description annotations")
                text = ann.get("summary", "") + ann.get("description", "")
                for label in ("site", "rank", "layer", "reason"):
                    if re.search(rf"\b{label}\b", rule["expr"]) and f"$labels.{label}" not in text and f".Labels.{label}" not in text:
                        problem(where, f"annotations should name the {label} ($labels.{label})")
                # A condition with a number compares against a threshold series; an alert on a
                # recorded condition (phasetrace:rank_silent) has no number to tune, nor one on
                # a 0/1 state gauge (`..._successful == 0`, as Prometheus's own
                # prometheus_config_last_reload_successful).
                condition = re.sub(r"\b[a-z_:]+_successful\s*==\s*0\b", " ", rule["expr"])
                if re.search(r"[<>]=?|==|!=", condition) and ":threshold" not in condition:
                    problem(where, "compare against a `...:threshold` recording rule (phasetrace-thresholds.yml), not a literal")
                counts = tests.get(name, {"firing": 0, "quiet": 0})
                if not counts["firing"] or not counts["quiet"]:
                    problem(where, f"unit tests must cover firing and quiet (found {counts})")
                link = ann.get("dashboard")
                if link:
                    match = re.match(r"/d/([^/?]+)", link)
                    if not match or match.group(1) not in dashboard_uids:
                        problem(where, f"dashboard annotation {link!r} names no dashboard in dashboards/")


# ------------------------------------------------------------------ Grafana provisioning
def check_grafana(compose: dict) -> None:
    sources = {}
    for path in glob.glob(os.path.join(ROOT, "otel-config/grafana/provisioning/datasources/*.yml")):
        for ds in load_yaml(rel(path)).get("datasources", []):
            sources[ds.get("uid")] = ds
    expect = {"prometheus": ("prometheus", "http://prometheus:9090"), "jaeger": ("jaeger", "http://jaeger:16686")}
    for uid, (dtype, url) in expect.items():
        ds = sources.get(uid)
        if not ds:
            problem("grafana datasources", f"no datasource with uid {uid!r}")
        elif ds.get("type") != dtype or ds.get("url") != url:
            problem("grafana datasources", f"{uid}: expected type {dtype} at {url}")
    destinations = ((sources.get("prometheus") or {}).get("jsonData") or {}).get("exemplarTraceIdDestinations") or []
    if not any(d.get("name") == "trace_id" and d.get("datasourceUid") == "jaeger" for d in destinations):
        problem("grafana datasources", "prometheus: exemplarTraceIdDestinations must send the exemplar label trace_id to the Jaeger datasource uid `jaeger`")
    prom_cmd = compose["services"].get("prometheus", {}).get("command", [])
    if "--enable-feature=exemplar-storage" not in prom_cmd:
        problem("docker-compose.yml", "prometheus: needs --enable-feature=exemplar-storage to keep the exemplars")
    mounts = {}
    for volume in compose["services"].get("grafana", {}).get("volumes", []):
        parts = str(volume).split(":")
        if len(parts) >= 2:
            mounts[parts[0]] = parts[1]
    dash_mount = mounts.get("./dashboards")
    provisioning = mounts.get("./otel-config/grafana/provisioning")
    if provisioning != "/etc/grafana/provisioning":
        problem("docker-compose.yml", "grafana: mount ./otel-config/grafana/provisioning at /etc/grafana/provisioning")
    paths = []
    for path in glob.glob(os.path.join(ROOT, "otel-config/grafana/provisioning/dashboards/*.yml")):
        for provider in load_yaml(rel(path)).get("providers", []):
            paths.append((provider.get("options") or {}).get("path"))
    if not paths or any(p != dash_mount for p in paths):
        problem("grafana dashboards provider", f"path {paths} must be where compose mounts ./dashboards ({dash_mount})")


# ------------------------------------------------------------------ dashboards
# Dashboard -> histograms whose exemplars (traced steps) a timeseries panel must show.
EXEMPLAR_HISTOGRAMS = {
    "decode-sections.json": ["phasetrace_step_duration_seconds_bucket", "phasetrace_section_duration_seconds_bucket"],
    "collectives-rank-skew.json": ["phasetrace_collective_wait_seconds_bucket"],
}


def panels_of(panels):
    for panel in panels or []:
        yield panel
        yield from panels_of(panel.get("panels"))


def check_dashboards() -> set[str]:
    uids: set[str] = set()
    files = sorted(glob.glob(os.path.join(ROOT, "dashboards/*.json")))
    if len(files) < 3:
        problem("dashboards", f"expected the three dashboards, found {len(files)}")
    prom_ref = {"type": "prometheus", "uid": "${datasource}"}
    for path in files:
        where = rel(path)
        dash = json.load(open(path, encoding="utf-8"))
        uid = dash.get("uid", "")
        if not uid or len(uid) > 40 or uid in uids:
            problem(where, f"uid {uid!r} missing, too long or duplicated")
        uids.add(uid)
        variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
        for name in ("datasource", "job", "rank", "layer"):
            if name not in variables:
                problem(where, f"template variable ${name} missing")
        ds_var = variables.get("datasource", {})
        if ds_var.get("query") != "prometheus" or (ds_var.get("current") or {}).get("value") != "prometheus":
            problem(where, "the datasource variable must list Prometheus datasources and default to uid `prometheus`")
        for name, var in variables.items():
            if var.get("type") == "query":
                if var.get("datasource") != prom_ref:
                    problem(where, f"variable ${name}: datasource must be {prom_ref}")
                if var.get("includeAll") and var.get("allValue") != ".*":
                    problem(where, f"variable ${name}: allValue must be .* (queries use =~)")
        ids = set()
        boxes = []
        for panel in panels_of(dash.get("panels")):
            title = panel.get("title")
            if panel.get("id") in ids:
                problem(where, f"panel id {panel.get('id')} duplicated")
            ids.add(panel.get("id"))
            grid = panel.get("gridPos") or {}
            box = (grid.get("x", 0), grid.get("y", 0), grid.get("w", 0), grid.get("h", 0), title)
            for other in boxes:
                if box[0] < other[0] + other[2] and other[0] < box[0] + box[2] and box[1] < other[1] + other[3] and other[1] < box[1] + box[3]:
                    problem(where, f"panels {other[4]!r} and {title!r} overlap")
            boxes.append(box)
            if box[0] + box[2] > 24:
                problem(where, f"panel {title!r} is wider than the grid")
            if panel.get("type") == "row":
                continue
            if panel.get("datasource") != prom_ref:
                problem(where, f"panel {title!r}: datasource must be {prom_ref}")
            for target in panel.get("targets", []):
                if target.get("datasource", prom_ref) != prom_ref:
                    problem(where, f"panel {title!r} target {target.get('refId')}: datasource must be {prom_ref}")
                if re.search(r'\$(job|rank|layer|site|bucket)\b', target.get("expr", "")) and re.search(r'[^~]="\$', target.get("expr", "")):
                    problem(where, f"panel {title!r}: multi-value variables must be used with =~")
            defaults = (panel.get("fieldConfig") or {}).get("defaults") or {}
            unit = (panel.get("options") or {}).get("yAxis", {}).get("unit") if panel.get("type") == "heatmap" else defaults.get("unit")
            if not unit:
                problem(where, f"panel {title!r}: no unit set")
            for link in defaults.get("links", []) or []:
                url = link.get("url", "")
                if url.startswith("/explore"):
                    panes = urllib.parse.parse_qs(urllib.parse.urlparse(url).query).get("panes", [""])[0]
                    if '"uid":"jaeger"' not in panes.replace(" ", ""):
                        problem(where, f"panel {title!r}: explore link must use the Jaeger datasource uid `jaeger`")
        # The step-time, section and collective-wait quantile panels show exemplars.
        for metric in EXEMPLAR_HISTOGRAMS.get(os.path.basename(path), []):
            if not any(
                metric in t.get("expr", "") and t.get("exemplar") is True
                for p in panels_of(dash.get("panels"))
                if p.get("type") == "timeseries"
                for t in p.get("targets", [])
            ):
                problem(where, f"no timeseries panel shows the exemplars of {metric}")
        if "collectives" in os.path.basename(path):
            has_links = any((p.get("fieldConfig") or {}).get("defaults", {}).get("links") for p in panels_of(dash.get("panels")))
            if not has_links:
                problem(where, "needs data links to Jaeger traces")
            if not any("ALERTS" in t.get("expr", "") for p in panels_of(dash.get("panels")) for t in p.get("targets", [])):
                problem(where, "needs a firing-alerts panel (ALERTS)")
    return uids


# ------------------------------------------------------------------ tools/versions.env
def check_pins(compose: dict) -> None:
    """The images compose runs are the releases the tests ran (built from tools/versions.env)."""
    where = "tools/versions.env"
    path = os.path.join(ROOT, where)
    if not os.path.exists(path):
        problem(where, "missing")
        return
    pins = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                key, _, value = line.partition("=")
                pins[key.strip()] = value.strip()
    services = compose.get("services", {})
    expect = {
        "prometheus": "prom/prometheus:v" + pins.get("PROMETHEUS_VERSION", "?"),
        "jaeger": "jaegertracing/jaeger:" + pins.get("JAEGER_VERSION", "?"),
        "otel-collector": "otel/opentelemetry-collector-contrib:"
        + pins.get("OTELCOL_CONTRIB_VERSION", "?").lstrip("v"),
    }
    for name, image in expect.items():
        got = services.get(name, {}).get("image")
        if got != image:
            problem("docker-compose.yml", f"{name}: image {got!r}, but {where} pins {image!r} (what the tests ran)")
    mounts = [str(v) for v in services.get("jaeger", {}).get("volumes", []) or []]
    if not any(m.startswith("./otel-config/jaeger.yaml:") for m in mounts):
        problem("docker-compose.yml", "jaeger: ./otel-config/jaeger.yaml must be mounted (the config the tests run)")


def main() -> int:
    compose = check_compose()
    check_pins(compose)
    check_collector(compose)
    check_prometheus()
    uids = check_dashboards()
    check_rules(uids)
    check_grafana(compose)
    if PROBLEMS:
        print(f"FAIL: {len(PROBLEMS)} consistency problem(s):")
        for line in PROBLEMS:
            print(f"  {line}")
        return 1
    print("ok: pins, compose, collector, prometheus, rules, grafana provisioning and dashboards agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
