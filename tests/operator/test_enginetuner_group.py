"""An EngineTuner whose target is a LeaderWorkerSet another stack made: a replica is a group of pods over
nodes that serve one engine. Discovery reads the leader's command and the group's size, the plan is the
owner's tensor x pipeline layout over the group's GPUs, the webhook tunes the leader and the workers alike,
and Auto replaces a whole group by evicting its leader. The in-memory API of test_enginetuner and the real
planner."""

from __future__ import annotations

import copy
from typing import Any

import kopf
import pytest
from operator_fakes import H100_LABELS, lws_group_pod, node_object
from test_enginetuner import NS, FakeTargetKube, cond, crashed, run

from kvpilot.operator.enginetuner import target, target_eviction, target_webhook
from kvpilot.operator.pods import group_crashes, leader_worker_set, pod_cache, workloads
from kvpilot.operator.status.events import RecordingEmitter
from kvpilot.tuner import vllm
from kvpilot.tuner.types import EngineSettings
from kvpilot.tuner.vllm import command as vllm_command

MODEL = "meta-llama/Llama-3.1-70B-Instruct"
LWS = "big"
# vLLM's multiprocessing over nodes (no Ray): the same command on every node, the workers headless.
COMMON = [MODEL, "--tensor-parallel-size", "4", vllm.PIPELINE_PARALLEL_FLAG, "2", vllm.NNODES_FLAG, "2"]
ADDRESS = [vllm.MASTER_ADDR_FLAG, leader_worker_set.LEADER_ADDRESS]
LEADER = ["vllm", "serve", *COMMON, vllm.NODE_RANK_FLAG, "0", *ADDRESS]
WORKER = ["vllm", "serve", *COMMON, vllm.NODE_RANK_FLAG, "1", *ADDRESS, vllm.HEADLESS_FLAG]
RAY_WORKER = ["bash", "-c", "ray start --block --address=$(LWS_LEADER_ADDRESS):6379"]


def _template(command: list[str]) -> dict[str, Any]:
    container = {
        "name": "vllm",
        "image": "vllm/vllm-openai:v0.33.0",
        "command": list(command),
        "resources": {"limits": {"nvidia.com/gpu": 4}},
    }
    return {"metadata": {"labels": {"app": LWS}}, "spec": {"containers": [container]}}


def leader_worker_set_of(worker: list[str] = WORKER, size: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": LWS, "namespace": NS},
        "spec": {
            "replicas": 2,
            "leaderWorkerTemplate": {
                "size": size,
                "leaderTemplate": _template(LEADER),
                "workerTemplate": _template(worker),
            },
        },
    }


def group_pod(lws: dict[str, Any], group: int, index: int, *, crash: bool = False) -> dict[str, Any]:
    """A vLLM pod as LWS makes it (:func:`operator_fakes.lws_group_pod`)."""
    return lws_group_pod(lws, group, index, container="vllm", crash=crash)


def group_tuner(mode: str = "Recommend") -> dict[str, Any]:
    return {
        "apiVersion": "kvpilot.io/v1alpha1",
        "kind": "EngineTuner",
        "metadata": {"name": "t", "namespace": NS, "generation": 1, "uid": "u1"},
        "spec": {"targetRef": {"kind": "LeaderWorkerSet", "name": LWS}, "updateMode": mode},
        "status": {},
    }


@pytest.fixture
def kube() -> FakeTargetKube:
    k = FakeTargetKube()
    lws = leader_worker_set_of()
    k.workloads[(NS, "LeaderWorkerSet", LWS)] = lws
    k.nodes = [node_object(f"h100-{g}-{i}", H100_LABELS) for g in range(2) for i in range(2)]
    k.pods = [group_pod(lws, g, i) for g in range(2) for i in range(2)]
    return k


async def test_a_group_is_discovered_from_its_leader_and_planned_over_its_nodes(kube: FakeTargetKube) -> None:
    body = group_tuner()
    await run(body, kube, RecordingEmitter())
    st = body["status"]
    assert cond(body, "Ready")["reason"] == "Recommending", st["conditions"]
    assert st["discovered"]["model"] == MODEL
    assert st["discovered"]["gpuCount"] == 4  # per pod: tensor x pipeline parallel 4 x 2 over 2 nodes
    assert st["discovered"]["pods"] == 4  # both groups, leaders and workers
    # the budget is the engine's over the group's 8 GPUs: the 70B's ~131 GiB of bf16 weights over 8, not 4
    weights = st["budget"]["weightsGiB"]
    assert 14 < weights < 18, weights
    assert st["recommendation"]["settings"].get("tensorParallelSize", 4) == 4  # the owner's layout stays


