"""Retunes on a full GPU pool, without a cluster: the closed loop chooses the rollout strategy from the
fake cluster's spare GPUs, holds when nothing may roll, and measures the restart it costs."""

from __future__ import annotations

from typing import Any

import pytest
from closed_loop_fakes import LoopHarness, pod, rfc3339, window
from operator_fakes import H100_LABELS, Harness, condition, gpu_pod, isvc, node_object

from kvpilot.operator.inferenceservice import handlers
from kvpilot.operator.pods.rollout_strategy import HELD_MESSAGE
from kvpilot.tuner.loop.policy import Action, Trigger

OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB. GPU 0 has a total capacity of "
    "79.11 GiB of which 140.75 MiB is free."
)


@pytest.fixture
async def loop(harness: Harness) -> LoopHarness:
    return LoopHarness(harness)


async def applied(harness: Harness, replicas: int = 1, full: bool = True, **spec: Any) -> dict[str, Any]:
    """A service on the fake cluster's one H100 node (8 GPUs); ``full``: other pods hold all eight."""
    if full:
        harness.kube.pods = [gpu_pod("node-1", 8)]
    body = isvc(gpu={"count": 1, "product": "H100-SXM"}, replicas=replicas, **spec)
    await harness.run(body)
    return body


def strategy(harness: Harness) -> dict[str, Any]:
    return dict(harness.kube.last("Deployment")["spec"]["strategy"])


def deep_queue(loop: LoopHarness) -> None:
    """As many requests wait as run: raising the sequence limit is worth even a full restart."""
    loop.window = window(loop.now + 30, kv=0.3, waiting=64, running=64, prompt=300, output=200)


async def test_one_replica_on_a_full_pool_holds_with_the_reason_and_the_recommendation(
    harness: Harness, loop: LoopHarness
) -> None:
    body = await applied(harness)
    loop.healthy_pods()
    deep_queue(loop)
    before = len(harness.kube.applied)
    d = await loop.tick(body)
    assert d is not None and (d.action, d.trigger) == (Action.HOLD, Trigger.IDLE_CAPACITY)
    assert len(harness.kube.applied) == before  # nothing rolled
    st = body["status"]
    assert HELD_MESSAGE in d.reason and st["recommendation"]["reason"] == d.reason
    assert st["recommendation"]["settings"]["maxNumSeqs"] > st["applied"]["maxNumSeqs"]
    assert st["history"][-1]["to"]["maxNumSeqs"] == st["recommendation"]["settings"]["maxNumSeqs"]
    cond = condition(body, "RolloutInProgress")
    assert (cond["status"], cond["reason"]) == ("False", "Held") and HELD_MESSAGE in cond["message"]
    assert [m for _, r, m in harness.emitter.events if r == "Held" and HELD_MESSAGE in m]
    assert st.get("failedSettings", []) == []


