"""An EngineTuner's vLLM target whose container cannot hold the KV offloading tier its command line asks for
(``--kv-offloading-size`` GiB of pinned host memory, more than ``resources.limits.memory``) is refused as the
InferenceService's spec is, with the same check: ``Planned=False`` and ``Ready=False`` reason
``HostMemoryTooSmall`` naming the container, one Warning event, no recommendation the webhook would put on
new pods, no eviction; once the owner raises the limit, it is planned. The in-memory API of test_enginetuner
and the real planner."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from test_enginetuner import NS, PS_COMMAND, FakeTargetKube, cond, deployment, pod_of, run, tuner
from test_enginetuner_group import LWS, leader_worker_set_of

from kvpilot.operator import api
from kvpilot.operator.enginetuner import target, target_host_memory, target_webhook
from kvpilot.operator.pods import pod_reading
from kvpilot.operator.status.events import RecordingEmitter

TIER = ["--kv-offloading-size", "100"]
"""100 GiB of pinned host memory, the engine's whole tier (one pod)."""


def offloading_target(memory: str | None, flags: list[str] = TIER) -> dict[str, Any]:
    limits: dict[str, Any] = {"nvidia.com/gpu": 1, **({"memory": memory} if memory else {})}
    return deployment("llama", [*PS_COMMAND, *flags], resources={"limits": limits})


def kube_with(workload: dict[str, Any]) -> FakeTargetKube:
    pod_reading.LOGS.clear()
    k = FakeTargetKube()
    k.workloads[(NS, "Deployment", "llama")] = workload
    k.pods = [pod_of(workload, "llama-abc12-x"), pod_of(workload, "llama-abc12-y", node="l4-1")]
    return k


def index(body: dict[str, Any]) -> Any:
    return target_webhook.index_tuner(NS, "t", body["spec"], body["status"], body["metadata"])


async def refused(body: dict[str, Any], kube: FakeTargetKube, emitter: RecordingEmitter, now: float) -> str:
    with pytest.raises(kopf.TemporaryError, match="HostMemoryTooSmall"):
        await run(body, kube, emitter, now=now)
    planned = cond(body, "Planned")
    assert (planned["status"], planned["reason"]) == ("False", "HostMemoryTooSmall")
    ready = cond(body, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "HostMemoryTooSmall")
    return str(planned["message"])


async def test_auto_neither_recommends_nor_evicts_for_a_container_below_its_tier() -> None:
    kube, body, emitter = kube_with(offloading_target("64Gi")), tuner("Auto"), RecordingEmitter()
    for dt in (0, 60, 120):  # Auto would evict from the second reconcile on
        message = await refused(body, kube, emitter, now=1.8e9 + dt)
    assert message.startswith("--kv-offloading-size in container vllm of the target pins 100.0 GiB")
    assert "that container's resources.limits.memory (64Gi)" in message and "raise the limit" in message
    assert emitter.reasons == ["HostMemoryTooSmall"]  # a Warning, once, not every tick
    assert emitter.events[0][0] == "Warning"
    assert "recommendation" not in body["status"] and index(body) is None  # the webhook rewrites no pod
    assert kube.evicted == [] and kube.writes == 0


async def test_a_target_tuned_before_its_tier_outgrew_the_limit_stops_being_actuated() -> None:
    kube, body = kube_with(offloading_target("128Gi")), tuner("Initial")
    await run(body, kube, RecordingEmitter())
    assert cond(body, "Ready")["status"] == "True" and index(body) is not None  # holds 100 GiB: planned
    kube.workloads[(NS, "Deployment", "llama")] = offloading_target("128Gi", ["--kv-offloading-size", "200"])
    await refused(body, kube, RecordingEmitter(), now=1.8e9 + 60)
    assert index(body) is None  # the old recommendation stays in the status, but new pods are not rewritten


async def test_planned_once_the_owner_raises_the_limit_or_leaves_it_unset() -> None:
    kube, body = kube_with(offloading_target("64Gi")), tuner("Recommend")
    await refused(body, kube, RecordingEmitter(), now=1.8e9)
    for memory in ("101Gi", None):
        kube.workloads[(NS, "Deployment", "llama")] = offloading_target(memory)
        await run(body, kube, RecordingEmitter(), now=1.8e9 + 60)
        assert cond(body, "Planned")["status"] == "True" and cond(body, "Ready")["status"] == "True"
        assert body["status"]["recommendation"]["settings"]