async def test_the_webhook_tunes_the_leaders_and_the_workers_alike(kube: FakeTargetKube) -> None:
    body = group_tuner("Initial")
    await run(body, kube, RecordingEmitter())
    index = target_webhook.index_tuner(NS, "t", body["spec"], body["status"], body["metadata"])
    assert index is not None
    ((key, actuation),) = index.items()
    assert key == (NS, "LeaderWorkerSet", LWS)
    lookup = {k: [v] for k, v in index.items()}
    lws = kube.workloads[key]
    for index_in_group in (0, 1):
        pod = group_pod(lws, 1, index_in_group)
        found = target_webhook.compute_pod_patch(pod, NS, lookup)
        assert found is not None, pod["metadata"]["name"]
        (c,) = found[0]
        parsed = vllm_command.find_vllm_command(c["command"], [])
        assert parsed is not None
        settings = vllm_command.compute_command_settings(parsed)
        assert target.tuned_part(settings) == target.tuned_part(actuation.settings)
        assert vllm.NODE_RANK_FLAG in c["command"] and vllm.NNODES_FLAG in c["command"]  # the owner's layout
    # a pod of another set, or one no StatefulSet of the set controls, is left alone
    stranger = group_pod(lws, 0, 1)
    stranger["metadata"]["labels"][leader_worker_set.NAME_LABEL] = "other"
    assert target_webhook.compute_pod_patch(stranger, NS, lookup) is None
    forged = group_pod(lws, 0, 1)
    forged["metadata"]["ownerReferences"] = [{"kind": "StatefulSet", "name": "mine", "controller": True}]
    assert target_webhook.compute_pod_patch(forged, NS, lookup) is None


REC = EngineSettings(max_model_len=8192, max_num_seqs=32, gpu_memory_utilization=0.9)


def _tuned(pod: dict[str, Any]) -> dict[str, Any]:
    (c,) = pod["spec"]["containers"]
    found = vllm_command.find_vllm_command(c["command"], [])
    assert found is not None
    command, _ = vllm_command.rewrite_tuned_flags(c["command"], [], found, REC)
    c["command"] = command
    return pod


def test_a_group_is_replaced_by_evicting_its_leader() -> None:
    lws = leader_worker_set_of()
    group0 = [_tuned(group_pod(lws, 0, i)) for i in range(2)]
    group1 = [_tuned(group_pod(lws, 1, 0)), group_pod(lws, 1, 1)]  # only the worker still runs the old
    stale = target.compute_stale_pods([*group0, *group1], "vllm", REC)
    assert [p["metadata"]["name"] for p in stale] == ["big-1"]  # its leader: LWS recreates the group
    victim, _ = target_eviction.compute_eviction(
        [*group0, *group1], "vllm", REC, now=1.8e9, last_eviction=None, interval_s=30, schedulable=True
    )
    assert victim == "big-1"
    assert target.compute_stale_pods([*group0, *(_tuned(p) for p in group1)], "vllm", REC) == []


def test_a_crash_looping_worker_has_its_group_replaced_at_once() -> None:
    lws = leader_worker_set_of()
    ok = [group_pod(lws, 0, i) for i in range(2)]
    crashing = [group_pod(lws, 1, 0), group_pod(lws, 1, 1, crash=True)]
    victim, why = target_eviction.compute_eviction(
        [*ok, *crashing], "vllm", REC, now=1.8e9, last_eviction=1.8e9 - 1, interval_s=30, schedulable=True
    )
    assert victim == "big-1" and "crash-loops" in why  # not waiting for the interval or for readiness


def test_ray_workers_run_no_vllm_and_are_never_stale() -> None:
    lws = leader_worker_set_of(worker=RAY_WORKER)
    pods = [_tuned(group_pod(lws, 0, 0)), group_pod(lws, 0, 1)]
    assert not target.runs_vllm(pods[1], "vllm")
    assert target.compute_stale_pods(pods, "vllm", REC) == []


@pytest.mark.parametrize(
    ("extra", "size", "message"),
    [
        (["--data-parallel-size", "2"], 2, "data-parallel engines"),
        ([], 3, "does not split over the group's 3 nodes"),
    ],
)
async def test_a_layout_kvpilot_does_not_tune_in_a_target_is_named(
    kube: FakeTargetKube, extra: list[str], size: int, message: str
) -> None:
    lws = leader_worker_set_of(size=size)
    lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["command"] += extra
    kube.workloads[(NS, "LeaderWorkerSet", LWS)] = lws
    body = group_tuner()
    with pytest.raises(kopf.TemporaryError):  # retried: the owner may change the set
        await run(body, kube, RecordingEmitter())
    discovered = cond(body, "Discovered")
    assert discovered["status"] == "False" and message in discovered["message"], discovered


