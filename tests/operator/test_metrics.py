"""The operator's own metrics: names, closed label sets, and the /metrics endpoint."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client import REGISTRY

from kvpilot.operator.clients import metrics


def _value(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


@pytest.mark.parametrize("result", metrics.RECONCILE_RESULTS)
def test_record_reconcile_counts_by_result(result: str) -> None:
    before = _value("kvpilot_reconciles_total", result=result)
    metrics.record_reconcile(result)
    assert _value("kvpilot_reconciles_total", result=result) == before + 1


@pytest.mark.parametrize("kind", ["Planned", "Retuned", "RolledBack", "Held", "Infeasible"])
def test_record_decision_counts_by_kind(kind: str) -> None:
    before = _value("kvpilot_decisions_total", kind=kind)
    metrics.record_decision(kind)
    assert _value("kvpilot_decisions_total", kind=kind) == before + 1


def test_closed_label_sets_reject_unknown_values() -> None:
    with pytest.raises(ValueError):
        metrics.record_reconcile("ok")
    with pytest.raises(ValueError):
        metrics.record_decision("retuned")
    with pytest.raises(ValueError):
        metrics.record_error("namespace/name: something broke")


def test_record_error_counts_by_reason() -> None:
    before = _value("kvpilot_errors_total", reason="UnsupportedGpu")
    metrics.record_error("UnsupportedGpu")
    assert _value("kvpilot_errors_total", reason="UnsupportedGpu") == before + 1


def test_prometheus_query_latency_histogram() -> None:
    count = _value("kvpilot_prometheus_query_duration_seconds_count")
    fast = _value("kvpilot_prometheus_query_duration_seconds_bucket", le="0.05")
    metrics.observe_prometheus_query(0.02)
    with pytest.raises(RuntimeError), metrics.time_prometheus_query():
        raise RuntimeError("query failed")  # still observed
    assert _value("kvpilot_prometheus_query_duration_seconds_count") == count + 2
    assert _value("kvpilot_prometheus_query_duration_seconds_bucket", le="0.05") == fast + 2
    with pytest.raises(ValueError):
        metrics.observe_prometheus_query(-1)


def test_series_exist_at_zero_before_any_event() -> None:
    for kind in metrics.DECISION_KINDS:
        assert REGISTRY.get_sample_value("kvpilot_decisions_total", {"kind": kind}) is not None


@pytest.mark.parametrize(
    ("env", "port"),
    [
        ({}, metrics.DEFAULT_PORT),
        ({"KVPILOT_METRICS_PORT": "9200"}, 9200),
        ({"KVPILOT_METRICS_PORT": "0"}, 0),
    ],
)
def test_metrics_port_from_env(env: dict[str, str], port: int) -> None:
    assert metrics.metrics_port_from_env(env) == port


@pytest.mark.parametrize("raw", ["http", "-1", "70000"])
def test_metrics_port_from_env_rejects_garbage(raw: str) -> None:
    with pytest.raises(ValueError):
        metrics.metrics_port_from_env({"KVPILOT_METRICS_PORT": raw})


def test_start_metrics_server_serves_and_is_idempotent() -> None:
    port = metrics.start_metrics_server(0, addr="127.0.0.1")
    assert port
    assert metrics.start_metrics_server(0, addr="127.0.0.1") == port
    metrics.record_decision("Held")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as rsp:
        body = rsp.read().decode()
    assert 'kvpilot_decisions_total{kind="Held"}' in body
    assert "kvpilot_prometheus_query_duration_seconds_bucket" in body
