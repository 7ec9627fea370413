"""Every PromQL expression of the dashboard and the alert rules, run by a real Prometheus.

Debian's ``prometheus`` (``e2e.prometheus``, scrape interval 1 s, relabelled as the chart's PodMonitor
relabels) scrapes three vLLM-format pods of the service ``ns1/llm`` (the e2e fleet's exposition: 0.33 names
with dcgm-exporter's framebuffer series, a pod with the pre-rename names, and a LeaderWorkerSet leader
named ``llm-0``), a pod of another service (``llm-big``, whose pods' names start like ``llm``'s), and
this process's own operator metrics (``kvpilot.operator.clients.metrics``, with ``ns1/llm``'s settings,
band, SLO and decisions).
Every panel's query, with Grafana's variables set to ``ns1``/``llm``, must parse and return series of
that service only; every alert expression must parse and evaluate. The binary is required (``make
test`` installs it), never skipped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.fleet.engine import Deltas, Finished
from e2e.fleet.exposition import VllmMetrics
from e2e.fleet.truth import EngineArgs, GroundTruth
from e2e.prometheus import PrometheusServer, serve_exposition
from kvpilot.observability import alerts, dashboard
from kvpilot.operator.clients import metrics
from kvpilot.tuner.loop import LatencySlo, PolicyConfig
from kvpilot.tuner.types import EngineSettings

PODS = (  # (pod, naming, its InferenceService)
    ("llm-5d8f7c-aaaaa", "current", "llm"),
    ("llm-5d8f7c-bbbbb", "legacy", "llm"),
    ("llm-0", "current", "llm"),  # a LeaderWorkerSet's leader: <service>-<group>, no hashes
    ("llm-big-7b9c6d-ccccc", "current", "llm-big"),
)
MINE = {"llm-5d8f7c-aaaaa", "llm-5d8f7c-bbbbb", "llm-0"}
VARIABLES = {"$__rate_interval": "10s", "$namespace": "ns1", "$service": "llm"}


def _finished() -> Finished:
    return Finished(
        prompt_tokens=500,
        generation_tokens=100,
        max_tokens=200,
        finished_reason="length",
        preemptions=0,
        queue_s=0.05,
        ttft_s=0.2,
        e2e_s=2.2,
        inference_s=2.15,
    )


@pytest.fixture(scope="module")
def prom() -> Iterator[PrometheusServer]:
    truth = GroundTruth()
    engines = {}
    servers = []
    for name, naming, _ in PODS:
        args = EngineArgs(model="m", max_model_len=8192, max_num_seqs=64, gpu_memory_utilization=0.9)
        engines[name] = VllmMetrics(truth, args, naming=naming)
        engines[name].record(running=40, waiting=7, kv_usage=0.95, deltas=Deltas(), fb_used_gib=60.0)
        servers.append((name, serve_exposition(engines[name].render)))
    stop = threading.Event()

    def traffic() -> None:  # preemptions and finished requests, so rates and quantiles have data
        while not stop.is_set():
            for engine in engines.values():
                engine.record(
                    running=40, waiting=7, kv_usage=0.95, deltas=Deltas(preemptions=1, finished=[_finished()])
                )
            time.sleep(0.2)

    threading.Thread(target=traffic, daemon=True).start()
    metrics.record_service(
        "ns1",
        "llm",
        EngineSettings(max_num_seqs=64, max_model_len=8192, gpu_memory_utilization=0.9),
        PolicyConfig(),
        LatencySlo(0.5, 0.05),
    )
    metrics.record_decision("Planned", "ns1", "llm")
    operator_port = metrics.start_metrics_server(0, addr="127.0.0.1")
    services = {name: service for name, _, service in PODS}
    targets = [
        {
            "targets": [f"127.0.0.1:{srv.server_address[1]}"],
            "labels": {
                "__meta_kubernetes_namespace": "ns1",
                "__meta_kubernetes_pod_name": name,
                "__meta_kubernetes_pod_label_kvpilot_io_inferenceservice": services[name],
            },
        }
        for name, srv in servers
    ]
    try:
        operator = {"kvpilot": [f"127.0.0.1:{operator_port}"]}
        with PrometheusServer(scrape_interval="1s", scrape_targets=operator) as p:
            p.write_targets(targets)
            p.wait_for("count(up == 1)", lambda r: bool(r) and r[0]["value"][1] == "5", timeout=60)
            time.sleep(12)  # enough scrapes for a 10 s rate
            metrics.record_decision("Retuned", "ns1", "llm")  # a decision the annotation sees change
            time.sleep(3)
            yield p
    finally:
        stop.set()
        for _, srv in servers:
            srv.shutdown()


def _substitute(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr.replace('"$1"', ""), expr
    return expr


@pytest.mark.parametrize("expr", dashboard.expressions(dashboard.build_dashboard()))
def test_every_panel_returns_the_services_series(prom: PrometheusServer, expr: str) -> None:
    result = prom.query(_substitute(expr))
    assert result, f"no series for {expr}"
    pods = {r["metric"].get("pod") for r in result} - {None}
    assert pods <= MINE, pods  # llm-big's pod is another service's


def test_both_kv_names_are_read(prom: PrometheusServer) -> None:
    (kv,) = [e for e in dashboard.expressions(dashboard.build_dashboard()) if "kv_cache_usage" in e]
    pods = {r["metric"]["pod"] for r in prom.query(_substitute(kv))}
    assert pods == MINE  # 0.33's name and the pre-rename one, and the group's leader


def test_the_variables_list_the_service(prom: PrometheusServer) -> None:
    values = prom.api("label/inferenceservice/values", **{"match[]": "kvpilot_applied_setting"})
    assert "llm" in values


@pytest.mark.parametrize("rule", alerts.build_rules()["groups"][0]["rules"], ids=lambda r: r["alert"])
def test_every_alert_expression_evaluates(prom: PrometheusServer, rule: dict[str, Any]) -> None:
    prom.query(rule["expr"])  # a parse or evaluation error raises


def test_healthy_and_served_services_raise_no_reading_alert(prom: PrometheusServer) -> None:
    """ns1/llm is served and scraped (other tests' services in this process's registry may not be)."""
    rules = {r["alert"]: r["expr"] for r in alerts.build_rules()["groups"][0]["rules"]}

    def firing(alert: str) -> list[dict[str, Any]]:
        mine = {"namespace": "ns1", "inferenceservice": "llm"}
        return [r for r in prom.query(rules[alert]) if mine.items() <= r["metric"].items()]

    assert firing("KvpilotMetricsUnavailable") == []  # ns1/llm's pods are scraped
    assert prom.query(rules["KvpilotOperatorDown"]) == []
    # KV 0.95 above the band's 0.90 with preemptions, but kvpilot retuned in the last 30 minutes
    assert firing("KvpilotKvSaturatedWhileHeld") == []
    blind = prom.query(rules["KvpilotMetricsUnavailable"].replace("unless", "and"))  # the join is real
    assert {"namespace": "ns1", "inferenceservice": "llm"}.items() <= blind[0]["metric"].items()
