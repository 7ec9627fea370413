"""The series the dashboard and the alert rules read, and how a service's pods are picked out of them.

vLLM's series come from :mod:`kvpilot.tuner.vllm.serving` (one home for a release's metric names), the
operator's own from :mod:`kvpilot.operator.clients.metrics` (the names are checked against its registry
in ``tests/observability``), the GPU's from dcgm-exporter (the names the closed loop reads too).

vLLM's series carry ``namespace``, ``pod`` and ``inferenceservice``: the chart's PodMonitor copies the
pod's label :data:`kvpilot.operator.api.SERVICE_LABEL` into each target (:data:`RELABELING`), so a
service's series are picked by its name, whatever its pods are called (a Deployment's
``<service>-<hash>-<hash>``, a LeaderWorkerSet leader's ``<service>-<group>``), and join the operator's,
which carry the same label. dcgm-exporter's series name only the pod: :func:`gpu_of_service` keeps the
pods that serve the service's vLLM series.
"""

from __future__ import annotations

import re

from kvpilot.operator import api
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
    "RELABELING",
    "SERVICE_LABEL",
    "SLO_SECONDS",
    "gpu_of_service",
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

SERVICE_LABEL = "inferenceservice"
"""The label naming a series' InferenceService, on the operator's series and (relabelled) on vLLM's."""
SERVICE = f"namespace, {SERVICE_LABEL}"
"""The labels that name one InferenceService in every joined expression."""
_NOT_IN_A_LABEL_NAME = re.compile("[^a-zA-Z0-9_]")


def pod_label_meta(key: str) -> str:
    """The meta label Prometheus' Kubernetes discovery gives a pod label: ``__meta_kubernetes_pod_label_`` and
    the key with every character outside ``[a-zA-Z0-9_]`` made ``_`` (Prometheus' ``SanitizeLabelName``)."""
    return "__meta_kubernetes_pod_label_" + _NOT_IN_A_LABEL_NAME.sub("_", key)


RELABELING = {"sourceLabels": [pod_label_meta(api.SERVICE_LABEL)], "targetLabel": SERVICE_LABEL}
"""The PodMonitor relabeling that gives vLLM's series their ``inferenceservice`` from the pod's
``kvpilot.io/inferenceservice`` label; a scrape config of your own needs the same rule (``source_labels``,
``target_label``)."""


def vllm_selector(namespace: str = "$namespace", service: str = "$service") -> str:
    """The label matchers of one service's vLLM series."""
    return f'namespace="{namespace}", {SERVICE_LABEL}="{service}"'


def service_selector(namespace: str = "$namespace", service: str = "$service") -> str:
    """The label matchers of one service's operator series."""
    return f'namespace="{namespace}", inferenceservice="{service}"'


def gpu_of_service(series: str, namespace: str = "$namespace", service: str = "$service") -> str:
    """dcgm-exporter's ``series`` summed per pod, for the pods that serve ``service``'s vLLM series (its
    own labels name the pod, not the service)."""
    serving = f"max by (pod) ({RUNNING}{{{vllm_selector(namespace, service)}}})"
    return f'sum by (pod) ({series}{{namespace="{namespace}"}}) and on (pod) {serving}'
