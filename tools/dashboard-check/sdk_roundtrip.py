#!/usr/bin/env python3
"""Round-trips Grafana dashboards through grafana-foundation-sdk's dashboard model.

Each dashboard JSON is loaded with `Dashboard.from_json` (the SDK's unmarshaller, with the
default panel and datasource plugins registered, so panel `options`,
`fieldConfig.defaults.custom` and Prometheus targets are decoded into their typed models) and
serialised back with the SDK's JSON encoder. The SDK keeps only the keys its schema knows, so:

  * every key of the input must survive the round trip with the same value: a key the model
    dropped is unknown or misspelled (at any depth: panels, options, targets, variables...);
  * every panel type must have a registered panel model (otherwise its options would pass
    through unchecked) and every target must decode as a Prometheus query;
  * keys the SDK adds (its defaults) are reported with --verbose but are not errors.

Usage: sdk_roundtrip.py [--verbose] DASHBOARD.json...    exit 0: all clean, 1: problems, 2: usage
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

try:
    from grafana_foundation_sdk.cog import plugins, runtime
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import dashboard as dashboard_model
    from grafana_foundation_sdk.models import prometheus as prometheus_model
except ImportError as err:  # pragma: no cover - environment problem
    print(f"sdk_roundtrip: grafana-foundation-sdk is not installed: {err}", file=sys.stderr)
    sys.exit(2)


def compare(expected: Any, actual: Any, path: str, problems: list[str], added: list[str]) -> None:
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            problems.append(f"{path}: became {type(actual).__name__} ({json.dumps(actual)[:80]})")
            return
        for key, value in expected.items():
            if key not in actual:
                problems.append(
                    f"{path}.{key}: unknown to the SDK model, dropped (value {json.dumps(value)[:80]})"
                )
            else:
                compare(value, actual[key], f"{path}.{key}", problems, added)
        for key in actual.keys() - expected.keys():
            added.append(f"{path}.{key} = {json.dumps(actual[key])[:80]}")
    elif isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            problems.append(f"{path}: list changed ({json.dumps(expected)[:60]} -> {json.dumps(actual)[:60]})")
            return
        for index, (e, a) in enumerate(zip(expected, actual)):
            compare(e, a, f"{path}[{index}]", problems, added)
    else:
        same = expected == actual and (isinstance(expected, bool) == isinstance(actual, bool))
        if not same:
            problems.append(f"{path}: {json.dumps(expected)} -> {json.dumps(actual)}")


def check_typed(model: Any, path: str, problems: list[str]) -> None:
    """Panels must be of a registered plugin and targets Prometheus queries, else unchecked."""
    registry = runtime.Runtime()
    for index, panel in enumerate(model.panels or []):
        panel_path = f"{path}.panels[{index}]"
        if isinstance(panel, dashboard_model.RowPanel):
            check_typed(panel, panel_path, problems)
            continue
        if registry.panelcfg_config(panel.type_val) is None:
            problems.append(f"{panel_path}: panel type {panel.type_val!r} has no SDK model (unchecked)")
        for t_index, target in enumerate(panel.targets or []):
            if not isinstance(target, prometheus_model.Dataquery):
                problems.append(
                    f"{panel_path}.targets[{t_index}]: not decoded as a Prometheus query "
                    f"({type(target).__name__}); set the panel datasource type to 'prometheus'"
                )


def check_file(path: str, verbose: bool) -> int:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, json.JSONDecodeError) as err:
        print(f"FAIL {path}: cannot read JSON: {err}")
        return 1
    problems: list[str] = []
    added: list[str] = []
    try:
        model = dashboard_model.Dashboard.from_json(data)
        round_tripped = json.loads(json.dumps(model, cls=JSONEncoder))
    except Exception as err:  # the SDK raises KeyError/TypeError/ValueError on bad shapes
        print(f"FAIL {path}: the SDK could not load it: {type(err).__name__}: {err}")
        return 1
    check_typed(model, "$", problems)
    compare(data, round_tripped, "$", problems, added)
    if problems:
        print(f"FAIL {path}: {len(problems)} problem(s)")
        for problem in problems:
            print(f"  {problem}")
    else:
        print(f"ok   {path}: round trip through grafana-foundation-sdk is lossless")
    if verbose and added:
        print(f"     {len(added)} SDK default(s) added:")
        for line in added:
            print(f"       {line}")
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dashboards", nargs="+", help="dashboard JSON files")
    parser.add_argument("--verbose", action="store_true", help="also list SDK defaults added")
    args = parser.parse_args()
    plugins.register_default_plugins()
    failed = sum(check_file(path, args.verbose) for path in args.dashboards)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
