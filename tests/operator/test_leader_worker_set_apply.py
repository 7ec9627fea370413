"""The operator applies a LeaderWorkerSet for a replica over several nodes (issue 28), and reads its groups.

Through :func:`kvpilot.operator.inferenceservice.handlers.reconcile` with the in-memory cluster: the kind is
applied only where the API server serves it (``LeaderWorkerSetNotInstalled`` otherwise), under the same
ownership rules as a Deployment; the group's pods are the service's (a worker's crash counts, a group is one
replica).
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest
from operator_fakes import H100_LABELS, Harness, condition, isvc

from kvpilot.operator.pods import leader_worker_set as lws
from kvpilot.operator.pods import pod_summary, pod_view, workloads
from kvpilot.tuner.loop import RestartKind
from kvpilot.tuner.types import EngineSettings

TWO_NODES = {"count": 8, "product": "H100-SXM", "nodesPerReplica": 2}


def group_body() -> dict[str, Any]:
    return isvc(gpu=dict(TWO_NODES))


async def test_without_the_crd_nothing_is_applied_and_ready_names_what_to_install(harness: Harness) -> None:
    body = group_body()
    with pytest.raises(kopf.TemporaryError):
        await harness.run(body)
    ready = condition(body, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "LeaderWorkerSetNotInstalled")
    assert "install LeaderWorkerSet (sigs.k8s.io/lws" in ready["message"]
    assert "multiNode.enabled=true" in ready["message"]
    assert harness.kube.applied == []


async def test_with_the_crd_the_group_is_applied_instead_of_a_deployment(harness: Harness) -> None:
    harness.kube.served_kinds.add(lws.KIND)
    body = group_body()
    await harness.run(body)
    kinds = [m["kind"] for m in harness.kube.applied]
    assert kinds == ["Service", "LeaderWorkerSet"]
    service, group = harness.kube.applied
    assert service["spec"]["selector"][lws.WORKER_INDEX_LABEL] == "0"
    assert group["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert group["metadata"]["ownerReferences"][0]["uid"] == "uid-llm"
    assert group["spec"]["leaderWorkerTemplate"]["size"] == 2
    # the closed loop finds the group's pods by the service's selector: the templates carry its labels
    for role in ("leaderTemplate", "workerTemplate"):
        labels = group["spec"]["leaderWorkerTemplate"][role]["metadata"]["labels"]
        assert workloads.build_selector("llm").items() <= labels.items()
    assert condition(body, "Ready")["status"] == "True"


async def test_two_groups_get_a_disruption_budget_over_all_their_pods(harness: Harness) -> None:
    harness.kube.served_kinds.add(lws.KIND)
    body = isvc(gpu=dict(TWO_NODES), replicas=2)
    await harness.run(body)
    assert [m["kind"] for m in harness.kube.applied] == ["Service", lws.KIND, "PodDisruptionBudget"]
    budget = harness.kube.applied[-1]["spec"]
    assert budget == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": workloads.build_selector("llm")},
        "unhealthyPodEvictionPolicy": "AlwaysAllow",  # a group that serves nothing never blocks a drain
    }


async def test_another_teams_leader_worker_set_of_that_name_is_a_conflict(harness: Harness) -> None:
    harness.kube.served_kinds.add(lws.KIND)
    harness.kube.foreign[(lws.KIND, "ns1", "llm")] = {
        "kind": lws.KIND,
        "metadata": {"name": "llm", "namespace": "ns1"},
    }
    body = group_body()
    with pytest.raises(kopf.TemporaryError):
        await harness.run(body)
    assert condition(body, "Ready")["reason"] == "NameConflict"
    assert "LeaderWorkerSet ns1/llm already exists" in condition(body, "Ready")["message"]
    assert harness.kube.applied == []


async def test_an_update_surges_a_whole_group_only_where_the_nodes_hold_one(harness: Harness) -> None:
    harness.kube.served_kinds.add(lws.KIND)
    body = group_body()
    await harness.run(body)  # the pool: one L4 node, one 8 x H100 node

    def rolled(generation: int) -> dict[str, Any]:
        body["metadata"]["generation"] = generation
        body["spec"]["replicas"] = generation
        return body

    def last_group() -> dict[str, Any]:
        return next(m for m in reversed(harness.kube.applied) if m["kind"] == lws.KIND)

    await harness.run(rolled(2), trigger="SpecChanged")
    rolling = last_group()["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]
    assert (rolling["maxSurge"], rolling["maxUnavailable"]) == (0, 2)  # no spare group: Auto recreates
    harness.kube.nodes.append(dict(H100_LABELS))  # a second 8 x H100 node: a whole group's room
    await harness.run(rolled(3), trigger="SpecChanged")
    group = last_group()
    assert group["kind"] == lws.KIND and group["spec"]["replicas"] == 3
    rolling = group["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]
    assert (rolling["maxSurge"], rolling["maxUnavailable"]) == (1, 0)


def group_pod(name: str, index: str, owner: str, *, ready: bool = True, message: str = "") -> dict[str, Any]:
    """A pod as LWS makes it: its set's labels, a StatefulSet controller, the worker flags in its args."""
    terminated = (
        {
            "lastState": {"terminated": {"reason": "Error", "exitCode": 1, "message": message}},
            "restartCount": 1,
        }
        if message
        else {}
    )
    return {
        "metadata": {
            "name": name,
            "namespace": "ns1",
            "labels": {
                **workloads.build_selector("llm"),
                lws.NAME_LABEL: "llm",
                lws.WORKER_INDEX_LABEL: index,
            },
            "ownerReferences": [{"kind": "StatefulSet", "name": owner, "controller": True}],
        },
        "spec": {"containers": [{"name": "vllm", "args": ["m", "--max-num-seqs", "64", "--headless"]}]},
        "status": {"containerStatuses": [{"name": "vllm", "ready": ready, **terminated}]},
    }


