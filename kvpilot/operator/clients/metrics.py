"""The operator's own Prometheus metrics (not vLLM's: those are read by ``prometheus.py``).

Where it sits: the kopf edge. Handlers and the closed loop call the ``record_*`` /
``observe_*`` functions below; ``main.py`` calls :func:`start_metrics_server` once at
start-up. Nothing here knows about Kubernetes or the tuner. The fleet-wide series' label
values are small closed sets (results, decision kinds) or CamelCase reasons, never object
names. The per-service series (``namespace``, ``inferenceservice`` labels: what the
dashboard and the alert rules in docs/observability.md read) hold a fixed handful of series
per managed service, and :func:`forget_service` drops them when the service is deleted.

Series (all prefixed ``kvpilot_``)::

    kvpilot_reconciles_total{result}           Counter   success | temporary_error | permanent_error
    kvpilot_decisions_total{kind}              Counter   Planned | Retuned | RolledBack | Held | Infeasible
    kvpilot_errors_total{reason}               Counter   a CamelCase reason (UnsupportedGpu, ...)
    kvpilot_profile_samples_refused_total{reason}  Counter  an observation fleet learning refused
                                               (KvAboveDevice)
    kvpilot_prometheus_query_duration_seconds  Histogram one observation per Prometheus HTTP query

    per service (labels namespace, inferenceservice):
    kvpilot_service_decisions_total{kind}      Counter   the decisions above, per service
    kvpilot_service_last_decision_timestamp_seconds{kind}  Gauge  when the last one of each kind was taken
    kvpilot_applied_setting{setting}           Gauge     the settings the engine runs (SERVICE_SETTINGS)
    kvpilot_kv_usage_threshold{threshold}      Gauge     the policy's KV-usage band: low | target | high
    kvpilot_slo_seconds{objective}             Gauge     spec.serving.slo: ttft_p95 | itl_p95
    kvpilot_service_held                       Gauge     1 while the closed loop holds a change it wants (a
                                               notable hold, not a routine one), else 0

The metrics live in the default ``prometheus_client`` registry, so the process and
platform collectors (memory, CPU, open fds, Python version) come with them.

The port comes from ``$KVPILOT_METRICS_PORT`` (the Helm chart sets it; ``0`` turns the
endpoint off); the default is :data:`DEFAULT_PORT`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Protocol

from prometheus_client import Counter, Gauge, Histogram, start_http_server

__all__ = [
    "DECISION_KINDS",
    "DEFAULT_PORT",
    "METRICS_PORT_ENV",
    "RECONCILE_RESULTS",
    "SERVICE_SETTINGS",
    "forget_service",
    "metrics_port_from_env",
    "observe_prometheus_query",
    "record_decision",
    "record_error",
    "record_refused_sample",
    "record_reconcile",
    "record_service",
    "start_metrics_server",
    "time_prometheus_query",
]

METRICS_PORT_ENV = "KVPILOT_METRICS_PORT"
"""Environment variable holding the metrics port (the chart's ``metrics.port``)."""

DEFAULT_PORT = 9102
"""Port used when ``$KVPILOT_METRICS_PORT`` is unset."""

RECONCILE_RESULTS = ("success", "temporary_error", "permanent_error")
"""Allowed ``result`` labels: handled; will retry (``kopf.TemporaryError``); gave up (``PermanentError``)."""

DECISION_KINDS = ("Planned", "Retuned", "RolledBack", "Held", "Infeasible")
"""Allowed ``kind`` labels: the ``status.history[].action`` values of the API contract."""

SERVICE_SETTINGS = ("max_num_seqs", "max_model_len", "gpu_memory_utilization", "max_num_batched_tokens")
"""The settings :func:`record_service` exports (``setting`` label: the engine-settings field names)."""
KV_THRESHOLDS = {"low": "kv_usage_low", "target": "target_kv_usage", "high": "kv_usage_high"}
"""``threshold`` label -> the policy field it reads."""
SLO_OBJECTIVES = {"ttft_p95": "ttft_p95_seconds", "itl_p95": "itl_p95_seconds"}
"""``objective`` label -> the SLO field it reads."""

_QUERY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

RECONCILES = Counter(
    "kvpilot_reconciles",
    "InferenceService reconciliations, by result.",
    ["result"],
)
DECISIONS = Counter(
    "kvpilot_decisions",
    "Tuning decisions taken, by kind (the status.history action).",
    ["kind"],
)
ERRORS = Counter(
    "kvpilot_errors",
    "Errors met while reconciling or tuning, by CamelCase reason.",
    ["reason"],
)
PROFILE_SAMPLES_REFUSED = Counter(
    "kvpilot_profile_samples_refused",
    "Observations refused by fleet learning (never learned into a TuningProfile), by reason.",
    ["reason"],
)
PROMETHEUS_QUERY_SECONDS = Histogram(
    "kvpilot_prometheus_query_duration_seconds",
    "Latency of the operator's queries to Prometheus, in seconds.",
    buckets=_QUERY_BUCKETS,
)
_SERVICE = ["namespace", "inferenceservice"]
SERVICE_DECISIONS = Counter(
    "kvpilot_service_decisions",
    "Tuning decisions taken for one InferenceService, by kind (the status.history action).",
    [*_SERVICE, "kind"],
)
SERVICE_DECISION_TIME = Gauge(
    "kvpilot_service_last_decision_timestamp_seconds",
    "Unix time of an InferenceService's last tuning decision of each kind (how long it has been held).",
    [*_SERVICE, "kind"],
)
APPLIED_SETTING = Gauge(
    "kvpilot_applied_setting",
    "The engine setting an InferenceService's pods are given (what kvpilot applied), by setting.",
    [*_SERVICE, "setting"],
)
KV_USAGE_THRESHOLD = Gauge(
    "kvpilot_kv_usage_threshold",
    "The closed loop's KV-usage band for an InferenceService (fraction 0-1): low, target, high.",
    [*_SERVICE, "threshold"],
)
SLO_SECONDS = Gauge(
    "kvpilot_slo_seconds",
    "An InferenceService's latency objective (spec.serving.slo), in seconds: ttft_p95, itl_p95.",
    [*_SERVICE, "objective"],
)
SERVICE_HELD = Gauge(
    "kvpilot_service_held",
    "1 while the closed loop holds an InferenceService back from a change it wants (a notable hold), else 0.",
    _SERVICE,
)
_PER_SERVICE = (
    (SERVICE_DECISIONS, "kind"),
    (SERVICE_DECISION_TIME, "kind"),
    (APPLIED_SETTING, "setting"),
    (KV_USAGE_THRESHOLD, "threshold"),
    (SLO_SECONDS, "objective"),
)

# Export every closed-set series at zero from the start, so rate() and absent() work
# before the first event.
for _result in RECONCILE_RESULTS:
    RECONCILES.labels(result=_result)
for _kind in DECISION_KINDS:
    DECISIONS.labels(kind=_kind)

_server_lock = threading.Lock()
_server_port: int | None = None


def record_reconcile(result: str) -> None:
    """Count one reconciliation. ``result`` is one of :data:`RECONCILE_RESULTS`."""
    if result not in RECONCILE_RESULTS:
        raise ValueError(f"unknown reconcile result {result!r}; expected one of {RECONCILE_RESULTS}")
    RECONCILES.labels(result=result).inc()


def record_decision(kind: str, namespace: str | None = None, name: str | None = None) -> None:
    """Count one tuning decision. ``kind`` is one of :data:`DECISION_KINDS`; with the service's
    ``namespace`` and ``name`` it is counted for that service too (``kvpilot_service_decisions_total``)."""
    if kind not in DECISION_KINDS:
        raise ValueError(f"unknown decision kind {kind!r}; expected one of {DECISION_KINDS}")
    DECISIONS.labels(kind=kind).inc()
    if namespace is not None and name is not None:
        service = {"namespace": namespace, "inferenceservice": name, "kind": kind}
        SERVICE_DECISIONS.labels(**service).inc()
        SERVICE_DECISION_TIME.labels(**service).set_to_current_time()


class _Settings(Protocol):
    def as_dict(self) -> dict[str, object]: ...


KEEP = object()
""":func:`record_service`'s default for ``policy`` and ``slo``: leave that group's series as they are."""


def record_service(
    namespace: str,
    name: str,
    settings: _Settings,
    policy: object = KEEP,
    slo: object = KEEP,
    held: bool | None = None,
) -> None:
    """Export one service's applied ``settings`` (an ``EngineSettings``: :data:`SERVICE_SETTINGS`; an unset
    one's series is dropped), its ``policy``'s KV band (a ``PolicyConfig``: :data:`KV_THRESHOLDS`), its
    latency ``slo`` (a ``LatencySlo``: :data:`SLO_OBJECTIVES`; ``None``, no objective, drops both) and
    whether this tick ``held`` a change back (``None`` leaves it)."""
    if not namespace or not name:
        raise ValueError(f"a service needs a namespace and a name, got {namespace!r}/{name!r}")
    for kind in DECISION_KINDS:  # every kind at zero from the start, so increase() sees the first one
        SERVICE_DECISIONS.labels(namespace=namespace, inferenceservice=name, kind=kind)
    values = settings.as_dict()
    _export(APPLIED_SETTING, namespace, name, "setting", {k: values.get(k) for k in SERVICE_SETTINGS})
    if policy is not KEEP:
        _export(
            KV_USAGE_THRESHOLD,
            namespace,
            name,
            "threshold",
            {label: getattr(policy, field) for label, field in KV_THRESHOLDS.items()},
        )
    if slo is not KEEP:
        _export(
            SLO_SECONDS,
            namespace,
            name,
            "objective",
            {label: getattr(slo, field, None) for label, field in SLO_OBJECTIVES.items()},
        )
    if held is not None:
        SERVICE_HELD.labels(namespace=namespace, inferenceservice=name).set(1 if held else 0)


def _export(gauge: Gauge, namespace: str, name: str, key: str, values: Mapping[str, object]) -> None:
    for label, value in values.items():
        labels = {"namespace": namespace, "inferenceservice": name, key: label}
        if value is None:
            with contextlib.suppress(KeyError):
                gauge.remove(*labels.values())
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            gauge.labels(**labels).set(value)
        else:
            raise ValueError(f"{key} {label} must be a number, got {value!r}")


def forget_service(namespace: str, name: str) -> None:
    """Drop every per-service series of ``namespace/name`` (the service was deleted)."""
    service = (namespace, name)
    with contextlib.suppress(KeyError):
        SERVICE_HELD.remove(namespace, name)
    for metric, key in _PER_SERVICE:
        samples = [s.labels for family in metric.collect() for s in family.samples]
        mine = {ls[key] for ls in samples if (ls["namespace"], ls["inferenceservice"]) == service}
        for value in mine:
            metric.remove(namespace, name, value)


def record_error(reason: str) -> None:
    """Count one error. ``reason`` is a CamelCase condition reason or exception class name."""
    if not reason or not reason.isidentifier() or len(reason) > 64:
        raise ValueError(f"error reason must be a short CamelCase identifier, got {reason!r}")
    ERRORS.labels(reason=reason).inc()


def record_refused_sample(reason: str) -> None:
    """Count one observation fleet learning refused. ``reason`` is a short CamelCase identifier."""
    if not reason or not reason.isidentifier() or len(reason) > 64:
        raise ValueError(f"refusal reason must be a short CamelCase identifier, got {reason!r}")
    PROFILE_SAMPLES_REFUSED.labels(reason=reason).inc()


def observe_prometheus_query(seconds: float) -> None:
    """Record the latency of one Prometheus query."""
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative: {seconds}")
    PROMETHEUS_QUERY_SECONDS.observe(seconds)


@contextlib.contextmanager
def time_prometheus_query() -> Iterator[None]:
    """``with metrics.time_prometheus_query(): ...`` records the block's duration, even on error."""
    start = time.perf_counter()
    try:
        yield
    finally:
        observe_prometheus_query(time.perf_counter() - start)


def metrics_port_from_env(environ: Mapping[str, str] | None = None) -> int:
    """The port to serve on: ``$KVPILOT_METRICS_PORT`` or :data:`DEFAULT_PORT`; ``0`` means off."""
    raw = (os.environ if environ is None else environ).get(METRICS_PORT_ENV, "").strip()
    if not raw:
        return DEFAULT_PORT
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"${METRICS_PORT_ENV} must be an integer port, got {raw!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"${METRICS_PORT_ENV} must be within 0..65535, got {port}")
    return port


def start_metrics_server(port: int | None = None, addr: str = "0.0.0.0") -> int | None:
    """Serve ``/metrics`` on ``addr:port`` in a daemon thread; return the bound port.

    ``port=None`` reads :func:`metrics_port_from_env`; ``0`` from the environment turns the
    endpoint off (returns ``None``), while an explicit ``port=0`` binds a free port (tests).
    Calling it again is a no-op that returns the first port,
    so a re-run start-up handler does not fail on "address in use".
    """
    global _server_port
    if port is None:
        port = metrics_port_from_env()
        if port == 0:
            return None
    with _server_lock:
        if _server_port is None:
            server, _thread = start_http_server(port, addr=addr)
            _server_port = server.server_port
        return _server_port
