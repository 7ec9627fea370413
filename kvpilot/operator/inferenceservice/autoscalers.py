"""An autoscaler on an InferenceService that cannot scale it safely: the bad input "an HPA on an
InferenceService with ``spec.rollout.strategy: Recreate`` and one replica".

Recreate stops every pod before the new one starts; on one replica each retune is an outage, and an
HorizontalPodAutoscaler (KEDA's included) that reads the service's metrics then sees none, or scales a
Deployment that is being recreated. kvpilot keeps serving (the spec is valid), and says so: a Warning event
``AutoscalerConflict`` and the same text in ``status.warnings``, naming the autoscaler and what to change.

:func:`fetch_autoscalers` lists the namespace's HPAs only when the spec has Recreate (so no other service pays
an API request); a refused or failed list is no answer, never a failed reconcile.
:func:`compute_autoscaler_conflict` is pure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from kvpilot.operator import api, errors
from kvpilot.operator.clients.kube import Kube

REASON = "AutoscalerConflict"
"""The event's reason and the ``status.warnings`` entry's prefix."""
KIND = "InferenceService"
GROUP = "kvpilot.io"


def targets(hpa: Mapping[str, Any], name: str) -> bool:
    """Whether ``hpa`` scales the InferenceService ``name`` (through its ``/scale`` subresource)."""
    ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
    group = str(ref.get("apiVersion") or "").split("/", 1)[0]
    return ref.get("kind") == KIND and ref.get("name") == name and group == GROUP


def compute_autoscaler_conflict(
    spec: api.InferenceServiceSpec, name: str, hpas: Sequence[Mapping[str, Any]]
) -> str | None:
    """The warning for an autoscaler on a Recreate service that can run on one replica; ``None`` otherwise."""
    if spec.rollout.strategy != "Recreate":
        return None
    for hpa in hpas:
        if not targets(hpa, name):
            continue
        low = int((hpa.get("spec") or {}).get("minReplicas") or 1)
        if low <= 1 or spec.replicas <= 1:
            hpa_name = (hpa.get("metadata") or {}).get("name")
            return (
                f"{REASON}: HorizontalPodAutoscaler {hpa_name} scales this service, whose "
                f"spec.rollout.strategy is Recreate with {min(low, spec.replicas)} replica(s): every retune "
                "stops all pods, and the autoscaler reads no metrics meanwhile. Set spec.rollout.strategy to "
                "Auto, or the autoscaler's minReplicas to 2 or more"
            )
    return None


async def fetch_autoscalers(
    kube: Kube, spec: api.InferenceServiceSpec, namespace: str
) -> list[dict[str, Any]]:
    """The namespace's HPAs when ``spec`` could conflict with one (Recreate); none otherwise or when the list
    fails (RBAC, the API): the warning is advice, not a reason to fail the reconcile."""
    if spec.rollout.strategy != "Recreate":
        return []
    try:
        return await asyncio.to_thread(kube.list_autoscalers, namespace)
    except errors.ApplyFailed:
        return []