def test_the_groups_pods_are_the_services_and_a_group_is_one_replica() -> None:
    pods = [
        group_pod("llm-0", "0", "llm"),
        group_pod("llm-0-1", "1", "llm-0"),
        group_pod("llm-1", "0", "llm", ready=False),
        group_pod("llm-1-1", "1", "llm-1"),
    ]
    assert all(pod_view.owned_by(p, "llm") for p in pods)
    assert not any(pod_view.owned_by(p, "ll") for p in pods)  # a set named like a prefix is another's
    foreign = {**pods[0], "metadata": {**pods[0]["metadata"], "ownerReferences": []}}
    assert not pod_view.owned_by(foreign, "llm")
    views = [pod_view.build_pod_view(p) for p in pods]
    serving = pod_summary.compute_serving(views, EngineSettings(max_num_seqs=64))
    assert (serving.replicas, serving.ready_replicas, serving.available) == (2, 1, True)


def test_a_workers_nccl_timeout_is_the_groups_restart_and_not_a_kv_failure() -> None:
    text = (
        "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran "
        "for 600010 milliseconds before timing out."
    )
    views = [
        pod_view.build_pod_view(group_pod("llm-0", "0", "llm")),
        pod_view.build_pod_view(group_pod("llm-0-1", "1", "llm-0", message=text)),
    ]
    summary = pod_summary.compute_pod_summary(views, EngineSettings(max_num_seqs=64), replicas=1)
    (restart,) = summary.restarts
    assert (restart.pod, restart.cause.kind) == ("llm-0-1", RestartKind.DISTRIBUTED_TIMEOUT)
    assert summary.ready  # the leader serves; the worker is no replica of its own


def test_the_workload_value_reads_both_kinds_alike(harness: Harness) -> None:
    body = isvc(gpu={"count": 8, "product": "H100-SXM"}, replicas=2)
    deployment = next(m for m in _applied(harness, body) if m["kind"] == "Deployment")
    harness.kube.served_kinds.add(lws.KIND)
    group = next(m for m in _applied(harness, group_body()) if m["kind"] == lws.KIND)
    one, many = workloads.read_workload(deployment), workloads.read_workload(group)
    assert (one.kind, one.replicas, one.group_size) == ("Deployment", 2, 1)
    assert (many.kind, many.replicas, many.group_size) == (lws.KIND, 1, 2)
    assert one.selector == workloads.build_selector("llm")
    assert many.selector == {lws.NAME_LABEL: "llm"}  # what LWS puts on each pod of the set
    assert one.pod_labels == many.pod_labels  # the closed loop finds both kinds' pods by the same labels
    assert [v["name"] for v in many.pod_template["spec"]["volumes"]] == [
        v["name"] for v in one.pod_template["spec"]["volumes"]
    ]
    with pytest.raises(ValueError, match="Service is not a workload kind"):
        workloads.read_workload({"kind": "Service", "metadata": {"name": "llm"}, "spec": {}})


def _applied(harness: Harness, body: dict[str, Any]) -> list[dict[str, Any]]:
    harness.kube.applied.clear()
    asyncio.run(harness.run(body))
    return list(harness.kube.applied)
