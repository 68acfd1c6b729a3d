"""The Grafana dashboard queries what the services really export.

``k8s/observability/grafana-dashboard.json`` is checked against a real scrape: the services'
real work (:func:`metrics_helpers.exercise_every_metric`) is run with the metrics endpoint up,
``/metrics`` is parsed by ``prometheus_client``, and every series name, every label grouped by
and every label matched in the dashboard's PromQL must be one the scrape has (with the matched
value among those it takes). A renamed metric or label fails here rather than as an empty
panel in production.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from metrics_helpers import Samples, exercise_every_metric, scrape

from podium.metrics import METRIC_NAMES, MetricsServer, setup_metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "k8s" / "observability" / "grafana-dashboard.json"
SCRAPE_LABELS = frozenset({"instance", "job", "namespace", "pod"})
"""Labels Prometheus adds when it scrapes (not in a process's own /metrics)."""

_METRIC = re.compile(r"\b(podium_[a-z0-9_]+)\b")
_BY = re.compile(r"\bby\s*\(([^)]*)\)")
_MATCHER = re.compile(r"\{([^}]*)\}")
_PAIR = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"\s*')


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def _exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in _panels(dashboard) for t in p["targets"]]


def test_dashboard_is_a_grafana_dashboard() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in _panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"])
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)) and all(t["expr"].strip() for t in panel["targets"])


def _labels(samples: Samples, name: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for labels, _ in samples.get(name, []):
        for key, val in labels.items():
            out.setdefault(key, set()).add(val)
    return out


async def test_every_query_names_what_the_services_export(tmp_path: Path) -> None:
    server = MetricsServer(0, host="127.0.0.1", registry=setup_metrics("podium-tests"))
    port = server.start()
    try:
        await exercise_every_metric(tmp_path)
        samples = scrape(port)
    finally:
        server.stop()
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs = _exprs(dashboard)
    used: set[str] = set()
    for expr in exprs:
        names = set(_METRIC.findall(expr))
        assert names, f"no podium metric in {expr!r}"
        missing = names - set(samples)
        assert not missing, f"{expr!r} queries {sorted(missing)}, not in a real scrape"
        used |= names
        labels: dict[str, set[str]] = {}
        for name in names:
            for key, vals in _labels(samples, name).items():
                labels.setdefault(key, set()).update(vals)
        for group in _BY.findall(expr):
            for label in (g.strip() for g in group.split(",") if g.strip()):
                assert label in labels or label in SCRAPE_LABELS, f"{expr!r}: no label {label!r}"
        for matchers in _MATCHER.findall(expr):
            for label, op, val in _PAIR.findall(matchers):
                assert label in labels, f"{expr!r}: no label {label!r}"
                if op in ("=", "!="):
                    assert val in labels[label], f"{expr!r}: {label} is never {val!r}"
    # Every family of the contract has a panel.
    families = {
        n.removesuffix(s) for n in used for s in ("_bucket", "_sum", "_count") if n.endswith(s)
    }
    assert set(METRIC_NAMES) <= used | families, set(METRIC_NAMES) - used - families
