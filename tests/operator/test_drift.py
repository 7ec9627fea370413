"""Drift repair without a cluster: who changed a field (managedFields) decides, and the repair re-applies."""

from __future__ import annotations

import copy
import logging
from typing import Any

from operator_fakes import Harness, isvc

from kvpilot.operator.clients.kube import FIELD_MANAGER
from kvpilot.operator.inferenceservice import drift
from kvpilot.operator.pods import leader_worker_set as lws

ARGS = drift.MANAGED_FIELDS["Deployment"][3]  # (field, fieldsV1 path) of the vLLM container's args


def _owning(manager: str, *paths: tuple[str, ...], subresource: str | None = None) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for path in paths:
        node = fields
        for key in path:
            node = node.setdefault(key, {})
    entry = {"manager": manager, "operation": "Update", "fieldsV1": fields}
    if subresource:
        entry["subresource"] = subresource
    return entry


def _live(wanted: dict[str, Any], *entries: dict[str, Any]) -> dict[str, Any]:
    live = copy.deepcopy(wanted)
    every = [path for _, path in drift.MANAGED_FIELDS[wanted["kind"]]]
    live["metadata"]["managedFields"] = [_owning(FIELD_MANAGER, *every), *entries]
    return live


def _container(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]["containers"][0]


async def test_a_hand_edit_is_drift_and_kvpilots_own_change_is_not(harness: Harness) -> None:
    body = isvc()
    await harness.run(body)
    wanted = harness.kube.last("Deployment")
    assert ARGS[0] == "spec.template.spec.containers[vllm].args"
    assert drift.compute_drift(_live(wanted), wanted) == []
    edited = _live(wanted, _owning("kubectl-patch", ARGS[1]))
    _container(edited)["args"] = [*_container(wanted)["args"], "--max-num-seqs", "999"]
    (found,) = drift.compute_drift(edited, wanted)
    assert (found.field, found.manager) == (ARGS[0], "kubectl-patch")
    assert "999" in found.describe() and "kubectl-patch" in found.describe()
    # the same value under kvpilot's own manager (a retune applied before status.applied says so): no drift
    retuned = _live(wanted)
    _container(retuned)["args"] = _container(edited)["args"]
    assert drift.compute_drift(retuned, wanted) == []
    # replicas scaled by the autoscaler (kube-controller-manager, scale subresource): not kvpilot's to undo
    scaled = _live(wanted, _owning("kube-controller-manager", ("f:spec", "f:replicas"), subresource="scale"))
    scaled["spec"]["replicas"] = 5
    assert drift.compute_drift(scaled, wanted) == []
    by_hand = _owning("kubectl", ("f:spec", "f:replicas"), subresource="scale")
    scaled["metadata"]["managedFields"].append(by_hand)
    assert [d.field for d in drift.compute_drift(scaled, wanted)] == ["spec.replicas"]


async def test_quantities_the_api_server_rewrote_are_not_drift(harness: Harness) -> None:
    body = isvc(engine={"resources": {"requests": {"cpu": "0.5", "memory": "1024Mi"}}})
    await harness.run(body)
    wanted = harness.kube.last("Deployment")
    path = drift.MANAGED_FIELDS["Deployment"][5]
    live = _live(wanted, _owning("kubectl-edit", path[1]))
    res = _container(live)["resources"]
    res["requests"] = {
        "cpu": "500m",
        "memory": "1Gi",
        "nvidia.com/gpu": "1",
        **{k: v for k, v in res["requests"].items() if k == "ephemeral-storage"},
    }
    res["limits"] = {k: str(v) for k, v in res["limits"].items()}
    assert drift.compute_drift(live, wanted) == []
    res["requests"]["cpu"] = "64"
    assert [d.field for d in drift.compute_drift(live, wanted)] == [path[0]]


async def _repair(
    harness: Harness, event: str | None, live: dict[str, Any], kind: str = "Deployment"
) -> list[str]:
    return await drift.apply_repair(
        kind,
        event,
        live,
        kube=harness.kube,
        hub=harness.deps.hub,
        emit=harness.emitter,
        logger=logging.getLogger("test"),
        read_owner=harness.kube.read_inference_service,
        plan_fn=harness.deps.plan_fn,
        owners=harness.deps.owners,
    )


