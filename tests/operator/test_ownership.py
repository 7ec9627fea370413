"""Never adopt what kvpilot does not own (kvpilot.operator.pods.ownership): an object of a wanted name that
another controls is a NameConflict, and nothing of that InferenceService is applied."""

from __future__ import annotations

import copy
import logging
from typing import Any

import kopf
import pytest
from operator_fakes import Harness, condition, isvc

from kvpilot.operator.inferenceservice import drift
from kvpilot.operator.pods import ownership


def _foreign(kind: str, name: str, namespace: str = "ns1", owner: dict[str, Any] | None = None) -> dict:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"their-{name}"}
    if owner is not None:
        meta["ownerReferences"] = [{**owner, "controller": True}]
    return {"kind": kind, "metadata": meta, "spec": {"selector": {"app": "ledger-api"}}}


@pytest.mark.parametrize(
    ("kind", "name", "spec"),
    [
        ("Service", "ledger", {}),
        ("Deployment", "ledger", {}),
        (
            "PersistentVolumeClaim",
            "ledger-model-cache",
            {
                "model": {
                    "id": "meta-llama/Llama-3.1-8B-Instruct",
                    "storage": {"claimTemplate": {"size": "50Gi"}},
                }
            },
        ),
        ("PodDisruptionBudget", "ledger", {"replicas": 2}),
    ],
)
async def test_another_teams_object_is_a_name_conflict_and_nothing_is_applied(
    harness: Harness, kind: str, name: str, spec: dict[str, Any]
) -> None:
    harness.kube.foreign[(kind, "ns1", name)] = _foreign(kind, name)
    body = isvc("ledger", **spec)
    with pytest.raises(kopf.TemporaryError):  # retried: the other object may go away
        await harness.run(body)
    ready = condition(body, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NameConflict")
    said = f"{kind} ns1/{name} already exists and is not kvpilot's (controlled by: no owner)"
    assert said in ready["message"]
    assert "Rename the InferenceService ledger" in ready["message"]
    assert harness.emitter.events[-1][:2] == ("Warning", "NameConflict")
    assert harness.kube.applied == [], "nothing of a conflicting InferenceService may be applied"


async def test_the_message_names_the_other_controller(harness: Harness) -> None:
    other = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "ledger-api", "uid": "u-9"}
    harness.kube.foreign[("Service", "ns1", "ledger")] = _foreign("Service", "ledger", owner=other)
    body = isvc("ledger")
    with pytest.raises(kopf.TemporaryError):
        await harness.run(body)
    assert "(controlled by: Deployment ledger-api)" in condition(body, "Ready")["message"]


async def test_an_older_inference_service_of_the_same_name_is_not_adopted(harness: Harness) -> None:
    old = {"apiVersion": "kvpilot.io/v1alpha1", "kind": "InferenceService", "name": "ledger", "uid": "gone"}
    harness.kube.foreign[("Deployment", "ns1", "ledger")] = _foreign("Deployment", "ledger", owner=old)
    body = isvc("ledger")
    with pytest.raises(kopf.TemporaryError):
        await harness.run(body)
    assert condition(body, "Ready")["reason"] == "NameConflict"


async def test_its_own_objects_are_applied_again_and_read_once(harness: Harness) -> None:
    body = isvc("ledger")
    await harness.run(body)
    first = len(harness.kube.applied)
    reads = harness.kube.object_reads
    assert first >= 2 and reads == first  # one read per object, before the first apply
    await harness.run(body, trigger="resumed")
    assert len(harness.kube.applied) == 2 * first
    assert harness.kube.object_reads == reads, "verified objects are not read again"
    assert condition(body, "Ready")["status"] == "True"