async def test_two_replicas_on_a_full_pool_are_replaced_one_at_a_time(
    harness: Harness, loop: LoopHarness
) -> None:
    body = await applied(harness, replicas=2)
    loop.healthy_pods(2)
    deep_queue(loop)
    d = await loop.tick(body)
    assert d is not None and d.action == Action.RETUNE
    assert strategy(harness)["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    rollout = body["status"]["rollout"]
    assert rollout["strategy"] == "Replace" and "replacing 1 of 2 replicas at a time" in rollout["reason"]
    retuned = next(m for _, r, m in harness.emitter.events if r == "Retuned")
    assert "[rollout Replace: " in retuned


async def test_allow_downtime_recreates_one_replica(harness: Harness, loop: LoopHarness) -> None:
    body = await applied(harness, rollout={"allowDowntime": True})
    loop.healthy_pods()
    deep_queue(loop)
    d = await loop.tick(body)
    assert d is not None and d.action == Action.RETUNE
    assert strategy(harness) == {"type": "Recreate"}
    assert body["status"]["rollout"]["strategy"] == "Recreate"


async def test_a_spare_gpu_surges(harness: Harness, loop: LoopHarness) -> None:
    body = await applied(harness, full=False)
    loop.healthy_pods()
    deep_queue(loop)
    await loop.tick(body)
    assert strategy(harness)["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert body["status"]["rollout"]["strategy"] == "Surge"


async def test_a_crash_looping_pod_is_replaced_without_a_spare_gpu(
    harness: Harness, loop: LoopHarness
) -> None:
    body = await applied(harness)
    loop.healthy_pods(ready=False, restarts=3, message=OOM, finished=loop.now + 10, crash_loop=True)
    d = await loop.tick(body)
    assert d is not None and (d.action, d.trigger) == (Action.RETUNE, "CudaOOM")
    assert strategy(harness)["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert "no replica serves (CrashLoopBackOff)" in body["status"]["rollout"]["reason"]


def started(p: dict[str, Any], at: float, ready_at: float | None = None) -> dict[str, Any]:
    p["status"]["startTime"] = rfc3339(at)
    if ready_at is not None:
        ready = {"type": "Ready", "status": "True", "lastTransitionTime": rfc3339(ready_at)}
        p["status"]["conditions"] = [ready]
    return p


async def test_the_deadline_counts_from_the_new_pod_start_and_startup_is_measured(
    harness: Harness, loop: LoopHarness
) -> None:
    body = await applied(harness, full=False)
    loop.healthy_pods()
    loop.pods.pods = [started(p, loop.now - 600, ready_at=loop.now - 480) for p in loop.pods.pods]
    await loop.tick(body)
    assert body["status"]["startupSeconds"] == 120.0  # start to Ready of the pod that serves
    deep_queue(loop)
    await loop.tick(body)
    rollout = body["status"]["rollout"]
    patched_at = loop.now
    # the new pod waited 200 s for a node, then started: the deadline moves to its start + 900 s
    new = started(pod("llm-9a8b7c-00000", loop.deployment_args(), ready=False), patched_at + 200)
    loop.pods.pods = [*loop.pods.pods, new]
    await loop.tick(body)
    assert body["status"]["rollout"]["deadline"] == rfc3339(patched_at + 200 + 900)
    assert rollout["deadline"] == rfc3339(patched_at + 900)


async def test_schedulable_says_why_no_node_could_take_the_pod(
    harness: Harness, loop: LoopHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = await applied(harness, full=False)
    loop.healthy_pods(ready=False)
    for p in loop.pods.pods:
        p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    tainted = [node_object("node-1", H100_LABELS, taints=[{"key": "team", "effect": "NoSchedule"}])]
    monkeypatch.setattr(harness.kube, "list_nodes", lambda: tainted)
    await loop.tick(body)
    cond = condition(body, "Schedulable")
    assert (cond["status"], cond["reason"]) == ("False", "TaintsNotTolerated")
    # the node's taint is removed: the next tick sees it (re-checked while False)
    monkeypatch.setattr(harness.kube, "list_nodes", lambda: [node_object("node-1", H100_LABELS)])
    await loop.tick(body)
    assert condition(body, "Schedulable")["status"] == "True"


# --- the reconciler's side: the PodDisruptionBudget and its own changes of the pods ----------------------


async def test_two_replicas_get_a_pod_disruption_budget_owned_by_the_service(harness: Harness) -> None:
    body = await applied(harness, replicas=2, full=False, rollout={"maxUnavailable": 1})
    pdb = harness.kube.last("PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == harness.kube.last("Deployment")["spec"]["selector"]
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]
    one = Harness()
    await applied(one, replicas=1, full=False)
    assert not [m for m in one.kube.applied if m["kind"] == "PodDisruptionBudget"]


async def test_a_spec_change_on_a_full_pool_rolls_out_like_a_retune(harness: Harness) -> None:
    body = await applied(harness, replicas=2)
    assert strategy(harness)["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}  # a create: no pods
    await harness.run(body, trigger=handlers.SPEC_CHANGED)
    # the cluster-wide pod list holds none of this service's pods: they serve nothing, so nothing is lost
    assert strategy(harness)["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 2}
    harness.kube.pods.append(ready_own_pod(body))
    await harness.run(body, trigger=handlers.SPEC_CHANGED)
    assert strategy(harness)["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def ready_own_pod(body: dict[str, Any]) -> dict[str, Any]:
    p = pod("llm-5d8f7c-00000", [], ready=True)
    p["metadata"]["namespace"] = body["metadata"]["namespace"]
    return p


async def test_schedulable_in_mode_off_too(
    harness: Harness, loop: LoopHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = await applied(harness, full=False, tuning={"mode": "Off"})
    loop.healthy_pods(ready=False)
    for p in loop.pods.pods:
        p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    monkeypatch.setattr(harness.kube, "list_nodes", lambda: [])
    await loop.tick(body)
    cond = condition(body, "Schedulable")
    assert (cond["status"], cond["reason"]) == ("False", "NoMatchingNode")
    products = "NVIDIA-H100-80GB-HBM3, NVIDIA-H100-SXM5-80GB"
    assert cond["message"] == f"no node with nvidia.com/gpu.product in ({products})"


async def test_a_tick_that_changes_nothing_sends_no_merge_patch(harness: Harness, loop: LoopHarness) -> None:
    """At 1000 services an unchanged field re-sent each tick is a PATCH per service per tick."""
    import logging

    import kopf

    from kvpilot.operator.inferenceservice import closed_loop

    body = await applied(harness, full=False)
    loop.healthy_pods(ready=False)
    for p in loop.pods.pods:
        p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    await loop.tick(body)
    assert body["status"]["replicas"] == 1 and body["status"]["readyReplicas"] == 0
    loop.now += 30
    patch = kopf.Patch()
    await closed_loop.run_once(
        body=body,
        spec=body["spec"],
        meta=body["metadata"],
        status=body["status"],
        patch=patch,
        logger=logging.getLogger("test"),
        deps=loop.deps,
    )
    body["status"] = loop.land(body, patch)
    assert dict(patch) == {} and not patch.fns  # kopf sends nothing ...
    assert harness.kube.take_status_patches("ns1", "llm") == []  # ... and neither does the tick itself
    loop.healthy_pods(ready=True)
    await loop.tick(body)
    assert body["status"]["readyReplicas"] == 1  # a change is still written