async def test_a_missing_set_says_lws_must_be_installed(kube: FakeTargetKube) -> None:
    kube.workloads.clear()
    body = group_tuner()
    with pytest.raises(kopf.TemporaryError):
        await run(body, kube, RecordingEmitter())
    found = cond(body, "TargetFound")
    assert found["status"] == "False" and "LeaderWorkerSet, sigs.k8s.io/lws, is installed" in found["message"]


def _admitted(body: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` as the webhook admits it (with the status' recommendation)."""
    index = target_webhook.index_tuner(NS, "t", body["spec"], body["status"], body["metadata"])
    assert index is not None
    found = target_webhook.compute_pod_patch(pod, NS, {k: [v] for k, v in index.items()})
    assert found is not None
    pod["spec"]["containers"] = found[0]
    return pod


async def test_a_workers_crash_outlives_the_group_lws_recreates(
    kube: FakeTargetKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LWS deletes a group the moment a pod restarts (RecreateGroupOnPodRestart): the target pods' watch
    files the worker's CUDA OOM as it passes, and the next reconcile, which finds only the new group, still
    lowers the recommendation (a crash remedy) instead of letting every new group crash the same way."""
    monkeypatch.setattr(group_crashes, "TARGET_CRASHES", group_crashes.GroupCrashes())  # a fresh memory
    now = 1.8e9
    lws = kube.workloads[(NS, "LeaderWorkerSet", LWS)]
    kube.pods = [group_pod(lws, 0, i) for i in range(2)]  # one group, the owner's settings
    body, emitter = group_tuner("Initial"), RecordingEmitter()
    await run(body, kube, emitter, now=now)
    planned = body["status"]["recommendation"]["settings"]
    leader, worker = (_admitted(body, group_pod(lws, 0, i)) for i in range(2))
    worker["metadata"]["uid"] = "w-1"
    kube.pods = [leader, worker]
    await run(body, kube, emitter, now=now + 30)  # the group runs the recommendation, Ready

    crash = crashed(copy.deepcopy(worker), now + 60)
    labels = crash["metadata"]["labels"]
    pod_cache.file_target_crash(NS, labels, crash)  # as the watch delivers it
    pod_cache.file_target_crash("elsewhere", labels, crash)  # another namespace's set of that name
    kube.pods = [_admitted(body, group_pod(lws, 0, i)) for i in range(2)]  # LWS's new group, no restarts
    for i, pod in enumerate(kube.pods):
        pod["metadata"]["uid"] = f"new-{i}"
    await run(body, kube, emitter, now=now + 90)
    st = body["status"]
    *_, last = st["history"]
    assert (last["action"], last["trigger"]) == ("Retuned", "CudaOOM"), st["history"]
    lowered = st["recommendation"]["settings"]
    assert lowered["gpuMemoryUtilization"] < planned["gpuMemoryUtilization"]
    assert st["discovered"]["pods"] == 2  # the gone worker is evidence, not a pod


def test_only_sets_kvpilot_did_not_make_are_filed_as_targets() -> None:
    assert pod_cache.TARGET_GROUP_LABELS[leader_worker_set.NAME_LABEL] is kopf.PRESENT
    assert pod_cache.TARGET_GROUP_LABELS[workloads.INSTANCE_LABEL] is kopf.ABSENT


@pytest.mark.parametrize("part", [LWS, f"{LWS}-0"])
async def test_a_statefulset_of_a_group_is_refused_with_the_set_to_target(
    kube: FakeTargetKube, part: str
) -> None:
    """An EngineTuner on the leaders' StatefulSet (``<set>``) or one group's workers' (``<set>-<group>``)
    would tune some of a group's ranks and not the others: Discovered=False names the set to target."""
    lws = kube.workloads[(NS, "LeaderWorkerSet", LWS)]
    template = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate" if part == LWS else "workerTemplate"]
    labels = {leader_worker_set.NAME_LABEL: LWS}
    kube.workloads[(NS, "StatefulSet", part)] = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": part, "namespace": NS, "labels": labels},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": copy.deepcopy(template)},
    }
    body = group_tuner()
    body["spec"]["targetRef"] = {"kind": "StatefulSet", "name": part}
    with pytest.raises(kopf.TemporaryError):
        await run(body, kube, RecordingEmitter())
    discovered = cond(body, "Discovered")
    assert (discovered["status"], discovered["reason"]) == ("False", "DiscoveryIncomplete")
    assert f"target the LeaderWorkerSet (kind: LeaderWorkerSet, name: {LWS})" in discovered["message"]
    assert "recommendation" not in body["status"]
