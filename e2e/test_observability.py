"""The dashboard's and the alert rules' PromQL against the real stack: a real Prometheus scraping the
simulated vLLM fleet (dcgm-exporter's framebuffer series included) and the operator's own ``/metrics``,
for a service the operator planned and whose closed loop runs.

Every panel query, with Grafana's variables set to that service, returns its series; every alert
expression evaluates; the rules about reading (metrics unavailable, KV saturated while held) and the
operator (down, failing) stay silent for it. The storm scenario of ``test_closed_loop`` then drives
a KV-pressure retune, which the decision series and the annotation query see.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import LocalCluster
from e2e.fleet import Scenario, Workload
from e2e.fleet.stack import Stack
from e2e.fleet.testing import H100_8B
from e2e.prometheus import free_port
from kvpilot.observability import alerts, dashboard

NAME = "obs"
H100 = "NVIDIA-H100-80GB-HBM3"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
_KV_TOKENS = 24576  # the storm case of test_closed_loop: a KV cache far smaller than the traffic needs
TRUTH = dataclasses.replace(H100_8B, non_kv_gib=round(0.95 * 79.11 - _KV_TOKENS * 131072 / 2**30, 4))
WORKLOAD = Workload(arrival_rate=3.0, prompt_tokens=1500, output_tokens=1500, time_scale=4.0)


@pytest.fixture(scope="module")
def stack(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, str]]:
    ns = f"e2e-obs-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", ns)
    s = Stack(
        cluster,
        Path(tmp_path_factory.mktemp("observability")),
        namespaces=[ns],
        operator_namespaces=[ns],
        scenarios={(ns, NAME): Scenario(name=NAME, truth=TRUTH, workload=WORKLOAD)},
        operator_metrics_port=free_port(),
    )
    s.start()
    try:
        cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", ns, "--timeout=60s")
        cluster.apply(
            [
                {
                    "apiVersion": "kvpilot.io/v1alpha1",
                    "kind": "InferenceService",
                    "metadata": {"name": NAME, "namespace": ns},
                    "spec": {
                        "model": {"id": MODEL, "source": "Catalogue"},
                        "gpu": {"count": 1, "product": H100},
                        "serving": {
                            "maxContextLength": 8192,
                            "slo": {"ttftP95Seconds": 2.0, "interTokenLatencyP95Seconds": 0.1},
                        },
                        "tuning": {
                            "cooldownSeconds": 0,
                            "maxChangesPerHour": 60,
                            "rolloutDeadlineSeconds": 30,
                        },
                    },
                }
            ]
        )
        yield s, ns
    finally:
        s.stop_and_clean([ns])


def _substitute(expr: str, ns: str) -> str:
    return expr.replace("$__rate_interval", "1m").replace("$namespace", ns).replace("$service", NAME)


def _wait(stack: Stack, query: str, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        result = stack.prom.query(query)
        if result or time.monotonic() > deadline:
            return result
        time.sleep(2)


def test_every_panel_returns_the_services_series(stack: tuple[Stack, str]) -> None:
    s, ns = stack
    # the closed loop's first full tick exports the band; the fleet's histograms need a minute of traffic
    _wait(s, f'kvpilot_kv_usage_threshold{{namespace="{ns}"}}', 150)
    panels = [e for e in dashboard.expressions(dashboard.build_dashboard()) if "decisions_total" not in e]
    empty = [e for e in panels if not _wait(s, _substitute(e, ns), 60)]
    assert empty == [], f"panels without series for {ns}/{NAME}: {empty}"
    for rule in alerts.build_rules()["groups"][0]["rules"]:
        s.prom.query(rule["expr"])  # evaluates (a parse or evaluation error raises)
    quiet = ("KvpilotMetricsUnavailable", "KvpilotOperatorDown", "KvpilotReconcileErrors")
    for rule in alerts.build_rules()["groups"][0]["rules"]:
        if rule["alert"] in quiet:
            mine = [r for r in s.prom.query(rule["expr"]) if r["metric"].get("namespace") in (None, ns)]
            assert mine == [], (rule["alert"], mine)


def test_a_retune_shows_in_the_decision_series(stack: tuple[Stack, str]) -> None:
    s, ns = stack
    mine = f'namespace="{ns}", inferenceservice="{NAME}"'
    assert _wait(s, f'kvpilot_service_decisions_total{{{mine}, kind="Retuned"}} > 0', 330), "no Retuned"
    decisions = [e for e in dashboard.expressions(dashboard.build_dashboard()) if "decisions_total" in e]
    for expr in decisions:  # the Decisions panel and the annotation query see it
        window = _substitute(expr, ns).replace("[1m]", "[10m]").replace("[2m]", "[10m]")
        assert _wait(s, window, 30), expr
