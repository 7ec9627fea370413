"""An HPA on a Recreate InferenceService with one replica: a Warning event and a status warning, never a
failed reconcile (kvpilot.operator.inferenceservice.autoscalers)."""

from __future__ import annotations

from typing import Any

import pytest
from operator_fakes import Harness, condition, isvc

from kvpilot.operator import errors
from kvpilot.operator.inferenceservice import autoscalers

RECREATE = {"strategy": "Recreate", "allowDowntime": True}


def hpa(
    target: str = "llm",
    namespace: str = "ns1",
    min_replicas: int | None = None,
    kind: str = "InferenceService",
) -> dict[str, Any]:
    ref = {"apiVersion": "kvpilot.io/v1alpha1", "kind": kind, "name": target}
    spec: dict[str, Any] = {"scaleTargetRef": ref, "maxReplicas": 4}
    if min_replicas is not None:
        spec["minReplicas"] = min_replicas
    return {"metadata": {"name": f"{target}-hpa", "namespace": namespace}, "spec": spec}


async def test_an_hpa_on_a_recreate_single_replica_is_warned_about(harness: Harness) -> None:
    harness.kube.autoscalers = [hpa()]
    body = isvc(rollout=RECREATE)
    await harness.run(body)
    assert condition(body, "Ready")["status"] == "True"  # the service runs: advice, not a failure
    warning = body["status"]["warnings"][0]
    assert warning.startswith("AutoscalerConflict: HorizontalPodAutoscaler llm-hpa scales this service")
    assert [e for e in harness.emitter.events if e[1] == autoscalers.REASON][0][0] == "Warning"
    # a second reconcile keeps the warning and does not repeat the event
    await harness.run(body, trigger="Resumed")
    assert body["status"]["warnings"][0] == warning
    assert harness.emitter.reasons.count(autoscalers.REASON) == 1


@pytest.mark.parametrize(
    ("rollout", "replicas", "found"),
    [
        ({}, 1, [hpa()]),  # Auto: surges or replaces one at a time
        (RECREATE, 1, [hpa(target="other")]),  # another service's autoscaler
        (RECREATE, 1, [hpa(kind="Deployment")]),  # scales a Deployment, not this service
        (RECREATE, 3, [hpa(min_replicas=2)]),  # never down to one replica
        (RECREATE, 1, [hpa(namespace="ns2")]),  # another namespace
    ],
)
async def test_no_warning_without_the_conflict(
    harness: Harness, rollout: dict[str, Any], replicas: int, found: list[dict[str, Any]]
) -> None:
    harness.kube.autoscalers = found
    body = isvc(rollout=rollout, replicas=replicas)
    await harness.run(body)
    assert not [w for w in body["status"]["warnings"] if w.startswith(autoscalers.REASON)]
    assert autoscalers.REASON not in harness.emitter.reasons


async def test_a_refused_hpa_list_is_no_answer_not_a_failure(harness: Harness) -> None:
    harness.kube.autoscaler_error = errors.ApplyFailed("listing horizontalpodautoscalers failed: HTTP 403")
    body = isvc(rollout=RECREATE)
    await harness.run(body)
    assert condition(body, "Ready")["status"] == "True"
    assert autoscalers.REASON not in harness.emitter.reasons
