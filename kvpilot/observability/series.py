"""The series the dashboard and the alert rules read, and how a service's pods are picked out of them.

vLLM's series come from :mod:`kvpilot.tuner.vllm.serving` (one home for a release's metric names), the
operator's own from :mod:`kvpilot.operator.clients.metrics` (the names are checked against its registry
in ``tests/observability``), the GPU's from dcgm-exporter (the names the closed loop reads too).

vLLM's series carry ``namespace`` and ``pod`` (the chart's PodMonitor, kube-prometheus style); a
service's pods are its Deployment's, named ``<service>-<replicaset hash>-<pod hash>``:
:func:`pod_regex` matches exactly those, and :func:`by_service` turns ``pod`` into the
``inferenceservice`` label the operator's series carry, so that the two can be joined.
"""

from __future__ import annotations

from kvpilot.operator.clients import metrics, prometheus
from kvpilot.tuner.vllm import serving

__all__ = [
    "APPLIED_SETTING",
    "CONTAINER",
    "DECISIONS",
    "DECISION_TIME",
    "FB_FREE",
    "FB_USED",
    "KV_THRESHOLD",
    "OPERATOR_RECONCILES",
    "SLO_SECONDS",
    "by_service",
    "pod_regex",
    "service_selector",
    "vllm_selector",
]

# vLLM (kvpilot.tuner.vllm.serving)
KV_USAGE = serving.KV_USAGE
KV_USAGE_LEGACY = serving.KV_USAGE_LEGACY
PREEMPTIONS = serving.PREEMPTIONS
RUNNING = serving.RUNNING
WAITING = serving.WAITING
TTFT = serving.TTFT
ITL = serving.ITL
CONTAINER = serving.CONTAINER_NAME

# the operator (kvpilot.operator.clients.metrics)
APPLIED_SETTING = "kvpilot_applied_setting"
KV_THRESHOLD = "kvpilot_kv_usage_threshold"
SLO_SECONDS = "kvpilot_slo_seconds"
DECISIONS = "kvpilot_service_decisions_total"
DECISION_TIME = "kvpilot_service_last_decision_timestamp_seconds"
HELD = "kvpilot_service_held"
OPERATOR_RECONCILES = "kvpilot_reconciles_total"
OPERATOR_ERRORS = "kvpilot_errors_total"
SETTINGS = metrics.SERVICE_SETTINGS
THRESHOLDS = tuple(metrics.KV_THRESHOLDS)
OBJECTIVES = tuple(metrics.SLO_OBJECTIVES)

# dcgm-exporter, MiB (what the closed loop reads: kvpilot.operator.clients.prometheus)
FB_USED = prometheus.FB_USED
FB_FREE = prometheus.FB_FREE

SERVICE = "namespace, inferenceservice"
"""The labels that name one InferenceService in every joined expression."""


def pod_regex(service: str) -> str:
    """The pods of ``service``'s Deployment (ReplicaSet hash, pod hash): not those of ``<service>-big``."""
    return f"{service}-[a-z0-9]+-[a-z0-9]+"


def vllm_selector(namespace: str = "$namespace", service: str = "$service") -> str:
    """The label matchers of one service's vLLM (and dcgm-exporter) series."""
    return f'namespace="{namespace}", pod=~"{pod_regex(service)}"'


def service_selector(namespace: str = "$namespace", service: str = "$service") -> str:
    """The label matchers of one service's operator series."""
    return f'namespace="{namespace}", inferenceservice="{service}"'


def by_service(expr: str) -> str:
    """``expr`` (per pod) with an ``inferenceservice`` label read from the pod's name."""
    return f'label_replace({expr}, "inferenceservice", "$1", "pod", "{pod_regex("(.+)")}")'
