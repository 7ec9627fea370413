"""The chart's dashboard ConfigMap and PrometheusRule: off by default, and when on, the generated files."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import yaml
from helmchart import CHART

from kvpilot.observability import alerts, dashboard

Rendered = Callable[..., list[dict[str, Any]]]


def _kinds(objs: list[dict[str, Any]]) -> set[str]:
    return {o["kind"] for o in objs}


def test_off_by_default(rendered: Rendered) -> None:
    objs = rendered()
    assert "PrometheusRule" not in _kinds(objs)
    assert not [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboards")]


def test_dashboard_configmap_for_grafanas_sidecar(rendered: Rendered) -> None:
    objs = rendered(sets=["dashboards.enabled=true", "dashboards.namespace=monitoring"])
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboards")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert json.loads(cm["data"]["kvpilot-inferenceservice.json"]) == dashboard.build_dashboard()


def test_prometheus_rule(rendered: Rendered) -> None:
    objs = rendered(sets=["alerts.enabled=true", "alerts.labels.release=kps"])
    (rule,) = [o for o in objs if o["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["spec"]["groups"] == alerts.build_rules()["groups"]
    shipped = yaml.safe_load((CHART / "files" / "alerts" / "kvpilot-rules.yaml").read_text())
    assert shipped == alerts.build_rules()
