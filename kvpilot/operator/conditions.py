"""Status conditions, the Kubernetes way: a list keyed by ``type``.

Pure helpers over plain dicts (the wire form in ``status.conditions``). A condition's
``lastTransitionTime`` changes only when its ``status`` does, so re-reconciling an
unchanged object leaves the times alone. Types and reasons are CamelCase
(api-conventions.md, "Typical status properties").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

READY = "Ready"
"""The service serves its current spec: the reconciler applied it (reason ``Applied`` until the pods are
seen) and, once the closed loop has seen the pods, a replica is available (``Serving``) or not (the
``Degraded`` reason, or ``Starting``)."""
CONFIG_RESOLVED = "ConfigResolved"
PLANNED = "Planned"
INFEASIBLE = "Infeasible"
"""Set by the reconciler (no plan fits) and by the closed loop (no remedy fits)."""
METRICS_AVAILABLE = "MetricsAvailable"
"""The closed loop: vLLM's metrics window is usable."""
ROLLOUT_IN_PROGRESS = "RolloutInProgress"
"""The closed loop: a retune or rollback is rolling out or on probation."""
AVAILABLE = "Available"
"""The closed loop, from the pods: at least one replica running the applied settings is Ready."""
DEGRADED = "Degraded"
"""The closed loop, from the pods: a crash loop, a start-up failure, no node, an image or a download."""

CLOSED_LOOP = "ClosedLoop"
"""The closed loop of another engine than vLLM: True (reason ``Recommending``) while it recommends SGLang or
TGI flags without rolling them out, ``Tuning`` while it rolls them out (mode Auto:
:mod:`kvpilot.operator.status.engine_patch`); False (reason ``EngineNotTuned``) for an engine it has no
rules for; not set for vLLM."""

TARGET_FOUND = "TargetFound"
"""An EngineTuner's: the workload named by ``spec.targetRef`` exists."""
DISCOVERED = "Discovered"
"""An EngineTuner's: the vLLM container, its settings, the model and GPU were read (False: what to set)."""
REWRITABLE = "Rewritable"
"""An EngineTuner's, in every mode but Off: False (reason ``RewriteRefused``) when the admission webhook's
rewrite cannot put the recommendation on the target's new pods (a shell script that does not pass ``"$@"``),
naming the container and what to change; mode Auto then evicts nothing. Back to True once it can."""

SCHEDULABLE = "Schedulable"
"""The closed loop, from the nodes: some node could ever take one of the service's pods (labels, GPU
product, taints, allocatable ``nvidia.com/gpu``); False with the reason when none could. Checked while a pod
cannot schedule or the condition is False, so it follows the nodes as they change."""

TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"

PROMETHEUS_TLS_ERROR = "PrometheusTLSError"
PROMETHEUS_UNAUTHORIZED = "PrometheusUnauthorized"
PROMETHEUS_FORBIDDEN = "PrometheusForbidden"
PROMETHEUS_UNREACHABLE = "PrometheusUnreachable"
PROMETHEUS_CREDENTIALS_UNREADABLE = "PrometheusCredentialsUnreadable"
PROMETHEUS_QUERY_FAILED = "PrometheusQueryFailed"
PROMETHEUS_NOT_FOUND = "PrometheusNotFound"
PROMETHEUS_UNAVAILABLE = "PrometheusUnavailable"
PROMETHEUS_BAD_RESPONSE = "PrometheusBadResponse"
PROMETHEUS_FAILURES = frozenset(
    {
        PROMETHEUS_TLS_ERROR,
        PROMETHEUS_UNAUTHORIZED,
        PROMETHEUS_FORBIDDEN,
        PROMETHEUS_UNREACHABLE,
        PROMETHEUS_CREDENTIALS_UNREADABLE,
        PROMETHEUS_QUERY_FAILED,
        PROMETHEUS_NOT_FOUND,
        PROMETHEUS_UNAVAILABLE,
        PROMETHEUS_BAD_RESPONSE,
    }
)
"""``MetricsAvailable=False`` reasons of a failed Prometheus query (``prometheus_errors.classify_error``):
each is also a Warning event when the reason changes to it."""
PROMETHEUS_NOT_CONFIGURED = "PrometheusNotConfigured"
"""``MetricsAvailable=False`` without a Prometheus URL: a supported set-up (crash remedies only), no event."""

TYPES = (
    READY,
    AVAILABLE,
    DEGRADED,
    SCHEDULABLE,
    CONFIG_RESOLVED,
    PLANNED,
    INFEASIBLE,
    METRICS_AVAILABLE,
    ROLLOUT_IN_PROGRESS,
)
"""Every condition type kvpilot sets, in the order ``status.conditions`` lists them."""


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    type_: str,
    status: str,
    reason: str,
    message: str,
    *,
    generation: int | None,
    now: str,
) -> list[dict[str, Any]]:
    """A copy of ``conditions`` with ``type_`` set; the transition time moves only on a status change."""
    if status not in (TRUE, FALSE, UNKNOWN):
        raise ValueError(f"condition status must be True, False or Unknown, got {status!r}")
    if not reason or not reason[0].isupper() or not reason.isalnum():
        raise ValueError(f"condition reason must be CamelCase, got {reason!r}")
    result = [dict(c) for c in conditions]
    old = next((c for c in result if c.get("type") == type_), None)
    new = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": old["lastTransitionTime"]
        if old and old.get("status") == status and old.get("lastTransitionTime")
        else now,
    }
    if generation is None:
        del new["observedGeneration"]
    if old is None:
        result.append(new)
    else:
        result[result.index(old)] = new
    return sorted(result, key=_sort_key)


def set_conditions(
    conditions: Sequence[Mapping[str, Any]],
    updates: Sequence[tuple[str, str, str, str]],
    *,
    generation: int | None,
    now: str,
) -> list[dict[str, Any]]:
    """Apply several ``(type, status, reason, message)`` updates in order."""
    result = [dict(c) for c in conditions]
    for type_, status, reason, message in updates:
        result = set_condition(result, type_, status, reason, message, generation=generation, now=now)
    return result


def find_condition(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    """The condition of ``type_``, or ``None``."""
    return next((c for c in conditions or () if c.get("type") == type_), None)


def is_true(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> bool:
    cond = find_condition(conditions, type_)
    return cond is not None and cond.get("status") == TRUE


def _sort_key(condition: Mapping[str, Any]) -> tuple[int, str]:
    type_ = str(condition.get("type", ""))
    return (TYPES.index(type_) if type_ in TYPES else len(TYPES), type_)
