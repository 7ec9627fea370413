"""The operator's own Prometheus metrics (not vLLM's: those are read by ``prometheus.py``).

Where it sits: the kopf edge. Handlers and the closed loop call the ``record_*`` /
``observe_*`` functions below; ``main.py`` calls :func:`start_metrics_server` once at
start-up. Nothing here knows about InferenceServices, Kubernetes or the tuner: label
values are small closed sets (results, decision kinds) or CamelCase reasons, never
object names, so the series count stays bounded however many services are managed.

Series (all prefixed ``kvpilot_``)::

    kvpilot_reconciles_total{result}           Counter   success | temporary_error | permanent_error
    kvpilot_decisions_total{kind}              Counter   Planned | Retuned | RolledBack | Held | Infeasible
    kvpilot_errors_total{reason}               Counter   a CamelCase reason (UnsupportedGpu, ...)
    kvpilot_profile_samples_refused_total{reason}  Counter  an observation fleet learning refused
                                               (KvAboveDevice)
    kvpilot_prometheus_query_duration_seconds  Histogram one observation per Prometheus HTTP query

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

from prometheus_client import Counter, Histogram, start_http_server

__all__ = [
    "DECISION_KINDS",
    "DEFAULT_PORT",
    "METRICS_PORT_ENV",
    "RECONCILE_RESULTS",
    "metrics_port_from_env",
    "observe_prometheus_query",
    "record_decision",
    "record_error",
    "record_refused_sample",
    "record_reconcile",
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


def record_decision(kind: str) -> None:
    """Count one tuning decision. ``kind`` is one of :data:`DECISION_KINDS`."""
    if kind not in DECISION_KINDS:
        raise ValueError(f"unknown decision kind {kind!r}; expected one of {DECISION_KINDS}")
    DECISIONS.labels(kind=kind).inc()


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
