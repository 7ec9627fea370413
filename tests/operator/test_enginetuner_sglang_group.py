"""An EngineTuner whose target is a LeaderWorkerSet another stack made to run SGLang over two nodes
(``--nnodes 2``, one ``--tp-size 16`` across them): discovery reads the leader's flags and the group's size,
the plan is the InferenceService planner's with ``gpu.nodesPerReplica`` 2, the webhook gives the leader and
the worker the recommendation alike, and a worker's CUDA OOM, gone with its group, lowers the fraction. TGI
shards within one node: in a group it is refused by name. The in-memory API of test_enginetuner and the
real planner."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from operator_fakes import H100_LABELS, lws_group_pod, node_object
from test_enginetuner import NS, FakeTargetKube, cond, crashed, run
from test_enginetuner_engines import SGLANG_IMAGE, TGI_IMAGE

from kvpilot.operator import api
from kvpilot.operator.enginetuner import target, target_engine_plan, target_webhook
from kvpilot.operator.enginetuner.target_engines import EngineArgs
from kvpilot.operator.pods import group_crashes, leader_worker_set, pod_cache, pod_reading
from kvpilot.operator.status.events import RecordingEmitter
from kvpilot.tuner import sglang

MODEL = "meta-llama/Llama-3.1-70B-Instruct"
LWS = "sg"
COMMON = ["python3", "-m", "sglang.launch_server", "--model-path", MODEL, "--tp-size", "16", "--nnodes", "2"]
ADDRESS = ["--dist-init-addr", f"{leader_worker_set.LEADER_ADDRESS}:20000", "--enable-metrics"]
LEADER = [*COMMON, "--node-rank", "0", *ADDRESS, "--host", "0.0.0.0", "--port", "30000"]
WORKER = [*COMMON, "--node-rank", leader_worker_set.WORKER_INDEX, *ADDRESS]
OOM = "Scheduler hit an exception: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def _template(command: list[str], image: str = SGLANG_IMAGE, name: str = "sglang") -> dict[str, Any]:
    container = {
        "name": name,
        "image": image,
        "command": list(command),
        "resources": {"limits": {"nvidia.com/gpu": 8}},
    }
    return {"metadata": {"labels": {"app": LWS}}, "spec": {"containers": [container]}}


def sglang_set(leader: list[str] = LEADER, worker: list[str] = WORKER) -> dict[str, Any]:
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": LWS, "namespace": NS},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": 2,
                "leaderTemplate": _template(leader),
                "workerTemplate": _template(worker),
            },
        },
    }


def group_pod(lws: dict[str, Any], index: int, uid: str) -> dict[str, Any]:
    """An SGLang pod of group 0 as LWS makes it (:func:`operator_fakes.lws_group_pod`)."""
    return lws_group_pod(lws, 0, index, container="sglang", uid=uid)


def group_tuner(mode: str = "Recommend") -> dict[str, Any]:
    return {
        "apiVersion": "kvpilot.io/v1alpha1",
        "kind": "EngineTuner",
        "metadata": {"name": "t", "namespace": NS, "generation": 1, "uid": "u1"},
        "spec": {"targetRef": {"kind": leader_worker_set.KIND, "name": LWS}, "updateMode": mode},
        "status": {},
    }


@pytest.fixture
def kube() -> FakeTargetKube:
    pod_reading.LOGS.clear()
    k = FakeTargetKube()
    lws = sglang_set()
    k.workloads[(NS, leader_worker_set.KIND, LWS)] = lws
    k.nodes = [node_object(f"h100-0-{i}", H100_LABELS) for i in range(2)]
    k.pods = [group_pod(lws, i, f"old-{i}") for i in range(2)]
    return k


def _spec() -> api.EngineTunerSpec:
    return api.EngineTunerSpec.model_validate({"targetRef": {"kind": leader_worker_set.KIND, "name": LWS}})


def test_the_groups_pods_each_run_their_share_of_sglangs_ranks() -> None:
    lws = sglang_set()
    found = target_engine_plan.find_target_engine(_spec(), lws)
    assert found is not None
    discovery = target_engine_plan.build_engine_discovery(_spec(), lws, [H100_LABELS], *found)
    assert (discovery.nodes, discovery.gpu_count) == (2, 8)  # --tp-size 16 over two nodes
    plan_spec = target_engine_plan.build_engine_plan_spec(_spec(), discovery)
    assert (plan_spec.gpu.count, plan_spec.gpu.nodes_per_replica, plan_spec.gpu.tensor_parallel_size) == (
        8,
        2,
        16,
    )


def test_ranks_that_do_not_split_over_the_nodes_are_named() -> None:
    odd = [a if a != "16" else "3" for a in LEADER]
    lws = sglang_set(odd, odd)
    found = target_engine_plan.find_target_engine(_spec(), lws)
    assert found is not None
    with pytest.raises(target.DiscoveryIncomplete, match="do not split over the group's 2 nodes"):
        target_engine_plan.build_engine_discovery(_spec(), lws, [H100_LABELS], *found)


def test_tgi_in_a_group_is_unsupported_by_name() -> None:
    launcher = ["text-generation-launcher", "--model-id", MODEL, "--num-shard", "8"]
    lws = sglang_set()
    for role in ("leaderTemplate", "workerTemplate"):
        lws["spec"]["leaderWorkerTemplate"][role] = _template(launcher, TGI_IMAGE, "tgi")
    found = target_engine_plan.find_target_engine(_spec(), lws)
    assert found is not None
    with pytest.raises(target.UnsupportedEngine, match="TGI shards a model within one node"):
        target_engine_plan.build_engine_discovery(_spec(), lws, [H100_LABELS], *found)


async def test_recommend_plans_the_group_over_its_nodes(kube: FakeTargetKube) -> None:
    body = group_tuner()
    await run(body, kube, RecordingEmitter())
    st = body["status"]
    assert cond(body, "Ready")["reason"] == "Recommending", st["conditions"]
    assert st["discovered"]["engine"] == "SGLang" and st["discovered"]["gpuCount"] == 8
    planned = sglang.parse_sglang_args(st["recommendation"]["engineArgs"])
    assert planned.tp_size == 16 and planned.mem_fraction_static is not None
    assert st["discovered"]["pods"] == 2 and kube.writes == 0


async def _planned(kube: FakeTargetKube, mode: str) -> tuple[dict[str, Any], dict[tuple[str, str, str], Any]]:
    body = group_tuner(mode)
    await run(body, kube, RecordingEmitter())
    index = target_webhook.index_tuner(NS, "t", body["spec"], body["status"], body["metadata"])
    assert index is not None
    return body, {k: [v] for k, v in index.items()}


def _admitted(lookup: dict[tuple[str, str, str], Any], pod: dict[str, Any]) -> dict[str, Any]:
    found = target_webhook.compute_pod_patch(pod, NS, lookup)
    assert found is not None, pod["metadata"]["name"]
    pod["spec"]["containers"] = found[0]
    return pod


async def test_the_webhook_gives_the_leader_and_the_worker_the_recommendation_alike(
    kube: FakeTargetKube,
) -> None:
    body, lookup = await _planned(kube, "Initial")
    recommended = EngineArgs("SGLang", tuple(body["status"]["recommendation"]["engineArgs"]))
    lws = kube.workloads[(NS, leader_worker_set.KIND, LWS)]
    for index in (0, 1):
        pod = _admitted(lookup, group_pod(lws, index, f"new-{index}"))
        assert target.pod_carries(pod, "sglang", recommended), pod["spec"]["containers"][0]["command"]
        command = pod["spec"]["containers"][0]["command"]
        assert command[command.index("--nnodes") + 1] == "2"  # the owner's layout stays
        assert command[command.index("--node-rank") + 1] == (
            "0" if index == 0 else leader_worker_set.WORKER_INDEX
        )
    # in Auto a stale group is replaced through its leader: LWS recreates the whole group
    stale = target.compute_stale_pods(
        [group_pod(lws, i, f"old-{i}") for i in range(2)], "sglang", recommended
    )
    assert [p["metadata"]["name"] for p in stale] == [f"{LWS}-0"]


async def test_a_workers_oom_gone_with_its_group_lowers_the_fraction(
    kube: FakeTargetKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LWS deletes the group the moment the worker restarts: the target pods' watch files the crash as it
    passes, and the next reconcile, which finds only LWS's new group, lowers ``--mem-fraction-static``."""
    monkeypatch.setattr(group_crashes, "TARGET_CRASHES", group_crashes.GroupCrashes())
    now = 1.8e9
    body, lookup = await _planned(kube, "Initial")
    fraction = sglang.parse_sglang_args(body["status"]["recommendation"]["engineArgs"]).mem_fraction_static
    assert fraction is not None
    lws = kube.workloads[(NS, leader_worker_set.KIND, LWS)]
    kube.pods = [_admitted(lookup, group_pod(lws, i, f"run-{i}")) for i in range(2)]
    await run(body, kube, RecordingEmitter(), now=now + 30)  # the group runs the recommendation

    crash = crashed(copy.deepcopy(kube.pods[1]), now + 60, OOM, container="sglang")
    pod_cache.file_target_crash(NS, crash["metadata"]["labels"], crash)  # as the watch delivers it
    kube.pods = [_admitted(lookup, group_pod(lws, i, f"new-{i}")) for i in range(2)]  # LWS's new group
    await run(body, kube, RecordingEmitter(), now=now + 90)
    st = body["status"]
    *_, last = st["history"]
    assert (last["action"], last["trigger"]) == ("Retuned", "RuntimeOOM"), st["history"]
    lowered = sglang.parse_sglang_args(st["recommendation"]["engineArgs"]).mem_fraction_static
    assert lowered is not None and lowered < fraction
    assert st["discovered"]["pods"] == 2  # the gone worker is evidence, not a pod