async def test_a_hand_edit_is_reverted_with_an_event_naming_the_field(harness: Harness) -> None:
    body = isvc()
    await harness.run(body)
    harness.kube.services[("ns1", "llm")] = body
    wanted = harness.kube.last("Deployment")
    edited = _live(wanted, _owning("kubectl-patch", ARGS[1]))
    _container(edited)["args"] = ["--max-num-seqs", "999"]
    before = len(harness.kube.applied)
    assert await _repair(harness, "MODIFIED", edited) == [ARGS[0]]
    assert _container(harness.kube.last("Deployment"))["args"] == _container(wanted)["args"]
    assert len(harness.kube.applied) > before
    (message,) = [m for _, r, m in harness.emitter.events if r == "DriftDetected"]
    assert ARGS[0] in message and "kubectl-patch" in message and "999" in message
    # nothing drifted: nothing applied, no event
    before = len(harness.kube.applied)
    assert await _repair(harness, "MODIFIED", _live(wanted)) == []
    assert len(harness.kube.applied) == before and harness.emitter.reasons.count("DriftDetected") == 1


async def test_a_deleted_child_is_recreated_unless_its_owner_goes(harness: Harness) -> None:
    body = isvc()
    await harness.run(body)
    harness.kube.services[("ns1", "llm")] = body
    service = harness.kube.last("Service")
    harness.kube.applied.clear()
    assert await _repair(harness, "DELETED", service, kind="Service") == ["deleted"]
    assert {m["kind"] for m in harness.kube.applied} >= {"Service", "Deployment"}
    assert harness.emitter.reasons.count("DriftDetected") == 1
    # the owner is being deleted (garbage collection takes the children): nothing is recreated
    harness.kube.applied.clear()
    body["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    assert await _repair(harness, "DELETED", service, kind="Service") == []
    del harness.kube.services[("ns1", "llm")]
    assert await _repair(harness, "DELETED", service, kind="Service") == []
    assert harness.kube.applied == []


async def test_no_repair_until_the_reconciler_applied_the_current_generation(harness: Harness) -> None:
    body = isvc()
    await harness.run(body)
    harness.kube.services[("ns1", "llm")] = body
    service = harness.kube.last("Service")
    body["metadata"]["generation"] = 2  # a spec update the reconciler has not handled yet
    harness.kube.applied.clear()
    assert await _repair(harness, "DELETED", service, kind="Service") == []
    assert harness.kube.applied == []


async def test_a_hand_edit_of_a_group_role_is_drift(harness: Harness) -> None:
    """A LeaderWorkerSet's fields are the leader's and the workers' templates' vLLM container: an edit of the
    workers' args by someone else is drift, named by role; the quantities LWS's webhook rewrote are not."""
    await harness.run(isvc())
    wanted = lws.build_leader_worker_set(harness.kube.last("Deployment"), 2)
    fields = dict(drift.MANAGED_FIELDS["LeaderWorkerSet"])
    worker_args = "spec.leaderWorkerTemplate.workerTemplate.spec.containers[vllm].args"
    assert drift.compute_drift(_live(wanted), wanted) == []
    edited = _live(wanted, _owning("kubectl-edit", fields[worker_args]))
    worker = edited["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    worker["args"] = [a for a in worker["args"] if a != "--headless"]
    (found,) = drift.compute_drift(edited, wanted)
    assert (found.field, found.manager) == (worker_args, "kubectl-edit")
    assert '"--headless"' in found.describe()
    leader_resources = "spec.leaderWorkerTemplate.leaderTemplate.spec.containers[vllm].resources"
    rewritten = _live(wanted, _owning("lws-webhook", fields[leader_resources]))
    leader = rewritten["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    leader["resources"] = {
        b: {k: int(v) if v.isdigit() else v for k, v in q.items()} for b, q in leader["resources"].items()
    }
    assert drift.compute_drift(rewritten, wanted) == []