async def test_a_claim_re_made_by_another_team_is_read_again_not_remembered(harness: Harness) -> None:
    """No watch sees a claim deleted and re-made by another team, so a claim is read before every apply: the
    next reconcile finds it foreign and applies nothing (a remembered claim would be adopted and, with the
    InferenceService, garbage-collected)."""
    storage = {"claimTemplate": {"size": "50Gi"}}
    body = isvc("ledger", model={"id": "meta-llama/Llama-3.1-8B-Instruct", "storage": storage})
    await harness.run(body)
    assert condition(body, "Ready")["status"] == "True"
    claim = ("PersistentVolumeClaim", "ns1", "ledger-model-cache")
    harness.kube.foreign[claim] = _foreign("PersistentVolumeClaim", "ledger-model-cache")
    applied = len(harness.kube.applied)
    with pytest.raises(kopf.TemporaryError):
        await harness.run(body, trigger="resumed")
    ready = condition(body, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NameConflict")
    assert "PersistentVolumeClaim ns1/ledger-model-cache" in ready["message"]
    assert len(harness.kube.applied) == applied, "nothing applied onto the other team's claim"


def test_compute_conflict_by_uid_and_without_one() -> None:
    mine = {
        "kind": "Service",
        "metadata": {
            "name": "llm",
            "namespace": "ns1",
            "labels": {"kvpilot.io/inferenceservice": "llm"},
            "ownerReferences": [{"kind": "InferenceService", "name": "llm", "uid": "u1", "controller": True}],
        },
    }
    assert ownership.compute_conflict(mine, None) is None
    assert ownership.compute_conflict(mine, copy.deepcopy(mine)) is None
    stolen = copy.deepcopy(mine)
    stolen["metadata"]["ownerReferences"][0]["uid"] = "u2"
    assert ownership.compute_conflict(mine, stolen) is not None
    no_uid = copy.deepcopy(mine)
    del no_uid["metadata"]["ownerReferences"]
    assert ownership.compute_conflict(no_uid, mine) is None  # an InferenceService of its name controls it
    assert ownership.compute_conflict(no_uid, _foreign("Service", "llm")) is not None


def test_the_memory_of_verified_objects_is_bounded_and_forgets_deleted_ones() -> None:
    memory = ownership.VerifiedOwners(limit=2)
    for i in range(3):
        memory.add(("Service", "ns", f"s{i}", "u"))
    assert ("Service", "ns", "s0", "u") not in memory
    assert ("Service", "ns", "s2", "u") in memory
    memory.forget("Service", "ns", "s2")
    assert ("Service", "ns", "s2", "u") not in memory


async def test_drift_repair_never_touches_an_object_it_does_not_control(harness: Harness) -> None:
    body = isvc()
    await harness.run(body)
    harness.kube.services[("ns1", "llm")] = body
    applied = len(harness.kube.applied)
    theirs = copy.deepcopy(harness.kube.last("Service"))
    other = {"kind": "Deployment", "name": "x", "uid": "u-x", "controller": True}
    theirs["metadata"]["ownerReferences"] = [other]
    theirs["spec"]["selector"] = {"app": "theirs"}
    theirs["metadata"]["managedFields"] = [{"manager": "kubectl", "operation": "Update", "fieldsV1": {}}]
    fields = await drift.apply_repair(
        "Service",
        "MODIFIED",
        theirs,
        kube=harness.kube,
        hub=harness.deps.hub,
        emit=harness.emitter,
        logger=logging.getLogger("test"),
        read_owner=harness.kube.read_inference_service,
        plan_fn=harness.deps.plan_fn,
        owners=harness.deps.owners,
    )
    assert fields == []
    assert len(harness.kube.applied) == applied


async def test_the_closed_loop_never_retunes_onto_a_deployment_another_took(harness: Harness) -> None:
    """The Deployment was deleted and another team made one of the same name: the loop's retune applies
    nothing onto it (a NameConflict Warning instead of the retune), and reads the name again each time."""
    from closed_loop_fakes import LoopHarness, window

    from kvpilot.tuner.loop.policy import Action

    loop = LoopHarness(harness)
    body = isvc(gpu={"count": 1, "product": "H100-SXM"}, tuning={"rolloutDeadlineSeconds": 300})
    await harness.run(body)
    loop.healthy_pods()
    loop.window = window(loop.now + 30)
    await loop.tick(body)
    theirs = _foreign("Deployment", "llm", owner={"kind": "Deployment", "name": "x", "uid": "u-x"})
    harness.kube.foreign[("Deployment", "ns1", "llm")] = theirs
    harness.deps.owners.forget("Deployment", "ns1", "llm")  # what drift repair does on its DELETED event
    applied = len(harness.kube.applied)
    loop.window = window(loop.now + 30, kv=0.97, preempt=1.0, running=64, prompt=3000, output=1000)
    d = await loop.tick(body)
    assert d is not None and d.action == Action.RETUNE, (d.trigger, d.reason)
    assert len(harness.kube.applied) == applied, "nothing applied onto another's Deployment"
    warning = harness.emitter.events[-1]
    assert warning[:2] == ("Warning", "NameConflict") and "Deployment ns1/llm" in warning[2]
    assert harness.kube.foreign[("Deployment", "ns1", "llm")] == theirs
