"""A dead node is not a failed setting: a pod whose node is NotReady, unreachable or gone (or that the node
lifecycle controller marked or evicted for it) makes the rollout wait, never marks its settings failed, and
sets Degraded=True ReplicaLost naming the pod and the node."""

from __future__ import annotations

from typing import Any

import pytest
from closed_loop_fakes import LoopHarness, pod, rfc3339, window
from operator_fakes import H100_LABELS, Harness, condition, isvc, node_object

from kvpilot.operator.pods import pod_summary, pod_view
from kvpilot.tuner.loop.policy import Action, Trigger
from kvpilot.tuner.types import EngineSettings

ARGS = ["--model", "m", "--max-num-seqs", "64"]
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 786.00 MiB."


def on_node(
    p: dict[str, Any], node: str, *conds: dict[str, Any], reason: str | None = None
) -> dict[str, Any]:
    p["spec"]["nodeName"] = node
    p["status"]["conditions"] = list(conds)
    if reason is not None:
        p["status"]["reason"] = reason
    return p


def node(name: str, ready: str) -> dict[str, Any]:
    n = node_object(name, H100_LABELS)
    n["status"]["conditions"] = [{"type": "Ready", "status": ready}]
    return n


@pytest.mark.parametrize(
    ("conds", "reason"),
    [
        ([{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}], None),
        ([{"type": "Ready", "status": "Unknown"}], None),
        ([{"type": "Ready", "status": "False", "reason": "NodeNotReady"}], None),
        ([], "NodeLost"),
    ],
)
def test_the_pod_itself_says_its_node_is_lost(conds: list[dict[str, Any]], reason: str | None) -> None:
    view = pod_view.build_pod_view(
        on_node(pod("llm-5d8f7c-00000", ARGS, ready=False), "n1", *conds, reason=reason)
    )
    assert view.node_lost and view.node == "n1"


def test_a_pod_not_ready_for_its_own_reasons_is_not_lost() -> None:
    p = on_node(
        pod("llm-5d8f7c-00000", ARGS, ready=False),
        "n1",
        {"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
    )
    assert not pod_view.build_pod_view(p).node_lost


def test_nodes_not_ready_unknown_or_gone_make_their_waiting_pods_lost() -> None:
    views = [
        pod_view.build_pod_view(on_node(pod(f"llm-5d8f7c-0000{i}", ARGS, ready=i == 3), n))
        for i, n in enumerate(["down", "unreachable", "deleted", "down", "fine"])
    ]
    assert pod_view.needs_node_check(views)
    nodes = [node("down", "False"), node("unreachable", "Unknown"), node("fine", "True")]
    lost = [v.node_lost for v in pod_view.with_lost_nodes(views, nodes)]
    assert lost == [True, True, True, False, False]  # a Ready pod is not lost; a Ready node loses none


def test_a_lost_pod_is_no_evidence_against_its_settings_and_degrades_the_service() -> None:
    current = pod_view.build_pod_view(pod("llm-5d8f7c-00000", ARGS)).settings
    assert isinstance(current, EngineSettings)
    crashed = on_node(
        pod("llm-5d8f7c-00001", ARGS, ready=False, restarts=1, message=OOM, finished=100.0),
        "gpu-7",
        {"type": "DisruptionTarget", "status": "True"},
    )
    views = [pod_view.build_pod_view(pod("llm-5d8f7c-00000", ARGS)), pod_view.build_pod_view(crashed)]
    summary = pod_summary.compute_pod_summary(views, current, replicas=2)
    assert summary.restarts == () and summary.not_started and not summary.ready
    serving = pod_summary.compute_serving(views, current)
    assert serving.available and serving.degraded_reason == "ReplicaLost"
    assert "llm-5d8f7c-00001" in serving.message and "gpu-7" in serving.message


async def test_a_replace_rollout_whose_new_pod_lost_its_node_waits_and_reports_degraded(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replicas, Replace: the new pod is bound to a node that goes NotReady before it ever served. Past
    the deadline the settings are not failed (no failedSettings, no rollback); Degraded=True ReplicaLost."""
    loop = LoopHarness(harness)
    body = isvc(
        gpu={"count": 1, "product": "H100-SXM"},
        replicas=2,
        rollout={"strategy": "Replace"},
        tuning={"rolloutDeadlineSeconds": 300},
    )
    await harness.run(body)
    loop.healthy_pods(2)
    loop.window = window(loop.now + 30)
    await loop.tick(body)
    loop.window = window(loop.now + 30, kv=0.97, preempt=1.0, running=64, prompt=3000, output=1000)
    d = await loop.tick(body)
    assert d is not None and (d.action, d.trigger) == (Action.RETUNE, Trigger.KV_PRESSURE)
    old = loop.pods.pods[0]
    new = on_node(pod("llm-9a8b7c-00000", loop.deployment_args(), ready=False), "node-1")
    new["status"]["startTime"] = rfc3339(loop.now + 10)
    loop.pods.pods = [old, new]
    monkeypatch.setattr(harness.kube, "list_nodes", lambda: [node("node-1", "False")])
    for _ in range(4):  # past the deadline, and on
        d = await loop.tick(body, advance=200)
        assert d is not None and d.failed is None and d.action != Action.ROLLBACK, d
    assert d.trigger == Trigger.ROLLOUT_PENDING and "node was lost" in d.reason
    st = body["status"]
    assert not st.get("failedSettings") and st["rollout"] is not None
    degraded = condition(body, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ReplicaLost")
    assert "llm-9a8b7c-00000" in degraded["message"] and "node-1" in degraded["message"]
    ready = condition(body, "Ready")  # no replica of the applied settings serves: the lost one is why
    assert (ready["status"], ready["reason"]) == ("False", "ReplicaLost")