async def test_the_tier_in_a_config_file_counts_and_lmcaches_does_not() -> None:
    wl = offloading_target("64Gi", ["--config", "/etc/vllm/engine.yaml"])
    c = wl["spec"]["template"]["spec"]["containers"][0]
    c["volumeMounts"] = [{"name": "cfg", "mountPath": "/etc/vllm"}]
    wl["spec"]["template"]["spec"]["volumes"] = [{"name": "cfg", "configMap": {"name": "engine"}}]
    kube, body = kube_with(wl), tuner("Recommend")
    kube.config_maps[(NS, "engine")] = {"engine.yaml": "kv-offloading-size: 100\n"}
    await refused(body, kube, RecordingEmitter(), now=1.8e9)
    kube.workloads[(NS, "Deployment", "llama")] = offloading_target(
        "64Gi", [*TIER, "--kv-offloading-backend", "lmcache"]
    )
    await run(body, kube, RecordingEmitter(), now=1.8e9 + 60)  # LMCache's server holds that tier
    assert cond(body, "Planned")["status"] == "True"


async def test_a_size_that_is_not_gib_is_discovery_incomplete() -> None:
    kube, body = kube_with(offloading_target("64Gi", ["--kv-offloading-size", "lots"])), tuner("Recommend")
    with pytest.raises(kopf.TemporaryError):
        await run(body, kube, RecordingEmitter())
    discovered = cond(body, "Discovered")
    assert (
        discovered["reason"] == "DiscoveryIncomplete"
        and "'lots' is not a size in GiB" in discovered["message"]
    )


def _group(leader_memory: str, worker_memory: str) -> dict[str, Any]:
    lws = leader_worker_set_of()
    group = lws["spec"]["leaderWorkerTemplate"]
    for key, memory in (("leaderTemplate", leader_memory), ("workerTemplate", worker_memory)):
        container = group[key]["spec"]["containers"][0]
        container["command"] = [*container["command"], *TIER]
        container["resources"]["limits"]["memory"] = memory
    return lws


def _check_group(lws: dict[str, Any]) -> None:
    spec = api.EngineTunerSpec.model_validate(
        {"targetRef": {"kind": "LeaderWorkerSet", "name": LWS}, "gpu": {"product": "H100-SXM"}}
    )
    found = target.build_discovery(spec, lws, [], {})
    assert found.nodes == 2
    target_host_memory.check_target_host_memory(lws, found)


def test_each_pod_of_a_group_holds_its_share_of_the_tier() -> None:
    _check_group(_group("64Gi", "64Gi"))  # 50 GiB on each of the group's two pods
    with pytest.raises(target_host_memory.HostMemoryTooSmall, match="its share on each") as raised:
        _check_group(_group("64Gi", "32Gi"))  # the worker's limit is below its 50 GiB
    assert "pins 50.0 GiB" in raised.value.message and "(32Gi)" in raised.value.message


LMCACHE = ["--kv-transfer-config", '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}']
"""LMCache's connector: its CPU backend pins ``max_local_cpu_size`` GiB (5 by default) per GPU worker."""


def lmcache_target(memory: str, gpus: int, env: list[dict[str, str]] | None = None) -> dict[str, Any]:
    workload = deployment(
        "llama", [*PS_COMMAND, *LMCACHE], resources={"limits": {"nvidia.com/gpu": gpus, "memory": memory}}
    )
    container = workload["spec"]["template"]["spec"]["containers"][0]
    container["env"] = env or []
    return workload


async def test_lmcaches_cpu_backend_is_held_per_gpu_worker_sized_by_the_containers_environment() -> None:
    """Four workers x 5 GiB do not fit 16Gi; the container's own LMCACHE_MAX_LOCAL_CPU_SIZE of 2 does."""
    kube, body = kube_with(lmcache_target("16Gi", 4)), tuner("Recommend")
    message = await refused(body, kube, RecordingEmitter(), now=1.8e9)
    assert "runs LMCache" in message and "20.0 GiB" in message and "x 4 GPU workers" in message
    small = [{"name": "LMCACHE_MAX_LOCAL_CPU_SIZE", "value": "2"}]
    kube.workloads[(NS, "Deployment", "llama")] = lmcache_target("16Gi", 4, small)
    await run(body, kube, RecordingEmitter(), now=1.8e9 + 60)
    assert cond(body, "Planned")["status"] == "True"
